// A path: one wire a QP's messages travel over, as one object per engine with the same small set of
// per-QP entry points (docs/architecture.md, "Paths"): RoCE RC and XRC (rc_path.h), RoCE UD/UC
// (datagram_path.h), the intra-host direct path (direct_path.h), iWARP (iwarp_path.h) and raw packets
// (raw_path.h).
//
// Joining and state. Every QP is on one path. It is on its type's path from creation (RC and XRC:
// RcPath, UD and UC: DatagramPath, raw: RawPath, which sets Qp::path at create_qp) until an attach
// moves it (DirectPath at RTR, IwarpPath at iwarp_attach): that path sets Qp::path to itself and, if it
// keeps per-QP state, Qp::path_state to an object of its own derived from PathState, which only it
// looks inside. The QP leaves at reset() or release(), when the path drops that state and clears
// Qp::path (Engine::path_of then gives the QP's type's path again).
//
// Calls. The engine calls a path only with its lock held, and only through Path: the requester's
// pass (transmit), a RoCE packet from the ports (deliver), the receive pass over the path's own
// streams or ports (receiving, receive), the timers (timers, next_deadline), the end of a received
// batch (batch_done), the QP to error (error), a memory region going away (forget_pointers_into),
// flush, reset and release, and post_send's check (carries). A path reaches the engine only through
// PathServices: the clock, counters, CQEs and async events, the key table, receive placement, the
// RoCE roles' shared steps, the ports, epoll registration -- never the engine's other members.
//
// Adding a path: derive a class from Path and PathServices (as IwarpPath and RawPath do), keep its
// per-QP state in a PathState subclass set on the Qp when it joins, add one instance to the engine
// (Engine's constructor, paths_ in receive order), and have the engine's entry point for it (create_qp,
// an attach call) make QPs join it. Everything else reaches it through the calls above.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <vector>

#include "core/arena.h"
#include "core/cq.h"
#include "core/mr.h"
#include "core/stats.h"
#include "net/liveness.h"

namespace softrdma::net {
struct Interface;
class Capture;
}
namespace softrdma::wire {
struct Packet;
}

namespace softrdma::transport {

class Engine;
struct Qp;
struct SendWqe;
struct SqEntry;
struct RecvWqe;
struct AsyncEvent;
struct Srq;
struct Bytes;
class DirectEndpoint;
class Requester;
class Completer;
class Responder;
class Placement;
class WireProtection;
template <typename Slot>
struct WorkQueue;

// Where a RoCEv2 packet came from and went to, and its UDP length.
struct Arrival {
  wire::IpAddress peer_ip;
  uint16_t peer_port = 0;
  wire::IpAddress local_ip;  // the device's address, or the multicast group's
  uint32_t len = 0;
};

// A path's state of one QP (Qp::path_state), owned by the QP while it is on the path.
struct PathState {
  virtual ~PathState() = default;
};

class Path {
 public:
  virtual ~Path() = default;
  // post_send's check: whether this path carries the work request (EINVAL for the rest).
  virtual bool carries(const Qp& qp, const SendWqe& w) const = 0;
  // The requester (and what the responder owes): the QP's WQEs to the wire; true when it did
  // anything. now_ns is 0 on a post from the caller's thread (read the clock where a timer needs it).
  virtual bool transmit(Qp& qp, uint64_t now_ns) = 0;
  // A RoCEv2 packet for the QP from the engine's ports, past the port's checks and the QP's service
  // class and source address. A path that takes none counts and drops it.
  virtual void deliver(Qp& qp, wire::Packet& pkt, const Arrival& from) = 0;
  // Once per progress pass, before transmit: the QP's timers that are due at now_ns.
  virtual void timers(Qp&, uint64_t) {}
  // After a batch of received packets and at the end of a progress pass: what the path coalesces
  // across packets and QPs (the RC responder's ACKs) goes out.
  virtual void batch_done() {}
  // Whether any QP of this path has a stream or port of its own to look at in this progress pass.
  virtual bool receiving() const { return false; }
  // One look at the QP's own stream or port (and what it owes there); true when anything moved.
  virtual bool receive(Qp&) { return false; }
  // The QP's earliest timer on this path (0: none).
  virtual uint64_t next_deadline(const Qp& qp) const = 0;
  // The QP has just moved to ERROR (Engine::move_to_error).
  virtual void error(Qp& qp) = 0;
  // The engine's flush of a QP in error has completed its queues.
  virtual void flush(Qp& qp) = 0;
  // The registered memory [lo, lo + len) is going away: what the path holds in flight drops its
  // pointers into it (Engine::forget_pointers_into).
  virtual void forget_pointers_into(Qp& qp, uint64_t lo, uint64_t len) = 0;
  // The QP goes to RESET: what of it the path keeps across a reset, it keeps.
  virtual void reset(Qp& qp) = 0;
  // The QP is destroyed (or its engine is): it leaves the path, which releases its state.
  virtual void release(Qp& qp) = 0;
};

// The engine's services to its paths, under the engine lock (defined in engine.h).
class PathServices {
 protected:
  explicit PathServices(Engine& e) : e_(e) {}
  ~PathServices() = default;
  uint64_t now() const;
  const net::Interface& iface() const;
  // Adds n to a counter of the device and, when qp is set, of that QP.
  void count(Qp* qp, uint64_t core::Counters::*field, uint64_t n = 1);
  void post_cqe(core::CompletionQueue* cq, const core::Cqe& cqe, bool solicited);
  void raise(const AsyncEvent& ev);
  void move_to_error(Qp& qp);
  void doorbell();
  core::MrTable& keys() const;
  // Peers have sent this context one-sided requests (Engine::passive_at_ns_).
  void serves_passive();
  // The engine lock, for a path's own entry points called from the verbs layer.
  std::mutex& engine_lock();
  // The progress thread's epoll set: ADD, MOD and DEL of a path's fd (epoll_ctl's result).
  int watch(int fd, uint32_t events);
  void rewatch(int fd, uint32_t events);
  void unwatch(int fd);
  // The RoCE RC path's roles (rc_path.h), whose steps other paths share: UC runs the responder's
  // check stages, iWARP, UD/UC and the direct path the requester's WQE checks and the completer's
  // in-order completion.
  Requester& requester();
  Completer& completer();
  Responder& responder();
  // RoCEv2 packets out of the context's port (engine.cpp): to the QP's peer, or to any address and
  // port (UD). resolve_destination looks the peer's port up again (it may have moved).
  // synthetic: not sent but given to the packet capture with this note (a direct-path operation's).
  void send_packet(Qp& qp, wire::Packet& pkt, const uint8_t* payload, uint32_t len, const char* synthetic = nullptr);
  // Packet capture (net/capture.h), nullptr when off.
  net::Capture* capture();
  // The ports' side (roce_ports.h): a packet past the port's checks to its QP (Engine::deliver), the
  // end of a batch received, and the protected QPs' keys.
  void deliver(Qp& qp, wire::Packet& pkt, const Arrival& from);
  void batch_done();
  WireProtection& protection();
  void send_packet_to(Qp& qp, wire::Packet& pkt, const uint8_t* payload, uint32_t len, const wire::IpAddress& dest_ip,
                      uint16_t dest_port);
  void resolve_destination(Qp& qp, bool again = false);
  // Whether the QP's peer process exists, as its host's kernel says (net/liveness.h), and how long a
  // requester may resend to one that does past retry_cnt (SOFTRDMA_PEER_PAUSE_MS).
  net::Liveness::Verdict peer_liveness(const Qp& qp, uint64_t max_age_ns, uint64_t asked_from_ns,
                                       uint64_t asked_until_ns);
  uint64_t peer_pause_ns() const;
  // The intra-host direct path's endpoint (direct.h; nullptr when off), and the placing of what its
  // initiators left in a QP's inbox (DirectPath::receive_inbox).
  DirectEndpoint* direct();
  void place_inbox(Qp& qp);
  // Shared receive queues (the XRC target's lookup), and the SQ side of tag matching: an SQ entry at
  // index completed with status; true when it was the engine's own (tag_matching.cpp).
  const std::vector<Srq*>& srqs() const;
  // The context's QPs (by number: nullptr when none), and dropping the async events not yet read that
  // name an SRQ going away.
  const std::vector<Qp*>& qps() const;
  Qp* find_qp(uint32_t qpn) const;
  void forget_events_of(const Srq* srq);
  bool tm_sq_done(Qp& qp, const SqEntry& e, uint64_t index, core::WcStatus status);
  // Receive WQEs and placement into them (placement.h), and the release of a receive ring.
  Placement& placement();
  void release_recv_ring(void* slots, size_t bytes);
  core::Arena& arena();

 private:
  Engine& e_;
};

}  // namespace softrdma::transport
