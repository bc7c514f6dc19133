#include "wire/icrc.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "wire/headers.h"

namespace softrdma::wire {
namespace {

IpAddress ip_be(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  const uint8_t bytes[4] = {a, b, c, d};
  uint32_t v;
  std::memcpy(&v, bytes, 4);
  return IpAddress::v4(v);
}

uint32_t read_le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// What a receiver that sees the real IPv4/UDP headers (raw capture) derives from them.
UdpAddr addr_from_headers(const uint8_t* ip) {
  UdpAddr a{};
  uint32_t src, dst;
  std::memcpy(&src, ip + 12, 4);
  std::memcpy(&dst, ip + 16, 4);
  a.src_ip = IpAddress::v4(src);
  a.dst_ip = IpAddress::v4(dst);
  a.ip_id = static_cast<uint16_t>(ip[4] << 8 | ip[5]);
  a.src_port = static_cast<uint16_t>(ip[20] << 8 | ip[21]);
  a.dst_port = static_cast<uint16_t>(ip[22] << 8 | ip[23]);
  return a;
}

// A RoCEv2 CNP captured from a Mellanox ConnectX-4 Lx NIC (published in scapy's test/contrib/roce.uts),
// Ethernet header stripped: IPv4 10.0.17.1 -> 10.0.18.1, TOS 0xC2, id 0x718C, DF, TTL 64, checksum
// 0x9161; UDP 0 -> 4791, checksum 0; BTH opcode 0x81 with BECN set in resv8a, DestQP 0x118; 16 bytes of
// CNP padding; ICRC 82 fd 00 2a as sent by the hardware.
const uint8_t kCx4Cnp[] = {
    0x45, 0xC2, 0x00, 0x3C, 0x71, 0x8C, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0A, 0x00, 0x11, 0x01,  // IPv4
    0x0A, 0x00, 0x12, 0x01,                                                                          //
    0x00, 0x00, 0x12, 0xB7, 0x00, 0x28, 0x00, 0x00,                                                  // UDP
    0x81, 0x00, 0xFF, 0xFF, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00,                          // BTH
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // pad
    0x82, 0xFD, 0x00, 0x2A,                                                                          // ICRC
};
constexpr size_t kIpUdp = 28;

TEST(Icrc, MatchesRealConnectX4Packet) {
  const UdpAddr a = addr_from_headers(kCx4Cnp);
  EXPECT_EQ(a.src_ip, ip_be(10, 0, 17, 1));
  EXPECT_EQ(a.dst_port, kRoceUdpPort);
  const uint8_t* bth = kCx4Cnp + kIpUdp;
  const size_t len = sizeof kCx4Cnp - kIpUdp - kIcrcLen;
  EXPECT_EQ(compute_icrc(a, bth, len), 0x2A00FD82u);
  EXPECT_TRUE(check_icrc(a, bth, len + kIcrcLen));
}

// The fields IBTA masks may be rewritten in flight: the NIC's ICRC must still check.
TEST(Icrc, MaskedFieldsOfRealPacketDoNotMatter) {
  for (size_t off : {size_t{1}, size_t{8}, size_t{10}, size_t{11}, size_t{26}, size_t{27}, kIpUdp + 4}) {
    uint8_t pkt[sizeof kCx4Cnp];
    std::memcpy(pkt, kCx4Cnp, sizeof pkt);
    pkt[off] ^= 0x5A;  // TOS, TTL, IP checksum, UDP checksum, BTH resv8a
    const UdpAddr a = addr_from_headers(pkt);
    EXPECT_TRUE(check_icrc(a, pkt + kIpUdp, sizeof pkt - kIpUdp)) << off;
  }
  // The identification is covered.
  uint8_t pkt[sizeof kCx4Cnp];
  std::memcpy(pkt, kCx4Cnp, sizeof pkt);
  pkt[5] ^= 1;
  EXPECT_FALSE(check_icrc(addr_from_headers(pkt), pkt + kIpUdp, sizeof pkt - kIpUdp));
}

// UC SEND ONLY from scapy's RoCE regression test: 192.168.0.7 -> 192.168.0.7, IP id 1144, UDP 49152 ->
// 4791; scapy's ICRC bytes 78 f3 53 f3.
TEST(Icrc, MatchesScapyUcSendOnly) {
  uint8_t pkt[] = {0x24, 0x60, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0xD3, 0x00, 0xCF, 0x17, 0x10,
                   0x46, 0x30, 0x81, 0x8B, 0xE2, 0x89, 0x35, 0xD9, 0x0E, 0x9A, 0x95, 0x50,
                   0x54, 0x01, 0xBE, 0x88, 0x5E, 0x50, 0x00, 0x00, 0x78, 0xF3, 0x53, 0xF3};
  UdpAddr a{ip_be(192, 168, 0, 7), ip_be(192, 168, 0, 7), 49152, kRoceUdpPort};
  a.ip_id = 1144;
  EXPECT_TRUE(check_icrc(a, pkt, sizeof pkt));
  uint8_t copy[sizeof pkt];
  std::memcpy(copy, pkt, sizeof pkt);
  std::memset(copy + 32, 0, 4);
  append_icrc(a, copy, 32);
  EXPECT_EQ(std::memcmp(copy, pkt, sizeof pkt), 0);
}

// A packet as softrdma sends it (IP id 0, DF). Expected value computed independently from the spec with
// python3:
//   bth  = bytes([5,0x90,0xff,0xff,0,0,0,0x11,0x80,0x12,0x34,0x56]); rest = bytes.fromhex('deadbeef')+b'abc\0'
//   ip   = bytes([0x45,0xff]) + struct.pack('!HHH', 20+8+20+4, 0, 0x4000) + bytes([0xff,17,0xff,0xff])
//          + bytes([192,168,1,2,192,168,1,3])
//   udp  = struct.pack('!HHH', 0xC001, 4791, 8+20+4) + b'\xff\xff'
//   zlib.crc32(b'\xff'*8 + ip + udp + bth[:4] + b'\xff' + bth[5:] + rest) == 0x6cc310d6
TEST(Icrc, MatchesSpecVectorForKernelStyleHeader) {
  const UdpAddr a{ip_be(192, 168, 1, 2), ip_be(192, 168, 1, 3), 0xC001, kRoceUdpPort};
  Packet p{};
  p.bth = {kRcSendOnlyImm, true, false, pad_for(3), 0, kDefaultPkey, false, false, 0x11, true, 0x123456};
  const uint8_t imm[4] = {0xDE, 0xAD, 0xBE, 0xEF};
  std::memcpy(&p.imm_data_be, imm, 4);
  uint8_t buf[24] = {};
  const size_t n = write_headers(p, buf);
  ASSERT_EQ(n, 16u);
  std::memcpy(buf + n, "abc", 3);
  buf[19] = 0;
  EXPECT_EQ(compute_icrc(a, buf, 20), 0x6CC310D6u);
  append_icrc(a, buf, 20);
  EXPECT_EQ(read_le32(buf + 20), 0x6CC310D6u);
  EXPECT_TRUE(check_icrc(a, buf, 24));
  // FECN/BECN set by a switch (resv8a) leave the ICRC valid.
  buf[4] = 0xC0;
  EXPECT_TRUE(check_icrc(a, buf, 24));
}

// RoCEv2 over IPv6, a packet as a UDP/IPv6 socket sends it. Expected value computed independently
// from Annex A17.3.3 with python3 (traffic class, flow label and hop limit as ones):
//   bth  = bytes([4,0x40,0xff,0xff,0,0,0,0x11,0x80,0x12,0x34,0x56]); rest = b'ipv6-roce-payload-01'
//   src  = ipaddress.IPv6Address('fd00::2').packed; dst = ipaddress.IPv6Address('fe80::fc:ff:fe00:1').packed
//   ip   = bytes([0x6f,0xff,0xff,0xff]) + struct.pack('!H', 8+32+4) + bytes([17,0xff]) + src + dst
//   udp  = struct.pack('!HHH', 0xC123, 4791, 8+32+4) + b'\xff\xff'
//   zlib.crc32(b'\xff'*8 + ip + udp + bth[:4] + b'\xff' + bth[5:] + rest) == 0x0d8ba48f
Ipv6UdpAddr v6_addr() {
  Ipv6UdpAddr a{};
  const uint8_t src[16] = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
  const uint8_t dst[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0xfc, 0, 0xff, 0xfe, 0, 0, 1};
  std::memcpy(a.src_ip, src, 16);
  std::memcpy(a.dst_ip, dst, 16);
  a.src_port = 0xC123;
  a.dst_port = kRoceUdpPort;
  return a;
}

TEST(Icrc, MatchesSpecVectorForIpv6) {
  const Ipv6UdpAddr a = v6_addr();
  Packet p{};
  p.bth = {kRcSendOnly, false, true, 0, 0, kDefaultPkey, false, false, 0x11, true, 0x123456};
  uint8_t buf[36] = {};
  ASSERT_EQ(write_headers(p, buf), kBthLen);
  const uint8_t bth[kBthLen] = {4, 0x40, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0x12, 0x34, 0x56};  // as above
  ASSERT_EQ(std::memcmp(buf, bth, kBthLen), 0);
  std::memcpy(buf + kBthLen, "ipv6-roce-payload-01", 20);
  EXPECT_EQ(compute_icrc_v6(a, buf, 32), 0x0D8BA48Fu);
  append_icrc_v6(a, buf, 32);
  EXPECT_EQ(read_le32(buf + 32), 0x0D8BA48Fu);
  EXPECT_TRUE(check_icrc_v6(a, buf, 36));
  buf[4] = 0xC0;  // FECN/BECN (resv8a) are masked
  EXPECT_TRUE(check_icrc_v6(a, buf, 36));
  // Addresses, ports and every payload byte are covered; a short packet never checks.
  for (int i = 0; i < 16; ++i) {
    Ipv6UdpAddr b = a;
    b.src_ip[i] ^= 1;
    EXPECT_FALSE(check_icrc_v6(b, buf, 36)) << "src byte " << i;
    b = a;
    b.dst_ip[i] ^= 0x80;
    EXPECT_FALSE(check_icrc_v6(b, buf, 36)) << "dst byte " << i;
  }
  Ipv6UdpAddr b = a;
  b.src_port ^= 1;
  EXPECT_FALSE(check_icrc_v6(b, buf, 36));
  for (size_t i = 0; i < 32; ++i) {
    if (i == 4) continue;
    buf[i] ^= 0x10;
    EXPECT_FALSE(check_icrc_v6(a, buf, 36)) << "byte " << i;
    buf[i] ^= 0x10;
  }
  EXPECT_FALSE(check_icrc_v6(a, buf, kBthLen + kIcrcLen - 1));
}

// The same bytes under IPv4-mapped addresses of an IPv4 header give another ICRC: the pseudo-header
// follows the IP version a packet travels in, not the GID form.
TEST(Icrc, Ipv6AndIpv4PseudoHeadersDiffer) {
  uint8_t buf[16] = {4, 0x40, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0x12, 0x34, 0x56, 1, 2, 3, 4};
  Ipv6UdpAddr a6{};
  a6.src_ip[10] = a6.src_ip[11] = a6.dst_ip[10] = a6.dst_ip[11] = 0xFF;
  a6.src_ip[12] = a6.dst_ip[12] = 127;
  a6.src_ip[15] = a6.dst_ip[15] = 1;
  a6.src_port = 0xC000;
  a6.dst_port = kRoceUdpPort;
  const UdpAddr a4{ip_be(127, 0, 0, 1), ip_be(127, 0, 0, 1), 0xC000, kRoceUdpPort};
  EXPECT_NE(compute_icrc_v6(a6, buf, sizeof buf), compute_icrc(a4, buf, sizeof buf));
}

// The family-neutral form picks the IPv6 pseudo-header for IPv6 addresses: the spec vector above.
TEST(Icrc, UdpAddrOfIpv6AddressesIsTheIpv6Icrc) {
  const Ipv6UdpAddr a6 = v6_addr();
  UdpAddr a{IpAddress::from_bytes(a6.src_ip), IpAddress::from_bytes(a6.dst_ip), a6.src_port, a6.dst_port};
  uint8_t buf[36] = {4, 0x40, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0x12, 0x34, 0x56};
  std::memcpy(buf + kBthLen, "ipv6-roce-payload-01", 20);
  EXPECT_EQ(compute_icrc(a, buf, 32), 0x0D8BA48Fu);
  append_icrc(a, buf, 32);
  EXPECT_TRUE(check_icrc(a, buf, 36));
  // Nothing to solve over IPv6: the identification is DF and 0 when the ICRC matches, else none.
  auto ident = solve_ip_ident(a, buf, 36);
  ASSERT_TRUE(ident.has_value());
  EXPECT_EQ(ident->ip_id, 0);
  buf[20] ^= 1;
  EXPECT_FALSE(solve_ip_ident(a, buf, 36).has_value());
}

// Independent bit-at-a-time CRC-32 (reflected 0xEDB88320), to cross-check ISA-L at many lengths.
uint32_t slow_crc32(const std::vector<uint8_t>& d) {
  uint32_t c = 0xFFFFFFFF;
  for (uint8_t b : d) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(Icrc, AgreesWithBitwiseReferenceAtManyLengths) {
  const UdpAddr a{ip_be(10, 1, 2, 3), ip_be(10, 4, 5, 6), 0xD00D, kRoceUdpPort};
  for (size_t len : {size_t{12}, size_t{13}, size_t{16}, size_t{31}, size_t{64}, size_t{257}, size_t{1500},
                     size_t{4124}}) {
    std::vector<uint8_t> pkt(len);
    for (size_t i = 0; i < len; ++i) pkt[i] = static_cast<uint8_t>(i * 31 + 7);
    std::vector<uint8_t> pseudo(8, 0xFF);
    const size_t ip_len = 20 + 8 + len + 4, udp_len = 8 + len + 4;
    const uint8_t ip[20] = {0x45, 0xFF, uint8_t(ip_len >> 8), uint8_t(ip_len), 0, 0, 0x40, 0, 0xFF, 17, 0xFF, 0xFF,
                            10, 1, 2, 3, 10, 4, 5, 6};
    const uint8_t udp[8] = {0xD0, 0x0D, 0x12, 0xB7, uint8_t(udp_len >> 8), uint8_t(udp_len), 0xFF, 0xFF};
    pseudo.insert(pseudo.end(), ip, ip + 20);
    pseudo.insert(pseudo.end(), udp, udp + 8);
    pseudo.insert(pseudo.end(), pkt.begin(), pkt.end());
    pseudo[8 + 20 + 8 + 4] = 0xFF;
    EXPECT_EQ(compute_icrc(a, pkt.data(), len), slow_crc32(pseudo)) << len;
  }
}

TEST(Icrc, EveryCoveredByteChangesIt) {
  const UdpAddr a{ip_be(192, 168, 1, 2), ip_be(192, 168, 1, 3), 0xC001, kRoceUdpPort};
  std::vector<uint8_t> pkt(12 + 16 + 40);
  for (size_t i = 0; i < pkt.size(); ++i) pkt[i] = static_cast<uint8_t>(i + 1);
  const uint32_t base = compute_icrc(a, pkt.data(), pkt.size());
  for (size_t i = 0; i < pkt.size(); ++i) {
    for (uint8_t flip : {0x01, 0x80, 0xFF}) {
      pkt[i] ^= flip;
      if (i == 4)
        EXPECT_EQ(compute_icrc(a, pkt.data(), pkt.size()), base) << "resv8a";
      else
        EXPECT_NE(compute_icrc(a, pkt.data(), pkt.size()), base) << i;
      pkt[i] ^= flip;
    }
  }
  // Addresses, ports, identification and the length are covered too.
  UdpAddr b = a;
  b.src_ip.bytes[12] ^= 0x01;
  EXPECT_NE(compute_icrc(b, pkt.data(), pkt.size()), base);
  b = a;
  b.dst_ip.bytes[15] ^= 0x01;
  EXPECT_NE(compute_icrc(b, pkt.data(), pkt.size()), base);
  b = a;
  b.src_port ^= 1;
  EXPECT_NE(compute_icrc(b, pkt.data(), pkt.size()), base);
  b = a;
  b.dst_port = 4792;
  EXPECT_NE(compute_icrc(b, pkt.data(), pkt.size()), base);
  b = a;
  b.ip_id = 1;
  EXPECT_NE(compute_icrc(b, pkt.data(), pkt.size()), base);
  EXPECT_NE(compute_icrc(a, pkt.data(), pkt.size() - 4), base);
}

TEST(Icrc, CheckRejectsCorruptionAndShortInput) {
  const UdpAddr a{ip_be(127, 0, 0, 1), ip_be(127, 0, 0, 1), 50000, kRoceUdpPort};
  std::vector<uint8_t> pkt(12 + 8 + kIcrcLen, 0x33);
  append_icrc(a, pkt.data(), pkt.size() - kIcrcLen);
  EXPECT_TRUE(check_icrc(a, pkt.data(), pkt.size()));
  for (size_t i = 0; i < pkt.size(); ++i) {
    if (i == 4) continue;
    pkt[i] ^= 0x10;
    EXPECT_FALSE(check_icrc(a, pkt.data(), pkt.size())) << i;
    pkt[i] ^= 0x10;
  }
  EXPECT_FALSE(check_icrc(a, pkt.data(), 15));
  EXPECT_FALSE(check_icrc(a, pkt.data(), 0));
}

}  // namespace
}  // namespace softrdma::wire

namespace softrdma::wire {
namespace {

// A packet as Linux rxe or a RoCE NIC sends it: IP identification not 0 (and DF set or not). The
// receiver, which cannot see those header bits, still accepts it, and still rejects corruption.
class UnknownIpId : public ::testing::Test {
 protected:
  std::vector<uint8_t> make(size_t payload, uint16_t ip_id, uint8_t flags, UdpAddr& addr) {
    Packet p{};
    p.bth.opcode = kRcWriteOnly;
    p.bth.pkey = 0xFFFF;
    p.bth.dest_qp = 0x123456;
    p.bth.psn = 0xABCDEF;
    p.reth = {0x1000, 0x11223344, static_cast<uint32_t>(payload)};
    std::vector<uint8_t> buf(64 + payload + 8);
    size_t n = write_headers(p, buf.data());
    for (size_t i = 0; i < payload; ++i) buf[n + i] = static_cast<uint8_t>(i * 7 + 3);
    n += payload;
    addr = {IpAddress::v4(0x0100007F), IpAddress::v4(0x0200007F), 50000, 4791};
    UdpAddr sender = addr;
    sender.ip_id = ip_id;
    sender.ip_flags = flags;
    append_icrc(sender, buf.data(), n);
    buf.resize(n + kIcrcLen);
    return buf;
  }
};

TEST_F(UnknownIpId, RecoversTheIdentificationAndDf) {
  for (uint16_t id : {uint16_t{0}, uint16_t{1}, uint16_t{0x1234}, uint16_t{0xFFFF}, uint16_t{0x8001}}) {
    for (uint8_t flags : {uint8_t{0x40}, uint8_t{0x00}}) {
      for (size_t payload : {size_t{0}, size_t{4}, size_t{1024}, size_t{4096}}) {
        UdpAddr addr;
        auto pkt = make(payload, id, flags, addr);
        EXPECT_EQ(check_icrc(addr, pkt.data(), pkt.size()), id == 0 && flags == 0x40)
            << "the plain check assumes identification 0 and DF";
        auto got = solve_ip_ident(addr, pkt.data(), pkt.size());
        ASSERT_TRUE(got) << "id " << id << " flags " << int(flags) << " payload " << payload;
        EXPECT_EQ(got->ip_id, id) << "the identification the packet was sent with is recovered";
        EXPECT_EQ(got->ip_flags, flags);
      }
    }
  }
}

TEST_F(UnknownIpId, RejectsCorruptedPackets) {
  // Each corruption below is caught unless it happens to equal an identification change
  // (probability 2^-15 each); with these fixed flips none does.
  UdpAddr addr;
  auto good = make(1024, 0x4321, 0x40, addr);
  int rejected = 0, tried = 0;
  for (size_t pos = 0; pos < good.size() - kIcrcLen; pos += 37) {
    if (pos == 4) continue;  // resv8a is masked by design
    auto bad = good;
    bad[pos] ^= 0x10;
    ++tried;
    rejected += !solve_ip_ident(addr, bad.data(), bad.size());
  }
  EXPECT_EQ(rejected, tried);
  auto other = addr;
  other.src_port = 50001;
  EXPECT_FALSE(solve_ip_ident(other, good.data(), good.size())) << "ports stay covered";
}

}  // namespace
}  // namespace softrdma::wire
