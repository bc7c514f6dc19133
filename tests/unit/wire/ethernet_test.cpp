// wire/ethernet: the checksums IBV_SEND_IP_CSUM fills in, for IPv4 and IPv6 frames.
#include "wire/ethernet.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

using namespace softrdma::wire;

namespace {

// 192.168.0.1 -> 192.168.0.199, UDP, total length 0x73: the header checksum is 0xb861.
std::vector<uint8_t> frame(uint8_t proto, uint16_t flags_frag = 0x4000) {
  std::vector<uint8_t> f(14 + 0x73, 0);
  f[12] = 0x08;
  const uint8_t ip[20] = {0x45, 0x00, 0x00, 0x73, 0x00, 0x00, static_cast<uint8_t>(flags_frag >> 8),
                          static_cast<uint8_t>(flags_frag), 0x40, proto, 0x12, 0x34, 0xc0, 0xa8, 0x00, 0x01,
                          0xc0, 0xa8, 0x00, 0xc7};
  std::memcpy(f.data() + 14, ip, 20);
  for (size_t i = 34; i < f.size(); ++i) f[i] = static_cast<uint8_t>(i * 7);
  return f;
}

uint16_t fold(uint32_t s) {
  while (s >> 16) s = (s & 0xFFFF) + (s >> 16);
  return static_cast<uint16_t>(s);
}

TEST(Ethernet, Ipv4HeaderChecksum) {
  auto f = frame(17);
  ASSERT_TRUE(fill_ip_checksums(f.data(), static_cast<uint32_t>(f.size())));
  EXPECT_EQ(f[24], 0xb8);
  EXPECT_EQ(f[25], 0x61);
}

TEST(Ethernet, UdpAndTcpChecksumsVerify) {
  for (uint8_t proto : {uint8_t{6}, uint8_t{17}}) {
    auto f = frame(proto);
    ASSERT_TRUE(fill_ip_checksums(f.data(), static_cast<uint32_t>(f.size())));
    // Summed with the pseudo-header, a correct checksum gives all ones.
    uint32_t sum = ones_sum(f.data() + 26, 8) + proto + (0x73 - 20);
    EXPECT_EQ(fold(ones_sum(f.data() + 34, 0x73 - 20, sum)), 0xFFFF) << int(proto);
  }
}

// fd77::1 -> fd77::2, next header proto, 0x60 bytes of payload, after an 802.1Q tag.
std::vector<uint8_t> frame6(uint8_t proto) {
  std::vector<uint8_t> f(18 + 40 + 0x60, 0);
  f[12] = 0x81;
  f[16] = 0x86;
  f[17] = 0xDD;
  uint8_t* ip = f.data() + 18;
  ip[0] = 0x60;
  ip[5] = 0x60;
  ip[6] = proto;
  ip[7] = 64;
  ip[8] = ip[24] = 0xfd;
  ip[9] = ip[25] = 0x77;
  ip[23] = 1;
  ip[39] = 2;
  for (size_t i = 58; i < f.size(); ++i) f[i] = static_cast<uint8_t>(i * 13 + 5);
  return f;
}

// RFC 8200 8.1's pseudo-header: both addresses, the upper-layer length (32 bits), the next header.
TEST(Ethernet, Ipv6UdpAndTcpChecksumsVerify) {
  for (uint8_t proto : {uint8_t{6}, uint8_t{17}}) {
    auto f = frame6(proto);
    ASSERT_TRUE(fill_ip_checksums(f.data(), static_cast<uint32_t>(f.size())));
    const uint8_t* ip = f.data() + 18;
    uint32_t sum = 0;
    for (int i = 8; i < 40; i += 2) sum += uint32_t{ip[i]} << 8 | ip[i + 1];
    sum += proto + 0x60;
    for (int i = 40; i < 40 + 0x60; i += 2) sum += uint32_t{ip[i]} << 8 | ip[i + 1];
    EXPECT_EQ(fold(sum), 0xFFFF) << int(proto);
    const int at = 40 + (proto == 6 ? 16 : 6);
    EXPECT_NE(ip[at] | ip[at + 1], 0) << "a checksum was written";
  }
  // Behind an extension header (hop-by-hop, 0) the datagram is left as it is.
  auto h = frame6(0);
  const auto before = h;
  EXPECT_TRUE(fill_ip_checksums(h.data(), static_cast<uint32_t>(h.size())));
  EXPECT_EQ(h, before);
  EXPECT_FALSE(fill_ip_checksums(h.data(), 18 + 40 + 0x5F)) << "payload length past the frame";
}

TEST(Ethernet, FragmentsAndOtherFramesKeepTheirL4Bytes) {
  auto f = frame(17, 0x2000);  // more fragments
  const uint8_t before[2] = {f[40], f[41]};
  ASSERT_TRUE(fill_ip_checksums(f.data(), static_cast<uint32_t>(f.size())));
  EXPECT_EQ(f[40], before[0]);
  EXPECT_EQ(f[41], before[1]);
  auto g = frame(17);
  g[12] = 0x86;
  g[13] = 0xDD;
  EXPECT_FALSE(fill_ip_checksums(g.data(), static_cast<uint32_t>(g.size()))) << "IPv6's EtherType, an IPv4 header";
  auto h = frame(17);
  EXPECT_FALSE(fill_ip_checksums(h.data(), 30)) << "truncated";
}

}  // namespace
