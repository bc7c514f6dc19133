// rdma_bind_addr and rdma_getaddrinfo as libfabric's verbs provider uses them to find the RDMA device
// behind each interface (vrb_ifa_rdma_info) and its default source (vrb_get_rai_id): a local interface
// address attaches the id to that address's device, a loopback address the loopback device (as the
// kernel attaches the device holding 127.0.0.1), the wildcard none, and libfabric's probe of
// "localhost" none (docs/rdmacm.md); rdma_getaddrinfo without node and service takes the addresses
// from the hints (rdma_getaddrinfo(3)); an id bound to 127.0.0.1 listens, and its device, PD and a QP
// made from them carry a connection. No datagram leaves this host.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>

#include <gtest/gtest.h>

#include "cm_helpers.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace {

using softrdma::cm_test::addr;

std::string ip_of(const sockaddr* a) {
  char s[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, s, sizeof s);
  return s;
}

// The IPv4 addresses of the interfaces that are up and not loopback (what libfabric probes for FI_EP_MSG).
std::vector<std::string> interface_ips() {
  std::vector<std::string> ips;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return ips;
  for (ifaddrs* i = list; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK))
      ips.push_back(ip_of(i->ifa_addr));
  freeifaddrs(list);
  return ips;
}

std::vector<std::string> device_names() {
  std::vector<std::string> names;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  for (int i = 0; list && i < n; ++i) names.emplace_back(ibv_get_device_name(list[i]));
  if (list) ibv_free_device_list(list);
  return names;
}

// vrb_ifa_rdma_info's steps for every interface address: rdma_getaddrinfo(RAI_PASSIVE | RAI_NUMERICHOST),
// rdma_create_id, rdma_bind_addr; the id must then hold a device of ibv_get_device_list whose GID 0 is
// the address (IPv4-mapped).
TEST(RdmaCmBind, InterfaceAddressAttachesItsDevice) {
  const auto ips = interface_ips();
  if (ips.empty()) GTEST_SKIP() << "no IPv4 interface other than loopback is up";
  const auto names = device_names();
  for (const std::string& ip : ips) {
    SCOPED_TRACE(ip);
    rdma_addrinfo hints{};
    hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
    rdma_addrinfo* rai = nullptr;
    ASSERT_EQ(rdma_getaddrinfo(ip.c_str(), nullptr, &hints, &rai), 0);
    rdma_cm_id* id = nullptr;
    ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
    ASSERT_EQ(rdma_bind_addr(id, rai->ai_src_addr), 0) << strerror(errno);
    ASSERT_NE(id->verbs, nullptr);
    // As librdmacm: the device's default PD comes with it (pyverbs' CMID builds its objects on it).
    ASSERT_NE(id->pd, nullptr);
    EXPECT_EQ(id->pd->context, id->verbs);
    const std::string dev = ibv_get_device_name(id->verbs->device);
    EXPECT_NE(std::find(names.begin(), names.end(), dev), names.end()) << dev << " is not in ibv_get_device_list";
    ibv_gid gid{};
    ASSERT_EQ(ibv_query_gid(id->verbs, id->port_num, 0, &gid), 0);
    EXPECT_EQ(std::memcmp(gid.raw + 12, &reinterpret_cast<sockaddr_in*>(rai->ai_src_addr)->sin_addr, 4), 0)
        << dev << "'s GID 0 is not " << ip;
    EXPECT_EQ(ip_of(rdma_get_local_addr(id)), ip);
    EXPECT_NE(rdma_get_src_port(id), 0);
    rdma_destroy_id(id);
    rdma_freeaddrinfo(rai);
  }
}

// The wildcard binds (an ephemeral port is taken) and attaches no device: connections made through the
// id find theirs later.
TEST(RdmaCmBind, WildcardAttachesNoDevice) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in a = addr("0.0.0.0", 0);
  ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)), 0) << strerror(errno);
  EXPECT_EQ(id->verbs, nullptr);
  EXPECT_NE(rdma_get_src_port(id), 0);
  EXPECT_EQ(ip_of(rdma_get_local_addr(id)), "0.0.0.0");
  EXPECT_EQ(rdma_listen(id, 4), 0);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
}

// Any 127/8 address attaches the loopback device (whose GID 0 is ::ffff:127.0.0.1) with its default
// PD, as the kernel attaches the device holding the address: a PD, a CQ and a QP can be made from the
// bound id (pyverbs' CMID does so), and it listens.
TEST(RdmaCmBind, LoopbackAttachesTheLoopbackDevice) {
  const in_addr_t lo = htonl(INADDR_LOOPBACK);
  for (const char* ip : {"127.0.0.1", "127.0.0.2"}) {
    for (bool explicit_port : {false, true}) {
      SCOPED_TRACE(std::string(ip) + (explicit_port ? " explicit port" : " port 0"));
      rdma_event_channel* ch = rdma_create_event_channel();
      ASSERT_NE(ch, nullptr);
      rdma_cm_id* id = nullptr;
      ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
      sockaddr_in a = addr(ip, 0);
      if (explicit_port) {  // a free port: bind one id to learn it, release it, bind again explicitly
        ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)), 0) << strerror(errno);
        a.sin_port = rdma_get_src_port(id);
        rdma_destroy_id(id);
        ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
      }
      ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)), 0) << strerror(errno);
      ASSERT_NE(id->verbs, nullptr);
      EXPECT_STREQ(ibv_get_device_name(id->verbs->device), "softrdma_lo");
      EXPECT_EQ(id->port_num, 1);
      ibv_gid gid{};
      ASSERT_EQ(ibv_query_gid(id->verbs, id->port_num, 0, &gid), 0);
      EXPECT_EQ(std::memcmp(gid.raw + 12, &lo, 4), 0);
      EXPECT_EQ(std::memcmp(id->route.addr.addr.ibaddr.sgid.raw, gid.raw, sizeof gid.raw), 0);
      ASSERT_NE(id->pd, nullptr);
      EXPECT_EQ(id->pd->context, id->verbs);
      ibv_pd* pd = ibv_alloc_pd(id->verbs);
      ASSERT_NE(pd, nullptr);
      ibv_cq* cq = ibv_create_cq(id->verbs, 4, nullptr, nullptr, 0);
      ASSERT_NE(cq, nullptr);
      ibv_qp_init_attr qa{};
      qa.send_cq = qa.recv_cq = cq;
      qa.qp_type = IBV_QPT_RC;
      qa.cap.max_send_wr = qa.cap.max_recv_wr = 2;
      qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
      ASSERT_EQ(rdma_create_qp(id, pd, &qa), 0) << strerror(errno);
      EXPECT_EQ(id->qp->context, id->verbs);
      EXPECT_EQ(ip_of(rdma_get_local_addr(id)), ip);
      EXPECT_EQ(rdma_listen(id, 4), 0);
      rdma_destroy_qp(id);
      ibv_destroy_cq(cq);
      ibv_dealloc_pd(pd);
      rdma_destroy_id(id);
      rdma_destroy_event_channel(ch);
    }
  }
}

// libfabric's verbs provider, for an endpoint without a source address, binds "localhost" on a
// synchronous id with port 0 and then keeps only the domains of the device attached: that probe
// attaches none (softrdma_lo would leave FI_EP_MSG no domain). A synchronous id bound to loopback
// with a port attaches the device as any other.
TEST(RdmaCmBind, LibfabricLocalhostProbeAttachesNoDevice) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE;
  rdma_addrinfo* rai = nullptr;
  ASSERT_EQ(rdma_getaddrinfo("localhost", nullptr, &hints, &rai), 0);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_bind_addr(id, rai->ai_src_addr), 0) << strerror(errno);
  EXPECT_EQ(id->verbs, nullptr);
  EXPECT_NE(rdma_get_src_port(id), 0);
  const uint16_t port = rdma_get_src_port(id);
  rdma_destroy_id(id);
  rdma_freeaddrinfo(rai);

  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in a = addr("127.0.0.1", 0);
  a.sin_port = port;
  ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)), 0) << strerror(errno);
  ASSERT_NE(id->verbs, nullptr);
  EXPECT_STREQ(ibv_get_device_name(id->verbs->device), "softrdma_lo");
  rdma_destroy_id(id);
}

// A listener bound to 127.0.0.1 carries a connection on the objects made from its bound id, as
// pyverbs' CMID does: the accepted id is on the listener's device and PD, and a SEND from the client
// lands in a buffer registered on the listener's PD.
TEST(RdmaCmBind, LoopbackBoundListenerConnectsOnItsDevice) {
  using namespace softrdma::cm_test;
  Listener L;
  ASSERT_NE(L.port, 0);
  ASSERT_NE(L.id->verbs, nullptr);
  ASSERT_NE(L.id->pd, nullptr);
  std::vector<uint8_t> sbuf(256, 0);
  ibv_mr* smr = ibv_reg_mr(L.id->pd, sbuf.data(), sbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(smr, nullptr);
  ibv_cq* scq = ibv_create_cq(L.id->verbs, 4, nullptr, nullptr, 0);
  ASSERT_NE(scq, nullptr);

  Client C;
  ASSERT_TRUE(C.resolve(L.port));
  Side cs;
  ASSERT_TRUE(cs.setup(C.id, 256));
  rdma_cm_id* child = connect_for_request(C.id, L.ch);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->verbs, L.id->verbs);
  EXPECT_EQ(child->pd, L.id->pd);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = scq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 2;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  ASSERT_EQ(rdma_create_qp(child, L.id->pd, &qa), 0) << strerror(errno);
  ibv_sge rs{reinterpret_cast<uint64_t>(sbuf.data()), static_cast<uint32_t>(sbuf.size()), smr->lkey};
  ASSERT_EQ(post_recv_one(child->qp, rs, 5), 0);
  ASSERT_EQ(accept_until_established(child, C.ch), "");
  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->id == child) << name(ev);
  rdma_ack_cm_event(ev);

  for (size_t i = 0; i < 256; ++i) cs.buf[i] = static_cast<uint8_t>(i * 13 + 1);
  ASSERT_EQ(post_send_one(C.id->qp, cs.sge(0, 256), 6), 0);
  EXPECT_EQ(cs.poll_one().status, IBV_WC_SUCCESS);
  ibv_wc wc{};
  for (int i = 0; i < kWaitMs * 10 && ibv_poll_cq(scq, 1, &wc) == 0; ++i) usleep(100);
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.byte_len, 256u);
  EXPECT_EQ(std::memcmp(sbuf.data(), cs.buf.data(), 256), 0);

  ASSERT_EQ(rdma_disconnect(C.id), 0);
  ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_DISCONNECTED && ev->id == child) << name(ev);
  rdma_ack_cm_event(ev);
  rdma_destroy_qp(child);
  EXPECT_EQ(rdma_destroy_id(child), 0);
  ibv_destroy_cq(scq);
  ibv_dereg_mr(smr);
}

TEST(RdmaCmBind, AddressOfNoLocalInterfaceIsNotAvailable) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in a = addr("203.0.113.77", 0);  // TEST-NET-3: never a local address
  EXPECT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  EXPECT_EQ(id->verbs, nullptr);
  rdma_destroy_id(id);
}

// RAI_PASSIVE | RAI_NUMERICHOST: one IPv4 source address with the node's address and port 0, no
// destination, the TCP port space and RC; RAI_NUMERICHOST refuses a name.
TEST(RdmaCmGetaddrinfo, PassiveNumericHost) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
  rdma_addrinfo* rai = nullptr;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", nullptr, &hints, &rai), 0);
  ASSERT_NE(rai, nullptr);
  EXPECT_EQ(rai->ai_family, AF_INET);
  EXPECT_TRUE(rai->ai_flags & RAI_PASSIVE);
  EXPECT_EQ(rai->ai_port_space, RDMA_PS_TCP);
  EXPECT_EQ(rai->ai_qp_type, IBV_QPT_RC);
  ASSERT_NE(rai->ai_src_addr, nullptr);
  EXPECT_EQ(rai->ai_src_len, sizeof(sockaddr_in));
  EXPECT_EQ(rai->ai_src_addr->sa_family, AF_INET);
  EXPECT_EQ(ip_of(rai->ai_src_addr), "127.0.0.1");
  EXPECT_EQ(reinterpret_cast<sockaddr_in*>(rai->ai_src_addr)->sin_port, 0);
  EXPECT_EQ(rai->ai_dst_addr, nullptr);
  EXPECT_EQ(rai->ai_dst_len, 0u);
  EXPECT_EQ(rai->ai_next, nullptr);
  rdma_freeaddrinfo(rai);

  // A service alone: the wildcard address with that port.
  hints.ai_flags = RAI_PASSIVE;
  ASSERT_EQ(rdma_getaddrinfo(nullptr, "7471", &hints, &rai), 0);
  ASSERT_NE(rai->ai_src_addr, nullptr);
  EXPECT_EQ(ip_of(rai->ai_src_addr), "0.0.0.0");
  EXPECT_EQ(ntohs(reinterpret_cast<sockaddr_in*>(rai->ai_src_addr)->sin_port), 7471);
  rdma_freeaddrinfo(rai);

  hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
  rai = nullptr;
  EXPECT_NE(rdma_getaddrinfo("localhost", nullptr, &hints, &rai), 0);
  EXPECT_EQ(rai, nullptr);
}

// Without node and service the result holds the hints' addresses (how libfabric's verbs provider asks
// for a connecting endpoint with fi_getinfo(NULL, NULL) and a destination in its hints).
TEST(RdmaCmGetaddrinfo, AddressesFromHints) {
  sockaddr_in dst = addr("10.77.0.2", 47592), src = addr("10.77.0.1", 0);
  rdma_addrinfo hints{};
  hints.ai_dst_addr = reinterpret_cast<sockaddr*>(&dst);
  hints.ai_dst_len = sizeof dst;
  rdma_addrinfo* rai = nullptr;
  ASSERT_EQ(rdma_getaddrinfo(nullptr, nullptr, &hints, &rai), 0);
  ASSERT_NE(rai->ai_dst_addr, nullptr);
  EXPECT_EQ(rai->ai_dst_len, sizeof(sockaddr_in));
  EXPECT_EQ(std::memcmp(rai->ai_dst_addr, &dst, sizeof dst), 0);
  EXPECT_EQ(rai->ai_src_addr, nullptr);
  EXPECT_EQ(rai->ai_src_len, 0u);
  EXPECT_EQ(rai->ai_family, AF_INET);
  EXPECT_EQ(rai->ai_qp_type, IBV_QPT_RC);
  rdma_freeaddrinfo(rai);

  hints.ai_src_addr = reinterpret_cast<sockaddr*>(&src);
  hints.ai_src_len = sizeof src;
  ASSERT_EQ(rdma_getaddrinfo(nullptr, nullptr, &hints, &rai), 0);
  ASSERT_NE(rai->ai_src_addr, nullptr);
  ASSERT_NE(rai->ai_dst_addr, nullptr);
  EXPECT_EQ(std::memcmp(rai->ai_src_addr, &src, sizeof src), 0);
  EXPECT_EQ(std::memcmp(rai->ai_dst_addr, &dst, sizeof dst), 0);
  rdma_freeaddrinfo(rai);

  // Passive: the source only.
  hints.ai_flags = RAI_PASSIVE;
  ASSERT_EQ(rdma_getaddrinfo(nullptr, nullptr, &hints, &rai), 0);
  ASSERT_NE(rai->ai_src_addr, nullptr);
  EXPECT_EQ(std::memcmp(rai->ai_src_addr, &src, sizeof src), 0);
  EXPECT_EQ(rai->ai_dst_addr, nullptr);
  rdma_freeaddrinfo(rai);

  // Neither node, service nor an address.
  rdma_addrinfo empty{};
  EXPECT_EQ(rdma_getaddrinfo(nullptr, nullptr, &empty, &rai), -1);
  EXPECT_EQ(errno, EINVAL);
}

}  // namespace
