// Placement of message bytes (placement.h): gathering a send WQE's data, and the receive-placement
// step every responder runs: take the receive WQE (RQ or SRQ), resolve its SGEs against the key
// table, copy at the message's offset, and complete the WQE with its CQE.
#include "transport/placement.h"

#include <cstring>

#include "core/limits.h"
#include "transport/engine.h"

namespace softrdma::transport {

void gather_send(const SqEntry& e, uint64_t off, uint8_t* dst, uint32_t len) {
  if (e.wqe.flags & kInline) {
    std::memcpy(dst, e.wqe.inline_data + off, len);
    return;
  }
  for_each_sge_piece(e.wqe.sge, e.host, e.wqe.num_sge, off, len, [&](uint8_t* p, uint64_t n) {
    std::memcpy(dst, p, n);
    dst += n;
    return true;
  });
}

bool scatter_recv(const RecvWqe& w, uint8_t* const* host, uint64_t off, const uint8_t* src, uint64_t len) {
  return for_each_sge_piece(w.sge, host, w.num_sge, off, len, [&](uint8_t* p, uint64_t n) {
    if (!p) return false;
    std::memcpy(p, src, n);
    src += n;
    return true;
  });
}

WcStatus Placement::resolve_recv_sges(const RecvWqe& w, uint32_t pd, uint64_t need, uint8_t** host) const {
  if (need > w.length) return WcStatus::LocLenErr;
  for (uint32_t i = 0; i < w.num_sge; ++i)
    if (keys().check_local(w.sge[i].lkey, pd, w.sge[i].addr, w.sge[i].length, true, &host[i]) !=
        core::AccessResult::Ok)
      return WcStatus::LocProtErr;
  return WcStatus::Success;
}

WcStatus Placement::place_message(const RecvWqe& w, uint32_t pd, std::initializer_list<Bytes> pieces) const {
  uint64_t need = 0;
  for (const Bytes& b : pieces) need += b.len;
  uint8_t* host[core::DeviceLimits::kMaxSge] = {};
  if (WcStatus st = resolve_recv_sges(w, pd, need, host); st != WcStatus::Success) return st;
  uint64_t off = 0;
  for (const Bytes& b : pieces) {
    scatter_recv(w, host, off, b.data, b.len);
    off += b.len;
  }
  return WcStatus::Success;
}

WcStatus Placement::resolve_active_recv(Qp& qp) {
  // need 0: a message in pieces is checked against the WQE's length as each piece is placed.
  return resolve_recv_sges(active_recv_wqe(qp), receive_pd(qp), 0, qp.resp.recv_host);
}

WcStatus Placement::open_recv_message(Qp& qp) {
  // A message given up (UC, SRQ) left its WQE active: it serves this one.
  if (!qp.resp.recv_active) {
    take_recv_wqe(qp);
    qp.resp.recv_active = true;
  }
  qp.resp.recv_offset = 0;
  return resolve_active_recv(qp);
}

WcStatus Placement::place_recv(Qp& qp, const uint8_t* src, uint64_t len) {
  const RecvWqe& w = active_recv_wqe(qp);
  if (qp.resp.recv_offset + len > w.length) return WcStatus::LocLenErr;
  // The receive buffer's MR was deregistered while this message arrived.
  if (!scatter_recv(w, qp.resp.recv_host, qp.resp.recv_offset, src, len)) return WcStatus::LocProtErr;
  qp.resp.recv_offset += len;
  return WcStatus::Success;
}

void Placement::finish_recv(Qp& qp, const core::Cqe& c, core::CompletionQueue* cq, bool solicited) {
  retire_recv_wqe(qp);
  qp.resp.recv_active = false;
  post_cqe(cq, c, solicited);
}

void Placement::fail_recv(Qp& qp, WcStatus status, core::CompletionQueue* cq) {
  finish_recv(qp, wqe_cqe(qp.qpn, active_recv_wqe(qp).wr_id, status, core::WcOpcode::Recv), cq, false);
}

bool Placement::alloc_recv_ring(WorkQueue<RecvWqe>& q, uint32_t max_wr, size_t* bytes, uint32_t ring_depth) {
  const uint32_t depth = std::max<uint32_t>(max_wr, 1);
  *bytes = sizeof(RecvWqe) * WorkQueue<RecvWqe>::capacity_for(std::max(depth, ring_depth));
  auto* ring = static_cast<RecvWqe*>(arena().allocate(*bytes));
  if (!ring) {
    errno = ENOMEM;
    return false;
  }
  q.init(ring, depth, ring_depth);
  return true;
}

RecvWqe* Placement::next_recv_wqe(Qp& qp) {
  if (qp.resp.srq_wqe_held) return &qp.resp.srq_wqe;  // taken by a message that was given up (UC): reused
  if (qp.srq) {
    // Other takers (initiators of this host) may claim the SRQ's WQEs at any time: the one this
    // message would take is claimed now, and held by the QP until a message completes it. WQEs given
    // back by initiators (Srq::give_back) go first.
    Srq& srq = *qp.srq;
    if (!srq.returned.empty()) {
      qp.resp.srq_wqe = srq.returned.back();
      srq.returned.pop_back();
      qp.resp.srq_wqe_held = true;
      check_srq_limit(srq);
      return &qp.resp.srq_wqe;
    }
    uint64_t index;
    while (srq.claim(&index))
      if (take_srq_wqe(qp, index)) return &qp.resp.srq_wqe;
    return nullptr;
  }
  WorkQueue<RecvWqe>& q = qp.rq;
  uint64_t t = q.tail.load(std::memory_order_relaxed);
  return t == q.head.load(std::memory_order_acquire) ? nullptr : &q.at(t);
}

RecvWqe& Placement::take_recv_wqe(Qp& qp) {
  if (!qp.srq) return qp.rq.at(qp.rq.tail.load(std::memory_order_relaxed));
  // Every caller asked next_recv_wqe() first, which claimed it.
  return qp.resp.srq_wqe;
}

RecvWqe* Placement::take_srq_wqe(Qp& qp, uint64_t index) {
  Srq& srq = *qp.srq;
  if (qp.resp.srq_wqe_held || !srq.take(index, &qp.resp.srq_wqe)) return nullptr;
  qp.resp.srq_wqe_held = true;
  check_srq_limit(srq);
  return &qp.resp.srq_wqe;
}

void Placement::check_srq_limit(Srq& srq) {
  // The low watermark (IBTA 11.2.3.2 / ibv_modify_srq(3)): once, then disarmed until set again.
  if (srq.limit && srq.left() < srq.limit) {
    srq.limit = 0;
    raise(AsyncEvent{AsyncEventType::SrqLimitReached, nullptr, nullptr, &srq});
  }
}

RecvWqe* Placement::take_claimed_srq_wqe(Qp& qp, uint32_t index_low) {
  return take_srq_wqe(qp, qp.srq->index_of(index_low));
}

void Placement::give_back_srq_claim(Qp& qp) {
  if (!qp.srq || !qp.resp.srq_wqe_held || qp.resp.recv_active) return;
  qp.srq->returned.push_back(qp.resp.srq_wqe);
  qp.resp.srq_wqe_held = false;
}

RecvWqe& Placement::active_recv_wqe(Qp& qp) {
  return qp.srq ? qp.resp.srq_wqe : qp.rq.at(qp.rq.tail.load(std::memory_order_relaxed));
}

void Placement::retire_recv_wqe(Qp& qp) {
  if (qp.srq)
    qp.resp.srq_wqe_held = false;
  else
    qp.rq.tail.store(qp.rq.tail.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  // (With the inbox's consumed count: what its initiator waits for.)
  if (DirectEndpoint* d = direct()) d->publish_tails(qp);
}

void Placement::report_last_wqe(Qp& qp) {
  // The QP is in error and its WQE in progress is flushed: it takes nothing more from the SRQ, whose
  // remaining WQEs stay there for the other QPs (IBTA 11.6.3.1, 10.3.1).
  if (!qp.srq || qp.resp.last_wqe_reached) return;
  qp.resp.last_wqe_reached = true;
  raise(AsyncEvent{AsyncEventType::QpLastWqeReached, &qp, nullptr});
}

}  // namespace softrdma::transport
