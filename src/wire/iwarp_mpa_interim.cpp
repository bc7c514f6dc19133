// INTERIM (branch iw-cm): the MPA request/reply functions of wire/iwarp.h (RFC 5044 §7.1, RFC 6581
// §4), so that the iWARP CM builds and is tested before iw-wire's src/wire/iwarp.cpp exists. Delete
// this file when merging iw-wire, whose definitions replace these (a duplicate-symbol link error
// says so otherwise).
#include <arpa/inet.h>

#include <cstring>

#include "wire/iwarp.h"

namespace softrdma::wire::iwarp {
namespace {

constexpr char kKeyReq[] = "MPA ID Req Frame";
constexpr char kKeyRep[] = "MPA ID Rep Frame";
// The 16 bits after the key: M, C, R, E (RFC 6581 enhanced) flags, then the revision in the low 8.
constexpr uint16_t kFlagM = 0x8000, kFlagC = 0x4000, kFlagR = 0x2000, kFlagE = 0x1000;
// The RFC 6581 words: IRD word P (peer-to-peer) and the zero-length SEND RTR, ORD word the
// zero-length WRITE and READ RTRs; 14-bit values below.
constexpr uint16_t kP = 0x8000, kRtrSend = 0x4000, kRtrWrite = 0x8000, kRtrRead = 0x4000;

uint16_t get16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return ntohs(v);
}
void put16(uint8_t* p, uint16_t v) {
  v = htons(v);
  std::memcpy(p, &v, 2);
}

}  // namespace

size_t mpa_frame_len(const uint8_t* hdr) {
  if (std::memcmp(hdr, kKeyReq, kMpaKeyLen) != 0 && std::memcmp(hdr, kKeyRep, kMpaKeyLen) != 0) return 0;
  uint16_t pd = get16(hdr + 18);
  return pd > kMpaMaxPrivateData ? 0 : kMpaHeaderLen + pd;
}

size_t encode_mpa(const MpaFrame& f, uint8_t* out) {
  std::memcpy(out, f.reply ? kKeyRep : kKeyReq, kMpaKeyLen);
  uint16_t bits = f.revision;
  if (f.markers) bits |= kFlagM;
  if (f.crc) bits |= kFlagC;
  if (f.reject) bits |= kFlagR;
  if (f.enhanced) bits |= kFlagE;
  put16(out + 16, bits);
  size_t off = kMpaHeaderLen;
  if (f.enhanced) {
    put16(out + off, static_cast<uint16_t>((f.ird & kMpaMaxIrdOrd) | (f.peer_to_peer ? kP : 0) | (f.rtr_send ? kRtrSend : 0)));
    put16(out + off + 2, static_cast<uint16_t>((f.ord & kMpaMaxIrdOrd) | (f.rtr_write ? kRtrWrite : 0) | (f.rtr_read ? kRtrRead : 0)));
    off += kMpaEnhancedLen;
  }
  if (f.private_data_len) std::memcpy(out + off, f.private_data, f.private_data_len);
  off += f.private_data_len;
  put16(out + 18, static_cast<uint16_t>(off - kMpaHeaderLen));
  return off;
}

bool parse_mpa(const uint8_t* buf, size_t len, bool reply, MpaFrame& f) {
  if (len < kMpaHeaderLen || std::memcmp(buf, reply ? kKeyRep : kKeyReq, kMpaKeyLen) != 0) return false;
  const uint16_t pd = get16(buf + 18);
  if (pd > kMpaMaxPrivateData || len != kMpaHeaderLen + pd) return false;
  const uint16_t bits = get16(buf + 16);
  f = MpaFrame{};
  f.reply = reply;
  f.markers = bits & kFlagM;
  f.crc = bits & kFlagC;
  f.reject = bits & kFlagR;
  f.revision = static_cast<uint8_t>(bits & 0xFF);
  f.enhanced = (bits & kFlagE) && f.revision == 2;
  const uint8_t* p = buf + kMpaHeaderLen;
  size_t n = pd;
  if (f.enhanced) {
    if (n < kMpaEnhancedLen) return false;
    const uint16_t ird = get16(p), ord = get16(p + 2);
    f.peer_to_peer = ird & kP;
    f.rtr_send = ird & kRtrSend;
    f.rtr_write = ord & kRtrWrite;
    f.rtr_read = ord & kRtrRead;
    f.ird = ird & kMpaMaxIrdOrd;
    f.ord = ord & kMpaMaxIrdOrd;
    p += kMpaEnhancedLen;
    n -= kMpaEnhancedLen;
  }
  f.private_data = n ? p : nullptr;
  f.private_data_len = static_cast<uint16_t>(n);
  return true;
}

}  // namespace softrdma::wire::iwarp
