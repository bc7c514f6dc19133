#include "core/cq.h"

#include <time.h>

#include <cerrno>

#include <new>

namespace softrdma::core {

uint32_t CompletionQueue::round_up(uint32_t n) {
  uint32_t cap = 1;
  while (cap < n) cap <<= 1;
  return cap;
}

CompletionQueue::CompletionQueue(Arena& arena, uint32_t min_entries, std::shared_ptr<Arena> arm_arena)
    : arena_(arena) {
  const uint32_t cap = round_up(min_entries);
  mask_ = cap - 1;
  void* mem = arena_.allocate(sizeof(Ring));
  if (!mem) throw std::bad_alloc();
  slots_ = static_cast<Cqe*>(arena_.allocate(sizeof(Cqe) * cap));
  if (!slots_) {
    arena_.release(mem, sizeof(Ring));
    throw std::bad_alloc();
  }
  ring_ = new (mem) Ring;
  ring_->head.store(0);
  ring_->tail.store(0);
  armed_ = &ring_->armed;
  if (arm_arena) {
    if (void* w = arm_arena->allocate(64)) {  // a line of its own
      armed_ = new (w) std::atomic<int>(kUnarmed);
      arm_arena_ = std::move(arm_arena);
    }
  }
  armed_->store(kUnarmed);
}

CompletionQueue::~CompletionQueue() {
  arena_.release(slots_, sizeof(Cqe) * capacity());
  if (arm_arena_) arm_arena_->release(armed_, 64);
  ring_->~Ring();
  arena_.release(ring_, sizeof(Ring));
}

int CompletionQueue::resize(uint32_t min_entries) {
  const uint32_t cap = round_up(min_entries);
  std::lock_guard lock(consumer_lock_);
  const uint64_t tail = ring_->tail.load(std::memory_order_relaxed);
  const uint64_t head = ring_->head.load(std::memory_order_acquire);
  if (head - tail > min_entries) return EINVAL;  // below what it holds (ibv_resize_cq(3))
  if (cap == capacity()) return 0;
  auto* fresh = static_cast<Cqe*>(arena_.allocate(sizeof(Cqe) * cap));
  if (!fresh) return ENOMEM;
  // The indices keep counting: each CQE present moves to the slot its index names in the new ring.
  for (uint64_t i = tail; i != head; ++i) fresh[i & (cap - 1)] = slots_[i & mask_];
  arena_.release(slots_, sizeof(Cqe) * capacity());
  slots_ = fresh;
  mask_ = cap - 1;
  return 0;
}

void CompletionQueue::discard_qp(uint32_t qpn, bool keep_receives) {
  std::lock_guard lock(consumer_lock_);
  const uint64_t tail = ring_->tail.load(std::memory_order_relaxed);
  const uint64_t head = ring_->head.load(std::memory_order_acquire);
  // Packed towards head, which the producer owns and which stays; tail moves up past the gap.
  uint64_t to = head;
  for (uint64_t from = head; from != tail;) {
    --from;
    const Cqe& c = slots_[from & mask_];
    if (c.qp_num == qpn && !(keep_receives && c.opcode >= WcOpcode::Recv)) continue;
    --to;
    if (to != from) slots_[to & mask_] = slots_[from & mask_];
  }
  ring_->tail.store(to, std::memory_order_release);
}

uint64_t CompletionQueue::clock_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

bool CompletionQueue::push(const Cqe& cqe, bool solicited) {
  if (overrun_.load(std::memory_order_relaxed)) return false;
  uint64_t head = ring_->head.load(std::memory_order_relaxed);
  if (head - ring_->tail.load(std::memory_order_acquire) > mask_) {
    overrun_.store(true, std::memory_order_release);
    if (on_overrun_) on_overrun_(*this);
    return false;
  }
  Cqe& slot = slots_[head & mask_];
  slot = cqe;
  // Taken here, by the ring's only producer: timestamps are nondecreasing in completion order.
  if (timestamps_) slot.timestamp_ns = clock_ns();
  ring_->head.store(head + 1, std::memory_order_release);
  // Without a completion channel an arm raises nothing: no need for the fence below.
  if (!on_completion_) return true;
  // Store head, then load armed; arm() stores armed, then the consumer loads head. Without a full fence
  // on both sides each can miss the other's store (x86 reorders a store with a later load): the CQE
  // would sit in the ring with no event raised and a consumer blocked in ibv_get_cq_event forever.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  int armed = armed_->load(std::memory_order_acquire);
  bool fire = armed == kArmedAll || armed == kClaimed ||
              (armed == kArmedSolicited && (solicited || cqe.status != WcStatus::Success));
  if (fire && armed_->compare_exchange_strong(armed, kUnarmed)) on_completion_(*this, armed == kClaimed);
  return true;
}

int CompletionQueue::poll(Cqe* out, int n) {
  if (empty() || n <= 0) return 0;
  std::lock_guard lock(consumer_lock_);
  uint64_t tail = ring_->tail.load(std::memory_order_relaxed);
  uint64_t head = ring_->head.load(std::memory_order_acquire);
  int got = 0;
  while (got < n && tail != head) out[got++] = slots_[tail++ & mask_];
  ring_->tail.store(tail, std::memory_order_release);
  return got;
}

void CompletionQueue::arm(bool solicited_only) {
  int want = solicited_only ? kArmedSolicited : kArmedAll;
  int cur = armed_->load();
  // Arming for all completions wins over a solicited-only arm that is still pending.
  while (cur < want && !armed_->compare_exchange_weak(cur, want)) {
  }
  // Pairs with the fence in push(): the poll that follows an arm sees every CQE pushed before the
  // producer could see the arm.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

uint32_t CompletionQueue::outstanding() const {
  return static_cast<uint32_t>(ring_->head.load(std::memory_order_acquire) -
                               ring_->tail.load(std::memory_order_acquire));
}

}  // namespace softrdma::core
