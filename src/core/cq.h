// Completion queue (IBTA 11.4.2): a ring of CQEs in the context's shared arena. One producer (the
// owning engine, under its lock) and consumers serialised by a small lock; producer and consumer
// indices are atomics so polling an empty CQ costs two loads.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "core/arena.h"
#include "core/spin_lock.h"

namespace softrdma::core {

// Numerically identical to enum ibv_wc_status / ibv_wc_opcode / ibv_wc_flags (checked in verbs/).
enum class WcStatus : uint8_t {
  Success = 0, LocLenErr, LocQpOpErr, LocEecOpErr, LocProtErr, WrFlushErr, MwBindErr, BadRespErr,
  LocAccessErr, RemInvReqErr, RemAccessErr, RemOpErr, RetryExcErr, RnrRetryExcErr, LocRddViolErr,
  RemInvRdReqErr, RemAbortErr, InvEecnErr, InvEecStateErr, FatalErr, RespTimeoutErr, GeneralErr,
  TmErr, TmRndvIncomplete,
};
enum class WcOpcode : uint8_t {
  Send = 0, RdmaWrite = 1, RdmaRead = 2, CompSwap = 3, FetchAdd = 4, BindMw = 5, LocalInv = 6, AtomicWrite = 9,
  Recv = 128, RecvRdmaWithImm = 129,
  TmAdd = 130, TmDel = 131, TmSync = 132, TmRecv = 133, TmNoTag = 134,  // tag-matching SRQs
};
enum WcFlags : uint32_t {
  kWcGrh = 1, kWcWithImm = 2, kWcIpCsumOk = 4, kWcWithInv = 8,
  kWcTmSyncReq = 16, kWcTmMatch = 32, kWcTmDataValid = 64,
};
// What a UD receive over RoCE reports as its SL: the L3 header type of the packet, as ConnectX NICs do
// (bits 2:0; UCX reads it to find the destination address in the GRH area). RoCE v2 over IPv4: 2,
// over IPv6: 1.
constexpr uint8_t kRoceSlIpv4 = 2;
constexpr uint8_t kRoceSlIpv6 = 1;

struct Cqe {
  uint64_t wr_id;
  WcStatus status;
  WcOpcode opcode;
  uint8_t sl;  // receive CQEs of UD QPs: kRoceSlIpv4 or kRoceSlIpv6; 0 otherwise
  uint32_t wc_flags;
  uint32_t vendor_err;
  uint32_t byte_len;
  uint32_t imm_or_inv;  // immediate data (network order) or invalidated rkey
  uint32_t qp_num;
  uint32_t src_qp;
  // Tag-matching receive CQEs with kWcTmMatch: the message's app_ctx and tag (its TMH), host order.
  uint32_t tm_priv;
  uint64_t timestamp_ns;  // CompletionQueue::clock_ns() when written, on CQs with timestamps enabled
  // Send-queue CQEs: which SQ slots polling this CQE gives back to the application (transport::SqCredit).
  // sq_ref = 0 for receive CQEs, else the QP's credit slot + 1 | its generation << 16; sq_index = the
  // low 32 bits of the WQE's SQ index.
  uint32_t sq_ref;
  uint32_t sq_index;
  uint64_t tm_tag;
};
static_assert(sizeof(Cqe) == 64, "one cache line per CQE");

class CompletionQueue {
 public:
  // Raised when a CQE is added to an armed CQ (IBTA 11.4.2.2), and on overrun.
  using NotifyFn = std::function<void(CompletionQueue&)>;
  // The completion event; woken: an intra-host initiator claimed this event (the arm word's kClaimed)
  // and has already written the channel's wake-up byte for it, so the event must not write another.
  using EventFn = std::function<void(CompletionQueue&, bool woken)>;
  // The arm word's values. kClaimed: an intra-host initiator that left a message for the armed CQ
  // took the arm and woke the channel's waiter (wake_fd); the next CQE raises the event, byte-less.
  static constexpr int kUnarmed = 0, kArmedSolicited = 1, kArmedAll = 2, kClaimed = 3;

  // arm_arena: where the arm word lives when it is not in the ring (the intra-host direct path's
  // peer-writable area, transport/direct.h: peers may write the arm word, never the ring).
  CompletionQueue(Arena& arena, uint32_t min_entries, std::shared_ptr<Arena> arm_arena = nullptr);
  ~CompletionQueue();

  uint32_t capacity() const { return mask_ + 1; }
  void* user = nullptr;  // the verbs object that owns this CQ (for events)

  // Producer side (engine). Returns false on overrun: the CQE is lost and the CQ is in error.
  bool push(const Cqe& cqe, bool solicited);
  // Consumer side: up to n CQEs, oldest first.
  int poll(Cqe* out, int n);
  bool empty() const {
    return ring_->head.load(std::memory_order_acquire) == ring_->tail.load(std::memory_order_relaxed);
  }

  // ibv_req_notify_cq: the next CQE (or the next solicited/error CQE) raises an event.
  void arm(bool solicited_only);
  void set_notify(EventFn completion, NotifyFn overrun) {
    on_completion_ = std::move(completion);
    on_overrun_ = std::move(overrun);
  }
  bool in_error() const { return overrun_.load(std::memory_order_acquire); }
  // The arm state, nonzero while armed, in the arena: an intra-host peer that leaves work for this
  // context reads it to know whether to wake it (transport/direct.h).
  const std::atomic<int>* arm_word() const { return armed_; }
  const Arena* arm_arena() const { return arm_arena_.get(); }
  // Whether an arm can raise anything: the CQ has a completion channel (fixed at creation).
  bool notifies() const { return static_cast<bool>(on_completion_); }
  // The write end of that channel's wake-up pipe (-1: none): an intra-host initiator that leaves a
  // message for this armed CQ writes a byte there, which wakes the thread waiting on the channel at
  // once (it places the message itself), instead of waking this context's progress thread first.
  void set_wake_fd(int fd) { wake_fd_ = fd; }
  int wake_fd() const { return wake_fd_; }
  // ibv_create_cq_ex with completion timestamps: each CQE is stamped as it is written. Called before any
  // QP completes into this CQ.
  void enable_timestamps() { timestamps_ = true; }
  // The device clock behind completion timestamps and ibv_query_rt_values_ex: CLOCK_MONOTONIC in ns,
  // i.e. a 1 GHz counter that never jumps.
  static uint64_t clock_ns();
  uint32_t outstanding() const;   // CQEs present, for resize checks
  // ibv_resize_cq: a ring of at least min_entries slots (rounded up to a power of two) that keeps the
  // CQEs present, in order. EINVAL when more than min_entries are present, ENOMEM when the arena has no room (the CQ
  // is unchanged then). The caller holds off the producer (the engine's lock); consumers are held off
  // here. The ring's indices and arm word stay where they are: intra-host peers hold the arm word's
  // offset (transport/direct.h), so only the slots move.
  int resize(uint32_t min_entries);
  // Removes the CQEs of QP qpn that are still in the ring (its receive CQEs too unless
  // keep_receives), keeping the others in order: a QP moved to RESET. Same caller rules as resize.
  void discard_qp(uint32_t qpn, bool keep_receives);

 private:
  struct Ring {
    std::atomic<uint64_t> head;  // next slot the producer fills
    alignas(64) std::atomic<uint64_t> tail;  // next slot a consumer takes
    alignas(64) std::atomic<int> armed;
  };
  static uint32_t round_up(uint32_t n);

  Arena& arena_;
  int wake_fd_ = -1;
  Ring* ring_;
  std::shared_ptr<Arena> arm_arena_;  // kept alive as long as the word in it
  std::atomic<int>* armed_ = nullptr;  // &ring_->armed, or a word in arm_arena_
  Cqe* slots_;
  uint32_t mask_;
  SpinLock consumer_lock_;
  std::atomic<bool> overrun_{false};
  bool timestamps_ = false;
  EventFn on_completion_;
  NotifyFn on_overrun_;
};

}  // namespace softrdma::core
