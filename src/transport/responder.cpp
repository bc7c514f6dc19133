// Responder (IBTA 9.7.3-9.7.5.2, 9.9.3): executes in-order requests on registered memory and the RQ,
// acknowledges them (coalesced), NAKs sequence errors, RNR and invalid or unauthorised requests, and
// answers duplicates from the replay cache: READ responses regenerated, ATOMIC results replayed.
// A request passes check stages (PSN, opcode sequence, length, receive WQE, R_Key) and is executed;
// the stages for SEND and WRITE are shared with the UC responder (datagram.cpp), and each returns a
// verdict that RC answers with a NAK and UC with a silent drop.
#include <algorithm>
#include <cstring>

#include "core/place.h"
#include "transport/engine.h"
#include "transport/rc_path.h"
#include "transport/srq.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace softrdma::transport {

namespace {
constexpr int kReadBurst = 64;  // READ response packets per QP per progress pass
}  // namespace

void Responder::responder_send_ack(Qp& qp, uint8_t syndrome, uint32_t psn) {
  wire::Packet pkt{};
  pkt.bth.opcode = wire::kRcAck;
  pkt.bth.psn = psn;
  pkt.aeth = {syndrome, qp.resp.msn};
  send_packet(qp, pkt, nullptr, 0);
}

// Responses go out in PSN order (IBTA 9.5): an ACK must not overtake the responses of an earlier
// READ or ATOMIC, or the requester would take those for lost. Regenerated responses (answers to
// duplicates) hold nothing back: the requester already saw later traffic.
static bool ack_must_wait(const Qp& qp, uint32_t ack_psn) {
  for (const ReadResponseJob& j : qp.resp.read_jobs)
    if (!j.regenerated && wire::psn_diff(ack_psn, j.first_psn) > 0) return true;
  return false;
}

static bool original_job_pending(const Qp& qp) {
  for (const ReadResponseJob& j : qp.resp.read_jobs)
    if (!j.regenerated) return true;
  return false;
}

void Responder::flush_owed_acks() {
  size_t kept = 0;
  for (Qp* qp : ack_owed_) {
    if (qp->resp.ack_owed && ack_must_wait(*qp, qp->resp.ack_psn) &&
        qp->state.load(std::memory_order_relaxed) != QpState::Err) {
      ack_owed_[kept++] = qp;
      continue;
    }
    if (qp->resp.ack_owed && qp->state.load(std::memory_order_relaxed) != QpState::Err)
      responder_send_ack(*qp, wire::aeth_ack(), qp->resp.ack_psn);
    qp->resp.ack_owed = false;
  }
  ack_owed_.resize(kept);
}

void Responder::forget(Qp& qp) {
  std::erase(ack_owed_, &qp);
  qp.resp.ack_owed = false;
}

void Responder::send_atomic_ack(Qp& qp, uint32_t psn, uint64_t orig) {
  wire::Packet ack{};
  ack.bth.opcode = wire::kRcAtomicAck;
  ack.bth.psn = psn;
  ack.aeth = {wire::aeth_ack(), qp.resp.msn};
  ack.atomic_ack_orig = orig;
  send_packet(qp, ack, nullptr, 0);
}

void Responder::responder_fatal(Qp& qp, uint8_t nak_code, uint32_t psn, WcStatus recv_status) {
  if (original_job_pending(qp)) {
    // Responses go out in PSN order: the NAK waits for the READ/ATOMIC responses before it, or the
    // requester would blame the wrong WQE (IBTA 9.5, 9.7.5.2).
    ReadResponseJob nak{psn, psn, psn, nullptr, 0, ReadResponseJob::Kind::Nak};
    nak.nak_code = nak_code;
    nak.recv_status = recv_status;
    qp.resp.read_jobs.push_back(nak);
    qp.resp.pending_fatal_nak = true;
    return;
  }
  count(&qp, nak_code == wire::kNakRemoteAccess ? &core::Counters::naks_sent_rem_access
             : nak_code == wire::kNakRemoteOp   ? &core::Counters::naks_sent_rem_op
                                                : &core::Counters::naks_sent_inv_req);
  responder_send_ack(qp, wire::aeth_nak(nak_code), psn);
  if (qp.resp.recv_active) placement().fail_recv(qp, recv_status, receive_cq(qp));
  // Errors that consumed no receive WQE are reported through the async event stream (IBTA 11.6.3).
  AsyncEventType ev = nak_code == wire::kNakRemoteAccess ? AsyncEventType::QpAccessErr
                      : nak_code == wire::kNakInvalidRequest ? AsyncEventType::QpReqErr
                                                              : AsyncEventType::QpFatal;
  raise(AsyncEvent{ev, &qp, nullptr});
  move_to_error(qp);
}

bool Responder::responder_run_reads(Qp& qp) {
  if (qp.resp.read_jobs.empty()) return false;
  int budget = kReadBurst;
  while (budget > 0 && !qp.resp.read_jobs.empty()) {
    ReadResponseJob& j = qp.resp.read_jobs.front();
    if (j.kind == ReadResponseJob::Kind::Nak) {
      // Everything before it has gone out: now the NAK, and the QP goes to error.
      const ReadResponseJob nak = j;
      qp.resp.read_jobs.clear();
      qp.resp.pending_fatal_nak = false;
      responder_fatal(qp, nak.nak_code, nak.psn, nak.recv_status);
      return true;
    }
    if (j.kind == ReadResponseJob::Kind::AtomicAck) {
      send_atomic_ack(qp, j.psn, j.atomic_orig);
      qp.resp.read_jobs.erase(qp.resp.read_jobs.begin());
      --budget;
      continue;
    }
    uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(qp.mtu, j.remaining));
    bool first = j.psn == j.first_psn;
    bool last = j.psn == j.last_psn;
    wire::Packet pkt{};
    pkt.bth.opcode = first ? (last ? wire::kRcReadResponseOnly : wire::kRcReadResponseFirst)
                           : (last ? wire::kRcReadResponseLast : wire::kRcReadResponseMiddle);
    pkt.bth.psn = j.psn;
    pkt.aeth = {wire::aeth_ack(), qp.resp.msn};
    send_packet(qp, pkt, j.src, len);
    j.src += len;
    j.remaining -= len;
    j.psn = wire::psn_add(j.psn, 1);
    --budget;
    if (last) qp.resp.read_jobs.erase(qp.resp.read_jobs.begin());
  }
  return true;
}

// ---- Check stages shared by RC and UC ----

bool Responder::opcode_in_sequence(const Qp& qp, const wire::OpcodeInfo& info) {
  bool continues = !info.first;
  return continues == qp.resp.in_message &&
         (!continues || wire::opcode_info(qp.resp.last_opcode).kind == info.kind);
}

Verdict Responder::check_length(const Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt) {
  if (info.has_payload && ((!info.last && pkt.payload_len != qp.mtu) || pkt.payload_len > qp.mtu))
    return {Verdict::InvalidRequest, WcStatus::RemInvReqErr};
  return {};
}

Verdict Responder::check_receive(Qp& qp, const wire::OpcodeInfo& info) {
  if (info.kind == wire::OpKind::Write) {
    // WRITE with immediate consumes a receive WQE: without one, refused before memory is touched.
    if ((info.headers & wire::kHdrImm) && !qp.resp.recv_active && !placement().next_recv_wqe(qp)) return {Verdict::Rnr};
    return {};
  }
  if (info.kind != wire::OpKind::Send || !info.first) return {};
  // A WQE still held from a message given up (UC, SRQ) serves this one.
  if (!qp.resp.recv_active && !placement().next_recv_wqe(qp)) return {Verdict::Rnr};
  if (placement().open_recv_message(qp) != WcStatus::Success) return {Verdict::RemoteOp, WcStatus::LocProtErr};
  return {};
}

Verdict Responder::check_rkey(Qp& qp, uint32_t rkey, uint64_t va, uint64_t len, uint32_t access,
                                   uint8_t** host) {
  if (!(qp.access_flags & access)) return {Verdict::RemoteAccess, WcStatus::RemAccessErr};
  // A zero-length RDMA WRITE or READ touches no memory, so its R_Key and VA are not checked, as on
  // hardware and rxe (UCX's rc_verbs flushes with a zero-length WRITE carrying R_Key 0).
  if (len == 0) {
    *host = nullptr;
    return {};
  }
  if (keys().check_remote(rkey, qp.cfg.pd, va, len, access, host, qp.qpn) != core::AccessResult::Ok)
    return {Verdict::RemoteAccess, WcStatus::RemAccessErr};
  return {};
}

namespace {
// Whether a replayed READ or ATOMIC WRITE may queue its response again. Bounded: a requester that
// keeps re-issuing cannot grow the queue without limit.
bool replay_room(const Qp& qp) { return qp.resp.read_jobs.size() < 4 * qp.max_dest_rd_atomic + 16; }

// Remembers an executed READ, ATOMIC or ATOMIC WRITE, so that a duplicate of it is answered again
// instead of executed again (responder_duplicate).
void remember_replay(Qp& qp, const ReplayEntry& e) {
  qp.resp.replay[qp.resp.replay_next++ % qp.resp.replay.size()] = e;
}

// The request at the expected PSN is executed: the next one follows its npkts PSNs.
void advance_epsn(Qp& qp, const wire::Packet& pkt, uint32_t npkts, bool in_message) {
  qp.resp.epsn = wire::psn_add(qp.resp.epsn, npkts);
  qp.resp.last_opcode = pkt.bth.opcode;
  qp.resp.in_message = in_message;
}
}  // namespace

Verdict Responder::execute_send(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt) {
  using TmKind = Qp::ResponderState::TmKind;
  const TmKind tm_kind = qp.resp.tm_kind;
  if (tm_kind == TmKind::Discard) {
    // A rendezvous request on a tag-matching SRQ: its header was acted on, its READ does the rest.
    if (info.last) {
      qp.resp.tm_kind = TmKind::None;
      qp.resp.msn = wire::psn_add(qp.resp.msn, 1);
    }
    return {};
  }
  // A message that matched a tagged buffer places what follows its TMH.
  const uint32_t skip = info.first && tm_kind == TmKind::Expected ? tm::kTmhBytes : 0;
  // Too long for the WQE: an invalid request; its memory deregistered meanwhile: a local error.
  if (WcStatus st = placement().place_recv(qp, pkt.payload + skip, pkt.payload_len - skip); st != WcStatus::Success)
    return {st == WcStatus::LocLenErr ? Verdict::InvalidRequest : Verdict::RemoteOp, st};
  if (!info.last) return {};
  core::Cqe c = connected_receive_cqe(qp, placement().active_recv_wqe(qp).wr_id, core::WcOpcode::Recv, qp.resp.recv_offset,
                                      (info.headers & wire::kHdrImm) != 0, pkt.imm_data_be);
  if (tm_kind != TmKind::None) {
    // Tag-matching SRQ: the completion says what the TMH made of the message.
    if (tm_kind == TmKind::NoTag) c.opcode = core::WcOpcode::TmNoTag;
    if (tm_kind == TmKind::Expected || tm_kind == TmKind::Unexpected) c.opcode = core::WcOpcode::TmRecv;
    if (tm_kind == TmKind::Expected) {
      c.wc_flags |= core::kWcTmMatch | core::kWcTmDataValid;
      c.tm_tag = qp.resp.tm_tag;
      c.tm_priv = qp.resp.tm_priv;
    }
    qp.resp.tm_kind = TmKind::None;
  }
  if (info.headers & wire::kHdrIeth) {
    // Send with Invalidate: only a type 2 window bound through this QP can be invalidated;
    // any other key is a Class J error (the receive WQE completes in error, QP to error).
    if (!keys().invalidate(pkt.ieth_rkey, qp.cfg.pd, qp.qpn, true))
      return {Verdict::InvalidRequest, WcStatus::RemInvReqErr};
    c.wc_flags = core::kWcWithInv;
    c.imm_or_inv = pkt.ieth_rkey;
  }
  qp.resp.msn = wire::psn_add(qp.resp.msn, 1);
  placement().finish_recv(qp, c, receive_cq(qp), pkt.bth.solicited);
  return {};
}

Verdict Responder::execute_write(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt,
                                      bool complete_receive) {
  if (info.first) {
    uint8_t* host = nullptr;
    if (Verdict v = check_rkey(qp, pkt.reth.rkey, pkt.reth.va, pkt.reth.dma_len, core::kRemoteWrite, &host); !v.ok())
      return v;
    qp.resp.write_dst = host;
    qp.resp.write_remaining = pkt.reth.dma_len;
    qp.resp.write_total = pkt.reth.dma_len;
  }
  // The target MR was deregistered between the packets of this WRITE.
  if (!qp.resp.write_dst && qp.resp.write_remaining) return {Verdict::RemoteAccess, WcStatus::RemAccessErr};
  // A length that contradicts the RETH.
  if (pkt.payload_len > qp.resp.write_remaining || (info.last && pkt.payload_len != qp.resp.write_remaining))
    return {Verdict::InvalidRequest, WcStatus::RemInvReqErr};
  // Each byte once, the last ones last, as a NIC's DMA: a program polling the buffer's last byte owns
  // the buffer once it changes (core/place.h).
  if (pkt.payload_len) core::place_in_order(qp.resp.write_dst, pkt.payload, pkt.payload_len);
  qp.resp.write_dst += pkt.payload_len;
  qp.resp.write_remaining -= pkt.payload_len;
  if (!info.last) return {};
  qp.resp.msn = wire::psn_add(qp.resp.msn, 1);
  if ((info.headers & wire::kHdrImm) && complete_receive) {
    core::Cqe c = connected_receive_cqe(qp, placement().take_recv_wqe(qp).wr_id, core::WcOpcode::RecvRdmaWithImm,
                                        qp.resp.write_total, true, pkt.imm_data_be);
    placement().finish_recv(qp, c, receive_cq(qp), pkt.bth.solicited);
  }
  return {};
}

// ---- RC ----

// RC answers a refused request with a NAK: RNR (the requester backs off and resends), or a fatal one
// after which the QP is in error.
void Responder::rc_refuse(Qp& qp, const Verdict& v, uint32_t psn) {
  switch (v.kind) {
    case Verdict::Rnr:
      count(&qp, &core::Counters::rnr_naks_sent);
      responder_send_ack(qp, wire::aeth_rnr_nak(qp.min_rnr_timer), psn);
      // The requester resends from psn after its back-off: the packets already behind this one get
      // no NAK-sequence as well, which would spend one of its retries per RNR (seen with 16 QPs on
      // one SRQ: RETRY_EXC_ERR after 7 RNR rounds).
      qp.resp.nak_sent = true;
      return;
    case Verdict::InvalidRequest:
      responder_fatal(qp, wire::kNakInvalidRequest, psn, v.status);
      return;
    case Verdict::RemoteAccess:
      responder_fatal(qp, wire::kNakRemoteAccess, psn, v.status);
      return;
    case Verdict::RemoteOp:
      responder_fatal(qp, wire::kNakRemoteOp, psn, v.status);
      return;
    case Verdict::Ok:
      return;
  }
}

// The responder's stages, in order, as rxe has them: the PSN (a gap is NAKed, a duplicate answered
// again), the checks of a new request (opcode sequence, XRC SRQ, length, receive WQE), its execution
// (with its R_Key check), and its acknowledgement. A refusal at any stage is answered by rc_refuse.
void Responder::responder_receive(Qp& qp, const wire::Packet& pkt) {
  if (qp.resp.pending_fatal_nak) {
    // Failed already: the NAK waits behind owed responses, and the QP is as good as in error.
    count(&qp, &core::Counters::drop_bad_state);
    return;
  }
  const wire::OpcodeInfo& info = wire::opcode_info(pkt.bth.opcode);
  if (info.kind != wire::OpKind::Send) serves_passive();
  const int32_t d = wire::psn_diff(pkt.bth.psn, qp.resp.epsn);
  if (d > 0) {
    nak_psn_gap(qp);
    return;
  }
  if (d < 0) {
    responder_duplicate(qp, info, pkt);
    return;
  }
  qp.resp.nak_sent = false;
  Verdict v = check_request(qp, info, pkt);
  if (v.ok()) {
    switch (info.kind) {
      case wire::OpKind::Send:
        v = execute_send(qp, info, pkt);
        break;
      case wire::OpKind::Write:
        v = execute_write(qp, info, pkt, true);
        break;
      case wire::OpKind::ReadRequest:
        v = execute_read(qp, pkt);
        break;
      case wire::OpKind::CompareSwap:
      case wire::OpKind::FetchAdd:
        v = execute_atomic(qp, info, pkt);
        break;
      case wire::OpKind::AtomicWrite:
        v = execute_atomic_write(qp, pkt);
        break;
      default:
        count(&qp, &core::Counters::drop_bad_opcode);
        return;
    }
  }
  if (!v.ok()) {
    rc_refuse(qp, v, pkt.bth.psn);
    return;
  }
  // READ and ATOMIC requests are answered by their responses (queued when they executed).
  if (info.kind == wire::OpKind::Send || info.kind == wire::OpKind::Write) responder_acknowledge(qp, info, pkt);
}

// A PSN beyond the expected one: earlier packets were lost. One NAK per gap (IBTA 9.7.5.1.2).
void Responder::nak_psn_gap(Qp& qp) {
  count(&qp, &core::Counters::out_of_sequence);
  if (qp.resp.nak_sent) return;
  qp.resp.nak_sent = true;
  count(&qp, &core::Counters::naks_sent_seq);
  responder_send_ack(qp, wire::aeth_nak(wire::kNakPsnSeqErr), qp.resp.epsn);
}

void Responder::owe_ack(Qp& qp, uint32_t psn) {
  if (!qp.resp.ack_owed) ack_owed_.push_back(&qp);
  qp.resp.ack_owed = true;
  qp.resp.ack_psn = psn;
}

// A PSN before the expected one: a request executed already whose response was lost. READ and the
// ATOMICs are answered again from the replay cache, never executed again.
void Responder::responder_duplicate(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt) {
  count(&qp, &core::Counters::duplicates);
  switch (info.kind) {
    case wire::OpKind::ReadRequest:
    case wire::OpKind::CompareSwap:
    case wire::OpKind::FetchAdd:
    case wire::OpKind::AtomicWrite:
      replay_response(qp, info, pkt);
      return;
    default:
      // A duplicate SEND/WRITE: its ACK was lost. Acknowledge everything received so far again.
      owe_ack(qp, wire::psn_add(qp.resp.epsn, wire::kPsnMask));  // epsn - 1
      return;
  }
}

void Responder::replay_response(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt) {
  const uint32_t psn = pkt.bth.psn;
  const bool atomic_write = info.kind == wire::OpKind::AtomicWrite;
  const bool atomic = info.kind != wire::OpKind::ReadRequest && !atomic_write;
  for (const ReplayEntry& r : qp.resp.replay) {
    const int32_t off = wire::psn_diff(psn, r.psn);
    if (!r.valid || r.atomic != atomic || r.atomic_write != atomic_write || off < 0 ||
        off >= static_cast<int32_t>(r.npkts))
      continue;
    if (atomic_write) {
      // Executed already: answered again, not written again (another WRITE may have followed it).
      if (off == 0 && replay_room(qp))
        qp.resp.read_jobs.push_back({psn, psn, psn, nullptr, 0, ReadResponseJob::Kind::Read, 0, true});
    } else if (atomic) {
      if (off == 0) send_atomic_ack(qp, psn, r.atomic_orig);  // a replay: nothing waits for it, it waits for nothing
    } else {
      regenerate_read(qp, pkt, r, off);
    }
    return;
  }
}

// Regenerated from the (possibly shortened) re-issued request, its key checked again.
void Responder::regenerate_read(Qp& qp, const wire::Packet& pkt, const ReplayEntry& r, int32_t off) {
  const uint32_t psn = pkt.bth.psn;
  const uint32_t n = wire::packets_for(pkt.reth.dma_len, qp.mtu);
  uint8_t* host = nullptr;
  if (static_cast<uint32_t>(off) + n > r.npkts ||
      (pkt.reth.dma_len && keys().check_remote(pkt.reth.rkey, qp.cfg.pd, pkt.reth.va, pkt.reth.dma_len,
                                             core::kRemoteRead, &host, qp.qpn) != core::AccessResult::Ok))
    return;
  // A request re-issued from its start supersedes the one being streamed out.
  const uint32_t last_psn = wire::psn_add(psn, n - 1);
  std::erase_if(qp.resp.read_jobs, [&](const ReadResponseJob& j) {
    return j.kind == ReadResponseJob::Kind::Read && wire::psn_diff(j.psn, psn) >= 0 &&
           wire::psn_diff(j.last_psn, last_psn) <= 0;
  });
  if (replay_room(qp))
    qp.resp.read_jobs.push_back({psn, psn, last_psn, host, pkt.reth.dma_len, ReadResponseJob::Kind::Read, 0, true});
}

Verdict Responder::check_request(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt) {
  if (!opcode_in_sequence(qp, info)) return {Verdict::InvalidRequest, WcStatus::RemInvReqErr};
  if (qp.cfg.xrc == XrcRole::Recv)
    if (Verdict v = xrc_target_srq(qp, pkt.xrc_srqn, info); !v.ok()) return v;
  if (Verdict v = check_length(qp, info, pkt); !v.ok()) return v;
  const bool tagged = qp.srq && qp.srq->tm && info.kind == wire::OpKind::Send && info.first;
  return tagged ? tm_classify(qp, info, pkt) : check_receive(qp, info);
}

Verdict Responder::execute_read(Qp& qp, const wire::Packet& pkt) {
  size_t outstanding = 0;
  for (const ReadResponseJob& j : qp.resp.read_jobs) outstanding += !j.regenerated;
  if (outstanding >= qp.max_dest_rd_atomic) return {Verdict::InvalidRequest, WcStatus::RemInvReqErr};
  uint8_t* host = nullptr;
  if (Verdict v = check_rkey(qp, pkt.reth.rkey, pkt.reth.va, pkt.reth.dma_len, core::kRemoteRead, &host); !v.ok())
    return v;
  const uint32_t psn = pkt.bth.psn;
  const uint32_t n = wire::packets_for(pkt.reth.dma_len, qp.mtu);
  remember_replay(qp, {true, false, psn, n, 0});
  qp.resp.msn = wire::psn_add(qp.resp.msn, 1);
  qp.resp.read_jobs.push_back({psn, psn, wire::psn_add(psn, n - 1), host, pkt.reth.dma_len});
  advance_epsn(qp, pkt, n, false);
  return {};
}

Verdict Responder::execute_atomic(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt) {
  if (pkt.atomic.va % 8 != 0) return {Verdict::InvalidRequest, WcStatus::RemInvReqErr};
  uint8_t* host = nullptr;
  if (Verdict v = check_rkey(qp, pkt.atomic.rkey, pkt.atomic.va, 8, core::kRemoteAtomic, &host); !v.ok()) return v;
  auto* word = reinterpret_cast<uint64_t*>(host);
  uint64_t orig;
  if (info.kind == wire::OpKind::CompareSwap) {
    orig = pkt.atomic.compare;
    __atomic_compare_exchange_n(word, &orig, pkt.atomic.swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  } else {
    orig = __atomic_fetch_add(word, pkt.atomic.swap_add, __ATOMIC_SEQ_CST);
  }
  const uint32_t psn = pkt.bth.psn;
  remember_replay(qp, {true, true, psn, 1, orig});
  qp.resp.msn = wire::psn_add(qp.resp.msn, 1);
  if (!original_job_pending(qp))
    send_atomic_ack(qp, psn, orig);
  else
    qp.resp.read_jobs.push_back({psn, psn, psn, nullptr, 0, ReadResponseJob::Kind::AtomicAck, orig});
  advance_epsn(qp, pkt, 1, false);
  return {};
}

Verdict Responder::execute_atomic_write(Qp& qp, const wire::Packet& pkt) {
  // 8 bytes at an 8-byte aligned address, as the RETH says (IBTA 1.5); anything else is invalid.
  if (pkt.payload_len != 8 || pkt.reth.dma_len != 8 || pkt.reth.va % 8 != 0)
    return {Verdict::InvalidRequest, WcStatus::RemInvReqErr};
  uint8_t* host = nullptr;
  if (Verdict v = check_rkey(qp, pkt.reth.rkey, pkt.reth.va, 8, core::kRemoteWrite, &host); !v.ok()) return v;
  uint64_t value;
  std::memcpy(&value, pkt.payload, 8);  // the bytes as they were in the requester's buffer
  __atomic_store_n(reinterpret_cast<uint64_t*>(host), value, __ATOMIC_SEQ_CST);
  const uint32_t psn = pkt.bth.psn;
  remember_replay(qp, {true, false, psn, 1, 0, true});
  qp.resp.msn = wire::psn_add(qp.resp.msn, 1);
  // Its response is a zero-length READ RESPONSE ONLY, in PSN order behind those still owed.
  qp.resp.read_jobs.push_back({psn, psn, psn, nullptr, 0, ReadResponseJob::Kind::Read});
  advance_epsn(qp, pkt, 1, false);
  return {};
}

void Responder::responder_acknowledge(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt) {
  const uint32_t psn = pkt.bth.psn;
  advance_epsn(qp, pkt, 1, !info.last);
  if (qp.resp.tm_ack_now) {
    // A matched rendezvous: its request is acknowledged before the READ and the FIN it starts go out,
    // so the sender sees its SEND complete first, as a ConnectX's sender does.
    qp.resp.tm_ack_now = false;
    if (!ack_must_wait(qp, psn)) {
      responder_send_ack(qp, wire::aeth_ack(), psn);
      qp.resp.ack_owed = false;
      return;
    }
  }
  if (pkt.bth.ack_req) owe_ack(qp, psn);
}

}  // namespace softrdma::transport
