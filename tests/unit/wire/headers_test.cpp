#include "wire/headers.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace softrdma::wire {
namespace {

// A Packet with a distinct value in every field, so a swapped or misplaced field shows.
Packet sample(uint8_t opcode, uint32_t payload_len) {
  Packet p{};
  p.bth.opcode = opcode;
  p.bth.solicited = true;
  p.bth.mig_req = true;
  p.bth.pad_count = pad_for(payload_len);
  p.bth.tver = 0;
  p.bth.pkey = 0x8001;
  p.bth.fecn = false;
  p.bth.becn = true;
  p.bth.dest_qp = 0xABCDEF;
  p.bth.ack_req = true;
  p.bth.psn = 0xFEDCBA;
  p.reth = {0x0102030405060708ull, 0x11223344, 0x55667788};
  p.aeth = {0x62, 0x9A8B7C};
  p.atomic = {0xA1A2A3A4A5A6A7A8ull, 0xB1B2B3B4, 0xC1C2C3C4C5C6C7C8ull, 0xD1D2D3D4D5D6D7D8ull};
  p.atomic_ack_orig = 0xE1E2E3E4E5E6E7E8ull;
  const uint8_t imm[4] = {0xDE, 0xAD, 0xBE, 0xEF};
  std::memcpy(&p.imm_data_be, imm, 4);
  p.ieth_rkey = 0x0BADF00D;
  p.deth = {0x80010203, 0x00C0FFEE};
  p.xrc_srqn = 0x00BEEF12;
  return p;
}

// Header + payload + pad + ICRC placeholder, sized exactly so ASan catches over-reads.
std::vector<uint8_t> build(const Packet& p, const std::vector<uint8_t>& payload, uint8_t pad) {
  const OpcodeInfo& info = opcode_info(p.bth.opcode);
  std::vector<uint8_t> buf(info.header_len + payload.size() + pad + kIcrcLen, 0x5A);
  const size_t n = write_headers(p, buf.data());
  EXPECT_EQ(n, info.header_len);
  if (!payload.empty()) std::memcpy(buf.data() + n, payload.data(), payload.size());
  std::memset(buf.data() + n + payload.size(), 0, pad);
  return buf;
}

TEST(Headers, PadFor) {
  static_assert(pad_for(0) == 0);
  static_assert(pad_for(1) == 3);
  static_assert(pad_for(2) == 2);
  static_assert(pad_for(3) == 1);
  static_assert(pad_for(4) == 0);
  static_assert(pad_for(4097) == 3);
  EXPECT_EQ(pad_for(0xFFFFFFFFu), 1);
}

TEST(Headers, RoundTripEveryValidOpcode) {
  int checked = 0;
  for (unsigned c = 0; c < 256; ++c) {
    const uint8_t op = static_cast<uint8_t>(c);
    const OpcodeInfo& info = opcode_info(op);
    if (!info.valid) continue;
    const std::vector<uint32_t> lens =
        info.has_payload ? std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 7, 255, 256, 4096} : std::vector<uint32_t>{0};
    for (uint32_t len : lens) {
      SCOPED_TRACE(std::string(info.name) + " payload " + std::to_string(len));
      const Packet in = sample(op, len);
      std::vector<uint8_t> payload(len);
      for (uint32_t i = 0; i < len; ++i) payload[i] = static_cast<uint8_t>(i * 7 + 1);
      const std::vector<uint8_t> buf = build(in, payload, in.bth.pad_count);

      Packet out;
      ASSERT_EQ(parse_packet(buf.data(), buf.size(), out), ParseError::Ok);
      EXPECT_EQ(out.bth.opcode, op);
      EXPECT_TRUE(out.bth.solicited);
      EXPECT_TRUE(out.bth.mig_req);
      EXPECT_EQ(out.bth.pad_count, pad_for(len));
      EXPECT_EQ(out.bth.tver, 0);
      EXPECT_EQ(out.bth.pkey, 0x8001);
      EXPECT_FALSE(out.bth.fecn);
      EXPECT_TRUE(out.bth.becn);
      EXPECT_EQ(out.bth.dest_qp, 0xABCDEFu);
      EXPECT_TRUE(out.bth.ack_req);
      EXPECT_EQ(out.bth.psn, 0xFEDCBAu);
      EXPECT_EQ(out.payload_len, len);
      EXPECT_EQ(out.payload, buf.data() + info.header_len);
      if (len) {
        EXPECT_EQ(std::memcmp(out.payload, payload.data(), len), 0);
      }

      const uint8_t h = info.headers;
      if (h & kHdrReth) {
        EXPECT_EQ(out.reth.va, in.reth.va);
        EXPECT_EQ(out.reth.rkey, in.reth.rkey);
        EXPECT_EQ(out.reth.dma_len, in.reth.dma_len);
      } else {
        EXPECT_EQ(out.reth.va, 0u);
        EXPECT_EQ(out.reth.rkey, 0u);
      }
      if (h & kHdrAeth) {
        EXPECT_EQ(out.aeth.syndrome, in.aeth.syndrome);
        EXPECT_EQ(out.aeth.msn, in.aeth.msn);
      } else {
        EXPECT_EQ(out.aeth.syndrome, 0);
      }
      if (h & kHdrAtomicEth) {
        EXPECT_EQ(out.atomic.va, in.atomic.va);
        EXPECT_EQ(out.atomic.rkey, in.atomic.rkey);
        EXPECT_EQ(out.atomic.swap_add, in.atomic.swap_add);
        EXPECT_EQ(out.atomic.compare, in.atomic.compare);
      } else {
        EXPECT_EQ(out.atomic.swap_add, 0u);
      }
      EXPECT_EQ(out.atomic_ack_orig, (h & kHdrAtomicAckEth) ? in.atomic_ack_orig : 0u);
      EXPECT_EQ(out.imm_data_be, (h & kHdrImm) ? in.imm_data_be : 0u);
      EXPECT_EQ(out.ieth_rkey, (h & kHdrIeth) ? in.ieth_rkey : 0u);
      if (h & kHdrDeth) {
        EXPECT_EQ(out.deth.qkey, in.deth.qkey);
        EXPECT_EQ(out.deth.src_qp, in.deth.src_qp);
      } else {
        EXPECT_EQ(out.deth.qkey, 0u);
      }
      EXPECT_EQ(out.xrc_srqn, (h & kHdrXrceth) ? in.xrc_srqn : 0u);
      ++checked;
    }
  }
  // 33 payload-carrying opcodes (RC ATOMIC WRITE included) and 5 without in RC/UC/UD, and XRC's 18 and 5.
  EXPECT_EQ(checked, (33 + 18) * 10 + 5 + 5);
}

TEST(Headers, BthByteLayout) {
  Packet p{};
  p.bth = {kRcSendOnly, true, false, 3, 0, 0xFFFF, true, false, 0x123456, true, 0xABCDEF};
  uint8_t buf[kBthLen];
  ASSERT_EQ(write_headers(p, buf), kBthLen);
  const uint8_t want[kBthLen] = {0x04, 0xB0, 0xFF, 0xFF, 0x80, 0x12, 0x34, 0x56, 0x80, 0xAB, 0xCD, 0xEF};
  EXPECT_EQ(std::memcmp(buf, want, kBthLen), 0);
}

TEST(Headers, WriterTruncatesToFieldWidths) {
  Packet p{};
  p.bth.opcode = kRcAck;
  p.bth.dest_qp = 0xFF123456;
  p.bth.psn = 0x01ABCDEF;
  p.bth.pad_count = 0;
  p.aeth = {0x1F, 0x77000001};
  uint8_t buf[16 + kIcrcLen] = {};
  ASSERT_EQ(write_headers(p, buf), 16u);
  Packet out;
  ASSERT_EQ(parse_packet(buf, sizeof buf, out), ParseError::Ok);
  EXPECT_EQ(out.bth.dest_qp, 0x123456u);
  EXPECT_EQ(out.bth.psn, 0xABCDEFu);
  EXPECT_EQ(out.aeth.msn, 1u);
  EXPECT_EQ(buf[8], 0);  // AckReq clear, resv7 zero
}

TEST(Headers, ExtensionHeaderByteLayouts) {
  {
    Packet p = sample(kRcWriteOnlyImm, 0);
    uint8_t buf[32];
    ASSERT_EQ(write_headers(p, buf), 32u);
    const uint8_t reth_imm[20] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x11, 0x22,
                                  0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xDE, 0xAD, 0xBE, 0xEF};
    EXPECT_EQ(std::memcmp(buf + 12, reth_imm, 20), 0);
  }
  {
    Packet p = sample(kRcCompareSwap, 0);
    uint8_t buf[40];
    ASSERT_EQ(write_headers(p, buf), 40u);
    const uint8_t atomic[28] = {0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7, 0xA8, 0xB1, 0xB2,
                                0xB3, 0xB4, 0xC1, 0xC2, 0xC3, 0xC4, 0xC5, 0xC6, 0xC7, 0xC8,
                                0xD1, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8};
    EXPECT_EQ(std::memcmp(buf + 12, atomic, 28), 0);
  }
  {
    Packet p = sample(kRcAtomicAck, 0);
    uint8_t buf[24];
    ASSERT_EQ(write_headers(p, buf), 24u);
    const uint8_t aeth_ack[12] = {0x62, 0x9A, 0x8B, 0x7C, 0xE1, 0xE2, 0xE3, 0xE4, 0xE5, 0xE6, 0xE7, 0xE8};
    EXPECT_EQ(std::memcmp(buf + 12, aeth_ack, 12), 0);
  }
  {
    Packet p = sample(kUdSendOnlyImm, 0);
    uint8_t buf[24];
    ASSERT_EQ(write_headers(p, buf), 24u);
    // DETH: Q_Key, a reserved zero byte, SrcQP; then ImmDt.
    const uint8_t deth_imm[12] = {0x80, 0x01, 0x02, 0x03, 0x00, 0xC0, 0xFF, 0xEE, 0xDE, 0xAD, 0xBE, 0xEF};
    EXPECT_EQ(std::memcmp(buf + 12, deth_imm, 12), 0);
  }
  {
    Packet p = sample(kRcSendOnlyInv, 0);
    uint8_t buf[16];
    ASSERT_EQ(write_headers(p, buf), 16u);
    const uint8_t ieth[4] = {0x0B, 0xAD, 0xF0, 0x0D};
    EXPECT_EQ(std::memcmp(buf + 12, ieth, 4), 0);
  }
}

// UC SEND ONLY from scapy's RoCE regression test (IP id 1144, 192.168.0.7 -> itself): MigReq, pad 2.
TEST(Headers, ParsesThirdPartyPacket) {
  const uint8_t pkt[] = {0x24, 0x60, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0xD3, 0x00, 0xCF, 0x17, 0x10,
                         0x46, 0x30, 0x81, 0x8B, 0xE2, 0x89, 0x35, 0xD9, 0x0E, 0x9A, 0x95, 0x50,
                         0x54, 0x01, 0xBE, 0x88, 0x5E, 0x50, 0x00, 0x00, 0x78, 0xF3, 0x53, 0xF3};
  Packet out;
  ASSERT_EQ(parse_packet(pkt, sizeof pkt, out), ParseError::Ok);
  EXPECT_EQ(out.bth.opcode, kUcSendOnly);
  EXPECT_TRUE(out.bth.mig_req);
  EXPECT_FALSE(out.bth.solicited);
  EXPECT_EQ(out.bth.pad_count, 2);
  EXPECT_EQ(out.bth.pkey, kDefaultPkey);
  EXPECT_EQ(out.bth.dest_qp, 211u);
  EXPECT_EQ(out.bth.psn, 13571856u);
  EXPECT_EQ(out.payload_len, 18u);
  EXPECT_EQ(out.payload, pkt + 12);
}

TEST(Headers, ErrorTooShort) {
  Packet out;
  uint8_t buf[64] = {};
  buf[0] = kRcSendOnly;
  EXPECT_EQ(parse_packet(buf, 0, out), ParseError::TooShort);
  EXPECT_EQ(parse_packet(buf, 15, out), ParseError::TooShort);
  EXPECT_EQ(parse_packet(buf, 16, out), ParseError::Ok);  // empty SEND ONLY
  buf[0] = kRcWriteOnly;                                  // BTH + RETH + ICRC = 32
  EXPECT_EQ(parse_packet(buf, 31, out), ParseError::TooShort);
  EXPECT_EQ(parse_packet(buf, 32, out), ParseError::Ok);
  buf[0] = kRcFetchAdd;  // 12 + 28 + 4
  EXPECT_EQ(parse_packet(buf, 43, out), ParseError::TooShort);
  EXPECT_EQ(parse_packet(buf, 44, out), ParseError::Ok);
}

TEST(Headers, ErrorBadVersion) {
  Packet p = sample(kRcSendOnly, 4);
  for (uint8_t tver : {1, 8, 15}) {
    p.bth.tver = tver;
    const std::vector<uint8_t> buf = build(p, {1, 2, 3, 4}, 0);
    Packet out;
    EXPECT_EQ(parse_packet(buf.data(), buf.size(), out), ParseError::BadVersion);
  }
}

TEST(Headers, XrcethFollowsTheBthAndPrecedesTheReth) {
  Packet p{};
  p.bth.opcode = 0xAA;  // XRC_RDMA_WRITE_ONLY
  p.bth.dest_qp = 0x123456;
  p.xrc_srqn = 0xABCDEF;
  p.reth = {0x1122334455667788ull, 0x99AABBCC, 4};
  uint8_t buf[64] = {};
  ASSERT_EQ(write_headers(p, buf), kBthLen + kXrcethLen + kRethLen);
  const uint8_t xrceth[4] = {0x00, 0xAB, 0xCD, 0xEF};
  EXPECT_EQ(0, memcmp(buf + kBthLen, xrceth, 4));
  EXPECT_EQ(buf[kBthLen + 4], 0x11);  // the RETH's VA comes next
  std::memcpy(buf + kBthLen + kXrcethLen + kRethLen, "data", 4);
  Packet out;
  ASSERT_EQ(parse_packet(buf, kBthLen + kXrcethLen + kRethLen + 4 + kIcrcLen, out), ParseError::Ok);
  EXPECT_EQ(out.xrc_srqn, 0xABCDEFu);
  EXPECT_EQ(out.reth.va, 0x1122334455667788ull);
  EXPECT_EQ(out.reth.rkey, 0x99AABBCCu);
  EXPECT_EQ(out.payload_len, 4u);
}

TEST(Headers, ErrorInvalidOpcode) {
  uint8_t buf[64] = {};
  Packet out;
  for (uint8_t op : {0x15, 0x1F, 0x40, 0x60, 0x81, 0xFF}) {
    buf[0] = op;
    EXPECT_EQ(parse_packet(buf, sizeof buf, out), ParseError::InvalidOpcode) << int{op};
  }
}

TEST(Headers, ErrorBadLengthForPayloadlessOpcodes) {
  for (uint8_t op : {kRcAck, kRcAtomicAck, kRcReadRequest, kRcCompareSwap, kRcFetchAdd}) {
    SCOPED_TRACE(opcode_info(op).name);
    Packet p = sample(op, 0);
    p.bth.pad_count = 0;
    std::vector<uint8_t> buf = build(p, {}, 0);
    Packet out;
    EXPECT_EQ(parse_packet(buf.data(), buf.size(), out), ParseError::Ok);
    // Four stray payload bytes.
    buf = build(p, {1, 2, 3, 4}, 0);
    EXPECT_EQ(parse_packet(buf.data(), buf.size(), out), ParseError::BadLength);
    // Right length but a pad count.
    p.bth.pad_count = 1;
    buf = build(p, {}, 0);
    EXPECT_EQ(parse_packet(buf.data(), buf.size(), out), ParseError::BadLength);
  }
}

TEST(Headers, ErrorBadPad) {
  Packet out;
  Packet p = sample(kRcSendOnly, 0);
  p.bth.pad_count = 1;  // pad with nothing to pad
  std::vector<uint8_t> buf = build(p, {}, 0);
  EXPECT_EQ(parse_packet(buf.data(), buf.size(), out), ParseError::BadPad);
  p = sample(kRcWriteLast, 0);
  p.bth.pad_count = 3;  // 2 bytes after the headers, pad claims 3
  buf = build(p, {9, 9}, 0);
  EXPECT_EQ(parse_packet(buf.data(), buf.size(), out), ParseError::BadPad);
  p.bth.pad_count = 2;  // same bytes, all pad: a valid empty payload
  buf = build(p, {9, 9}, 0);
  ASSERT_EQ(parse_packet(buf.data(), buf.size(), out), ParseError::Ok);
  EXPECT_EQ(out.payload_len, 0u);
}

TEST(Headers, ParseErrorNamesAreDistinct) {
  std::set<std::string> names;
  for (ParseError e : {ParseError::Ok, ParseError::TooShort, ParseError::BadVersion, ParseError::InvalidOpcode,
                       ParseError::BadLength, ParseError::BadPad})
    names.insert(parse_error_name(e));
  EXPECT_EQ(names.size(), 6u);
  EXPECT_STREQ(parse_error_name(ParseError::BadPad), "BadPad");
}

TEST(Headers, Constants) {
  EXPECT_EQ(kRoceUdpPort, 4791);
  EXPECT_EQ(kDefaultPkey, 0xFFFF);
  EXPECT_EQ(kBthLen + kRethLen + kImmLen, 32u);
}

}  // namespace
}  // namespace softrdma::wire
