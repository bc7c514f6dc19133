// The MR key table against a reference map, through heavy register/deregister churn: every live
// region is found under its own keys (and only under the right kind of key), every removed one is
// gone, and access checks follow PD, bounds and permissions.
#include "core/mr.h"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <random>
#include <vector>

namespace softrdma::core {
namespace {

TEST(MrTable, ChurnKeepsEveryLiveKeyAndForgetsRemovedOnes) {
  Arena arena(64 << 20);
  MrTable table(arena);
  std::mt19937 rng(7);
  std::vector<MrRegion> live;
  std::vector<MrRegion> removed;
  for (int step = 0; step < 300000; ++step) {
    // Grow to the table's full MR count, then churn there: the highest load, the longest probe chains.
    bool add = live.size() < MrTable::kMaxMr && (live.size() < MrTable::kMaxMr - 100 || rng() % 2);
    if (add) {
      MrRegion r{0x10000ull * (step + 1), 0x10000ull * (step + 1), 4096, kLocalWrite | kRemoteRead, 1, 0, 0};
      ASSERT_TRUE(table.add(r));
      live.push_back(r);
    } else {
      size_t i = rng() % live.size();
      table.remove(live[i]);
      if (removed.size() < 1000) removed.push_back(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
  }
  ASSERT_EQ(table.count(), live.size());
  uint8_t* host = nullptr;
  for (const MrRegion& r : live) {
    ASSERT_EQ(table.check_local(r.lkey, 1, r.iova, 4096, true, &host), AccessResult::Ok);
    ASSERT_EQ(host, reinterpret_cast<uint8_t*>(r.addr));
    ASSERT_EQ(table.check_remote(r.rkey, 1, r.iova + 100, 8, kRemoteRead, &host), AccessResult::Ok);
    ASSERT_EQ(host, reinterpret_cast<uint8_t*>(r.addr + 100));
    // An lkey is not an rkey (and the reverse), unless the random keys happen to collide.
    if (r.lkey != r.rkey) {
      EXPECT_EQ(table.check_remote(r.lkey, 1, r.iova, 8, kRemoteRead, &host), AccessResult::BadKey);
    }
  }
  std::map<uint32_t, int> live_keys;
  for (const MrRegion& r : live) live_keys[r.lkey] = live_keys[r.rkey] = 1;
  for (const MrRegion& r : removed) {
    if (!live_keys.count(r.lkey)) {
      EXPECT_EQ(table.check_local(r.lkey, 1, r.iova, 1, false, &host), AccessResult::BadKey);
    }
    if (!live_keys.count(r.rkey)) {
      EXPECT_EQ(table.check_remote(r.rkey, 1, r.iova, 1, kRemoteRead, &host), AccessResult::BadKey);
    }
  }
}

// Keys are capabilities: they come from the kernel's CSPRNG, not from a generator state in the
// process. A forked child that registers (and deregisters) a region gets other keys than its parent
// registering the same region next; a seeded PRNG, or any user-space pool, would hand both the same.
// And a thousand registrations give a thousand distinct keys with no fixed step between them.
TEST(MrTable, KeysComeFromTheKernelNotFromProcessState) {
  Arena arena(64 << 20);
  MrTable table(arena);
  MrRegion warm{0x10000, 0x10000, 4096, kRemoteWrite, 1, 0, 0};
  ASSERT_TRUE(table.add(warm));
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    MrRegion r{0x20000, 0x20000, 4096, kRemoteWrite, 1, 0, 0};
    uint32_t k[2] = {0, 0};
    if (table.add(r)) {
      k[0] = r.lkey;
      k[1] = r.rkey;
      table.remove(r);  // the arena is shared with the parent: leave its table as it was
    }
    _exit(write(fds[1], k, sizeof k) == sizeof k ? 0 : 1);
  }
  uint32_t child[2] = {0, 0};
  ASSERT_EQ(read(fds[0], child, sizeof child), static_cast<ssize_t>(sizeof child));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(fds[0]);
  close(fds[1]);
  ASSERT_NE(child[1], 0u);
  MrRegion r{0x20000, 0x20000, 4096, kRemoteWrite, 1, 0, 0};
  ASSERT_TRUE(table.add(r));
  EXPECT_NE(r.rkey, child[1]) << "the parent drew the rkey its child drew";
  EXPECT_NE(r.lkey, child[0]) << "the parent drew the lkey its child drew";

  std::map<uint32_t, int> seen;
  std::map<uint32_t, int> steps;
  uint32_t prev = r.rkey;
  for (int i = 0; i < 1000; ++i) {
    MrRegion m{0x100000ull * (i + 1), 0x100000ull * (i + 1), 4096, kRemoteWrite, 1, 0, 0};
    ASSERT_TRUE(table.add(m));
    EXPECT_NE(m.rkey, 0u);
    ++seen[m.rkey];
    ++seen[m.lkey];
    ++steps[m.rkey - prev];
    prev = m.rkey;
    uint8_t* host = nullptr;
    ASSERT_EQ(table.check_remote(m.rkey, 1, m.iova, 8, kRemoteWrite, &host), AccessResult::Ok);
  }
  EXPECT_EQ(seen.size(), 2000u) << "keys repeat";
  EXPECT_GT(steps.size(), 990u) << "keys follow each other at a fixed step";
}

TEST(MrTable, AccessChecks) {
  Arena arena(64 << 20);
  MrTable table(arena);
  MrRegion r{0x7000'0000'0000ull, 0x1000, 8192, kLocalWrite | kRemoteWrite, 3, 0, 0};
  ASSERT_TRUE(table.add(r));
  uint8_t* host = nullptr;
  EXPECT_EQ(table.check_remote(r.rkey, 3, 0x1000, 8192, kRemoteWrite, &host), AccessResult::Ok);
  EXPECT_EQ(table.check_remote(r.rkey, 4, 0x1000, 8, kRemoteWrite, &host), AccessResult::BadPd);
  EXPECT_EQ(table.check_remote(r.rkey, 3, 0x1000, 8193, kRemoteWrite, &host), AccessResult::OutOfRange);
  EXPECT_EQ(table.check_remote(r.rkey, 3, 0xFFF, 8, kRemoteWrite, &host), AccessResult::OutOfRange);
  EXPECT_EQ(table.check_remote(r.rkey, 3, 0x1000 + 8192, 1, kRemoteWrite, &host), AccessResult::OutOfRange);
  EXPECT_EQ(table.check_remote(r.rkey, 3, ~0ull - 4, 8, kRemoteWrite, &host), AccessResult::OutOfRange)
      << "va + len wraps";
  EXPECT_EQ(table.check_remote(r.rkey, 3, 0x1000, 8, kRemoteRead, &host), AccessResult::NoPermission);
  EXPECT_EQ(table.check_local(r.lkey, 3, 0x1000, 8, true, &host), AccessResult::Ok);
  table.remove(r);
  EXPECT_EQ(table.check_remote(r.rkey, 3, 0x1000, 8, kRemoteWrite, &host), AccessResult::BadKey);
  EXPECT_EQ(table.count(), 0u);
}

// On-demand regions: the pages a check covers are faulted in, and a check over memory that is not
// mapped, or not writable for a write, fails instead of handing out a pointer that would fault.
TEST(MrTable, OnDemandChecksFaultInOrFail) {
  Arena arena(64 << 20);
  MrTable table(arena);
  constexpr uint64_t kPage = 4096;
  auto* mem = static_cast<uint8_t*>(mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(mem, MAP_FAILED);
  ASSERT_EQ(mprotect(mem + kPage, kPage, PROT_READ), 0);  // page 1: read-only
  ASSERT_EQ(munmap(mem + 2 * kPage, kPage), 0);          // page 2: a hole
  const auto base = reinterpret_cast<uint64_t>(mem);
  MrRegion implicit{0, 0, ~uint64_t{0}, kLocalWrite | kRemoteWrite | kRemoteRead | kOnDemand, 1, 0, 0, 0};
  MrRegion pinned{base, base, 4 * kPage, kLocalWrite | kRemoteWrite | kRemoteRead, 1, 0, 0, 0};
  ASSERT_TRUE(table.add(implicit));
  ASSERT_TRUE(table.add(pinned));
  uint8_t* host = nullptr;
  EXPECT_EQ(table.check_remote(implicit.rkey, 1, base, kPage, kRemoteWrite, &host), AccessResult::Ok);
  EXPECT_EQ(host, mem);
  EXPECT_EQ(table.check_remote(implicit.rkey, 1, base + kPage, 8, kRemoteRead, &host), AccessResult::Ok);
  EXPECT_EQ(table.check_remote(implicit.rkey, 1, base + kPage, 8, kRemoteWrite, &host), AccessResult::NotMapped);
  EXPECT_EQ(table.check_local(implicit.lkey, 1, base + kPage, 8, false, &host), AccessResult::Ok);
  EXPECT_EQ(table.check_local(implicit.lkey, 1, base + kPage, 8, true, &host), AccessResult::NotMapped);
  EXPECT_EQ(table.check_remote(implicit.rkey, 1, base + 2 * kPage - 4, 8, kRemoteRead, &host), AccessResult::NotMapped);
  EXPECT_EQ(table.check_remote(implicit.rkey, 1, base + 3 * kPage, kPage, kRemoteWrite, &host), AccessResult::Ok);
  // The top of the address space: in the region's range, mapped nowhere.
  EXPECT_EQ(table.check_remote(implicit.rkey, 1, ~uint64_t{0} - 16, 16, kRemoteRead, &host), AccessResult::NotMapped);
  EXPECT_EQ(table.check_remote(implicit.rkey, 1, 1ull << 63, 16, kRemoteRead, &host), AccessResult::NotMapped);
  EXPECT_EQ(table.check_remote(implicit.rkey, 2, base, 8, kRemoteRead, &host), AccessResult::BadPd);
  // An ordinary region is not probed: its pages were checked when it was registered.
  EXPECT_EQ(table.check_remote(pinned.rkey, 1, base + 2 * kPage, 8, kRemoteRead, &host), AccessResult::Ok);
  table.remove(implicit);
  table.remove(pinned);
  munmap(mem, 2 * kPage);
  munmap(mem + 3 * kPage, kPage);
}

}  // namespace
}  // namespace softrdma::core
