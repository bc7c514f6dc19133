// The receive side of the iWARP data path (docs/iwarp.md): the QP's TCP stream read into its buffer,
// FPDUs found by the MPA receiver (length, CRC, markers), then check stages per ULPDU -- DDP/RDMAP
// header, queue number, MSN in order, MO -- and per opcode: SEND into the next receive WQE (with
// invalidate, solicited), RDMA WRITE placed after its STag check, READ requests queued for their
// responses (at most IRD), READ responses placed into the oldest outstanding READ, and Terminate.
// Every refusal sends one Terminate (RFC 5040 §4.8 / RFC 5041 §7 / RFC 5044 §8, codes as siw uses
// them), is counted, and moves the QP to error.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/place.h"
#include "transport/engine.h"
#include "transport/iwarp_path.h"
#include "transport/srq.h"

namespace softrdma::transport {

namespace iw = wire::iwarp;
using L = iw::TermLayer;
using C = core::Counters;

namespace {
// Terminate codes (RFC 5040 §4.8; RFC 5041 §7.2; RFC 5044 §8), from wire/iwarp.h, by shorter names.
namespace t = iw::term;
constexpr uint8_t kRdmapCatastrophic = t::kRdmapCatastrophic, kRdmapProtection = t::kRdmapRemoteProtection,
                  kRdmapOperation = t::kRdmapRemoteOperation;
constexpr uint8_t kRdmapInvalidStag = t::kInvalidStag, kRdmapBaseBounds = t::kBaseBounds,
                  kRdmapAccessRights = t::kAccessRights, kRdmapNotAssoc = t::kStagNotAssoc, kRdmapToWrap = t::kToWrap,
                  kRdmapOpcode = t::kUnexpectedOpcode, kRdmapCatastrophicStream = t::kCatastrophicStream,
                  kRdmapCannotInvalidate = t::kCannotInvalidate, kRdmapUnspecified = t::kUnspecified;
constexpr uint8_t kDdpCatastrophic = t::kDdpCatastrophic, kDdpTagged = t::kDdpTagged, kDdpUntagged = t::kDdpUntagged;
constexpr uint8_t kDdpInvalidStag = t::kTInvalidStag, kDdpBaseBounds = t::kTBaseBounds, kDdpNotAssoc = t::kTStagNotAssoc,
                  kDdpToWrap = t::kTToWrap;
constexpr uint8_t kDdpInvalidQn = t::kUtInvalidQn, kDdpNoBuffer = t::kUtInvalidMsnNoBuffer,
                  kDdpMsnRange = t::kUtInvalidMsnRange, kDdpInvalidMo = t::kUtInvalidMo,
                  kDdpTooLong = t::kUtMessageTooLong;

constexpr int kReadsPerPass = 16;  // recv calls per QP per progress pass

// Whether a first FPDU is the RTR the MPA exchange agreed (RFC 6581 §5): a zero-length WRITE, a READ
// request for nothing, or a zero-length SEND, each one whole message.
bool is_agreed_rtr(IwarpRtr rtr, const iw::DdpHeader& h, const uint8_t* payload, size_t plen) {
  if (!h.last) return false;
  switch (rtr) {
    case IwarpRtr::AwaitWrite: return h.opcode == iw::Opcode::Write && plen == 0;
    case IwarpRtr::AwaitSend: return h.opcode == iw::Opcode::Send && plen == 0 && h.mo == 0;
    case IwarpRtr::AwaitRead: {
      iw::ReadRequest r;
      return h.opcode == iw::Opcode::ReadRequest && iw::parse_read_request(payload, plen, r) && r.size == 0;
    }
    default: return false;
  }
}

// A key check's result as iWARP reports it: a DDP tagged buffer error (RDMA WRITE, READ response)
// and an RDMAP remote protection error (the source of a READ request). Access rights have no DDP
// code: invalid STag, as siw reports them.
struct KeyErrorCodes {
  uint8_t ddp, rdmap;
};
KeyErrorCodes key_error_codes(core::AccessResult r) {
  switch (r) {
    case core::AccessResult::BadPd: return {kDdpNotAssoc, kRdmapNotAssoc};
    case core::AccessResult::OutOfRange:
    case core::AccessResult::NotMapped: return {kDdpBaseBounds, kRdmapBaseBounds};
    case core::AccessResult::NoPermission: return {kDdpInvalidStag, kRdmapAccessRights};
    default: return {kDdpInvalidStag, kRdmapInvalidStag};
  }
}
uint64_t C::*stag_counter(core::AccessResult r) {
  return r == core::AccessResult::OutOfRange || r == core::AccessResult::NotMapped ? &C::iw_bad_bounds
                                                                                    : &C::iw_bad_stag;
}
bool is_send(iw::Opcode op) {
  return op == iw::Opcode::Send || op == iw::Opcode::SendInvalidate || op == iw::Opcode::SendSolicited ||
         op == iw::Opcode::SendSolicitedInvalidate;
}
// What the requester's WQE reports when the peer terminated the stream (the class of its error).
WcStatus terminate_status(const iw::Terminate& t) {
  if ((t.layer == L::Ddp && t.etype == kDdpTagged) || (t.layer == L::Rdmap && t.etype == kRdmapProtection))
    return WcStatus::RemAccessErr;
  if (t.layer == L::Ddp && t.etype == kDdpUntagged) return WcStatus::RemInvReqErr;
  return WcStatus::RemOpErr;
}
}  // namespace

void IwarpPath::iwarp_refuse(Qp& qp, const IwarpFault& f, const uint8_t* ddp, size_t ddp_len, size_t ulpdu_len,
                          const uint8_t* rdmap, size_t rdmap_len) {
  IwarpState& s = state(qp);
  count(&qp, f.counter);
  if (!s.closing && !s.shut) {
    // One Terminate (RFC 5040 §4.8), untagged on QN 2, naming the error and copying what it refused.
    iw::Terminate t;
    t.layer = f.layer;
    t.etype = f.etype;
    t.ecode = f.ecode;
    if (ddp_len) {
      t.has_segment_len = true;
      t.segment_len = static_cast<uint16_t>(ulpdu_len);
      t.ddp_header = ddp;
      t.ddp_header_len = ddp_len;
    }
    t.rdmap_header = rdmap;
    t.rdmap_header_len = rdmap_len;
    iw::DdpHeader h;
    h.last = true;
    h.opcode = iw::Opcode::Terminate;
    h.qn = iw::kQnTerminate;
    h.msn = s.tx_msn[iw::kQnTerminate]++;
    uint8_t buf[iw::kUntaggedHeaderLen + iw::kMaxTerminateLen];
    size_t n = iw::encode_header(h, buf);
    n += iw::encode_terminate(t, buf + n);
    s.hold_tx = false;
    iwarp_queue(qp, buf, n, nullptr, 0);
    count(&qp, &C::iw_terminate_sent);
  }
  if (qp.resp.recv_active && f.recv_status != WcStatus::Success) {
    // The receive WQE the refused message had taken reports why; the others are flushed.
    core::Cqe c{};
    c.wr_id = placement().active_recv_wqe(qp).wr_id;
    c.status = f.recv_status;
    c.opcode = core::WcOpcode::Recv;
    c.qp_num = qp.qpn;
    placement().retire_recv_wqe(qp);
    qp.resp.recv_active = false;
    post_cqe(receive_cq(qp), c, false);
  }
  qp.resp.in_message = false;
  raise(AsyncEvent{f.event, &qp, nullptr});
  if (qp.state.load(std::memory_order_relaxed) != QpState::Err) move_to_error(qp);
  iwarp_stop(qp);
}

bool IwarpPath::iwarp_receive(Qp& qp) {
  IwarpState& s = state(qp);
  bool did = false;
  for (int round = 0; round < kReadsPerPass; ++round) {
    const size_t room = s.rx.size() - s.rx_len;
    const ssize_t n = recv(s.fd, s.rx.data() + s.rx_len, room, MSG_DONTWAIT);
    if (n == 0) {
      iwarp_conn_lost(qp, false);
      return true;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      iwarp_conn_lost(qp, true);
      return true;
    }
    did = true;
    s.rx_len += static_cast<size_t>(n);
    size_t off = 0;
    while (!s.closing) {
      iw::FpduReceiver::Fpdu f;
      const auto st = s.rx_framer->next(s.rx.data() + off, s.rx_len - off, s.demarked.empty() ? nullptr : s.demarked.data(), f);
      if (st == iw::FpduReceiver::Status::NeedMore) break;
      if (st != iw::FpduReceiver::Status::Ok) {
        // CRC, or a length or marker that lost the framing (RFC 5044 §8): the stream is beyond use.
        const iw::ParseError e = iw::FpduReceiver::error(st);
        const bool crc = st == iw::FpduReceiver::Status::BadCrc;
        iwarp_refuse(qp, {e.layer, e.etype, e.ecode, crc ? &C::iw_bad_crc : &C::iw_bad_framing, AsyncEventType::QpFatal});
        break;
      }
      off += f.consumed;
      count(&qp, &C::iw_rx_fpdus);
      s.kicks = false;  // the peer reads and writes: no zero-length WRITE needed
      if (!iwarp_deliver(qp, f.ulpdu, f.ulpdu_len)) break;
    }
    if (s.closing) {
      s.rx_len = 0;
      return true;
    }
    std::memmove(s.rx.data(), s.rx.data() + off, s.rx_len - off);
    s.rx_len -= off;
    if (static_cast<size_t>(n) < room) break;  // the socket is drained
  }
  return did;
}

bool IwarpPath::iwarp_deliver(Qp& qp, const uint8_t* u, size_t len) {
  IwarpState& s = state(qp);
  iw::DdpHeader h;
  iw::ParseError err{};
  const size_t hl = iw::parse_header(u, len, h, err);
  if (!hl) {
    // The Terminate copies the header only when it is all there (D names a whole DDP header).
    const size_t want = (len && (u[0] & 0x80)) ? iw::kTaggedHeaderLen : iw::kUntaggedHeaderLen;
    const size_t copy = len >= want ? want : 0;
    iwarp_refuse(qp, {err.layer, err.etype, err.ecode, &C::iw_bad_header, AsyncEventType::QpReqErr}, u, copy, len);
    return false;
  }
  // The first FPDU from the peer: transmission may start (RTR Await). With peer-to-peer it must be
  // the zero-length RTR agreed in the MPA exchange; a zero-length SEND RTR takes no receive WQE.
  const IwarpRtr rtr = s.rtr_expected;
  s.rtr_expected = IwarpRtr::None;
  s.hold_tx = false;
  const uint8_t* payload = u + hl;
  const size_t plen = len - hl;
  if (rtr != IwarpRtr::None && !is_agreed_rtr(rtr, h, payload, plen)) {
    iwarp_refuse(qp, {L::Llp, t::kLlpMpa, t::kNoMatchingRtr, &C::iw_bad_rtr, AsyncEventType::QpFatal});
    return false;
  }
  const size_t ddp_len = h.tagged ? iw::kTaggedHeaderLen : iw::kUntaggedHeaderLen;
  if (!h.tagged) {
    const uint32_t want_qn = is_send(h.opcode) ? iw::kQnSend
                             : h.opcode == iw::Opcode::ReadRequest ? iw::kQnReadRequest
                                                                   : iw::kQnTerminate;
    if (h.qn != want_qn) {
      iwarp_refuse(qp, {L::Ddp, kDdpUntagged, kDdpInvalidQn, &C::iw_bad_qn, AsyncEventType::QpReqErr}, u, ddp_len,
                   len);
      return false;
    }
    if (h.opcode != iw::Opcode::Terminate && h.msn != s.rx_msn[h.qn]) {
      iwarp_refuse(qp, {L::Ddp, kDdpUntagged, kDdpMsnRange, &C::iw_bad_msn, AsyncEventType::QpReqErr}, u, ddp_len,
                   len);
      return false;
    }
    if (rtr == IwarpRtr::AwaitSend) {
      ++s.rx_msn[iw::kQnSend];
      return true;
    }
  }
  switch (h.opcode) {
    case iw::Opcode::Write: {
      serves_passive();
      if (plen == 0) return true;  // touches no memory: no STag check (RFC 5040 §7.1; the RTR WRITE)
      core::AccessResult r = core::AccessResult::NoPermission;
      uint8_t* host = nullptr;
      if (h.to + plen < h.to) {
        iwarp_refuse(qp, {L::Ddp, kDdpTagged, kDdpToWrap, &C::iw_bad_bounds, AsyncEventType::QpAccessErr}, u, ddp_len,
                     len);
        return false;
      }
      if (qp.access_flags & core::kRemoteWrite)
        r = keys().check_remote(h.stag, qp.cfg.pd, h.to, plen, core::kRemoteWrite, &host, qp.qpn);
      if (r != core::AccessResult::Ok) {
        iwarp_refuse(qp, {L::Ddp, kDdpTagged, key_error_codes(r).ddp, stag_counter(r), AsyncEventType::QpAccessErr}, u,
                     ddp_len, len);
        return false;
      }
      core::place_in_order(host, payload, plen);  // as the RoCE responder places a WRITE
      return true;
    }
    case iw::Opcode::ReadRequest:
      iwarp_deliver_read_request(qp, h, u, ddp_len, payload, plen, len);
      break;
    case iw::Opcode::ReadResponse:
      iwarp_deliver_read_response(qp, h, u, ddp_len, payload, plen, len);
      break;
    case iw::Opcode::Terminate:
      iwarp_deliver_terminate(qp, payload, plen);
      break;
    default:
      iwarp_deliver_send(qp, h, u, ddp_len, payload, plen, len);
      break;
  }
  return !s.closing;
}

void IwarpPath::iwarp_deliver_send(Qp& qp, const iw::DdpHeader& h, const uint8_t* hdr, size_t hdr_len,
                                const uint8_t* payload, size_t plen, size_t ulpdu_len) {
  IwarpState& s = state(qp);
  auto refuse = [&](const IwarpFault& f) { iwarp_refuse(qp, f, hdr, hdr_len, ulpdu_len); };
  // MO: where this segment's payload lies in the message (RFC 5041 §5.2); a message starts at 0.
  if (h.mo != (qp.resp.in_message ? qp.resp.recv_offset : 0)) {
    refuse({L::Ddp, kDdpUntagged, kDdpInvalidMo, &C::iw_bad_mo, AsyncEventType::QpReqErr});
    return;
  }
  if (!qp.resp.in_message) {
    // An untagged message with no buffer posted is fatal in iWARP (RFC 5041 §7.2: no RNR retry).
    if (!placement().next_recv_wqe(qp)) {
      refuse({L::Ddp, kDdpUntagged, kDdpNoBuffer, &C::iw_no_recv, AsyncEventType::QpReqErr});
      return;
    }
    qp.resp.in_message = true;
    if (placement().open_recv_message(qp) != WcStatus::Success) {
      refuse({L::Ddp, kDdpCatastrophic, 0, &C::iw_local_error, AsyncEventType::QpFatal, WcStatus::LocProtErr});
      return;
    }
  }
  // Too long for the WQE, or its MR deregistered while the message arrived.
  if (const WcStatus st = placement().place_recv(qp, payload, plen); st != WcStatus::Success) {
    if (st == WcStatus::LocLenErr)
      refuse({L::Ddp, kDdpUntagged, kDdpTooLong, &C::iw_msg_too_long, AsyncEventType::QpReqErr, WcStatus::LocLenErr});
    else
      refuse({L::Ddp, kDdpCatastrophic, 0, &C::iw_local_error, AsyncEventType::QpFatal, WcStatus::LocProtErr});
    return;
  }
  if (!h.last) return;
  core::Cqe c = connected_receive_cqe(qp, placement().active_recv_wqe(qp).wr_id, core::WcOpcode::Recv, qp.resp.recv_offset,
                                      false, 0);
  if (h.opcode == iw::Opcode::SendInvalidate || h.opcode == iw::Opcode::SendSolicitedInvalidate) {
    // The STag in the header is invalidated as the message completes, by the rules of RoCE's SEND
    // with invalidate (a type 2 window bound through this QP).
    if (!keys().invalidate(h.rsvd_ulp, qp.cfg.pd, qp.qpn, true)) {
      refuse({L::Rdmap, kRdmapProtection, kRdmapCannotInvalidate, &C::iw_cannot_invalidate, AsyncEventType::QpReqErr,
              WcStatus::RemInvReqErr});
      return;
    }
    c.wc_flags = core::kWcWithInv;
    c.imm_or_inv = h.rsvd_ulp;
  }
  qp.resp.in_message = false;
  ++s.rx_msn[iw::kQnSend];
  const bool solicited = h.opcode == iw::Opcode::SendSolicited || h.opcode == iw::Opcode::SendSolicitedInvalidate;
  placement().finish_recv(qp, c, receive_cq(qp), solicited);
}

void IwarpPath::iwarp_deliver_read_request(Qp& qp, const iw::DdpHeader& h, const uint8_t* hdr, size_t hdr_len,
                                        const uint8_t* payload, size_t plen, size_t ulpdu_len) {
  IwarpState& s = state(qp);
  if (h.mo != 0) {
    iwarp_refuse(qp, {L::Ddp, kDdpUntagged, kDdpInvalidMo, &C::iw_bad_mo, AsyncEventType::QpReqErr}, hdr, hdr_len,
                 ulpdu_len);
    return;
  }
  iw::ReadRequest r;
  if (!h.last || plen != iw::kReadRequestLen || !iw::parse_read_request(payload, plen, r)) {
    // A READ request is one segment of exactly its header.
    iwarp_refuse(qp, {L::Ddp, kDdpUntagged, kDdpTooLong, &C::iw_bad_header, AsyncEventType::QpReqErr}, hdr, hdr_len,
                 ulpdu_len);
    return;
  }
  const uint8_t* rdmap = payload;
  ++s.rx_msn[iw::kQnReadRequest];
  // Outstanding until its last response is in the socket (RFC 5040 §6.3): owed or still queued.
  const size_t unsent = static_cast<size_t>(
      std::count_if(s.tx.begin(), s.tx.end(), [](const IwarpTx& t) { return t.ends_read; }));
  if (s.read_jobs.size() + unsent >= s.ird) {
    iwarp_refuse(qp, {L::Rdmap, kRdmapOperation, kRdmapCatastrophicStream, &C::iw_ird_exceeded,
                      AsyncEventType::QpReqErr},
                 hdr, hdr_len, ulpdu_len, rdmap, iw::kReadRequestLen);
    return;
  }
  serves_passive();
  uint8_t* src = nullptr;
  if (r.size) {
    // A zero-length READ (the RTR's) reads nothing: no STag check.
    if (r.src_to + r.size < r.src_to) {
      iwarp_refuse(qp, {L::Rdmap, kRdmapProtection, kRdmapToWrap, &C::iw_bad_bounds, AsyncEventType::QpAccessErr},
                   hdr, hdr_len, ulpdu_len, rdmap, iw::kReadRequestLen);
      return;
    }
    core::AccessResult a = core::AccessResult::NoPermission;
    if (qp.access_flags & core::kRemoteRead)
      a = keys().check_remote(r.src_stag, qp.cfg.pd, r.src_to, r.size, core::kRemoteRead, &src, qp.qpn);
    if (a != core::AccessResult::Ok) {
      iwarp_refuse(qp, {L::Rdmap, kRdmapProtection, key_error_codes(a).rdmap, stag_counter(a),
                        AsyncEventType::QpAccessErr},
                   hdr, hdr_len, ulpdu_len, rdmap, iw::kReadRequestLen);
      return;
    }
  }
  s.read_jobs.push_back({r.sink_stag, r.sink_to, src, r.size});
}

void IwarpPath::iwarp_deliver_read_response(Qp& qp, const iw::DdpHeader& h, const uint8_t* hdr, size_t hdr_len,
                                         const uint8_t* payload, size_t plen, size_t ulpdu_len) {
  IwarpState& s = state(qp);
  auto refuse = [&](const IwarpFault& f) { iwarp_refuse(qp, f, hdr, hdr_len, ulpdu_len); };
  if (s.reads.empty()) {
    refuse({L::Rdmap, kRdmapOperation, kRdmapOpcode, &C::iw_bad_response, AsyncEventType::QpReqErr});
    return;
  }
  IwarpRead& rd = s.reads.front();
  if (rd.rtr) {
    // The answer to our RTR READ: zero-length, and it completes nothing.
    if (plen || !h.last) {
      refuse({L::Ddp, kDdpTagged, kDdpBaseBounds, &C::iw_bad_bounds, AsyncEventType::QpAccessErr});
      return;
    }
    s.reads.pop_front();
    return;
  }
  SqEntry& e = qp.sq.at(rd.sq_index);
  const Sge& sink = e.wqe.sge[0];
  // Responses come in request order (RFC 5040 §5.2), tagged to the sink we named: its STag, within it.
  if (plen && h.stag != sink.lkey) {
    refuse({L::Ddp, kDdpTagged, kDdpInvalidStag, &C::iw_bad_stag, AsyncEventType::QpAccessErr});
    return;
  }
  if (plen && (h.to < sink.addr || h.to - sink.addr > e.wqe.length || plen > e.wqe.length - (h.to - sink.addr) ||
               rd.placed + plen > e.wqe.length)) {
    refuse({L::Ddp, kDdpTagged, kDdpBaseBounds, &C::iw_bad_bounds, AsyncEventType::QpAccessErr});
    return;
  }
  if (plen) {
    if (e.host[0])
      std::memcpy(e.host[0] + (h.to - sink.addr), payload, plen);
    else
      e.status = WcStatus::LocProtErr;  // the sink was deregistered while the READ was outstanding
  }
  rd.placed += plen;
  if (!h.last) return;
  if (rd.placed != e.wqe.length) {
    // The response ended before the length we asked for (RFC 5040 §4.5: one message of that size).
    // Every earlier WQE is complete (the request went out behind them): the READ takes the error,
    // after the Terminate is queued (the QP is in error then).
    refuse({L::Rdmap, kRdmapOperation, kRdmapUnspecified, &C::iw_bad_response, AsyncEventType::QpReqErr});
    completer().requester_error(qp, WcStatus::BadRespErr);
    return;
  }
  s.reads.pop_front();
  e.acked = true;
  completer().complete_in_order(qp);
}

void IwarpPath::iwarp_deliver_terminate(Qp& qp, const uint8_t* payload, size_t plen) {
  IwarpState& s = state(qp);
  count(&qp, &C::iw_terminate_rcvd);
  iw::Terminate t;
  if (!iw::parse_terminate(payload, plen, t)) t = {L::Rdmap, kRdmapCatastrophic, kRdmapUnspecified};
  raise(AsyncEvent{AsyncEventType::QpFatal, &qp, nullptr});
  // The oldest WQE in progress takes the peer's verdict; the rest are flushed. SEND and WRITE
  // already complete are not called back (iWARP completes them when written).
  const uint64_t tail = qp.sq.tail.load(std::memory_order_relaxed);
  if (tail < qp.sq.head.load(std::memory_order_acquire) && qp.sq.at(tail).started)
    completer().requester_error(qp, terminate_status(t));
  if (qp.state.load(std::memory_order_relaxed) != QpState::Err) move_to_error(qp);
  iwarp_stop(qp);
  s.tx.clear();  // nothing follows a Terminate either way (RFC 5040 §5.4)
  s.tx_hold_until_ns = 0;
}

}  // namespace softrdma::transport
