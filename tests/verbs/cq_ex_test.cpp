// The extended CQ: ibv_create_cq_ex, ibv_start_poll/ibv_next_poll/ibv_end_poll, the ibv_wc_read_*
// accessors (checked field by field against what ibv_poll_cq returns for the same traffic), completion
// timestamps against ibv_query_rt_values_ex and the wall clock, and interplay with ibv_poll_cq and
// completion channels on the same CQ.
#include <poll.h>
#include <sched.h>
#include <time.h>

#include <chrono>
#include <cstring>
#include <functional>

#include "helpers.h"

namespace softrdma::verbs_test {
namespace {

constexpr uint64_t kAllWcFlags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
                                 IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |
                                 IBV_WC_EX_WITH_DLID_PATH_BITS;
constexpr uint64_t kTimestampFlags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

// One completion as read through the accessors, laid out as ibv_poll_cq would have returned it.
struct ExWc {
  ibv_wc wc{};
  uint64_t ts = 0;
  uint64_t wallclock_ns = 0;
};

ExWc read_current(ibv_cq_ex* cq, uint64_t flags) {
  ExWc e;
  e.wc.wr_id = cq->wr_id;
  e.wc.status = cq->status;
  e.wc.opcode = ibv_wc_read_opcode(cq);
  e.wc.vendor_err = ibv_wc_read_vendor_err(cq);
  e.wc.wc_flags = ibv_wc_read_wc_flags(cq);
  if (flags & IBV_WC_EX_WITH_BYTE_LEN) e.wc.byte_len = ibv_wc_read_byte_len(cq);
  if ((flags & IBV_WC_EX_WITH_IMM) && (e.wc.wc_flags & IBV_WC_WITH_IMM)) e.wc.imm_data = ibv_wc_read_imm_data(cq);
  if ((flags & IBV_WC_EX_WITH_IMM) && (e.wc.wc_flags & IBV_WC_WITH_INV))
    e.wc.invalidated_rkey = ibv_wc_read_invalidated_rkey(cq);
  if (flags & IBV_WC_EX_WITH_QP_NUM) e.wc.qp_num = ibv_wc_read_qp_num(cq);
  if (flags & IBV_WC_EX_WITH_SRC_QP) e.wc.src_qp = ibv_wc_read_src_qp(cq);
  if (flags & IBV_WC_EX_WITH_SLID) e.wc.slid = static_cast<uint16_t>(ibv_wc_read_slid(cq));
  if (flags & IBV_WC_EX_WITH_SL) e.wc.sl = ibv_wc_read_sl(cq);
  if (flags & IBV_WC_EX_WITH_DLID_PATH_BITS) e.wc.dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
  if (flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) e.ts = ibv_wc_read_completion_ts(cq);
  if (flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
    e.wallclock_ns = ibv_wc_read_completion_wallclock_ns(cq);
  return e;
}

// Polls exactly n completions with start/next/end (bounded; fewer with a gtest failure). Never takes
// more than n off the CQ.
std::vector<ExWc> poll_ex(ibv_cq_ex* cq, size_t n, uint64_t flags, int timeout_s = kWaitSeconds) {
  std::vector<ExWc> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (out.size() < n) {
    ibv_poll_cq_attr attr{};
    int rc = ibv_start_poll(cq, &attr);
    if (rc == ENOENT) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "only " << out.size() << " of " << n << " completions within " << timeout_s << " s";
        break;
      }
      sched_yield();
      continue;
    }
    if (rc != 0) {
      ADD_FAILURE() << "ibv_start_poll: " << rc;
      break;
    }
    out.push_back(read_current(cq, flags));
    while (out.size() < n) {
      rc = ibv_next_poll(cq);
      if (rc == ENOENT) break;
      if (rc != 0) {
        ADD_FAILURE() << "ibv_next_poll: " << rc;
        break;
      }
      out.push_back(read_current(cq, flags));
    }
    ibv_end_poll(cq);
    if (rc != 0 && rc != ENOENT) break;
  }
  return out;
}

ibv_cq_ex* make_cq_ex(ibv_context* ctx, int cqe, uint64_t wc_flags, ibv_comp_channel* ch = nullptr,
                      uint32_t flags = 0) {
  ibv_cq_init_attr_ex a{};
  a.cqe = static_cast<uint32_t>(cqe);
  a.channel = ch;
  a.wc_flags = wc_flags;
  if (flags) {
    a.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
    a.flags = flags;
  }
  return ibv_create_cq_ex(ctx, &a);
}

uint64_t raw_clock(ibv_context* ctx) {
  ibv_values_ex v{};
  v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  int rc = ibv_query_rt_values_ex(ctx, &v);
  EXPECT_EQ(rc, 0) << "ibv_query_rt_values_ex";
  EXPECT_TRUE(v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK);
  return static_cast<uint64_t>(v.raw_clock.tv_sec) * 1000000000ull + static_cast<uint64_t>(v.raw_clock.tv_nsec);
}

uint64_t realtime_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Two completions of the same work: identical in every field ibv_wc defines for their status.
void expect_same(const ibv_wc& classic, const ibv_wc& ex, const char* what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(ex.wr_id, classic.wr_id);
  EXPECT_EQ(ex.status, classic.status) << ibv_wc_status_str(ex.status) << " vs " << ibv_wc_status_str(classic.status);
  EXPECT_EQ(ex.qp_num, classic.qp_num);
  EXPECT_EQ(ex.vendor_err, classic.vendor_err);
  if (classic.status != IBV_WC_SUCCESS) return;
  EXPECT_EQ(ex.opcode, classic.opcode);
  EXPECT_EQ(ex.byte_len, classic.byte_len);
  EXPECT_EQ(ex.wc_flags, classic.wc_flags);
  if (classic.wc_flags & IBV_WC_WITH_IMM) {
    EXPECT_EQ(ex.imm_data, classic.imm_data);
  }
  if (classic.wc_flags & IBV_WC_WITH_INV) {
    EXPECT_EQ(ex.invalidated_rkey, classic.invalidated_rkey);
  }
  EXPECT_EQ(ex.src_qp, classic.src_qp);
  EXPECT_EQ(ex.slid, classic.slid);
  EXPECT_EQ(ex.sl, classic.sl);
  EXPECT_EQ(ex.dlid_path_bits, classic.dlid_path_bits);
}

// An RC pair whose four CQs are extended CQs (polled through either API).
class CqExBase : public RcPair {
 protected:
  uint64_t wc_flags = kAllWcFlags | kTimestampFlags;
  bool use_ex = true;  // how poll() reads completions

  // Completions of one scenario run, send CQ of a and receive CQ of b.
  struct Run {
    std::vector<ibv_wc> send, recv;
  };

  ibv_cq_ex* ex(ibv_cq* cq) { return reinterpret_cast<ibv_cq_ex*>(cq); }

  bool create_side(Side& s) {
    s.dev = &dev;
    s.pd = ibv_alloc_pd(dev.ctx);
    if (!s.pd) {
      ADD_FAILURE() << "ibv_alloc_pd: " << strerror(errno);
      return false;
    }
    ibv_cq_ex* scq = make_cq_ex(dev.ctx, qcfg.send_cqe, wc_flags, qcfg.send_channel);
    ibv_cq_ex* rcq = make_cq_ex(dev.ctx, qcfg.recv_cqe, wc_flags, qcfg.recv_channel);
    if (scq) s.scq = ibv_cq_ex_to_cq(scq);
    if (rcq) s.rcq = ibv_cq_ex_to_cq(rcq);
    if (!scq || !rcq) {
      ADD_FAILURE() << "ibv_create_cq_ex: " << strerror(errno);
      return false;
    }
    ibv_qp_init_attr_ex ia{};
    ia.send_cq = s.scq;
    ia.recv_cq = s.rcq;
    ia.cap = {qcfg.max_send_wr, qcfg.max_recv_wr, qcfg.max_send_sge, qcfg.max_recv_sge, qcfg.max_inline_data};
    ia.qp_type = IBV_QPT_RC;
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ia.pd = s.pd;
    ia.send_ops_flags = qcfg.send_ops_flags;
    s.qp = ibv_create_qp_ex(dev.ctx, &ia);
    if (!s.qp) {
      ADD_FAILURE() << "ibv_create_qp_ex: " << strerror(errno);
      return false;
    }
    s.qpx = ibv_qp_to_qp_ex(s.qp);
    s.cap = ia.cap;
    s.psn = random_psn();
    return true;
  }

  bool connect_ex() {
    a.reset();
    b.reset();
    if (!create_side(a) || !create_side(b)) return false;
    int rc = bring_up(a.qp, a.psn, b.qpn(), b.psn, dev.gid, conn, dev.attr);
    if (!rc) rc = bring_up(b.qp, b.psn, a.qpn(), a.psn, dev.gid, conn, dev.attr);
    if (rc) ADD_FAILURE() << "bring up: " << strerror(rc);
    return rc == 0;
  }

  std::vector<ibv_wc> poll(ibv_cq* cq, size_t n) {
    if (!use_ex) return poll_wcs(cq, n);
    std::vector<ibv_wc> out;
    for (const ExWc& e : poll_ex(ex(cq), n, wc_flags)) out.push_back(e.wc);
    return out;
  }

  // Runs the scenario on a fresh pair twice, polling with ibv_poll_cq and then with the extended API,
  // and checks both runs completed identically.
  void run_both(const std::function<void(Run&)>& scenario) {
    Run runs[2];
    for (int i = 0; i < 2; ++i) {
      use_ex = i == 1;
      SCOPED_TRACE(use_ex ? "polled with ibv_start_poll" : "polled with ibv_poll_cq");
      ASSERT_TRUE(connect_ex());
      scenario(runs[i]);
      if (HasFatalFailure()) return;
      // QP numbers differ between the runs: compare the roles they name instead.
      for (auto* v : {&runs[i].send, &runs[i].recv}) {
        for (ibv_wc& w : *v) {
          for (uint32_t* n : {&w.qp_num, &w.src_qp}) *n = *n == a.qpn() ? 1 : *n == b.qpn() ? 2 : *n;
        }
      }
    }
    ASSERT_EQ(runs[0].send.size(), runs[1].send.size());
    ASSERT_EQ(runs[0].recv.size(), runs[1].recv.size());
    for (size_t i = 0; i < runs[0].send.size(); ++i) expect_same(runs[0].send[i], runs[1].send[i], "send CQ");
    for (size_t i = 0; i < runs[0].recv.size(); ++i) expect_same(runs[0].recv[i], runs[1].recv[i], "recv CQ");
  }
};
using CqEx = OverPaths<CqExBase>;

TEST_P(CqEx, CreateRefusesWhatItCannotReport) {
  struct Case {
    uint64_t wc_flags;
    uint32_t comp_mask, flags;
    int err;
  } cases[] = {
      {IBV_WC_EX_WITH_CVLAN, 0, 0, EOPNOTSUPP},
      {IBV_WC_EX_WITH_FLOW_TAG, 0, 0, EOPNOTSUPP},
      {kAllWcFlags | IBV_WC_EX_WITH_CVLAN, 0, 0, EOPNOTSUPP},
      {uint64_t{1} << 40, 0, 0, EOPNOTSUPP},
      {0, IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN, EOPNOTSUPP},
      {0, IBV_CQ_INIT_ATTR_MASK_FLAGS, 1u << 7, EINVAL},
      {0, 1u << 5, 0, EINVAL},
  };
  for (const Case& c : cases) {
    ibv_cq_init_attr_ex a{};
    a.cqe = 16;
    a.wc_flags = c.wc_flags;
    a.comp_mask = c.comp_mask;
    a.flags = c.flags;
    errno = 0;
    ibv_cq_ex* cq = ibv_create_cq_ex(dev.ctx, &a);
    EXPECT_EQ(cq, nullptr) << "wc_flags " << std::hex << c.wc_flags << " comp_mask " << c.comp_mask << " flags "
                           << c.flags;
    EXPECT_EQ(errno, c.err) << "wc_flags " << std::hex << c.wc_flags;
    if (cq) ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
  }
  ibv_cq_init_attr_ex a{};
  a.cqe = 0;
  a.wc_flags = kAllWcFlags;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(dev.ctx, &a), nullptr);
  EXPECT_EQ(errno, EINVAL) << "cqe 0";
  a.cqe = dev.attr.max_cqe + 1u;
  EXPECT_EQ(ibv_create_cq_ex(dev.ctx, &a), nullptr);
  EXPECT_EQ(errno, EINVAL) << "cqe above max_cqe";

  // Everything that is supported, and the single-threaded hint, are accepted.
  for (uint32_t f : {0u, uint32_t{IBV_CREATE_CQ_ATTR_SINGLE_THREADED}}) {
    ibv_cq_ex* cq = make_cq_ex(dev.ctx, 16, kAllWcFlags | kTimestampFlags, nullptr, f);
    ASSERT_NE(cq, nullptr) << strerror(errno);
    EXPECT_GE(cq->cqe, 16);
    EXPECT_EQ(cq->context, dev.ctx);
    EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  }
}

TEST_P(CqEx, StartPollOnEmptyCq) {
  ibv_cq_ex* cq = make_cq_ex(dev.ctx, 8, kAllWcFlags);
  ASSERT_NE(cq, nullptr);
  ibv_poll_cq_attr attr{};
  // ENOENT ends the poll without ibv_end_poll; the CQ can be polled again at once.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ibv_start_poll(cq, &attr), ENOENT);
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(ibv_cq_ex_to_cq(cq), 1, &wc), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
}

// SEND, SEND_WITH_IMM and inline SEND: requester and responder completions, both APIs.
TEST_P(CqEx, SendCompletionsMatchPollCq) {
  run_both([&](Run& r) {
    VT_BUF(src, a, 8192);
    VT_BUF(dst, b, 3 * 4096);
    fill_pattern(src->data, 8192, 81);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(post_recv(b.qp, 100 + i, {dst->sge(i * 4096, 4096)}), 0);
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = 1;
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(a.qpx);
    ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(0), 4000);
    a.qpx->wr_id = 2;
    ibv_wr_send_imm(a.qpx, htonl(0x12345678));
    ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(4000), 1);
    a.qpx->wr_id = 3;
    ibv_wr_send(a.qpx);
    ibv_wr_set_inline_data(a.qpx, src->data + 5000, 40);
    ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
    r.send = poll(a.scq, 3);
    r.recv = poll(b.rcq, 3);
    ASSERT_EQ(r.send.size(), 3u);
    ASSERT_EQ(r.recv.size(), 3u);
    for (int i = 0; i < 3; ++i) expect_wc(r.send[i], {.wr_id = uint64_t(i + 1), .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
    expect_wc(r.recv[0], {.wr_id = 100, .opcode = IBV_WC_RECV, .byte_len = 4000, .no_imm = true, .qp_num = b.qpn()});
    expect_wc(r.recv[1], {.wr_id = 101, .opcode = IBV_WC_RECV, .byte_len = 1, .imm = 0x12345678, .qp_num = b.qpn()});
    expect_wc(r.recv[2], {.wr_id = 102, .opcode = IBV_WC_RECV, .byte_len = 40, .no_imm = true, .qp_num = b.qpn()});
    EXPECT_EQ(check_pattern(dst->data, 4000, 81), 4000u);
    EXPECT_EQ(check_pattern(dst->data + 4096, 1, 81, 4000), 1u);
    EXPECT_EQ(check_pattern(dst->data + 8192, 40, 81, 5000), 40u);
  });
}

// RDMA WRITE, WRITE_WITH_IMM (RECV_RDMA_WITH_IMM at the responder) and READ.
TEST_P(CqEx, RdmaCompletionsMatchPollCq) {
  run_both([&](Run& r) {
    VT_BUF(local, a, 16384);
    VT_BUF(remote, b, 16384);
    fill_pattern(local->data, 8192, 82);
    fill_pattern(remote->data + 8192, 8192, 83);
    ASSERT_EQ(post_recv(b.qp, 200, {}), 0);
    ibv_wr_start(a.qpx);
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    a.qpx->wr_id = 1;
    ibv_wr_rdma_write(a.qpx, remote->rkey(), remote->addr(0));
    ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(0), 3000);
    a.qpx->wr_id = 2;
    ibv_wr_rdma_write_imm(a.qpx, remote->rkey(), remote->addr(3000), htonl(0xfeedbeef));
    ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(3000), 5192);
    a.qpx->wr_id = 3;
    ibv_wr_rdma_read(a.qpx, remote->rkey(), remote->addr(8192));
    ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(8192), 8192);
    ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
    r.send = poll(a.scq, 3);
    r.recv = poll(b.rcq, 1);
    ASSERT_EQ(r.send.size(), 3u);
    ASSERT_EQ(r.recv.size(), 1u);
    expect_wc(r.send[0], {.wr_id = 1, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
    expect_wc(r.send[1], {.wr_id = 2, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
    expect_wc(r.send[2], {.wr_id = 3, .opcode = IBV_WC_RDMA_READ, .byte_len = 8192, .qp_num = a.qpn()});
    expect_wc(r.recv[0],
              {.wr_id = 200, .opcode = IBV_WC_RECV_RDMA_WITH_IMM, .byte_len = 5192, .imm = 0xfeedbeef, .qp_num = b.qpn()});
    EXPECT_EQ(check_pattern(remote->data, 8192, 82), 8192u);
    EXPECT_EQ(check_pattern(local->data + 8192, 8192, 83), 8192u);
  });
}

TEST_P(CqEx, AtomicCompletionsMatchPollCq) {
  if (!atomics_supported()) GTEST_SKIP() << "device has no atomics";
  run_both([&](Run& r) {
    VT_BUF(local, a, 4096);
    VT_BUF(remote, b, 4096);
    remote->u64(0) = 5;
    remote->u64(8) = 100;
    ibv_wr_start(a.qpx);
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    a.qpx->wr_id = 1;
    ibv_wr_atomic_cmp_swp(a.qpx, remote->rkey(), remote->addr(0), 5, 6);
    ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(0), 8);
    a.qpx->wr_id = 2;
    ibv_wr_atomic_fetch_add(a.qpx, remote->rkey(), remote->addr(8), 11);
    ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(8), 8);
    ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
    r.send = poll(a.scq, 2);
    ASSERT_EQ(r.send.size(), 2u);
    expect_wc(r.send[0], {.wr_id = 1, .opcode = IBV_WC_COMP_SWAP, .byte_len = 8, .qp_num = a.qpn()});
    expect_wc(r.send[1], {.wr_id = 2, .opcode = IBV_WC_FETCH_ADD, .byte_len = 8, .qp_num = a.qpn()});
    EXPECT_EQ(local->u64(0), 5u);
    EXPECT_EQ(local->u64(8), 100u);
    EXPECT_EQ(remote->u64(0), 6u);
    EXPECT_EQ(remote->u64(8), 111u);
  });
}

// A remote access error, the WR behind it flushed, and the responder's receive flushed after it is moved
// to the error state: status, wr_id, qp_num and vendor_err agree between the APIs.
TEST_P(CqEx, ErrorCompletionsMatchPollCq) {
  run_both([&](Run& r) {
    VT_BUF(local, a, 4096);
    VT_BUF(remote, b, 4096, IBV_ACCESS_LOCAL_WRITE);  // no remote access
    ASSERT_EQ(post_recv(b.qp, 300, {remote->sge(0, 64)}), 0);
    ibv_wr_start(a.qpx);
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    a.qpx->wr_id = 1;
    ibv_wr_rdma_write(a.qpx, remote->rkey(), remote->addr(0));
    ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(0), 64);
    a.qpx->wr_id = 2;
    ibv_wr_send(a.qpx);
    ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(0), 64);
    ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
    r.send = poll(a.scq, 2);
    ASSERT_EQ(r.send.size(), 2u);
    expect_wc(r.send[0], {.wr_id = 1, .status = IBV_WC_REM_ACCESS_ERR, .qp_num = a.qpn()});
    expect_wc(r.send[1], {.wr_id = 2, .status = IBV_WC_WR_FLUSH_ERR, .qp_num = a.qpn()});
    ibv_qp_attr qa{};
    qa.qp_state = IBV_QPS_ERR;
    ASSERT_EQ(ibv_modify_qp(b.qp, &qa, IBV_QP_STATE), 0);
    r.recv = poll(b.rcq, 1);
    ASSERT_EQ(r.recv.size(), 1u);
    expect_wc(r.recv[0], {.wr_id = 300, .status = IBV_WC_WR_FLUSH_ERR, .qp_num = b.qpn()});
  });
}

// ibv_poll_cq and start/next/end on one CQ take completions in order, none twice, none lost.
TEST_P(CqEx, MixedWithPollCq) {
  ASSERT_TRUE(connect_ex());
  VT_BUF(src, a, 4096);
  VT_BUF(dst, b, 4096);
  fill_pattern(src->data, 4096, 84);
  ibv_wr_start(a.qpx);
  a.qpx->wr_flags = IBV_SEND_SIGNALED;
  for (int i = 0; i < 8; ++i) {
    a.qpx->wr_id = 10 + i;
    ibv_wr_rdma_write(a.qpx, dst->rkey(), dst->addr(i * 512));
    ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(i * 512), 512);
  }
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  std::vector<uint64_t> ids;
  auto c1 = poll_wcs(a.scq, 1);
  for (auto& w : c1) ids.push_back(w.wr_id);
  for (auto& e : poll_ex(ex(a.scq), 3, wc_flags)) ids.push_back(e.wc.wr_id);
  for (auto& w : poll_wcs(a.scq, 2)) ids.push_back(w.wr_id);
  for (auto& e : poll_ex(ex(a.scq), 2, wc_flags)) ids.push_back(e.wc.wr_id);
  ASSERT_EQ(ids.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(ids[i], uint64_t(10 + i));
  ibv_poll_cq_attr attr{};
  EXPECT_EQ(ibv_start_poll(ex(a.scq), &attr), ENOENT);
  EXPECT_EQ(check_pattern(dst->data, 4096, 84), 4096u);
}

// Timestamps: nondecreasing in completion order, inside the ibv_query_rt_values_ex readings taken before
// posting and after polling, and the wall-clock variant inside the CLOCK_REALTIME readings around them.
TEST_P(CqEx, CompletionTimestamps) {
  ibv_device_attr_ex dx{};
  ASSERT_EQ(ibv_query_device_ex(dev.ctx, nullptr, &dx), 0);
  if (!dx.hca_core_clock || !dx.completion_timestamp_mask) GTEST_SKIP() << "no completion timestamps";
  ASSERT_TRUE(connect_ex());
  constexpr int kMsgs = 24;
  VT_BUF(src, a, kMsgs * 256);
  VT_BUF(dst, b, kMsgs * 256);
  fill_pattern(src->data, kMsgs * 256, 85);
  for (int i = 0; i < kMsgs; ++i) ASSERT_EQ(post_recv(b.qp, 1000 + i, {dst->sge(i * 256, 256)}), 0);

  const uint64_t wall_before = realtime_ns();
  const uint64_t raw_before = raw_clock(dev.ctx);
  // Three batches, so completions are spread over several engine passes.
  for (int batch = 0; batch < 3; ++batch) {
    ibv_wr_start(a.qpx);
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    for (int i = batch * 8; i < batch * 8 + 8; ++i) {
      a.qpx->wr_id = i;
      if (i % 2) {
        ibv_wr_send_imm(a.qpx, htonl(i));
      } else {
        ibv_wr_send(a.qpx);
      }
      ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(i * 256), 256);
    }
    ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  }
  auto sends = poll_ex(ex(a.scq), kMsgs, wc_flags);
  auto recvs = poll_ex(ex(b.rcq), kMsgs, wc_flags);
  const uint64_t raw_after = raw_clock(dev.ctx);
  const uint64_t wall_after = realtime_ns();
  ASSERT_EQ(sends.size(), size_t{kMsgs});
  ASSERT_EQ(recvs.size(), size_t{kMsgs});
  for (const auto* v : {&sends, &recvs}) {
    uint64_t prev = raw_before;
    for (const ExWc& e : *v) {
      EXPECT_EQ(e.wc.status, IBV_WC_SUCCESS);
      EXPECT_GE(e.ts, prev) << "wr_id " << e.wc.wr_id << ": timestamp went backwards";
      EXPECT_LE(e.ts, raw_after) << "wr_id " << e.wc.wr_id << ": timestamp after the clock read after polling";
      EXPECT_GE(e.wallclock_ns, wall_before) << "wr_id " << e.wc.wr_id;
      EXPECT_LE(e.wallclock_ns, wall_after) << "wr_id " << e.wc.wr_id;
      prev = e.ts;
    }
  }
  for (int i = 0; i < kMsgs; ++i) {
    EXPECT_EQ(sends[i].wc.wr_id, uint64_t(i));
    expect_wc(recvs[i].wc, {.wr_id = uint64_t(1000 + i), .opcode = IBV_WC_RECV, .byte_len = 256, .qp_num = b.qpn()});
    if (i % 2) {
      EXPECT_TRUE(recvs[i].wc.wc_flags & IBV_WC_WITH_IMM);
      EXPECT_EQ(ntohl(recvs[i].wc.imm_data), uint32_t(i));
    }
  }
  EXPECT_EQ(check_pattern(dst->data, kMsgs * 256, 85), size_t{kMsgs * 256});
}

// Completion channel and ibv_req_notify_cq on an extended CQ, then the event's CQ polled with start_poll.
TEST_P(CqEx, CompletionChannel) {
  ibv_comp_channel* ch = make_channel();
  ASSERT_TRUE(ch);
  qcfg.recv_channel = ch;
  ASSERT_TRUE(connect_ex());
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  fill_pattern(src->data, 64, 86);
  pollfd p{ch->fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "event without arming";
  ASSERT_EQ(ibv_req_notify_cq(b.rcq, 0), 0);
  ASSERT_EQ(post_recv(b.qp, 7, {dst->sge(0, 64)}), 0);
  SendWr s(1, IBV_WR_SEND, {src->sge(0, 64)});
  ASSERT_EQ(post_send(a.qp, s), 0);
  ASSERT_EQ(::poll(&p, 1, kWaitSeconds * 1000), 1) << "no CQ event";
  ibv_cq* cq = nullptr;
  void* cq_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch, &cq, &cq_ctx), 0);
  EXPECT_EQ(cq, b.rcq);
  ibv_ack_cq_events(cq, 1);
  auto got = poll_ex(ex(cq), 1, wc_flags);
  ASSERT_EQ(got.size(), 1u);
  expect_wc(got[0].wc, {.wr_id = 7, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(dst->data, 64, 86), 64u);
  ASSERT_EQ(poll_wcs(a.scq, 1).size(), 1u);
}

// Without timestamp flags the CQ works the same (the accessors asked for are all that is read).
TEST_P(CqEx, MinimalFlagsAndSingleThreaded) {
  wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
  a.reset();
  b.reset();
  ASSERT_TRUE(connect_ex());
  ibv_cq_ex* st = make_cq_ex(dev.ctx, 4, 0, nullptr, IBV_CREATE_CQ_ATTR_SINGLE_THREADED);
  ASSERT_NE(st, nullptr);
  ibv_poll_cq_attr attr{};
  EXPECT_EQ(ibv_start_poll(st, &attr), ENOENT);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(st)), 0);
  VT_BUF(local, a, 4096);
  VT_BUF(remote, b, 4096);
  fill_pattern(remote->data, 4096, 87);
  ibv_wr_start(a.qpx);
  a.qpx->wr_flags = IBV_SEND_SIGNALED;
  a.qpx->wr_id = 9;
  ibv_wr_rdma_read(a.qpx, remote->rkey(), remote->addr(0));
  ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(0), 4096);
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  auto got = poll_ex(ex(a.scq), 1, wc_flags);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].wc.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(got[0].wc.byte_len, 4096u);
  EXPECT_EQ(check_pattern(local->data, 4096, 87), 4096u);
}

// Off iWARP: connect_ex brings its QPs to RTS by hand (RoCE's RTR and RTS), atomics do not exist
// there, and a remote error reaches the requester as a Terminate after its WR completed
// (docs/iwarp.md).
VT_INSTANTIATE_PATHS(CqEx, VT_ROCE_PATHS);

}  // namespace
}  // namespace softrdma::verbs_test
