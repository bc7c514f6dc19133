// The unreliable services (IBTA 9.8.x): UD datagrams with DETH and Q_Key checks, and UC messages with
// PSNs but no acknowledgements. Nothing is retransmitted: a send WQE completes once its packets are
// handed to the port, and a receiver drops what it cannot take (a whole UC message on any loss). The UC
// responder runs the RC responder's check stages (responder.cpp) with its own PSN rules and policy.
// This is the RoCE UD/UC path (DatagramPath, datagram_path.h).
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "net/registry.h"
#include "transport/datagram_path.h"
#include "transport/engine.h"
#include "transport/srq.h"
#include "transport/work_request.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace softrdma::transport {

namespace {
constexpr int kBurst = 64;           // packets one QP may send per progress pass
constexpr uint32_t kGrhLen = 40;     // the GRH area ahead of every UD message (IBTA 11.4.1.2)
constexpr uint32_t kQkeyUseQpOwn = 0x80000000u;  // a WR Q_Key with the high bit set: send the QP's own

// RoCEv2 (Annex A17.4.5.1): over IPv4 the GRH area holds 20 zero bytes, then the IPv4 header of the
// datagram as it arrived; over IPv6 it is the IPv6 header. A UDP socket does not see that header, so it
// is rebuilt from what is known: addresses, length, protocol UDP, TTL (hop limit) 64, and for IPv4 DF
// and a valid header checksum.
void build_grh(uint8_t* out, const wire::IpAddress& src, const wire::IpAddress& dst, uint32_t udp_payload_len) {
  std::memset(out, 0, kGrhLen);
  if (!src.is_v4()) {
    const uint32_t payload = 8 + udp_payload_len;
    out[0] = 0x60;
    out[4] = static_cast<uint8_t>(payload >> 8);
    out[5] = static_cast<uint8_t>(payload);
    out[6] = 17;
    out[7] = 64;
    std::memcpy(out + 8, src.bytes.data(), 16);
    std::memcpy(out + 24, dst.bytes.data(), 16);
    return;
  }
  const uint32_t src_ip_be = src.v4_be(), dst_ip_be = dst.v4_be();
  uint8_t* ip = out + 20;
  uint32_t total = 20 + 8 + udp_payload_len;
  ip[0] = 0x45;
  ip[2] = static_cast<uint8_t>(total >> 8);
  ip[3] = static_cast<uint8_t>(total);
  ip[6] = 0x40;  // don't fragment
  ip[8] = 64;
  ip[9] = 17;
  std::memcpy(ip + 12, &src_ip_be, 4);
  std::memcpy(ip + 16, &dst_ip_be, 4);
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += uint32_t{ip[i]} << 8 | ip[i + 1];
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  uint16_t csum = static_cast<uint16_t>(~sum);
  ip[10] = static_cast<uint8_t>(csum >> 8);
  ip[11] = static_cast<uint8_t>(csum);
}

}  // namespace

// One UD datagram for e (its only packet), to the WQE's destination; one above the MTU is counted and
// not sent.
void DatagramPath::ud_send(Qp& qp, SqEntry& e) {
  const SendWqe& w = e.wqe;
  if (w.length > qp.mtu) {
    // C10-93.1.1: a UD message above the port MTU emits no packet and raises no error.
    count(&qp, &core::Counters::ud_send_over_mtu);
  } else {
    wire::Packet pkt{};
    pkt.bth.opcode = work_request(w.op, QpType::Ud).opcodes.only;
    pkt.bth.psn = e.first_psn;
    pkt.bth.solicited = (w.flags & kSolicited) != 0;
    pkt.bth.dest_qp = w.ud_remote_qpn;
    pkt.imm_data_be = w.imm_be;
    pkt.deth.qkey = (w.ud_remote_qkey & kQkeyUseQpOwn) ? qp.qkey : w.ud_remote_qkey;
    pkt.deth.src_qp = qp.qpn;
    uint8_t scratch[4096];
    const uint8_t* payload = scratch;
    uint32_t len = static_cast<uint32_t>(w.length);
    if (len && !(w.flags & kInline) && w.num_sge == 1)
      payload = e.host[0];
    else
      gather_send(e, 0, scratch, len);
    // A QP of a process on this host is reached at that process's port; others (and groups) at 4791.
    uint16_t port = wire::kRoceUdpPort;
    if (!w.ud_dest_ip.is_multicast()) {
      auto ep = net::Registry::instance().lookup(w.ud_remote_qpn);
      if (ep && ep->ip_key == w.ud_dest_ip.key()) port = ep->port;
    }
    send_packet_to(qp, pkt, payload, len, w.ud_dest_ip, port);
  }
}

bool DatagramPath::carries(const Qp& qp, const SendWqe& w) const {
  return work_request(w.op, qp.cfg.type).allowed && (qp.cfg.type != QpType::Ud || w.ud_dest_ip.is_set());
}

void DatagramPath::deliver(Qp& qp, wire::Packet& pkt, const Arrival& from) {
  // UD and UC receive in RTR and later; they never see acknowledgements.
  const QpState st = qp.state.load(std::memory_order_relaxed);
  if (st != QpState::Rtr && st != QpState::Rts && st != QpState::Sqd && st != QpState::Sqe) {
    count(&qp, &core::Counters::drop_bad_state);
    return;
  }
  if (qp.cfg.type == QpType::Ud)
    datagram_receive(qp, pkt, from);
  else
    uc_receive(qp, pkt);
}

bool DatagramPath::transmit(Qp& qp, uint64_t) {
  bool did = false;
  int budget = kBurst;
  const bool ud = qp.cfg.type == QpType::Ud;
  uint64_t head = qp.sq.head.load(std::memory_order_acquire);
  while (budget > 0 && qp.req.send_index < std::min(head, qp.req.sq_stop_at)) {
    SqEntry& e = qp.sq.at(qp.req.send_index);
    if (!e.started && work_request(e.wqe.op, qp.cfg.type).local) {
      // Bind MW, Local Invalidate (UC): executed in order, as on RC.
      did = true;
      if (!requester().execute_local_wqe(qp, e)) return true;
      continue;
    }
    if (!e.started) {
      if (!requester().prepare_wqe(qp, e)) {
        e.started = true;
        completer().fail_in_order(qp, e);
        return true;
      }
      e.started = true;
      if (ud) e.npkts = 1;
      e.first_psn = qp.req.next_psn;
      qp.req.next_psn = wire::psn_add(qp.req.next_psn, e.npkts);
      qp.req.send_offset_pkts = 0;
    }
    if (e.status != WcStatus::Success) {
      // Its memory was deregistered between two passes: it completes in error.
      completer().fail_in_order(qp, e);
      return true;
    }
    if (ud) {
      ud_send(qp, e);
      --budget;
    } else {
      while (qp.req.send_offset_pkts < e.npkts && budget > 0) {
        requester().send_request_packet(qp, e, qp.req.send_offset_pkts);
        ++qp.req.send_offset_pkts;
        --budget;
      }
      if (qp.req.send_offset_pkts < e.npkts) {
        did = true;
        break;
      }
    }
    // Unacknowledged service: the WQE is done once its last packet is on its way.
    e.acked = true;
    ++qp.req.send_index;
    qp.req.send_offset_pkts = 0;
    did = true;
    completer().complete_in_order(qp);
  }
  return did;
}

void DatagramPath::datagram_receive(Qp& qp, const wire::Packet& pkt, const Arrival& from) {
  // A datagram whose Q_Key differs from the QP's is silently dropped (IBTA 10.2.4, Q_Keys).
  if (pkt.deth.qkey != qp.qkey) {
    count(&qp, &core::Counters::ud_drop_qkey);
    return;
  }
  if (!placement().next_recv_wqe(qp)) {
    // No receive WQE: UD has no RNR, the datagram is lost.
    count(&qp, &core::Counters::ud_drop_no_recv);
    return;
  }
  RecvWqe& w = placement().take_recv_wqe(qp);
  const wire::OpcodeInfo& info = wire::opcode_info(pkt.bth.opcode);
  // The message is the GRH area, then the payload.
  uint8_t grh[kGrhLen];
  build_grh(grh, from.peer_ip, from.local_ip, from.len);
  const WcStatus st = placement().place_message(w, receive_pd(qp), {{grh, kGrhLen}, {pkt.payload, pkt.payload_len}});
  core::Cqe c = wqe_cqe(qp.qpn, w.wr_id, st, core::WcOpcode::Recv);
  if (c.status == WcStatus::Success) {
    c.byte_len = kGrhLen + pkt.payload_len;
    c.src_qp = pkt.deth.src_qp;
    c.wc_flags = core::kWcGrh;
    c.sl = from.peer_ip.is_v4() ? core::kRoceSlIpv4 : core::kRoceSlIpv6;
    if (info.headers & wire::kHdrImm) {
      c.wc_flags |= core::kWcWithImm;
      c.imm_or_inv = pkt.imm_data_be;
    }
  }
  placement().finish_recv(qp, c, qp.cfg.recv_cq, pkt.bth.solicited);
  // A local error on the receive side (buffer too small or not writable) leaves the QP in error.
  if (c.status != WcStatus::Success) move_to_error(qp);
}

namespace {
// Forgets the UC message in progress: its receive WQE is not consumed but serves the next message (an
// RQ WQE stays at the RQ's tail; one taken off an SRQ stays held by the QP, recv_active), and a
// WRITE's remaining packets are ignored (what they would have written stays as it is).
void uc_abandon(Qp& qp) {
  qp.resp.in_message = false;
  if (!qp.srq) qp.resp.recv_active = false;
  qp.resp.recv_offset = 0;
  qp.resp.write_dst = nullptr;
  qp.resp.write_remaining = 0;
}
}  // namespace

// UC has no NAK: a refused message is dropped whole and silently, and the QP stays up; only a local
// error on the receive WQE it took completes that WQE in error and leaves the QP in error (as on UD).
// UC has no RNR either: a SEND finds no receive WQE and is dropped, a WRITE with immediate places its
// data and only its completion is lost.
void DatagramPath::uc_refuse(Qp& qp, const Verdict& v, const wire::OpcodeInfo& info) {
  if (v.kind == Verdict::Rnr) count(&qp, &core::Counters::ud_drop_no_recv);
  if (v.status == WcStatus::LocProtErr || v.status == WcStatus::LocLenErr) {
    placement().fail_recv(qp, v.status, qp.cfg.recv_cq);
    uc_abandon(qp);
    move_to_error(qp);
    return;
  }
  // Drops the rest of this message (this packet included).
  uc_abandon(qp);
  qp.resp.uc_dropping = !info.last;
  count(&qp, &core::Counters::uc_msg_dropped);
}

void DatagramPath::uc_receive(Qp& qp, const wire::Packet& pkt) {
  const wire::OpcodeInfo& info = wire::opcode_info(pkt.bth.opcode);
  int32_t d = wire::psn_diff(pkt.bth.psn, qp.resp.epsn);
  if (d < 0) {
    // Older than expected: a duplicate or a straggler of a message already given up.
    count(&qp, &core::Counters::duplicates);
    return;
  }
  qp.resp.epsn = wire::psn_add(pkt.bth.psn, 1);
  bool continues = !info.first;
  if (d != 0 || qp.resp.uc_dropping || !Responder::opcode_in_sequence(qp, info)) {
    // UC (IBTA 9.8): a lost packet loses the message it belongs to; a FIRST or ONLY starts clean.
    if (d > 0) count(&qp, &core::Counters::out_of_sequence);
    bool counted = false;
    if (qp.resp.in_message) {
      uc_abandon(qp);
      count(&qp, &core::Counters::uc_msg_dropped);
      counted = true;
    }
    if (continues) {
      if (!qp.resp.uc_dropping && !counted) count(&qp, &core::Counters::uc_msg_dropped);
      qp.resp.uc_dropping = true;
      return;
    }
    qp.resp.uc_dropping = false;
  }
  Verdict v = Responder::check_length(qp, info, pkt);
  if (v.ok() && info.kind != wire::OpKind::Send && info.kind != wire::OpKind::Write) {
    count(&qp, &core::Counters::drop_bad_opcode);
    return;
  }
  bool no_receive = false;  // a WRITE with immediate and no receive WQE: placed, not completed
  if (v.ok()) {
    v = responder().check_receive(qp, info);
    if (v.kind == Verdict::Rnr && info.kind == wire::OpKind::Write) {
      v = {};
      no_receive = true;
    }
  }
  if (v.ok())
    v = info.kind == wire::OpKind::Send ? responder().execute_send(qp, info, pkt)
                                         : responder().execute_write(qp, info, pkt, !no_receive);
  if (!v.ok()) {
    uc_refuse(qp, v, info);
    return;
  }
  if (no_receive && info.last) count(&qp, &core::Counters::ud_drop_no_recv);
  qp.resp.last_opcode = pkt.bth.opcode;
  qp.resp.in_message = !info.last;
}

}  // namespace softrdma::transport
