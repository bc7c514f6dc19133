// The intra-host direct path (docs/direct-path.md): for an RC QP whose peer QP belongs to another
// context on this host, the requester executes RDMA WRITE, READ and ATOMIC itself, on the peer's memory
// mapped into this process, with the checks the peer's responder would make. A SEND (and the receive
// half of WRITE_WITH_IMM) goes into an inbox in the peer's writable area, but only once the initiator
// has seen a receive WQE there that will take it; the peer's engine places it into that WQE and writes
// the CQE when its application polls, or when woken because the CQ is armed (direct_path.cpp).
//
// Each context (Engine) has one DirectEndpoint, which is what the engine sees of the path; its parts,
// one job each:
// - direct_layout.h: what a target shares -- the DirectShared block in its arena (peers map it read-only:
//   a seqlock over its key table, the state of each of its QPs) and, in a second memfd, the writable
//   area (peers map it read-write): one busy slot per connected initiator process, the inboxes, the CQ
//   arm words.
// - DirectTarget (direct_target.*): the target side -- that block and area, the QP lifecycle hooks that
//   publish each QP's descriptor, inbox and wake-up pipe, and waiting out initiators' copies.
// - DirectGate (direct_gate.*): admission -- who may connect, and which connections and rights a client
//   has (docs/security.md, "Local isolation").
// - DirectServer (direct_server.*): the server thread answering initiators on an abstract Unix socket
//   (direct_protocol.*): the arena's fd read-only, the writable area, the fds of registered memory
//   (direct_share.*; read-only unless an MR on it grants remote write), wake-up pipes.
// - DirectInitiator and DirectPeer (direct_peer.h): the initiator side -- one connection per target
//   context (direct_connect.cpp) and the data path (direct_execute.cpp).
#pragma once
#include <cstdint>
#include <memory>

#include "core/arena.h"
#include "core/mr.h"
#include "core/stats.h"
#include "transport/direct_gate.h"
#include "transport/direct_layout.h"
#include "transport/direct_peer.h"
#include "transport/direct_server.h"
#include "transport/direct_target.h"
#include "transport/qp.h"

namespace softrdma::transport {

class DirectEndpoint {
 public:
  // The context's arena and key table (in it), and its address in the registry (names our socket).
  // Throws std::system_error when the socket or the arena block cannot be had.
  // doorbell_fd: the engine's eventfd; the server thread writes it when an initiator rings (kRing) for a
  // SEND it left for an armed CQ (initiators never get it).
  // counters: the context's device counters (the server thread adds direct_refused there, atomically).
  // peers: who may connect (SOFTRDMA_DIRECT_PEERS).
  DirectEndpoint(core::Arena& arena, const core::MrTable& keys, uint32_t ip_key, uint16_t port, int doorbell_fd,
                 core::Counters* counters, DirectGate::PeerPolicy peers)
      : gate_(counters, peers), target_(arena, keys, gate_), initiator_(gate_),
        server_(gate_, target_, keys, ip_key, port, doorbell_fd) {}
  DirectEndpoint(const DirectEndpoint&) = delete;
  DirectEndpoint& operator=(const DirectEndpoint&) = delete;

  // --- as a target (all under the engine lock) ---
  void qp_created(Qp& qp) { target_.qp_created(qp); }
  void qp_changed(Qp& qp) { target_.qp_changed(qp); }
  // Its remote access flags changed, not its state: published; a right taken away binds every copy
  // that starts after this returns.
  void qp_access_changed(Qp& qp) { target_.qp_access_changed(qp); }
  // Then the engine places what is left in the inbox, and releases it:
  void qp_destroyed(Qp& qp) {
    initiator_.detach(qp);
    target_.qp_destroyed(qp);
  }
  void release_inbox(Qp& qp) { target_.release_inbox(qp); }
  // An SRQ's descriptor for initiators (at create), the ring ibv_modify_srq replaces (around the
  // change), and the descriptor gone (at destroy); the SRQ's producer index after ibv_post_srq_recv.
  void srq_created(Srq& srq) { target_.srq_created(srq); }
  void srq_ring_changing(Srq& srq) { DirectTarget::srq_ring_changing(srq); }
  void srq_ring_changed(Srq& srq) { target_.srq_ring_changed(srq); }
  void srq_destroyed(Srq& srq) { target_.srq_destroyed(srq); }
  static void publish_srq_head(Srq& srq, uint64_t head) { DirectTarget::publish_srq_head(srq, head); }
  // The QP's inbox, once it is connected (RC, on an SRQ too): where initiators put SENDs.
  DirectInbox* inbox(const Qp& qp) const { return qp.direct.inbox; }
  // Mirrors of the receive queue's indices for initiators: after ibv_post_recv, and after the RQ's
  // consumer index or the inbox's consumed count moved.
  void publish_rq_head(const Qp& qp, uint64_t head) { target_.publish_rq_head(qp, head); }
  void publish_tails(const Qp& qp) { target_.publish_tails(qp); }
  // After a key was removed from the table: returns once no initiator can still be copying with it.
  void wait_copies() { target_.wait_copies(); }
  // The area peers may write (inboxes, busy slots, CQ arm words): CQs take their arm word from it.
  std::shared_ptr<core::Arena> writable_area() const { return target_.writable_area(); }

  // --- as an initiator (under the engine lock) ---
  // Connects qp to its peer (dest_qpn at dest_ip owned by the process pid at port), or drops the
  // connection when the peer is not another context on this host that serves the direct path.
  void attach(Qp& qp, int32_t pid, uint16_t port) { initiator_.attach(qp, pid, port); }
  void detach(Qp& qp) { initiator_.detach(qp); }

  using Result = DirectResult;
  // Executes a WQE of qp on its peer: WRITE, READ or ATOMIC on the peer's memory, SEND(_IMM) and
  // WRITE_WITH_IMM also into its inbox; e.host: the WQE's local SGEs, already resolved. Fallback:
  // anything the peer's responder would refuse or answer with RNR, or that this path cannot do; the
  // packet path then gives exactly the wire's answer.
  Result execute(Qp& qp, SqEntry& e, uint64_t now) { return initiator_.execute(qp, e, now); }

 private:
  // Built in this order and torn down in reverse: the server thread stops first, then the connections
  // to our peers close, then what we published goes.
  DirectGate gate_;
  DirectTarget target_;
  DirectInitiator initiator_;
  DirectServer server_;
};

}  // namespace softrdma::transport
