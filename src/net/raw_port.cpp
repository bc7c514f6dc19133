#include "net/raw_port.h"

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace softrdma::net {
namespace {
constexpr uint32_t kMacs = 12;
constexpr uint32_t kBufBytes = 65536 + 64;  // loopback's MTU and an Ethernet header, with room to spare
#ifndef PACKET_IGNORE_OUTGOING
constexpr int PACKET_IGNORE_OUTGOING = 23;
#endif
}  // namespace

RawPort::RawPort(int ifindex, bool loopback) : ifindex_(ifindex), loopback_(loopback) {
  // Protocol 0: the socket receives nothing until set_rules() has installed its filter.
  fd_ = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "AF_PACKET socket");
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = 0;
  sll.sll_ifindex = ifindex;
  if (bind(fd_, reinterpret_cast<sockaddr*>(&sll), sizeof sll) < 0) {
    int e = errno;
    close(fd_);
    throw std::system_error(e, std::generic_category(), "AF_PACKET bind");
  }
  buf_.resize(kBufBytes);
}

RawPort::~RawPort() {
  if (fd_ >= 0) close(fd_);
}

int RawPort::send(const uint8_t* frame, uint32_t len) {
  if (len < 14) return EINVAL;
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  std::memcpy(&sll.sll_protocol, frame + kMacs, 2);  // the frame's EtherType (or 802.1Q TPID)
  sll.sll_ifindex = ifindex_;
  sll.sll_halen = 6;
  std::memcpy(sll.sll_addr, frame, 6);
  for (;;) {
    ssize_t n = sendto(fd_, frame, len, 0, reinterpret_cast<sockaddr*>(&sll), sizeof sll);
    if (n == static_cast<ssize_t>(len)) return 0;
    if (n < 0 && errno == EINTR) continue;
    return n < 0 ? errno : EIO;
  }
}

int RawPort::set_rules(const std::vector<FrameRule>& rules) {
  std::vector<sock_filter> prog = compile_bpf(rules);
  sock_fprog fprog{static_cast<unsigned short>(prog.size()), prog.data()};
  if (setsockopt(fd_, SOL_SOCKET, SO_ATTACH_FILTER, &fprog, sizeof fprog) < 0) return errno;
  rules_ = rules;
  if (!bound_rx_ && !rules.empty()) {
    // The filter is in place before the socket sees its first frame. On loopback a frame sent is
    // seen once, as it comes back in, not a second time on its way out.
    int one = 1;
    if (loopback_) setsockopt(fd_, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
    setsockopt(fd_, SOL_PACKET, PACKET_AUXDATA, &one, sizeof one);
    sockaddr_ll sll{};
    sll.sll_family = AF_PACKET;
    sll.sll_protocol = htons(ETH_P_ALL);
    sll.sll_ifindex = ifindex_;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&sll), sizeof sll) < 0) return errno;
    bound_rx_ = true;
  }
  return 0;
}

const FrameView* RawPort::receive(uint64_t* filtered) {
  if (!bound_rx_) return nullptr;
  for (;;) {
    sockaddr_ll from{};
    iovec iov{buf_.data(), buf_.size()};
    alignas(cmsghdr) uint8_t control[CMSG_SPACE(sizeof(tpacket_auxdata))];
    msghdr msg{};
    msg.msg_name = &from;
    msg.msg_namelen = sizeof from;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = recvmsg(fd_, &msg, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      return nullptr;
    }
    if ((loopback_ && from.sll_pkttype == PACKET_OUTGOING) || (msg.msg_flags & MSG_TRUNC)) continue;
    view_ = FrameView{buf_.data(), static_cast<uint32_t>(n), false, 0};
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_PACKET || c->cmsg_type != PACKET_AUXDATA) continue;
      tpacket_auxdata aux;
      std::memcpy(&aux, CMSG_DATA(c), sizeof aux);
      if (aux.tp_status & TP_STATUS_VLAN_VALID) {
        view_.has_vlan = true;
        view_.vlan_tci = aux.tp_vlan_tci;
      }
    }
    if (any_rule_matches(rules_, view_)) return &view_;
    ++*filtered;
  }
}

uint32_t RawPort::wire_frame(const FrameView& f, uint8_t* dst, uint32_t room) {
  const uint32_t len = wire_length(f);
  if (len > room) return len;
  if (!f.has_vlan) {
    std::memcpy(dst, f.data, f.len);
    return len;
  }
  std::memcpy(dst, f.data, kMacs);
  const uint8_t tag[4] = {0x81, 0x00, static_cast<uint8_t>(f.vlan_tci >> 8), static_cast<uint8_t>(f.vlan_tci)};
  std::memcpy(dst + kMacs, tag, 4);
  std::memcpy(dst + kMacs + 4, f.data + kMacs, f.len - kMacs);
  return len;
}

}  // namespace softrdma::net
