// Shared receive queues (IBTA 10.2.9, 11.2.3): the context's SrqTable (create, destroy, resize, post),
// and the responder's XRC stage that picks the SRQ an XRCETH names (IBTA 10.2.10). Taking receive
// WQEs off an SRQ, with its limit event and the Last WQE Reached event, is placement's (placement.cpp).
#include "transport/srq.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/limits.h"
#include "transport/engine.h"
#include "wire/opcode.h"

namespace softrdma::transport {

SrqTable::~SrqTable() {
  for (Srq* srq : srqs_) {
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
  if (!placement().alloc_recv_ring(srq->rq, max_wr, &srq->rq_bytes)) {
    delete srq;
    return nullptr;
  }
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
    size_t bytes = sizeof(RecvWqe) * WorkQueue<RecvWqe>::capacity_for(new_max);
    auto* ring = static_cast<RecvWqe*>(arena().allocate(bytes));
    if (!ring) return ENOMEM;
    uint32_t new_mask = WorkQueue<RecvWqe>::capacity_for(new_max) - 1;
    // Head and tail are running counters: each WQE keeps its index, only its slot moves.
    for (uint64_t i = q.tail.load(); i != q.head.load(); ++i) ring[i & new_mask] = q.at(i);
    release_recv_ring(q.slots, srq->rq_bytes);
    q.slots = ring;
    q.mask = new_mask;
    q.max_wr = new_max;
    srq->rq_bytes = bytes;
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
  return push_recv_wqes(srq->rq, wqes, n, srq->max_sge, bad, &head);
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
