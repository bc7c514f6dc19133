// Every RC opcode through ibv_post_send, with data and both sides' completions checked.
#include "helpers.h"

#include <cstring>

namespace softrdma::verbs_test {
namespace {

using Opcodes = OverPaths<>;
// Off iWARP: immediate data, atomics and READs into more than one SGE do not exist there
// (docs/iwarp.md: an iWARP QP refuses them at post_send); and a WRITE completes there once its
// bytes are in the socket, not once placed (docs/iwarp.md, "Completion"), so a check of the target
// right after the WRITE's own completion does not hold.
using OpcodesRoce = OverPaths<>;

TEST_P(Opcodes, Send) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 3000);
  VT_BUF(dst, b, 4096);
  fill_pattern(src->data, 3000, 1);
  ASSERT_EQ(post_recv(b.qp, 77, {dst->sge(0, 4096)}), 0);
  SendWr w(11, IBV_WR_SEND, {src->sge(0, 3000)});
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 11, .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 77, .opcode = IBV_WC_RECV, .byte_len = 3000, .no_imm = true, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(dst->data, 3000, 1), 3000u);
}

TEST_P(OpcodesRoce, SendWithImm) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 100);
  VT_BUF(dst, b, 100);
  fill_pattern(src->data, 100, 2);
  ASSERT_EQ(post_recv(b.qp, 5, {dst->sge(0, 100)}), 0);
  SendWr w(6, IBV_WR_SEND_WITH_IMM, {src->sge(0, 100)});
  w.imm(0xdeadbeef);
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 6, .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 5, .opcode = IBV_WC_RECV, .byte_len = 100, .imm = 0xdeadbeef, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(dst->data, 100, 2), 100u);
}

TEST_P(OpcodesRoce, RdmaWrite) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 5000);
  VT_BUF(dst, b, 8192);
  fill_pattern(src->data, 5000, 3);
  std::memset(dst->data, 0xee, 8192);
  SendWr w(21, IBV_WR_RDMA_WRITE, {src->sge(0, 5000)});
  w.rdma(dst->addr(100), dst->rkey());
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 21, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  EXPECT_EQ(check_pattern(dst->data + 100, 5000, 3), 5000u);
  // Bytes around the target range stay untouched.
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(dst->data[i], 0xee) << i;
  for (size_t i = 5100; i < 8192; ++i) ASSERT_EQ(dst->data[i], 0xee) << i;
  // A WRITE without immediate consumes no receive and makes no responder completion.
  EXPECT_EQ(drain_cq(b.rcq), 0);
}

TEST_P(OpcodesRoce, RdmaWriteWithImm) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 2500);
  VT_BUF(dst, b, 4096);
  fill_pattern(src->data, 2500, 4);
  ASSERT_EQ(post_recv(b.qp, 31, {}), 0);  // WRITE_WITH_IMM needs a receive, not its buffers
  SendWr w(32, IBV_WR_RDMA_WRITE_WITH_IMM, {src->sge(0, 2500)});
  w.rdma(dst->addr(0), dst->rkey()).imm(0x01020304);
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 32, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 31, .opcode = IBV_WC_RECV_RDMA_WITH_IMM, .byte_len = 2500, .imm = 0x01020304,
                 .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(dst->data, 2500, 4), 2500u);
}

TEST_P(Opcodes, RdmaRead) {
  ASSERT_TRUE(connect());
  VT_BUF(remote, b, 6000);
  VT_BUF(local, a, 6000);
  fill_pattern(remote->data, 6000, 5);
  SendWr w(41, IBV_WR_RDMA_READ, {local->sge(0, 5555)});
  w.rdma(remote->addr(7), remote->rkey());
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 41, .opcode = IBV_WC_RDMA_READ, .byte_len = 5555, .qp_num = a.qpn()});
  EXPECT_EQ(check_pattern(local->data, 5555, 5, 7), 5555u);
  EXPECT_EQ(drain_cq(b.rcq), 0);
}

TEST_P(OpcodesRoce, AtomicCompareAndSwapSuccessAndFailure) {
  ASSERT_TRUE(connect());
  if (!atomics_supported()) GTEST_SKIP() << "device reports IBV_ATOMIC_NONE";
  VT_BUF(remote, b, 64);
  VT_BUF(local, a, 64);
  remote->u64(8) = 5;
  local->u64(0) = 0xffff;
  SendWr ok(51, IBV_WR_ATOMIC_CMP_AND_SWP, {local->sge(0, 8)});
  ok.cmp_swp(remote->addr(8), remote->rkey(), 5, 9);
  ASSERT_EQ(post_send(a.qp, ok), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 51, .opcode = IBV_WC_COMP_SWAP, .byte_len = 8, .qp_num = a.qpn()});
  EXPECT_EQ(local->u64(0), 5u) << "old value returned";
  EXPECT_EQ(remote->u64(8), 9u) << "swap happened";

  SendWr fail(52, IBV_WR_ATOMIC_CMP_AND_SWP, {local->sge(16, 8)});
  fail.cmp_swp(remote->addr(8), remote->rkey(), 7, 1234);
  ASSERT_EQ(post_send(a.qp, fail), 0);
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 52, .opcode = IBV_WC_COMP_SWAP, .byte_len = 8, .qp_num = a.qpn()});
  EXPECT_EQ(local->u64(16), 9u) << "old value returned on a failed compare";
  EXPECT_EQ(remote->u64(8), 9u) << "no swap when the compare fails";
  EXPECT_EQ(remote->u64(0), 0u);
  EXPECT_EQ(remote->u64(16), 0u);
}

TEST_P(OpcodesRoce, AtomicFetchAndAdd) {
  ASSERT_TRUE(connect());
  if (!atomics_supported()) GTEST_SKIP() << "device reports IBV_ATOMIC_NONE";
  VT_BUF(remote, b, 64);
  VT_BUF(local, a, 64);
  remote->u64(24) = 100;
  SendWr w(61, IBV_WR_ATOMIC_FETCH_AND_ADD, {local->sge(8, 8)});
  w.fetch_add(remote->addr(24), remote->rkey(), 23);
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 61, .opcode = IBV_WC_FETCH_ADD, .byte_len = 8, .qp_num = a.qpn()});
  EXPECT_EQ(local->u64(8), 100u);
  EXPECT_EQ(remote->u64(24), 123u);
  // 64-bit wrap-around.
  remote->u64(24) = ~uint64_t{0};
  SendWr w2(62, IBV_WR_ATOMIC_FETCH_AND_ADD, {local->sge(16, 8)});
  w2.fetch_add(remote->addr(24), remote->rkey(), 2);
  ASSERT_EQ(post_send(a.qp, w2), 0);
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 62, .opcode = IBV_WC_FETCH_ADD, .byte_len = 8, .qp_num = a.qpn()});
  EXPECT_EQ(local->u64(16), ~uint64_t{0});
  EXPECT_EQ(remote->u64(24), 1u);
}

// Atomics on one word execute in order: each returns the previous one's result.
TEST_P(OpcodesRoce, ManyFetchAndAddInOrder) {
  ASSERT_TRUE(connect());
  if (!atomics_supported()) GTEST_SKIP() << "device reports IBV_ATOMIC_NONE";
  constexpr int kN = 50;
  VT_BUF(remote, b, 8);
  VT_BUF(local, a, 8 * kN);
  for (int i = 0; i < kN; ++i) {
    SendWr w(100 + i, IBV_WR_ATOMIC_FETCH_AND_ADD, {local->sge(8 * i, 8)});
    w.fetch_add(remote->addr(0), remote->rkey(), 3);
    ASSERT_EQ(post_send(a.qp, w), 0) << i;
  }
  auto wcs = poll_wcs(a.scq, kN);
  ASSERT_EQ(wcs.size(), size_t{kN});
  for (int i = 0; i < kN; ++i) {
    expect_wc(wcs[i], {.wr_id = uint64_t(100 + i), .opcode = IBV_WC_FETCH_ADD, .byte_len = 8, .qp_num = a.qpn()});
    EXPECT_EQ(local->u64(8 * i), uint64_t(3 * i)) << i;
  }
  EXPECT_EQ(remote->u64(0), uint64_t(3 * kN));
}

TEST_P(OpcodesRoce, InlineSendAndWriteUpToMaxInline) {
  qcfg.max_inline_data = 128;
  ASSERT_TRUE(connect());
  const uint32_t n = a.cap.max_inline_data;
  ASSERT_GE(n, 128u);
  VT_BUF(dst, b, n);
  VT_BUF(wdst, b, n);
  // Inline data needs no registration and is copied at post time.
  std::vector<uint8_t> src(n);
  fill_pattern(src.data(), n, 7);
  ASSERT_EQ(post_recv(b.qp, 1, {dst->sge(0, n)}), 0);
  SendWr s(2, IBV_WR_SEND, {ibv_sge{reinterpret_cast<uint64_t>(src.data()), n, 0}},
           IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  ASSERT_EQ(post_send(a.qp, s), 0);
  SendWr w(3, IBV_WR_RDMA_WRITE, {ibv_sge{reinterpret_cast<uint64_t>(src.data()), n, 0}},
           IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  w.rdma(wdst->addr(), wdst->rkey());
  ASSERT_EQ(post_send(a.qp, w), 0);
  std::memset(src.data(), 0, n);  // the WRs must not read this buffer any more
  auto wcs = poll_wcs(a.scq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  expect_wc(wcs[0], {.wr_id = 2, .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
  expect_wc(wcs[1], {.wr_id = 3, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 1, .opcode = IBV_WC_RECV, .byte_len = n, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(dst->data, n, 7), n);
  EXPECT_EQ(check_pattern(wdst->data, n, 7), n);
}

// Three gather SGEs on the sender, four scatter SGEs of other sizes on the receiver.
TEST_P(OpcodesRoce, SgeListsGatherAndScatter) {
  ASSERT_TRUE(connect());
  VT_BUF(s1, a, 8192);
  VT_BUF(s2, a, 4096);
  VT_BUF(r1, b, 4096);
  VT_BUF(r2, b, 4096);
  const uint32_t lens[3] = {1000, 37, 2500};
  fill_pattern(s1->data + 10, lens[0], 9, 0);
  fill_pattern(s2->data + 500, lens[1], 9, lens[0]);
  fill_pattern(s1->data + 2000, lens[2], 9, lens[0] + lens[1]);
  const uint32_t total = lens[0] + lens[1] + lens[2];  // 3537
  std::memset(r1->data, 0, 4096);
  std::memset(r2->data, 0, 4096);
  // Receive SGEs: 700 + 1 + 2000 + 1000 = 3701 >= 3537.
  ASSERT_EQ(post_recv(b.qp, 8, {r1->sge(0, 700), r2->sge(100, 1), r1->sge(1000, 2000), r2->sge(2000, 1000)}), 0);
  SendWr w(9, IBV_WR_SEND, {s1->sge(10, lens[0]), s2->sge(500, lens[1]), s1->sge(2000, lens[2])});
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 9, .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 8, .opcode = IBV_WC_RECV, .byte_len = total, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(r1->data, 700, 9, 0), 700u);
  EXPECT_EQ(check_pattern(r2->data + 100, 1, 9, 700), 1u);
  EXPECT_EQ(check_pattern(r1->data + 1000, 2000, 9, 701), 2000u);
  EXPECT_EQ(check_pattern(r2->data + 2000, total - 2701, 9, 2701), total - 2701);
  EXPECT_EQ(r2->data[2000 + total - 2701], 0) << "wrote past the message";

  // The same gather list into one RDMA WRITE, and a READ scattering into three SGEs.
  VT_BUF(target, b, 8192);
  SendWr wr(10, IBV_WR_RDMA_WRITE, {s1->sge(10, lens[0]), s2->sge(500, lens[1]), s1->sge(2000, lens[2])});
  wr.rdma(target->addr(64), target->rkey());
  ASSERT_EQ(post_send(a.qp, wr), 0);
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 10, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  EXPECT_EQ(check_pattern(target->data + 64, total, 9), total);

  VT_BUF(back, a, 8192);
  SendWr rd(11, IBV_WR_RDMA_READ, {back->sge(0, 1), back->sge(100, 2000), back->sge(4000, total - 2001)});
  rd.rdma(target->addr(64), target->rkey());
  ASSERT_EQ(post_send(a.qp, rd), 0);
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 11, .opcode = IBV_WC_RDMA_READ, .byte_len = total, .qp_num = a.qpn()});
  EXPECT_EQ(check_pattern(back->data, 1, 9, 0), 1u);
  EXPECT_EQ(check_pattern(back->data + 100, 2000, 9, 1), 2000u);
  EXPECT_EQ(check_pattern(back->data + 4000, total - 2001, 9, 2001), total - 2001);
}

TEST_P(OpcodesRoce, ZeroLengthSendWriteRead) {
  ASSERT_TRUE(connect());
  VT_BUF(buf, b, 64);
  VT_BUF(local, a, 64);
  std::memset(buf->data, 0x5a, 64);
  std::memset(local->data, 0xa5, 64);
  ASSERT_EQ(post_recv(b.qp, 1, {buf->sge(0, 64)}), 0);
  SendWr s(2, IBV_WR_SEND, {});
  ASSERT_EQ(post_send(a.qp, s), 0);
  SendWr w(3, IBV_WR_RDMA_WRITE, {});
  w.rdma(buf->addr(), buf->rkey());
  ASSERT_EQ(post_send(a.qp, w), 0);
  SendWr r(4, IBV_WR_RDMA_READ, {});
  r.rdma(buf->addr(), buf->rkey());
  ASSERT_EQ(post_send(a.qp, r), 0);
  ASSERT_EQ(post_recv(b.qp, 5, {}), 0);
  SendWr wi(6, IBV_WR_RDMA_WRITE_WITH_IMM, {});
  wi.rdma(buf->addr(), buf->rkey()).imm(66);
  ASSERT_EQ(post_send(a.qp, wi), 0);
  auto wcs = poll_wcs(a.scq, 4);
  ASSERT_EQ(wcs.size(), 4u);
  expect_wc(wcs[0], {.wr_id = 2, .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
  expect_wc(wcs[1], {.wr_id = 3, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  expect_wc(wcs[2], {.wr_id = 4, .opcode = IBV_WC_RDMA_READ, .byte_len = 0, .qp_num = a.qpn()});
  expect_wc(wcs[3], {.wr_id = 6, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  auto rwcs = poll_wcs(b.rcq, 2);
  ASSERT_EQ(rwcs.size(), 2u);
  expect_wc(rwcs[0], {.wr_id = 1, .opcode = IBV_WC_RECV, .byte_len = 0, .no_imm = true, .qp_num = b.qpn()});
  expect_wc(rwcs[1], {.wr_id = 5, .opcode = IBV_WC_RECV_RDMA_WITH_IMM, .byte_len = 0, .imm = 66, .qp_num = b.qpn()});
  for (int i = 0; i < 64; ++i) {
    ASSERT_EQ(buf->data[i], 0x5a) << i;
    ASSERT_EQ(local->data[i], 0xa5) << i;
  }
}

// A zero-length WRITE or READ touches no memory, so its R_Key and VA are not checked (hardware and rxe
// accept R_Key 0 there; UCX's rc_verbs flushes an endpoint with such a WRITE). The QP stays usable.
TEST_P(OpcodesRoce, ZeroLengthWriteAndReadIgnoreTheKey) {
  ASSERT_TRUE(connect());
  VT_BUF(buf, b, 64);
  fill_pattern(buf->data, 64, 7);
  SendWr w(1, IBV_WR_RDMA_WRITE, {});
  w.rdma(0, 0);
  ASSERT_EQ(post_send(a.qp, w), 0);
  SendWr r(2, IBV_WR_RDMA_READ, {});
  r.rdma(0, 0x12345678);
  ASSERT_EQ(post_send(a.qp, r), 0);
  ASSERT_EQ(post_recv(b.qp, 3, {}), 0);
  SendWr wi(4, IBV_WR_RDMA_WRITE_WITH_IMM, {});
  wi.rdma(0, 0).imm(9);
  ASSERT_EQ(post_send(a.qp, wi), 0);
  auto wcs = poll_wcs(a.scq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  expect_wc(wcs[0], {.wr_id = 1, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  expect_wc(wcs[1], {.wr_id = 2, .opcode = IBV_WC_RDMA_READ, .byte_len = 0, .qp_num = a.qpn()});
  expect_wc(wcs[2], {.wr_id = 4, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 3, .opcode = IBV_WC_RECV_RDMA_WITH_IMM, .byte_len = 0, .imm = 9, .qp_num = b.qpn()});
  // A WRITE with data is still checked, and the QP still carries it.
  VT_BUF(src, a, 64);
  fill_pattern(src->data, 64, 8);
  SendWr d(5, IBV_WR_RDMA_WRITE, {src->sge(0, 64)});
  d.rdma(buf->addr(), buf->rkey());
  ASSERT_EQ(post_send(a.qp, d), 0);
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 5, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  EXPECT_EQ(check_pattern(buf->data, 64, 8), 64u);
}

// 65 MiB WRITE, READ and SEND: more than 2^24 bytes, every byte checked.
TEST_P(OpcodesRoce, LargeMessages65MiB) {
  constexpr size_t kLen = 65u << 20;
  ASSERT_TRUE(connect());
  if (dev.port.max_msg_sz < kLen) GTEST_SKIP() << "max_msg_sz " << dev.port.max_msg_sz;
  VT_BUF(src, a, kLen);
  VT_BUF(dst, b, kLen);
  fill_pattern(src->data, kLen, 21);
  SendWr w(1, IBV_WR_RDMA_WRITE, {src->sge(0, kLen)});
  w.rdma(dst->addr(), dst->rkey());
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc, 120));
  expect_wc(wc, {.wr_id = 1, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  EXPECT_EQ(check_pattern(dst->data, kLen, 21), kLen);

  // READ back a different pattern into a cleared buffer.
  fill_pattern(dst->data, kLen, 22);
  std::memset(src->data, 0, kLen);
  SendWr r(2, IBV_WR_RDMA_READ, {src->sge(0, kLen)});
  r.rdma(dst->addr(), dst->rkey());
  ASSERT_EQ(post_send(a.qp, r), 0);
  ASSERT_TRUE(poll_wc(a.scq, &wc, 120));
  expect_wc(wc, {.wr_id = 2, .opcode = IBV_WC_RDMA_READ, .byte_len = kLen, .qp_num = a.qpn()});
  EXPECT_EQ(check_pattern(src->data, kLen, 22), kLen);

  // SEND it back the other way.
  fill_pattern(src->data, kLen, 23);
  std::memset(dst->data, 0, kLen);
  ASSERT_EQ(post_recv(b.qp, 3, {dst->sge(0, kLen)}), 0);
  SendWr s(4, IBV_WR_SEND, {src->sge(0, kLen)});
  ASSERT_EQ(post_send(a.qp, s), 0);
  ASSERT_TRUE(poll_wc(a.scq, &wc, 120));
  expect_wc(wc, {.wr_id = 4, .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
  ASSERT_TRUE(poll_wc(b.rcq, &wc, 120));
  expect_wc(wc, {.wr_id = 3, .opcode = IBV_WC_RECV, .byte_len = kLen, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(dst->data, kLen, 23), kLen);
}

// Every path MTU, with sizes around and between MTU multiples.
class PathMtu : public RcPair, public ::testing::WithParamInterface<ibv_mtu> {};

TEST_P(PathMtu, SendWriteReadOddSizes) {
  conn.path_mtu = GetParam();
  if (dev.ok() && dev.port.active_mtu < GetParam()) GTEST_SKIP() << "port active_mtu is smaller";
  ASSERT_TRUE(connect());
  const uint32_t mtu = 128u << GetParam();
  const uint32_t sizes[] = {1, mtu - 1, mtu, mtu + 1, 3 * mtu + 17, 10 * mtu - 3};
  const size_t cap = 10 * mtu + 64;
  VT_BUF(src, a, cap);
  VT_BUF(back, a, cap);
  VT_BUF(dst, b, cap);
  VT_BUF(wdst, b, cap);
  uint32_t seed = 100;
  for (uint32_t n : sizes) {
    SCOPED_TRACE("mtu " + std::to_string(mtu) + " size " + std::to_string(n));
    ++seed;
    fill_pattern(src->data, n, seed);
    ASSERT_EQ(post_recv(b.qp, n, {dst->sge(0, cap)}), 0);
    SendWr s(1, IBV_WR_SEND, {src->sge(0, n)});
    ASSERT_EQ(post_send(a.qp, s), 0);
    SendWr w(2, IBV_WR_RDMA_WRITE, {src->sge(0, n)});
    w.rdma(wdst->addr(3), wdst->rkey());
    ASSERT_EQ(post_send(a.qp, w), 0);
    SendWr r(3, IBV_WR_RDMA_READ, {back->sge(5, n)});
    r.rdma(wdst->addr(3), wdst->rkey());
    ASSERT_EQ(post_send(a.qp, r), 0);
    auto wcs = poll_wcs(a.scq, 3);
    ASSERT_EQ(wcs.size(), 3u);
    expect_wc(wcs[0], {.wr_id = 1, .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
    expect_wc(wcs[1], {.wr_id = 2, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
    expect_wc(wcs[2], {.wr_id = 3, .opcode = IBV_WC_RDMA_READ, .byte_len = n, .qp_num = a.qpn()});
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(b.rcq, &wc));
    expect_wc(wc, {.wr_id = n, .opcode = IBV_WC_RECV, .byte_len = n, .qp_num = b.qpn()});
    EXPECT_EQ(check_pattern(dst->data, n, seed), n);
    EXPECT_EQ(check_pattern(wdst->data + 3, n, seed), n);
    EXPECT_EQ(check_pattern(back->data + 5, n, seed), n);
  }
}

INSTANTIATE_TEST_SUITE_P(AllMtus, PathMtu,
                         ::testing::Values(IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096),
                         [](const ::testing::TestParamInfo<ibv_mtu>& i) {
                           return "mtu" + std::to_string(128u << i.param);
                         });

VT_INSTANTIATE_PATHS(Opcodes, VT_ALL_PATHS);
VT_INSTANTIATE_PATHS(OpcodesRoce, VT_ROCE_PATHS);

}  // namespace
}  // namespace softrdma::verbs_test
