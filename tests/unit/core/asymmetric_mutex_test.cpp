#include "core/asymmetric_mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace softrdma::core {
namespace {

// Mutual exclusion, and no lost wake-up: holders keep the lock long enough (a sleep inside) that the
// others go to sleep on it, and every one of them must come back, however releases and sleeps interleave.
TEST(AsymmetricMutex, ExcludesAndWakesEverySleeper) {
  AsymmetricMutex mu;
  uint64_t counter = 0;
  constexpr int kThreads = 4, kRounds = 400;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        std::lock_guard lock(mu);
        const uint64_t seen = counter;
        if ((i + t) % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        counter = seen + 1;
      }
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(counter, uint64_t{kThreads} * kRounds);
}

TEST(AsymmetricMutex, TryLockFailsWhileHeld) {
  AsymmetricMutex mu;
  ASSERT_TRUE(mu.try_lock());
  bool other = true;
  std::thread([&] { other = mu.try_lock(); }).join();
  EXPECT_FALSE(other);
  mu.unlock();
  std::thread([&] {
    other = mu.try_lock();
    if (other) mu.unlock();
  }).join();
  EXPECT_TRUE(other);
}

}  // namespace
}  // namespace softrdma::core
