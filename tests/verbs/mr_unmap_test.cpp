// Registered memory that the application unmaps or replaces before deregistering it: legal with any
// verbs provider (a NIC only unpins the pages), and UCX's registration cache does it at cleanup. The
// deregistration must succeed and leave whatever is mapped at that address now untouched.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "helpers.h"

namespace softrdma::verbs_test {
namespace {

constexpr size_t kLen = 256 * 1024;

// Over each path: how a context registers memory depends on it (with the direct path, registration
// moves anonymous pages onto a memfd of softrdma's and deregistration moves them back).
class MrUnmapBase : public RcPair {
 protected:
  ibv_pd* pd = nullptr;
  void SetUp() override {
    RcPair::SetUp();
    if (HasFatalFailure()) return;
    pd = ibv_alloc_pd(dev.ctx);
    ASSERT_NE(pd, nullptr);
  }
  void TearDown() override {
    if (pd) ibv_dealloc_pd(pd);
    pd = nullptr;
    RcPair::TearDown();
  }
  static uint8_t* map(void* at, int flags) {
    void* p = mmap(at, kLen, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
};
using MrUnmap = OverPaths<MrUnmapBase>;

TEST_P(MrUnmap, DeregisterAfterUnmapAndGuard) {
  uint8_t* a = map(nullptr, MAP_PRIVATE);
  ASSERT_NE(a, nullptr);
  fill_pattern(a, kLen, 1);
  ibv_mr* mr = ibv_reg_mr(pd, a, kLen, kAllAccess);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  ASSERT_EQ(munmap(a, kLen), 0);
  // An inaccessible reservation there now, as allocators leave (a read of it faults), and a hole.
  void* guard = mmap(a, kLen / 2, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(guard, a) << strerror(errno);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  munmap(guard, kLen / 2);
  // The device still registers memory afterwards.
  Buffer b(4096);
  EXPECT_TRUE(b.reg(pd, kAllAccess));
}

TEST_P(MrUnmap, DeregisterAfterReplaceLeavesTheNewMapping) {
  uint8_t* a = map(nullptr, MAP_PRIVATE);
  ASSERT_NE(a, nullptr);
  fill_pattern(a, kLen, 2);
  ibv_mr* old_mr = ibv_reg_mr(pd, a, kLen, kAllAccess);
  ASSERT_NE(old_mr, nullptr) << strerror(errno);
  ASSERT_EQ(munmap(a, kLen), 0);
  // New shared memory at the same address, registered too.
  uint8_t* b = map(a, MAP_SHARED);
  if (!b) {
    ibv_dereg_mr(old_mr);
    GTEST_SKIP() << "could not map again at the same address";
  }
  ASSERT_EQ(b, a);
  fill_pattern(b, kLen, 3);
  ibv_mr* new_mr = ibv_reg_mr(pd, b, kLen, kAllAccess);
  ASSERT_NE(new_mr, nullptr) << strerror(errno);

  EXPECT_EQ(ibv_dereg_mr(old_mr), 0);
  EXPECT_EQ(check_pattern(b, kLen, 3), kLen) << "contents of the new mapping";
  // Still shared: a child's write is seen here.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::memset(b + 4096, 0x7e, 64);
    _exit(0);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  EXPECT_EQ(b[4096], 0x7e) << "the new mapping is no longer MAP_SHARED";
  EXPECT_EQ(b[4096 + 63], 0x7e);
  EXPECT_EQ(ibv_dereg_mr(new_mr), 0);
  munmap(b, kLen);
}

VT_INSTANTIATE_PATHS(MrUnmap, VT_ALL_PATHS);

}  // namespace
}  // namespace softrdma::verbs_test
