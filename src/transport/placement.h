// Where message bytes meet registered memory, written once for every path: a send WQE's data
// gathered out of its SGEs (RC, UC, UD requesters), a message placed into a receive WQE's SGEs (the
// RoCE and iWARP responders, UD, the direct path's inbox), and the CQE of a WQE that ends without
// data (errors, flushes). The Engine's receive-placement steps that use the key table and the receive
// queues are declared in engine.h and defined in placement.cpp.
#pragma once
#include <cstdint>

#include "core/cq.h"
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

}  // namespace softrdma::transport
