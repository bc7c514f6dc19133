// Requester (IBTA 9.5, 9.7.2): turns send-queue WQEs into request packets with consecutive PSNs,
// segmenting by path MTU, honouring fences, the READ/ATOMIC credit (max_rd_atomic) and a PSN window.
#include <algorithm>
#include <cstring>

#include "transport/engine.h"
#include "transport/rc_path.h"
#include "transport/work_request.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace softrdma::transport {

namespace {
// An acknowledgement is requested at the end of every message and every this many packets (the
// congestion window's floor, kMinCwnd, relies on it).
constexpr uint32_t kAckReqInterval = 32;
static_assert(kMinCwnd >= kAckReqInterval);
// Packets one QP may send per progress pass, so that one big message does not starve the others.
constexpr int kBurst = 64;

}  // namespace

// Bind MW and Local Invalidate act on this side's key table when the requester reaches them, so a
// request posted after them on this QP already sees their effect; they use no PSN and complete in
// order with the requests around them (IBTA 10.6.7.2, 10.7.2.x). A failed one completes in error in
// order and stops the SQ: the result says whether sending goes on.
bool Requester::execute_local_wqe(Qp& qp, SqEntry& e) {
  e.started = true;
  e.acked = true;
  e.npkts = 0;
  e.first_psn = qp.req.next_psn;
  if (e.wqe.op == WrOp::BindMw) {
    uint32_t rkey = 0;
    e.status = keys().bind_window(e.wqe.bind, qp.cfg.pd, qp.qpn, &rkey) ? WcStatus::Success : WcStatus::MwBindErr;
  } else {
    e.status = keys().invalidate(e.wqe.imm_be, qp.cfg.pd, qp.qpn, false) ? WcStatus::Success : WcStatus::LocQpOpErr;
  }
  const bool ok = e.status == WcStatus::Success;
  if (!ok) qp.req.sq_stop_at = qp.req.send_index;
  ++qp.req.send_index;
  qp.req.send_offset_pkts = 0;
  completer().complete_in_order(qp);  // e is not touched after this
  return ok;
}

bool Requester::prepare_wqe(Qp& qp, SqEntry& e) {
  const SendWqe& w = e.wqe;
  const WorkRequest wr = work_request(w.op, qp.cfg.type);
  e.npkts = wr.atomic ? 1 : wire::packets_for(w.length, qp.mtu);
  if (w.length > core::DeviceLimits::kMaxMsgSize) {
    e.status = WcStatus::LocLenErr;
    return false;
  }
  if ((wr.atomic || wr.atomic_write) && w.length != 8) {
    e.status = WcStatus::LocLenErr;
    return false;
  }
  if (w.flags & kInline) return true;
  // The HCA writes READ and ATOMIC results into the gather list: those SGEs need LOCAL_WRITE (an ATOMIC
  // WRITE only reads its 8 bytes from there).
  bool write = wr.read || wr.atomic;
  for (uint32_t i = 0; i < w.num_sge; ++i) {
    if (keys().check_local(w.sge[i].lkey, qp.cfg.pd, w.sge[i].addr, w.sge[i].length, write, &e.host[i]) !=
        core::AccessResult::Ok) {
      e.status = WcStatus::LocProtErr;
      return false;
    }
  }
  return true;
}

void Requester::capture_direct(Qp& qp, SqEntry& e) {
  static constexpr char kNote[] =
      "softrdma direct path: executed through shared memory, no packet sent; synthetic frame (its PSN is "
      "not consumed)";
  e.first_psn = qp.req.next_psn;
  const uint64_t n = work_request(e.wqe.op, qp.cfg.type).read_or_atomic() ? 1 : e.npkts;  // requests only
  for (uint64_t i = 0; i < n; ++i) send_request_packet(qp, e, i, kNote);
}

void Requester::send_request_packet(Qp& qp, SqEntry& e, uint64_t idx, const char* synthetic) {
  const SendWqe& w = e.wqe;
  const RequestOpcodes opcodes = work_request(w.op, qp.cfg.type).opcodes;  // UC: its own class
  wire::Packet pkt{};
  pkt.bth.psn = wire::psn_add(e.first_psn, static_cast<uint32_t>(idx));
  pkt.xrc_srqn = w.xrc_srqn;  // XRC_SEND: every request packet names the remote SRQ
  uint8_t scratch[4096];
  const uint8_t* payload = nullptr;
  uint32_t len = 0;
  bool last = true;
  switch (w.op) {
    case WrOp::Read:
      // A re-issued READ asks only for what has not arrived yet, at that part's PSN (IBTA 9.7.4.1.4).
      pkt.bth.opcode = opcodes.only;
      pkt.reth = {w.remote_addr + idx * qp.mtu, w.rkey, static_cast<uint32_t>(w.length - idx * qp.mtu)};
      if (w.length == 0) pkt.reth.dma_len = 0;
      break;
    case WrOp::CompareSwap:
    case WrOp::FetchAdd:
      pkt.bth.opcode = opcodes.only;
      pkt.atomic = {w.remote_addr, w.rkey, w.op == WrOp::CompareSwap ? w.swap : w.compare_add,
                    w.op == WrOp::CompareSwap ? w.compare_add : 0};
      break;
    default: {
      bool first = idx == 0;
      last = idx + 1 == e.npkts;
      uint64_t off = idx * qp.mtu;
      len = static_cast<uint32_t>(std::min<uint64_t>(qp.mtu, w.length - std::min(off, w.length)));
      pkt.bth.opcode = opcodes.at(first, last);
      if (first && (w.op == WrOp::Write || w.op == WrOp::WriteImm || w.op == WrOp::AtomicWrite))
        pkt.reth = {w.remote_addr, w.rkey, static_cast<uint32_t>(w.length)};
      if (last) {
        pkt.imm_data_be = w.imm_be;
        pkt.ieth_rkey = w.imm_be;
        pkt.bth.solicited = (w.flags & kSolicited) != 0;
      }
      if (len) {
        // One SGE covering the packet: send straight from registered memory.
        if (!(w.flags & kInline) && w.num_sge == 1) {
          payload = e.host[0] + off;
        } else {
          gather_send(e, off, scratch, len);
          payload = scratch;
        }
      }
    }
  }
  pkt.bth.ack_req = last || (idx % kAckReqInterval) == kAckReqInterval - 1;
  if (qp.cfg.type == QpType::Uc) pkt.bth.ack_req = false;  // nothing is acknowledged
  send_packet(qp, pkt, payload, len, synthetic);
}

void Requester::arm_retransmit_timer(Qp& qp, uint64_t now) {
  uint64_t us = wire::ack_timeout_us(qp.timeout);
  qp.comp.timer_deadline_ns = us ? now + us * 1000 : 0;
}

// e's request packets from the send offset up to to_send, within the PSN window and the pass's budget;
// the retransmit timer is armed with the first (now read from the clock if still 0). True: one was sent.
bool Requester::requester_send_packets(Qp& qp, SqEntry& e, uint64_t to_send, int& budget, uint64_t& now) {
  bool did = false;
  while (qp.req.send_offset_pkts < to_send && budget > 0) {
    uint32_t psn = wire::psn_add(e.first_psn, static_cast<uint32_t>(qp.req.send_offset_pkts));
    if (wire::psn_diff(psn, qp.comp.acked_psn) >= static_cast<int32_t>(qp.req.cwnd)) break;
    send_request_packet(qp, e, qp.req.send_offset_pkts);
    ++qp.req.send_offset_pkts;
    --budget;
    did = true;
    if (!qp.comp.timer_deadline_ns) {
      if (!now) now = this->now();
      arm_retransmit_timer(qp, now);
    }
  }
  return did;
}

bool Requester::requester_run(Qp& qp, uint64_t now) {
  // now 0 (a post from the caller's thread): the clock is read only where a timer needs it.
  if (qp.comp.rnr_resume_ns) {
    if (!now) now = this->now();
    if (now < qp.comp.rnr_resume_ns) return false;
    qp.comp.rnr_resume_ns = 0;
  }
  bool did = false;
  int budget = kBurst;
  const uint64_t head = std::min(qp.sq.head.load(std::memory_order_acquire), qp.req.sq_stop_at);
  while (budget > 0 && qp.req.send_index < head) {
    SqEntry& e = qp.sq.at(qp.req.send_index);
    const WorkRequest wr = work_request(e.wqe.op, qp.cfg.type);
    if (e.started && e.acked && e.status == WcStatus::Success) {
      // Rewound past a request that is already acknowledged: nothing of it needs resending.
      ++qp.req.send_index;
      qp.req.send_offset_pkts = 0;
      continue;
    }
    if (!e.started) {
      // A fenced WQE waits until every earlier WQE (and so every READ/ATOMIC) has completed.
      if ((e.wqe.flags & kFence) && qp.sq.tail.load(std::memory_order_relaxed) != qp.req.send_index) break;
      if (wr.read_or_atomic() && qp.req.reads_outstanding >= qp.max_rd_atomic) break;
      if (wr.local) {
        did = true;
        if (!execute_local_wqe(qp, e)) return true;
        continue;
      }
      if (!prepare_wqe(qp, e)) {
        // Reported in order by the completer; nothing after it is sent.
        e.started = true;
        completer().fail_in_order(qp, e);
        return true;
      }
      if (wire::psn_diff(qp.req.next_psn, qp.comp.acked_psn) >= static_cast<int32_t>(qp.req.cwnd)) break;
      e.first_psn = qp.req.next_psn;
      qp.req.next_psn = wire::psn_add(qp.req.next_psn, e.npkts);
      e.started = true;
      qp.req.send_offset_pkts = 0;
      if (wr.read_or_atomic()) ++qp.req.reads_outstanding;
    }
    if (e.status != WcStatus::Success) {
      // Its memory was deregistered while it was in flight: it completes in error, in order.
      completer().fail_in_order(qp, e);
      return true;
    }
    // READ and ATOMIC are one request packet however many PSNs their responses use.
    uint64_t to_send = wr.read ? qp.req.send_offset_pkts + 1 : wr.atomic ? 1 : e.npkts;
    if (requester_send_packets(qp, e, to_send, budget, now)) did = true;
    if (qp.req.send_offset_pkts < to_send) break;
    ++qp.req.send_index;
    qp.req.send_offset_pkts = 0;
  }
  return did;
}

}  // namespace softrdma::transport
