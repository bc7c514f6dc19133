// The extended post API: ibv_create_qp_ex + ibv_qp_to_qp_ex + ibv_wr_*.
#include "helpers.h"

#include <cstring>

namespace softrdma::verbs_test {
namespace {

class QpEx : public RcPair {
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

TEST_F(QpEx, SendSendImmAndInline) {
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

TEST_F(QpEx, WriteAndWriteImmWithSgeList) {
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

TEST_F(QpEx, ReadAndAtomics) {
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
TEST_F(QpEx, UnsignaledAndAbort) {
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
TEST_F(QpEx, ClassicPostOnExtendedQp) {
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

}  // namespace
}  // namespace softrdma::verbs_test
