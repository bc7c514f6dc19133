#include "net/memory_network.h"

#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>
#include <system_error>

namespace softrdma::net {

class MemoryNetwork::Port final : public PacketPort {
 public:
  Port(MemoryNetwork& net, Endpoint ep) : net_(net), ep_(ep) {}
  ~Port() override {
    for (const Flight& f : queue_) net_.free_slot(f.slot);
    release_lent();
    if (held_) net_.free_slot(held_->slot);
    net_.ports_.erase(ep_);
  }
  uint16_t port() const override { return ep_.port; }
  uint32_t ip_be() const override { return ep_.ip_be; }
  size_t receive(Datagram* out, size_t max) override {
    release_lent();
    size_t n = 0;
    for (; n < max && n < kBatch && !queue_.empty(); ++n) {
      const Flight& f = queue_.front();
      out[n] = {net_.slot_data(f.slot), f.len, f.from.ip_be, f.from.port, ep_.ip_be};
      lent_.push_back(f.slot);
      queue_.pop_front();
    }
    return n;
  }
  void send(const uint8_t* data, uint32_t len, uint32_t dst_ip_be, uint16_t dst_port) override {
    net_.send(*this, data, len, {dst_ip_be, dst_port});
  }
  void flush() override {}

 private:
  friend class MemoryNetwork;
  void release_lent() {
    for (uint32_t s : lent_) net_.free_slot(s);
    lent_.clear();
  }
  MemoryNetwork& net_;
  Endpoint ep_;
  std::deque<Flight> queue_;
  std::vector<uint32_t> lent_;   // slots handed out by the last receive()
  std::optional<Flight> held_;   // waits for this port's next send
};

MemoryNetwork::~MemoryNetwork() {
  // Ports must be gone first; what is still in flight just goes with the pool.
}

std::unique_ptr<PacketPort> MemoryNetwork::open(uint32_t ip_be, uint16_t port) {
  if (port == 0) {
    while (ports_.count({ip_be, next_port_})) ++next_port_;
    port = next_port_++;
  }
  Endpoint ep{ip_be, port};
  if (ports_.count(ep)) throw std::system_error(EADDRINUSE, std::generic_category(), "MemoryNetwork: port taken");
  auto p = std::make_unique<Port>(*this, ep);
  ports_[ep] = p.get();
  return p;
}

uint32_t MemoryNetwork::alloc_slot() {
  if (free_.empty()) {
    chunks_.push_back(std::make_unique<uint8_t[]>(size_t{kSlotsPerChunk} * kMaxDatagram));
    const uint32_t base = static_cast<uint32_t>((chunks_.size() - 1) * kSlotsPerChunk);
    for (uint32_t i = kSlotsPerChunk; i-- > 0;) free_.push_back(base + i);
  }
  uint32_t s = free_.back();
  free_.pop_back();
  return s;
}

void MemoryNetwork::send(Port& from, const uint8_t* data, uint32_t len, Endpoint to) {
  ++stats_.sent;
  if (len > kMaxDatagram) {
    ++stats_.dropped;
    return;
  }
  Fate fate;
  if (policy_) fate = policy_(Offer{from.ep_, to, data, len, stats_.sent - 1});
  // A datagram held earlier leaves now, right behind this one (whatever becomes of this one).
  std::optional<Flight> released = std::move(from.held_);
  from.held_.reset();
  const uint64_t arrive = now_ + latency_ns_ + fate.delay_ns;
  if (fate.drop) {
    ++stats_.dropped;
  } else {
    if (fate.delay_ns) ++stats_.delayed;
    for (int copy = 0; copy < (fate.duplicate ? 2 : 1); ++copy) {
      Flight f{arrive, seq_++, alloc_slot(), len, from.ep_, to};
      uint8_t* d = slot_data(f.slot);
      std::memcpy(d, data, len);
      if (fate.flip_bit < len * 8u) {
        d[fate.flip_bit / 8] ^= static_cast<uint8_t>(1u << (fate.flip_bit % 8));
        ++stats_.flipped;
      }
      if (copy) ++stats_.duplicated;
      if (fate.hold && !copy) {
        ++stats_.held;
        from.held_ = f;
      } else {
        launch(f);
      }
    }
  }
  if (released) {
    released->arrive_ns = std::max(arrive, now_ + latency_ns_);
    released->seq = seq_++;
    launch(*released);
  }
}

size_t MemoryNetwork::deliver() {
  size_t n = 0;
  while (!flights_.empty() && flights_.top().arrive_ns <= now_) {
    Flight f = flights_.top();
    flights_.pop();
    auto it = ports_.find(f.to);
    if (it == ports_.end()) {
      ++stats_.unroutable;
      free_slot(f.slot);
      continue;
    }
    it->second->queue_.push_back(f);
    ++stats_.delivered;
    ++n;
  }
  return n;
}

size_t MemoryNetwork::in_flight() const {
  size_t n = flights_.size();
  for (const auto& [ep, p] : ports_) n += p->held_.has_value();
  return n;
}

}  // namespace softrdma::net
