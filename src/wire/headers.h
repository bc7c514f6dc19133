// RoCEv2 transport headers (IBTA vol. 1 ch. 9): BTH and the extension headers, parsed into host-order
// structs and written back out. Pure functions: no I/O, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "wire/opcode.h"

namespace softrdma::wire {

inline constexpr size_t kBthLen = 12;
inline constexpr size_t kRethLen = 16;
inline constexpr size_t kAethLen = 4;
inline constexpr size_t kAtomicEthLen = 28;
inline constexpr size_t kAtomicAckEthLen = 8;
inline constexpr size_t kImmLen = 4;
inline constexpr size_t kIethLen = 4;
inline constexpr size_t kDethLen = 8;
inline constexpr size_t kXrcethLen = 4;
inline constexpr size_t kIcrcLen = 4;
inline constexpr uint16_t kRoceUdpPort = 4791;
inline constexpr uint16_t kDefaultPkey = 0xFFFF;

struct Bth {
  uint8_t opcode;
  bool solicited;
  bool mig_req;
  uint8_t pad_count;  // 0..3
  uint8_t tver;       // 0..15, must be 0
  uint16_t pkey;
  bool fecn, becn;
  uint32_t dest_qp;  // 24 bit
  bool ack_req;
  uint32_t psn;  // 24 bit
};
struct Reth {
  uint64_t va;
  uint32_t rkey;
  uint32_t dma_len;
};
struct Aeth {
  uint8_t syndrome;
  uint32_t msn;  // 24 bit
};
struct AtomicEth {
  uint64_t va;
  uint32_t rkey;
  uint64_t swap_add;
  uint64_t compare;
};
struct Deth {
  uint32_t qkey;
  uint32_t src_qp;  // 24 bit
};

// A parsed packet: all fields in host byte order, except imm_data which stays in network order
// because ibv_wc.imm_data / ibv_send_wr.imm_data are __be32 (so it passes through untouched).
// Only the headers opcode_info(bth.opcode).headers names are meaningful; parse_packet zeroes the rest.
struct Packet {
  Bth bth;
  Reth reth;
  Aeth aeth;
  AtomicEth atomic;
  uint64_t atomic_ack_orig;
  uint32_t imm_data_be;
  uint32_t ieth_rkey;
  Deth deth;
  uint32_t xrc_srqn;  // XRCETH: the XRC SRQ the request is for (24 bit)
  const uint8_t* payload;
  uint32_t payload_len;  // excludes pad bytes and ICRC
};

enum class ParseError : uint8_t { Ok, TooShort, BadVersion, InvalidOpcode, BadLength, BadPad };
const char* parse_error_name(ParseError e);

// Parses BTH..ICRC as received in a UDP payload (len includes the 4-byte ICRC; the ICRC is NOT checked
// here). Checks, in this order: len >= BTH + ICRC (TooShort), TVer == tver (BadVersion; 0 is RoCEv2's,
// wire::kProtectTver a protected packet's, wire/protect.h), opcode valid
// (InvalidOpcode), len >= header_len + ICRC (TooShort); an opcode that carries no payload must have
// exactly header_len + ICRC bytes and pad 0 (BadLength); otherwise pad <= payload bytes (BadPad).
// On success out.payload points into buf. On error out is unspecified.
ParseError parse_packet(const uint8_t* buf, size_t len, Packet& out, uint8_t tver = 0);

// Writes the BTH and the extension headers that opcode_info(pkt.bth.opcode).headers names, in IBTA
// order, into buf (which must hold header_len bytes). Fields wider than the wire field are truncated
// (dest_qp/psn/msn/src_qp/xrc_srqn to 24 bits, pad_count to 2, tver to 4). Returns header_len; the caller
// appends payload, pad_for(payload_len) zero bytes, then the ICRC. An invalid opcode writes only the
// BTH and returns kBthLen.
size_t write_headers(const Packet& pkt, uint8_t* buf);

// Pad count for a payload of n bytes: payloads are padded to a multiple of 4.
constexpr uint8_t pad_for(uint32_t n) { return static_cast<uint8_t>((4 - n % 4) % 4); }

}  // namespace softrdma::wire
