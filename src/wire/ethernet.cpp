#include "wire/ethernet.h"

#include "wire/bytes.h"

namespace softrdma::wire {

uint32_t ones_sum(const uint8_t* p, uint32_t len, uint32_t sum) {
  uint32_t i = 0;
  for (; i + 1 < len; i += 2) sum += uint32_t{p[i]} << 8 | p[i + 1];
  if (i < len) sum += uint32_t{p[i]} << 8;
  return sum;
}

namespace {
uint16_t fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}
using be::put16;
}  // namespace

namespace {
// Writes a TCP (proto 6) or UDP (17) checksum at l4, l4_len bytes, over sum (the pseudo-header's
// addresses); other protocols or a datagram too short for its header are left alone.
void fill_l4_checksum(uint8_t* l4, uint32_t l4_len, uint8_t proto, uint32_t sum) {
  uint32_t csum_off;
  if (proto == 6 && l4_len >= 20) {
    csum_off = 16;
  } else if (proto == 17 && l4_len >= 8) {
    csum_off = 6;
  } else {
    return;
  }
  put16(l4 + csum_off, 0);
  sum += proto;
  sum += l4_len & 0xFFFF;
  sum += l4_len >> 16;
  uint16_t c = fold(ones_sum(l4, l4_len, sum));
  if (proto == 17 && c == 0) c = 0xFFFF;  // UDP: 0 means "no checksum"
  put16(l4 + csum_off, c);
}

bool fill_ipv6_checksum(uint8_t* ip, uint32_t avail) {
  if (avail < 40 || (ip[0] >> 4) != 6) return false;
  const uint32_t payload = uint32_t{ip[4]} << 8 | ip[5];
  if (40 + payload > avail) return false;
  // The datagram follows the fixed header; behind extension headers it is left as it is.
  fill_l4_checksum(ip + 40, payload, ip[6], ones_sum(ip + 8, 32));
  return true;
}
}  // namespace

bool fill_ip_checksums(uint8_t* frame, uint32_t len) {
  uint32_t l3 = 14;
  if (len < l3) return false;
  uint16_t type = static_cast<uint16_t>(frame[12] << 8 | frame[13]);
  if (type == 0x8100 && len >= 18) {
    type = static_cast<uint16_t>(frame[16] << 8 | frame[17]);
    l3 = 18;
  }
  if (type == 0x86DD) return fill_ipv6_checksum(frame + l3, len - l3);
  if (type != 0x0800 || len < l3 + 20) return false;
  uint8_t* ip = frame + l3;
  const uint32_t ihl = 4u * (ip[0] & 0x0F);
  const uint32_t total = uint32_t{ip[2]} << 8 | ip[3];
  if ((ip[0] >> 4) != 4 || ihl < 20 || total < ihl || l3 + total > len) return false;
  put16(ip + 10, 0);
  put16(ip + 10, fold(ones_sum(ip, ihl)));
  const bool fragment = ((ip[6] & 0x3F) | ip[7]) != 0;  // MF set or a fragment offset
  if (!fragment) fill_l4_checksum(ip + ihl, total - ihl, ip[9], ones_sum(ip + 12, 8));
  return true;
}

}  // namespace softrdma::wire
