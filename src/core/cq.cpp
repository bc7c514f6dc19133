#include "core/cq.h"

#include <time.h>

#include <new>

namespace softrdma::core {

CompletionQueue::CompletionQueue(Arena& arena, uint32_t min_entries) : arena_(arena) {
  uint32_t cap = 1;
  while (cap < min_entries) cap <<= 1;
  mask_ = cap - 1;
  ring_bytes_ = sizeof(Ring) + sizeof(Cqe) * (cap - 1);
  void* mem = arena_.allocate(ring_bytes_);
  if (!mem) throw std::bad_alloc();
  ring_ = new (mem) Ring;
  ring_->head.store(0);
  ring_->tail.store(0);
  ring_->armed.store(kUnarmed);
}

CompletionQueue::~CompletionQueue() {
  ring_->~Ring();
  arena_.release(ring_, ring_bytes_);
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
  Cqe& slot = ring_->slots[head & mask_];
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
  int armed = ring_->armed.load(std::memory_order_acquire);
  bool fire = armed == kArmedAll || armed == kClaimed ||
              (armed == kArmedSolicited && (solicited || cqe.status != WcStatus::Success));
  if (fire && ring_->armed.compare_exchange_strong(armed, kUnarmed)) on_completion_(*this, armed == kClaimed);
  return true;
}

int CompletionQueue::poll(Cqe* out, int n) {
  if (empty() || n <= 0) return 0;
  std::lock_guard lock(consumer_lock_);
  uint64_t tail = ring_->tail.load(std::memory_order_relaxed);
  uint64_t head = ring_->head.load(std::memory_order_acquire);
  int got = 0;
  while (got < n && tail != head) out[got++] = ring_->slots[tail++ & mask_];
  ring_->tail.store(tail, std::memory_order_release);
  return got;
}

void CompletionQueue::arm(bool solicited_only) {
  int want = solicited_only ? kArmedSolicited : kArmedAll;
  int cur = ring_->armed.load();
  // Arming for all completions wins over a solicited-only arm that is still pending.
  while (cur < want && !ring_->armed.compare_exchange_weak(cur, want)) {
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
