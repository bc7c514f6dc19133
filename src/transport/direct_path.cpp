// The intra-host direct path's object (direct_path.h): joining at RTR, the requester's step that
// executes WQEs on the peer's memory (through DirectEndpoint, direct.h) before handing the rest to the
// RC path, and the receive side. An initiator of this host left SENDs and the immediates of
// WRITE_WITH_IMMs in a QP's inbox, each after seeing the receive WQE it will take (on an SRQ, after
// claiming it); they are placed here, in order, as the responder would have placed the same packets.
#include "transport/direct_path.h"

#include <algorithm>
#include <cstring>

#include "net/registry.h"
#include "transport/engine.h"
#include "transport/work_request.h"
#include "wire/psn.h"

namespace softrdma::transport {

bool DirectPath::receive_inbox(Qp& qp) {
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
    // On an SRQ, the WQE the initiator claimed (and checked) for this message; else the RQ's next.
    RecvWqe* w = qp.srq ? placement().take_claimed_srq_wqe(qp, slot.srq_index) : placement().next_recv_wqe(qp);
    ++qp.direct.inbox_tail;
    did = true;
    if ((!send && op != DirectInbox::kWriteImm) || (send && length > DirectInbox::kMaxMessage) || !w) {
      // Not what a softrdma initiator writes (it reserves a WQE for each message).
      count(&qp, &core::Counters::drop_malformed);
      count(&qp, &core::Counters::direct_bad_inbox);
      if (DirectEndpoint* d = direct()) d->publish_tails(qp);
      if (qp.state.load(std::memory_order_relaxed) != QpState::Err) move_to_error(qp);
      return true;
    }
    placement().take_recv_wqe(qp);
    core::Cqe c = connected_receive_cqe(qp, w->wr_id, send ? core::WcOpcode::Recv : core::WcOpcode::RecvRdmaWithImm,
                                        length, op != DirectInbox::kSend, imm_be);
    if (send) c.status = place_send(qp, slot, *w, length);
    placement().retire_recv_wqe(qp);  // publishes the RQ's and the inbox's consumer indices together
    qp.resp.msn = wire::psn_add(qp.resp.msn, 1);
    post_cqe(qp.cfg.recv_cq, c, solicited);
    if (c.status != WcStatus::Success) {
      count(&qp, &core::Counters::direct_fallbacks);
      if (qp.state.load(std::memory_order_relaxed) != QpState::Err) move_to_error(qp);
      return true;
    }
  }
}

WcStatus DirectPath::place_send(Qp& qp, const DirectInboxEntry& slot, const RecvWqe& w, uint32_t length) {
  DirectInbox* in = qp.direct.inbox;
  // A short message is in its entry; a longer one in the inbox's data ring, from its tail on.
  if (length <= DirectInboxEntry::kInlineBytes) return placement().place_message(w, qp.cfg.pd, {{slot.inline_data, length}});
  const uint64_t pos = in->data_tail.load(std::memory_order_relaxed);
  const uint64_t at = pos % DirectInbox::kDataBytes;
  const uint64_t first = std::min<uint64_t>(length, DirectInbox::kDataBytes - at);
  // The initiator checked this WQE against the key table; it can only have changed since by an
  // ibv_dereg_mr racing with the message, which fails it as the responder would.
  const WcStatus st = placement().place_message(w, qp.cfg.pd, {{in->data + at, first}, {in->data, length - first}});
  in->data_tail.store(pos + length, std::memory_order_release);  // consumed, placed or not
  return st;
}

bool DirectPath::receive_inboxes(const std::vector<Qp*>& qps) {
  bool did = false;
  for (Qp* qp : qps)
    if (qp->direct.inbox && receive_inbox(*qp)) did = true;
  return did;
}

void DirectPath::join(Qp& qp) {
  // XRC QPs go by packets: the direct path knows no XRCETH.
  DirectEndpoint* d = direct();
  if (!d || qp.cfg.type != QpType::Rc || qp.cfg.xrc != XrcRole::None || qp.on_path()) return;
  auto ep = net::Registry::instance().lookup(qp.dest_qpn);
  if (ep && ep->ip_key == qp.dest_ip.key())
    d->attach(qp, ep->pid, ep->port);
  else
    d->detach(qp);
  if (qp.direct.peer || qp.direct.retry_ns) qp.path.store(this, std::memory_order_relaxed);
}

void DirectPath::reset(Qp& qp) {
  direct()->detach(qp);
  qp.path.store(nullptr, std::memory_order_relaxed);
  rc_.reset(qp);
}

void DirectPath::release(Qp& qp) {
  // DirectEndpoint::qp_destroyed drops the connection to the peer.
  qp.path.store(nullptr, std::memory_order_relaxed);
  rc_.release(qp);
}

bool DirectPath::transmit(Qp& qp, uint64_t now) {
  bool did = false;
  // During an RNR back-off the RC requester holds the SQ.
  if ((qp.direct.peer || qp.direct.retry_ns) && !qp.comp.rnr_resume_ns) {
    did = transmit_direct(qp, now);
    // The whole SQ done here and no READ responses owed by packets: nothing for the RC path.
    if (qp.req.send_index == qp.sq.head.load(std::memory_order_acquire) && qp.resp.read_jobs.empty()) return did;
  }
  const uint64_t from = qp.req.send_index;
  if (!rc_.transmit(qp, now)) return did;
  did = true;
  // By packets the peer's responder takes receive WQEs the direct path does not know of: its view of
  // them is read again before the next direct SEND.
  const uint64_t head = qp.sq.head.load(std::memory_order_acquire);
  for (uint64_t i = from; i <= qp.req.send_index && i < head; ++i) {
    const SqEntry& e = qp.sq.at(i);
    if (e.started && e.npkts && work_request(e.wqe.op, qp.cfg.type).consumes_receive) {
      qp.direct.recv.valid = false;
      break;
    }
  }
  return did;
}

bool DirectPath::transmit_direct(Qp& qp, uint64_t now) {
  bool did = false;
  const uint64_t head = std::min(qp.sq.head.load(std::memory_order_acquire), qp.req.sq_stop_at);
  // Only with nothing in flight before the WQE; a rendezvous FIN goes by packets, behind the ACK that
  // completed the sender's request.
  while (qp.req.send_index < head && qp.sq.tail.load(std::memory_order_relaxed) == qp.req.send_index) {
    SqEntry& e = qp.sq.at(qp.req.send_index);
    if (e.started || (e.wqe.flags & kTmFin)) break;
    const WorkRequest wr = work_request(e.wqe.op, qp.cfg.type);
    if (wr.local) {
      did = true;
      if (!requester().execute_local_wqe(qp, e)) break;
      continue;
    }
    if (!requester().prepare_wqe(qp, e)) {
      // Reported in order by the completer; nothing after it is sent.
      e.started = true;
      completer().fail_in_order(qp, e);
      return true;
    }
    if (wr.read_or_atomic() && qp.req.reads_outstanding >= qp.max_rd_atomic) break;
    if (direct()->execute(qp, e, now) != DirectEndpoint::Result::Done) {
      if (qp.direct.peer) count(&qp, &core::Counters::direct_fallbacks);  // not while still asking
      break;  // by packets, from the RC requester
    }
    if (capture()) [[unlikely]] requester().capture_direct(qp, e);
    e.started = true;
    e.acked = true;
    e.npkts = 0;
    e.first_psn = qp.req.next_psn;
    count(&qp, &core::Counters::direct_ops);
    count(&qp, &core::Counters::direct_bytes, e.wqe.length);
    ++qp.req.send_index;
    qp.req.send_offset_pkts = 0;
    completer().complete_in_order(qp);
    did = true;
  }
  return did;
}

}  // namespace softrdma::transport
