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

WcStatus Engine::resolve_recv_sges(const RecvWqe& w, uint32_t pd, uint64_t need, uint8_t** host) const {
  if (need > w.length) return WcStatus::LocLenErr;
  for (uint32_t i = 0; i < w.num_sge; ++i)
    if (mrs_.check_local(w.sge[i].lkey, pd, w.sge[i].addr, w.sge[i].length, true, &host[i]) !=
        core::AccessResult::Ok)
      return WcStatus::LocProtErr;
  return WcStatus::Success;
}

WcStatus Engine::place_message(const RecvWqe& w, uint32_t pd, std::initializer_list<Bytes> pieces) const {
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

WcStatus Engine::resolve_active_recv(Qp& qp) {
  // need 0: a message in pieces is checked against the WQE's length as each piece is placed.
  return resolve_recv_sges(active_recv_wqe(qp), receive_pd(qp), 0, qp.resp.recv_host);
}

WcStatus Engine::open_recv_message(Qp& qp) {
  // A message given up (UC, SRQ) left its WQE active: it serves this one.
  if (!qp.resp.recv_active) {
    take_recv_wqe(qp);
    qp.resp.recv_active = true;
  }
  qp.resp.recv_offset = 0;
  return resolve_active_recv(qp);
}

WcStatus Engine::place_recv(Qp& qp, const uint8_t* src, uint64_t len) {
  const RecvWqe& w = active_recv_wqe(qp);
  if (qp.resp.recv_offset + len > w.length) return WcStatus::LocLenErr;
  // The receive buffer's MR was deregistered while this message arrived.
  if (!scatter_recv(w, qp.resp.recv_host, qp.resp.recv_offset, src, len)) return WcStatus::LocProtErr;
  qp.resp.recv_offset += len;
  return WcStatus::Success;
}

void Engine::finish_recv(Qp& qp, const core::Cqe& c, core::CompletionQueue* cq, bool solicited) {
  retire_recv_wqe(qp);
  qp.resp.recv_active = false;
  post_cqe(cq, c, solicited);
}

void Engine::fail_recv(Qp& qp, WcStatus status, core::CompletionQueue* cq) {
  finish_recv(qp, wqe_cqe(qp.qpn, active_recv_wqe(qp).wr_id, status, core::WcOpcode::Recv), cq, false);
}

}  // namespace softrdma::transport
