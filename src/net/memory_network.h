// An in-memory network with a virtual clock: the test side of the packet seam (packet_port.h).
// Engines open ports on it instead of UDP sockets; a datagram sent is in flight until the clock
// reaches its arrival time, then deliver() puts it in its destination port's queue. Nothing runs on
// its own: a test advances the clock and steps the engines, so every run of a seed is the same.
//
// A fault policy decides each datagram's fate: drop, duplicate, delay, flip bits, or hold it until
// its sender's next send, however much later that is and wherever it goes (issue 12's reorder model).
// Buffers come from a pool that only grows, so steady traffic allocates nothing per datagram.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <vector>

#include "net/packet_port.h"

namespace softrdma::net {

class MemoryNetwork final : public Clock {
 public:
  static constexpr uint32_t kMaxDatagram = 65536;  // a segmented send (gso) fills up to 64 KiB

  // With segmentation offload on, a port gathers consecutive coalescing datagrams to one destination into
  // one segmented datagram (net/gso.h), which flies as one and is split on receive, as a veth carries
  // them between UDP_SEGMENT and UDP_GRO sockets. The policy then sees, and may corrupt, the whole of it.
  struct Options {
    uint64_t latency_ns = 2000;
    bool gso = false;
  };

  struct Endpoint {
    wire::IpAddress ip;
    uint16_t port;
    bool operator<(const Endpoint& o) const { return ip != o.ip ? ip < o.ip : port < o.port; }
  };
  // What the policy sees of a datagram; it may read the bytes (to target an opcode, say).
  struct Offer {
    Endpoint from, to;
    const uint8_t* data;
    uint32_t len;
    uint64_t index;  // datagrams offered so far on the network
    uint32_t seg_size;  // segmented (gso): its segment length; 0 for one datagram
  };
  struct Fate {
    bool drop = false;
    bool duplicate = false;    // a second copy arrives right after the first
    bool hold = false;         // held until the sender's next send, and arrives after that one
    uint64_t delay_ns = 0;     // on top of the network latency
    uint32_t flip_bit = ~0u;   // a bit (index into the datagram) flipped in every copy
  };
  using Policy = std::function<Fate(const Offer&)>;

  struct Stats {
    uint64_t sent = 0, delivered = 0, dropped = 0, duplicated = 0, held = 0, delayed = 0, flipped = 0,
             unroutable = 0;
  };

  explicit MemoryNetwork(uint64_t latency_ns = 2000) : latency_ns_(latency_ns) {}
  explicit MemoryNetwork(const Options& o) : latency_ns_(o.latency_ns), gso_(o.gso) {}
  ~MemoryNetwork() override;
  MemoryNetwork(const MemoryNetwork&) = delete;
  MemoryNetwork& operator=(const MemoryNetwork&) = delete;

  // A port at (ip, port); port 0 picks a free one from 40000 up. Throws std::system_error
  // (EADDRINUSE) when taken, as a socket bind would. The port must not outlive the network.
  std::unique_ptr<PacketPort> open(const wire::IpAddress& ip, uint16_t port);
  void set_policy(Policy p) { policy_ = std::move(p); }

  uint64_t now_ns() const override { return now_; }
  void advance_to(uint64_t t) {
    if (t > now_) now_ = t;
  }
  // Arrival time of the next datagram in flight; 0 when none is.
  uint64_t next_arrival() const { return flights_.empty() ? 0 : flights_.top().arrive_ns; }
  // Moves every datagram due by now into its port's queue; returns how many.
  size_t deliver();
  // Datagrams in flight or held by a sender.
  size_t in_flight() const;
  const Stats& stats() const { return stats_; }

 private:
  class Port;
  struct Flight {
    uint64_t arrive_ns;
    uint64_t seq;  // ties keep sending order
    uint32_t slot, len;
    Endpoint from, to;
    uint32_t seg_size = 0;
    bool operator>(const Flight& o) const { return arrive_ns != o.arrive_ns ? arrive_ns > o.arrive_ns : seq > o.seq; }
  };
  uint32_t alloc_slot();
  void free_slot(uint32_t slot) { free_.push_back(slot); }
  uint8_t* slot_data(uint32_t slot) { return chunks_[slot / kSlotsPerChunk].get() + (slot % kSlotsPerChunk) * kMaxDatagram; }
  void send(Port& from, const uint8_t* data, uint32_t len, Endpoint to, uint32_t seg_size);
  void launch(const Flight& f) { flights_.push(f); }

  static constexpr uint32_t kSlotsPerChunk = 16;
  uint64_t latency_ns_;
  bool gso_ = false;
  uint64_t now_ = 1;
  uint64_t seq_ = 0;
  Policy policy_;
  Stats stats_;
  std::vector<std::unique_ptr<uint8_t[]>> chunks_;
  std::vector<uint32_t> free_;
  std::priority_queue<Flight, std::vector<Flight>, std::greater<Flight>> flights_;
  std::map<Endpoint, Port*> ports_;
  uint16_t next_port_ = 40000;
};

}  // namespace softrdma::net
