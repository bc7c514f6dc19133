// net/frame_filter: the software match of frame rules, and the classic BPF program compiled from them,
// run by the kernel on a Unix datagram socket (a socket filter sees the datagram as its "packet").
#include "net/frame_filter.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

using namespace softrdma::net;

namespace {

std::vector<uint8_t> ipv4_udp_frame(uint8_t ihl_words, uint16_t dst_port) {
  std::vector<uint8_t> f(14 + ihl_words * 4 + 8 + 10, 0);
  const uint8_t dst[6] = {0x01, 0x50, 0x56, 0x19, 0x20, 0xa7};
  std::memcpy(f.data(), dst, 6);
  f[12] = 0x08;
  f[13] = 0x00;
  f[14] = static_cast<uint8_t>(0x40 | ihl_words);
  f[14 + 9] = 17;
  const size_t l4 = 14 + ihl_words * 4;
  f[l4 + 2] = static_cast<uint8_t>(dst_port >> 8);
  f[l4 + 3] = static_cast<uint8_t>(dst_port);
  return f;
}

FrameRule udp_port_rule(uint16_t port) {
  FrameRule r;
  r.l3 = FrameRule::L3::Ipv4;
  r.terms.push_back({FrameTerm::Base::L2, 12, 2, 0xFFFF, 0x0800});
  r.terms.push_back({FrameTerm::Base::L3, 9, 1, 0xFF, 17});
  r.terms.push_back({FrameTerm::Base::L4, 2, 2, 0xFFFF, port});
  return r;
}

FrameRule dst_mac_rule(uint8_t last) {
  FrameRule r;
  r.terms.push_back({FrameTerm::Base::L2, 0, 4, 0xFFFFFFFF, 0x01505619});
  r.terms.push_back({FrameTerm::Base::L2, 4, 2, 0xFFFF, uint32_t{0x2000} | last});
  return r;
}

bool sw(const std::vector<FrameRule>& rules, const std::vector<uint8_t>& f, bool vlan = false, uint16_t tci = 0) {
  return any_rule_matches(rules, FrameView{f.data(), static_cast<uint32_t>(f.size()), vlan, tci});
}

// Whether the kernel lets the frame through a socket carrying the compiled program.
bool bpf(const std::vector<FrameRule>& rules, const std::vector<uint8_t>& f) {
  int sv[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0, sv), 0);
  std::vector<sock_filter> prog = compile_bpf(rules);
  sock_fprog fp{static_cast<unsigned short>(prog.size()), prog.data()};
  EXPECT_EQ(setsockopt(sv[1], SOL_SOCKET, SO_ATTACH_FILTER, &fp, sizeof fp), 0) << "the kernel refused the program";
  EXPECT_EQ(send(sv[0], f.data(), f.size(), 0), static_cast<ssize_t>(f.size()));
  uint8_t buf[2048];
  ssize_t n = recv(sv[1], buf, sizeof buf, 0);
  close(sv[0]);
  close(sv[1]);
  return n == static_cast<ssize_t>(f.size());
}

TEST(FrameFilter, NoRulesMatchNothing) {
  auto f = ipv4_udp_frame(5, 5678);
  EXPECT_FALSE(sw({}, f));
  EXPECT_FALSE(bpf({}, f));
}

TEST(FrameFilter, EmptyRuleMatchesEverything) {
  auto f = ipv4_udp_frame(5, 5678);
  EXPECT_TRUE(sw({FrameRule{}}, f));
  EXPECT_TRUE(bpf({FrameRule{}}, f));
}

TEST(FrameFilter, MacRule) {
  auto f = ipv4_udp_frame(5, 5678);
  EXPECT_TRUE(sw({dst_mac_rule(0xa7)}, f));
  EXPECT_TRUE(bpf({dst_mac_rule(0xa7)}, f));
  EXPECT_FALSE(sw({dst_mac_rule(0xa8)}, f));
  EXPECT_FALSE(bpf({dst_mac_rule(0xa8)}, f));
}

TEST(FrameFilter, L4FollowsTheIpv4HeaderLength) {
  for (uint8_t ihl : {5, 6, 15}) {
    auto f = ipv4_udp_frame(ihl, 5678);
    EXPECT_TRUE(sw({udp_port_rule(5678)}, f)) << int(ihl);
    EXPECT_TRUE(bpf({udp_port_rule(5678)}, f)) << int(ihl);
    EXPECT_FALSE(sw({udp_port_rule(5679)}, f)) << int(ihl);
    EXPECT_FALSE(bpf({udp_port_rule(5679)}, f)) << int(ihl);
  }
}

TEST(FrameFilter, AShortFrameFailsOneRuleAndStillMatchesTheNext) {
  // A frame too short for the L4 rule: a BPF load past its end would drop it outright.
  auto f = ipv4_udp_frame(5, 5678);
  f.resize(14 + 20);
  std::vector<FrameRule> rules{udp_port_rule(5678), dst_mac_rule(0xa7)};
  EXPECT_TRUE(sw(rules, f));
  EXPECT_TRUE(bpf(rules, f));
  EXPECT_FALSE(sw({udp_port_rule(5678)}, f));
  EXPECT_FALSE(bpf({udp_port_rule(5678)}, f));
}

TEST(FrameFilter, MaskedCompare) {
  auto f = ipv4_udp_frame(5, 0x1234);
  FrameRule r = udp_port_rule(0);
  r.terms.back() = {FrameTerm::Base::L4, 2, 2, 0xFF00, 0x1200};
  EXPECT_TRUE(sw({r}, f));
  EXPECT_TRUE(bpf({r}, f));
  r.terms.back().value = 0x1300;
  EXPECT_FALSE(sw({r}, f));
  EXPECT_FALSE(bpf({r}, f));
}

TEST(FrameFilter, VlanIsMatchedInSoftware) {
  auto f = ipv4_udp_frame(5, 5678);
  FrameRule r;
  r.terms.push_back({FrameTerm::Base::Vlan, 0, 2, 0x0FFF, 0x0C0C});
  EXPECT_FALSE(sw({r}, f));
  EXPECT_TRUE(sw({r}, f, true, 0xA000 | 0x0C0C));
  EXPECT_FALSE(sw({r}, f, true, 0x0C0D));
  EXPECT_TRUE(bpf({r}, f)) << "the kernel filter lets the software decide";
}

TEST(FrameFilter, Ipv6L4IsAtTheFixedHeaderEnd) {
  std::vector<uint8_t> f(14 + 40 + 20, 0);
  f[12] = 0x86;
  f[13] = 0xDD;
  f[14 + 6] = 6;
  f[54 + 0] = 0x04;
  f[54 + 1] = 0xD2;  // source port 1234
  FrameRule r;
  r.l3 = FrameRule::L3::Ipv6;
  r.terms.push_back({FrameTerm::Base::L2, 12, 2, 0xFFFF, 0x86DD});
  r.terms.push_back({FrameTerm::Base::L4, 0, 2, 0xFFFF, 1234});
  EXPECT_TRUE(sw({r}, f));
  EXPECT_TRUE(bpf({r}, f));
  r.terms.back().value = 1235;
  EXPECT_FALSE(sw({r}, f));
  EXPECT_FALSE(bpf({r}, f));
}

}  // namespace
