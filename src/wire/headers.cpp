#include "wire/headers.h"

#include "wire/bytes.h"

namespace softrdma::wire {
namespace {

using namespace be;

// imm_data is kept in network order, so it is copied byte for byte in memory order.
inline uint32_t get_raw32(const uint8_t* p) {
  uint32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}
inline void put_raw32(uint8_t* p, uint32_t v) { __builtin_memcpy(p, &v, 4); }

}  // namespace

const char* parse_error_name(ParseError e) {
  switch (e) {
    case ParseError::Ok: return "Ok";
    case ParseError::TooShort: return "TooShort";
    case ParseError::BadVersion: return "BadVersion";
    case ParseError::InvalidOpcode: return "InvalidOpcode";
    case ParseError::BadLength: return "BadLength";
    case ParseError::BadPad: return "BadPad";
  }
  return "Unknown";
}

ParseError parse_packet(const uint8_t* buf, size_t len, Packet& out, uint8_t tver) {
  if (len < kBthLen + kIcrcLen) return ParseError::TooShort;
  out = Packet{};
  Bth& b = out.bth;
  b.opcode = buf[0];
  b.solicited = (buf[1] & 0x80) != 0;
  b.mig_req = (buf[1] & 0x40) != 0;
  b.pad_count = (buf[1] >> 4) & 0x3;
  b.tver = buf[1] & 0xF;
  b.pkey = get16(buf + 2);
  b.fecn = (buf[4] & 0x80) != 0;
  b.becn = (buf[4] & 0x40) != 0;
  b.dest_qp = get24(buf + 5);
  b.ack_req = (buf[8] & 0x80) != 0;
  b.psn = get24(buf + 9);
  if (b.tver != tver) return ParseError::BadVersion;

  const OpcodeInfo& info = opcode_info(b.opcode);
  if (!info.valid) return ParseError::InvalidOpcode;
  if (len < size_t{info.header_len} + kIcrcLen) return ParseError::TooShort;
  const size_t body = len - info.header_len - kIcrcLen;  // payload + pad
  if (!info.has_payload && (body != 0 || b.pad_count != 0)) return ParseError::BadLength;
  if (b.pad_count > body) return ParseError::BadPad;

  // Extension headers in IBTA order: XRCETH | DETH, RETH | AtomicETH, AETH, AtomicAckETH, ImmDt | IETH.
  const uint8_t* p = buf + kBthLen;
  const uint8_t h = info.headers;
  if (h & kHdrXrceth) {
    out.xrc_srqn = get24(p + 1);
    p += kXrcethLen;
  }
  if (h & kHdrDeth) {
    out.deth.qkey = get32(p);
    out.deth.src_qp = get24(p + 5);
    p += kDethLen;
  }
  if (h & kHdrReth) {
    out.reth.va = get64(p);
    out.reth.rkey = get32(p + 8);
    out.reth.dma_len = get32(p + 12);
    p += kRethLen;
  }
  if (h & kHdrAtomicEth) {
    out.atomic.va = get64(p);
    out.atomic.rkey = get32(p + 8);
    out.atomic.swap_add = get64(p + 12);
    out.atomic.compare = get64(p + 20);
    p += kAtomicEthLen;
  }
  if (h & kHdrAeth) {
    out.aeth.syndrome = p[0];
    out.aeth.msn = get24(p + 1);
    p += kAethLen;
  }
  if (h & kHdrAtomicAckEth) {
    out.atomic_ack_orig = get64(p);
    p += kAtomicAckEthLen;
  }
  if (h & kHdrImm) {
    out.imm_data_be = get_raw32(p);
    p += kImmLen;
  }
  if (h & kHdrIeth) {
    out.ieth_rkey = get32(p);
    p += kIethLen;
  }
  out.payload = p;
  out.payload_len = static_cast<uint32_t>(body - b.pad_count);
  return ParseError::Ok;
}

size_t write_headers(const Packet& pkt, uint8_t* buf) {
  const Bth& b = pkt.bth;
  buf[0] = b.opcode;
  buf[1] = static_cast<uint8_t>((b.solicited ? 0x80 : 0) | (b.mig_req ? 0x40 : 0) | (b.pad_count & 0x3) << 4 |
                                (b.tver & 0xF));
  put16(buf + 2, b.pkey);
  buf[4] = static_cast<uint8_t>((b.fecn ? 0x80 : 0) | (b.becn ? 0x40 : 0));
  put24(buf + 5, b.dest_qp);
  buf[8] = b.ack_req ? 0x80 : 0;
  put24(buf + 9, b.psn);

  const OpcodeInfo& info = opcode_info(b.opcode);
  if (!info.valid) return kBthLen;
  uint8_t* p = buf + kBthLen;
  const uint8_t h = info.headers;
  if (h & kHdrXrceth) {
    p[0] = 0;
    put24(p + 1, pkt.xrc_srqn);
    p += kXrcethLen;
  }
  if (h & kHdrDeth) {
    put32(p, pkt.deth.qkey);
    p[4] = 0;
    put24(p + 5, pkt.deth.src_qp);
    p += kDethLen;
  }
  if (h & kHdrReth) {
    put64(p, pkt.reth.va);
    put32(p + 8, pkt.reth.rkey);
    put32(p + 12, pkt.reth.dma_len);
    p += kRethLen;
  }
  if (h & kHdrAtomicEth) {
    put64(p, pkt.atomic.va);
    put32(p + 8, pkt.atomic.rkey);
    put64(p + 12, pkt.atomic.swap_add);
    put64(p + 20, pkt.atomic.compare);
    p += kAtomicEthLen;
  }
  if (h & kHdrAeth) {
    p[0] = pkt.aeth.syndrome;
    put24(p + 1, pkt.aeth.msn);
    p += kAethLen;
  }
  if (h & kHdrAtomicAckEth) {
    put64(p, pkt.atomic_ack_orig);
    p += kAtomicAckEthLen;
  }
  if (h & kHdrImm) {
    put_raw32(p, pkt.imm_data_be);
    p += kImmLen;
  }
  if (h & kHdrIeth) {
    put32(p, pkt.ieth_rkey);
    p += kIethLen;
  }
  return static_cast<size_t>(p - buf);
}

}  // namespace softrdma::wire
