// RoCEv2 invariant CRC (IBTA Annex A17.3.3) for IPv4 and IPv6.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "wire/ip_address.h"

namespace softrdma::wire {

// The addresses of a RoCEv2 packet's UDP datagram. Both IPv4 (mapped) or both IPv6: the ICRC's
// pseudo-header is the IPv4 one or the IPv6 one.
struct UdpAddr {
  IpAddress src_ip, dst_ip;
  uint16_t src_port, dst_port;  // host order
  // IPv4 identification as sent (IPv6 has none). The kernel sends 0 for an unconnected UDP socket with DF set, which is
  // what softrdma does; a receiver that knows the real value (raw capture) may set it, since the ICRC
  // covers it.
  uint16_t ip_id = 0;
  uint8_t ip_flags = 0x40;  // high byte of the IPv4 flags/fragment word: DF set
};

// ICRC over: (IPv6 addresses: compute_icrc_v6's) 8 bytes of 0xFF (LRH stand-in); the IPv4 header as sent (version/IHL 0x45, TOS masked 0xFF,
// total length 20+8+len+4, identification ip_id, flags DF, TTL masked 0xFF, protocol 17, checksum
// masked 0xFFFF, src, dst); the UDP header (ports, length 8+len+4, checksum masked 0xFFFF); the BTH
// with resv8a (byte 4: FECN, BECN, resv6) taken as 0xFF; then the rest of the len bytes from bth, i.e.
// everything before the ICRC. len must be >= 12. The value is the Ethernet CRC-32 (as zlib crc32) and
// is stored little-endian in the 4 bytes after the packet.
uint32_t compute_icrc(const UdpAddr& addr, const uint8_t* bth, size_t len);
// Writes the ICRC of the len bytes at bth into bth[len..len+3].
void append_icrc(const UdpAddr& addr, uint8_t* bth, size_t len);
// True when the last 4 bytes hold the ICRC of the bytes before them. False if len_with_icrc < 16.
bool check_icrc(const UdpAddr& addr, const uint8_t* bth, size_t len_with_icrc);

// RoCEv2 over UDP/IPv6 (RoCE v2 GIDs that are not IPv4-mapped).
struct Ipv6UdpAddr {
  uint8_t src_ip[16], dst_ip[16];  // network order, as in the GIDs
  uint16_t src_port, dst_port;     // host order
};

// ICRC over: 8 bytes of 0xFF (LRH stand-in); the IPv6 header with its variant fields as ones (version
// 6, traffic class 0xFF, flow label 0xFFFFF, payload length 8+len+4, next header 17, hop limit 0xFF,
// src, dst: Annex A17.3.3); the UDP header (checksum masked 0xFFFF); the BTH with resv8a as 0xFF; the
// rest of the len bytes. IPv6 has no identification, so nothing is left to solve at the receiver.
uint32_t compute_icrc_v6(const Ipv6UdpAddr& addr, const uint8_t* bth, size_t len);
void append_icrc_v6(const Ipv6UdpAddr& addr, uint8_t* bth, size_t len);
bool check_icrc_v6(const Ipv6UdpAddr& addr, const uint8_t* bth, size_t len_with_icrc);
// The IPv4 identification and DF flag a packet was sent with, when the receiver cannot see them (a UDP
// socket does not report them; Linux rxe and RoCE NICs send changing, non-zero identifications). The
// ICRC is affine in those 17 bits, so the ICRC difference to the all-zero case is solved for them over
// GF(2). nullopt when no value makes the ICRC match. Any corrupted packet has about a 2^17 / 2^32 chance
// of having a solution, so a solution alone is weak evidence: the caller must also check that the
// identification is the one it expects from that sender (docs/reliability.md). Over IPv6 (nothing to
// solve): {0, DF} when the ICRC matches.
struct IpIdent {
  uint16_t ip_id;
  uint8_t ip_flags;  // 0x40 (DF) or 0
};
std::optional<IpIdent> solve_ip_ident(const UdpAddr& addr, const uint8_t* bth, size_t len_with_icrc);

}  // namespace softrdma::wire
