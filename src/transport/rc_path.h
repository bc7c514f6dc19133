// The RoCE RC path (path.h): RC and XRC QPs over RoCEv2 packets through the engine's UDP ports. As in
// Linux rxe, three roles with their own state in the QP (Qp::req, Qp::comp, Qp::resp) do the work:
// the Requester turns send WQEs into request packets (requester.cpp), the Completer turns ACKs, NAKs
// and responses into CQEs and owns the retransmit timer (completer.cpp), and the Responder executes
// the peer's requests in named check stages (responder.cpp; its tag-matching stage in
// tag_matching.cpp, its XRC stage in srq.cpp). RcPath is the path object that puts them together.
// The RoCE UD/UC path (datagram.cpp) uses the Responder's stages too: UC places like RC.
#pragma once
#include <cstdint>
#include <vector>

#include "transport/direct.h"
#include "transport/path.h"
#include "transport/qp.h"
#include "transport/srq.h"
#include "wire/headers.h"
#include "wire/opcode.h"

namespace softrdma::transport {

class Requester : PathServices {
 public:
  explicit Requester(Engine& e) : PathServices(e) {}
  // The QP's WQEs to request packets, in order, within the PSN window and one pass's burst; true
  // when it did anything. now 0 (a post from the caller's thread): the clock is read where needed.
  bool requester_run(Qp& qp, uint64_t now_ns);
  // A WQE's length, keys and packet count checked and resolved; false: it fails (e.status).
  bool prepare_wqe(Qp& qp, SqEntry& e);
  // Bind MW and Local Invalidate, executed in order; false: it failed, the SQ is stopped.
  bool execute_local_wqe(Qp& qp, SqEntry& e);
  // Packet pkt_index of e (also a retransmission); synthetic: to the packet capture only, with that note.
  void send_request_packet(Qp& qp, SqEntry& e, uint64_t pkt_index, const char* synthetic = nullptr);
  // Packet capture: the request packets e would have been, for a WQE the direct path executed (their
  // PSNs from the next one, which they do not consume).
  void capture_direct(Qp& qp, SqEntry& e);
  void arm_retransmit_timer(Qp& qp, uint64_t now_ns);

 private:
  // requester_run's step: the packets of a started WQE.
  bool requester_send_packets(Qp& qp, SqEntry& e, uint64_t to_send, int& budget, uint64_t& now_ns);
};

class Completer : PathServices {
 public:
  explicit Completer(Engine& e) : PathServices(e) {}
  // An ACK, NAK, READ response or ATOMIC ACK for the QP (state already checked).
  void completer_receive(Qp& qp, const wire::Packet& pkt);
  // The retransmit timer: an expiry resends from the oldest unacknowledged request, or fails it when
  // the retries are spent.
  void check_timers(Qp& qp, uint64_t now_ns);
  void complete_in_order(Qp& qp);
  // e, the WQE at the SQ's send index, completes in error in order: the SQ stops before it, so
  // nothing after it is sent.
  void fail_in_order(Qp& qp, SqEntry& e) {
    e.acked = true;
    qp.req.sq_stop_at = qp.req.send_index;
    complete_in_order(qp);
  }
  void requester_error(Qp& qp, WcStatus status);

 private:
  // completer_receive's stages; false: the packet is consumed (dropped, or the QP's course is set).
  bool completer_check_psn(Qp& qp, const wire::Packet& pkt, const wire::OpcodeInfo& info);
  bool completer_check_ack(Qp& qp, const wire::Packet& pkt, uint64_t now_ns);
  void completer_rnr_nak(Qp& qp, const wire::Packet& pkt, uint64_t now_ns);
  void completer_nak(Qp& qp, const wire::Packet& pkt, uint64_t now_ns);
  bool completer_check_response(Qp& qp, const wire::Packet& pkt, const wire::OpcodeInfo& info);
  bool completer_read_response(Qp& qp, SqEntry& e, const wire::Packet& pkt, const wire::OpcodeInfo& info);
  // Completes e, the SQ's oldest WQE: advances the SQ tail, then posts its CQE (if any).
  void complete_sq_entry(Qp& qp, SqEntry& e, WcStatus status);
  // A NAK for a request the responder refused: that WQE, not the oldest one, takes status.
  void nak_error(Qp& qp, uint32_t psn, WcStatus status);
  void rewind_to(Qp& qp, uint32_t psn);
  void reissue_read(Qp& qp, SqEntry& e);
  // retry_cnt is spent: true (the budget refilled) when the peer's kernel vouches for its process,
  // which does not run, and SOFTRDMA_PEER_PAUSE_MS has not run out since the budget first ran out (docs/reliability.md).
  bool wait_for_paused_peer(Qp& qp, net::Liveness::Verdict peer, uint64_t now_ns);
  // What the peer's kernel and engine say of the QP's peer (RocePorts::peer_liveness).
  net::Liveness::Verdict ask_peer(const Qp& qp, uint64_t now_ns);
};

// A responder check stage's verdict. RC answers a refusal with a NAK (Responder::rc_refuse), UC drops
// the message silently (datagram.cpp).
struct Verdict {
  enum Kind : uint8_t { Ok, Rnr, InvalidRequest, RemoteAccess, RemoteOp };
  Kind kind = Ok;
  WcStatus status = WcStatus::Success;  // of the request; of the receive WQE when it had taken one
  bool ok() const { return kind == Ok; }
};

class Responder : PathServices {
 public:
  explicit Responder(Engine& e) : PathServices(e) {}
  // An RC request packet (state already checked): the stages below, in the order they run.
  void responder_receive(Qp& qp, const wire::Packet& pkt);
  // READ responses owed to the peer, a burst at a time; true when any was sent.
  bool responder_run_reads(Qp& qp);
  // The ACKs owed at the end of a progress pass, coalesced.
  void flush_owed_acks();
  // The QP leaves (reset, destroy): no ACK is owed for it any more.
  void forget(Qp& qp);

  // The stages UC shares with RC (datagram.cpp).
  // Opcode sequence (IBTA 9.8.3): a FIRST or ONLY opens a message, MIDDLE and LAST continue one of
  // the same kind.
  static bool opcode_in_sequence(const Qp& qp, const wire::OpcodeInfo& info);
  // Every packet of a multi-packet message but the last is exactly one path MTU (IBTA 9.7.4.1.x).
  static Verdict check_length(const Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt);
  // The receive WQE a SEND's first packet or a WRITE with immediate's last packet needs: taken and its
  // SGEs resolved (SEND), or present (WRITE).
  Verdict check_receive(Qp& qp, const wire::OpcodeInfo& info);
  Verdict execute_send(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt);
  // complete_receive false: the WRITE's data is placed but no receive WQE completes (UC, none posted).
  Verdict execute_write(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt, bool complete_receive);

 private:
  void nak_psn_gap(Qp& qp);
  void responder_duplicate(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt);
  void replay_response(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt);
  void regenerate_read(Qp& qp, const wire::Packet& pkt, const ReplayEntry& r, int32_t off);
  // Opcode sequence, the XRC target's SRQ, length, then the receive WQE (classified by its TMH on a
  // tag-matching SRQ).
  Verdict check_request(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt);
  // XRC_RECV (srq.cpp): the XRC SRQ a request's XRCETH names becomes the QP's receive queue, CQ and
  // PD for that request (IBTA 10.2.10); InvalidRequest when the domain has no such SRQ here.
  Verdict xrc_target_srq(Qp& qp, uint32_t srqn, const wire::OpcodeInfo& info);
  // tag_matching.cpp: the first packet of a SEND to a QP on a tag-matching SRQ, classified by its TMH
  // and given its destination (check_receive's part for such QPs); a rendezvous that matched.
  Verdict tm_classify(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt);
  Verdict tm_rendezvous(Qp& qp, tm::Tag& t, const wire::Packet& pkt, uint64_t tag, uint32_t priv);
  // An R_Key for len bytes at va with the access the request needs, through this QP (type 2 windows).
  Verdict check_rkey(Qp& qp, uint32_t rkey, uint64_t va, uint64_t len, uint32_t access, uint8_t** host);
  Verdict execute_read(Qp& qp, const wire::Packet& pkt);
  Verdict execute_atomic(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt);
  Verdict execute_atomic_write(Qp& qp, const wire::Packet& pkt);
  void rc_refuse(Qp& qp, const Verdict& v, uint32_t psn);
  // A SEND or WRITE packet executed: the next PSN is expected, and the ACK it asked for is owed.
  void responder_acknowledge(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt);
  // An ACK of everything up to psn is owed: sent by flush_owed_acks, coalesced with later ones.
  void owe_ack(Qp& qp, uint32_t psn);
  void responder_send_ack(Qp& qp, uint8_t syndrome, uint32_t psn);
  void send_atomic_ack(Qp& qp, uint32_t psn, uint64_t orig);
  void responder_fatal(Qp& qp, uint8_t nak_code, uint32_t psn, WcStatus recv_status);

  std::vector<Qp*> ack_owed_;
};

// The path object: RC and XRC QPs join it when they are created, and leave it for the iWARP path
// when attached to a TCP connection.
class RcPath final : public Path, PathServices {
 public:
  explicit RcPath(Engine& e) : PathServices(e), requester_(e), completer_(e), responder_(e) {}
  Requester& requester() { return requester_; }
  Completer& completer() { return completer_; }
  Responder& responder() { return responder_; }

  bool carries(const Qp& qp, const SendWqe& w) const override;
  bool transmit(Qp& qp, uint64_t now_ns) override;
  void deliver(Qp& qp, wire::Packet& pkt, const Arrival& from) override;
  void timers(Qp& qp, uint64_t now_ns) override { completer_.check_timers(qp, now_ns); }
  void batch_done() override { responder_.flush_owed_acks(); }
  uint64_t next_deadline(const Qp& qp) const override;
  void error(Qp& qp) override;
  void flush(Qp&) override {}
  void forget_pointers_into(Qp& qp, uint64_t lo, uint64_t len) override;
  void reset(Qp& qp) override;
  void release(Qp& qp) override;

 private:
  Requester requester_;
  Completer completer_;
  Responder responder_;
};

}  // namespace softrdma::transport
