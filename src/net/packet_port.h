// The packet seam (docs/architecture.md, "The packet seam"): what a progress engine sends and receives datagrams through, and the
// clock it reads. UdpPort (udp_port.h) is the real one; MemoryNetwork (memory_network.h) is an
// in-memory network with a virtual clock, so transport tests step engines deterministically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "wire/ip_address.h"

namespace softrdma::net {

struct Datagram {
  uint8_t* data;
  uint32_t len;
  wire::IpAddress peer_ip;
  uint16_t peer_port;         // host order
  wire::IpAddress local_ip;   // destination address of the datagram (IP_PKTINFO), else the bound address
  // Its index among the segments of the buffer it arrived in (UDP_GRO, net/gso.h): a segmented send
  // gives segment k IPv4 identification k, which the ICRC covers. 0 for a datagram that came alone.
  uint32_t segment = 0;
};

class Liveness;  // net/liveness.h

class PacketPort {
 public:
  static constexpr size_t kBatch = 64;  // datagrams per receive() / per send batch

  virtual ~PacketPort() = default;
  virtual uint16_t port() const = 0;  // host order
  virtual const wire::IpAddress& ip() const = 0;
  // A file descriptor that becomes readable when datagrams arrive (for epoll); -1 when there is none.
  virtual int fd() const { return -1; }
  // What this port's peers' kernels say of them (liveness.h); nullptr where nobody can be asked.
  virtual Liveness* liveness() { return nullptr; }
  // Up to max (at most kBatch) datagrams; out[i].data stays valid until the next receive().
  virtual size_t receive(Datagram* out, size_t max) = 0;
  // Room for one datagram of len bytes to (dst_ip, dst_port), for the caller to write in place and
  // then commit(); nullptr (counted) when len is too long for the port. With coalesce the datagram may
  // join those queued just before it to the same destination as one segmented send (net/gso.h): only
  // for receivers that are softrdma contexts. *ip_id is the IPv4 identification it will carry on the
  // wire, which its ICRC must cover (0 over IPv6, which has none). It leaves at once, at the next reserve() or at flush().
  virtual uint8_t* reserve(uint32_t len, const wire::IpAddress& dst_ip, uint16_t dst_port, bool coalesce,
                           uint16_t* ip_id) = 0;
  virtual void commit() = 0;
  virtual void flush() = 0;
  // The datagrams queued (not sent yet), and: those queued now leave after those queued from now on,
  // when the batch is next sent (an answer before the ACKs held for it: the engine's held_). That send
  // ends it.
  virtual size_t queued() const { return 0; }
  virtual void defer_queued() {}
  // Queues a copy of one datagram, never coalesced.
  void send(const uint8_t* data, uint32_t len, const wire::IpAddress& dst_ip, uint16_t dst_port) {
    uint16_t ip_id;
    uint8_t* p = reserve(len, dst_ip, dst_port, false, &ip_id);
    if (!p) return;
    std::memcpy(p, data, len);
    commit();
  }
};

// Monotonic nanoseconds. The engine reads time only through one of these.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint64_t now_ns() const = 0;
};

// CLOCK_MONOTONIC.
class SystemClock final : public Clock {
 public:
  uint64_t now_ns() const override;
  static const SystemClock& instance();
};

}  // namespace softrdma::net
