// A lock for the short critical sections of the data path (a queue's producer or consumer index):
// taking it is one atomic exchange and releasing it a plain store, where a std::mutex pays an atomic
// operation for each. A waiter yields the CPU, since its holder may share the core.
#pragma once
#include <sched.h>

#include <atomic>

namespace softrdma::core {

class SpinLock {
 public:
  void lock() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed)) sched_yield();
    }
  }
  bool try_lock() { return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace softrdma::core
