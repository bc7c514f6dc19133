// A mutex whose release is a plain store. The engine lock is taken and released for every WQE posted
// on the intra-host direct path, where a std::mutex costs an atomic read-modify-write each way (~6 ns
// apiece here, a quarter of such a post). Releasing without one would lose a wake-up (the releaser's
// look at the sleepers can pass its store), so a thread about to sleep on the lock pays for the fence the
// releaser skips, with membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED): after it, either the release is
// visible to the sleeper, or the releaser's later look sees the sleeper. Where membarrier cannot serve,
// releases fence as a mutex's do.
#pragma once
#include <atomic>
#include <cstdint>

namespace softrdma::core {

class AsymmetricMutex {
 public:
  bool try_lock() {
    uint32_t free = 0;
    return word_.load(std::memory_order_relaxed) == 0 &&
           word_.compare_exchange_strong(free, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void lock() {
    if (!try_lock()) lock_slow();
  }
  void unlock() {
    word_.store(0, std::memory_order_release);
    if (kReleaseUnfenced)
      std::atomic_signal_fence(std::memory_order_seq_cst);  // a sleeper's membarrier is the fence
    else
      std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_relaxed)) wake();
  }

  // This process is registered for MEMBARRIER_CMD_PRIVATE_EXPEDITED (set once, when the library loads).
  static const bool kReleaseUnfenced;

 private:
  void lock_slow();
  void wake();
  std::atomic<uint32_t> word_{0};  // 1: held
  std::atomic<uint32_t> sleepers_{0};
};

}  // namespace softrdma::core
