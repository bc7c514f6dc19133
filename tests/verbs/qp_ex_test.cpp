// The extended post API: ibv_create_qp_ex + ibv_qp_to_qp_ex + ibv_wr_*.
#include "helpers.h"

#include <poll.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <iterator>
#include <thread>

namespace softrdma::verbs_test {
namespace {

class QpExBase : public RcPair {
 protected:
  void SetUp() override {
    RcPair::SetUp();
    qcfg.extended = true;
  }
  void next(uint64_t wr_id, unsigned flags = IBV_SEND_SIGNALED) {
    a.qpx->wr_id = wr_id;
    a.qpx->wr_flags = flags;
  }
};
using QpEx = OverPaths<QpExBase>;
// Off iWARP: immediate data and atomics do not exist there, which send_ops_flags are refused is the
// device's own, and a WRITE completes once its bytes are in the socket, not once placed (docs/iwarp.md,
// "Completion"): its target is not checked at its completion there.
using QpExRoce = QpEx;

TEST_P(QpExRoce, SendSendImmAndInline) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 4096);
  VT_BUF(dst, b, 3 * 4096);
  fill_pattern(src->data, 4096, 71);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(post_recv(b.qp, 10 + i, {dst->sge(i * 4096, 4096)}), 0);
  std::vector<uint8_t> inl(a.cap.max_inline_data);
  fill_pattern(inl.data(), inl.size(), 72);

  ibv_wr_start(a.qpx);
  next(1);
  ibv_wr_send(a.qpx);
  ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(0), 1000);
  next(2);
  ibv_wr_send_imm(a.qpx, htonl(0xabcd0123));
  ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(1000), 3096);
  next(3, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  ibv_wr_send(a.qpx);
  ibv_wr_set_inline_data(a.qpx, inl.data(), inl.size());
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  std::memset(inl.data(), 0, inl.size());  // inline data was copied at post time

  auto wcs = poll_wcs(a.scq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  for (int i = 0; i < 3; ++i) expect_wc(wcs[i], {.wr_id = uint64_t(i + 1), .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
  auto rwcs = poll_wcs(b.rcq, 3);
  ASSERT_EQ(rwcs.size(), 3u);
  expect_wc(rwcs[0], {.wr_id = 10, .opcode = IBV_WC_RECV, .byte_len = 1000, .no_imm = true, .qp_num = b.qpn()});
  expect_wc(rwcs[1], {.wr_id = 11, .opcode = IBV_WC_RECV, .byte_len = 3096, .imm = 0xabcd0123, .qp_num = b.qpn()});
  expect_wc(rwcs[2], {.wr_id = 12, .opcode = IBV_WC_RECV, .byte_len = uint32_t(inl.size()), .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(dst->data, 1000, 71), 1000u);
  EXPECT_EQ(check_pattern(dst->data + 4096, 3096, 71, 1000), 3096u);
  EXPECT_EQ(check_pattern(dst->data + 8192, inl.size(), 72), inl.size());
}

TEST_P(QpExRoce, WriteAndWriteImmWithSgeList) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 8192);
  VT_BUF(dst, b, 8192);
  fill_pattern(src->data, 8192, 73);
  ASSERT_EQ(post_recv(b.qp, 20, {}), 0);
  const ibv_sge list[3] = {src->sge(0, 100), src->sge(100, 2000), src->sge(2100, 1)};
  ibv_wr_start(a.qpx);
  next(1);
  ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(0));
  ibv_wr_set_sge_list(a.qpx, 3, list);
  next(2);
  ibv_wr_rdma_write_imm(a.qpx, dst->rkey(), dst->addr(4096), htonl(99));
  ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(4096), 4000);
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  auto wcs = poll_wcs(a.scq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  expect_wc(wcs[0], {.wr_id = 1, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  expect_wc(wcs[1], {.wr_id = 2, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 20, .opcode = IBV_WC_RECV_RDMA_WITH_IMM, .byte_len = 4000, .imm = 99, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(dst->data, 2101, 73), 2101u);
  EXPECT_EQ(check_pattern(dst->data + 4096, 4000, 73, 4096), 4000u);
}

TEST_P(QpExRoce, ReadAndAtomics) {
  ASSERT_TRUE(connect());
  VT_BUF(remote, b, 4096);
  VT_BUF(local, a, 4096);
  fill_pattern(remote->data, 2048, 74);
  remote->u64(2048) = 10;
  remote->u64(2056) = 1000;
  const bool atomics = atomics_supported();
  ibv_wr_start(a.qpx);
  next(1);
  ibv_wr_rdma_read(a.qpx, remote->rkey(), remote->addr(0));
  ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(0), 2048);
  if (atomics) {
    next(2);
    ibv_wr_atomic_cmp_swp(a.qpx, remote->rkey(), remote->addr(2048), 10, 20);
    ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(2048), 8);
    next(3);
    ibv_wr_atomic_cmp_swp(a.qpx, remote->rkey(), remote->addr(2048), 10, 30);  // fails: now 20
    ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(2056), 8);
    next(4);
    ibv_wr_atomic_fetch_add(a.qpx, remote->rkey(), remote->addr(2056), 5);
    ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(2064), 8);
  }
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  auto wcs = poll_wcs(a.scq, atomics ? 4 : 1);
  ASSERT_EQ(wcs.size(), atomics ? 4u : 1u);
  expect_wc(wcs[0], {.wr_id = 1, .opcode = IBV_WC_RDMA_READ, .byte_len = 2048, .qp_num = a.qpn()});
  EXPECT_EQ(check_pattern(local->data, 2048, 74), 2048u);
  if (!atomics) return;
  expect_wc(wcs[1], {.wr_id = 2, .opcode = IBV_WC_COMP_SWAP, .byte_len = 8, .qp_num = a.qpn()});
  expect_wc(wcs[2], {.wr_id = 3, .opcode = IBV_WC_COMP_SWAP, .byte_len = 8, .qp_num = a.qpn()});
  expect_wc(wcs[3], {.wr_id = 4, .opcode = IBV_WC_FETCH_ADD, .byte_len = 8, .qp_num = a.qpn()});
  EXPECT_EQ(local->u64(2048), 10u);
  EXPECT_EQ(local->u64(2056), 20u);
  EXPECT_EQ(local->u64(2064), 1000u);
  EXPECT_EQ(remote->u64(2048), 20u);
  EXPECT_EQ(remote->u64(2056), 1005u);
}

// Unsignaled WRs through the extended API make no completion either.
TEST_P(QpExRoce, UnsignaledAndAbort) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 4096);
  VT_BUF(dst, b, 4096);
  fill_pattern(src->data, 4096, 75);
  // An aborted batch posts nothing.
  ibv_wr_start(a.qpx);
  next(50);
  ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(0));
  ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(0), 4096);
  ibv_wr_abort(a.qpx);

  ibv_wr_start(a.qpx);
  next(1, 0);
  ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(0));
  ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(0), 1024);
  next(2, IBV_SEND_SIGNALED);
  ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(1024));
  ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(1024), 1024);
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 2, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  EXPECT_EQ(drain_cq(a.scq), 0) << "completion for an unsignaled or aborted WR";
  EXPECT_EQ(check_pattern(dst->data, 2048, 75), 2048u);
  for (int i = 2048; i < 4096; ++i) ASSERT_EQ(dst->data[i], 0) << "aborted WR wrote at " << i;
}

// The classic API keeps working on a QP created with send_ops_flags.
TEST_P(QpExRoce, ClassicPostOnExtendedQp) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 256);
  VT_BUF(dst, b, 256);
  fill_pattern(src->data, 256, 76);
  SendWr w(7, IBV_WR_RDMA_WRITE, {src->sge(0, 256)});
  w.rdma(dst->addr(), dst->rkey());
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 7, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  EXPECT_EQ(check_pattern(dst->data, 256, 76), 256u);
}

// Inline data from a list of buffers, into an RDMA WRITE and a SEND_WITH_IMM.
TEST_P(QpExRoce, InlineDataList) {
  ASSERT_TRUE(connect());
  VT_BUF(dst, b, 4096);
  ASSERT_EQ(post_recv(b.qp, 30, {dst->sge(2048, 2048)}), 0);
  uint8_t p1[7], p2[20], p3[1];
  fill_pattern(p1, sizeof p1, 77);
  fill_pattern(p2, sizeof p2, 77, sizeof p1);
  fill_pattern(p3, sizeof p3, 77, sizeof p1 + sizeof p2);
  const ibv_data_buf list[3] = {{p1, sizeof p1}, {p2, sizeof p2}, {p3, sizeof p3}};
  ibv_wr_start(a.qpx);
  next(1);
  ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(0));
  ibv_wr_set_inline_data_list(a.qpx, 3, list);
  next(2);
  ibv_wr_send_imm(a.qpx, htonl(5));
  ibv_wr_set_inline_data_list(a.qpx, 3, list);
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  std::memset(p2, 0, sizeof p2);  // copied at post time
  auto wcs = poll_wcs(a.scq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  expect_wc(wcs[0], {.wr_id = 1, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  expect_wc(wcs[1], {.wr_id = 2, .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 30, .opcode = IBV_WC_RECV, .byte_len = 28, .imm = 5, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(dst->data, 28, 77), 28u);
  EXPECT_EQ(check_pattern(dst->data + 2048, 28, 77), 28u);
  EXPECT_EQ(dst->data[28], 0);
}

// One bad WR fails ibv_wr_complete with EINVAL and none of the batch is posted: not the good WRs before
// it, not those after. The QP stays usable.
TEST_P(QpExRoce, BadWrPostsNothingOfTheBatch) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 4096);
  VT_BUF(dst, b, 4096);
  fill_pattern(src->data, 4096, 78);
  std::vector<ibv_sge> too_many(a.cap.max_send_sge + 1, src->sge(0, 8));
  std::vector<uint8_t> too_long(a.cap.max_inline_data + 1, 1);
  const std::function<void()> bad_setters[] = {
      [&] {  // more SGEs than max_send_sge
        ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(1024));
        ibv_wr_set_sge_list(a.qpx, too_many.size(), too_many.data());
      },
      [&] {  // inline data longer than max_inline_data
        ibv_wr_send(a.qpx);
        ibv_wr_set_inline_data(a.qpx, too_long.data(), too_long.size());
      },
      [&] {  // inline data on an RDMA READ
        ibv_wr_rdma_read(a.qpx, dst->rkey(), dst->addr(1024));
        ibv_wr_set_inline_data(a.qpx, src->data, 8);
      },
      [&] {  // a setter with no WR to attach to: first in the batch
      },
  };
  for (size_t k = 0; k < std::size(bad_setters); ++k) {
    SCOPED_TRACE(k);
    ibv_wr_start(a.qpx);
    if (k == 3) ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(0), 8);
    next(1);
    ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(0));
    ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(0), 512);
    next(2);
    bad_setters[k]();
    next(3);
    ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(2048));
    ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(2048), 512);
    EXPECT_EQ(ibv_wr_complete(a.qpx), EINVAL);
  }
  // Nothing arrived and nothing completes; a good batch afterwards goes through.
  ibv_wr_start(a.qpx);
  next(9);
  ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(3072));
  ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(3072), 1024);
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 9, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  EXPECT_EQ(drain_cq(a.scq), 0) << "a WR of a failed batch completed";
  for (int i = 0; i < 3072; ++i) ASSERT_EQ(dst->data[i], 0) << "a WR of a failed batch wrote at " << i;
  EXPECT_EQ(check_pattern(dst->data + 3072, 1024, 78, 3072), 1024u);
}

// A batch larger than the send queue's free room is refused whole (ENOMEM), not posted in part.
TEST_P(QpExRoce, BatchOverSendQueueDepthPostsNothing) {
  qcfg.max_send_wr = 16;
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 4096);
  VT_BUF(dst, b, 4096);
  fill_pattern(src->data, 4096, 79);
  const uint32_t depth = a.cap.max_send_wr;
  ibv_wr_start(a.qpx);
  for (uint32_t i = 0; i <= depth; ++i) {
    next(i);
    ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(i % 64 * 64));
    ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(i % 64 * 64), 64);
  }
  EXPECT_EQ(ibv_wr_complete(a.qpx), ENOMEM);
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(a.scq, 1, &wc), 0);
  // A full queue's worth is accepted.
  ibv_wr_start(a.qpx);
  for (uint32_t i = 0; i < depth; ++i) {
    next(100 + i);
    ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(i % 64 * 64));
    ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(i % 64 * 64), 64);
  }
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  auto wcs = poll_wcs(a.scq, depth);
  ASSERT_EQ(wcs.size(), size_t{depth});
  for (uint32_t i = 0; i < depth; ++i) expect_wc(wcs[i], {.wr_id = 100 + i, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  size_t written = std::min<size_t>(depth, 64) * 64;
  EXPECT_EQ(check_pattern(dst->data, written, 79), written);
}

// ibv_wr_start .. ibv_wr_complete is a per-QP critical section: two threads building batches on one QP
// at once lose no WR and mix none up.
TEST_P(QpExRoce, ConcurrentBatchesOnOneQp) {
  ASSERT_TRUE(connect());
  constexpr int kThreads = 2, kBatches = 25, kPerBatch = 2;
  constexpr int kWrs = kThreads * kBatches * kPerBatch;  // within max_send_wr and the CQ
  VT_BUF(src, a, kWrs * 64);
  VT_BUF(dst, b, kWrs * 64);
  fill_pattern(src->data, kWrs * 64, 80);
  std::atomic<int> failures{0};
  auto worker = [&](int t) {
    for (int batch = 0; batch < kBatches; ++batch) {
      ibv_wr_start(a.qpx);
      for (int j = 0; j < kPerBatch; ++j) {
        int id = (t * kBatches + batch) * kPerBatch + j;
        a.qpx->wr_id = id;
        a.qpx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(id * 64));
        ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(id * 64), 64);
      }
      if (ibv_wr_complete(a.qpx) != 0) ++failures;
    }
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(failures.load(), 0);
  auto wcs = poll_wcs(a.scq, kWrs);
  ASSERT_EQ(wcs.size(), size_t{kWrs});
  std::vector<int> seen(kWrs, 0);
  for (const ibv_wc& w : wcs) {
    EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    ASSERT_LT(w.wr_id, uint64_t{kWrs});
    ++seen[w.wr_id];
  }
  for (int i = 0; i < kWrs; ++i) EXPECT_EQ(seen[i], 1) << "wr_id " << i;
  EXPECT_EQ(check_pattern(dst->data, kWrs * 64, 80), size_t{kWrs * 64});
}

// send_ops_flags naming an operation RC cannot do here is refused at creation.
TEST_P(QpExRoce, UnsupportedSendOpsRefused) {
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  for (uint64_t op : {uint64_t{IBV_QP_EX_WITH_TSO}, uint64_t{1} << 20}) {
    ibv_qp_init_attr_ex ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.cap = {4, 4, 1, 1, 0};
    ia.qp_type = IBV_QPT_RC;
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ia.pd = pd;
    ia.send_ops_flags = IBV_QP_EX_WITH_SEND | op;
    errno = 0;
    ibv_qp* qp = ibv_create_qp_ex(dev.ctx, &ia);
    EXPECT_EQ(qp, nullptr) << "send_ops_flags " << std::hex << op;
    EXPECT_EQ(errno, EOPNOTSUPP);
    if (qp) ibv_destroy_qp(qp);
  }
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// IBV_SEND_SOLICITED in wr_flags sets the solicited bit: a receive CQ armed for solicited completions
// only raises its event for that message.
TEST_P(QpEx, SolicitedFlag) {
  ibv_comp_channel* ch = make_channel();
  ASSERT_TRUE(ch);
  qcfg.recv_channel = ch;
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 128);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(post_recv(b.qp, 40 + i, {dst->sge(i * 64, 64)}), 0);
  ASSERT_EQ(ibv_req_notify_cq(b.rcq, 1), 0);
  ibv_wr_start(a.qpx);
  next(1);
  ibv_wr_send(a.qpx);
  ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(0), 64);
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 40, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = b.qpn()});
  pollfd p{ch->fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "event for an unsolicited message";
  ibv_wr_start(a.qpx);
  next(2, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
  ibv_wr_send(a.qpx);
  ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(0), 64);
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  ASSERT_EQ(::poll(&p, 1, kWaitSeconds * 1000), 1) << "no event for the solicited message";
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch, &cq, &ctx), 0);
  EXPECT_EQ(cq, b.rcq);
  ibv_ack_cq_events(cq, 1);
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 41, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = b.qpn()});
  EXPECT_EQ(poll_wcs(a.scq, 2).size(), 2u);
}

VT_INSTANTIATE_PATHS(QpEx, VT_ALL_PATHS);
VT_INSTANTIATE_PATHS(QpExRoce, VT_ROCE_PATHS);

}  // namespace
}  // namespace softrdma::verbs_test
