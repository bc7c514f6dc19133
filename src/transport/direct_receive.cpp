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
    RecvWqe* w = placement_->next_recv_wqe(qp);
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
    placement_->take_recv_wqe(qp);
    core::Cqe c = connected_receive_cqe(qp, w->wr_id, send ? core::WcOpcode::Recv : core::WcOpcode::RecvRdmaWithImm,
                                        length, op != DirectInbox::kSend, imm_be);
    if (send) c.status = direct_place_send(qp, slot, *w, length);
    placement_->retire_recv_wqe(qp);  // publishes the RQ's and the inbox's consumer indices together
    qp.resp.msn = wire::psn_add(qp.resp.msn, 1);
    post_cqe(qp.cfg.recv_cq, c, solicited);
    if (c.status != WcStatus::Success) {
      count(&qp, &core::Counters::direct_fallbacks);
      if (qp.state.load(std::memory_order_relaxed) != QpState::Err) move_to_error(qp);
      return true;
    }
  }
}

WcStatus Engine::direct_place_send(Qp& qp, const DirectInboxEntry& slot, const RecvWqe& w, uint32_t length) {
  DirectInbox* in = qp.direct.inbox;
  // A short message is in its entry; a longer one in the inbox's data ring, from its tail on.
  if (length <= DirectInboxEntry::kInlineBytes) return placement_->place_message(w, qp.cfg.pd, {{slot.inline_data, length}});
  const uint64_t pos = in->data_tail.load(std::memory_order_relaxed);
  const uint64_t at = pos % DirectInbox::kDataBytes;
  const uint64_t first = std::min<uint64_t>(length, DirectInbox::kDataBytes - at);
  // The initiator checked this WQE against the key table; it can only have changed since by an
  // ibv_dereg_mr racing with the message, which fails it as the responder would.
  const WcStatus st = placement_->place_message(w, qp.cfg.pd, {{in->data + at, first}, {in->data, length - first}});
  in->data_tail.store(pos + length, std::memory_order_release);  // consumed, placed or not
  return st;
}

bool Engine::direct_receive_all() {
  bool did = false;
  for (Qp* qp : qp_list_)
    if (qp->direct.inbox && direct_receive(*qp)) did = true;
  return did;
}

}  // namespace softrdma::transport
