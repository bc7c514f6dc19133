// The receive side of the intra-host direct path (direct.h): an initiator of this host left SENDs and
// the immediates of WRITE_WITH_IMMs in a QP's inbox, each after seeing the receive WQE it will take.
// The engine places them here, in order, as its responder would have placed the same packets.
#include <algorithm>
#include <cstring>

#include "transport/engine.h"
#include "wire/psn.h"

namespace softrdma::transport {

bool Engine::direct_receive(Qp& qp) {
  DirectInbox* in = qp.direct.inbox;
  if (!in) return false;
  bool did = false;
  for (;;) {
    DirectInboxEntry& slot = in->entries[qp.direct.inbox_tail % DirectInbox::kEntries];
    if (slot.stamp.load(std::memory_order_acquire) != qp.direct.inbox_tail + 1) return did;
    // The initiator is another process: what it wrote is checked before it is used.
    const uint32_t op = slot.op, length = slot.length, imm_be = slot.imm_be;
    const bool solicited = slot.solicited != 0;
    const bool send = op == DirectInbox::kSend || op == DirectInbox::kSendImm;
    RecvWqe* w = next_recv_wqe(qp);
    ++qp.direct.inbox_tail;
    did = true;
    if ((!send && op != DirectInbox::kWriteImm) || (send && length > DirectInbox::kMaxMessage) || !w) {
      // Not what a softrdma initiator writes (it reserves a WQE for each message).
      count(&qp, &core::Counters::drop_malformed);
      count(&qp, &core::Counters::direct_bad_inbox);
      if (direct_) direct_->publish_tails(qp);
      if (qp.state.load(std::memory_order_relaxed) != QpState::Err) move_to_error(qp);
      return true;
    }
    take_recv_wqe(qp);
    core::Cqe c = connected_receive_cqe(qp, w->wr_id, send ? core::WcOpcode::Recv : core::WcOpcode::RecvRdmaWithImm,
                                        length, op != DirectInbox::kSend, imm_be);
    if (send) {
      // The initiator checked this WQE against the key table; it can only have changed since by an
      // ibv_dereg_mr racing with the message, which fails it as the responder would.
      uint8_t* host[core::DeviceLimits::kMaxSge] = {};
      if (length > w->length) c.status = WcStatus::LocLenErr;
      for (uint32_t i = 0; i < w->num_sge && c.status == WcStatus::Success; ++i)
        if (mrs_.check_local(w->sge[i].lkey, qp.cfg.pd, w->sge[i].addr, w->sge[i].length, true, &host[i]) !=
            core::AccessResult::Ok)
          c.status = WcStatus::LocProtErr;
      const bool in_entry = length <= DirectInboxEntry::kInlineBytes;
      uint64_t pos = in->data_tail.load(std::memory_order_relaxed);
      const uint8_t* src = slot.inline_data;
      if (c.status == WcStatus::Success) {
        for_each_sge_piece(w->sge, host, w->num_sge, 0, length, [&](uint8_t* p, uint64_t n) {
          if (in_entry) {
            std::memcpy(p, src, n);
            src += n;
            return true;
          }
          while (n) {
            const uint64_t at = pos % DirectInbox::kDataBytes;
            const uint64_t k = std::min<uint64_t>(n, DirectInbox::kDataBytes - at);
            std::memcpy(p, in->data + at, k);
            p += k;
            pos += k;
            n -= k;
          }
          return true;
        });
      } else if (!in_entry) {
        pos += length;
      }
      if (!in_entry) in->data_tail.store(pos, std::memory_order_release);
    }
    retire_recv_wqe(qp);  // publishes the RQ's and the inbox's consumer indices together
    qp.resp.msn = wire::psn_add(qp.resp.msn, 1);
    post_cqe(qp.cfg.recv_cq, c, solicited);
    if (c.status != WcStatus::Success) {
      count(&qp, &core::Counters::direct_fallbacks);
      if (qp.state.load(std::memory_order_relaxed) != QpState::Err) move_to_error(qp);
      return true;
    }
  }
}

bool Engine::direct_receive_all() {
  bool did = false;
  for (Qp* qp : qp_list_)
    if (qp->direct.inbox && direct_receive(*qp)) did = true;
  return did;
}

}  // namespace softrdma::transport
