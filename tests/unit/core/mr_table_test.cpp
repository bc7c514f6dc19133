// The MR key table against a reference map, through heavy register/deregister churn: every live
// region is found under its own keys (and only under the right kind of key), every removed one is
// gone, and access checks follow PD, bounds and permissions.
#include "core/mr.h"

#include <gtest/gtest.h>

#include <sys/mman.h>

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
