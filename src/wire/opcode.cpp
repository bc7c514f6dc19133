#include "wire/opcode.h"

#include <array>

#include "wire/headers.h"

namespace softrdma::wire {
namespace {

constexpr uint8_t header_bytes(uint8_t mask) {
  uint8_t n = kBthLen;
  if (mask & kHdrReth) n += kRethLen;
  if (mask & kHdrAeth) n += kAethLen;
  if (mask & kHdrAtomicEth) n += kAtomicEthLen;
  if (mask & kHdrAtomicAckEth) n += kAtomicAckEthLen;
  if (mask & kHdrImm) n += kImmLen;
  if (mask & kHdrIeth) n += kIethLen;
  if (mask & kHdrDeth) n += kDethLen;
  if (mask & kHdrXrceth) n += kXrcethLen;
  return n;
}

// The XRC opcode names, by the low five bits of the code (the RC operation they carry).
constexpr const char* kXrcNames[0x18] = {
    "XRC_SEND_FIRST", "XRC_SEND_MIDDLE", "XRC_SEND_LAST", "XRC_SEND_LAST_WITH_IMMEDIATE", "XRC_SEND_ONLY",
    "XRC_SEND_ONLY_WITH_IMMEDIATE", "XRC_RDMA_WRITE_FIRST", "XRC_RDMA_WRITE_MIDDLE", "XRC_RDMA_WRITE_LAST",
    "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE", "XRC_RDMA_WRITE_ONLY", "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
    "XRC_RDMA_READ_REQUEST", "XRC_RDMA_READ_RESPONSE_FIRST", "XRC_RDMA_READ_RESPONSE_MIDDLE",
    "XRC_RDMA_READ_RESPONSE_LAST", "XRC_RDMA_READ_RESPONSE_ONLY", "XRC_ACKNOWLEDGE", "XRC_ATOMIC_ACKNOWLEDGE",
    "XRC_COMPARE_SWAP", "XRC_FETCH_ADD", "INVALID", "XRC_SEND_LAST_WITH_INVALIDATE",
    "XRC_SEND_ONLY_WITH_INVALIDATE"};

enum Pos : uint8_t { kFirst = 1, kMiddle = 2, kLast = 4, kOnly = kFirst | kLast };

constexpr OpcodeInfo entry(const char* name, OpKind kind, uint8_t pos, uint8_t headers, bool payload) {
  return OpcodeInfo{name,
                    true,
                    QpClass::RC,  // filled in from the opcode by the table builder
                    kind,
                    (pos & kFirst) != 0,
                    (pos & kMiddle) != 0,
                    (pos & kLast) != 0,
                    headers,
                    header_bytes(headers),
                    payload};
}

// Opcode low 5 bits for SEND/WRITE are shared by RC and UC; the RC-only ones live above 0x0B.
constexpr std::array<OpcodeInfo, 256> build_table() {
  std::array<OpcodeInfo, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    const unsigned cls = i >> 5;
    t[i] = OpcodeInfo{"INVALID", false, (cls <= 3 || cls == 5) ? static_cast<QpClass>(cls) : QpClass::RC, OpKind::Invalid,
                      false, false, false, 0, kBthLen, false};
  }
  auto set = [&t](uint8_t code, OpcodeInfo info) {
    info.qp_class = static_cast<QpClass>(code >> 5);
    t[code] = info;
  };
  set(0x00, entry("RC_SEND_FIRST", OpKind::Send, kFirst, 0, true));
  set(0x01, entry("RC_SEND_MIDDLE", OpKind::Send, kMiddle, 0, true));
  set(0x02, entry("RC_SEND_LAST", OpKind::Send, kLast, 0, true));
  set(0x03, entry("RC_SEND_LAST_WITH_IMMEDIATE", OpKind::Send, kLast, kHdrImm, true));
  set(0x04, entry("RC_SEND_ONLY", OpKind::Send, kOnly, 0, true));
  set(0x05, entry("RC_SEND_ONLY_WITH_IMMEDIATE", OpKind::Send, kOnly, kHdrImm, true));
  set(0x06, entry("RC_RDMA_WRITE_FIRST", OpKind::Write, kFirst, kHdrReth, true));
  set(0x07, entry("RC_RDMA_WRITE_MIDDLE", OpKind::Write, kMiddle, 0, true));
  set(0x08, entry("RC_RDMA_WRITE_LAST", OpKind::Write, kLast, 0, true));
  set(0x09, entry("RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", OpKind::Write, kLast, kHdrImm, true));
  set(0x0A, entry("RC_RDMA_WRITE_ONLY", OpKind::Write, kOnly, kHdrReth, true));
  set(0x0B, entry("RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", OpKind::Write, kOnly, kHdrReth | kHdrImm, true));
  set(0x0C, entry("RC_RDMA_READ_REQUEST", OpKind::ReadRequest, kOnly, kHdrReth, false));
  set(0x0D, entry("RC_RDMA_READ_RESPONSE_FIRST", OpKind::ReadResponse, kFirst, kHdrAeth, true));
  set(0x0E, entry("RC_RDMA_READ_RESPONSE_MIDDLE", OpKind::ReadResponse, kMiddle, 0, true));
  set(0x0F, entry("RC_RDMA_READ_RESPONSE_LAST", OpKind::ReadResponse, kLast, kHdrAeth, true));
  set(0x10, entry("RC_RDMA_READ_RESPONSE_ONLY", OpKind::ReadResponse, kOnly, kHdrAeth, true));
  set(0x11, entry("RC_ACKNOWLEDGE", OpKind::Ack, kOnly, kHdrAeth, false));
  set(0x12, entry("RC_ATOMIC_ACKNOWLEDGE", OpKind::AtomicAck, kOnly, kHdrAeth | kHdrAtomicAckEth, false));
  set(0x13, entry("RC_COMPARE_SWAP", OpKind::CompareSwap, kOnly, kHdrAtomicEth, false));
  set(0x14, entry("RC_FETCH_ADD", OpKind::FetchAdd, kOnly, kHdrAtomicEth, false));
  set(0x16, entry("RC_SEND_LAST_WITH_INVALIDATE", OpKind::Send, kLast, kHdrIeth, true));
  set(0x17, entry("RC_SEND_ONLY_WITH_INVALIDATE", OpKind::Send, kOnly, kHdrIeth, true));
  set(0x1D, entry("RC_ATOMIC_WRITE", OpKind::AtomicWrite, kOnly, kHdrReth, true));

  set(0x20, entry("UC_SEND_FIRST", OpKind::Send, kFirst, 0, true));
  set(0x21, entry("UC_SEND_MIDDLE", OpKind::Send, kMiddle, 0, true));
  set(0x22, entry("UC_SEND_LAST", OpKind::Send, kLast, 0, true));
  set(0x23, entry("UC_SEND_LAST_WITH_IMMEDIATE", OpKind::Send, kLast, kHdrImm, true));
  set(0x24, entry("UC_SEND_ONLY", OpKind::Send, kOnly, 0, true));
  set(0x25, entry("UC_SEND_ONLY_WITH_IMMEDIATE", OpKind::Send, kOnly, kHdrImm, true));
  set(0x26, entry("UC_RDMA_WRITE_FIRST", OpKind::Write, kFirst, kHdrReth, true));
  set(0x27, entry("UC_RDMA_WRITE_MIDDLE", OpKind::Write, kMiddle, 0, true));
  set(0x28, entry("UC_RDMA_WRITE_LAST", OpKind::Write, kLast, 0, true));
  set(0x29, entry("UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", OpKind::Write, kLast, kHdrImm, true));
  set(0x2A, entry("UC_RDMA_WRITE_ONLY", OpKind::Write, kOnly, kHdrReth, true));
  set(0x2B, entry("UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", OpKind::Write, kOnly, kHdrReth | kHdrImm, true));

  // XRC (IBTA 9.2, table 38): every RC operation in class 101. Requests carry the XRCETH (after the
  // BTH, before RETH/AtomicETH/ImmDt/IETH); READ responses and acknowledges do not.
  for (unsigned rc = 0; rc <= 0x17; ++rc) {
    OpcodeInfo info = t[rc];
    if (!info.valid) continue;
    const bool response = info.kind == OpKind::ReadResponse || info.kind == OpKind::Ack || info.kind == OpKind::AtomicAck;
    if (!response) {
      info.headers = static_cast<uint8_t>(info.headers | kHdrXrceth);
      info.header_len = header_bytes(info.headers);
    }
    info.name = kXrcNames[rc];
    set(static_cast<uint8_t>(0xA0 | rc), info);
  }

  set(0x64, entry("UD_SEND_ONLY", OpKind::Send, kOnly, kHdrDeth, true));
  set(0x65, entry("UD_SEND_ONLY_WITH_IMMEDIATE", OpKind::Send, kOnly, kHdrDeth | kHdrImm, true));
  return t;
}

constexpr std::array<OpcodeInfo, 256> kTable = build_table();

}  // namespace

const OpcodeInfo& opcode_info(uint8_t opcode) { return kTable[opcode]; }

}  // namespace softrdma::wire
