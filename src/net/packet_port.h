// The packet seam (DESIGN §8): what a progress engine sends and receives datagrams through, and the
// clock it reads. UdpPort (udp_port.h) is the real one; MemoryNetwork (memory_network.h) is an
// in-memory network with a virtual clock, so transport tests step engines deterministically.
#pragma once

#include <cstddef>
#include <cstdint>

namespace softrdma::net {

struct Datagram {
  uint8_t* data;
  uint32_t len;
  uint32_t peer_ip_be;
  uint16_t peer_port;     // host order
  uint32_t local_ip_be;   // destination address of the datagram (IP_PKTINFO), else the bound address
};

class PacketPort {
 public:
  static constexpr size_t kBatch = 64;  // datagrams per receive() / per send batch

  virtual ~PacketPort() = default;
  virtual uint16_t port() const = 0;  // host order
  virtual uint32_t ip_be() const = 0;
  // A file descriptor that becomes readable when datagrams arrive (for epoll); -1 when there is none.
  virtual int fd() const { return -1; }
  // Up to max (at most kBatch) datagrams; out[i].data stays valid until the next receive().
  virtual size_t receive(Datagram* out, size_t max) = 0;
  // Queues one datagram (copied); it may leave at once or at the next flush().
  virtual void send(const uint8_t* data, uint32_t len, uint32_t dst_ip_be, uint16_t dst_port) = 0;
  virtual void flush() = 0;
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
