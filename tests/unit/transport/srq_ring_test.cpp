// An SRQ's ring when its WQEs leave out of order (transport/srq.h): intra-host initiators claim WQEs
// and name them in their messages, which the target places in any order. An application that posts
// one receive for each CQE it polled never holds more than max_wr posted WQEs, so ibv_post_srq_recv
// must not find the SRQ full while an earlier WQE, claimed, waits for its message (UCX treats that
// ENOMEM as fatal: Open MPI over UCX, 8 ranks on one host and another, aborted in rc_verbs_iface.c).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "transport/qp.h"
#include "transport/srq.h"

namespace softrdma::transport {
namespace {

struct Ring {
  static constexpr uint32_t kMaxWr = 4;
  Srq srq;
  std::vector<RecvWqe> slots;
  Ring() {
    // As SrqTable::create makes it: room for twice max_wr.
    slots.resize(WorkQueue<RecvWqe>::capacity_for(2 * kMaxWr));
    srq.rq.init(slots.data(), kMaxWr, 2 * kMaxWr);
    srq.taken.assign(srq.rq.mask + 1, 0);
    srq.max_sge = 1;
  }
  // Posts one WQE with this wr_id: 0 or ENOMEM.
  int post(uint64_t wr_id) {
    RecvWqe w{};
    w.wr_id = wr_id;
    int bad = -1;
    uint64_t head = 0;
    return push_recv_wqes(srq.rq, &w, 1, srq.max_sge, &bad, &head, &srq.taken_ahead);
  }
};

TEST(SrqRing, WqesTakenOutOfOrderMayBePostedAgain) {
  Ring r;
  for (uint64_t i = 0; i < Ring::kMaxWr; ++i) ASSERT_EQ(r.post(i), 0);
  EXPECT_EQ(r.post(99), ENOMEM) << "max_wr WQEs posted: full";
  uint64_t a = 0, b = 0;
  ASSERT_TRUE(r.srq.claim(&a));  // one initiator's message, not placed yet
  ASSERT_TRUE(r.srq.claim(&b));  // another's, placed first
  RecvWqe got{};
  ASSERT_TRUE(r.srq.take(b, &got));
  EXPECT_EQ(got.wr_id, b);
  EXPECT_EQ(r.srq.rq.tail.load(), a) << "the tail waits at the WQE still claimed";
  // The application polled b's CQE and posts one receive for it: 3 posted WQEs, room for one.
  EXPECT_EQ(r.post(4), 0);
  EXPECT_EQ(r.post(5), ENOMEM) << "max_wr WQEs posted again: full";
  ASSERT_TRUE(r.srq.take(a, &got));
  EXPECT_EQ(got.wr_id, a);
  EXPECT_EQ(r.srq.rq.tail.load(), b + 1) << "the tail moves past both";
  EXPECT_EQ(r.srq.taken_ahead.load(), 0u);
  EXPECT_EQ(r.post(5), 0);
  EXPECT_EQ(r.post(6), ENOMEM);
}

TEST(SrqRing, TheRingBoundsOutOfOrderTakesToo) {
  // The ring has 2 * max_wr slots: while the oldest WQE waits, at most that many fit between tail and
  // head, however many of them are taken.
  Ring r;
  for (uint64_t i = 0; i < Ring::kMaxWr; ++i) ASSERT_EQ(r.post(i), 0);
  uint64_t oldest = 0;
  ASSERT_TRUE(r.srq.claim(&oldest));
  uint64_t next_id = Ring::kMaxWr;
  int posted_more = 0;
  for (int round = 0; round < 16; ++round) {
    uint64_t i = 0;
    if (!r.srq.claim(&i)) break;
    RecvWqe got{};
    ASSERT_TRUE(r.srq.take(i, &got));
    if (r.post(next_id++) != 0) break;
    ++posted_more;
  }
  const uint64_t span = r.srq.rq.head.load() - r.srq.rq.tail.load();
  EXPECT_LE(span, r.srq.rq.mask + 1u) << "never more WQEs than ring slots";
  EXPECT_EQ(posted_more, static_cast<int>(r.srq.rq.mask + 1 - Ring::kMaxWr))
      << "posts go on until the ring's slots, not max_wr, are used up";
  EXPECT_EQ(r.post(next_id), ENOMEM);
}

}  // namespace
}  // namespace softrdma::transport
