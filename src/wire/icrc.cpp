#include "wire/icrc.h"

#include <isa-l/crc.h>

#include "wire/headers.h"

namespace softrdma::wire {

namespace {

// The UDP header (checksum masked) and the BTH (resv8a masked) of the pseudo-header at out.
void udp_bth_part(uint8_t* udp, uint16_t src_port, uint16_t dst_port, const uint8_t* bth, size_t len) {
  const uint32_t udp_len = static_cast<uint32_t>(8 + len + kIcrcLen);
  udp[0] = static_cast<uint8_t>(src_port >> 8);
  udp[1] = static_cast<uint8_t>(src_port);
  udp[2] = static_cast<uint8_t>(dst_port >> 8);
  udp[3] = static_cast<uint8_t>(dst_port);
  udp[4] = static_cast<uint8_t>(udp_len >> 8);
  udp[5] = static_cast<uint8_t>(udp_len);
  udp[6] = 0xFF;  // UDP checksum
  udp[7] = 0xFF;
  uint8_t* b = udp + 8;
  __builtin_memcpy(b, bth, kBthLen);
  b[4] = 0xFF;  // resv8a: FECN/BECN may be set by switches
}

// The CRC of a pseudo-header h (ending with the BTH) followed by the rest of the packet after the BTH.
uint32_t icrc_of(const uint8_t* h, size_t hlen, const uint8_t* bth, size_t len) {
  // crc32_gzip_refl chains like zlib's crc32 (pre- and post-inversion handled inside).
  uint32_t crc = crc32_gzip_refl(0, h, hlen);
  return crc32_gzip_refl(crc, bth + kBthLen, len - kBthLen);
}

void store_icrc(uint32_t crc, uint8_t* p) {
  p[0] = static_cast<uint8_t>(crc);
  p[1] = static_cast<uint8_t>(crc >> 8);
  p[2] = static_cast<uint8_t>(crc >> 16);
  p[3] = static_cast<uint8_t>(crc >> 24);
}

uint32_t stored_icrc(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

}  // namespace

uint32_t compute_icrc(const UdpAddr& addr, const uint8_t* bth, size_t len) {
  if (!addr.src_ip.is_v4() || !addr.dst_ip.is_v4()) {
    Ipv6UdpAddr a6{};
    __builtin_memcpy(a6.src_ip, addr.src_ip.bytes.data(), 16);
    __builtin_memcpy(a6.dst_ip, addr.dst_ip.bytes.data(), 16);
    a6.src_port = addr.src_port;
    a6.dst_port = addr.dst_port;
    return compute_icrc_v6(a6, bth, len);
  }
  // Pseudo-header: LRH stand-in (8) + IPv4 (20) + UDP (8) + BTH (12), with the variant fields set to ones.
  uint8_t h[8 + 20 + 8 + kBthLen];
  for (int i = 0; i < 8; ++i) h[i] = 0xFF;
  uint8_t* ip = h + 8;
  const uint32_t ip_len = static_cast<uint32_t>(20 + 8 + len + kIcrcLen);
  ip[0] = 0x45;
  ip[1] = 0xFF;  // TOS (DSCP/ECN) may be rewritten in flight
  ip[2] = static_cast<uint8_t>(ip_len >> 8);
  ip[3] = static_cast<uint8_t>(ip_len);
  ip[4] = static_cast<uint8_t>(addr.ip_id >> 8);
  ip[5] = static_cast<uint8_t>(addr.ip_id);
  ip[6] = addr.ip_flags;  // DF (normally), fragment offset 0
  ip[7] = 0x00;
  ip[8] = 0xFF;  // TTL
  ip[9] = 17;    // UDP
  ip[10] = 0xFF;  // header checksum
  ip[11] = 0xFF;
  __builtin_memcpy(ip + 12, addr.src_ip.bytes.data() + 12, 4);
  __builtin_memcpy(ip + 16, addr.dst_ip.bytes.data() + 12, 4);
  udp_bth_part(ip + 20, addr.src_port, addr.dst_port, bth, len);
  return icrc_of(h, sizeof h, bth, len);
}

uint32_t compute_icrc_v6(const Ipv6UdpAddr& addr, const uint8_t* bth, size_t len) {
  // Pseudo-header: LRH stand-in (8) + IPv6 (40) + UDP (8) + BTH (12).
  uint8_t h[8 + 40 + 8 + kBthLen];
  for (int i = 0; i < 8; ++i) h[i] = 0xFF;
  uint8_t* ip = h + 8;
  const uint32_t payload_len = static_cast<uint32_t>(8 + len + kIcrcLen);
  ip[0] = 0x6F;  // version 6, traffic class (high nibble) masked
  ip[1] = 0xFF;  // traffic class (low nibble), flow label (high nibble) masked
  ip[2] = 0xFF;  // flow label masked
  ip[3] = 0xFF;
  ip[4] = static_cast<uint8_t>(payload_len >> 8);
  ip[5] = static_cast<uint8_t>(payload_len);
  ip[6] = 17;    // next header: UDP
  ip[7] = 0xFF;  // hop limit masked
  __builtin_memcpy(ip + 8, addr.src_ip, 16);
  __builtin_memcpy(ip + 24, addr.dst_ip, 16);
  udp_bth_part(ip + 40, addr.src_port, addr.dst_port, bth, len);
  return icrc_of(h, sizeof h, bth, len);
}

void append_icrc(const UdpAddr& addr, uint8_t* bth, size_t len) { store_icrc(compute_icrc(addr, bth, len), bth + len); }
void append_icrc_v6(const Ipv6UdpAddr& addr, uint8_t* bth, size_t len) {
  store_icrc(compute_icrc_v6(addr, bth, len), bth + len);
}

bool check_icrc(const UdpAddr& addr, const uint8_t* bth, size_t len_with_icrc) {
  if (len_with_icrc < kBthLen + kIcrcLen) return false;
  const size_t len = len_with_icrc - kIcrcLen;
  return stored_icrc(bth + len) == compute_icrc(addr, bth, len);
}

bool check_icrc_v6(const Ipv6UdpAddr& addr, const uint8_t* bth, size_t len_with_icrc) {
  if (len_with_icrc < kBthLen + kIcrcLen) return false;
  const size_t len = len_with_icrc - kIcrcLen;
  return stored_icrc(bth + len) == compute_icrc_v6(addr, bth, len);
}

std::optional<IpIdent> solve_ip_ident(const UdpAddr& addr, const uint8_t* bth, size_t len_with_icrc) {
  if (len_with_icrc < kBthLen + kIcrcLen) return std::nullopt;
  // IPv6 has no identification: the ICRC matches or not.
  if (!addr.src_ip.is_v4() || !addr.dst_ip.is_v4())
    return check_icrc(addr, bth, len_with_icrc) ? std::optional<IpIdent>(IpIdent{0, 0x40}) : std::nullopt;
  const size_t len = len_with_icrc - kIcrcLen;
  UdpAddr a = addr;
  a.ip_id = 0;
  a.ip_flags = 0x40;
  const uint32_t c0 = compute_icrc(a, bth, len);
  const uint32_t delta = stored_icrc(bth + len) ^ c0;
  if (delta == 0) return IpIdent{0, 0x40};
  // Effect of each unknown bit on the ICRC: 16 identification bits, then DF cleared. It depends only
  // on the packet length, so a few recent lengths are remembered.
  constexpr int kBits = 17;
  struct Basis {
    size_t len = 0;
    uint32_t v[kBits];
  };
  thread_local Basis cache[4];
  thread_local unsigned next = 0;
  Basis* basis = nullptr;
  for (Basis& b : cache)
    if (b.len == len) basis = &b;
  if (!basis) {
    basis = &cache[next++ % 4];
    for (int i = 0; i < 16; ++i) {
      UdpAddr t = a;
      t.ip_id = static_cast<uint16_t>(1u << i);
      basis->v[i] = compute_icrc(t, bth, len) ^ c0;
    }
    UdpAddr t = a;
    t.ip_flags = 0;
    basis->v[16] = compute_icrc(t, bth, len) ^ c0;
    basis->len = len;
  }
  // Gaussian elimination over GF(2), remembering which unknown bits make up each pivot row.
  uint32_t pivot[32] = {};
  uint32_t combo[32] = {};
  for (int i = 0; i < kBits; ++i) {
    uint32_t v = basis->v[i], c = 1u << i;
    for (int bit = 31; bit >= 0 && v; --bit) {
      if (!(v >> bit & 1)) continue;
      if (!pivot[bit]) {
        pivot[bit] = v;
        combo[bit] = c;
        break;
      }
      v ^= pivot[bit];
      c ^= combo[bit];
    }
  }
  uint32_t d = delta, bits = 0;
  for (int bit = 31; bit >= 0 && d; --bit) {
    if (!(d >> bit & 1)) continue;
    if (!pivot[bit]) return std::nullopt;
    d ^= pivot[bit];
    bits ^= combo[bit];
  }
  if (d) return std::nullopt;
  return IpIdent{static_cast<uint16_t>(bits & 0xFFFF), static_cast<uint8_t>(bits >> 16 ? 0 : 0x40)};
}

}  // namespace softrdma::wire
