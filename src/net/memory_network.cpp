#include "net/memory_network.h"

#include "net/gso.h"

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
    launch_run();
    for (const Flight& f : queue_) net_.free_slot(f.slot);
    release_lent();
    if (held_) net_.free_slot(held_->slot);
    net_.ports_.erase(ep_);
  }
  uint16_t port() const override { return ep_.port; }
  const wire::IpAddress& ip() const override { return ep_.ip; }
  size_t receive(Datagram* out, size_t max) override {
    release_lent();
    size_t n = 0;
    while (n < max && n < kBatch && !queue_.empty()) {
      const Flight& f = queue_.front();
      if (cursor_.done()) cursor_ = {net_.slot_data(f.slot), f.len, f.seg_size};
      Datagram& d = out[n++];
      d.len = cursor_.next(&d.data, &d.segment);
      d.peer_ip = f.from.ip;
      d.peer_port = f.from.port;
      d.local_ip = ep_.ip;
      if (cursor_.done()) {
        lent_.push_back(f.slot);
        queue_.pop_front();
      }
    }
    return n;
  }
  uint8_t* reserve(uint32_t len, const wire::IpAddress& dst_ip, uint16_t dst_port, bool coalesce,
                   uint16_t* ip_id) override {
    if (len > kMaxDatagram) {
      ++net_.stats_.sent;
      ++net_.stats_.dropped;
      return nullptr;
    }
    placing_len_ = len;
    if (net_.gso_ && coalesce && run_.accepts(dst_ip, dst_port, len)) {
      placing_join_ = true;
      *ip_id = static_cast<uint16_t>(run_.segments);
      return gather_.data() + run_.bytes;
    }
    launch_run();
    placing_join_ = false;
    placing_to_ = {dst_ip, dst_port};
    placing_coalesce_ = net_.gso_ && coalesce;
    *ip_id = 0;
    if (gather_.size() < kMaxDatagram) gather_.resize(kMaxDatagram);
    return gather_.data();
  }
  void commit() override {
    if (placing_join_) {
      run_.add(placing_len_);
      return;
    }
    run_.open(placing_to_.ip, placing_to_.port, placing_len_);
    if (!placing_coalesce_) launch_run();  // alone: it leaves now, as before segmentation existed
  }
  void flush() override { launch_run(); }

 private:
  friend class MemoryNetwork;
  void launch_run() {
    if (!run_.segments) return;
    net_.send(*this, gather_.data(), run_.bytes, {run_.dst_ip, run_.dst_port},
              run_.segments > 1 ? run_.seg_size : 0);
    run_ = {};
  }
  void release_lent() {
    for (uint32_t s : lent_) net_.free_slot(s);
    lent_.clear();
  }
  MemoryNetwork& net_;
  Endpoint ep_;
  std::deque<Flight> queue_;
  std::vector<uint32_t> lent_;   // slots handed out by the last receive()
  std::optional<Flight> held_;   // waits for this port's next send
  SegmentCursor cursor_;         // splits queue_.front() into its segments
  // The datagram reserve() handed out, and the run of them being gathered into one send.
  std::vector<uint8_t> gather_;
  GsoRun run_;
  uint32_t placing_len_ = 0;
  Endpoint placing_to_{};
  bool placing_join_ = false, placing_coalesce_ = false;
};

MemoryNetwork::~MemoryNetwork() {
  // Ports must be gone first; what is still in flight just goes with the pool.
}

std::unique_ptr<PacketPort> MemoryNetwork::open(const wire::IpAddress& ip, uint16_t port) {
  if (port == 0) {
    while (ports_.count({ip, next_port_})) ++next_port_;
    port = next_port_++;
  }
  Endpoint ep{ip, port};
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

void MemoryNetwork::send(Port& from, const uint8_t* data, uint32_t len, Endpoint to, uint32_t seg_size) {
  ++stats_.sent;
  if (len > kMaxDatagram) {
    ++stats_.dropped;
    return;
  }
  Fate fate;
  if (policy_) fate = policy_(Offer{from.ep_, to, data, len, stats_.sent - 1, seg_size});
  // A datagram held earlier leaves now, right behind this one (whatever becomes of this one).
  std::optional<Flight> released = std::move(from.held_);
  from.held_.reset();
  const uint64_t arrive = now_ + latency_ns_ + fate.delay_ns;
  if (fate.drop) {
    ++stats_.dropped;
  } else {
    if (fate.delay_ns) ++stats_.delayed;
    for (int copy = 0; copy < (fate.duplicate ? 2 : 1); ++copy) {
      Flight f{arrive, seq_++, alloc_slot(), len, from.ep_, to, seg_size};
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
