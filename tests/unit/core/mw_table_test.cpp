// Memory windows in the key table: bind checks (IBTA C10-72..75), key tags, type 2 QP association,
// invalidation rules, and the reservation of a window's key prefix against region keys.
#include <gtest/gtest.h>

#include <vector>

#include "core/mr.h"

namespace softrdma::core {
namespace {

constexpr uint32_t kPd = 3;
constexpr uint32_t kQpn = 17;

struct MwTable : ::testing::Test {
  Arena arena{64 << 20};
  MrTable table{arena};
  std::vector<uint8_t> mem = std::vector<uint8_t>(65536);
  MrRegion mr{};

  void SetUp() override {
    mr.addr = reinterpret_cast<uint64_t>(mem.data());
    mr.iova = 0x100000;
    mr.length = mem.size();
    mr.access = kLocalWrite | kMwBind;
    mr.pd = kPd;
    ASSERT_TRUE(table.add(mr));
  }
  MwBind bind(uint32_t handle, uint32_t rkey, uint64_t off, uint64_t len, uint32_t access) const {
    return MwBind{handle, rkey, mr.lkey, mr.iova + off, len, access};
  }
};

TEST_F(MwTable, Type1BindResolvesInsideWindowOnly) {
  uint32_t h = 0, key = 0;
  ASSERT_TRUE(table.alloc_window(MwType::Type1, kPd, &h, &key));
  EXPECT_EQ(key >> 8, h);
  uint32_t bound = 0;
  ASSERT_TRUE(table.bind_window(bind(h, key + 1, 4096, 4096, kRemoteWrite | kRemoteRead), kPd, kQpn, &bound));
  EXPECT_EQ(bound >> 8, h);
  EXPECT_NE(bound & 0xFF, key & 0xFF);
  uint8_t* host = nullptr;
  // Any QP of the PD may use a type 1 window.
  ASSERT_EQ(table.check_remote(bound, kPd, mr.iova + 4096, 4096, kRemoteWrite, &host, 99), AccessResult::Ok);
  EXPECT_EQ(host, mem.data() + 4096);
  EXPECT_EQ(table.check_remote(bound, kPd, mr.iova + 4095, 8, kRemoteRead, &host), AccessResult::OutOfRange);
  EXPECT_EQ(table.check_remote(bound, kPd, mr.iova + 8190, 4, kRemoteRead, &host), AccessResult::OutOfRange);
  EXPECT_EQ(table.check_remote(bound, kPd, mr.iova + 4096, 8, kRemoteAtomic, &host), AccessResult::NoPermission);
  EXPECT_EQ(table.check_remote(bound, kPd + 1, mr.iova + 4096, 8, kRemoteRead, &host), AccessResult::BadPd);
  // The old key is dead; the region's own rkey grants nothing remote (the MR has no remote rights).
  EXPECT_EQ(table.check_remote(key, kPd, mr.iova + 4096, 8, kRemoteRead, &host), AccessResult::BadKey);
  EXPECT_EQ(table.check_remote(mr.rkey, kPd, mr.iova, 8, kRemoteRead, &host), AccessResult::NoPermission);
  EXPECT_TRUE(table.has_bound_windows(mr.lkey));
  // Type 1 windows cannot be invalidated, locally or remotely.
  EXPECT_FALSE(table.invalidate(bound, kPd, kQpn, false));
  EXPECT_FALSE(table.invalidate(bound, kPd, kQpn, true));
  table.dealloc_window(h);
  EXPECT_FALSE(table.has_bound_windows(mr.lkey));
  EXPECT_EQ(table.check_remote(bound, kPd, mr.iova + 4096, 8, kRemoteRead, &host), AccessResult::BadKey);
}

TEST_F(MwTable, BindChecks) {
  uint32_t h1 = 0, k1 = 0, h2 = 0, k2 = 0, out = 0;
  ASSERT_TRUE(table.alloc_window(MwType::Type1, kPd, &h1, &k1));
  ASSERT_TRUE(table.alloc_window(MwType::Type2, kPd, &h2, &k2));
  // The same key tag again is no error (IBTA asks for none), nor is LOCAL_WRITE among the window's
  // rights: it grants nothing remote.
  EXPECT_TRUE(table.bind_window(bind(h1, k1, 0, 64, kRemoteRead | kLocalWrite), kPd, kQpn, &out));
  EXPECT_EQ(out, k1);
  uint8_t* host = nullptr;
  EXPECT_EQ(table.check_remote(k1, kPd, mr.iova, 8, kRemoteRead, &host), AccessResult::Ok);
  EXPECT_EQ(table.check_remote(k1, kPd, mr.iova, 8, kRemoteWrite, &host), AccessResult::NoPermission);
  EXPECT_FALSE(table.bind_window(bind(h1, k1 + 1, 0, 64, kRemoteRead | kMwBind), kPd, kQpn, &out));
  EXPECT_FALSE(table.bind_window(bind(h1, k1 + 1, 65536 - 32, 64, kRemoteRead), kPd, kQpn, &out));  // C10-75
  EXPECT_FALSE(table.bind_window(bind(h1, k1 + 1, 0, 64, kRemoteRead | kZeroBased), kPd, kQpn, &out));
  EXPECT_FALSE(table.bind_window(bind(h2, k2 + 1, 0, 64, kRemoteRead), kPd + 1, kQpn, &out));  // C10-72
  EXPECT_FALSE(table.bind_window(bind(h2, k2 + 1, 0, 0, kRemoteRead), kPd, kQpn, &out));       // zero length
  EXPECT_FALSE(table.bind_window(bind(12345678, 1, 0, 64, kRemoteRead), kPd, kQpn, &out));     // no window
  // C10-73: an MR without MW_BIND; C10-74: a writable window on an MR without local write.
  MrRegion plain{mr.addr, 0x900000, 4096, kLocalWrite | kRemoteWrite, kPd, 0, 0};
  ASSERT_TRUE(table.add(plain));
  MwBind b{h1, k1 + 1, plain.lkey, plain.iova, 64, kRemoteRead};
  EXPECT_FALSE(table.bind_window(b, kPd, kQpn, &out));
  MrRegion ro{mr.addr, 0xA00000, 4096, kMwBind, kPd, 0, 0};
  ASSERT_TRUE(table.add(ro));
  b = {h1, k1 + 1, ro.lkey, ro.iova, 64, kRemoteWrite};
  EXPECT_FALSE(table.bind_window(b, kPd, kQpn, &out));
  b.access = kRemoteAtomic;
  EXPECT_FALSE(table.bind_window(b, kPd, kQpn, &out));
  b.access = kRemoteRead;
  EXPECT_TRUE(table.bind_window(b, kPd, kQpn, &out));
  // A failed bind changed nothing: the window's key tag moved only with the successful one.
  EXPECT_EQ(out, (k1 & ~0xFFu) | ((k1 + 1) & 0xFF));
}

TEST_F(MwTable, Type2IsTiedToItsQpAndInvalidatedOnce) {
  uint32_t h = 0, key = 0, bound = 0;
  ASSERT_TRUE(table.alloc_window(MwType::Type2, kPd, &h, &key));
  ASSERT_TRUE(table.bind_window(bind(h, key + 1, 0, 4096, kRemoteRead | kZeroBased), kPd, kQpn, &bound));
  uint8_t* host = nullptr;
  // Zero based: the address is an offset into the window.
  ASSERT_EQ(table.check_remote(bound, kPd, 100, 8, kRemoteRead, &host, kQpn), AccessResult::Ok);
  EXPECT_EQ(host, mem.data() + 100);
  EXPECT_EQ(table.check_remote(bound, kPd, 100, 8, kRemoteRead, &host, kQpn + 1), AccessResult::BadKey);
  // Bound type 2 windows are not bound again before they are invalidated.
  uint32_t again = 0;
  EXPECT_FALSE(table.bind_window(bind(h, bound + 1, 0, 64, kRemoteRead), kPd, kQpn, &again));
  // Send with Invalidate only through the QP it is bound to; Local Invalidate from the PD.
  EXPECT_FALSE(table.invalidate(bound, kPd, kQpn + 1, true));
  EXPECT_FALSE(table.invalidate(bound ^ 1, kPd, kQpn, true));
  EXPECT_FALSE(table.invalidate(mr.rkey, kPd, kQpn, true));
  EXPECT_TRUE(table.invalidate(bound, kPd, kQpn, true));
  EXPECT_FALSE(table.invalidate(bound, kPd, kQpn, false));
  EXPECT_EQ(table.check_remote(bound, kPd, 100, 8, kRemoteRead, &host, kQpn), AccessResult::BadKey);
  EXPECT_FALSE(table.has_bound_windows(mr.lkey));
  // Free again: bound anew, then unbound by its QP's destruction.
  ASSERT_TRUE(table.bind_window(bind(h, bound + 1, 0, 64, kRemoteRead), kPd, kQpn, &again));
  table.unbind_windows_of_qp(kQpn);
  EXPECT_EQ(table.check_remote(again, kPd, mr.iova, 8, kRemoteRead, &host, kQpn), AccessResult::BadKey);
  EXPECT_FALSE(table.has_bound_windows(mr.lkey));
}

// A window's 24-bit prefix stays its own: region keys never take it, so any tag it moves to is free.
TEST_F(MwTable, WindowPrefixesAreNeverRegionKeys) {
  std::vector<uint32_t> prefixes;
  for (int i = 0; i < 200; ++i) {
    uint32_t h = 0, key = 0;
    ASSERT_TRUE(table.alloc_window(MwType::Type1, kPd, &h, &key));
    prefixes.push_back(h);
  }
  for (int i = 0; i < 2000; ++i) {
    MrRegion r{mr.addr, 0x200000ull * (i + 1), 64, kLocalWrite, kPd, 0, 0};
    ASSERT_TRUE(table.add(r));
    for (uint32_t h : prefixes) {
      ASSERT_NE(r.lkey >> 8, h);
      ASSERT_NE(r.rkey >> 8, h);
    }
  }
  EXPECT_EQ(table.window_count(), 200u);
}

}  // namespace
}  // namespace softrdma::core
