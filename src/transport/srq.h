// A shared receive queue (IBTA 10.2.9): one ring of receive WQEs that every QP attached to it consumes,
// whatever its transport service. Applications fill the ring under its producer lock; the engine
// consumes it under the engine lock, and the limit ("low watermark") state is only touched there.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "transport/qp.h"

namespace softrdma::transport {

// Bits of ibv_modify_srq's mask (numerically enum ibv_srq_attr_mask).
enum SrqModifyMask : int { kSrqModMaxWr = 1 << 0, kSrqModLimit = 1 << 1 };

// Tag matching (ibv_create_srq_ex(3) "Tag matching", ibv_post_srq_ops(3)): the SRQ's matching list of
// tagged buffers, filled by list operations and consumed by the responder in posting order.
namespace tm {
inline constexpr uint32_t kMaxNumTags = 255;     // tm_caps.max_num_tags
inline constexpr uint32_t kMaxOps = 1024;        // tm_caps.max_ops
inline constexpr uint32_t kMaxSge = 4;           // tm_caps.max_sge
inline constexpr uint32_t kMaxRndvHdrSize = 64;  // tm_caps.max_rndv_hdr_size
inline constexpr uint32_t kTmhBytes = 16;        // struct ibv_tmh
inline constexpr uint32_t kRvhBytes = 16;        // struct ibv_rvh
// TMH opcodes (enum ibv_tmh_op) and list operations (enum ibv_ops_wr_opcode, ibv_ops_flags).
enum TmhOp : uint8_t { kNoTag = 0, kRndv = 1, kFin = 2, kEager = 3 };
enum OpCode : uint32_t { kAdd = 0, kDel = 1, kSync = 2 };
enum OpFlags : uint32_t { kOpSignaled = 1, kOpSync = 2 };
// Rendezvous READs and their FIN SENDs a QP may have in its SQ at once, beyond what it was created with.
inline constexpr uint32_t kSqSlots = 32;

struct Tag {
  bool used = false;
  bool busy = false;        // consumed by a rendezvous whose READ is still under way
  uint64_t seq = 0;         // posting order
  uint64_t tag = 0, mask = 0, recv_wr_id = 0;
  uint32_t num_sge = 0;
  uint64_t length = 0;
  Sge sge[kMaxSge] = {};
};

struct Op {
  OpCode opcode = kAdd;
  uint32_t flags = 0;
  uint64_t wr_id = 0;
  uint32_t unexpected_cnt = 0;
  uint32_t handle = 0;     // DEL: the entry
  uint64_t tag = 0, mask = 0, recv_wr_id = 0;
  uint32_t num_sge = 0;
  uint64_t length = 0;
  Sge sge[kMaxSge] = {};
};

struct State {
  core::CompletionQueue* cq = nullptr;  // list-operation and tag-matching receive completions
  uint32_t max_num_tags = 0;
  std::vector<Tag> tags;                // handle = index
  uint64_t next_seq = 1;
  // Phase synchronisation: messages deemed unexpected, and how many of them software said it handled
  // (IBV_OPS_TM_SYNC). Matching is off while they differ.
  uint32_t hw_unexpected = 0;
  uint32_t sw_unexpected = 0;
  bool in_sync() const { return hw_unexpected == sw_unexpected; }
};
}  // namespace tm

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
  std::unique_ptr<tm::State> tm;  // IBV_SRQT_TM: its matching list (engine lock)
};

}  // namespace softrdma::transport
