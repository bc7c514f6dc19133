// Where message bytes meet registered memory, written once for every path: a send WQE's data
// gathered out of its SGEs (RC, UC, UD requesters), a message placed into a receive WQE's SGEs (the
// RoCE and iWARP responders, UD, the direct path's inbox), and the CQE of a WQE that ends without
// data (errors, flushes). Placement is the engine's part that takes receive WQEs off a QP's RQ or
// SRQ and places messages into them with the key table: the one receive step of every path (RoCE
// RC/UC, iWARP, UD, the direct inbox; raw frames resolve their WQE alike), reached through
// PathServices.
#pragma once
#include <cstdint>

#include "core/cq.h"
#include "transport/path.h"
#include "transport/qp.h"
#include "transport/srq.h"

namespace softrdma::transport {

// Copies [off, off + len) of a send WQE's data (inline, or gathered from its resolved SGEs) to dst. A
// WQE whose memory was deregistered is stopped before it is sent, so every piece is mapped.
void gather_send(const SqEntry& e, uint64_t off, uint8_t* dst, uint32_t len);

// Writes src into a receive WQE's resolved SGEs at message offset off; false when a piece's memory
// is gone (deregistered while the message arrived).
bool scatter_recv(const RecvWqe& w, uint8_t* const* host, uint64_t off, const uint8_t* src, uint64_t len);

// A run of bytes of a message placed whole (placement of UD datagrams and direct-path SENDs).
struct Bytes {
  const uint8_t* data;
  uint64_t len;
};

// The protection domain a QP's receive buffers belong to: an SRQ's buffers are in the SRQ's PD
// (IBTA 10.2.9).
inline uint32_t receive_pd(const Qp& qp) { return qp.srq ? qp.srq->pd : qp.cfg.pd; }

// The CQE of a WQE that completes without data: an error, a flush, or a send WQE's completion before
// its length is known.
inline core::Cqe wqe_cqe(uint32_t qp_num, uint64_t wr_id, WcStatus status, core::WcOpcode opcode) {
  core::Cqe c{};
  c.wr_id = wr_id;
  c.status = status;
  c.opcode = opcode;
  c.qp_num = qp_num;
  return c;
}

class Placement : PathServices {
 public:
  explicit Placement(Engine& e) : PathServices(e) {}
  // The receive WQE a message fills, from the QP's RQ or its SRQ alike (any QP type).
  RecvWqe* next_recv_wqe(Qp& qp);    // the WQE the next message would take; nullptr when none is posted
  RecvWqe& take_recv_wqe(Qp& qp);    // a message starts on next_recv_wqe() (which took an SRQ's WQE)
  // The SRQ WQE an initiator of this host claimed for the message it left in qp's inbox (the low 32
  // bits of its index), taken; nullptr when that is no WQE it could have claimed.
  RecvWqe* take_claimed_srq_wqe(Qp& qp, uint32_t index_low);
  RecvWqe& active_recv_wqe(Qp& qp);  // the WQE taken by the message in progress
  // The QP leaves error, reset or destruction with an SRQ WQE claimed for a message that never started
  // (next_recv_wqe before a WRITE_WITH_IMM's checks): it is still the SRQ's, not flushed.
  void give_back_srq_claim(Qp& qp);
  void retire_recv_wqe(Qp& qp);      // that message is complete (or failed): an RQ WQE leaves the RQ
  // After a flush of a QP attached to an SRQ: IBV_EVENT_QP_LAST_WQE_REACHED, once per error.
  void report_last_wqe(Qp& qp);
  // A receive WQE's buffers for a message of need bytes: LOC_LEN_ERR when they are too short,
  // LOC_PROT_ERR when an SGE fails its key check (pd, LOCAL_WRITE), else Success with each SGE's host
  // pointer in host[].
  WcStatus resolve_recv_sges(const RecvWqe& w, uint32_t pd, uint64_t need, uint8_t** host) const;
  // A whole message (UD, the direct path) into w: its SGEs resolved for the pieces' total length, the
  // pieces copied one after another from offset 0. The status of resolve_recv_sges.
  WcStatus place_message(const RecvWqe& w, uint32_t pd, std::initializer_list<Bytes> pieces) const;
  // A message placed in pieces (RC, UC, iWARP, tag matching): the active WQE's SGEs resolved into
  // qp.resp.recv_host (LOC_PROT_ERR or Success).
  WcStatus resolve_active_recv(Qp& qp);
  // A message starts on the next receive WQE (the caller saw one): taken, at offset 0, SGEs resolved.
  WcStatus open_recv_message(Qp& qp);
  // len bytes of the message in progress at its offset: LOC_LEN_ERR past the WQE's length,
  // LOC_PROT_ERR when its memory was deregistered, else Success and the offset moves on.
  WcStatus place_recv(Qp& qp, const uint8_t* src, uint64_t len);
  // The message in progress completes with c into cq: its WQE is retired. fail_recv: in error, status.
  void finish_recv(Qp& qp, const core::Cqe& c, core::CompletionQueue* cq, bool solicited);
  void fail_recv(Qp& qp, WcStatus status, core::CompletionQueue* cq);
  // A receive ring of max(max_wr, 1) WQEs in the context's arena (QP RQ, SRQ, WQ), with its size in
  // *bytes for the release; false (errno ENOMEM) when the arena is full.
  bool alloc_recv_ring(WorkQueue<RecvWqe>& q, uint32_t max_wr, size_t* bytes, uint32_t ring_depth = 0);

 private:
  // SRQ WQE index (claimed) into qp.resp.srq_wqe, held; nullptr when it cannot be taken.
  RecvWqe* take_srq_wqe(Qp& qp, uint64_t index);
  void check_srq_limit(Srq& srq);
};

}  // namespace softrdma::transport
