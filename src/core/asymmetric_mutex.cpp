#include "core/asymmetric_mutex.h"

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace softrdma::core {

namespace {
long membarrier(int cmd) { return syscall(__NR_membarrier, cmd, 0, 0); }

bool register_private_expedited() {
  const long cmds = membarrier(MEMBARRIER_CMD_QUERY);
  return cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
         membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}
}  // namespace

// Before any lock exists (dynamic initialisation at load, one thread): false means fenced releases.
const bool AsymmetricMutex::kReleaseUnfenced = register_private_expedited();

void AsymmetricMutex::lock_slow() {
  // The holder is most likely short and may share this core: let it run a few times before sleeping.
  for (int i = 0; i < 16; ++i) {
    sched_yield();
    if (try_lock()) return;
  }
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  for (;;) {
    // A membarrier refused now (a forked child is no longer registered) may let a release pass us
    // unseen: then the sleep is bounded, and the lock looked at again.
    const bool fenced = !kReleaseUnfenced || membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
    if (try_lock()) break;
    timespec bound{0, 1000000};
    syscall(SYS_futex, &word_, FUTEX_WAIT_PRIVATE, 1, fenced ? nullptr : &bound, nullptr, 0);
  }
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
}

void AsymmetricMutex::wake() { syscall(SYS_futex, &word_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0); }

}  // namespace softrdma::core
