// Test harness for deterministic transport tests: progress engines with no threads, wired through a
// net::MemoryNetwork and stepped in its virtual time, plus helpers to build RC pairs and post work.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "net/memory_network.h"
#include "transport/engine.h"

namespace softrdma::transport::test {

// One host: an engine on the network at ip.
struct Host {
  std::unique_ptr<Engine> engine;
  wire::IpAddress ip;
};

class Fabric {
 public:
  static constexpr uint64_t kStepNs = 200;  // virtual time one pass of every engine takes

  explicit Fabric(uint64_t latency_ns = 2000) : net(latency_ns) {}
  // With o.gso, engines' packets to one another travel as segmented datagrams (memory_network.h).
  explicit Fabric(const net::MemoryNetwork::Options& o) : net(o) {}
  ~Fabric();
  Host& add_host(const wire::IpAddress& ip);

  // One round: deliver what is due, step every engine. True when anything happened.
  bool round();
  // Rounds until done() holds; when nothing happens, the clock jumps to the next arrival or timer.
  // False when limit_ns of virtual time passes first (or nothing is left to happen).
  bool run_until(const std::function<bool()>& done, uint64_t limit_ns = 60'000'000'000ull);
  // Rounds until nothing is in flight and no timer is armed, or limit_ns passes.
  bool settle(uint64_t limit_ns = 60'000'000'000ull);
  uint64_t now() const { return net.now_ns(); }

  net::MemoryNetwork net;
  std::vector<std::unique_ptr<Host>> hosts;
};

// Memory registered on an engine (owned here).
struct Region {
  std::vector<uint8_t> bytes;
  core::MrRegion mr{};
  uint8_t* data() { return bytes.data(); }
  uint64_t addr(uint64_t off = 0) const { return mr.addr + off; }
};
std::unique_ptr<Region> register_region(Engine& e, uint32_t pd, size_t len, uint32_t access);

// One end of an RC connection.
struct End {
  Host* host = nullptr;
  uint32_t pd = 0;
  std::unique_ptr<core::CompletionQueue> scq, rcq;
  Qp* qp = nullptr;
  Engine& engine() { return *host->engine; }
};

struct RcParams {
  uint32_t mtu = 1024;
  uint32_t psn_a = 0x100, psn_b = 0x200;
  uint8_t timeout = 10, retry_cnt = 7, rnr_retry = 7, min_rnr_timer = 1;
  uint32_t max_rd_atomic = 16;
  uint32_t access = core::kLocalWrite | core::kRemoteWrite | core::kRemoteRead | core::kRemoteAtomic;
  uint32_t max_wr = 256;
  std::function<void(End&)> before_rtr;  // called in INIT, before RTR (e.g. to install a wire key)
};

// Two connected RC QPs: a on host 0, b on host 1.
struct RcPair {
  End a, b;
};
RcPair connect_rc(Fabric& f, Host& ha, Host& hb, const RcParams& p);
// Takes both QPs to RESET and connects them again (INIT, RTR, RTS), as an application that re-uses
// its QPs for a new connection does.
void reconnect_rc(RcPair& r, const RcParams& p);
void destroy(End& e);

// Work requests.
SendWqe write_wqe(uint64_t wr_id, const Region& src, uint64_t off, uint32_t len, uint64_t raddr, uint32_t rkey);
SendWqe read_wqe(uint64_t wr_id, const Region& dst, uint64_t off, uint32_t len, uint64_t raddr, uint32_t rkey);
SendWqe atomic_wqe(uint64_t wr_id, WrOp op, const Region& dst, uint64_t off, uint64_t raddr, uint32_t rkey,
                   uint64_t compare_add, uint64_t swap = 0);
SendWqe send_wqe(uint64_t wr_id, const Region& src, uint64_t off, uint32_t len, WrOp op = WrOp::Send);
RecvWqe recv_wqe(uint64_t wr_id, const Region& dst, uint64_t off, uint32_t len);
int post(End& e, const SendWqe& w);
int post(End& e, const RecvWqe& w);

// Polls every CQE there is.
std::vector<core::Cqe> poll_all(End& e, core::CompletionQueue& cq);

// A datagram's RoCE header fields, for policies and traces.
struct PacketView {
  uint8_t opcode = 0;
  uint32_t psn = 0;
  uint32_t dest_qp = 0;
  uint8_t syndrome = 0;  // AETH, when the packet has one
  bool ack_req = false;
};
PacketView view(const uint8_t* data, uint32_t len);
// The datagrams of what a policy is offered: one, or each segment of a segmented one (Offer::seg_size).
struct Segment {
  const uint8_t* data;
  uint32_t len;
  uint32_t offset;  // of its first byte in the offered datagram
};
std::vector<Segment> segments(const net::MemoryNetwork::Offer& o);
std::string describe(const PacketView& v);

}  // namespace softrdma::transport::test
