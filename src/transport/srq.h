// A shared receive queue (IBTA 10.2.9): one ring of receive WQEs that every QP attached to it consumes,
// whatever its transport service. Applications fill the ring under its producer lock; the engine
// consumes it under the engine lock, and the limit ("low watermark") state is only touched there.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/cq.h"
#include "transport/path.h"
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

struct DirectSrqDesc;  // transport/direct_layout.h

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

  // Taking WQEs (engine lock). Each taker claims the next index (claim_word); rq.tail is the oldest WQE
  // not yet taken, and moves past those taken out of order. Alone, the engine claims exactly at the tail.
  // With the direct path (DirectSrqDesc), initiators of this host claim WQEs through a shared claim
  // word and name them in their inbox entries: they leave the SRQ out of order.
  std::atomic<uint64_t> own_claim{0};
  std::atomic<uint64_t>* claim_word = &own_claim;
  DirectSrqDesc* direct = nullptr;  // published for initiators (DirectTarget::srq_created)
  std::vector<uint8_t> taken;       // per ring slot: its WQE, between tail and head, is taken already
  // How many WQEs between tail and head are taken (written by take(), before the tail): they are no
  // longer posted, so the application may post as many again. The ring has room for max_wr more
  // (SrqTable::create): an application that reposts for each CQE it polled must not find it full
  // while an earlier WQE, claimed by an initiator, waits for its message (ibv_post_srq_recv ENOMEM
  // was fatal to UCX).
  std::atomic<uint64_t> taken_ahead{0};
  // The next WQE for the engine's own responder, claimed; false when none is posted.
  bool claim(uint64_t* index);
  // Takes WQE index (claimed by us, or named by an initiator): false when it is not posted or is taken
  // already (a peer wrote nonsense).
  bool take(uint64_t index, RecvWqe* out);
  // The WQE named by the low 32 bits of its index, as an inbox entry names it (the WQEs an initiator
  // may claim lie between tail and head, fewer than 2^32 apart).
  uint64_t index_of(uint32_t low) const {
    const uint64_t t = rq.tail.load(std::memory_order_relaxed);
    return t + static_cast<uint32_t>(low - static_cast<uint32_t>(t));
  }
  // A WQE claimed for a message that will never be placed (its inbox dropped at reset, its initiator
  // gone): taken off the ring and kept in returned, which the engine's responder takes from first.
  void give_back(uint64_t index) {
    RecvWqe w;
    if (take(index, &w)) returned.push_back(w);
  }
  std::vector<RecvWqe> returned;
  // WQEs posted and not claimed: what the limit is compared with.
  uint64_t left() const;
};

// The context's shared receive queues (srq.cpp) and their tag matching (tag_matching.cpp): the verbs
// layer's SRQ calls, under the engine lock where they touch what the engine reads. Each returns 0 or
// an errno unless said otherwise.
class SrqTable : PathServices {
 public:
  explicit SrqTable(Engine& e) : PathServices(e) {}
  ~SrqTable();  // the engine's lock held: every SRQ left is freed
  // nullptr (errno set) on failure. An XRC SRQ has an XRC domain (xrcd != 0) and the CQ its receive
  // completions go to.
  Srq* create(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint32_t xrcd = 0,
              core::CompletionQueue* cq = nullptr);
  // Refused (EBUSY) while QPs are attached.
  int destroy(Srq* srq);
  int modify(Srq* srq, int mask, uint32_t max_wr, uint32_t limit);
  void query(Srq* srq, uint32_t& max_wr, uint32_t& max_sge, uint32_t& limit);
  int post_recv(Srq* srq, const RecvWqe* wqes, int n, int* bad);
  // Makes a new SRQ, before any QP attaches, an IBV_SRQT_TM one whose list operations and
  // tag-matching receives complete into cq.
  int enable_tag_matching(Srq* srq, uint32_t max_num_tags, core::CompletionQueue* cq);
  // One list operation (ADD sets op.handle); 0 or an errno (nothing done).
  int post_op(Srq* srq, tm::Op& op);
  const std::vector<Srq*>& list() const { return srqs_; }

  // The send-queue side of tag matching: an SQ entry at index completed (or was flushed) with status:
  // true when it was the engine's own (kTmRead, kTmFin), whose completion is a tag-matching CQE or
  // nothing, never an SQ CQE.
  bool tm_sq_done(Qp& qp, const SqEntry& e, uint64_t index, core::WcStatus status);
  // The QP's SQ is dropped without completions (reset, destroy): its rendezvous entries are released.
  void tm_drop_sq(Qp& qp);
  // The application's share of the SQ in use (under sq.producer_lock): the engine's own WQEs whose
  // slots are not given back yet do not count.
  static uint64_t tm_app_sq_used(Qp& qp, uint64_t head);

 private:
  // post_recv found the ring full: WQEs claimed by initiators and stranded are given back; true when
  // that freed slots.
  bool recover_claims(Srq& srq);
  std::vector<Srq*> srqs_;
  uint32_t next_srqn_ = 1;
};

}  // namespace softrdma::transport
