// The progress engine of one device context: the software HCA (docs/architecture.md, "The engine").
// It keeps the context's QP table, key table, CQs, counters, timers and a background progress thread,
// and owns the objects that do the rest: the RoCE ports (roce_ports.h), one path object per wire
// (path.h: RoCE RC with its requester, completer and responder, UD/UC, direct, iWARP, raw), receive
// placement, the SRQ table and wire protection. All of them run under its lock, one at a time, so
// transport state needs no finer locking; applications only fill queue rings and poll CQ rings.
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <initializer_list>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "config/config.h"
#include "core/arena.h"
#include "core/cq.h"
#include "core/event_queue.h"
#include "core/mr.h"
#include "core/stats.h"
#include "net/interfaces.h"
#include "net/link_monitor.h"
#include "net/packet_port.h"
#include "net/udp_port.h"
#include "transport/direct.h"
#include "transport/icrc_gate.h"
#include "transport/iwarp.h"
#include "transport/path.h"
#include "transport/placement.h"
#include "transport/protect.h"
#include "transport/qp.h"
#include "transport/raw.h"
#include "transport/rc_path.h"
#include "transport/roce_ports.h"
#include "transport/datagram_path.h"
#include "transport/srq.h"
#include "wire/headers.h"
#include "wire/opcode.h"

namespace softrdma::transport {

// Async events, numerically identical to enum ibv_event_type.
enum class AsyncEventType : uint32_t {
  CqErr = 0, QpFatal = 1, QpReqErr = 2, QpAccessErr = 3, CommEst = 4, SqDrained = 5, PathMig = 6,
  PathMigErr = 7, DeviceFatal = 8, PortActive = 9, PortErr = 10, LidChange = 11, PkeyChange = 12,
  SmChange = 13, SrqErr = 14, SrqLimitReached = 15, QpLastWqeReached = 16, ClientReregister = 17,
  GidChange = 18,
};
struct AsyncEvent {
  AsyncEventType type;
  Qp* qp = nullptr;
  core::CompletionQueue* cq = nullptr;
  Srq* srq = nullptr;
};


// Everything modify_qp may change, already validated by the verbs layer (verbs/qp_state.h).
struct QpModify {
  int mask = 0;                 // enum ibv_qp_attr_mask bits
  QpState state = QpState::Reset;
  uint32_t access_flags = 0;
  uint32_t mtu_bytes = 0;
  uint32_t dest_qpn = 0;
  wire::IpAddress dest_ip;
  uint32_t rq_psn = 0, sq_psn = 0;
  uint8_t timeout = 0, retry_cnt = 0, rnr_retry = 0, min_rnr_timer = 0;
  uint32_t max_rd_atomic = 0, max_dest_rd_atomic = 0;
  uint32_t qkey = 0;
};

// How an engine meets the world (the packet seam, net/packet_port.h). The defaults are a device
// context's: UDP sockets, the system clock, a progress thread. A deterministic transport test gives
// ports of a net::MemoryNetwork and its virtual clock, no thread and no direct path, and calls step().
// The engine reads no environment: a context's options come from the configuration table
// (context_options below), read when it opens.
struct EngineOptions {
  // Opens the packet port at (ip, port); port 0 means any. Throws std::system_error when it cannot.
  std::function<std::unique_ptr<net::PacketPort>(const wire::IpAddress& ip, uint16_t port)> open_port;
  // Wraps fd, another process's UDP 4791 socket taken from its offer (net/port_share.h), as a port;
  // throws std::system_error (closing fd) when it cannot. Empty: 4791 is never shared (ports that
  // are not UDP sockets). The default goes with the default open_port.
  std::function<std::unique_ptr<net::PacketPort>(int fd)> adopt_port;
  const net::Clock* clock = nullptr;  // nullptr: net::SystemClock
  bool progress_thread = true;
  bool link_monitor = true;
  bool direct = true;           // the intra-host direct path (SOFTRDMA_DIRECT)
  bool take_roce_port = true;   // try to hold UDP 4791 for the address (docs/architecture.md)
  // How long the progress thread keeps spinning after its last piece of work before it blocks.
  uint64_t spin_us = config::Settings{}.spin_us;  // SOFTRDMA_SPIN_US
  // How long a requester resends past retry_cnt to a peer known to exist (docs/reliability.md).
  uint64_t peer_pause_ms = config::Settings{}.peer_pause_ms;  // SOFTRDMA_PEER_PAUSE_MS
  bool dump_counters = false;   // print the context's counters to stderr when it closes (SOFTRDMA_COUNTERS)
  config::DirectPeers direct_peers = config::Settings{}.direct_peers;  // SOFTRDMA_DIRECT_PEERS
  std::optional<uint32_t> stats_mode;  // the counters page's file mode (SOFTRDMA_STATS_MODE)
  std::string capture;          // the pcapng file of packet capture (SOFTRDMA_CAPTURE; "": off)
};

// A device context's options from the configuration table's settings.
inline EngineOptions context_options(const config::Settings& s) {
  EngineOptions o;
  o.direct = s.direct;
  o.spin_us = s.spin_us;
  o.peer_pause_ms = s.peer_pause_ms;
  o.dump_counters = s.counters;
  o.direct_peers = s.direct_peers;
  o.stats_mode = s.stats_mode;
  o.capture = s.capture;
  return o;
}

class RcPath;        // transport/rc_path.h
class DirectPath;    // transport/direct_path.h
class DatagramPath;  // transport/datagram_path.h
class IwarpPath;     // transport/iwarp_path.h
class RawPath;       // transport/raw_path.h

class Engine {
 public:
  explicit Engine(const net::Interface& iface, EngineOptions opts = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  // Every engine of this process sends what its application's last poll held (held_). Run at exit
  // (an atexit handler, and librdmacm's before its DREQs), when no later call of the application
  // will; an engine whose lock stays taken (another thread mid-pass, or a child after fork) is skipped.
  static void flush_all_held();

  const net::Interface& interface() const { return iface_; }
  core::Arena& arena() { return arena_; }
  core::EventQueue<AsyncEvent>& async_events() { return async_events_; }
  // The port's link as last seen by the link monitor (port_state.cpp); always up without one.
  net::LinkState port_link() const;
  // The device's counters (all QPs, and drops before a QP is known).
  core::Counters counters();

  // Memory regions: false when the key table is full.
  bool register_mr(core::MrRegion& region);
  // 0, or EBUSY while memory windows are bound to the region (ibv_dereg_mr(3)).
  int deregister_mr(const core::MrRegion& region);
  // ibv_rereg_mr: region (registered) takes wanted's addr, iova, length, access and PD; its keys
  // stay. translation: the pages change, and operations in flight lose their pointers into the old
  // ones as at deregistration. 0, or EBUSY while memory windows are bound to it (nothing changes).
  int reregister_mr(core::MrRegion& region, const core::MrRegion& wanted, bool translation);
  // The region registered under lkey (ibv_advise_mr); false when there is none.
  bool lookup_mr(uint32_t lkey, core::MrRegion* out);
  // Memory windows: alloc_mw is false when max_mw are allocated; dealloc_mw invalidates a bound one.
  bool alloc_mw(core::MwType type, uint32_t pd, uint32_t* handle, uint32_t* rkey);
  void dealloc_mw(uint32_t handle);

  std::unique_ptr<core::CompletionQueue> create_cq(uint32_t entries, core::CompletionQueue::EventFn on_completion);
  // Drops the CQ's pending events; the CQ must have no QPs left (the verbs layer checks).
  void destroy_cq(core::CompletionQueue* cq);
  // ibv_resize_cq: 0, EINVAL (more CQEs present than fit) or ENOMEM; no CQE is produced meanwhile.
  int resize_cq(core::CompletionQueue* cq, uint32_t entries);

  // Returns nullptr (errno set) on failure.
  Qp* create_qp(const QpConfig& cfg);
  void destroy_qp(Qp* qp);
  int modify_qp(Qp* qp, const QpModify& m);
  // Whether the kernel of the QP's peer says the peer's process is gone (net/liveness.h): rdma_cm
  // reports DISCONNECTED for a connection idle when its peer died. Asks again on each call (the
  // first only connects); never true for a peer that is not a softrdma context's own port.
  bool peer_gone(uint32_t qpn);
  // Adds one to a device counter, from a thread that does not hold the engine lock (librdmacm's).
  void count_device(uint64_t core::Counters::*field) {
    std::lock_guard lock(lock_);
    count(nullptr, field);
  }
  // Wire protection of RC and UC QPs' packets (protect.h).
  WireProtection& protection() { return *protection_; }
  // iWARP: moves an RC QP in INIT to RTS over a connected TCP socket (the iWARP path, iwarp_qp.cpp).
  // 0 or an errno.
  int iwarp_attach(Qp* qp, const IwarpAttach& a);

  // Queue WQEs (already translated by the verbs layer). Return 0 or an errno; *bad = index of the
  // first WQE not queued.
  // whole_batch (ibv_wr_complete): all n are queued or, on any error, none.
  int post_send(Qp* qp, const SendWqe* wqes, int n, int* bad, bool whole_batch = false);
  int post_recv(Qp* qp, const RecvWqe* wqes, int n, int* bad);

  // Shared receive queues and their tag matching (srq.h).
  SrqTable& srq_table() { return *srq_table_; }
  // ibv_poll_cq: when the CQ is empty, drives progress inline (no wake-up of the progress thread needed).
  int poll_cq(core::CompletionQueue* cq, core::Cqe* out, int n);
  // ibv_req_notify_cq: arms the CQ, then places what intra-host initiators left for it while it was
  // unarmed (they rang no doorbell), so that those messages raise the event.
  void arm_cq(core::CompletionQueue* cq, bool solicited_only);

  // A thread waiting in ibv_get_cq_event does the engine's work itself, as a spinning poller does, so
  // that a message costs one wake-up, the waiter's, not the progress thread's and then the waiter's:
  // the channel's fd holds input_fd() (readable when a socket of this engine is), and the waiter runs
  // waiter_pass() before it sleeps there and after each wake-up. waiter_pass returns false when this
  // engine's progress thread serves its sockets anyway (it serves one-sided requests or has an
  // intra-host direct peer): the waiter then sleeps on the channel's pipe alone. *deadline_ns: lowered
  // to the engine's earliest timer, which the waiter keeps while it sleeps. waiter_sleeps(true) and
  // (false) bracket the sleep, so that the progress thread stays off the sockets meanwhile.
  // waiter_arrives: a thread enters ibv_get_cq_event (the progress thread goes quiet even when the
  // event is there already); what waiter_pass returns.
  int input_fd() const { return input_epoll_fd_; }
  bool waiter_arrives();
  bool waiter_pass(uint64_t* deadline_ns);
  void waiter_sleeps(bool asleep);

  // Without a progress thread: one pass of the progress engine (receive, timers, requesters,
  // responders); true when it did anything. And the earliest timer deadline of any QP (0: none).
  bool step();
  // Places what intra-host initiators left in this context's inboxes (their CQEs raise the events of
  // armed CQs): for a thread woken on a completion channel by such an initiator.
  void place_direct();
  uint64_t next_deadline();
  uint64_t now() const { return clock_->now_ns(); }

  // The UDP port this context receives on (the registry's endpoint for its QPNs).
  uint16_t udp_port() const { return ports_->port(); }
  // Feeds one datagram through the receive path as if it had arrived on local_port (0: udp_port()) from
  // (peer_ip, peer_port): for fuzzing and hostile-input tests.
  void inject_datagram(const uint8_t* data, uint32_t len, const wire::IpAddress& peer_ip, uint16_t peer_port,
                       uint16_t local_port = 0);
  // The context's RoCEv2 ports, whose multicast groups UD QPs join (roce_ports.h).
  RocePorts& ports() { return *ports_; }
  // RAW_PACKET flow steering and receive work queues (the raw path, raw_path.h).
  RawPath& raw() { return *raw_; }

 private:
  // port_state.cpp: reads the link monitor; a change of the port's state raises PORT_ERR/PORT_ACTIVE.
  void start_link_monitor();
  // readable: epoll saw the monitor's fd ready; otherwise it is read at most every few ms.
  void check_link(uint64_t now_ns, bool readable);
  // engine.cpp
  void progress_loop();
  // The progress thread while an application thread drives the engine from poll_cq: it sleeps on the
  // doorbell alone, for at most kQuietCheckNs or until a timer is due, then does one pass.
  void quiet_sleep();
  // Some peer reaches this context by packets (no direct peer at all, or packet_qps_): its polls and
  // waiters serve the sockets themselves.
  bool packet_peers() const;
  // An application thread drives the engine (a poll that found nothing, a channel's waiter): counted,
  // so that the progress thread goes or stays quiet.
  void app_drives();
  static constexpr uint64_t kQuietCheckNs = 1000000;
  // How long a wake-up without a doorbell that placed direct messages waits for their ring before it
  // counts them as direct_late_events (progress_loop).
  static constexpr int kLateRingWaitMs = 200;
  // Lock held; true when anything was done. may_hold: a polling application's pass, which may leave the
  // ACKs it queued for that application's next call (held_) when it produced completions.
  bool progress_once(bool may_hold = false);
  // Lock held: sends what a poll's pass held back (held_), if anything.
  void flush_held();
  // Lock held: operations in flight drop their host pointers into the region's pages (deregistration,
  // or a rereg that moves it), so a late packet finds an error instead of memory no longer its own.
  void forget_pointers_into(const core::MrRegion& region);
  // A packet for one of our QPs, past the port's checks: the QP's own (service class, XRC direction,
  // source address, state), then to its completer, responder, or UD/UC receive.
  void deliver(Qp& qp, wire::Packet& pkt, const Arrival& from);
  // Rouses a sleeping progress thread; rouse_quiet: a quiet one too (work that no poller may see).
  void doorbell(bool rouse_quiet = false);
  uint64_t next_deadline_ns();
  // Takes the engine lock for an application thread: when free, or, once a QP has a direct peer, after
  // waiting for it (posts and polls then do the direct path's work themselves).
  bool lock_for_caller();
  void move_to_error(Qp& qp);
  void flush_queues(Qp& qp);
  void post_cqe(core::CompletionQueue* cq, const core::Cqe& cqe, bool solicited);
  // Adds n to a counter of the device and, when the packet belongs to a QP, of that QP.
  void count(Qp* qp, uint64_t core::Counters::*field, uint64_t n = 1) {
    stats_.device().*field += n;
    if (qp && qp->stats) qp->stats->*field += n;
  }

  // The paths (path.h). A QP is on the path of its type from its creation (RoCE RC and XRC, RoCE
  // UD/UC, raw packets) until an attach moves it to another (direct, iWARP); path_of gives it.
  friend class PathServices;
  std::unique_ptr<RcPath> rc_;               // RC and XRC QPs, and the roles UC and iWARP share
  std::unique_ptr<DirectPath> direct_path_;  // RC QPs whose peer is a context of this host
  std::unique_ptr<DatagramPath> datagram_;   // UD and UC QPs
  std::unique_ptr<RawPath> raw_;             // RAW_PACKET QPs, their flows and WQs
  std::unique_ptr<IwarpPath> iwarp_;         // RC QPs attached to a TCP socket
  // What every path shares: receive placement, the SRQs, RoCE packet protection, the ports.
  std::unique_ptr<Placement> placement_;
  std::unique_ptr<SrqTable> srq_table_;
  std::unique_ptr<WireProtection> protection_;
  std::unique_ptr<RocePorts> ports_;  // the receive WQEs and placement into them, for every path
  Path* paths_[5] = {};  // in the order a progress pass looks at their own streams and ports
  Path& path_of(const Qp& qp) const;
  void batch_done() {
    for (Path* p : paths_) p->batch_done();
  }

  net::Interface iface_;
  core::Arena arena_;
  core::MrTable mrs_;
  core::EventQueue<AsyncEvent> async_events_;
  EngineOptions opts_;
  const net::Clock* clock_;
  std::mutex lock_;                          // the engine lock
  std::unordered_map<uint32_t, Qp*> qps_;
  std::vector<Qp*> qp_list_;
  core::StatsPage stats_;
  uint32_t empty_polls_ = 0;  // poll_cq calls that found nothing (under lock_)
  // Under lock_: the packets and FPDUs counted when a poll's pass last saw them move, and the passes
  // since that saw none. With direct peers too, packet peers quiet for kQuietPasses passes (a few
  // milliseconds of spinning) get a pass on every 64th empty poll only: UCX's UD wire-up QP stays a
  // packet peer after its connections moved to the direct path.
  uint64_t packet_activity_ = 0;
  uint32_t quiet_passes_ = 0;
  static constexpr uint32_t kQuietPasses = 4096;
  bool app_pass_ = false;  // under lock_: the pass is an application's poll
  // Under lock_: the CQ whose empty poll ran the last whole pass, and when that pass ended. Consumers
  // such as UCX poll several CQs in turn (each transport's send and receive CQ); a pass is a receive
  // system call (~1.3 us here), so a poll of another CQ within kOtherCqPassGapNs of a pass leaves the
  // sockets to the next poll of that CQ: one pass per round of polls, not one per CQ.
  const core::CompletionQueue* pass_cq_ = nullptr;
  uint64_t pass_end_ns_ = 0;
  static constexpr uint64_t kOtherCqPassGapNs = 2000;
  uint64_t cqes_posted_ = 0;    // CQEs written by this engine (under lock_)
  uint64_t acks_queued_ = 0;    // ACKs queued (under lock_): a pass that queued none holds nothing
  uint64_t others_queued_ = 0;  // packets other than ACKs queued (under lock_): those are never held
  // Under lock_: ACKs a polling application's pass queued and left for its next call (progress_once).
  // Sent by that call (most often the post of its answer: both leave in one sendmmsg), or the quiet
  // progress thread's next check, or a modify or destroy of a QP, or the engine's end, or exit.
  bool held_ = false;
  bool answers_ = true;  // under lock_: the application posted a send since a pass last sent held ACKs
  uint64_t events_raised_ = 0;  // completion events raised by this engine's CQs (under lock_)
  const uint64_t spin_ns_;      // SOFTRDMA_SPIN_US: how long the progress thread spins when idle
  // Some QP has had an intra-host direct peer: posts wait for the lock, empty polls look in the inboxes.
  std::atomic<bool> direct_active_{false};
  // QPs whose peer's packets arrive on this context's sockets and streams (set_packet_peer): while
  // there are any, empty polls serve the sockets as they would without a direct peer.
  std::atomic<uint32_t> packet_qps_{0};
  // Lock held: counts the QP in packet_qps_ or not, from RTR (or an iWARP attach) until reset or destroy.
  void set_packet_peer(Qp& qp, bool on);
  std::unique_ptr<DirectEndpoint> direct_;  // the intra-host direct path; nullptr when off
  // Send-queue credits (qp.h), one per QP slot; free_credits_ under the engine lock.
  std::unique_ptr<SqCredit[]> sq_credits_;
  std::vector<uint32_t> free_credits_;

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<uint32_t> work_hint_{0};
  int doorbell_fd_ = -1;
  int epoll_fd_ = -1;
  int quiet_epoll_fd_ = -1;  // the doorbell alone (quiet_sleep)
  int input_epoll_fd_ = -1;  // epoll_fd_'s sockets and streams without the doorbell and link (input_fd)
  // Run to completion: an application thread's last poll_cq found nothing and drove the engine itself
  // (it polls again); app_polls_ counts such polls; quiet_: the progress thread sleeps in quiet_sleep.
  std::atomic<bool> app_polling_{false};
  std::atomic<uint64_t> app_polls_{0};
  std::atomic<bool> quiet_{false};
  // Threads asleep in waiter_sleeps on input_fd(): they serve the sockets, so a quiet progress thread
  // that saw no poll for kQuietCheckNs stays quiet (deep_quiet_: with no periodic check) until the last
  // of them wakes, which rouses it.
  std::atomic<int> waiters_{0};
  std::atomic<bool> deep_quiet_{false};
  // When peers last sent this context a one-sided request (WRITE, READ, ATOMIC): for kPassiveHoldNs
  // after one, its application may wait on memory for the next as soon as a poll returns, and only the
  // progress thread can place it, so that thread does not go quiet. (Not for good: UCX, for one, reads
  // once while it connects and then only sends.)
  std::atomic<uint64_t> passive_at_ns_{0};
  static constexpr uint64_t kPassiveHoldNs = 100'000'000;
  bool serves_passive(uint64_t now_ns) const {
    const uint64_t at = passive_at_ns_.load(std::memory_order_relaxed);
    return at && now_ns - at < kPassiveHoldNs;
  }
  // The device interface's link (port_state.cpp): the monitor is the progress thread's; port_link_
  // holds its last LinkState (bit 0 admin up, 1 carrier, 2 address) for ibv_query_port.
  std::unique_ptr<net::LinkMonitor> link_;
  std::atomic<uint32_t> port_link_{7};
  uint64_t link_checked_ns_ = 0;
};

uint64_t now_ns();

// The services of path.h, each the engine's own step (the engine lock is held).
inline uint64_t PathServices::now() const { return e_.now(); }
inline const net::Interface& PathServices::iface() const { return e_.iface_; }
inline void PathServices::count(Qp* qp, uint64_t core::Counters::*field, uint64_t n) { e_.count(qp, field, n); }
inline void PathServices::post_cqe(core::CompletionQueue* cq, const core::Cqe& cqe, bool solicited) {
  e_.post_cqe(cq, cqe, solicited);
}
inline void PathServices::raise(const AsyncEvent& ev) { e_.async_events_.push(ev); }
inline void PathServices::move_to_error(Qp& qp) { e_.move_to_error(qp); }
inline void PathServices::doorbell() { e_.doorbell(); }
inline core::MrTable& PathServices::keys() const { return e_.mrs_; }
inline void PathServices::serves_passive() {
  // Refreshed at most every millisecond: one store, not one per packet.
  const uint64_t t = e_.now();
  if (t - e_.passive_at_ns_.load(std::memory_order_relaxed) > 1'000'000)
    e_.passive_at_ns_.store(t, std::memory_order_relaxed);
}
inline std::mutex& PathServices::engine_lock() { return e_.lock_; }
inline Requester& PathServices::requester() { return e_.rc_->requester(); }
inline Completer& PathServices::completer() { return e_.rc_->completer(); }
inline Responder& PathServices::responder() { return e_.rc_->responder(); }
inline void PathServices::send_packet(Qp& qp, wire::Packet& pkt, const uint8_t* payload, uint32_t len,
                                      const char* synthetic) {
  ++(pkt.bth.opcode == wire::kRcAck ? e_.acks_queued_ : e_.others_queued_);
  e_.ports_->send_packet(qp, pkt, payload, len, synthetic);
}
inline net::Capture* PathServices::capture() { return e_.ports_->capture(); }
inline void PathServices::send_packet_to(Qp& qp, wire::Packet& pkt, const uint8_t* payload, uint32_t len,
                                         const wire::IpAddress& dest_ip, uint16_t dest_port) {
  ++e_.others_queued_;
  e_.ports_->send_packet_to(qp, pkt, payload, len, dest_ip, dest_port);
}
inline void PathServices::resolve_destination(Qp& qp, bool again) { e_.ports_->resolve_destination(qp, again); }
inline net::Liveness::Verdict PathServices::peer_liveness(const Qp& qp, uint64_t max_age_ns, uint64_t asked_from_ns,
                                                         uint64_t asked_until_ns) {
  return e_.ports_->peer_liveness(qp, max_age_ns, asked_from_ns, asked_until_ns);
}
inline uint64_t PathServices::peer_pause_ns() const { return e_.opts_.peer_pause_ms * 1'000'000ull; }
inline Qp* PathServices::find_qp(uint32_t qpn) const {
  auto it = e_.qps_.find(qpn);
  return it == e_.qps_.end() ? nullptr : it->second;
}
inline void PathServices::deliver(Qp& qp, wire::Packet& pkt, const Arrival& from) { e_.deliver(qp, pkt, from); }
inline void PathServices::batch_done() { e_.batch_done(); }
inline WireProtection& PathServices::protection() { return *e_.protection_; }
inline DirectEndpoint* PathServices::direct() { return e_.direct_.get(); }

inline const std::vector<Srq*>& PathServices::srqs() const { return e_.srq_table_->list(); }
inline const std::vector<Qp*>& PathServices::qps() const { return e_.qp_list_; }
inline void PathServices::forget_events_of(const Srq* srq) {
  e_.async_events_.discard_if([srq](const AsyncEvent& ev) { return ev.srq == srq; });
}
inline bool PathServices::tm_sq_done(Qp& qp, const SqEntry& e, uint64_t index, WcStatus status) {
  return e_.srq_table_->tm_sq_done(qp, e, index, status);
}
inline void PathServices::release_recv_ring(void* slots, size_t bytes) { e_.arena_.release(slots, bytes); }
inline core::Arena& PathServices::arena() { return e_.arena_; }
inline Placement& PathServices::placement() { return *e_.placement_; }

}  // namespace softrdma::transport
