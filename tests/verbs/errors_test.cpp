// Error completions, each provoked, then the QP in ERR with later WRs flushed.
#include "helpers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace softrdma::verbs_test {
namespace {

class ErrorsBase : public RcPair {
 protected:
  // The QP is in ERR: a newly posted send and receive each complete with WR_FLUSH_ERR.
  void expect_err_and_flush(Side& s) {
    EXPECT_TRUE(wait_qp_state(s.qp, IBV_QPS_ERR));
    VT_BUF(scratch, s, 64);
    SendWr w(0xf1f1, IBV_WR_SEND, {scratch->sge(0, 8)});
    ASSERT_EQ(post_send(s.qp, w), 0) << "posting to a QP in ERR is legal and flushes";
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(s.scq, &wc));
    expect_wc(wc, {.wr_id = 0xf1f1, .status = IBV_WC_WR_FLUSH_ERR, .qp_num = s.qpn()});
    ASSERT_EQ(post_recv(s.qp, 0xf2f2, {scratch->sge(0, 8)}), 0);
    ASSERT_TRUE(poll_wc(s.rcq, &wc));
    expect_wc(wc, {.wr_id = 0xf2f2, .status = IBV_WC_WR_FLUSH_ERR, .qp_num = s.qpn()});
  }

  // Posts `bad`, then a valid WRITE right behind it: the first completes with `status`,
  // the second is flushed, and the QP ends in ERR.
  void expect_requester_error(SendWr& bad, ibv_wc_status status) {
    VT_BUF(src, a, 64);
    VT_BUF(dst, b, 64);
    ASSERT_EQ(post_send(a.qp, bad), 0);
    SendWr after(0xaf7e, IBV_WR_RDMA_WRITE, {src->sge(0, 8)});
    after.rdma(dst->addr(), dst->rkey());
    ASSERT_EQ(post_send(a.qp, after), 0);
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(a.scq, &wc));
    expect_wc(wc, {.wr_id = bad.wr.wr_id, .status = status, .qp_num = a.qpn()});
    ASSERT_TRUE(poll_wc(a.scq, &wc));
    expect_wc(wc, {.wr_id = 0xaf7e, .status = IBV_WC_WR_FLUSH_ERR, .qp_num = a.qpn()});
    expect_err_and_flush(a);
  }
};
using Errors = OverPaths<ErrorsBase>;
// Off iWARP: atomics and immediate data do not exist there, a SEND without a receive ends the
// connection (no RNR NAK), and there is no RDMA-level acknowledgement: a SEND or WRITE completes with
// success once its bytes are in the socket, and the responder's error reaches the requester later
// as a Terminate (docs/iwarp.md, "Completion"), so the requester statuses below are RoCE's.
using ErrorsRoce = Errors;

// Receive buffer too small for a SEND: receiver LOC_LEN_ERR, sender REM_INV_REQ_ERR.
TEST_P(ErrorsRoce, LocLenErrOnShortReceive) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 200);
  VT_BUF(dst, b, 200);
  ASSERT_EQ(post_recv(b.qp, 1, {dst->sge(0, 100)}), 0);
  SendWr s(2, IBV_WR_SEND, {src->sge(0, 200)});
  ASSERT_EQ(post_send(a.qp, s), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 1, .status = IBV_WC_LOC_LEN_ERR, .qp_num = b.qpn()});
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 2, .status = IBV_WC_REM_INV_REQ_ERR, .qp_num = a.qpn()});
  expect_err_and_flush(a);
  expect_err_and_flush(b);
}

TEST_P(Errors, LocProtErrWrongLkey) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  ASSERT_EQ(post_recv(b.qp, 1, {dst->sge(0, 64)}), 0);
  ibv_sge sge = src->sge(0, 64);
  sge.lkey ^= 0x00a5a5a5;
  SendWr s(2, IBV_WR_SEND, {sge});
  ASSERT_NO_FATAL_FAILURE(expect_requester_error(s, IBV_WC_LOC_PROT_ERR));
}

TEST_P(Errors, LocProtErrSgeOutsideMr) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 4096);
  VT_BUF(dst, b, 8192);
  std::memset(dst->data, 0x11, 8192);
  // Starts inside the MR, ends 1 byte past it.
  SendWr w(3, IBV_WR_RDMA_WRITE, {src->sge(4000, 97)});
  w.rdma(dst->addr(), dst->rkey());
  ASSERT_NO_FATAL_FAILURE(expect_requester_error(w, IBV_WC_LOC_PROT_ERR));
  for (int i = 0; i < 8192; ++i) ASSERT_EQ(dst->data[i], 0x11) << i;
}

TEST_P(Errors, LocProtErrReadIntoMrWithoutLocalWrite) {
  ASSERT_TRUE(connect());
  VT_BUF(remote, b, 256);
  VT_BUF(local, a, 256, IBV_ACCESS_REMOTE_READ);  // no LOCAL_WRITE
  fill_pattern(remote->data, 256, 81);
  std::memset(local->data, 0x22, 256);
  SendWr r(4, IBV_WR_RDMA_READ, {local->sge(0, 256)});
  r.rdma(remote->addr(), remote->rkey());
  ASSERT_NO_FATAL_FAILURE(expect_requester_error(r, IBV_WC_LOC_PROT_ERR));
  for (int i = 0; i < 256; ++i) ASSERT_EQ(local->data[i], 0x22) << i;
}

// A WR the QP cannot execute: either refused at post time (EINVAL/ENOMEM, and the QP stays
// usable) or completed with LOC_QP_OP_ERR (and the QP in ERR).
class LocalQpOp : public Errors {
 protected:
  void expect_refused(SendWr& w) {
    ibv_send_wr* bad = nullptr;
    ibv_send_wr* wr = w.get();
    int rc = ibv_post_send(a.qp, wr, &bad);
    if (rc != 0) {
      EXPECT_TRUE(rc == EINVAL || rc == ENOMEM) << "post_send returned " << rc;
      EXPECT_EQ(bad, wr);
      // Nothing was posted: the QP still works.
      EXPECT_EQ(qp_state(a.qp), IBV_QPS_RTS);
      VT_BUF(src, a, 64);
      VT_BUF(dst, b, 64);
      fill_pattern(src->data, 64, 82);
      SendWr ok(0x600d, IBV_WR_RDMA_WRITE, {src->sge(0, 64)});
      ok.rdma(dst->addr(), dst->rkey());
      ASSERT_EQ(post_send(a.qp, ok), 0);
      ibv_wc wc{};
      ASSERT_TRUE(poll_wc(a.scq, &wc));
      expect_wc(wc, {.wr_id = 0x600d, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
      EXPECT_EQ(check_pattern(dst->data, 64, 82), 64u);
    } else {
      ibv_wc wc{};
      ASSERT_TRUE(poll_wc(a.scq, &wc));
      expect_wc(wc, {.wr_id = w.wr.wr_id, .status = IBV_WC_LOC_QP_OP_ERR, .qp_num = a.qpn()});
      expect_err_and_flush(a);
    }
  }
};

TEST_P(LocalQpOp, TooManySges) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 4096);
  VT_BUF(dst, b, 4096);
  std::vector<ibv_sge> sges;
  for (uint32_t i = 0; i <= a.cap.max_send_sge; ++i) sges.push_back(src->sge(i * 8, 8));
  SendWr w(5, IBV_WR_RDMA_WRITE, sges);
  w.rdma(dst->addr(), dst->rkey());
  ASSERT_NO_FATAL_FAILURE(expect_refused(w));
}

TEST_P(LocalQpOp, OpcodeNotValidForRc) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 64);
  SendWr w(6, IBV_WR_TSO, {src->sge(0, 64)});  // TSO exists only on UD/raw packet QPs
  ASSERT_NO_FATAL_FAILURE(expect_refused(w));
}

TEST_P(LocalQpOp, InlineLargerThanMaxInline) {
  ASSERT_TRUE(connect());
  std::vector<uint8_t> big(a.cap.max_inline_data + 1);
  SendWr w(7, IBV_WR_SEND, {ibv_sge{reinterpret_cast<uint64_t>(big.data()), uint32_t(big.size()), 0}},
           IBV_SEND_SIGNALED | IBV_SEND_INLINE);
  ASSERT_NO_FATAL_FAILURE(expect_refused(w));
}

class RemoteAccess : public Errors {
 protected:
  // The WR fails with REM_ACCESS_ERR and `target` keeps its 0x33 fill.
  void run(SendWr& w, Buffer& target) {
    ASSERT_NO_FATAL_FAILURE(expect_requester_error(w, IBV_WC_REM_ACCESS_ERR));
    for (size_t i = 0; i < target.len; ++i) ASSERT_EQ(target.data[i], 0x33) << "target changed at " << i;
  }
};
// Off iWARP: immediate data and atomics do not exist there, and a WRITE completes with success once
// its bytes are in the socket (the remote access error comes later, as a Terminate).
using RemoteAccessRoce = RemoteAccess;

TEST_P(RemoteAccessRoce, WrongRkey) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 256);
  VT_BUF(dst, b, 256);
  std::memset(dst->data, 0x33, 256);
  SendWr w(10, IBV_WR_RDMA_WRITE, {src->sge(0, 256)});
  w.rdma(dst->addr(), dst->rkey() ^ 0x01000100);
  ASSERT_NO_FATAL_FAILURE(run(w, *dst));
}

TEST_P(RemoteAccessRoce, WriteBeyondMrEnd) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 256);
  VT_BUF(dst, b, 4096);
  std::memset(dst->data, 0x33, 4096);
  SendWr w(11, IBV_WR_RDMA_WRITE, {src->sge(0, 100)});
  w.rdma(dst->addr(4096 - 50), dst->rkey());
  ASSERT_NO_FATAL_FAILURE(run(w, *dst));
}

TEST_P(RemoteAccess, ReadBeforeMrStart) {
  ASSERT_TRUE(connect());
  VT_BUF(local, a, 256);
  VT_BUF(remote, b, 4096);
  std::memset(remote->data, 0x33, 4096);
  std::memset(local->data, 0x44, 256);
  SendWr r(12, IBV_WR_RDMA_READ, {local->sge(0, 64)});
  r.rdma(remote->addr() - 8, remote->rkey());
  ASSERT_NO_FATAL_FAILURE(run(r, *remote));
  for (int i = 0; i < 256; ++i) ASSERT_EQ(local->data[i], 0x44) << i;
}

TEST_P(RemoteAccessRoce, WriteToMrWithoutRemoteWrite) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 256);
  VT_BUF(dst, b, 256, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  std::memset(dst->data, 0x33, 256);
  SendWr w(13, IBV_WR_RDMA_WRITE, {src->sge(0, 256)});
  w.rdma(dst->addr(), dst->rkey());
  ASSERT_NO_FATAL_FAILURE(run(w, *dst));
}

TEST_P(RemoteAccessRoce, WriteWithImmToMrWithoutRemoteWrite) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 256);
  VT_BUF(dst, b, 256, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  std::memset(dst->data, 0x33, 256);
  ASSERT_EQ(post_recv(b.qp, 1, {}), 0);
  SendWr w(14, IBV_WR_RDMA_WRITE_WITH_IMM, {src->sge(0, 256)});
  w.rdma(dst->addr(), dst->rkey()).imm(1);
  ASSERT_NO_FATAL_FAILURE(run(w, *dst));
}

TEST_P(RemoteAccess, ReadFromMrWithoutRemoteRead) {
  ASSERT_TRUE(connect());
  VT_BUF(local, a, 256);
  VT_BUF(remote, b, 256, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  std::memset(remote->data, 0x33, 256);
  std::memset(local->data, 0x44, 256);
  SendWr r(15, IBV_WR_RDMA_READ, {local->sge(0, 256)});
  r.rdma(remote->addr(), remote->rkey());
  ASSERT_NO_FATAL_FAILURE(run(r, *remote));
  for (int i = 0; i < 256; ++i) ASSERT_EQ(local->data[i], 0x44) << i;
}

TEST_P(RemoteAccessRoce, AtomicOnMrWithoutRemoteAtomic) {
  ASSERT_TRUE(connect());
  if (!atomics_supported()) GTEST_SKIP() << "device reports IBV_ATOMIC_NONE";
  VT_BUF(local, a, 64);
  VT_BUF(remote, b, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  std::memset(remote->data, 0x33, 64);
  SendWr f(16, IBV_WR_ATOMIC_FETCH_AND_ADD, {local->sge(0, 8)});
  f.fetch_add(remote->addr(8), remote->rkey(), 1);
  ASSERT_NO_FATAL_FAILURE(run(f, *remote));
}

// An rkey that is valid, but for an MR of another protection domain.
TEST_P(RemoteAccessRoce, RkeyOfAnotherPd) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 256);
  // a's own PD is not b's: a WRITE arriving at b must not reach an MR of a's PD.
  VT_BUF(foreign, a, 256);
  std::memset(foreign->data, 0x33, 256);
  SendWr w(17, IBV_WR_RDMA_WRITE, {src->sge(0, 256)});
  w.rdma(foreign->addr(), foreign->rkey());
  ASSERT_NO_FATAL_FAILURE(run(w, *foreign));
}

// Misaligned atomic: the responder answers NAK Invalid Request -- or the requester already
// refuses the WR at post time with EINVAL (kernel rxe does that; ibv_post_send(3) allows it).
TEST_P(ErrorsRoce, RemInvReqErrMisalignedAtomic) {
  ASSERT_TRUE(connect());
  if (!atomics_supported()) GTEST_SKIP() << "device reports IBV_ATOMIC_NONE";
  VT_BUF(local, a, 64);
  VT_BUF(remote, b, 64);
  std::memset(remote->data, 0x33, 64);
  SendWr f(18, IBV_WR_ATOMIC_FETCH_AND_ADD, {local->sge(0, 8)});
  f.fetch_add(remote->addr(4), remote->rkey(), 1);
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(a.qp, f.get(), &bad);
  if (rc != 0) {
    EXPECT_EQ(rc, EINVAL);
    EXPECT_EQ(bad, &f.wr);
  } else {
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(a.scq, &wc));
    expect_wc(wc, {.wr_id = 18, .status = IBV_WC_REM_INV_REQ_ERR, .qp_num = a.qpn()});
    expect_err_and_flush(a);
  }
  for (int i = 0; i < 64; ++i) ASSERT_EQ(remote->data[i], 0x33) << i;
}

// The responder cannot use its own receive WQE (bad lkey): it reports a local protection
// error, the requester gets a Remote Operational Error NAK.
TEST_P(ErrorsRoce, RemOpErrOnBadReceiveLkey) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  std::memset(dst->data, 0x33, 64);
  ibv_sge rsge = dst->sge(0, 64);
  rsge.lkey ^= 0x00a5a5a5;
  ASSERT_EQ(post_recv(b.qp, 1, {rsge}), 0);
  SendWr s(19, IBV_WR_SEND, {src->sge(0, 64)});
  ASSERT_EQ(post_send(a.qp, s), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 1, .status = IBV_WC_LOC_PROT_ERR, .qp_num = b.qpn()});
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 19, .status = IBV_WC_REM_OP_ERR, .qp_num = a.qpn()});
  for (int i = 0; i < 64; ++i) ASSERT_EQ(dst->data[i], 0x33) << i;
  expect_err_and_flush(a);
  expect_err_and_flush(b);
}

class Retry : public Errors {
 protected:
  void SetUp() override {
    Errors::SetUp();
    conn.timeout = 8;  // ~1 ms
    conn.retry_cnt = 1;
  }
};
// Packets only: over iWARP TCP retransmits (no transport timer or retry count), and on the direct
// path a peer that is gone or not ready is never reached directly: these go by packets there too.

// The peer QP is destroyed after the connection was set up: nothing ever answers.
TEST_P(Retry, RetryExcErrPeerDestroyed) {
  ASSERT_TRUE(connect());
  b.destroy_qp();
  VT_BUF(src, a, 64);
  SendWr s(20, IBV_WR_SEND, {src->sge(0, 64)});
  ASSERT_EQ(post_send(a.qp, s), 0);
  SendWr s2(21, IBV_WR_SEND, {src->sge(0, 64)});
  ASSERT_EQ(post_send(a.qp, s2), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 20, .status = IBV_WC_RETRY_EXC_ERR, .qp_num = a.qpn()});
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 21, .status = IBV_WC_WR_FLUSH_ERR, .qp_num = a.qpn()});
  expect_err_and_flush(a);
}

// An RDMA WRITE towards a QP number that was never connected (the peer stays in INIT,
// which silently drops packets).
TEST_P(Retry, RetryExcErrPeerNotReady) {
  ASSERT_TRUE(a.create(dev, qcfg));
  ASSERT_TRUE(b.create(dev, qcfg));
  ASSERT_EQ(bring_up(a.qp, a.psn, b.qpn(), b.psn, dev.gid, conn, dev.attr), 0);
  ASSERT_EQ(modify_to_init(b.qp, conn.access), 0);
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  std::memset(dst->data, 0x33, 64);
  SendWr w(22, IBV_WR_RDMA_WRITE, {src->sge(0, 64)});
  w.rdma(dst->addr(), dst->rkey());
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 22, .status = IBV_WC_RETRY_EXC_ERR, .qp_num = a.qpn()});
  for (int i = 0; i < 64; ++i) ASSERT_EQ(dst->data[i], 0x33) << "INIT QP accepted a WRITE at " << i;
  expect_err_and_flush(a);
}

// The direct path only (its own parameter is rnr_retry).
class Rnr : public ErrorsBase, public ::testing::WithParamInterface<int> {};

// SEND with no receive posted and a finite rnr_retry.
TEST_P(Rnr, RnrRetryExcErr) {
  conn.min_rnr_timer = 1;  // 0.01 ms
  conn.rnr_retry = static_cast<uint8_t>(GetParam());
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 64);
  SendWr s(23, IBV_WR_SEND, {src->sge(0, 64)});
  ASSERT_EQ(post_send(a.qp, s), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 23, .status = IBV_WC_RNR_RETRY_EXC_ERR, .qp_num = a.qpn()});
  expect_err_and_flush(a);
  // RNR is not an error of the responder: it stays in RTS and reported nothing.
  EXPECT_EQ(qp_state(b.qp), IBV_QPS_RTS);
  EXPECT_EQ(drain_cq(b.rcq), 0);
}

INSTANTIATE_TEST_SUITE_P(RnrRetry, Rnr, ::testing::Values(0, 1));

// With rnr_retry 7 (infinite) a SEND waits until the receive shows up.
TEST_P(ErrorsRoce, RnrInfiniteRetryWaitsForReceive) {
  conn.min_rnr_timer = 1;
  conn.rnr_retry = 7;
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  fill_pattern(src->data, 64, 83);
  SendWr s(24, IBV_WR_SEND, {src->sge(0, 64)});
  ASSERT_EQ(post_send(a.qp, s), 0);
  usleep(50 * 1000);  // let a few RNR NAKs happen; correctness does not depend on it
  ASSERT_EQ(post_recv(b.qp, 25, {dst->sge(0, 64)}), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 24, .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 25, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(dst->data, 64, 83), 64u);
}

// Moving a QP to ERR flushes every outstanding receive, in order, and later sends.
TEST_P(Errors, WrFlushErrOnModifyToErr) {
  ASSERT_TRUE(connect());
  VT_BUF(buf, a, 4096);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(post_recv(a.qp, 300 + i, {buf->sge(i * 64, 64)}), 0);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(a.qp, &attr, IBV_QP_STATE), 0);
  auto wcs = poll_wcs(a.rcq, 5);
  ASSERT_EQ(wcs.size(), 5u);
  for (int i = 0; i < 5; ++i)
    expect_wc(wcs[i], {.wr_id = uint64_t(300 + i), .status = IBV_WC_WR_FLUSH_ERR, .qp_num = a.qpn()});
  for (int i = 0; i < 3; ++i) {
    SendWr s(400 + i, IBV_WR_SEND, {buf->sge(0, 64)});
    ASSERT_EQ(post_send(a.qp, s), 0);
  }
  wcs = poll_wcs(a.scq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  for (int i = 0; i < 3; ++i)
    expect_wc(wcs[i], {.wr_id = uint64_t(400 + i), .status = IBV_WC_WR_FLUSH_ERR, .qp_num = a.qpn()});
  EXPECT_EQ(qp_state(a.qp), IBV_QPS_ERR);
}

// Deregistering an MR while a large operation on it is in flight, then unmapping its pages at once:
// the operation either finished first or ends with the protection error of its side, and nothing
// touches the unmapped memory (a touch would kill the test process).
class DeregInFlightBase : public RcPair {
 protected:
  static constexpr size_t kLen = 24 << 20;
  struct Region {
    uint8_t* mem = nullptr;
    ibv_mr* mr = nullptr;
  };
  Region map_and_register(ibv_pd* pd) {
    Region r;
    void* p = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return r;
    r.mem = static_cast<uint8_t*>(p);
    std::memset(r.mem, 0x5A, kLen);
    r.mr = ibv_reg_mr(pd, r.mem, kLen, kAllAccess);
    return r;
  }
  void release(Region& r) {
    if (r.mr) {
      EXPECT_EQ(ibv_dereg_mr(r.mr), 0);
    }
    if (r.mem) munmap(r.mem, kLen);
    r = {};
  }
  // Posts op from a's region to b's, then pulls the MR of `victim` away and unmaps it.
  void run(ibv_wr_opcode op, bool victim_is_remote, std::initializer_list<ibv_wc_status> allowed) {
    ASSERT_TRUE(connect());
    Region local = map_and_register(a.pd), remote = map_and_register(b.pd);
    ASSERT_TRUE(local.mr && remote.mr);
    SendWr w(77, op, {ibv_sge{reinterpret_cast<uint64_t>(local.mem), static_cast<uint32_t>(kLen), local.mr->lkey}});
    w.rdma(reinterpret_cast<uint64_t>(remote.mem), remote.mr->rkey);
    ASSERT_EQ(post_send(a.qp, w), 0);
    release(victim_is_remote ? remote : local);
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(a.scq, &wc)) << "the operation never completed";
    bool ok = false;
    for (ibv_wc_status s : allowed) ok |= wc.status == s;
    EXPECT_TRUE(ok) << "status " << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, 77u);
    if (wc.status != IBV_WC_SUCCESS) {
      EXPECT_TRUE(wait_qp_state(a.qp, IBV_QPS_ERR));
    }
    release(local);
    release(remote);
  }
};
using DeregInFlight = OverPaths<DeregInFlightBase>;

TEST_P(DeregInFlight, TargetOfWriteDeregisteredAndUnmapped) {
  run(IBV_WR_RDMA_WRITE, true, {IBV_WC_SUCCESS, IBV_WC_REM_ACCESS_ERR});
}

TEST_P(DeregInFlight, SourceOfWriteDeregisteredAndUnmapped) {
  run(IBV_WR_RDMA_WRITE, false, {IBV_WC_SUCCESS, IBV_WC_LOC_PROT_ERR});
}

TEST_P(DeregInFlight, DestinationOfReadDeregisteredAndUnmapped) {
  run(IBV_WR_RDMA_READ, false, {IBV_WC_SUCCESS, IBV_WC_LOC_PROT_ERR});
}

TEST_P(DeregInFlight, SourceOfReadDeregisteredAndUnmapped) {
  run(IBV_WR_RDMA_READ, true, {IBV_WC_SUCCESS, IBV_WC_REM_ACCESS_ERR, IBV_WC_RETRY_EXC_ERR});
}

VT_INSTANTIATE_PATHS(Errors, VT_ALL_PATHS);
VT_INSTANTIATE_PATHS(ErrorsRoce, VT_ROCE_PATHS);
// Off iWARP: a refused WR is followed by a WRITE whose target is checked at its completion.
VT_INSTANTIATE_PATHS(LocalQpOp, VT_ROCE_PATHS);
VT_INSTANTIATE_PATHS(RemoteAccess, VT_ALL_PATHS);
VT_INSTANTIATE_PATHS(RemoteAccessRoce, VT_ROCE_PATHS);
VT_INSTANTIATE_PATHS(Retry, Path::Packets);
VT_INSTANTIATE_PATHS(DeregInFlight, VT_ALL_PATHS);

}  // namespace
}  // namespace softrdma::verbs_test
