// IBTA transport opcodes (vol. 1, table 38) and the per-opcode facts the transport needs:
// which extension headers follow the BTH, packet position, and whether payload may follow.
#pragma once

#include <cstdint>

namespace softrdma::wire {

// Extension-header mask bits (OpcodeInfo::headers).
enum : uint8_t {
  kHdrReth = 1,
  kHdrAeth = 2,
  kHdrAtomicEth = 4,
  kHdrAtomicAckEth = 8,
  kHdrImm = 16,
  kHdrIeth = 32,
  kHdrDeth = 64,
  kHdrXrceth = 128,  // XRC requests: the destination XRC SRQ, right after the BTH
};

enum class OpKind : uint8_t { Send, Write, ReadRequest, ReadResponse, Ack, AtomicAck, CompareSwap, FetchAdd, AtomicWrite,
                              Invalid };

// Opcode bits 7..5.
enum class QpClass : uint8_t { RC = 0, UC = 1, RD = 2, UD = 3, CNP = 4, XRC = 5 };

struct OpcodeInfo {
  const char* name;      // e.g. "RC_SEND_FIRST"; "INVALID" for unused codes
  bool valid;
  QpClass qp_class;
  OpKind kind;
  bool first, middle, last;  // packet position; an ONLY packet has first && last
  uint8_t headers;           // kHdr* mask of extension headers after the BTH
  uint8_t header_len;        // BTH (12) + all extension headers, in bytes
  bool has_payload;          // opcode may carry payload (SEND/WRITE/READ RESPONSE data packets)
};

// Table-driven lookup, defined for all 256 codes. RD opcodes (0x40..0x5F), the reserved codes and
// CNP (0x81) are reported invalid: softrdma implements RC, UC, UD and XRC only. XRC's codes are RC's
// with the class bits 101 (0xA0 + the RC code); its requests carry an XRCETH, its responses do not.
const OpcodeInfo& opcode_info(uint8_t opcode);

// RC
inline constexpr uint8_t kRcSendFirst = 0x00;
inline constexpr uint8_t kRcSendMiddle = 0x01;
inline constexpr uint8_t kRcSendLast = 0x02;
inline constexpr uint8_t kRcSendLastImm = 0x03;
inline constexpr uint8_t kRcSendOnly = 0x04;
inline constexpr uint8_t kRcSendOnlyImm = 0x05;
inline constexpr uint8_t kRcWriteFirst = 0x06;
inline constexpr uint8_t kRcWriteMiddle = 0x07;
inline constexpr uint8_t kRcWriteLast = 0x08;
inline constexpr uint8_t kRcWriteLastImm = 0x09;
inline constexpr uint8_t kRcWriteOnly = 0x0A;
inline constexpr uint8_t kRcWriteOnlyImm = 0x0B;
inline constexpr uint8_t kRcReadRequest = 0x0C;
inline constexpr uint8_t kRcReadResponseFirst = 0x0D;
inline constexpr uint8_t kRcReadResponseMiddle = 0x0E;
inline constexpr uint8_t kRcReadResponseLast = 0x0F;
inline constexpr uint8_t kRcReadResponseOnly = 0x10;
inline constexpr uint8_t kRcAck = 0x11;
inline constexpr uint8_t kRcAtomicAck = 0x12;
inline constexpr uint8_t kRcCompareSwap = 0x13;
inline constexpr uint8_t kRcFetchAdd = 0x14;
inline constexpr uint8_t kRcSendLastInv = 0x16;
inline constexpr uint8_t kRcSendOnlyInv = 0x17;
// IBTA 1.5 (9.4.7.1): an 8-byte RDMA WRITE the responder executes atomically; RETH + 8 bytes of payload,
// answered by a zero-length RDMA READ RESPONSE ONLY.
inline constexpr uint8_t kRcAtomicWrite = 0x1D;

// UC
inline constexpr uint8_t kUcSendFirst = 0x20;
inline constexpr uint8_t kUcSendMiddle = 0x21;
inline constexpr uint8_t kUcSendLast = 0x22;
inline constexpr uint8_t kUcSendLastImm = 0x23;
inline constexpr uint8_t kUcSendOnly = 0x24;
inline constexpr uint8_t kUcSendOnlyImm = 0x25;
inline constexpr uint8_t kUcWriteFirst = 0x26;
inline constexpr uint8_t kUcWriteMiddle = 0x27;
inline constexpr uint8_t kUcWriteLast = 0x28;
inline constexpr uint8_t kUcWriteLastImm = 0x29;
inline constexpr uint8_t kUcWriteOnly = 0x2A;
inline constexpr uint8_t kUcWriteOnlyImm = 0x2B;

// XRC: the RC operation of the same low five bits.
inline constexpr uint8_t kXrcClassBits = 0xA0;
inline constexpr uint8_t kXrcSendFirst = 0xA0;
inline constexpr uint8_t kXrcSendOnly = 0xA4;
inline constexpr uint8_t kXrcWriteOnly = 0xAA;
inline constexpr uint8_t kXrcReadRequest = 0xAC;
inline constexpr uint8_t kXrcAck = 0xB1;
inline constexpr uint8_t kXrcSendOnlyInv = 0xB7;
// The RC opcode an XRC opcode is the XRC form of (the same low five bits).
constexpr uint8_t rc_of_xrc(uint8_t xrc_opcode) { return static_cast<uint8_t>(xrc_opcode & 0x1F); }

// UD
inline constexpr uint8_t kUdSendOnly = 0x64;
inline constexpr uint8_t kUdSendOnlyImm = 0x65;

// Aliases spelled after the IBTA names, for code written against those.
inline constexpr uint8_t kRcRdmaWriteFirst = kRcWriteFirst;
inline constexpr uint8_t kRcRdmaWriteMiddle = kRcWriteMiddle;
inline constexpr uint8_t kRcRdmaWriteLast = kRcWriteLast;
inline constexpr uint8_t kRcRdmaWriteLastImm = kRcWriteLastImm;
inline constexpr uint8_t kRcRdmaWriteOnly = kRcWriteOnly;
inline constexpr uint8_t kRcRdmaWriteOnlyImm = kRcWriteOnlyImm;
inline constexpr uint8_t kRcRdmaReadRequest = kRcReadRequest;
inline constexpr uint8_t kRcRdmaReadResponseFirst = kRcReadResponseFirst;
inline constexpr uint8_t kRcRdmaReadResponseMiddle = kRcReadResponseMiddle;
inline constexpr uint8_t kRcRdmaReadResponseLast = kRcReadResponseLast;
inline constexpr uint8_t kRcRdmaReadResponseOnly = kRcReadResponseOnly;
inline constexpr uint8_t kRcAcknowledge = kRcAck;
inline constexpr uint8_t kRcAtomicAcknowledge = kRcAtomicAck;
inline constexpr uint8_t kUcRdmaWriteFirst = kUcWriteFirst;
inline constexpr uint8_t kUcRdmaWriteMiddle = kUcWriteMiddle;
inline constexpr uint8_t kUcRdmaWriteLast = kUcWriteLast;
inline constexpr uint8_t kUcRdmaWriteLastImm = kUcWriteLastImm;
inline constexpr uint8_t kUcRdmaWriteOnly = kUcWriteOnly;
inline constexpr uint8_t kUcRdmaWriteOnlyImm = kUcWriteOnlyImm;

}  // namespace softrdma::wire
