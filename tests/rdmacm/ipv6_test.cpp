// rdma_cm ids with AF_INET6 addresses, as far as softrdma carries them: a bind to "::" with and
// without RDMA_OPTION_ID_AFONLY (programs bind "::" beside "0.0.0.0" and fail their set-up when either
// bind fails), IPv4-mapped addresses (::ffff:a.b.c.d) bound, resolved and connected as IPv4 with the
// id's addresses kept in AF_INET6, ::1 as the loopback device's, and the refusal of link-local ones.
// Only the public API; every connection stays on this host (IPv6 between hosts: compat.ipv6).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>

#include "cm_helpers.h"

namespace {

using namespace softrdma::cm_test;

int set_afonly(rdma_cm_id* id, int on) { return rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &on, sizeof on); }

// C (address and route resolved) connects to listener L; a SEND of text crosses and is checked. The
// child id is handed to check before it is accepted.
void connect_and_send(Id& L, Id& C, const char* text, const std::function<void(rdma_cm_id*)>& check = {}) {
  const uint32_t len = static_cast<uint32_t>(std::strlen(text) + 1);
  Side cs;
  ASSERT_TRUE(cs.setup(C.id, 64));
  rdma_cm_id* child = connect_for_request(C.id, L.ch);
  ASSERT_NE(child, nullptr);
  if (check) check(child);
  Side ss;
  ASSERT_TRUE(ss.setup(child, 64));
  ASSERT_EQ(post_recv_one(child->qp, ss.sge(0, 64), 1), 0);
  ASSERT_EQ(accept_until_established(child, C.ch), "");
  std::memcpy(cs.buf.data(), text, len);
  ASSERT_EQ(post_send_one(C.id->qp, cs.sge(0, len), 2), 0);
  EXPECT_EQ(cs.poll_one().status, IBV_WC_SUCCESS);
  ibv_wc wc = ss.poll_one();
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, len);
  EXPECT_EQ(std::memcmp(ss.buf.data(), text, len), 0);
  ss.release();
  rdma_destroy_id(child);
}

// "::" with AFONLY holds the port in IPv6's port space only: the IPv4 wildcard on the same port binds
// beside it, a second "::" does not; reported as "::" and the port; it listens. Without AFONLY "::"
// also takes IPv4's wildcard, so it collides with an IPv4 id on that port (as the kernel's rdma_cm).
TEST(RdmaCmIpv6, WildcardWithAndWithoutAfonly) {
  Id v4;
  ASSERT_EQ(v4.bind(addr("0.0.0.0", 0)), 0) << strerror(errno);
  const uint16_t port = ntohs(rdma_get_src_port(v4.id));
  ASSERT_NE(port, 0);

  Id only;
  ASSERT_EQ(set_afonly(only.id, 1), 0);
  ASSERT_EQ(only.bind(addr6("::", port)), 0) << strerror(errno);
  const sockaddr* local = rdma_get_local_addr(only.id);
  EXPECT_EQ(local->sa_family, AF_INET6);
  EXPECT_EQ(str_of(local), "::");
  EXPECT_EQ(ntohs(rdma_get_src_port(only.id)), port);
  EXPECT_EQ(only.id->verbs, nullptr);
  EXPECT_EQ(rdma_listen(only.id, 4), 0);
  EXPECT_EQ(set_afonly(only.id, 0), -1) << "AFONLY is set before the bind";
  EXPECT_EQ(errno, EINVAL);

  Id again;
  ASSERT_EQ(set_afonly(again.id, 1), 0);
  EXPECT_EQ(again.bind(addr6("::", port)), -1);
  EXPECT_EQ(errno, EADDRINUSE);

  Id dual;
  ASSERT_EQ(set_afonly(dual.id, 0), 0);
  EXPECT_EQ(dual.bind(addr6("::", port)), -1) << "0.0.0.0 holds the port's IPv4 half";
  EXPECT_EQ(errno, EADDRINUSE);
  // After the IPv4 id is gone the IPv6-only one still blocks a dual-stack bind of its port.
  rdma_destroy_id(v4.id);
  v4.id = nullptr;
  EXPECT_EQ(dual.bind(addr6("::", port)), -1);
  EXPECT_EQ(errno, EADDRINUSE);
}

// A dual-stack "::" listener hears IPv4 connections; the accepted id's addresses are IPv4 (the kernel
// keeps the family of the connection's cma header). An IPv4 wildcard bind of its port then fails.
TEST(RdmaCmIpv6, DualStackWildcardListenerAcceptsIpv4) {
  Id L;
  ASSERT_EQ(set_afonly(L.id, 0), 0);
  ASSERT_EQ(L.bind(addr6("::", 0)), 0) << strerror(errno);
  const uint16_t port = ntohs(rdma_get_src_port(L.id));
  ASSERT_NE(port, 0);
  EXPECT_EQ(str_of(rdma_get_local_addr(L.id)), "::");
  ASSERT_EQ(rdma_listen(L.id, 4), 0);
  Id v4;
  EXPECT_EQ(v4.bind(addr("0.0.0.0", port)), -1);
  EXPECT_EQ(errno, EADDRINUSE);

  Client C;
  ASSERT_TRUE(C.resolve(port));
  Side cs;
  ASSERT_TRUE(cs.setup(C.id, 64));
  rdma_cm_id* child = connect_for_request(C.id, L.ch);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(rdma_get_local_addr(child)->sa_family, AF_INET);
  EXPECT_EQ(rdma_get_peer_addr(child)->sa_family, AF_INET);
  Side ss;
  ASSERT_TRUE(ss.setup(child, 64));
  ASSERT_EQ(accept_until_established(child, C.ch), "");
  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->id == child) << name(ev);
  rdma_ack_cm_event(ev);
  ss.release();
  rdma_destroy_id(child);
}

// ::ffff:127.0.0.1 is 127.0.0.1: the bind attaches the loopback device, a client resolves and connects
// to the mapped address, and a SEND crosses; both ids report their addresses in AF_INET6.
TEST(RdmaCmIpv6, Ipv4MappedAddressesConnectAsIpv4) {
  Id L;
  ASSERT_EQ(L.bind(addr6("::ffff:127.0.0.1", 0)), 0) << strerror(errno);
  ASSERT_NE(L.id->verbs, nullptr);
  EXPECT_STREQ(ibv_get_device_name(L.id->verbs->device), "softrdma_lo");
  EXPECT_EQ(rdma_get_local_addr(L.id)->sa_family, AF_INET6);
  EXPECT_EQ(str_of(rdma_get_local_addr(L.id)), "::ffff:127.0.0.1");
  const uint16_t port = ntohs(rdma_get_src_port(L.id));
  ASSERT_EQ(rdma_listen(L.id, 4), 0);

  Id C;
  sockaddr_in6 dst = addr6("::ffff:127.0.0.1", port);
  ASSERT_EQ(rdma_resolve_addr(C.id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0) << strerror(errno);
  rdma_cm_event* ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->status == 0) << name(ev);
  rdma_ack_cm_event(ev);
  ASSERT_NE(C.id->verbs, nullptr);
  EXPECT_EQ(rdma_get_peer_addr(C.id)->sa_family, AF_INET6);
  EXPECT_EQ(str_of(rdma_get_peer_addr(C.id)), "::ffff:127.0.0.1");
  EXPECT_EQ(ntohs(rdma_get_dst_port(C.id)), port);
  EXPECT_EQ(rdma_get_local_addr(C.id)->sa_family, AF_INET6);
  EXPECT_EQ(str_of(rdma_get_local_addr(C.id)), "::ffff:127.0.0.1");
  ASSERT_EQ(rdma_resolve_route(C.id, 2000), 0);
  ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ROUTE_RESOLVED) << name(ev);
  rdma_ack_cm_event(ev);

  connect_and_send(L, C, "mapped-ipv4-send");
}

// rdma_getaddrinfo in AF_INET6: a passive service alone is "::", an IPv4 node comes back IPv4-mapped,
// and rdma_create_ep binds what it returns (the loopback device for ::ffff:127.0.0.1). AF_IB: refused.
TEST(RdmaCmIpv6, GetaddrinfoInIpv6) {
  rdma_addrinfo hints{};
  hints.ai_family = AF_INET6;
  hints.ai_flags = RAI_PASSIVE;
  rdma_addrinfo* rai = nullptr;
  ASSERT_EQ(rdma_getaddrinfo(nullptr, "7471", &hints, &rai), 0);
  EXPECT_EQ(rai->ai_family, AF_INET6);
  ASSERT_NE(rai->ai_src_addr, nullptr);
  EXPECT_EQ(rai->ai_src_len, sizeof(sockaddr_in6));
  EXPECT_EQ(str_of(rai->ai_src_addr), "::");
  EXPECT_EQ(ntohs(reinterpret_cast<sockaddr_in6*>(rai->ai_src_addr)->sin6_port), 7471);
  EXPECT_EQ(rai->ai_dst_addr, nullptr);
  rdma_freeaddrinfo(rai);

  hints.ai_flags = RAI_NUMERICHOST;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &rai), 0);
  ASSERT_NE(rai->ai_dst_addr, nullptr);
  EXPECT_EQ(rai->ai_dst_len, sizeof(sockaddr_in6));
  EXPECT_EQ(str_of(rai->ai_dst_addr), "::ffff:127.0.0.1");
  rdma_freeaddrinfo(rai);

  // A port: a synchronous id bound to loopback with port 0 is libfabric's probe (bind_test.cpp).
  std::string port;
  {
    Id probe;
    ASSERT_EQ(probe.bind(addr6("::ffff:127.0.0.1", 0)), 0);
    port = std::to_string(ntohs(rdma_get_src_port(probe.id)));
  }
  hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
  ASSERT_EQ(rdma_getaddrinfo("::ffff:127.0.0.1", port.c_str(), &hints, &rai), 0);
  rdma_cm_id* ep = nullptr;
  ASSERT_EQ(rdma_create_ep(&ep, rai, nullptr, nullptr), 0) << strerror(errno);
  ASSERT_NE(ep->verbs, nullptr);
  EXPECT_STREQ(ibv_get_device_name(ep->verbs->device), "softrdma_lo");
  EXPECT_EQ(str_of(rdma_get_local_addr(ep)), "::ffff:127.0.0.1");
  EXPECT_EQ(rdma_listen(ep, 2), 0);
  rdma_destroy_ep(ep);
  rdma_freeaddrinfo(rai);

  hints.ai_family = AF_IB;
  rai = nullptr;
  EXPECT_EQ(rdma_getaddrinfo("127.0.0.1", nullptr, &hints, &rai), EAI_FAMILY);
  EXPECT_EQ(rai, nullptr);
}

// ::1 is the loopback device's, as 127.0.0.1 is: the bind attaches softrdma_lo, and a client
// connects to [::1]:port over the CM's IPv6 sockets; the ids report ::1 in AF_INET6, the route's GIDs
// are softrdma_lo's (the data path is lo's), and a SEND crosses.
TEST(RdmaCmIpv6, LoopbackIpv6AddressConnects) {
  Id L;
  ASSERT_EQ(L.bind(addr6("::1", 0)), 0) << strerror(errno);
  ASSERT_NE(L.id->verbs, nullptr);
  EXPECT_STREQ(ibv_get_device_name(L.id->verbs->device), "softrdma_lo");
  EXPECT_EQ(str_of(rdma_get_local_addr(L.id)), "::1");
  const uint16_t port = ntohs(rdma_get_src_port(L.id));
  ASSERT_EQ(rdma_listen(L.id, 4), 0);

  Id C;
  sockaddr_in6 dst = addr6("::1", port);
  ASSERT_EQ(rdma_resolve_addr(C.id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0) << strerror(errno);
  rdma_cm_event* ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->status == 0) << name(ev);
  rdma_ack_cm_event(ev);
  ASSERT_NE(C.id->verbs, nullptr);
  EXPECT_STREQ(ibv_get_device_name(C.id->verbs->device), "softrdma_lo");
  EXPECT_EQ(str_of(rdma_get_local_addr(C.id)), "::1");
  EXPECT_EQ(str_of(rdma_get_peer_addr(C.id)), "::1");
  ASSERT_EQ(rdma_resolve_route(C.id, 2000), 0);
  ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ROUTE_RESOLVED) << name(ev);
  rdma_ack_cm_event(ev);
  char gid[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, C.id->route.addr.addr.ibaddr.dgid.raw, gid, sizeof gid);
  EXPECT_STREQ(gid, "::ffff:127.0.0.1") << "the data path is softrdma_lo's";

  const uint16_t c_port = ntohs(rdma_get_src_port(C.id));
  connect_and_send(L, C, "ipv6-loopback", [c_port](rdma_cm_id* child) {
    EXPECT_EQ(rdma_get_peer_addr(child)->sa_family, AF_INET6);
    EXPECT_EQ(str_of(rdma_get_peer_addr(child)), "::1");
    EXPECT_EQ(ntohs(rdma_get_dst_port(child)), c_port);
  });
}

// A link-local address is refused (EAFNOSUPPORT: its scope would travel with every GID), and an IPv6
// address of no interface here cannot be bound (EADDRNOTAVAIL, as the kernel says); the id stays
// usable for an IPv4 bind.
TEST(RdmaCmIpv6, LinkLocalAndForeignIpv6Addresses) {
  Id id;
  EXPECT_EQ(id.bind(addr6("fe80::1", 0)), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  sockaddr_in6 dst = addr6("fe80::1", 7471);
  EXPECT_EQ(rdma_resolve_addr(id.id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  EXPECT_EQ(id.bind(addr6("2001:db8::77", 0)), -1);  // documentation prefix, never configured
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  EXPECT_EQ(id.bind(addr("127.0.0.1", 0)), 0) << strerror(errno);
  EXPECT_EQ(rdma_get_local_addr(id.id)->sa_family, AF_INET);
}

}  // namespace
