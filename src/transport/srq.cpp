// Shared receive queues (IBTA 10.2.9, 11.2.3): the context's SrqTable (create, destroy, resize, post),
// and the responder's XRC stage that picks the SRQ an XRCETH names (IBTA 10.2.10). Taking receive
// WQEs off an SRQ, with its limit event and the Last WQE Reached event, is placement's (placement.cpp).
#include "transport/srq.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/limits.h"
#include "transport/direct.h"
#include "transport/engine.h"
#include "wire/opcode.h"

namespace softrdma::transport {

namespace {
// Ring slots for twice max_wr WQEs: taken_ahead (srq.h) lets the application post max_wr more while
// WQEs claimed out of order still hold the tail.
uint32_t ring_depth(uint32_t max_wr) { return 2 * std::max<uint32_t>(max_wr, 1); }
}  // namespace

bool Srq::claim(uint64_t* index) {
  uint64_t head = rq.head.load(std::memory_order_acquire);
  const uint64_t tail = rq.tail.load(std::memory_order_relaxed);  // only ours moves it
  uint64_t c = claim_word->load(std::memory_order_acquire);
  for (;;) {
    // WQEs posted since head was read: initiators may have claimed them already (they see a head
    // published after ours moved).
    if (c > head) head = rq.head.load(std::memory_order_acquire);
    // Only a peer's write puts the word below the tail or past the head: mended, never believed.
    if (c < tail || c > head) {
      if (claim_word->compare_exchange_weak(c, tail, std::memory_order_acq_rel)) c = tail;
      continue;
    }
    if (c == head) return false;
    if (claim_word->compare_exchange_weak(c, c + 1, std::memory_order_acq_rel)) {
      *index = c;
      return true;
    }
  }
}

bool Srq::take(uint64_t index, RecvWqe* out) {
  uint64_t tail = rq.tail.load(std::memory_order_relaxed);
  const uint64_t head = rq.head.load(std::memory_order_acquire);
  if (index < tail || index >= head || taken[index & rq.mask]) return false;
  const RecvWqe& w = rq.at(index);
  out->wr_id = w.wr_id;
  out->num_sge = w.num_sge;
  out->length = w.length;
  std::memcpy(out->sge, w.sge, sizeof(Sge) * w.num_sge);
  taken[index & rq.mask] = 1;
  uint64_t ahead = taken_ahead.load(std::memory_order_relaxed) + 1;
  // The ring's slots are free again from the tail up to the first WQE still claimed and not taken.
  for (; tail != head && taken[tail & rq.mask]; --ahead) taken[tail++ & rq.mask] = 0;
  taken_ahead.store(ahead, std::memory_order_relaxed);
  rq.tail.store(tail, std::memory_order_release);
  return true;
}

uint64_t Srq::left() const {
  const uint64_t head = rq.head.load(std::memory_order_acquire);
  const uint64_t c = std::max(claim_word->load(std::memory_order_relaxed), rq.tail.load(std::memory_order_relaxed));
  return (c < head ? head - c : 0) + returned.size();
}

SrqTable::~SrqTable() {
  for (Srq* srq : srqs_) {
    if (DirectEndpoint* d = direct()) d->srq_destroyed(*srq);
    release_recv_ring(srq->rq.slots, srq->rq_bytes);
    delete srq;
  }
}

Srq* SrqTable::create(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint32_t xrcd, core::CompletionQueue* cq) {
  using L = core::DeviceLimits;
  if (max_wr > L::kMaxSrqWr || max_sge > L::kMaxSrqSge) {
    errno = EINVAL;
    return nullptr;
  }
  auto* srq = new (std::nothrow) Srq{};
  if (!srq) {
    errno = ENOMEM;
    return nullptr;
  }
  srq->pd = pd;
  srq->xrcd = xrcd;
  srq->cq = cq;
  srq->max_sge = std::max<uint32_t>(max_sge, 1);
  if (!placement().alloc_recv_ring(srq->rq, max_wr, &srq->rq_bytes, ring_depth(max_wr))) {
    delete srq;
    return nullptr;
  }
  srq->taken.assign(srq->rq.mask + 1, 0);
  std::lock_guard lock(engine_lock());
  if (srqs_.size() >= L::kMaxSrq) {
    release_recv_ring(srq->rq.slots, srq->rq_bytes);
    delete srq;
    errno = ENOMEM;
    return nullptr;
  }
  // SRQ numbers are 24-bit (XRCETH) and unique among this context's live SRQs.
  for (;;) {
    uint32_t n = next_srqn_;
    next_srqn_ = (next_srqn_ & 0xFFFFFF) + 1;
    if (std::none_of(srqs_.begin(), srqs_.end(), [n](const Srq* s) { return s->srqn == n; })) {
      srq->srqn = n;
      break;
    }
  }
  // Initiators of this host may take its WQEs (an XRC SRQ's messages come by packets only). Without
  // room for the descriptor, SENDs to its QPs go by packets.
  if (DirectEndpoint* d = direct(); d && !xrcd) d->srq_created(*srq);
  srqs_.push_back(srq);
  return srq;
}

int SrqTable::destroy(Srq* srq) {
  {
    std::lock_guard lock(engine_lock());
    if (srq->qp_refs) return EBUSY;
    srqs_.erase(std::remove(srqs_.begin(), srqs_.end(), srq), srqs_.end());
    // XRC targets that delivered into it forget it; a message in progress into it fails at its next
    // packet (xrc_target_srq), its WQE with the SRQ.
    for (Qp* qp : qps()) {
      if (qp->cfg.xrc != XrcRole::Recv || qp->srq != srq) continue;
      qp->srq = nullptr;
      qp->shared_rq = nullptr;
      qp->cfg.recv_cq = nullptr;
      qp->resp.srq_wqe_held = false;
      qp->resp.recv_active = false;
    }
    if (DirectEndpoint* d = direct()) d->srq_destroyed(*srq);
    release_recv_ring(srq->rq.slots, srq->rq_bytes);
  }
  forget_events_of(srq);
  delete srq;
  return 0;
}

int SrqTable::modify(Srq* srq, int mask, uint32_t max_wr, uint32_t limit) {
  if (mask & ~(kSrqModMaxWr | kSrqModLimit)) return EINVAL;
  // Producer lock first, as post_srq_recv then the engine: the ring may be replaced below.
  std::lock_guard producer(srq->rq.producer_lock);
  std::lock_guard lock(engine_lock());
  WorkQueue<RecvWqe>& q = srq->rq;
  uint32_t new_max = q.max_wr;
  if (mask & kSrqModMaxWr) {
    // A resize never drops posted WQEs (ibv_modify_srq(3): an invalid attribute modifies nothing).
    if (max_wr == 0 || max_wr > core::DeviceLimits::kMaxSrqWr || max_wr < q.count()) return EINVAL;
    new_max = max_wr;
  }
  if ((mask & kSrqModLimit) && limit > new_max) return EINVAL;
  if (new_max != q.max_wr) {
    const uint32_t slots = WorkQueue<RecvWqe>::capacity_for(ring_depth(new_max));
    size_t bytes = sizeof(RecvWqe) * slots;
    auto* ring = static_cast<RecvWqe*>(arena().allocate(bytes));
    if (!ring) return ENOMEM;
    uint32_t new_mask = slots - 1;
    // Head and tail are running counters: each WQE keeps its index, only its slot moves.
    std::vector<uint8_t> taken(new_mask + 1, 0);
    for (uint64_t i = q.tail.load(); i != q.head.load(); ++i) {
      ring[i & new_mask] = q.at(i);
      taken[i & new_mask] = srq->taken[i & q.mask];
    }
    DirectEndpoint* d = srq->direct ? direct() : nullptr;
    if (d) d->srq_ring_changing(*srq);
    release_recv_ring(q.slots, srq->rq_bytes);
    q.slots = ring;
    q.mask = new_mask;
    q.max_wr = new_max;
    srq->rq_bytes = bytes;
    srq->taken = std::move(taken);
    if (d) d->srq_ring_changed(*srq);
  }
  if (mask & kSrqModLimit) srq->limit = limit;
  return 0;
}

void SrqTable::query(Srq* srq, uint32_t& max_wr, uint32_t& max_sge, uint32_t& limit) {
  std::lock_guard lock(engine_lock());
  max_wr = srq->rq.max_wr;
  max_sge = srq->max_sge;
  limit = srq->limit;
}

int SrqTable::post_recv(Srq* srq, const RecvWqe* wqes, int n, int* bad) {
  std::lock_guard lock(srq->rq.producer_lock);
  uint64_t head;
  int rc = push_recv_wqes(srq->rq, wqes, n, srq->max_sge, bad, &head, &srq->taken_ahead);
  if (rc == ENOMEM && srq->direct && recover_claims(*srq)) {
    // Room again: the rest of the list.
    int more = 0;
    rc = push_recv_wqes(srq->rq, wqes + *bad, n - *bad, srq->max_sge, &more, &head, &srq->taken_ahead);
    *bad += more;
  }
  if (srq->direct) DirectEndpoint::publish_srq_head(*srq, head);
  return rc;
}

bool SrqTable::recover_claims(Srq& srq) {
  // The ring is full. Slots are freed only up to the oldest WQE claimed and not yet taken; an initiator
  // that died between its claim and its message (a few instructions), or a hostile one, would hold the
  // tail there for good. Claimed before now and still not taken once every initiator is out of its copy
  // window and the inboxes are placed: stranded, given back.
  std::lock_guard lock(engine_lock());
  const uint64_t head = srq.rq.head.load(std::memory_order_relaxed);
  const uint64_t claimed = std::min(srq.claim_word->load(std::memory_order_acquire), head);
  const uint64_t tail = srq.rq.tail.load(std::memory_order_relaxed);
  if (claimed <= tail) return false;  // full of WQEs nobody took: really full
  direct()->wait_copies();
  for (Qp* qp : qps())
    if (qp->srq == &srq) place_inbox(*qp);
  bool freed = false;
  for (uint64_t i = srq.rq.tail.load(std::memory_order_relaxed); i < claimed; ++i)
    if (!srq.taken[i & srq.rq.mask]) {
      srq.give_back(i);
      count(nullptr, &core::Counters::direct_bad_inbox);
      freed = true;
    }
  return freed && srq.rq.tail.load(std::memory_order_relaxed) != tail;
}

Verdict Responder::xrc_target_srq(Qp& qp, uint32_t srqn, const wire::OpcodeInfo& info) {
  // A message continues into the SRQ it started in: the same number in every packet.
  if (!info.first) {
    if (qp.srq && qp.srq->srqn == srqn) return {};
    return {Verdict::InvalidRequest, WcStatus::RemInvReqErr};
  }
  Srq* found = nullptr;
  for (Srq* s : srqs())
    if (s->srqn == srqn) found = s;
  // An SRQ of another domain, or not an XRC SRQ at all, is as good as none (IBTA 10.2.10.x).
  if (!found || !found->xrcd || found->xrcd != qp.cfg.xrcd) {
    count(&qp, &core::Counters::xrc_bad_srqn);
    return {Verdict::InvalidRequest, WcStatus::RemInvReqErr};
  }
  qp.srq = found;
  qp.shared_rq = &found->rq;
  qp.cfg.recv_cq = found->cq;
  qp.cfg.pd = found->pd;  // memory the request reaches is checked against the SRQ's PD
  return {};
}

}  // namespace softrdma::transport
