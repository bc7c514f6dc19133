#include "net/interfaces.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <set>

#include <gtest/gtest.h>

namespace softrdma::net {
namespace {

uint32_t ip(const char* s) {
  in_addr a{};
  EXPECT_EQ(inet_pton(AF_INET, s, &a), 1);
  return a.s_addr;
}

TEST(Interfaces, LoopbackIsAlwaysLast) {
  auto list = list_interfaces();
  ASSERT_FALSE(list.empty());
  const Interface& lo = list.back();
  EXPECT_EQ(lo.ifname, "lo");
  EXPECT_EQ(lo.ip, wire::IpAddress::v4(ip("127.0.0.1")));
  EXPECT_TRUE(lo.loopback);
  EXPECT_EQ(lo.netmask_be, ip("255.0.0.0"));
  EXPECT_GT(lo.mtu, 0u);
  EXPECT_GT(lo.ifindex, 0);
}

TEST(Interfaces, NonLoopbackFirstSortedAndUnique) {
  auto list = list_interfaces();
  bool seen_loopback = false;
  int last_index = -1;
  std::set<wire::IpAddress> ips;
  for (const Interface& itf : list) {
    EXPECT_TRUE(ips.insert(itf.ip).second) << itf.ifname << " listed twice";
    EXPECT_FALSE(itf.ip.is_link_local()) << itf.ifname << ": link-local addresses are no devices";
    EXPECT_GT(itf.mtu, 0u) << itf.ifname;
    if (itf.loopback) {
      seen_loopback = true;
      continue;
    }
    EXPECT_FALSE(seen_loopback) << itf.ifname << " comes after a loopback entry";
    EXPECT_GE(itf.ifindex, last_index) << itf.ifname;
    last_index = itf.ifindex;
  }
}

TEST(Interfaces, LocalIpRecognisesOwnAddressesOnly) {
  EXPECT_TRUE(is_local_ip(wire::IpAddress::v4(ip("127.0.0.1"))));
  EXPECT_TRUE(is_local_ip(wire::IpAddress::v4(ip("127.9.8.7"))));  // all of 127/8 reaches this host
  wire::IpAddress v6;
  ASSERT_TRUE(wire::parse("::1", &v6));
  EXPECT_TRUE(is_local_ip(v6));
  for (const Interface& itf : list_interfaces()) EXPECT_TRUE(is_local_ip(itf.ip)) << itf.ifname;
  EXPECT_FALSE(is_local_ip(wire::IpAddress::v4(ip("192.0.2.77"))));  // TEST-NET-1, never configured here
  EXPECT_FALSE(is_local_ip(wire::IpAddress::v4(ip("0.0.0.0"))));
  ASSERT_TRUE(wire::parse("2001:db8::77", &v6));  // documentation prefix, never configured here
  EXPECT_FALSE(is_local_ip(v6));
}

TEST(Interfaces, NetnsInodeMatchesProc) {
  struct stat st{};
  ASSERT_EQ(stat("/proc/self/ns/net", &st), 0);
  EXPECT_NE(netns_inode(), 0u);
  EXPECT_EQ(netns_inode(), static_cast<uint32_t>(st.st_ino));
}

}  // namespace
}  // namespace softrdma::net
