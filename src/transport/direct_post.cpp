// The direct path's post (direct.h): a WQE for an intra-host peer, posted when nothing earlier on its
// send queue is incomplete, is executed from the caller's WQE at once and completed in the same call,
// without being copied into the send queue and walked by the requester and the completer. What this
// skips is what such a WQE does not need there: no PSN, no timer, no packet, and order and fences hold
// trivially. It still takes its send-queue slot (the slot stays the application's until its CQE, or a
// later one, is polled) and is checked exactly as the requester and the target's responder would.
#include "transport/engine.h"
#include "transport/work_request.h"

namespace softrdma::transport {

int Engine::post_direct(Qp& qp, const SendWqe* wqes, int n) {
  if (!direct_ || !direct_active_.load(std::memory_order_relaxed)) return 0;
  lock_for_caller();  // waits: the engine has a direct peer
  int done = 0;
  if (qp.direct.peer && qp.cfg.type == QpType::Rc) {
    if (!qp.sq_filled_under_engine_lock) {
      // Once, with both locks (this order, as queue_send takes them): a producer that filled the SQ
      // without the engine lock has left, and every later one sees the flag and takes the engine lock.
      std::lock_guard producer(qp.sq.producer_lock);
      qp.sq_filled_under_engine_lock = true;
    }
    uint64_t head = qp.sq.head.load(std::memory_order_relaxed);
    uint8_t* host[core::DeviceLimits::kMaxSge];
    // The send queue is idle: the requester would reach this WQE next, with nothing before it in flight.
    while (done < n && qp.state.load(std::memory_order_relaxed) == QpState::Rts &&
           qp.sq.tail.load(std::memory_order_relaxed) == head && qp.req.send_index == head &&
           qp.req.sq_stop_at > head && !qp.comp.rnr_resume_ns) {
      const SendWqe& w = wqes[done];
      const WorkRequest wr = work_request(w.op, qp.cfg.type);
      // Anything the generic post or the requester would refuse or report goes their way, with the rest.
      if (!wr.allowed || wr.local || w.num_sge > qp.cfg.max_send_sge || w.length > core::DeviceLimits::kMaxMsgSize ||
          ((w.flags & kInline) && w.length > qp.cfg.max_inline) || (wr.atomic && w.length != 8) ||
          (wr.read_or_atomic() && qp.req.reads_outstanding >= qp.max_rd_atomic) ||
          ((head - qp.sq_credit->polled()) & SqCredit::kMask) >= qp.sq.max_wr)
        break;
      bool local_ok = true;
      if (!(w.flags & kInline))
        for (uint32_t i = 0; i < w.num_sge && local_ok; ++i)
          local_ok = mrs_.check_local(w.sge[i].lkey, qp.cfg.pd, w.sge[i].addr, w.sge[i].length, wr.read_or_atomic(),
                                      &host[i]) == core::AccessResult::Ok;
      // A fallback is tried again by the requester, which counts it and sends the WQE by packets.
      if (!local_ok || direct_->execute(qp, w, host, 0) != DirectEndpoint::Result::Done) break;
      count(&qp, &core::Counters::direct_ops);
      count(&qp, &core::Counters::direct_bytes, w.length);
      // Completed in order, as complete_sq_entry() would: the slot is counted, then the CQE written.
      const bool report = qp.cfg.sq_sig_all || (w.flags & kSignaled);
      core::Cqe c{};
      if (report) {
        c.wr_id = w.wr_id;
        c.status = WcStatus::Success;
        c.opcode = wr.completion;
        c.qp_num = qp.qpn;
        c.byte_len = wr.atomic ? 8 : static_cast<uint32_t>(w.length);
        tag_sq_cqe(qp, c, head);
      }
      ++head;
      qp.sq.head.store(head, std::memory_order_release);
      qp.sq.tail.store(head, std::memory_order_release);
      qp.req.send_index = head;
      ++done;
      if (report) post_cqe(qp.cfg.send_cq, c, false);  // an overrun moves the QP to error: the loop stops
    }
  }
  lock_.unlock();
  return done;
}

}  // namespace softrdma::transport
