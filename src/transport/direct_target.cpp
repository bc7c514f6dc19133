// The target side of the direct path (direct_target.h): the shared block and writable area, the QP
// lifecycle hooks that publish each QP's descriptor, inbox and wake-up pipe, and waiting out the copies
// of initiators after a revocation.
#include "transport/direct_target.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <system_error>

#include "core/cq.h"
#include "transport/direct_protocol.h"

namespace softrdma::transport {

namespace {
bool pid_alive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH); }
}  // namespace

DirectTarget::DirectTarget(core::Arena& arena, const core::MrTable& keys, DirectGate& gate)
    : arena_(arena), rw_(std::make_shared<core::Arena>(kWritableBytes, /*peers_write=*/true)), gate_(gate) {
  // Peers get the arena read-only: sealed against writing (a descriptor's O_RDONLY alone is not enough:
  // a memfd can be reopened O_RDWR through /proc/self/fd), and neither file can change size.
  if (!arena_.sealed() || !rw_->sealed())
    throw std::system_error(ENOTSUP, std::generic_category(), "direct arena seals");
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", arena_.fd());
  ro_fd_ = open(path, O_RDONLY | O_CLOEXEC);
  if (ro_fd_ < 0) throw std::system_error(errno, std::generic_category(), "direct arena read-only");
  slots_ = static_cast<DirectPeerSlot*>(rw_->allocate(sizeof(DirectPeerSlot) * DirectShared::kPeers));
  shared_ = static_cast<DirectShared*>(arena_.allocate(sizeof(DirectShared)));
  if (!shared_ || !slots_) {
    close(ro_fd_);
    throw std::system_error(ENOMEM, std::generic_category(), "direct arena block");
  }
  shared_->peers_off = static_cast<uint64_t>(reinterpret_cast<uint8_t*>(slots_) - rw_->base());
  shared_->magic = DirectShared::kMagic;
  shared_->layout = direct::kLayout;
  shared_->key_table_off = static_cast<uint64_t>(static_cast<const uint8_t*>(keys.slots()) - arena_.base());
  shared_->key_seq_off = static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(keys.seq()) - arena_.base());
  for (uint32_t i = DirectShared::kQps; i-- > 0;) free_descs_.push_back(i);
  for (int& fd : wake_fds_) fd = -1;
  for (auto& sp : slot_pid_) sp.store(0, std::memory_order_relaxed);
}

DirectTarget::~DirectTarget() {
  for (int fd : wake_fds_)
    if (fd >= 0) close(fd);
  close(ro_fd_);
  arena_.release(shared_, sizeof(DirectShared));
  rw_->release(slots_, sizeof(DirectPeerSlot) * DirectShared::kPeers);
}

void DirectTarget::qp_created(Qp& qp) {
  // XRC QPs have no descriptor: initiators never take them for a direct target (packets only).
  if (free_descs_.empty() || qp.cfg.xrc != XrcRole::None) return;
  qp.direct.desc = free_descs_.back();
  free_descs_.pop_back();
  DirectQpDesc& d = shared_->qps[qp.direct.desc];
  d.state.store(static_cast<uint32_t>(QpState::Reset), std::memory_order_relaxed);
  d.access.store(0, std::memory_order_relaxed);
  d.pd.store(qp.cfg.pd, std::memory_order_relaxed);
  d.inbox_off.store(0, std::memory_order_relaxed);
  d.rq_ring_off.store(static_cast<uint64_t>(reinterpret_cast<uint8_t*>(qp.rq.slots) - arena_.base()),
                      std::memory_order_relaxed);
  d.rq_mask.store(qp.rq.mask, std::memory_order_relaxed);
  // 0 for a receive CQ without a completion channel: nobody can be waiting on it, so initiators skip
  // the fence and the look at its arm state.
  const core::CompletionQueue* rcq = qp.cfg.recv_cq;
  // (The arm word is in the writable area, where initiators may claim it.)
  const bool arm_shared = rcq && rcq->notifies() && rcq->arm_arena() == rw_.get();
  d.recv_cq_arm_off.store(
      arm_shared ? static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(rcq->arm_word()) - rw_->base()) : 0,
      std::memory_order_relaxed);
  d.srq_off.store(qp.srq && qp.srq->direct ? static_cast<uint64_t>(reinterpret_cast<uint8_t*>(qp.srq->direct) - arena_.base()) : 0,
                  std::memory_order_relaxed);
  d.rq_head.store(0, std::memory_order_relaxed);
  d.tails.store(0, std::memory_order_relaxed);
  d.generation.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(wake_mu_);
    wake_fds_[qp.direct.desc] = rcq && rcq->notifies() && rcq->wake_fd() >= 0 ? fcntl(rcq->wake_fd(), F_DUPFD_CLOEXEC, 0) : -1;
  }
  d.qpn.store(qp.qpn, std::memory_order_release);
  publish_gate(qp);
}

void DirectTarget::maybe_give_inbox(Qp& qp, DirectQpDesc& d) {
  // An inbox for a connected RC QP whose peer is another context here (attach found it: the peer is
  // symmetric); on an SRQ only when initiators can claim its WQEs (not a tag-matching one: its
  // messages are matched by the responder).
  // (Or will be: its server said EAGAIN, and the peer may already be sending to us.)
  // A receive CQ with a channel whose arm word initiators cannot reach could never be woken: packets.
  const core::CompletionQueue* rcq = qp.cfg.recv_cq;
  const bool wakeable = !rcq || !rcq->notifies() || rcq->arm_arena() == rw_.get();
  const bool srq_ok = !qp.srq || (qp.srq->direct && !qp.srq->tm);
  if (qp.direct.inbox || !(qp.direct.peer || qp.direct.retry_ns) || qp.cfg.type != QpType::Rc || !srq_ok ||
      !wakeable)
    return;
  if (void* mem = rw_->allocate(sizeof(DirectInbox))) {  // zeroed, in the writable area
    qp.direct.inbox = static_cast<DirectInbox*>(mem);
    d.inbox_off.store(static_cast<uint64_t>(static_cast<uint8_t*>(mem) - rw_->base()), std::memory_order_release);
  }
}

void DirectTarget::reset_inbox(Qp& qp, DirectQpDesc& d) {
  if (DirectInbox* in = qp.direct.inbox; in && qp.srq) {
    // The messages dropped here had claimed SRQ WQEs, which the SRQ's other QPs may still use.
    for (uint32_t t = qp.direct.inbox_tail;; ++t) {
      const DirectInboxEntry& en = in->entries[t % DirectInbox::kEntries];
      if (en.stamp.load(std::memory_order_acquire) != t + 1) break;
      qp.srq->give_back(qp.srq->index_of(en.srq_index));
    }
  }
  if (DirectInbox* in = qp.direct.inbox) {
    in->head = 0;
    in->data_head = 0;
    in->data_tail.store(0, std::memory_order_relaxed);
    for (DirectInboxEntry& en : in->entries) en.stamp.store(0, std::memory_order_relaxed);
  }
  d.generation.fetch_add(1, std::memory_order_release);
  qp.direct.inbox_tail = 0;
  publish_rq_head(qp, 0);
  publish_tails(qp);
}

void DirectTarget::qp_changed(Qp& qp) {
  if (qp.direct.desc == ~0u) return;
  DirectQpDesc& d = shared_->qps[qp.direct.desc];
  const QpState st = qp.state.load(std::memory_order_relaxed);
  if (st == QpState::Rtr) maybe_give_inbox(qp, d);
  d.access.store(qp.access_flags, std::memory_order_relaxed);
  d.state.store(static_cast<uint32_t>(st), std::memory_order_seq_cst);
  publish_gate(qp);
  if (st == QpState::Err || st == QpState::Reset) {
    // From here on no initiator takes the QP as live: nothing more enters its inbox, and what did is
    // placed (error: before the flush) or dropped (reset).
    wait_copies();
    if (st == QpState::Reset) reset_inbox(qp, d);
  }
}

void DirectTarget::qp_access_changed(Qp& qp) {
  if (qp.direct.desc == ~0u) return;
  DirectQpDesc& d = shared_->qps[qp.direct.desc];
  const uint32_t before = d.access.load(std::memory_order_relaxed);
  d.access.store(qp.access_flags, std::memory_order_seq_cst);
  publish_gate(qp);
  // An initiator that read the old flags is inside its copy window: let it finish.
  if (before & ~qp.access_flags) wait_copies();
}

void DirectTarget::release_inbox(Qp& qp) {
  if (!qp.direct.inbox) return;
  rw_->release(qp.direct.inbox, sizeof(DirectInbox));
  qp.direct.inbox = nullptr;
}

void DirectTarget::qp_destroyed(Qp& qp) {
  if (qp.direct.desc == ~0u) return;
  DirectQpDesc& d = shared_->qps[qp.direct.desc];
  d.state.store(static_cast<uint32_t>(QpState::Err), std::memory_order_relaxed);
  d.qpn.store(0, std::memory_order_seq_cst);
  gate_.clear(qp.direct.desc);
  // An initiator that saw this QP live may be finishing a copy: let it, before the QP's memory goes.
  wait_copies();
  {
    std::lock_guard lock(wake_mu_);
    if (wake_fds_[qp.direct.desc] >= 0) close(wake_fds_[qp.direct.desc]);
    wake_fds_[qp.direct.desc] = -1;
  }
  free_descs_.push_back(qp.direct.desc);
  qp.direct.desc = ~0u;
}

void DirectTarget::wait_copies() {
  // Every initiator either saw the new sequence number before its copy (and re-checks), or announced
  // its copy before we looked (and we wait for it): a seq_cst store and load on each side.
  // Only slots our server gave to a connected client count (slot_pid_; a peer can write any slot's pid and
  // busy words), and only while that client is connected.
  for (uint32_t i = 0; i < DirectShared::kPeers; ++i) {
    DirectPeerSlot& s = slots_[i];
    const int32_t pid = slot_pid_[i].load(std::memory_order_seq_cst);
    if (pid == 0) continue;
    for (uint32_t spins = 0; s.busy.load(std::memory_order_seq_cst); ++spins) {
      if (slot_pid_[i].load(std::memory_order_relaxed) != pid) break;  // its client went
      if ((spins & 1023) == 1023 && !pid_alive(pid)) break;  // it died mid-copy: nothing left to wait for
      sched_yield();
    }
  }
}

void DirectTarget::srq_created(Srq& srq) {
  auto* desc = static_cast<DirectSrqDesc*>(arena_.allocate(sizeof(DirectSrqDesc)));
  auto* word = static_cast<std::atomic<uint64_t>*>(rw_->allocate(sizeof(std::atomic<uint64_t>)));
  if (!desc || !word) {
    if (desc) arena_.release(desc, sizeof(DirectSrqDesc));
    if (word) rw_->release(word, sizeof(std::atomic<uint64_t>));
    return;
  }
  word->store(srq.own_claim.load(std::memory_order_relaxed), std::memory_order_relaxed);
  desc->claim_off.store(static_cast<uint64_t>(reinterpret_cast<uint8_t*>(word) - rw_->base()), std::memory_order_relaxed);
  desc->pd.store(srq.pd, std::memory_order_relaxed);
  desc->head.store(srq.rq.head.load(std::memory_order_relaxed), std::memory_order_relaxed);
  desc->ring_seq.store(0, std::memory_order_relaxed);
  srq.direct = desc;
  srq.claim_word = word;
  srq_ring_changed(srq);
}

void DirectTarget::srq_ring_changing(Srq& srq) {
  // A seqlock: an initiator that read a WQE through the old ring while it was replaced (and perhaps
  // reused) sees the number move, and does not trust what it read.
  srq.direct->ring_seq.fetch_add(1, std::memory_order_acq_rel);
  std::atomic_thread_fence(std::memory_order_release);
}

void DirectTarget::srq_ring_changed(Srq& srq) {
  DirectSrqDesc& d = *srq.direct;
  d.ring_off.store(static_cast<uint64_t>(reinterpret_cast<uint8_t*>(srq.rq.slots) - arena_.base()), std::memory_order_relaxed);
  d.ring_mask.store(srq.rq.mask, std::memory_order_relaxed);
  // Even again (srq_created starts at 0 and leaves it there: 0 then 2 would mean the same).
  if (d.ring_seq.load(std::memory_order_relaxed) & 1) d.ring_seq.fetch_add(1, std::memory_order_release);
}

void DirectTarget::srq_destroyed(Srq& srq) {
  // No QP is attached any more, and each one's destruction waited out the copies of its initiators.
  if (!srq.direct) return;
  srq.own_claim.store(srq.claim_word->load(std::memory_order_relaxed), std::memory_order_relaxed);
  rw_->release(srq.claim_word, sizeof(std::atomic<uint64_t>));
  arena_.release(srq.direct, sizeof(DirectSrqDesc));
  srq.claim_word = &srq.own_claim;
  srq.direct = nullptr;
}

void DirectTarget::publish_srq_head(Srq& srq, uint64_t head) {
  srq.direct->head.store(head, std::memory_order_release);
}

DirectTarget::Hello DirectTarget::hello() const {
  return {ro_fd_, rw_->fd(), arena_.capacity(),
          static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(shared_) - arena_.base()), rw_->capacity()};
}

int32_t DirectTarget::claim_slot(int32_t pid) {
  for (uint32_t i = 0; i < DirectShared::kPeers; ++i) {
    if (slot_pid_[i].load(std::memory_order_relaxed) != 0) continue;
    slots_[i].busy.store(0, std::memory_order_relaxed);
    slots_[i].pid.store(pid, std::memory_order_release);
    slot_pid_[i].store(pid, std::memory_order_seq_cst);
    return static_cast<int32_t>(i);
  }
  return -1;
}

void DirectTarget::free_slot(int32_t slot) {
  slots_[slot].busy.store(0, std::memory_order_release);
  slots_[slot].pid.store(0, std::memory_order_release);
  slot_pid_[slot].store(0, std::memory_order_seq_cst);
}

int DirectTarget::open_wake_fd(uint32_t desc) {
  std::lock_guard lock(wake_mu_);
  // A new open file description of the pipe's write end, the peer's own: O_NONBLOCK is a flag of the
  // description, and a peer that cleared it on a dup of ours would make our own writes block.
  if (wake_fds_[desc] < 0) return -1;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", wake_fds_[desc]);
  return open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
}

}  // namespace softrdma::transport
