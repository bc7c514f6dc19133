// rdma_bind_addr and rdma_getaddrinfo as libfabric's verbs provider uses them to find the RDMA device
// behind each interface (vrb_ifa_rdma_info) and its default source (vrb_get_rai_id): a local interface
// address attaches the id to that address's device; the wildcard and loopback addresses attach none
// (id->verbs NULL; the kernel would attach a device holding 127.0.0.1, see docs/rdmacm.md); rdma_getaddrinfo without node and service takes the
// addresses from the hints (rdma_getaddrinfo(3)). No datagram leaves this host: nothing here connects.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace {

sockaddr_in addr(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

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

// The wildcard and any 127/8 address bind (an ephemeral port is taken) but attach no device (for 127/8
// a departure from the kernel, docs/rdmacm.md). libfabric binds "localhost" for an endpoint without a
// source address and gives every device its own address only when id->verbs is NULL; with softrdma_lo attached (a device libfabric
// never offers for FI_EP_MSG, lo being a loopback interface) fi_getinfo(FI_EP_MSG) found nothing.
TEST(RdmaCmBind, WildcardAndLoopbackAttachNoDevice) {
  for (const char* ip : {"0.0.0.0", "127.0.0.1", "127.0.0.2"}) {
    SCOPED_TRACE(ip);
    rdma_cm_id* id = nullptr;
    ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);
    sockaddr_in a = addr(ip, 0);
    ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)), 0) << strerror(errno);
    EXPECT_EQ(id->verbs, nullptr);
    EXPECT_NE(rdma_get_src_port(id), 0);
    EXPECT_EQ(ip_of(rdma_get_local_addr(id)), ip);
    EXPECT_EQ(rdma_listen(id, 4), 0);
    rdma_destroy_id(id);
  }
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
