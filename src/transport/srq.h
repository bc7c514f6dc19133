// A shared receive queue (IBTA 10.2.9): one ring of receive WQEs that every QP attached to it consumes,
// whatever its transport service. Applications fill the ring under its producer lock; the engine
// consumes it under the engine lock, and the limit ("low watermark") state is only touched there.
#pragma once
#include <cstddef>
#include <cstdint>

#include "transport/qp.h"

namespace softrdma::transport {

// Bits of ibv_modify_srq's mask (numerically enum ibv_srq_attr_mask).
enum SrqModifyMask : int { kSrqModMaxWr = 1 << 0, kSrqModLimit = 1 << 1 };

struct Srq {
  void* user = nullptr;     // the verbs object (ibv_srq) that owns this SRQ, for async events
  uint32_t pd = 0;          // receive buffers are checked against the SRQ's PD, not the QP's
  uint32_t max_sge = 0;
  WorkQueue<RecvWqe> rq;    // its ring lives in the context's shared arena, as an RQ's does
  size_t rq_bytes = 0;
  // Armed when nonzero: the SRQ_LIMIT_REACHED event fires once when the WQEs left drop below it,
  // which disarms the limit (0) until ibv_modify_srq sets it again.
  uint32_t limit = 0;
  uint32_t qp_refs = 0;     // QPs attached (engine lock): destroy is refused while any remain
  uint32_t srqn = 0;        // its number (ibv_get_srq_num), unique in the context
  // An XRC SRQ (IBV_SRQT_XRC): its domain (nonzero) and the CQ its receive completions go to; the
  // XRC_RECV QPs of the domain deliver into it the messages whose XRCETH names srqn.
  uint32_t xrcd = 0;
  core::CompletionQueue* cq = nullptr;
};

}  // namespace softrdma::transport
