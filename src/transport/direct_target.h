// The target side of the direct path (docs/direct-path.md, "Exchange" and "Revocation"): what a context
// publishes for its initiators, and the QP lifecycle hooks that keep it true (all under the engine lock).
// It owns the DirectShared block in the arena and the writable area (direct_layout.h), gives each QP a
// descriptor there, an RC QP connected to a local peer an inbox, and keeps the wake-up pipes of the
// receive CQs' channels and the table of which client holds which busy slot, for the server thread
// (direct_server.h). wait_copies() returns once no initiator can still be copying with what was revoked.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/arena.h"
#include "core/mr.h"
#include "transport/direct_gate.h"
#include "transport/direct_layout.h"
#include "transport/qp.h"
#include "transport/srq.h"

namespace softrdma::transport {

class DirectTarget {
 public:
  static constexpr size_t kWritableBytes = size_t{1} << 30;  // sparse, like the arena

  // The context's arena and key table (in it); gate: where the server's view of each QP is published.
  // Throws std::system_error when the arena block cannot be had or the seals are missing.
  DirectTarget(core::Arena& arena, const core::MrTable& keys, DirectGate& gate);
  ~DirectTarget();
  DirectTarget(const DirectTarget&) = delete;
  DirectTarget& operator=(const DirectTarget&) = delete;

  // --- QP lifecycle (under the engine lock) ---
  void qp_created(Qp& qp);
  void qp_changed(Qp& qp);
  void qp_access_changed(Qp& qp);
  void qp_destroyed(Qp& qp);
  void release_inbox(Qp& qp);
  void publish_rq_head(const Qp& qp, uint64_t head) {
    if (qp.direct.desc != ~0u) shared_->qps[qp.direct.desc].rq_head.store(head, std::memory_order_release);
  }
  void publish_tails(const Qp& qp) {
    if (qp.direct.desc == ~0u) return;
    uint64_t t = static_cast<uint32_t>(qp.rq.tail.load(std::memory_order_relaxed)) |
                 static_cast<uint64_t>(qp.direct.inbox_tail) << 32;
    shared_->qps[qp.direct.desc].tails.store(t, std::memory_order_release);
  }
  void wait_copies();
  std::shared_ptr<core::Arena> writable_area() const { return rw_; }

  // --- SRQs (under the engine lock; publish_srq_head under the SRQ's producer lock) ---
  // Publishes a DirectSrqDesc and moves the SRQ's claims to a word in the writable area; without room
  // for them, the SRQ stays the engine's alone (its QPs get no inbox).
  void srq_created(Srq& srq);
  static void srq_ring_changing(Srq& srq);
  void srq_ring_changed(Srq& srq);
  void srq_destroyed(Srq& srq);
  static void publish_srq_head(Srq& srq, uint64_t head);

  // --- for the server thread ---
  // What an admitted client is sent (kHello): both files, their sizes, where DirectShared is.
  struct Hello {
    int arena_fd, rw_fd;  // the arena's read-only fd; the writable area's
    uint64_t arena_bytes, shared_off, rw_bytes;
  };
  Hello hello() const;
  // A busy slot for the client process pid (-1: none free), and back. Who holds which slot is ours to
  // know (slot_pid_), not what peers wrote in the writable area.
  int32_t claim_slot(int32_t pid);
  void free_slot(int32_t slot);
  // A new open file description of the write end of the wake-up pipe of descriptor desc's receive CQ
  // channel, the client's own (-1: none).
  int open_wake_fd(uint32_t desc);

 private:
  void publish_gate(const Qp& qp) {
    if (qp.direct.desc != ~0u) gate_.publish(qp.direct.desc, qp);
  }
  // An inbox for the QP entering RTR, when initiators can use one (qp_changed).
  void maybe_give_inbox(Qp& qp, DirectQpDesc& d);
  void reset_inbox(Qp& qp, DirectQpDesc& d);

  core::Arena& arena_;
  std::shared_ptr<core::Arena> rw_;
  DirectGate& gate_;
  int ro_fd_ = -1;  // the arena's memfd reopened read-only: what peers get
  DirectPeerSlot* slots_ = nullptr;  // in rw_: one per connected initiator process
  // The pid of the client each slot was given to (0: free): set and cleared by the server thread, read
  // by wait_copies. Never the slot's own pid word, which peers can write.
  std::atomic<int32_t> slot_pid_[DirectShared::kPeers];
  DirectShared* shared_ = nullptr;
  std::vector<uint32_t> free_descs_;
  // Per QP descriptor: a dup of its receive CQ channel's wake-up pipe (-1: none), handed to a connected
  // initiator (kWake). The mutex keeps the server thread from passing one that is being closed.
  std::mutex wake_mu_;
  int wake_fds_[DirectShared::kQps];
};

}  // namespace softrdma::transport
