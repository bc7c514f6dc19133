// fuzz_parser: wire::parse_packet on arbitrary bytes.
// Properties checked on every input:
//  - the verdict equals one computed independently from the header contract in wire/headers.h;
//  - on success: payload points right after the headers, header_len + payload_len + pad + ICRC == len,
//    and write_headers() reproduces the header bytes, except the reserved bits parse_packet drops
//    (BTH byte 4 bits 5..0 = resv6, byte 8 bits 6..0 = resv7, DETH byte 4 = reserved, XRCETH byte 0 =
//    reserved);
//  - the ICRC written by append_icrc checks, and flipping a covered byte makes the check fail.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

using namespace softrdma::wire;

namespace {

[[noreturn]] void fail(const char* what) {
  __builtin_printf("fuzz_parser: property violated: %s\n", what);
  abort();
}

// The contract of parse_packet, written from its header comment rather than its code.
ParseError expected_verdict(const uint8_t* buf, size_t len) {
  if (len < kBthLen + kIcrcLen) return ParseError::TooShort;
  if ((buf[1] & 0xF) != 0) return ParseError::BadVersion;
  const OpcodeInfo& info = opcode_info(buf[0]);
  if (!info.valid) return ParseError::InvalidOpcode;
  if (len < size_t{info.header_len} + kIcrcLen) return ParseError::TooShort;
  size_t body = len - info.header_len - kIcrcLen;
  uint8_t pad = (buf[1] >> 4) & 3;
  if (!info.has_payload && (body != 0 || pad != 0)) return ParseError::BadLength;
  if (pad > body) return ParseError::BadPad;
  return ParseError::Ok;
}

// Sum of the extension header sizes the mask names: an independent check of the opcode table.
size_t header_len_from_mask(uint8_t h) {
  size_t n = kBthLen;
  if (h & kHdrXrceth) n += kXrcethLen;
  if (h & kHdrDeth) n += kDethLen;
  if (h & kHdrReth) n += kRethLen;
  if (h & kHdrAtomicEth) n += kAtomicEthLen;
  if (h & kHdrAeth) n += kAethLen;
  if (h & kHdrAtomicAckEth) n += kAtomicAckEthLen;
  if (h & kHdrImm) n += kImmLen;
  if (h & kHdrIeth) n += kIethLen;
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A private copy of exactly size bytes, so ASan catches any read past the datagram.
  std::vector<uint8_t> buf(data, data + size);
  Packet pkt;
  ParseError got = parse_packet(buf.data(), buf.size(), pkt);
  if (got != expected_verdict(buf.data(), buf.size())) fail("verdict differs from the documented contract");
  if (got != ParseError::Ok) return 0;

  const OpcodeInfo& info = opcode_info(pkt.bth.opcode);
  const size_t hl = info.header_len;
  if (hl != header_len_from_mask(info.headers)) fail("opcode table header_len disagrees with its header mask");
  if (pkt.payload != buf.data() + hl) fail("payload does not start right after the headers");
  if (hl + pkt.payload_len + pkt.bth.pad_count + kIcrcLen != size) fail("lengths do not add up to len");
  if (!info.has_payload && pkt.payload_len != 0) fail("payload on an opcode without payload");

  uint8_t out[kBthLen + kXrcethLen + kDethLen + kRethLen + kAtomicEthLen + kAethLen + kAtomicAckEthLen + kImmLen + kIethLen];
  if (write_headers(pkt, out) != hl) fail("write_headers length differs from header_len");
  std::vector<uint8_t> want(buf.begin(), buf.begin() + static_cast<ptrdiff_t>(hl));
  want[4] &= 0xC0;  // FECN, BECN kept; resv6 dropped
  want[8] &= 0x80;  // AckReq kept; resv7 dropped
  if (info.headers & kHdrDeth) want[kBthLen + 4] = 0;  // DETH reserved byte
  if (info.headers & kHdrXrceth) want[kBthLen] = 0;   // XRCETH reserved byte (before the 24-bit SRQ number)
  if (std::memcmp(out, want.data(), hl) != 0) fail("write_headers(parse_packet(x)) != header bytes of x");

  // ICRC: what append_icrc writes must check, over the same bytes; a changed covered byte must not.
  UdpAddr addr{IpAddress::v4(0x0100007F), IpAddress::v4(0x0200007F), static_cast<uint16_t>(size * 7919), kRoceUdpPort};
  const size_t body = size - kIcrcLen;
  append_icrc(addr, buf.data(), body);
  if (!check_icrc(addr, buf.data(), size)) fail("append_icrc result does not check");
  size_t victim = size > 5 ? 5 + data[size - 1] % (body - 5) : 0;  // byte 4 (resv8a) is masked out
  if (victim != 4) {
    buf[victim] ^= 0x01;
    if (check_icrc(addr, buf.data(), size)) fail("single-bit change not detected by ICRC");
  }
  return 0;
}
