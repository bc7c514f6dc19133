#include "net/link_monitor.h"

#include <linux/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace softrdma::net {
namespace {

constexpr unsigned kLinkPending = 1, kAddrPending = 2;

}  // namespace

LinkMonitor::LinkMonitor(int ifindex, const wire::IpAddress& ip) : ifindex_(ifindex), ip_(ip) {
  fd_ = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "netlink socket");
  sockaddr_nl addr{};
  addr.nl_family = AF_NETLINK;
  addr.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
  if (bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    close(fd_);
    throw std::system_error(err, std::generic_category(), "netlink bind");
  }
  resync();
}

LinkMonitor::~LinkMonitor() { close(fd_); }

bool LinkMonitor::update() {
  const LinkState before = state_;
  // Aligned for the nlmsghdr casts; one read returns whole messages.
  alignas(nlmsghdr) char buf[16384];
  for (;;) {
    ssize_t n = recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      // Notifications were lost to a full socket buffer: the kernel's view is the truth now.
      if (errno == ENOBUFS) {
        resync();
        continue;
      }
      break;  // EAGAIN: all read
    }
    if (n == 0) break;
    unsigned pending = 0;
    apply(buf, static_cast<size_t>(n), &pending);
  }
  return !(state_ == before);
}

void LinkMonitor::resync() {
  // The link by index, then every IPv4 address of the namespace (a dump: there is no per-interface
  // filter the kernel must honour); the address counts only if a reply lists it.
  for (int attempt = 0; attempt < 3; ++attempt) {
    state_ = LinkState{};
    seq_ += 2;
    struct {
      nlmsghdr h;
      ifinfomsg ifi;
    } link_req{};
    link_req.h.nlmsg_len = sizeof link_req;
    link_req.h.nlmsg_type = RTM_GETLINK;
    link_req.h.nlmsg_flags = NLM_F_REQUEST;
    link_req.h.nlmsg_seq = seq_;
    link_req.ifi.ifi_family = AF_UNSPEC;
    link_req.ifi.ifi_index = ifindex_;
    struct {
      nlmsghdr h;
      ifaddrmsg ifa;
    } addr_req{};
    addr_req.h.nlmsg_len = sizeof addr_req;
    addr_req.h.nlmsg_type = RTM_GETADDR;
    addr_req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    addr_req.h.nlmsg_seq = seq_ + 1;
    addr_req.ifa.ifa_family = static_cast<uint8_t>(ip_.family());
    if (send(fd_, &link_req, sizeof link_req, 0) != sizeof link_req ||
        send(fd_, &addr_req, sizeof addr_req, 0) != sizeof addr_req)
      return;  // the state stays down: better than a port claimed up on no evidence
    unsigned pending = kLinkPending | kAddrPending;
    alignas(nlmsghdr) char buf[16384];
    bool overflow = false;
    while (pending && !overflow) {
      pollfd pfd{fd_, POLLIN, 0};
      if (poll(&pfd, 1, 2000) <= 0) return;  // the kernel always answers; give up rather than hang
      ssize_t n = recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == ENOBUFS) overflow = true;  // replies or notifications lost: ask again
        else if (errno != EINTR && errno != EAGAIN) return;
        continue;
      }
      apply(buf, static_cast<size_t>(n), &pending);
    }
    if (!overflow) return;
  }
}

void LinkMonitor::apply(const void* data, size_t len, unsigned* pending) {
  for (auto* h = static_cast<const nlmsghdr*>(data); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
    // Replies to resync(): the link's (or an error: no such interface), and the end of the dump.
    if (h->nlmsg_seq == seq_ && (h->nlmsg_type == RTM_NEWLINK || h->nlmsg_type == NLMSG_ERROR))
      *pending &= ~kLinkPending;
    if (h->nlmsg_seq == seq_ + 1 && (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR))
      *pending &= ~kAddrPending;
    switch (h->nlmsg_type) {
      case RTM_NEWLINK:
      case RTM_DELLINK: {
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(ifinfomsg))) break;
        auto* ifi = static_cast<const ifinfomsg*>(NLMSG_DATA(h));
        if (ifi->ifi_index != ifindex_) break;
        // A deleted interface (or one moved to another namespace) takes its link with it.
        bool gone = h->nlmsg_type == RTM_DELLINK;
        state_.admin_up = !gone && (ifi->ifi_flags & IFF_UP);
        state_.carrier = !gone && (ifi->ifi_flags & IFF_LOWER_UP);
        if (gone) state_.has_address = false;
        break;
      }
      case RTM_NEWADDR:
      case RTM_DELADDR: {
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(ifaddrmsg))) break;
        auto* ifa = static_cast<const ifaddrmsg*>(NLMSG_DATA(h));
        if (ifa->ifa_family != ip_.family() || static_cast<int>(ifa->ifa_index) != ifindex_) break;
        // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer's on point-to-point links
        // (and the only one IPv6 gives).
        const size_t want = ip_.is_v4() ? 4 : 16;
        wire::IpAddress local, address;
        bool has_local = false, has_address = false;
        size_t alen = IFA_PAYLOAD(h);
        for (auto* rta = IFA_RTA(ifa); RTA_OK(rta, alen); rta = RTA_NEXT(rta, alen)) {
          if (RTA_PAYLOAD(rta) < want) continue;
          const auto* p = static_cast<const uint8_t*>(RTA_DATA(rta));
          wire::IpAddress a;
          if (want == 4) {
            uint32_t v4;
            std::memcpy(&v4, p, 4);
            a = wire::IpAddress::v4(v4);
          } else {
            a = wire::IpAddress::from_bytes(p);
          }
          if (rta->rta_type == IFA_LOCAL) {
            local = a;
            has_local = true;
          } else if (rta->rta_type == IFA_ADDRESS) {
            address = a;
            has_address = true;
          }
        }
        const wire::IpAddress ip = has_local ? local : address;
        if ((!has_local && !has_address) || ip != ip_) break;
        state_.has_address = h->nlmsg_type == RTM_NEWADDR;
        break;
      }
      default:
        break;
    }
  }
}

}  // namespace softrdma::net
