// Cross-core cache-line ping-pong between CPU 0 and CPU 1: prints the round trip in ns. The host moves
// this VM's vCPUs between a near (~60 ns) and a far (~330 ns) placement, which moves every
// shared-memory figure 2-4x (../shared/reference/peer-performance.md): bench/direct.sh prints it
// before and after its run so that a table can be judged.
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {
alignas(64) std::atomic<long> ball{0};

void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}
}  // namespace

int main(int argc, char** argv) {
  const long rounds = argc > 1 ? std::atol(argv[1]) : 200000;
  std::thread other([&] {
    pin(1);
    for (long i = 0; i < rounds; ++i) {
      while (ball.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      ball.store(2 * i + 2, std::memory_order_release);
    }
  });
  pin(0);
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < rounds; ++i) {
    ball.store(2 * i + 1, std::memory_order_release);
    while (ball.load(std::memory_order_acquire) != 2 * i + 2) {
    }
  }
  auto t1 = std::chrono::steady_clock::now();
  other.join();
  std::printf("%.1f\n", std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(rounds));
  return 0;
}
