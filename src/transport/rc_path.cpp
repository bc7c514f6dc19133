// The RoCE RC path's entry points (rc_path.h): what the engine calls for an RC or XRC QP, handed to
// the requester, completer or responder.
#include <algorithm>

#include "transport/engine.h"
#include "transport/rc_path.h"
#include "transport/work_request.h"

namespace softrdma::transport {

bool RcPath::carries(const Qp& qp, const SendWqe& w) const {
  // XRC carries the RC operations up to SEND with invalidate (opcodes 0xA0..0xB7): no ATOMIC WRITE.
  if (w.op == WrOp::AtomicWrite && qp.cfg.xrc != XrcRole::None) return false;
  return work_request(w.op, qp.cfg.type).allowed;
}

bool RcPath::transmit(Qp& qp, uint64_t now_ns) {
  // READ responses owed to the peer first: they answer requests older than anything we send now.
  const bool did = responder_.responder_run_reads(qp);
  return requester_.requester_run(qp, now_ns) || did;
}

void RcPath::deliver(Qp& qp, wire::Packet& pkt, const Arrival& from) {
  const wire::IpAddress& peer_ip = from.peer_ip;
  const uint16_t peer_port = from.peer_port;
  if (qp.cfg.xrc != XrcRole::None) {
    // From here on an XRC packet is handled as the RC one it carries (its XRCETH is in pkt). An
    // initiator only takes responses, a target only requests: each has one direction of RC.
    pkt.bth.opcode = wire::rc_of_xrc(pkt.bth.opcode);
    const wire::OpKind k = wire::opcode_info(pkt.bth.opcode).kind;
    const bool response = k == wire::OpKind::Ack || k == wire::OpKind::AtomicAck || k == wire::OpKind::ReadResponse;
    if (response != (qp.cfg.xrc == XrcRole::Send)) {
      count(&qp, &core::Counters::drop_bad_opcode);
      return;
    }
  }
  if (qp.dest_port == wire::kRoceUdpPort && peer_ip == qp.dest_ip && net::UdpPort::is_context_port(peer_port)) {
    // The peer is a softrdma context on another host (RoCE stacks send from 0xC000 up): from now on it
    // is reached at its own port, not through the 4791 holder of its host (docs/architecture.md), and
    // our packets to it may travel segmented.
    qp.dest_port = peer_port;
    count(&qp, &core::Counters::peer_port_learned);
  }
  const QpState st = qp.state.load(std::memory_order_relaxed);
  switch (wire::opcode_info(pkt.bth.opcode).kind) {
    case wire::OpKind::Ack:
    case wire::OpKind::AtomicAck:
    case wire::OpKind::ReadResponse:
      if (st != QpState::Rts && st != QpState::Sqd) {
        count(&qp, &core::Counters::drop_bad_state);
        return;
      }
      completer_.completer_receive(qp, pkt);
      break;
    default:
      if (st != QpState::Rtr && st != QpState::Rts && st != QpState::Sqd) {
        count(&qp, &core::Counters::drop_bad_state);
        return;
      }
      responder_.responder_receive(qp, pkt);
      break;
  }
}

uint64_t RcPath::next_deadline(const Qp& qp) const {
  const uint64_t a = qp.comp.timer_deadline_ns, b = qp.comp.rnr_resume_ns;
  return a && b ? std::min(a, b) : a | b;
}

void RcPath::error(Qp& qp) {
  qp.comp.timer_deadline_ns = 0;
  qp.resp.read_jobs.clear();
}

void RcPath::forget_pointers_into(Qp& qp, uint64_t lo, uint64_t len) {
  auto inside = [&](const uint8_t* p) { return p && reinterpret_cast<uintptr_t>(p) - lo < len; };
  if (qp.resp.write_remaining && inside(qp.resp.write_dst)) qp.resp.write_dst = nullptr;
  std::erase_if(qp.resp.read_jobs, [&](const ReadResponseJob& j) {
    const uint64_t src = reinterpret_cast<uintptr_t>(j.src);
    return j.kind == ReadResponseJob::Kind::Read && j.remaining && src < lo + len && src + j.remaining > lo;
  });
}

void RcPath::reset(Qp& qp) { responder_.forget(qp); }

void RcPath::release(Qp& qp) { responder_.forget(qp); }

}  // namespace softrdma::transport
