// Ethernet frames as a RAW_PACKET QP sends them (pure functions): the checksums IBV_SEND_IP_CSUM asks
// the device to fill in.
#pragma once
#include <cstdint>

namespace softrdma::wire {

// The RFC 1071 one's-complement sum of len bytes, added to sum (not yet folded or complemented).
uint32_t ones_sum(const uint8_t* p, uint32_t len, uint32_t sum = 0);

// In an Ethernet frame (optionally 802.1Q-tagged) carrying IPv4, writes the IPv4 header checksum and,
// for an unfragmented TCP or UDP datagram that the frame holds whole, its checksum over the
// pseudo-header; carrying IPv6, the checksum of a TCP or UDP datagram that directly follows the fixed
// header (no extension headers) over IPv6's pseudo-header (RFC 8200 8.1), as a NIC's L4 checksum
// offload does for either family. Anything else (another EtherType, a malformed header) is left as
// it is; false then.
bool fill_ip_checksums(uint8_t* frame, uint32_t len);

}  // namespace softrdma::wire
