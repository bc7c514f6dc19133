#include "wire/opcode.h"

#include <gtest/gtest.h>

#include <string>

#include "wire/headers.h"

namespace softrdma::wire {
namespace {

struct Named {
  uint8_t code;
  const char* name;
};

// Every opcode softrdma implements, with its IBTA vol. 1 table 38 name.
constexpr Named kAll[] = {
    {kRcSendFirst, "RC_SEND_FIRST"},
    {kRcSendMiddle, "RC_SEND_MIDDLE"},
    {kRcSendLast, "RC_SEND_LAST"},
    {kRcSendLastImm, "RC_SEND_LAST_WITH_IMMEDIATE"},
    {kRcSendOnly, "RC_SEND_ONLY"},
    {kRcSendOnlyImm, "RC_SEND_ONLY_WITH_IMMEDIATE"},
    {kRcWriteFirst, "RC_RDMA_WRITE_FIRST"},
    {kRcWriteMiddle, "RC_RDMA_WRITE_MIDDLE"},
    {kRcWriteLast, "RC_RDMA_WRITE_LAST"},
    {kRcWriteLastImm, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE"},
    {kRcWriteOnly, "RC_RDMA_WRITE_ONLY"},
    {kRcWriteOnlyImm, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"},
    {kRcReadRequest, "RC_RDMA_READ_REQUEST"},
    {kRcReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST"},
    {kRcReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE"},
    {kRcReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST"},
    {kRcReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY"},
    {kRcAck, "RC_ACKNOWLEDGE"},
    {kRcAtomicAck, "RC_ATOMIC_ACKNOWLEDGE"},
    {kRcCompareSwap, "RC_COMPARE_SWAP"},
    {kRcFetchAdd, "RC_FETCH_ADD"},
    {kRcSendLastInv, "RC_SEND_LAST_WITH_INVALIDATE"},
    {kRcSendOnlyInv, "RC_SEND_ONLY_WITH_INVALIDATE"},
    {kRcAtomicWrite, "RC_ATOMIC_WRITE"},
    {0xA0, "XRC_SEND_FIRST"},
    {0xA1, "XRC_SEND_MIDDLE"},
    {0xA2, "XRC_SEND_LAST"},
    {0xA3, "XRC_SEND_LAST_WITH_IMMEDIATE"},
    {0xA4, "XRC_SEND_ONLY"},
    {0xA5, "XRC_SEND_ONLY_WITH_IMMEDIATE"},
    {0xA6, "XRC_RDMA_WRITE_FIRST"},
    {0xA7, "XRC_RDMA_WRITE_MIDDLE"},
    {0xA8, "XRC_RDMA_WRITE_LAST"},
    {0xA9, "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE"},
    {0xAA, "XRC_RDMA_WRITE_ONLY"},
    {0xAB, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"},
    {0xAC, "XRC_RDMA_READ_REQUEST"},
    {0xAD, "XRC_RDMA_READ_RESPONSE_FIRST"},
    {0xAE, "XRC_RDMA_READ_RESPONSE_MIDDLE"},
    {0xAF, "XRC_RDMA_READ_RESPONSE_LAST"},
    {0xB0, "XRC_RDMA_READ_RESPONSE_ONLY"},
    {0xB1, "XRC_ACKNOWLEDGE"},
    {0xB2, "XRC_ATOMIC_ACKNOWLEDGE"},
    {0xB3, "XRC_COMPARE_SWAP"},
    {0xB4, "XRC_FETCH_ADD"},
    {0xB6, "XRC_SEND_LAST_WITH_INVALIDATE"},
    {0xB7, "XRC_SEND_ONLY_WITH_INVALIDATE"},
    {kUcSendFirst, "UC_SEND_FIRST"},
    {kUcSendMiddle, "UC_SEND_MIDDLE"},
    {kUcSendLast, "UC_SEND_LAST"},
    {kUcSendLastImm, "UC_SEND_LAST_WITH_IMMEDIATE"},
    {kUcSendOnly, "UC_SEND_ONLY"},
    {kUcSendOnlyImm, "UC_SEND_ONLY_WITH_IMMEDIATE"},
    {kUcWriteFirst, "UC_RDMA_WRITE_FIRST"},
    {kUcWriteMiddle, "UC_RDMA_WRITE_MIDDLE"},
    {kUcWriteLast, "UC_RDMA_WRITE_LAST"},
    {kUcWriteLastImm, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE"},
    {kUcWriteOnly, "UC_RDMA_WRITE_ONLY"},
    {kUcWriteOnlyImm, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"},
    {kUdSendOnly, "UD_SEND_ONLY"},
    {kUdSendOnlyImm, "UD_SEND_ONLY_WITH_IMMEDIATE"},
};

TEST(Opcode, ConstantsHaveIbtaValues) {
  EXPECT_EQ(kRcSendFirst, 0x00);
  EXPECT_EQ(kRcWriteFirst, 0x06);
  EXPECT_EQ(kRcReadRequest, 0x0C);
  EXPECT_EQ(kRcAck, 0x11);
  EXPECT_EQ(kRcCompareSwap, 0x13);
  EXPECT_EQ(kRcFetchAdd, 0x14);
  EXPECT_EQ(kRcSendLastInv, 0x16);
  EXPECT_EQ(kRcSendOnlyInv, 0x17);
  EXPECT_EQ(kRcAtomicWrite, 0x1D);
  EXPECT_EQ(kUcSendFirst, 0x20);
  EXPECT_EQ(kUcWriteOnlyImm, 0x2B);
  EXPECT_EQ(kUdSendOnly, 0x64);
  EXPECT_EQ(kUdSendOnlyImm, 0x65);
}

TEST(Opcode, NamesMatchConstantsAndExactlyTheseAreValid) {
  bool listed[256] = {};
  for (const Named& n : kAll) {
    const OpcodeInfo& i = opcode_info(n.code);
    EXPECT_TRUE(i.valid) << n.name;
    EXPECT_STREQ(i.name, n.name);
    listed[n.code] = true;
  }
  for (unsigned c = 0; c < 256; ++c) {
    if (listed[c]) continue;
    const OpcodeInfo& i = opcode_info(static_cast<uint8_t>(c));
    EXPECT_FALSE(i.valid) << c;
    EXPECT_STREQ(i.name, "INVALID") << c;
    EXPECT_EQ(i.kind, OpKind::Invalid) << c;
  }
}

TEST(Opcode, ReservedRdAndCnpCodesAreInvalid) {
  for (uint8_t c : {0x15, 0x18, 0x1F, 0x2C, 0x40, 0x44, 0x5F, 0x60, 0x63, 0x66, 0x81, 0xFF})
    EXPECT_FALSE(opcode_info(c).valid) << int{c};
}

TEST(Opcode, ClassComesFromTopBitsAndHeaderLenFromMask) {
  for (const Named& n : kAll) {
    const OpcodeInfo& i = opcode_info(n.code);
    EXPECT_EQ(static_cast<unsigned>(i.qp_class), unsigned{n.code} >> 5u) << n.name;
    size_t len = kBthLen;
    if (i.headers & kHdrReth) len += kRethLen;
    if (i.headers & kHdrAeth) len += kAethLen;
    if (i.headers & kHdrAtomicEth) len += kAtomicEthLen;
    if (i.headers & kHdrAtomicAckEth) len += kAtomicAckEthLen;
    if (i.headers & kHdrImm) len += kImmLen;
    if (i.headers & kHdrIeth) len += kIethLen;
    if (i.headers & kHdrDeth) len += kDethLen;
    if (i.headers & kHdrXrceth) len += kXrcethLen;
    EXPECT_EQ(i.header_len, len) << n.name;
    EXPECT_TRUE(i.first || i.middle || i.last) << n.name;
    EXPECT_FALSE(i.middle && (i.first || i.last)) << n.name;
    const std::string name = n.name;
    const bool payload_kind = i.kind == OpKind::Send || i.kind == OpKind::Write || i.kind == OpKind::ReadResponse ||
                              i.kind == OpKind::AtomicWrite;
    EXPECT_EQ(i.has_payload, payload_kind) << n.name;
    // ATOMIC WRITE is a single packet with payload, though its name says no ONLY.
    const bool single = name.find("ONLY") != std::string::npos || !i.has_payload || i.kind == OpKind::AtomicWrite;
    EXPECT_EQ(single, i.first && i.last) << n.name;
    EXPECT_EQ(name.find("WITH_IMMEDIATE") != std::string::npos, (i.headers & kHdrImm) != 0) << n.name;
    EXPECT_EQ(name.find("WITH_INVALIDATE") != std::string::npos, (i.headers & kHdrIeth) != 0) << n.name;
  }
}

TEST(Opcode, XrcIsRcWithAnXrcethOnRequests) {
  for (unsigned rc = 0; rc <= 0x17; ++rc) {
    const OpcodeInfo& r = opcode_info(static_cast<uint8_t>(rc));
    const OpcodeInfo& x = opcode_info(static_cast<uint8_t>(0xA0 | rc));
    ASSERT_EQ(r.valid, x.valid) << rc;
    if (!r.valid) continue;
    EXPECT_EQ(x.qp_class, QpClass::XRC);
    EXPECT_EQ(x.kind, r.kind);
    EXPECT_EQ(rc_of_xrc(static_cast<uint8_t>(0xA0 | rc)), rc);
    const bool response = r.kind == OpKind::ReadResponse || r.kind == OpKind::Ack || r.kind == OpKind::AtomicAck;
    EXPECT_EQ(x.headers, response ? r.headers : (r.headers | kHdrXrceth)) << x.name;
  }
  EXPECT_EQ(opcode_info(kXrcSendOnly).header_len, 16);
  EXPECT_EQ(opcode_info(kXrcAck).header_len, 16);
}

TEST(Opcode, IbtaHeaderSets) {
  EXPECT_EQ(opcode_info(kRcWriteFirst).headers, kHdrReth);
  EXPECT_EQ(opcode_info(kRcWriteFirst).header_len, 28);
  EXPECT_EQ(opcode_info(kRcWriteMiddle).headers, 0);
  EXPECT_EQ(opcode_info(kRcWriteLast).headers, 0);
  EXPECT_EQ(opcode_info(kRcWriteLastImm).headers, kHdrImm);
  EXPECT_EQ(opcode_info(kRcWriteOnly).headers, kHdrReth);
  EXPECT_EQ(opcode_info(kRcWriteOnlyImm).headers, kHdrReth | kHdrImm);
  EXPECT_EQ(opcode_info(kRcWriteOnlyImm).header_len, 32);
  EXPECT_EQ(opcode_info(kRcSendFirst).headers, 0);
  EXPECT_EQ(opcode_info(kRcSendOnlyImm).headers, kHdrImm);
  EXPECT_EQ(opcode_info(kRcSendLastInv).headers, kHdrIeth);
  EXPECT_EQ(opcode_info(kRcSendOnlyInv).headers, kHdrIeth);
  EXPECT_EQ(opcode_info(kRcReadRequest).headers, kHdrReth);
  EXPECT_EQ(opcode_info(kRcReadResponseFirst).headers, kHdrAeth);
  EXPECT_EQ(opcode_info(kRcReadResponseMiddle).headers, 0);
  EXPECT_EQ(opcode_info(kRcReadResponseLast).headers, kHdrAeth);
  EXPECT_EQ(opcode_info(kRcReadResponseOnly).headers, kHdrAeth);
  EXPECT_EQ(opcode_info(kRcAck).headers, kHdrAeth);
  EXPECT_EQ(opcode_info(kRcAck).header_len, 16);
  EXPECT_EQ(opcode_info(kRcAtomicAck).headers, kHdrAeth | kHdrAtomicAckEth);
  EXPECT_EQ(opcode_info(kRcAtomicAck).header_len, 24);
  EXPECT_EQ(opcode_info(kRcCompareSwap).headers, kHdrAtomicEth);
  EXPECT_EQ(opcode_info(kRcFetchAdd).header_len, 40);
  EXPECT_EQ(opcode_info(kRcAtomicWrite).headers, kHdrReth);
  EXPECT_EQ(opcode_info(kRcAtomicWrite).header_len, 28);
  EXPECT_TRUE(opcode_info(kRcAtomicWrite).has_payload);
  EXPECT_EQ(opcode_info(kUdSendOnly).headers, kHdrDeth);
  EXPECT_EQ(opcode_info(kUdSendOnly).header_len, 20);
  EXPECT_EQ(opcode_info(kUdSendOnlyImm).headers, kHdrDeth | kHdrImm);
  EXPECT_EQ(opcode_info(kUdSendOnly).qp_class, QpClass::UD);
  EXPECT_EQ(opcode_info(kUcWriteFirst).qp_class, QpClass::UC);
}

TEST(Opcode, KindsAndPositions) {
  EXPECT_EQ(opcode_info(kRcReadRequest).kind, OpKind::ReadRequest);
  EXPECT_FALSE(opcode_info(kRcReadRequest).has_payload);
  EXPECT_EQ(opcode_info(kRcReadResponseMiddle).kind, OpKind::ReadResponse);
  EXPECT_TRUE(opcode_info(kRcReadResponseMiddle).middle);
  EXPECT_EQ(opcode_info(kRcAck).kind, OpKind::Ack);
  EXPECT_EQ(opcode_info(kRcAtomicAck).kind, OpKind::AtomicAck);
  EXPECT_EQ(opcode_info(kRcCompareSwap).kind, OpKind::CompareSwap);
  EXPECT_EQ(opcode_info(kRcFetchAdd).kind, OpKind::FetchAdd);
  EXPECT_EQ(opcode_info(kUdSendOnlyImm).kind, OpKind::Send);
  EXPECT_EQ(opcode_info(kUcWriteLastImm).kind, OpKind::Write);
  const OpcodeInfo& first = opcode_info(kRcSendFirst);
  EXPECT_TRUE(first.first && !first.middle && !first.last);
  const OpcodeInfo& last = opcode_info(kUcSendLast);
  EXPECT_TRUE(!last.first && !last.middle && last.last);
  const OpcodeInfo& only = opcode_info(kRcWriteOnly);
  EXPECT_TRUE(only.first && !only.middle && only.last);
}

TEST(Opcode, UcSendAndWriteMirrorRc) {
  for (uint8_t c = 0; c <= 0x0B; ++c) {
    const OpcodeInfo& rc = opcode_info(c);
    const OpcodeInfo& uc = opcode_info(static_cast<uint8_t>(c + 0x20));
    EXPECT_EQ(rc.headers, uc.headers) << int{c};
    EXPECT_EQ(rc.kind, uc.kind) << int{c};
    EXPECT_EQ(rc.first, uc.first);
    EXPECT_EQ(rc.last, uc.last);
    EXPECT_STREQ(rc.name + 2, uc.name + 2);
  }
}

}  // namespace
}  // namespace softrdma::wire
