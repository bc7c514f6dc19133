// wire::IpAddress: the GID form of both families, and its conversions to and from socket addresses.
#include "wire/ip_address.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <unordered_set>

namespace softrdma::wire {
namespace {

IpAddress addr(const char* text) {
  IpAddress a;
  EXPECT_TRUE(parse(text, &a)) << text;
  return a;
}

TEST(IpAddress, Ipv4IsItsMappedGid) {
  const IpAddress a = IpAddress::v4(inet_addr("10.1.2.3"));
  const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 1, 2, 3};
  EXPECT_EQ(std::memcmp(a.bytes.data(), gid, 16), 0);
  EXPECT_TRUE(a.is_v4());
  EXPECT_EQ(a.v4_be(), inet_addr("10.1.2.3"));
  EXPECT_EQ(a.family(), AF_INET);
  EXPECT_EQ(a, addr("10.1.2.3"));
  EXPECT_EQ(a, addr("::ffff:10.1.2.3")) << "the mapped text is the same address";
  EXPECT_EQ(to_string(a), "10.1.2.3");
  EXPECT_EQ(a.key(), inet_addr("10.1.2.3")) << "an IPv4 address is its own key";
}

TEST(IpAddress, Ipv6Properties) {
  const IpAddress g = addr("fd00::2"), ll = addr("fe80::fc:ff:fe00:1"), lo = addr("::1");
  EXPECT_FALSE(g.is_v4());
  EXPECT_EQ(g.v4_be(), 0u);
  EXPECT_EQ(g.family(), AF_INET6);
  EXPECT_EQ(to_string(g), "fd00::2");
  EXPECT_TRUE(ll.is_link_local());
  EXPECT_FALSE(g.is_link_local());
  EXPECT_TRUE(lo.is_loopback());
  EXPECT_TRUE(addr("127.0.0.5").is_loopback());
  EXPECT_FALSE(g.is_loopback());
  EXPECT_TRUE(addr("ff02::1").is_multicast());
  EXPECT_TRUE(addr("239.1.1.1").is_multicast());
  EXPECT_FALSE(g.is_multicast());
  EXPECT_FALSE(IpAddress{}.is_set());
  EXPECT_FALSE(addr("0.0.0.0").is_set());
  EXPECT_TRUE(g.is_set());
  IpAddress out;
  EXPECT_FALSE(parse("fd00::zz", &out));
  EXPECT_FALSE(parse("10.1.2", &out));
}

// Keys name an IPv6 address in 32 bits inside 0.0.0.0/8 (no unicast IPv4 address), the same for the
// same address and spread over many: the host registry and the direct path's socket names rely on it.
TEST(IpAddress, Ipv6KeysAreStableAndOutsideIpv4) {
  std::unordered_set<uint32_t> keys;
  for (int i = 1; i <= 1000; ++i) {
    IpAddress a = addr("fd00::");
    a.bytes[14] = static_cast<uint8_t>(i >> 8);
    a.bytes[15] = static_cast<uint8_t>(i);
    const uint32_t k = a.key();
    EXPECT_EQ(k, a.key());
    EXPECT_EQ(k & 0xFF, 0u) << "first byte (network order) is 0";
    keys.insert(k);
  }
  EXPECT_GE(keys.size(), 999u);
}

TEST(IpAddress, SocketAddressesRoundTrip) {
  sockaddr_storage ss;
  IpAddress back;
  uint16_t port = 0;
  ASSERT_EQ(to_sockaddr(addr("192.0.2.9"), 4791, &ss), sizeof(sockaddr_in));
  EXPECT_EQ(ss.ss_family, AF_INET);
  EXPECT_EQ(reinterpret_cast<sockaddr_in*>(&ss)->sin_port, htons(4791));
  ASSERT_TRUE(from_sockaddr(reinterpret_cast<sockaddr*>(&ss), &back, &port));
  EXPECT_EQ(back, addr("192.0.2.9"));
  EXPECT_EQ(port, 4791);

  ASSERT_EQ(to_sockaddr(addr("fe80::1"), 5000, &ss, 7), sizeof(sockaddr_in6));
  auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
  EXPECT_EQ(s6->sin6_family, AF_INET6);
  EXPECT_EQ(s6->sin6_scope_id, 7u) << "a link-local address carries its interface";
  ASSERT_TRUE(from_sockaddr(reinterpret_cast<sockaddr*>(&ss), &back, &port));
  EXPECT_EQ(back, addr("fe80::1"));
  EXPECT_EQ(port, 5000);
  ASSERT_EQ(to_sockaddr(addr("fd00::1"), 1, &ss, 7), sizeof(sockaddr_in6));
  EXPECT_EQ(s6->sin6_scope_id, 0u) << "a global address has no scope";

  // An IPv4-mapped AF_INET6 address (a dual-stack socket's view of IPv4) is that IPv4 address.
  sockaddr_in6 mapped{};
  mapped.sin6_family = AF_INET6;
  ASSERT_EQ(inet_pton(AF_INET6, "::ffff:10.9.8.7", &mapped.sin6_addr), 1);
  ASSERT_TRUE(from_sockaddr(reinterpret_cast<sockaddr*>(&mapped), &back));
  EXPECT_TRUE(back.is_v4());
  EXPECT_EQ(back, addr("10.9.8.7"));
  sockaddr other{};
  other.sa_family = AF_UNIX;
  EXPECT_FALSE(from_sockaddr(&other, &back));
}

}  // namespace
}  // namespace softrdma::wire
