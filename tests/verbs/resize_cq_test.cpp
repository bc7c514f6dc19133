// ibv_resize_cq(3): a CQ grows or shrinks and keeps the completions it holds, in order; a size below
// what it holds, below 1 or above max_cqe is EINVAL and changes nothing; cq->cqe reports the size
// it has (at least the one asked for). Also while a peer's messages arrive, between two contexts of
// one process (the intra-host direct path on softrdma, packets with SOFTRDMA_DIRECT=0).
#include "helpers.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace softrdma::verbs_test {
namespace {

class ResizeCqBase : public RcPair {
 protected:
  // n signaled 8-byte WRITEs from a to b, not polled; wr_id base + i.
  void post_writes(Buffer& src, Buffer& dst, int n, uint64_t base) {
    for (int i = 0; i < n; ++i) {
      SendWr w(base + static_cast<uint64_t>(i), IBV_WR_RDMA_WRITE, {src.sge(0, 8)});
      w.rdma(dst.addr(8 * static_cast<size_t>(i)), dst.rkey());
      ASSERT_EQ(post_send(a.qp, w), 0) << i;
    }
  }
  // Waits until the CQ holds all n completions expected, without polling any: a CQ holding n refuses
  // to shrink to n - 1. Until it does, that resize succeeds, so n - 1 must round up to a size that
  // still holds n (n = 4, 6, 7, ...): the CQ reports at least what was asked, and here not less than
  // the next power of two -- which holds on every device that rounds up that way; a device that
  // sized it exactly would overrun, and the test would fail, not pass.
  bool wait_held(ibv_cq* cq, int n) {
    for (int i = 0; i < kWaitSeconds * 1000; ++i) {
      int rc = ibv_resize_cq(cq, n - 1);
      if (rc == EINVAL) return true;
      EXPECT_EQ(rc, 0);
      EXPECT_GE(cq->cqe, n) << "the test's assumption on rounding";
      usleep(1000);
    }
    ADD_FAILURE() << "the CQ never held " << n << " completions";
    return false;
  }
};
using ResizeCq = OverPaths<ResizeCqBase>;
// Off iWARP: a WRITE completes there once its bytes are in the socket, not once placed (docs/iwarp.md,
// "Completion"): its target is not checked at its completion there.
using ResizeCqRoce = ResizeCq;

TEST_P(ResizeCq, BadSizesAreEinvalAndChangeNothing) {
  qcfg.send_cqe = 16;
  ASSERT_TRUE(connect());
  const int size = a.scq->cqe;
  EXPECT_GE(size, 16);
  EXPECT_EQ(ibv_resize_cq(a.scq, 0), EINVAL);
  EXPECT_EQ(ibv_resize_cq(a.scq, -1), EINVAL);
  EXPECT_EQ(ibv_resize_cq(a.scq, dev.attr.max_cqe + 1), EINVAL);
  EXPECT_EQ(a.scq->cqe, size);
}

TEST_P(ResizeCqRoce, GrowKeepsHeldCompletionsInOrder) {
  qcfg.send_cqe = 4;
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 8 * 512);
  src->u64(0) = 0x0102030405060708ull;
  ASSERT_GE(a.scq->cqe, 4);
  // Three polled first: the held ones then wrap around the end of a 4-entry ring.
  ASSERT_NO_FATAL_FAILURE(post_writes(*src, *dst, 3, 1));
  ASSERT_EQ(poll_wcs(a.scq, 3).size(), 3u);
  ASSERT_NO_FATAL_FAILURE(post_writes(*src, *dst, 4, 100));
  ASSERT_TRUE(wait_held(a.scq, 4));
  ASSERT_EQ(ibv_resize_cq(a.scq, 300), 0);
  EXPECT_GE(a.scq->cqe, 300);
  // Now more than the old size fits.
  ASSERT_NO_FATAL_FAILURE(post_writes(*src, *dst, 100, 104));
  auto wcs = poll_wcs(a.scq, 104);
  ASSERT_EQ(wcs.size(), 104u);
  for (size_t i = 0; i < wcs.size(); ++i) {
    expect_wc(wcs[i], {.wr_id = 100 + i, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  }
  for (int i = 0; i < 100; ++i) EXPECT_EQ(dst->u64(8 * static_cast<size_t>(i)), 0x0102030405060708ull) << i;
}

TEST_P(ResizeCq, ShrinkBelowHeldIsEinvalThenShrinkToFit) {
  qcfg.send_cqe = 64;
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 8 * 64);
  ASSERT_NO_FATAL_FAILURE(post_writes(*src, *dst, 6, 200));
  ASSERT_TRUE(wait_held(a.scq, 6));
  const int size = a.scq->cqe;
  EXPECT_EQ(ibv_resize_cq(a.scq, 1), EINVAL);
  EXPECT_EQ(ibv_resize_cq(a.scq, 5), EINVAL);
  EXPECT_EQ(a.scq->cqe, size) << "a refused resize changes nothing";
  ASSERT_EQ(ibv_resize_cq(a.scq, 6), 0);
  EXPECT_GE(a.scq->cqe, 6);
  auto wcs = poll_wcs(a.scq, 6);
  ASSERT_EQ(wcs.size(), 6u);
  for (size_t i = 0; i < wcs.size(); ++i) {
    expect_wc(wcs[i], {.wr_id = 200 + i, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  }
  // Empty: any size down to 1.
  ASSERT_EQ(ibv_resize_cq(a.scq, 1), 0);
  EXPECT_GE(a.scq->cqe, 1);
  ASSERT_NO_FATAL_FAILURE(post_writes(*src, *dst, 1, 300));
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 300, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
}

// The receive CQ of a context whose peer (another context: on softrdma the direct path) keeps
// sending is resized between polls: every message completes once, in order, with its data.
TEST(ResizeCqTwoContexts, ResizeWhileMessagesArrive) {
  Device dev_a, dev_b;
  ASSERT_TRUE(dev_a.ok() && dev_b.ok());
  Side a, b;
  QpConfig q;
  q.recv_cqe = 256;
  q.max_recv_wr = 256;
  q.max_send_wr = 256;
  q.send_cqe = 512;
  ConnConfig conn;
  ASSERT_TRUE(a.create(dev_a, q) && b.create(dev_b, q));
  ASSERT_EQ(bring_up(a.qp, a.psn, b.qpn(), b.psn, dev_b.gid, conn, dev_a.attr), 0);
  ASSERT_EQ(bring_up(b.qp, b.psn, a.qpn(), a.psn, dev_a.gid, conn, dev_b.attr), 0);
  constexpr int kMsgs = 200;
  constexpr uint32_t kMsg = 512;
  {
    VT_BUF(src, a, kMsgs * kMsg);
    VT_BUF(dst, b, kMsgs * kMsg);
    fill_pattern(src->data, kMsgs * kMsg, 9);
    for (int i = 0; i < kMsgs; ++i) ASSERT_EQ(post_recv(b.qp, 1000 + i, {dst->sge(i * kMsg, kMsg)}), 0);
    for (int i = 0; i < kMsgs; ++i) {
      SendWr s(i, IBV_WR_SEND, {src->sge(i * kMsg, kMsg)}, i % 8 == 7 ? IBV_SEND_SIGNALED : 0);
      ASSERT_EQ(post_send(a.qp, s), 0);
    }
    // Sizes that always hold every message still to come (at most kMsgs in flight).
    const int sizes[] = {kMsgs, 4 * kMsgs, 2 * kMsgs, kMsgs + 1};
    int got = 0, round = 0;
    for (int spins = 0; got < kMsgs && spins < kWaitSeconds * 100000; ++spins) {
      ibv_wc wc[16];
      int n = ibv_poll_cq(b.rcq, 16, wc);
      ASSERT_GE(n, 0);
      for (int i = 0; i < n; ++i, ++got) {
        expect_wc(wc[i], {.wr_id = 1000u + got, .opcode = IBV_WC_RECV, .byte_len = kMsg, .qp_num = b.qpn()});
      }
      if (n) {
        ASSERT_EQ(ibv_resize_cq(b.rcq, sizes[round++ % 4]), 0);
        EXPECT_GE(b.rcq->cqe, kMsgs);
      }
    }
    ASSERT_EQ(got, kMsgs);
    EXPECT_EQ(check_pattern(dst->data, kMsgs * kMsg, 9), size_t{kMsgs} * kMsg);
    auto sends = poll_wcs(a.scq, kMsgs / 8);
    for (const ibv_wc& w : sends) EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  }
}

// An armed CQ that is resized still raises its event when a peer's message arrives (an intra-host
// peer finds the arm state where it was), and a CQ armed after a resize too.
TEST(ResizeCqTwoContexts, ArmedCqStillRaisesItsEventAfterResize) {
  Device dev_a, dev_b;
  ASSERT_TRUE(dev_a.ok() && dev_b.ok());
  ibv_comp_channel* ch = ibv_create_comp_channel(dev_b.ctx);
  ASSERT_NE(ch, nullptr);
  {
    Side a, b;
    QpConfig q;
    q.recv_cqe = 8;
    QpConfig qb = q;
    qb.recv_channel = ch;
    ConnConfig conn;
    ASSERT_TRUE(a.create(dev_a, q) && b.create(dev_b, qb));
    ASSERT_EQ(bring_up(a.qp, a.psn, b.qpn(), b.psn, dev_b.gid, conn, dev_a.attr), 0);
    ASSERT_EQ(bring_up(b.qp, b.psn, a.qpn(), a.psn, dev_a.gid, conn, dev_b.attr), 0);
    VT_BUF(src, a, 64);
    VT_BUF(dst, b, 64);
    for (int round = 0; round < 4; ++round) {
      ASSERT_EQ(post_recv(b.qp, 10 + round, {dst->sge(0, 64)}), 0);
      const int size = round % 2 ? 8 : 1000;
      if (round < 2) {
        ASSERT_EQ(ibv_req_notify_cq(b.rcq, 0), 0);
        ASSERT_EQ(ibv_resize_cq(b.rcq, size), 0);  // armed, then resized
      } else {
        ASSERT_EQ(ibv_resize_cq(b.rcq, size), 0);  // resized, then armed
        ASSERT_EQ(ibv_req_notify_cq(b.rcq, 0), 0);
      }
      fill_pattern(src->data, 64, 40 + round);
      SendWr s(round, IBV_WR_SEND, {src->sge(0, 64)});
      ASSERT_EQ(post_send(a.qp, s), 0);
      pollfd pf{ch->fd, POLLIN, 0};
      ASSERT_EQ(poll(&pf, 1, kWaitSeconds * 1000), 1) << "no completion event, round " << round;
      ibv_cq* ev_cq = nullptr;
      void* ev_ctx = nullptr;
      ASSERT_EQ(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
      EXPECT_EQ(ev_cq, b.rcq);
      ibv_ack_cq_events(b.rcq, 1);
      ibv_wc wc{};
      ASSERT_TRUE(poll_wc(b.rcq, &wc));
      expect_wc(wc, {.wr_id = 10u + round, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = b.qpn()});
      EXPECT_EQ(check_pattern(dst->data, 64, 40 + round), 64u);
      ASSERT_TRUE(poll_wc(a.scq, &wc));
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    }
  }
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

VT_INSTANTIATE_PATHS(ResizeCq, VT_ALL_PATHS);
VT_INSTANTIATE_PATHS(ResizeCqRoce, VT_ROCE_PATHS);

}  // namespace
}  // namespace softrdma::verbs_test
