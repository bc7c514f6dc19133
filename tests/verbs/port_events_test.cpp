// Port async events: the port of the loopback device follows the `lo` interface. In a private
// network namespace (a forked child, so the host's lo is never touched) lo goes down and up and
// loses and regains 127.0.0.1; every open context must get IBV_EVENT_PORT_ERR / PORT_ACTIVE (and
// GID_CHANGE for the address) for port 1, ibv_query_port must agree, and an RC connection made
// before must carry data again once the port is back. Needs root (CAP_SYS_ADMIN for unshare).
#include "helpers.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace softrdma::verbs_test {
namespace {

constexpr int kSkip = 77;

// The child reports the first broken expectation on stderr and exits non-zero.
#define PE_CHECK(cond, ...)                                       \
  do {                                                            \
    if (!(cond)) {                                                \
      fprintf(stderr, "port_events child: %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                               \
      fprintf(stderr, "\n");                                      \
      return 1;                                                   \
    }                                                             \
  } while (0)

bool set_link(const char* ifname, bool up) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return false;
  ifreq req{};
  std::snprintf(req.ifr_name, sizeof req.ifr_name, "%s", ifname);
  bool ok = ioctl(s, SIOCGIFFLAGS, &req) == 0;
  if (ok) {
    req.ifr_flags = static_cast<short>(up ? (req.ifr_flags | IFF_UP) : (req.ifr_flags & ~IFF_UP));
    ok = ioctl(s, SIOCSIFFLAGS, &req) == 0;
  }
  close(s);
  return ok;
}

// Adds or deletes an IPv4 address with rtnetlink; returns 0 or the kernel's errno.
int change_address(int ifindex, uint32_t ip_be, uint8_t prefix, bool add) {
  int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (s < 0) return errno;
  struct {
    nlmsghdr h;
    ifaddrmsg ifa;
    alignas(4) char attrs[64];
  } req{};
  req.h.nlmsg_type = add ? RTM_NEWADDR : RTM_DELADDR;
  req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | (add ? NLM_F_CREATE | NLM_F_EXCL : 0);
  req.h.nlmsg_seq = 1;
  req.ifa.ifa_family = AF_INET;
  req.ifa.ifa_prefixlen = prefix;
  req.ifa.ifa_scope = RT_SCOPE_HOST;
  req.ifa.ifa_index = static_cast<unsigned>(ifindex);
  size_t len = NLMSG_LENGTH(sizeof(ifaddrmsg));
  for (unsigned short type : {IFA_LOCAL, IFA_ADDRESS}) {
    auto* rta = reinterpret_cast<rtattr*>(reinterpret_cast<char*>(&req) + NLMSG_ALIGN(len));
    rta->rta_type = type;
    rta->rta_len = RTA_LENGTH(sizeof ip_be);
    std::memcpy(RTA_DATA(rta), &ip_be, sizeof ip_be);
    len = NLMSG_ALIGN(len) + RTA_ALIGN(rta->rta_len);
  }
  req.h.nlmsg_len = static_cast<uint32_t>(len);
  int err = EIO;
  if (send(s, &req, len, 0) == static_cast<ssize_t>(len)) {
    alignas(nlmsghdr) char buf[4096];
    ssize_t n = recv(s, buf, sizeof buf, 0);
    auto* h = reinterpret_cast<nlmsghdr*>(buf);
    if (n >= static_cast<ssize_t>(NLMSG_LENGTH(sizeof(nlmsgerr))) && h->nlmsg_type == NLMSG_ERROR)
      err = -static_cast<nlmsgerr*>(NLMSG_DATA(h))->error;
  } else {
    err = errno;
  }
  close(s);
  return err;
}

struct Event {
  ibv_event_type type;
  int port;
};

// Reads n async events of ctx (acknowledging each), waiting at most kWaitSeconds for each.
std::vector<Event> read_events(ibv_context* ctx, size_t n) {
  std::vector<Event> out;
  while (out.size() < n) {
    pollfd pf{ctx->async_fd, POLLIN, 0};
    if (poll(&pf, 1, kWaitSeconds * 1000) != 1) break;
    ibv_async_event ev{};
    if (ibv_get_async_event(ctx, &ev) != 0) break;
    out.push_back({ev.event_type, ev.element.port_num});
    ibv_ack_async_event(&ev);
  }
  return out;
}

// True when events holds exactly the wanted types (in any order), each for port 1.
bool same_port_events(std::vector<Event> got, std::vector<ibv_event_type> want) {
  if (got.size() != want.size()) return false;
  std::vector<ibv_event_type> types;
  for (const Event& e : got) {
    if (e.port != kPort) return false;
    types.push_back(e.type);
  }
  std::sort(types.begin(), types.end());
  std::sort(want.begin(), want.end());
  return types == want;
}

std::string describe(const std::vector<Event>& evs) {
  std::string s;
  for (const Event& e : evs) s += std::string(ibv_event_type_str(e.type)) + "/port " + std::to_string(e.port) + " ";
  return s.empty() ? "(none)" : s;
}

// One SEND a -> b with a checked payload.
bool send_checked(Side& a, Side& b, Buffer& src, Buffer& dst, uint32_t seed) {
  const uint32_t len = 8192;
  fill_pattern(src.data, len, seed);
  std::memset(dst.data, 0, len);
  if (post_recv(b.qp, seed, {dst.sge(0, len)})) return false;
  SendWr w(seed, IBV_WR_SEND, {src.sge(0, len)});
  if (post_send(a.qp, w)) return false;
  ibv_wc swc{}, rwc{};
  if (!poll_wc(a.scq, &swc) || !poll_wc(b.rcq, &rwc)) return false;
  return swc.status == IBV_WC_SUCCESS && rwc.status == IBV_WC_SUCCESS && rwc.byte_len == len &&
         check_pattern(dst.data, len, seed) == len;
}

int child_main() {
  if (unshare(CLONE_NEWNET) != 0) return kSkip;
  PE_CHECK(set_link("lo", true), "lo up: %s", strerror(errno));
  const int lo_index = static_cast<int>(if_nametoindex("lo"));
  const uint32_t lo_ip = htonl(INADDR_LOOPBACK);

  Device dev;
  PE_CHECK(dev.ok(), "no loopback device in the new namespace");
  PE_CHECK(dev.port.state == IBV_PORT_ACTIVE, "port state %d at start", dev.port.state);
  // Async events are per context: a second context of the same device sees them all too.
  ibv_context* other = open_loopback_device();
  PE_CHECK(other, "second context");

  Side a, b;
  PE_CHECK(a.create(dev, QpConfig{}) && b.create(dev, QpConfig{}), "QP creation");
  ConnConfig conn;
  PE_CHECK(bring_up(a.qp, a.psn, b.qpn(), b.psn, dev.gid, conn, dev.attr) == 0 &&
               bring_up(b.qp, b.psn, a.qpn(), a.psn, dev.gid, conn, dev.attr) == 0,
           "connect");
  auto src = a.buf(65536);
  auto dst = b.buf(65536);
  PE_CHECK(src->mr && dst->mr, "reg_mr");
  PE_CHECK(send_checked(a, b, *src, *dst, 11), "SEND before the link change");

  auto expect_port = [&](ibv_port_state state, uint8_t phys) {
    for (ibv_context* ctx : {dev.ctx, other}) {
      ibv_port_attr pa{};
      if (ibv_query_port(ctx, kPort, &pa) != 0 || pa.state != state || pa.phys_state != phys) {
        fprintf(stderr, "port_events child: ibv_query_port: state %d phys_state %d, expected %d %d\n",
                pa.state, pa.phys_state, state, phys);
        return false;
      }
    }
    return true;
  };
  auto expect_events = [&](std::vector<ibv_event_type> want) {
    for (ibv_context* ctx : {dev.ctx, other}) {
      std::vector<Event> got = read_events(ctx, want.size());
      if (!same_port_events(got, want)) {
        fprintf(stderr, "port_events child: async events: %s\n", describe(got).c_str());
        return false;
      }
    }
    return true;
  };

  // lo down: the port is down and its link disabled (administratively down).
  PE_CHECK(set_link("lo", false), "lo down: %s", strerror(errno));
  PE_CHECK(expect_events({IBV_EVENT_PORT_ERR}), "PORT_ERR after lo down");
  PE_CHECK(expect_port(IBV_PORT_DOWN, 3), "port after lo down");

  PE_CHECK(set_link("lo", true), "lo up: %s", strerror(errno));
  PE_CHECK(expect_events({IBV_EVENT_PORT_ACTIVE}), "PORT_ACTIVE after lo up");
  PE_CHECK(expect_port(IBV_PORT_ACTIVE, 5), "port after lo up");
  PE_CHECK(send_checked(a, b, *src, *dst, 22), "SEND after the link returned");

  // The device's address removed: its only GID is gone and the port cannot carry traffic, though
  // the link itself stays up.
  int err = change_address(lo_index, lo_ip, 8, false);
  PE_CHECK(err == 0, "deleting 127.0.0.1: %s", strerror(err));
  PE_CHECK(expect_events({IBV_EVENT_PORT_ERR, IBV_EVENT_GID_CHANGE}), "events after the address went");
  PE_CHECK(expect_port(IBV_PORT_DOWN, 5), "port without its address");
  err = change_address(lo_index, lo_ip, 8, true);
  PE_CHECK(err == 0, "adding 127.0.0.1: %s", strerror(err));
  PE_CHECK(expect_events({IBV_EVENT_PORT_ACTIVE, IBV_EVENT_GID_CHANGE}), "events after the address returned");
  PE_CHECK(expect_port(IBV_PORT_ACTIVE, 5), "port with its address back");
  PE_CHECK(send_checked(a, b, *src, *dst, 33), "SEND after the address returned");

  // Nothing else was raised (no QP event: the QPs never noticed).
  for (ibv_context* ctx : {dev.ctx, other}) {
    pollfd pf{ctx->async_fd, POLLIN, 0};
    PE_CHECK(poll(&pf, 1, 0) == 0, "an unexpected async event is pending");
  }
  ibv_close_device(other);
  return 0;
}

TEST(PortEvents, LinkAndAddressChangesRaisePortEventsOnEveryContext) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create a network namespace";
  fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int rc = child_main();
    fflush(nullptr);
    _exit(rc);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child died, status " << status;
  if (WEXITSTATUS(status) == kSkip) GTEST_SKIP() << "unshare(CLONE_NEWNET) refused (no CAP_SYS_ADMIN)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the child's message above";
}

}  // namespace
}  // namespace softrdma::verbs_test
