// transport/raw: the Toeplitz hash (Microsoft's RSS verification vectors) and flow rules.
#include "transport/raw.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>

using namespace softrdma;
using namespace softrdma::transport;

namespace {

const std::vector<uint8_t> kMsKey = {
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
    0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
    0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa};

std::vector<uint8_t> udp4(const char* src, const char* dst, uint16_t sport, uint16_t dport) {
  std::vector<uint8_t> f(14 + 20 + 8, 0);
  f[12] = 0x08;
  f[14] = 0x45;
  f[14 + 9] = 17;
  inet_pton(AF_INET, src, f.data() + 26);
  inet_pton(AF_INET, dst, f.data() + 30);
  f[34] = static_cast<uint8_t>(sport >> 8);
  f[35] = static_cast<uint8_t>(sport);
  f[36] = static_cast<uint8_t>(dport >> 8);
  f[37] = static_cast<uint8_t>(dport);
  return f;
}

net::FrameView view(const std::vector<uint8_t>& f) { return {f.data(), static_cast<uint32_t>(f.size()), false, 0}; }

TEST(Rss, ToeplitzMatchesTheVerificationSuite) {
  // Microsoft's "Verifying the RSS Hash Calculation": destination 161.142.100.80:1766 from
  // 66.9.149.187:2794 hashes to 0x323e8fc2 over the addresses, 0x51ccc178 with the ports.
  auto f = udp4("66.9.149.187", "161.142.100.80", 2794, 1766);
  EXPECT_EQ(rss_hash(kMsKey, kHashSrcIpv4 | kHashDstIpv4, view(f)), 0x323e8fc2u);
  EXPECT_EQ(rss_hash(kMsKey, kHashSrcIpv4 | kHashDstIpv4 | kHashSrcPortUdp | kHashDstPortUdp, view(f)), 0x51ccc178u);
  auto g = udp4("199.92.111.2", "65.69.140.83", 14230, 4739);
  EXPECT_EQ(rss_hash(kMsKey, kHashSrcIpv4 | kHashDstIpv4, view(g)), 0xd718262au);
  EXPECT_EQ(rss_hash(kMsKey, kHashSrcIpv4 | kHashDstIpv4 | kHashSrcPortUdp | kHashDstPortUdp, view(g)), 0xc626b0eau);
  // TCP port fields do not apply to a UDP frame.
  EXPECT_EQ(rss_hash(kMsKey, kHashSrcIpv4 | kHashDstIpv4 | kHashSrcPortTcp, view(f)), 0x323e8fc2u);
}

TEST(Flow, Ipv4UdpRule) {
  FlowMatch m;
  m.has_ipv4 = true;
  m.ipv4.dst = 0x02020202;
  m.ipv4_mask.dst = 0xFFFFFFFF;
  m.l4 = FlowMatch::L4::Udp;
  m.ports.dst = 1766;
  m.ports_mask.dst = 0xFFFF;
  net::FrameRule r;
  ASSERT_TRUE(flow_rule(m, &r));
  auto f = udp4("1.1.1.1", "2.2.2.2", 9, 1766);
  EXPECT_TRUE(net::rule_matches(r, view(f)));
  f[37] ^= 1;  // another port
  EXPECT_FALSE(net::rule_matches(r, view(f)));
  f[37] ^= 1;
  f[14 + 9] = 6;  // TCP: the UDP spec implies protocol 17
  EXPECT_FALSE(net::rule_matches(r, view(f)));
}

TEST(Flow, SpecsThatCannotBeExpressed) {
  net::FrameRule r;
  FlowMatch l4_alone;
  l4_alone.l4 = FlowMatch::L4::Tcp;
  EXPECT_FALSE(flow_rule(l4_alone, &r));
  FlowMatch both;
  both.has_ipv4 = both.has_ipv6 = true;
  EXPECT_FALSE(flow_rule(both, &r));
}

}  // namespace
