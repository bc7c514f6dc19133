// The iWARP path of RC QPs over TCP (docs/iwarp.md, iwarp_path.h): the attach, the requester (SQ
// WQEs -> SEND, RDMA WRITE and READ request FPDUs), READ responses streamed out, the socket writes
// (writev of FPDUs pointing into registered memory; partial writes resumed), the completion of
// SEND/WRITE once their last byte is in the socket, and the end of a connection (Terminate, shutdown).
// The receive side (responder checks, READ response placement, Terminate received) is
// iwarp_responder.cpp.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/engine.h"
#include "transport/iwarp_path.h"
#include "transport/work_request.h"

namespace softrdma::transport {

namespace iw = wire::iwarp;

namespace {
constexpr size_t kRxBuffer = 256 * 1024;  // holds several largest FPDUs (65535 + MPA framing)
constexpr size_t kTxQueue = 16;           // FPDUs framed ahead of the socket
constexpr size_t kPassBytes = 4 << 20;    // written per QP per pass: one big transfer starves no QP
constexpr int kMaxIov = 1024;             // IOV_MAX
// Room offered to the framer for one FPDU: the largest ULPDU (16-bit length) and its framing.
constexpr size_t kFpduRoom = iw::kMaxUlpduLen + 1024;

size_t max_payload(const iw::FpduSender& f, size_t hdr_len) {
  return std::min(f.max_ulpdu(kFpduRoom), iw::kMaxUlpduLen) - hdr_len;
}

// The unsent bytes of the queued FPDUs, in stream order, as at most kMaxIov pieces (their sum in *total).
int unsent_iov(const IwarpState& s, iovec* iov, size_t* total) {
  int n = 0;
  for (const IwarpTx& t : s.tx) {
    size_t skip = t.sent;
    for (const iovec& v : t.iov) {
      if (n == kMaxIov) break;
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      iov[n++] = {static_cast<uint8_t*>(v.iov_base) + skip, v.iov_len - skip};
      *total += v.iov_len - skip;
      skip = 0;
    }
    if (n == kMaxIov) break;
  }
  return n;
}

iw::Opcode send_opcode(const SendWqe& w) {
  const bool se = w.flags & kSolicited;
  if (w.op == WrOp::SendInv) return se ? iw::Opcode::SendSolicitedInvalidate : iw::Opcode::SendInvalidate;
  return se ? iw::Opcode::SendSolicited : iw::Opcode::Send;
}
}  // namespace

IwarpState* iwarp_state(Qp& qp) { return dynamic_cast<IwarpState*>(qp.path_state.get()); }

bool IwarpPath::carries(const Qp&, const SendWqe& w) const {
  return work_request(w.op, QpType::Rc).allowed && iwarp_carries(w);
}

bool IwarpPath::iwarp_carries(const SendWqe& w) {
  switch (w.op) {
    case WrOp::Send:
    case WrOp::SendInv:
    case WrOp::Write:
    case WrOp::LocalInv:
    case WrOp::BindMw:  // local, nothing on the wire (siw has no windows: the verbs layer decides)
      return true;
    case WrOp::Read:
      return w.num_sge == 1 && !(w.flags & kInline);  // one sink buffer (RFC 5040 §4.4), as siw
    default:
      return false;  // no immediate data and no atomics in iWARP (RFC 5040; siw)
  }
}

int Engine::iwarp_attach(Qp* qp, const IwarpAttach& a) {
  if (a.fd < 0) return EINVAL;
  int rc;
  {
    std::lock_guard lock(lock_);
    rc = iwarp_->attach(qp, a);
    if (!rc) set_packet_peer(*qp, true);  // its stream, looked at by progress passes
  }
  if (rc) {
    ::close(a.fd);
    return rc;
  }
  doorbell();
  return 0;
}

int IwarpPath::attach(Qp* qp, const IwarpAttach& a) {
  if (qp->cfg.type != QpType::Rc || qp->cfg.xrc != XrcRole::None || qp->state.load() != QpState::Init ||
      qp->on_path())
    return EINVAL;
  const int fl = fcntl(a.fd, F_GETFL);
  if (fl < 0 || fcntl(a.fd, F_SETFL, fl | O_NONBLOCK) < 0) return errno;
  // Small FPDUs (READ requests, Terminate, a latency test's SEND) leave at once. Fails harmlessly on
  // a socketpair (the transport tests).
  int one = 1;
  setsockopt(a.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (watch(a.fd, EPOLLIN | EPOLLRDHUP) != 0) return errno;
  qp->path_state = std::make_unique<IwarpState>();
  IwarpState& s = state(*qp);
  s.fd = a.fd;
  s.crc = a.crc;
  s.markers_rx = a.markers_rx;
  s.markers_tx = a.markers_tx;
  // Zero would forbid every READ, the RTR's too: one is the least an RNIC offers.
  s.ird = std::max<uint32_t>(a.ird, 1);
  s.ord = std::max<uint32_t>(a.ord, 1);
  s.tx_framer.emplace(a.crc, a.markers_tx);
  s.rx_framer.emplace(a.crc, a.markers_rx);
  s.rx.resize(kRxBuffer);
  if (a.markers_rx) s.demarked.resize(iw::kMaxUlpduLen);
  qp->req.send_index = qp->sq.tail.load();
  qp->req.send_offset_pkts = 0;
  s.send_offset = 0;
  // The RTR FPDU (RFC 6581 §4): the first thing on the stream after the MPA frames.
  uint8_t hdr[iw::kMaxHeaderLen];
  if (a.rtr == IwarpRtr::SendWrite || a.rtr == IwarpRtr::SendRead || a.rtr == IwarpRtr::SendSend) {
    // A zero-length message, last segment: a WRITE (tagged, STag 0), a READ request for nothing (its
    // zero-length response completes no WQE) or a SEND on its queue.
    iw::DdpHeader h;
    h.last = true;
    h.tagged = a.rtr == IwarpRtr::SendWrite;
    h.opcode = a.rtr == IwarpRtr::SendWrite  ? iw::Opcode::Write
               : a.rtr == IwarpRtr::SendRead ? iw::Opcode::ReadRequest
                                             : iw::Opcode::Send;
    if (!h.tagged) {
      h.qn = a.rtr == IwarpRtr::SendRead ? iw::kQnReadRequest : iw::kQnSend;
      h.msn = s.tx_msn[h.qn]++;
    }
    size_t n = iw::encode_header(h, hdr);
    if (a.rtr == IwarpRtr::SendRead) {
      n += iw::encode_read_request(iw::ReadRequest{}, hdr + n);
      s.reads.push_back({0, true, 0});
    }
    iwarp_queue(*qp, hdr, n, nullptr, 0);
    if (a.rtr_hold) {
      s.tx_hold_until_ns = now() + kIwarpRtrHoldNs;
      s.attached_ns = now();
      s.kicks = true;
    }
  }
  if (iwarp_awaits(a.rtr)) {
    s.hold_tx = true;
    if (a.rtr != IwarpRtr::Await) s.rtr_expected = a.rtr;
    if (a.await_grace) s.hold_until_ns = now() + kIwarpAwaitGraceNs;
  }
  qp->state.store(QpState::Rts, std::memory_order_release);
  qp->path.store(this, std::memory_order_relaxed);
  ++qps_;
  iwarp_transmit(*qp);
  return 0;
}

void IwarpPath::iwarp_queue(Qp& qp, const uint8_t* hdr, size_t hdr_len, const iovec* payload, int n, bool completes,
                         uint64_t sq_index) {
  IwarpState& s = state(qp);
  IwarpTx& t = s.tx.emplace_back();
  std::memcpy(t.hdr, hdr, hdr_len);
  iovec ulpdu[core::DeviceLimits::kMaxSge + 1];
  ulpdu[0] = {t.hdr, hdr_len};
  size_t ulen = hdr_len;
  for (int i = 0; i < n; ++i) {
    ulpdu[i + 1] = payload[i];
    ulen += payload[i].iov_len;
  }
  t.scratch.resize(iw::FpduSender::scratch_len(ulen));
  t.iov.resize(static_cast<size_t>(n) + 1 + iw::kFrameIov + 2 * (ulen / iw::kMarkerInterval + 2));
  const int k = s.tx_framer->frame(ulpdu, n + 1, t.scratch.data(), t.iov.data(), static_cast<int>(t.iov.size()));
  t.iov.resize(k > 0 ? static_cast<size_t>(k) : 0);
  t.len = 0;
  for (const iovec& v : t.iov) t.len += v.iov_len;
  t.completes = completes;
  t.sq_index = sq_index;
  count(&qp, &core::Counters::iw_tx_fpdus);
}

void IwarpPath::iwarp_read_request(Qp& qp, const SendWqe& w) {
  IwarpState& s = state(qp);
  uint8_t hdr[iw::kMaxHeaderLen];
  // RDMA READ request (RFC 5040 §4.4): untagged on QN 1; the sink is the local SGE, named by its lkey.
  iw::DdpHeader h;
  h.last = true;
  h.opcode = iw::Opcode::ReadRequest;
  h.qn = iw::kQnReadRequest;
  h.msn = s.tx_msn[iw::kQnReadRequest]++;
  size_t n = iw::encode_header(h, hdr);
  iw::ReadRequest r;
  r.sink_stag = w.sge[0].lkey;
  r.sink_to = w.sge[0].addr;
  r.size = static_cast<uint32_t>(w.length);
  r.src_stag = w.rkey;
  r.src_to = w.remote_addr;
  n += iw::encode_read_request(r, hdr + n);
  iwarp_queue(qp, hdr, n, nullptr, 0);
  s.reads.push_back({qp.req.send_index, false, 0});
  ++qp.req.reads_outstanding;
  ++qp.req.send_index;
}

bool IwarpPath::iwarp_requester_fill(Qp& qp) {
  IwarpState& s = state(qp);
  const uint64_t head = std::min(qp.sq.head.load(std::memory_order_acquire), qp.req.sq_stop_at);
  if (qp.req.send_index >= head) return false;
  SqEntry& e = qp.sq.at(qp.req.send_index);
  const WorkRequest wr = work_request(e.wqe.op, QpType::Rc);
  if (!e.started) {
    // A fenced WQE waits until every earlier one (and so every READ) has completed.
    if ((e.wqe.flags & kFence) && qp.sq.tail.load(std::memory_order_relaxed) != qp.req.send_index) return false;
    if (wr.read && s.reads.size() >= s.ord) return false;
    if (wr.local) {
      requester().execute_local_wqe(qp, e);
      return true;
    }
    e.first_psn = 0;
    e.npkts = 0;
    if (!iwarp_carries(e.wqe)) e.status = WcStatus::LocQpOpErr;
    if (e.status != WcStatus::Success || !requester().prepare_wqe(qp, e)) {
      // Reported in order; nothing after it is sent.
      e.started = true;
      completer().fail_in_order(qp, e);
      return true;
    }
    e.started = true;
    s.send_offset = 0;
  }
  if (e.status != WcStatus::Success) {
    // Its memory was deregistered while it was being sent: it completes in error, in order.
    completer().fail_in_order(qp, e);
    return true;
  }
  const SendWqe& w = e.wqe;
  if (wr.read) {
    iwarp_read_request(qp, w);
    return true;
  }
  uint8_t hdr[iw::kMaxHeaderLen];
  iw::DdpHeader h;
  const bool write = w.op == WrOp::Write;
  const uint64_t off = s.send_offset;
  size_t hdr_len;
  if (write) {
    h.tagged = true;
    h.opcode = iw::Opcode::Write;
    h.stag = w.rkey;
    h.to = w.remote_addr + off;
    hdr_len = iw::kTaggedHeaderLen;
  } else {
    h.opcode = send_opcode(w);
    h.qn = iw::kQnSend;
    h.msn = s.tx_msn[iw::kQnSend];
    h.mo = static_cast<uint32_t>(off);
    if (w.op == WrOp::SendInv) h.rsvd_ulp = w.imm_be;  // the STag the peer invalidates
    hdr_len = iw::kUntaggedHeaderLen;
  }
  const uint64_t chunk = std::min<uint64_t>(w.length - off, max_payload(*s.tx_framer, hdr_len));
  h.last = off + chunk == w.length;
  iovec pieces[core::DeviceLimits::kMaxSge];
  int n = 0;
  if (chunk && (w.flags & kInline)) {
    pieces[n++] = {const_cast<uint8_t*>(w.inline_data) + off, chunk};
  } else if (chunk) {
    for_each_sge_piece(w.sge, e.host, w.num_sge, off, chunk, [&](uint8_t* p, uint64_t len) {
      pieces[n++] = {p, len};
      return true;
    });
  }
  iw::encode_header(h, hdr);
  iwarp_queue(qp, hdr, hdr_len, pieces, n, h.last, qp.req.send_index);
  if (h.last) {
    if (!write) ++s.tx_msn[iw::kQnSend];
    ++qp.req.send_index;
    s.send_offset = 0;
  } else {
    s.send_offset = off + chunk;
  }
  return true;
}

bool IwarpPath::iwarp_read_response_fill(Qp& qp) {
  IwarpState& s = state(qp);
  if (s.read_jobs.empty()) return false;
  IwarpReadJob& j = s.read_jobs.front();
  // RDMA READ response (RFC 5040 §4.5): tagged to the requester's sink STag and TO.
  iw::DdpHeader h;
  h.tagged = true;
  h.opcode = iw::Opcode::ReadResponse;
  h.stag = j.sink_stag;
  h.to = j.sink_to;
  const uint64_t chunk = std::min<uint64_t>(j.remaining, max_payload(*s.tx_framer, iw::kTaggedHeaderLen));
  h.last = chunk == j.remaining;
  uint8_t hdr[iw::kTaggedHeaderLen];
  iw::encode_header(h, hdr);
  iovec p{const_cast<uint8_t*>(j.src), chunk};
  iwarp_queue(qp, hdr, iw::kTaggedHeaderLen, &p, chunk ? 1 : 0);
  j.src += chunk;
  j.sink_to += chunk;
  j.remaining -= chunk;
  if (h.last) {
    s.tx.back().ends_read = true;
    s.read_jobs.pop_front();
  }
  return true;
}

bool IwarpPath::iwarp_transmit(Qp& qp) {
  IwarpState& s = state(qp);
  if (s.shut) return false;
  bool did = false;
  size_t budget = kPassBytes;
  bool blocked = false;
  for (;;) {
    if (!s.closing && !s.hold_tx && qp.state.load(std::memory_order_relaxed) == QpState::Rts) {
      // READ responses and the requester's FPDUs take turns on the stream.
      while (s.tx.size() < kTxQueue && !s.closing) {
        bool any = iwarp_read_response_fill(qp);
        if (s.tx.size() < kTxQueue && !s.closing) any |= iwarp_requester_fill(qp);
        if (!any) break;
        did = true;
      }
    }
    if (s.tx.empty()) break;
    if (s.tx_hold_until_ns) {
      if (now() < s.tx_hold_until_ns) break;  // the RTR hold: queued, not yet written
      s.tx_hold_until_ns = 0;
    }
    iovec iov[kMaxIov];
    size_t total = 0;
    const int n = unsent_iov(s, iov, &total);
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t w = sendmsg(s.fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        blocked = true;
        break;
      }
      // A peer that refused our data sends a Terminate, then shuts its socket, and its kernel resets
      // the stream when more of ours arrives. The Terminate, which names the error (a WRITE to a
      // deregistered region ends in REM_ACCESS_ERR, not flushed), is still readable: read it first.
      if (!s.closing) iwarp_receive(qp);
      if (!s.closing) {
        iwarp_conn_lost(qp, true);
        return true;
      }
      s.tx.clear();  // the stream is gone: it ends below
      did = true;
      break;
    }
    did = true;
    size_t left = static_cast<size_t>(w);
    while (left && !s.tx.empty()) {
      IwarpTx& t = s.tx.front();
      const size_t take = std::min(left, t.len - t.sent);
      t.sent += take;
      left -= take;
      if (t.sent < t.len) break;
      const bool completes = t.completes && !s.closing;
      const uint64_t index = t.sq_index;
      s.tx.pop_front();
      if (completes) {
        // SEND and WRITE are complete once the socket has all of them (there is no RDMA-level ACK).
        qp.sq.at(index).acked = true;
        completer().complete_in_order(qp);
      }
    }
    budget -= std::min(budget, static_cast<size_t>(w));
    if (static_cast<size_t>(w) < total) {
      blocked = true;
      break;
    }
    if (!budget) break;
  }
  // A full send buffer: the progress thread waits for room too (level-triggered EPOLLOUT).
  if (blocked != s.want_out) {
    s.want_out = blocked;
    const uint32_t out = blocked ? uint32_t{EPOLLOUT} : 0u;
    rewatch(s.fd, s.closing ? out : uint32_t{EPOLLIN | EPOLLRDHUP} | out);
  }
  if (s.closing && s.tx.empty()) {
    // Everything owed (the Terminate last) is in the socket: the connection ends (RFC 5040 §6.1).
    shutdown(s.fd, SHUT_RDWR);
    unwatch(s.fd);
    s.shut = true;
    did = true;
  }
  return did;
}

bool IwarpPath::receive(Qp& qp) {
  IwarpState& s = state(qp);
  if (s.shut) return false;
  bool did = false;
  if (s.hold_tx && s.hold_until_ns && now() >= s.hold_until_ns) {
    s.hold_tx = false;  // the grace is over: the requester runs in this pass
    did = true;
  }
  if (s.tx_hold_until_ns && now() >= s.tx_hold_until_ns) did = true;  // the RTR hold is over
  if (s.kicks && now() >= iwarp_kick_due(s) && !s.closing &&
      qp.state.load(std::memory_order_relaxed) == QpState::Rts) {
    // The peer has said nothing yet: a zero-length RDMA WRITE (STag 0, touches no memory) makes a
    // siw that missed our first bytes read its socket again.
    iw::DdpHeader h;
    h.last = true;
    h.tagged = true;
    h.opcode = iw::Opcode::Write;
    uint8_t hdr[iw::kMaxHeaderLen];
    iwarp_queue(qp, hdr, iw::encode_header(h, hdr), nullptr, 0);
    if (++s.kicks_sent == std::size(kIwarpRtrKickNs)) s.kicks = false;
    did = true;
  }
  if (!s.closing) did |= iwarp_receive(qp);
  // A QP in RTS writes from the requester (requester_run); one in error only finishes what is owed.
  if (s.closing || qp.state.load(std::memory_order_relaxed) != QpState::Rts) did |= iwarp_transmit(qp);
  return did;
}

void IwarpPath::iwarp_own_tx(Qp& qp) {
  for (IwarpTx& t : state(qp).tx) {
    if (!t.owned.empty() || t.sent == t.len) continue;
    std::vector<uint8_t> bytes;
    bytes.reserve(t.len - t.sent);
    size_t skip = t.sent;
    for (const iovec& v : t.iov) {
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      const auto* p = static_cast<const uint8_t*>(v.iov_base) + skip;
      bytes.insert(bytes.end(), p, p + (v.iov_len - skip));
      skip = 0;
    }
    t.owned = std::move(bytes);
    t.iov.assign(1, iovec{t.owned.data(), t.owned.size()});
    t.len = t.owned.size();
    t.sent = 0;
  }
}

void IwarpPath::iwarp_stop(Qp& qp) {
  IwarpState& s = state(qp);
  if (s.closing) return;
  // What is framed still goes out (the stream stays framed for the Terminate behind it), but from
  // copies: the SQ entries are flushed and their slots reused, the memory may be deregistered.
  iwarp_own_tx(qp);
  for (IwarpTx& t : s.tx) t.completes = false;
  s.closing = true;
  s.hold_tx = false;
  s.kicks = false;  // a QP in error kicks no peer: no deadline of its own is left but the RTR hold
  s.reads.clear();
  s.read_jobs.clear();
  if (!s.shut) rewatch(s.fd, s.want_out ? uint32_t{EPOLLOUT} : 0u);
}

void IwarpPath::iwarp_conn_lost(Qp& qp, bool reset) {
  IwarpState& s = state(qp);
  count(&qp, &core::Counters::iw_conn_lost);
  // An orderly close (the peer's rdma_disconnect) is no error of the QP's; a reset is.
  if (reset) raise(AsyncEvent{AsyncEventType::QpFatal, &qp, nullptr});
  if (qp.state.load(std::memory_order_relaxed) != QpState::Err) move_to_error(qp);
  iwarp_stop(qp);
  s.tx.clear();  // nobody reads them
  s.tx_hold_until_ns = 0;  // nor is anything held for anyone
}

void IwarpPath::release(Qp& qp) {
  IwarpState& s = state(qp);
  if (!s.shut) unwatch(s.fd);
  ::close(s.fd);
  qp.path.store(nullptr, std::memory_order_relaxed);
  qp.path_state.reset();
  --qps_;
}

uint64_t IwarpPath::next_deadline(const Qp& qp) const {
  // The holds and kicks are cleared when the stream ends (iwarp_stop, iwarp_conn_lost).
  const IwarpState& iw = state(qp);
  uint64_t d = 0;
  for (uint64_t t : {iw.hold_tx ? iw.hold_until_ns : uint64_t{0}, iw.tx_hold_until_ns,
                     iw.kicks ? iwarp_kick_due(iw) : uint64_t{0}})
    if (t && (!d || t < d)) d = t;
  return d;
}

void IwarpPath::forget_pointers_into(Qp& qp, uint64_t lo, uint64_t len) {
  IwarpState& s = state(qp);
  // Only when some queued FPDU points into the region: MR caches deregister often.
  const bool queued = std::any_of(s.tx.begin(), s.tx.end(), [&](const IwarpTx& t) {
    return std::any_of(t.iov.begin(), t.iov.end(), [&](const iovec& v) {
      const uint64_t b = reinterpret_cast<uintptr_t>(v.iov_base);
      return v.iov_len && b < lo + len && b + v.iov_len > lo;
    });
  });
  if (queued) iwarp_own_tx(qp);
  const bool reading = std::any_of(s.read_jobs.begin(), s.read_jobs.end(), [&](const IwarpReadJob& j) {
    const uint64_t src = reinterpret_cast<uintptr_t>(j.src);
    return j.remaining && src < lo + len && src + j.remaining > lo;
  });
  if (reading)
    iwarp_refuse(qp, {wire::iwarp::TermLayer::Rdmap, 1, 0, &core::Counters::iw_bad_stag, AsyncEventType::QpAccessErr});
}

}  // namespace softrdma::transport
