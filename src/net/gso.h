// UDP segmentation and receive offload as packet ports use them (UDP_SEGMENT, UDP_GRO; Linux >= 5.0):
// consecutive datagrams to one destination, all of one length but a shorter last, leave as one buffer
// and one send, and a receiver with UDP_GRO gets them as one buffer with the segment length. On the
// wire, or to a receiver without UDP_GRO, they are ordinary datagrams. The kernel numbers the IPv4
// identification of segment k of a send k (the send itself carries 0: DF set, unconnected socket).
#pragma once

#include <cstdint>

#include "wire/ip_address.h"

namespace softrdma::net {

inline constexpr uint32_t kGsoMaxSegments = 64;    // UDP_MAX_SEGMENTS
inline constexpr uint32_t kGsoMaxBytes = 65507;    // the largest UDP payload over IPv4

// The run of datagrams a port is gathering into one send.
struct GsoRun {
  wire::IpAddress dst_ip;
  uint16_t dst_port = 0;
  uint32_t seg_size = 0;   // length of the first datagram; every one but the last has it
  uint32_t segments = 0;   // 0: no run is open
  uint32_t bytes = 0;
  bool closed = false;     // a shorter datagram ended it

  // Whether a datagram of len bytes to (ip, port) may join the run as its next segment. An empty one
  // may not: as a last segment of no bytes it would not be there on receive.
  bool accepts(const wire::IpAddress& ip, uint16_t port, uint32_t len) const {
    return segments && !closed && len && ip == dst_ip && port == dst_port && len <= seg_size &&
           segments < kGsoMaxSegments && bytes + len <= kGsoMaxBytes;
  }
  void open(const wire::IpAddress& ip, uint16_t port, uint32_t len) {
    *this = GsoRun{ip, port, len, 1, len, false};
  }
  void add(uint32_t len) {
    ++segments;
    bytes += len;
    if (len < seg_size) closed = true;
  }
};

// A received buffer of one or more segments (UDP_GRO), taken one datagram at a time. seg_size 0 (no
// UDP_GRO control message) means one datagram. Every segment but the last has seg_size bytes.
struct SegmentCursor {
  uint8_t* data = nullptr;
  uint32_t len = 0;
  uint32_t seg_size = 0;
  uint32_t off = 0;
  uint32_t index = 0;  // of the next segment

  bool done() const { return off >= len; }
  // The next datagram: its bytes at *p, its length returned, its index in *k.
  uint32_t next(uint8_t** p, uint32_t* k) {
    const uint32_t rest = len - off;
    const uint32_t n = seg_size && seg_size < rest ? seg_size : rest;
    *p = data + off;
    *k = index++;
    off += n;
    return n;
  }
};

}  // namespace softrdma::net
