// Completer (IBTA 9.7.5.1, 9.9.2): acknowledgements, NAKs and responses -> CQEs, in send-queue
// order; the retransmit timer, RNR back-off and the retry counters.
#include <algorithm>
#include <cstring>

#include "transport/engine.h"
#include "transport/work_request.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace softrdma::transport {

namespace {
// What the responder sends back for e besides ACKs: READ response data or an ATOMIC result.
bool is_read(const SqEntry& e) { return work_request(e.wqe.op, QpType::Rc).read; }
bool is_atomic(const SqEntry& e) { return work_request(e.wqe.op, QpType::Rc).atomic; }
bool is_atomic_write(const SqEntry& e) { return e.wqe.op == WrOp::AtomicWrite; }
// READ, ATOMIC, ATOMIC WRITE: completed by their response, never by an ACK (they hold a responder resource).
bool awaits_response(const SqEntry& e) { return work_request(e.wqe.op, QpType::Rc).read_or_atomic(); }
uint32_t last_psn(const SqEntry& e) { return wire::psn_add(e.first_psn, e.npkts - 1); }

// Scatters len bytes at message offset off into the WQE's SGEs (READ responses).
void scatter(SqEntry& e, uint64_t off, const uint8_t* src, uint32_t len) {
  for_each_sge_piece(e.wqe.sge, e.host, e.wqe.num_sge, off, len, [&](uint8_t* p, uint64_t n) {
    if (p) std::memcpy(p, src, n);  // null: deregistered in flight, the WQE ends in LOC_PROT_ERR
    src += n;
    return true;
  });
}

// The started request whose PSN range holds psn (a READ response or ATOMIC acknowledge answers it),
// searched from the oldest WQE up to the send index; null when none.
SqEntry* answered_request(Qp& qp, uint32_t psn) {
  for (uint64_t i = qp.sq.tail.load(std::memory_order_relaxed); i <= qp.req.send_index; ++i) {
    if (i >= qp.sq.head.load(std::memory_order_acquire)) break;
    SqEntry& e = qp.sq.at(i);
    if (!e.started) break;
    int32_t d = wire::psn_diff(psn, e.first_psn);
    if (d >= 0 && d < static_cast<int32_t>(e.npkts)) return &e;
  }
  return nullptr;
}
}  // namespace

void Completer::complete_sq_entry(Qp& qp, SqEntry& e, WcStatus status) {
  if (e.wqe.flags & (kTmRead | kTmFin)) {
    // The engine's own rendezvous WQE (tag_matching.cpp): its CQE, if any, is a tag-matching one.
    const uint64_t index = qp.sq.tail.load(std::memory_order_relaxed);
    const SqEntry done = e;
    qp.sq.tail.store(index + 1, std::memory_order_release);
    tm_sq_done(qp, done, index, status);
    return;
  }
  bool signaled = qp.cfg.sq_sig_all || (e.wqe.flags & kSignaled);
  // Errors always complete, signaled or not (IBTA 10.7.2.2).
  bool report = signaled || status != WcStatus::Success;
  core::Cqe c{};
  if (report) {
    c = wqe_cqe(qp.qpn, e.wqe.wr_id, status, work_request(e.wqe.op, qp.cfg.type).completion);
    if (status == WcStatus::Success)
      c.byte_len = is_atomic(e) ? 8 : static_cast<uint32_t>(e.wqe.length);
    tag_sq_cqe(qp, c, qp.sq.tail.load(std::memory_order_relaxed));  // e is the oldest WQE
  }
  // e is the oldest WQE: its slot is free before its CQE can be polled, so an application that reposts
  // one WQE per polled CQE always finds room (qperf fills the SQ and does). e is not touched after this.
  qp.sq.tail.store(qp.sq.tail.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  if (report) post_cqe(qp.cfg.send_cq, c, false);
}

void Completer::complete_in_order(Qp& qp) {
  uint64_t tail = qp.sq.tail.load(std::memory_order_relaxed);
  // Any started WQE that is fully acknowledged completes, also one at or beyond send_index: after a
  // rewind, the acknowledgement of the first transmission can arrive before the retransmission.
  while (tail < qp.sq.head.load(std::memory_order_acquire)) {
    SqEntry& e = qp.sq.at(tail);
    if (!e.started || !e.acked) break;
    if (awaits_response(e)) qp.req.reads_outstanding -= qp.req.reads_outstanding ? 1 : 0;
    const WcStatus status = e.status;
    complete_sq_entry(qp, e, status);  // advances the tail
    ++tail;
    if (tail > qp.req.send_index) {
      // It completed while rewound: nothing of it is left to resend.
      qp.req.send_index = tail;
      qp.req.send_offset_pkts = 0;
    }
    if (status != WcStatus::Success) {
      move_to_error(qp);
      return;
    }
  }
  // Everything sent is complete: nothing to time out.
  if (tail == qp.req.send_index && qp.req.send_offset_pkts == 0) qp.comp.timer_deadline_ns = 0;
}

void Completer::requester_error(Qp& qp, WcStatus status) {
  // The oldest incomplete WQE takes the error; the rest are flushed.
  uint64_t tail = qp.sq.tail.load(std::memory_order_relaxed);
  if (tail < qp.sq.head.load(std::memory_order_acquire)) {
    SqEntry& e = qp.sq.at(tail);
    if (awaits_response(e)) qp.req.reads_outstanding -= qp.req.reads_outstanding ? 1 : 0;
    complete_sq_entry(qp, e, status);  // advances the tail
  }
  move_to_error(qp);
}

void Completer::nak_error(Qp& qp, uint32_t psn, WcStatus status) {
  // The NAK names the request that failed (IBTA 9.7.5.1.2); the WQEs before it completed at the
  // responder and still complete here as their responses arrive, then this one takes the error and the
  // rest are flushed. Nothing after it is sent; what is before it may be resent (a lost READ
  // response), and runs out of retries against a responder in error.
  for (uint64_t i = qp.sq.tail.load(std::memory_order_relaxed); i < qp.sq.head.load(std::memory_order_acquire); ++i) {
    SqEntry& e = qp.sq.at(i);
    if (!e.started) break;
    int32_t d = wire::psn_diff(psn, e.first_psn);
    if (d < 0 || d >= static_cast<int32_t>(e.npkts)) continue;
    e.status = status;
    e.acked = true;
    qp.req.sq_stop_at = std::min(qp.req.sq_stop_at, i);
    complete_in_order(qp);
    return;
  }
  requester_error(qp, status);
}

// Forward progress restores the retry budgets (timeouts and RNR NAKs both count per request, not per
// connection: rxe resets both counters as an ACK completes a WQE) and ends a wait for a paused peer.
static void forward_progress(Qp& qp) {
  qp.comp.retries_left = qp.retry_cnt;
  qp.comp.rnr_retries_left = qp.rnr_retry;
  qp.comp.paused_since_ns = 0;
}

// All request PSNs before psn are acknowledged (explicitly, or implicitly by a later response).
static void acknowledge_before(Qp& qp, uint32_t psn) {
  if (int32_t n = wire::psn_diff(psn, qp.comp.acked_psn); n > 0) {
    // Each acknowledged PSN lets one more out: the window doubles per round trip back to the maximum.
    qp.req.cwnd = std::min(kPsnWindow, qp.req.cwnd + static_cast<uint32_t>(n));
    qp.comp.acked_psn = psn;
    forward_progress(qp);
  }
  // Every started WQE counts, also those a rewind put back at or beyond send_index.
  for (uint64_t i = qp.sq.tail.load(std::memory_order_relaxed); i < qp.sq.head.load(std::memory_order_acquire); ++i) {
    SqEntry& e = qp.sq.at(i);
    if (!e.started || wire::psn_diff(last_psn(e), psn) >= 0) break;
    if (!awaits_response(e)) e.acked = true;
  }
}

void Completer::rewind_to(Qp& qp, uint32_t psn) {
  for (uint64_t i = qp.sq.tail.load(std::memory_order_relaxed); i <= qp.req.send_index; ++i) {
    if (i >= qp.sq.head.load(std::memory_order_acquire)) break;
    SqEntry& e = qp.sq.at(i);
    if (!e.started) break;
    int32_t d = wire::psn_diff(psn, e.first_psn);
    if (d < 0 || d >= static_cast<int32_t>(e.npkts)) continue;
    if (e.acked) continue;
    qp.req.send_index = i;
    if (is_read(e)) {
      // Ask again for what has not arrived: from the first missing response packet.
      qp.req.send_offset_pkts = e.read_received / qp.mtu;
    } else if (is_atomic(e) || is_atomic_write(e)) {
      qp.req.send_offset_pkts = 0;
    } else {
      qp.req.send_offset_pkts = static_cast<uint64_t>(d);
    }
    count(&qp, &core::Counters::retransmits);
    return;
  }
}

void Completer::reissue_read(Qp& qp, SqEntry& e) {
  // Once per point reached: a stream of out-of-order responses triggers one re-issue, not one each.
  if (e.reissued_at == e.read_received) return;
  e.reissued_at = e.read_received;
  rewind_to(qp, wire::psn_add(e.first_psn, static_cast<uint32_t>(e.read_received / qp.mtu)));
}

net::Liveness::Verdict Completer::ask_peer(const Qp& qp, uint64_t now) {
  const uint64_t timeout_ns = wire::ack_timeout_us(qp.timeout) * 1000;
  // How long a query may go unacknowledged by the peer's kernel: a stopped process's kernel delays its
  // ACKs (up to 200 ms: nobody reads, so nothing carries them), and a host that went away must not be
  // vouched for much longer than retry_cnt takes to run out.
  const uint64_t max_age = std::max<uint64_t>(2 * timeout_ns, 250'000'000);
  // An answer tells that the peer's engine ran while this QP went unanswered when its query was
  // asked after the silence began (about retry_cnt + 1 timeouts ago) and a whole timeout ago, so
  // that the engine had the time to answer this QP's packets too.
  const uint64_t budget = (uint64_t{qp.retry_cnt} + 1) * timeout_ns;
  return peer_liveness(qp, max_age, now > budget ? now - budget : 0, now > timeout_ns ? now - timeout_ns : 0);
}

bool Completer::wait_for_paused_peer(Qp& qp, net::Liveness::Verdict peer, uint64_t now) {
  // retry_cnt is spent. IBTA ends the request here; a NIC's peer would have answered long before, so
  // a peer whose host vouches for its process is a process that does not run (stopped, debugged,
  // starved): wait for it, up to SOFTRDMA_PEER_PAUSE_MS from the first time the budget ran out.
  // A process that runs and still leaves the QP unanswered gets IBTA's answer.
  const uint64_t bound = peer_pause_ns();
  if (peer != net::Liveness::Verdict::Paused || bound == 0) return false;
  if (!qp.comp.paused_since_ns) {
    qp.comp.paused_since_ns = now;
  } else if (now - qp.comp.paused_since_ns > bound) {
    return false;
  }
  count(&qp, &core::Counters::peer_paused);
  qp.comp.retries_left = qp.retry_cnt + 1;  // the caller spends one
  return true;
}

void Completer::check_timers(Qp& qp, uint64_t now) {
  if (!qp.comp.timer_deadline_ns || now < qp.comp.timer_deadline_ns) return;
  // A timer that fires a whole timeout (and at least 10 ms) late means this engine itself was not
  // scheduled: on a busy 2-core host that is no evidence of a lost packet, so it resends without
  // spending a retry. A dead or silent peer still exhausts retry_cnt on time.
  uint64_t timeout_ns = wire::ack_timeout_us(qp.timeout) * 1000;
  bool starved = now - qp.comp.timer_deadline_ns > std::max<uint64_t>(timeout_ns, 10000000);
  qp.comp.timer_deadline_ns = 0;
  uint64_t tail = qp.sq.tail.load(std::memory_order_relaxed);
  if (tail == qp.req.send_index && qp.req.send_offset_pkts == 0) return;
  count(&qp, &core::Counters::timeouts);
  if (starved) ++qp.comp.retries_left;  // undone below: this expiry is not counted
  // Silence is no evidence; the peer's kernel may have some (net/liveness.h). A process that is gone
  // fails the request now; one that exists but does not run (or has not denied the QP) keeps its
  // requests past retry_cnt.
  const net::Liveness::Verdict peer = ask_peer(qp, now);
  if (peer == net::Liveness::Verdict::Dead) {
    count(&qp, &core::Counters::peer_gone);
    requester_error(qp, WcStatus::RetryExcErr);
    return;
  }
  if (qp.comp.retries_left == 0 && !wait_for_paused_peer(qp, peer, now)) {
    count(&qp, &core::Counters::retry_exceeded);
    requester_error(qp, WcStatus::RetryExcErr);
    return;
  }
  --qp.comp.retries_left;
  qp.req.cwnd = kMinCwnd;  // nothing came back for a whole timeout: restart from the floor
  // The peer may have come up (or moved) since RTR: look its port up again.
  resolve_destination(qp, true);
  // Go back to the oldest unacknowledged request.
  for (uint64_t i = tail; i <= qp.req.send_index && i < qp.sq.head.load(); ++i) {
    SqEntry& e = qp.sq.at(i);
    if (!e.started) break;
    if (e.acked) continue;
    uint32_t from = e.first_psn;
    if (!awaits_response(e) && wire::psn_diff(qp.comp.acked_psn, e.first_psn) > 0) from = qp.comp.acked_psn;
    if (is_read(e)) from = wire::psn_add(e.first_psn, static_cast<uint32_t>(e.read_received / qp.mtu));
    rewind_to(qp, from);
    break;
  }
  requester().arm_retransmit_timer(qp, now);
}

// A response to a PSN never sent or already fully acknowledged, or a NAK for a PSN before the oldest
// outstanding request: counted and dropped (false).
bool Completer::completer_check_psn(Qp& qp, const wire::Packet& pkt, const wire::OpcodeInfo& info) {
  uint32_t psn = pkt.bth.psn;
  // A response to a PSN never sent, or already fully acknowledged, is stale: ignore it.
  if (wire::psn_diff(psn, qp.req.next_psn) >= 0) {
    count(&qp, &core::Counters::drop_stale_response);
    return false;
  }
  // A NAK names a PSN of a request still outstanding: from the oldest incomplete WQE on. One for an
  // older PSN (nothing outstanding at all included) is a ghost, a delayed duplicate or a forgery, and
  // must not error the QP or use up its retries.
  if (info.kind == wire::OpKind::Ack && wire::aeth_type(pkt.aeth.syndrome) != wire::AethType::Ack) {
    uint64_t t = qp.sq.tail.load(std::memory_order_relaxed);
    if (t == qp.sq.head.load(std::memory_order_acquire) || !qp.sq.at(t).started ||
        wire::psn_diff(psn, qp.sq.at(t).first_psn) < 0) {
      count(&qp, &core::Counters::drop_stale_response);
      return false;
    }
  }
  return true;
}

// An ACK, RNR NAK or NAK (AETH): true when the completer goes on to complete WQEs and re-arm the timer.
bool Completer::completer_check_ack(Qp& qp, const wire::Packet& pkt, uint64_t now) {
  uint32_t psn = pkt.bth.psn;
  switch (wire::aeth_type(pkt.aeth.syndrome)) {
    case wire::AethType::Ack: {
      acknowledge_before(qp, wire::psn_add(psn, 1));
      // The responder answers in PSN order: an ACK beyond a READ whose data has not all arrived
      // means the rest of its responses were lost.
      uint64_t t = qp.sq.tail.load(std::memory_order_relaxed);
      if (t < qp.sq.head.load(std::memory_order_acquire)) {
        SqEntry& first = qp.sq.at(t);
        if (first.started && !first.acked && is_read(first) && wire::psn_diff(psn, last_psn(first)) > 0)
          reissue_read(qp, first);
      }
      return true;
    }
    case wire::AethType::RnrNak:
      completer_rnr_nak(qp, pkt, now);
      return false;
    case wire::AethType::Nak:
      completer_nak(qp, pkt, now);
      return false;
    case wire::AethType::Reserved:
      count(&qp, &core::Counters::drop_malformed);
      return false;
  }
  return true;  // not reached: every AETH type is handled above
}

// RNR NAK: what is before its PSN completes, then the request is resent after the RNR timer, or the
// WQE fails once rnr_retry is used up.
void Completer::completer_rnr_nak(Qp& qp, const wire::Packet& pkt, uint64_t now) {
  uint32_t psn = pkt.bth.psn;
  count(&qp, &core::Counters::rnr_naks_rcvd);
  acknowledge_before(qp, psn);
  complete_in_order(qp);
  if (qp.rnr_retry != 7) {
    if (qp.comp.rnr_retries_left == 0) {
      count(&qp, &core::Counters::rnr_retry_exceeded);
      requester_error(qp, WcStatus::RnrRetryExcErr);
      return;
    }
    --qp.comp.rnr_retries_left;
  }
  qp.comp.rnr_resume_ns = now + uint64_t{wire::rnr_timer_us(wire::aeth_value(pkt.aeth.syndrome))} * 1000;
  rewind_to(qp, psn);
  requester().arm_retransmit_timer(qp, qp.comp.rnr_resume_ns);
}

// NAK: a PSN sequence error resends from the PSN the responder expects (spending a retry); any other
// code completes the named request in error.
void Completer::completer_nak(Qp& qp, const wire::Packet& pkt, uint64_t now) {
  uint32_t psn = pkt.bth.psn;
  {
    uint8_t c = wire::aeth_value(pkt.aeth.syndrome);
    count(&qp, c == wire::kNakPsnSeqErr      ? &core::Counters::naks_rcvd_seq
               : c == wire::kNakRemoteAccess ? &core::Counters::naks_rcvd_rem_access
               : c == wire::kNakRemoteOp     ? &core::Counters::naks_rcvd_rem_op
                                             : &core::Counters::naks_rcvd_inv_req);
  }
  acknowledge_before(qp, psn);
  complete_in_order(qp);
  uint8_t code = wire::aeth_value(pkt.aeth.syndrome);
  if (code == wire::kNakPsnSeqErr) {
    // The responder lost something: resend from the PSN it expects.
    if (qp.comp.retries_left == 0 && !wait_for_paused_peer(qp, ask_peer(qp, now), now)) {
      count(&qp, &core::Counters::retry_exceeded);
      requester_error(qp, WcStatus::RetryExcErr);
      return;
    }
    --qp.comp.retries_left;
    qp.req.cwnd = std::max(kMinCwnd, qp.req.cwnd / 2);  // a loss: resend less at once
    rewind_to(qp, psn);
    requester().arm_retransmit_timer(qp, now);
    return;
  }
  WcStatus st = code == wire::kNakRemoteAccess ? WcStatus::RemAccessErr
                : code == wire::kNakRemoteOp   ? WcStatus::RemOpErr
                                               : WcStatus::RemInvReqErr;
  nak_error(qp, psn, st);
}

// A READ response or ATOMIC acknowledge: applied to the request it answers. True when the completer
// goes on to complete WQEs and re-arm the timer.
bool Completer::completer_check_response(Qp& qp, const wire::Packet& pkt, const wire::OpcodeInfo& info) {
  uint32_t psn = pkt.bth.psn;
  SqEntry* target = answered_request(qp, psn);
  if (!target || target->acked) {
    count(&qp, &core::Counters::duplicates);
    return false;
  }
  SqEntry& e = *target;
  if (info.kind == wire::OpKind::AtomicAck) {
    if (!is_atomic(e)) {
      count(&qp, &core::Counters::drop_bad_opcode);
      return false;
    }
    acknowledge_before(qp, psn);
    if (e.host[0]) std::memcpy(e.host[0], &pkt.atomic_ack_orig, 8);
    e.acked = true;
    forward_progress(qp);  // new response data is forward progress, even below acked_psn
    return true;
  }
  if (is_atomic_write(e)) {
    // ATOMIC WRITE is answered by a zero-length READ RESPONSE ONLY (IBTA 1.5).
    if (!info.first || !info.last) {
      count(&qp, &core::Counters::drop_bad_opcode);
      return false;
    }
    if (pkt.payload_len != 0) {
      requester_error(qp, WcStatus::BadRespErr);
      return false;
    }
    acknowledge_before(qp, psn);
    e.acked = true;
    forward_progress(qp);
    return true;
  }
  if (!is_read(e)) {
    count(&qp, &core::Counters::drop_bad_opcode);
    return false;
  }
  return completer_read_response(qp, e, pkt, info);
}

// One READ response packet of e: in sequence, its payload is scattered into e's SGEs; out of sequence,
// a duplicate is dropped and a gap re-issues the READ. True when the completer goes on.
bool Completer::completer_read_response(Qp& qp, SqEntry& e, const wire::Packet& pkt, const wire::OpcodeInfo& info) {
  uint32_t psn = pkt.bth.psn;
  uint64_t expect_idx = e.read_received / qp.mtu;
  int32_t idx = wire::psn_diff(psn, e.first_psn);
  if (idx != static_cast<int32_t>(expect_idx)) {
    if (idx < static_cast<int32_t>(expect_idx)) {
      count(&qp, &core::Counters::duplicates);
      return false;
    }
    // Responses come in PSN order: a later one means earlier ones were lost. Ask again now.
    count(&qp, &core::Counters::out_of_sequence);
    reissue_read(qp, e);
    return false;
  }
  uint64_t remaining = e.wqe.length - e.read_received;
  bool last = info.last;
  if (pkt.payload_len > remaining || (!last && pkt.payload_len != qp.mtu) ||
      (last && pkt.payload_len != remaining)) {
    requester_error(qp, WcStatus::BadRespErr);
    return false;
  }
  acknowledge_before(qp, psn);
  scatter(e, e.read_received, pkt.payload, pkt.payload_len);
  e.read_received += pkt.payload_len;
  forward_progress(qp);  // as for ATOMIC: later ACKs may have moved acked_psn past this READ
  if (last) e.acked = true;
  return true;
}

// The completer (IBTA 9.9.2) as its stages: check the PSN, then the ACK/NAK or the response, then
// complete WQEs in order and restart or stop the retransmit timer.
void Completer::completer_receive(Qp& qp, const wire::Packet& pkt) {
  const wire::OpcodeInfo& info = wire::opcode_info(pkt.bth.opcode);
  if (!completer_check_psn(qp, pkt, info)) return;
  const uint64_t now = this->now();
  if (info.kind == wire::OpKind::Ack) {
    if (!completer_check_ack(qp, pkt, now)) return;
  } else {
    if (!completer_check_response(qp, pkt, info)) return;
  }
  complete_in_order(qp);
  if (qp.state.load(std::memory_order_relaxed) == QpState::Err) return;
  uint64_t tail = qp.sq.tail.load(std::memory_order_relaxed);
  if (tail == qp.req.send_index && qp.req.send_offset_pkts == 0)
    qp.comp.timer_deadline_ns = 0;
  else
    requester().arm_retransmit_timer(qp, now);  // progress: restart the timer for what remains
}

}  // namespace softrdma::transport
