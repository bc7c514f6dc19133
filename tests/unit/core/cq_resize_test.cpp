// The CQ ring's resize and per-QP discard (ibv_resize_cq, a QP moved to RESET), and the key table's
// in-place update behind ibv_rereg_mr: CQEs keep their order across wrap-around, and a region's keys
// lead to its new range, PD and rights at once, with the table's sequence number moved on.
#include "core/cq.h"
#include "core/mr.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <vector>

namespace softrdma::core {
namespace {

Cqe cqe(uint64_t id, uint32_t qpn, WcOpcode op = WcOpcode::Send) {
  Cqe c{};
  c.wr_id = id;
  c.qp_num = qpn;
  c.opcode = op;
  return c;
}

std::vector<uint64_t> drain(CompletionQueue& cq) {
  std::vector<uint64_t> ids;
  Cqe out[8];
  for (int n; (n = cq.poll(out, 8)) > 0;)
    for (int i = 0; i < n; ++i) ids.push_back(out[i].wr_id);
  return ids;
}

TEST(CqResize, KeepsOrderAcrossWrapAndRefusesBelowHeld) {
  Arena arena(1 << 20);
  CompletionQueue cq(arena, 4);
  ASSERT_EQ(cq.capacity(), 4u);
  // Move the indices so that the held CQEs wrap around the ring's end.
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(cq.push(cqe(i, 1), false));
  ASSERT_EQ(drain(cq).size(), 3u);
  for (uint64_t i = 10; i < 14; ++i) ASSERT_TRUE(cq.push(cqe(i, 1), false));
  EXPECT_FALSE(cq.in_error());
  EXPECT_EQ(cq.resize(3), EINVAL);
  EXPECT_EQ(cq.capacity(), 4u);
  ASSERT_EQ(cq.resize(100), 0);
  EXPECT_EQ(cq.capacity(), 128u);
  for (uint64_t i = 14; i < 100; ++i) ASSERT_TRUE(cq.push(cqe(i, 1), false));
  ASSERT_EQ(cq.resize(90), 0);  // 90 held: shrinks to 128 still, nothing lost
  auto ids = drain(cq);
  ASSERT_EQ(ids.size(), 90u);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], 10 + i);
  ASSERT_EQ(cq.resize(1), 0);
  EXPECT_EQ(cq.capacity(), 1u);
  ASSERT_TRUE(cq.push(cqe(7, 1), false));
  EXPECT_FALSE(cq.push(cqe(8, 1), false)) << "a full 1-entry CQ overruns";
  EXPECT_TRUE(cq.in_error());
}

TEST(CqDiscard, DropsOneQpsCompletionsAndKeepsTheRestInOrder) {
  Arena arena(1 << 20);
  CompletionQueue cq(arena, 8);
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(cq.push(cqe(i, 1), false));
  ASSERT_EQ(drain(cq).size(), 5u);  // indices move past the ring's end below
  ASSERT_TRUE(cq.push(cqe(100, 7), false));
  ASSERT_TRUE(cq.push(cqe(101, 9), false));
  ASSERT_TRUE(cq.push(cqe(102, 7, WcOpcode::Recv), false));
  ASSERT_TRUE(cq.push(cqe(103, 9), false));
  ASSERT_TRUE(cq.push(cqe(104, 7), false));
  cq.discard_qp(7, /*keep_receives=*/true);
  EXPECT_EQ(drain(cq), (std::vector<uint64_t>{101, 102, 103}));
  ASSERT_TRUE(cq.push(cqe(105, 7, WcOpcode::Recv), false));
  ASSERT_TRUE(cq.push(cqe(106, 9), false));
  cq.discard_qp(7, false);
  EXPECT_EQ(drain(cq), (std::vector<uint64_t>{106}));
  cq.discard_qp(9, false);  // empty: nothing to do
  EXPECT_TRUE(drain(cq).empty());
  // The ring is whole afterwards: it still holds its capacity.
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(cq.push(cqe(200 + i, 3), false));
  EXPECT_EQ(drain(cq).size(), 8u);
}

TEST(MrTableUpdate, KeysLeadToTheNewRangePdAndRights) {
  Arena arena(16 << 20);
  MrTable table(arena);
  std::vector<uint8_t> a(8192), b(8192);
  MrRegion r{reinterpret_cast<uint64_t>(a.data()), reinterpret_cast<uint64_t>(a.data()), 8192,
             kLocalWrite | kRemoteWrite, 1, 0, 0, 0};
  ASSERT_TRUE(table.add(r));
  const uint64_t seq = table.seq()->load();
  MrRegion next = r;
  next.addr = next.iova = reinterpret_cast<uint64_t>(b.data());
  next.length = 4096;
  next.pd = 2;
  next.access = kLocalWrite | kRemoteRead;
  table.update(next);
  EXPECT_GT(table.seq()->load(), seq);
  EXPECT_EQ(table.seq()->load() % 2, 0u);
  uint8_t* host = nullptr;
  EXPECT_EQ(table.check_remote(r.rkey, 2, next.iova + 100, 8, kRemoteRead, &host), AccessResult::Ok);
  EXPECT_EQ(host, b.data() + 100);
  EXPECT_EQ(table.check_remote(r.rkey, 2, next.iova, 8, kRemoteWrite, &host), AccessResult::NoPermission);
  EXPECT_EQ(table.check_remote(r.rkey, 1, next.iova, 8, kRemoteRead, &host), AccessResult::BadPd);
  EXPECT_EQ(table.check_remote(r.rkey, 2, r.iova, 8, kRemoteRead, &host), AccessResult::OutOfRange);
  EXPECT_EQ(table.check_local(r.lkey, 2, next.iova + 4000, 96, true, &host), AccessResult::Ok);
  EXPECT_EQ(table.check_local(r.lkey, 2, next.iova + 4000, 97, false, &host), AccessResult::OutOfRange);
  MrRegion seen{};
  ASSERT_TRUE(MrTable::find_in(table.slots(), r.rkey, true, &seen));
  EXPECT_EQ(seen.addr, next.addr);
  EXPECT_EQ(seen.pd, 2u);
  table.remove(next);
  EXPECT_EQ(table.check_local(r.lkey, 2, next.iova, 8, false, &host), AccessResult::BadKey);
}

}  // namespace
}  // namespace softrdma::core
