// Fault tests (issue 3): RC traffic between two device contexts of this process over the loopback
// device while the net layer drops, duplicates, reorders and corrupts datagrams (SOFTRDMA_IMPAIR, read
// when a context opens and creates its UDP ports). Each context is given its own SOFTRDMA_IMPAIR by
// softrdma_open_device_with (verbs/private_abi.h); otherwise only the public verbs API is used.
//
// Reproduce a run with FAULT_SEED=<n> (the seed every test prints); the faults a port injected are
// printed to stderr when its context closes.
#include <infiniband/verbs.h>

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <memory>
#include <vector>

#include <gtest/gtest.h>
#include "splitmix.h"
#include "verbs/private_abi.h"

namespace softrdma::faults {
namespace {

// A test fails when no completion arrives for this long (a bound on a hang, not a timing assertion).
constexpr auto kNoProgress = std::chrono::seconds(60);
constexpr uint8_t kPort = 1;

uint64_t seed_or(uint64_t dflt) {
  const char* s = std::getenv("FAULT_SEED");
  return s && *s ? std::strtoull(s, nullptr, 0) : dflt;
}

using softrdma::fault_test::Rng;

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h ^ n;
}

// One opened softrdma_lo context, created with SOFTRDMA_IMPAIR = impair (nullptr: no faults).
struct Context {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_device_attr attr{};
  ibv_gid gid{};
  explicit Context(const char* impair) {
    // The context's own SOFTRDMA_IMPAIR (none: "", the default, whatever the environment says).
    const std::string settings = std::string("SOFTRDMA_IMPAIR=") + (impair ? impair : "");
    ctx = softrdma_open_device_with("softrdma_lo", 0, settings.c_str());
    if (!ctx) return;
    pd = ibv_alloc_pd(ctx);
    if (ibv_query_device(ctx, &attr) || ibv_query_gid(ctx, kPort, 0, &gid) || !pd) {
      if (pd) ibv_dealloc_pd(pd);
      ibv_close_device(ctx);
      ctx = nullptr;
    }
  }
  ~Context() {
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
};

struct Mr {
  std::vector<uint8_t> mem;
  ibv_mr* mr = nullptr;
  Mr(ibv_pd* pd, size_t len) : mem(std::max<size_t>(len, 64)) {
    mr = ibv_reg_mr(pd, mem.data(), mem.size(),
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC);
  }
  ~Mr() {
    if (mr) ibv_dereg_mr(mr);
  }
  uint8_t* at(size_t off) { return mem.data() + off; }
  uint64_t addr(size_t off) { return reinterpret_cast<uint64_t>(at(off)); }
};

struct Timing {
  uint8_t timeout = 12, retry_cnt = 7, rnr_retry = 7;  // 16.8 ms: the 2 cores are shared and busy
};

// An RC QP with its own send and receive CQs.
struct Qp {
  Context* c = nullptr;
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  ibv_qp* qp = nullptr;
  Qp(Context& ctx, uint32_t depth) : c(&ctx) {
    scq = ibv_create_cq(ctx.ctx, static_cast<int>(depth * 2), nullptr, nullptr, 0);
    rcq = ibv_create_cq(ctx.ctx, static_cast<int>(depth * 2), nullptr, nullptr, 0);
    ibv_qp_init_attr a{};
    a.send_cq = scq;
    a.recv_cq = rcq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = depth;
    a.cap.max_recv_wr = depth;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    if (scq && rcq) qp = ibv_create_qp(ctx.pd, &a);
  }
  ~Qp() {
    if (qp) ibv_destroy_qp(qp);
    if (scq) ibv_destroy_cq(scq);
    if (rcq) ibv_destroy_cq(rcq);
  }
  Qp(const Qp&) = delete;
  Qp& operator=(const Qp&) = delete;
};

int bring_up(Qp& me, const Qp& peer, uint32_t my_psn, uint32_t peer_psn, const Timing& t) {
  const uint8_t rd = static_cast<uint8_t>(std::min(16, std::min(me.c->attr.max_qp_rd_atom, me.c->attr.max_qp_init_rd_atom)));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = kPort;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC;
  if (int r = ibv_modify_qp(me.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return r;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = peer.qp->qp_num;
  a.rq_psn = peer_psn;
  a.max_dest_rd_atomic = rd;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = peer.c->gid;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = kPort;
  if (int r = ibv_modify_qp(me.qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return r;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = t.timeout;
  a.retry_cnt = t.retry_cnt;
  a.rnr_retry = t.rnr_retry;
  a.sq_psn = my_psn;
  a.max_rd_atomic = rd;
  return ibv_modify_qp(me.qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
}

bool connect(Qp& x, Qp& y, uint32_t psn_x, uint32_t psn_y, const Timing& t) {
  return bring_up(x, y, psn_x, psn_y, t) == 0 && bring_up(y, x, psn_y, psn_x, t) == 0;
}

// Polls exactly n completions; fails (returns fewer) only after kNoProgress without any.
std::vector<ibv_wc> poll_n(ibv_cq* cq, size_t n) {
  std::vector<ibv_wc> out;
  auto last = std::chrono::steady_clock::now();
  ibv_wc wc[16];
  while (out.size() < n) {
    int got = ibv_poll_cq(cq, static_cast<int>(std::min<size_t>(16, n - out.size())), wc);
    if (got < 0) {
      ADD_FAILURE() << "ibv_poll_cq failed";
      break;
    }
    if (got > 0) {
      out.insert(out.end(), wc, wc + got);
      last = std::chrono::steady_clock::now();
      continue;
    }
    if (std::chrono::steady_clock::now() - last > kNoProgress) {
      ADD_FAILURE() << "no completion for " << kNoProgress.count() << " s: got " << out.size() << " of " << n;
      break;
    }
    std::this_thread::yield();
  }
  return out;
}

// No completion beyond those expected (a duplicate would show up here).
void expect_cq_empty(ibv_cq* cq, const char* what) {
  ibv_wc wc;
  int n = ibv_poll_cq(cq, 1, &wc);
  EXPECT_EQ(n, 0) << what << ": unexpected completion wr_id " << wc.wr_id << " status " << wc.status;
}

std::string impair_spec(uint64_t seed) {
  // FAULT_IMPAIR replaces the rates (debugging: narrow a failure down to one kind of fault).
  if (const char* e = std::getenv("FAULT_IMPAIR"); e && *e) return "seed=" + std::to_string(seed) + "," + e;
  // ~5% drop, 5% dup, 5% reorder and 1% corruption per path, split over the sender's tx and the
  // receiver's rx so that both hooks are exercised.
  return "seed=" + std::to_string(seed) +
         ",tx_drop=0.03,rx_drop=0.02,tx_dup=0.03,rx_dup=0.02,tx_reorder=0.03,rx_reorder=0.02,reorder_depth=8,"
         "tx_corrupt=0.005,rx_corrupt=0.005";
}

// ---- Mixed traffic ----------------------------------------------------------------------------------

enum class Op { Write, WriteImm, Read, Send, SendImm };
const char* op_name(Op o) {
  static const char* names[] = {"WRITE", "WRITE_IMM", "READ", "SEND", "SEND_IMM"};
  return names[static_cast<int>(o)];
}

struct WorkItem {
  Op op;
  uint32_t len;
  size_t src_off;  // in the source region (requester's out for WRITE/SEND, responder's rsrc for READ)
  size_t dst_off;  // in the destination region
  uint32_t imm;
};

constexpr size_t kRegion = 20u << 20;  // per region: room for a window of operations
constexpr size_t kGuard = 64;         // bytes left untouched after each destination slice
constexpr uint8_t kGuardByte = 0xEE;
constexpr uint32_t kMaxLen = 8u << 20;  // messages of 0 B .. 8 MiB
constexpr size_t kWindowOps = 32;

// Runs `total` bytes of mixed operations from a to b in windows; every completion and every byte is
// checked. *nops: the number of operations completed.
void run_mixed(Qp& a, Qp& b, uint64_t seed, uint64_t total, size_t* nops) {
  Mr a_out(a.c->pd, kRegion), a_rdst(a.c->pd, kRegion);
  Mr b_wdst(b.c->pd, kRegion), b_rsrc(b.c->pd, kRegion), b_recv(b.c->pd, kRegion);
  for (Mr* m : {&a_out, &a_rdst, &b_wdst, &b_rsrc, &b_recv}) {
    ASSERT_NE(m->mr, nullptr);
  }
  Rng rng{seed};
  uint64_t done_bytes = 0;
  size_t ops = 0;
  std::map<Op, size_t> per_op;
  while (done_bytes < total && !::testing::Test::HasFailure()) {
    // Plan a window.
    std::vector<WorkItem> w;
    size_t used_src[2] = {0, 0}, used_dst[3] = {0, 0, 0};  // src: a_out, b_rsrc; dst: b_wdst, a_rdst, b_recv
    while (w.size() < kWindowOps && done_bytes < total) {
      WorkItem it{};
      it.op = static_cast<Op>(rng.next() % 5);
      const uint32_t bits = static_cast<uint32_t>(rng.next() % 24);
      it.len = rng.next() % 10 == 0 ? 0 : static_cast<uint32_t>(rng.next() % ((1ull << bits) + 1));
      it.len = std::min(it.len, kMaxLen);
      it.imm = static_cast<uint32_t>(rng.next());
      const int s = it.op == Op::Read ? 1 : 0;
      const int d = it.op == Op::Read ? 1 : (it.op == Op::Write || it.op == Op::WriteImm) ? 0 : 2;
      const size_t need = (it.len + kGuard + 63) & ~size_t{63};
      if (used_src[s] + need > kRegion || used_dst[d] + need > kRegion) break;
      it.src_off = used_src[s];
      it.dst_off = used_dst[d];
      used_src[s] += need;
      used_dst[d] += need;
      w.push_back(it);
      done_bytes += it.len;
    }
    // Fresh source data; destinations (with their guards) set to a known byte.
    for (const WorkItem& it : w) {
      Mr& src = it.op == Op::Read ? b_rsrc : a_out;
      uint8_t* p = src.at(it.src_off);
      for (uint32_t i = 0; i < it.len; i += 8) {
        uint64_t v = rng.next();
        std::memcpy(p + i, &v, std::min<uint32_t>(8, it.len - i));
      }
    }
    std::memset(b_wdst.at(0), kGuardByte, used_dst[0]);
    std::memset(a_rdst.at(0), kGuardByte, used_dst[1]);
    std::memset(b_recv.at(0), kGuardByte, used_dst[2]);

    // Receives first (SEND, SEND_IMM and WRITE_IMM each consume one, in order), then the requests.
    size_t nrecv = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      const WorkItem& it = w[i];
      if (it.op == Op::Write || it.op == Op::Read) continue;
      ibv_sge sge{b_recv.addr(it.dst_off), it.len, b_recv.mr->lkey};
      ibv_recv_wr rw{};
      rw.wr_id = ops + i;
      rw.sg_list = &sge;
      rw.num_sge = (it.op == Op::WriteImm || it.len == 0) ? 0 : 1;
      ibv_recv_wr* bad = nullptr;
      EXPECT_EQ(ibv_post_recv(b.qp, &rw, &bad), 0);
      ++nrecv;
    }
    for (size_t i = 0; i < w.size(); ++i) {
      const WorkItem& it = w[i];
      ibv_sge sge{};
      ibv_send_wr sw{};
      sw.wr_id = ops + i;
      sw.send_flags = IBV_SEND_SIGNALED;
      sw.sg_list = &sge;
      sw.num_sge = it.len ? 1 : 0;
      switch (it.op) {
        case Op::Write:
        case Op::WriteImm:
          sge = {a_out.addr(it.src_off), it.len, a_out.mr->lkey};
          sw.opcode = it.op == Op::Write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_WRITE_WITH_IMM;
          sw.wr.rdma.remote_addr = b_wdst.addr(it.dst_off);
          sw.wr.rdma.rkey = b_wdst.mr->rkey;
          break;
        case Op::Read:
          sge = {a_rdst.addr(it.dst_off), it.len, a_rdst.mr->lkey};
          sw.opcode = IBV_WR_RDMA_READ;
          sw.wr.rdma.remote_addr = b_rsrc.addr(it.src_off);
          sw.wr.rdma.rkey = b_rsrc.mr->rkey;
          break;
        case Op::Send:
        case Op::SendImm:
          sge = {a_out.addr(it.src_off), it.len, a_out.mr->lkey};
          sw.opcode = it.op == Op::Send ? IBV_WR_SEND : IBV_WR_SEND_WITH_IMM;
          break;
      }
      if (it.op == Op::WriteImm || it.op == Op::SendImm) sw.imm_data = htonl(it.imm);
      ibv_send_wr* bad = nullptr;
      EXPECT_EQ(ibv_post_send(a.qp, &sw, &bad), 0) << "op " << ops + i;
    }

    // Requester completions: all present, once, in order.
    auto swc = poll_n(a.scq, w.size());
    for (size_t i = 0; i < swc.size(); ++i) {
      const WorkItem& it = w[i];
      const ibv_wc& c = swc[i];
      ASSERT_EQ(c.wr_id, ops + i) << "send completion out of order";
      ASSERT_EQ(c.status, IBV_WC_SUCCESS) << op_name(it.op) << " op " << ops + i << " len " << it.len << ": "
                                          << ibv_wc_status_str(c.status);
      const ibv_wc_opcode want = it.op == Op::Read ? IBV_WC_RDMA_READ
                                 : (it.op == Op::Send || it.op == Op::SendImm) ? IBV_WC_SEND
                                                                                : IBV_WC_RDMA_WRITE;
      EXPECT_EQ(c.opcode, want) << "op " << ops + i;
      if (it.op == Op::Read) {
        EXPECT_EQ(c.byte_len, it.len) << "READ op " << ops + i;
      }
    }
    // Responder completions: present, once, in order, with the right length and immediate.
    auto rwc = poll_n(b.rcq, nrecv);
    size_t r = 0;
    for (size_t i = 0; i < w.size() && r < rwc.size(); ++i) {
      const WorkItem& it = w[i];
      if (it.op == Op::Write || it.op == Op::Read) continue;
      const ibv_wc& c = rwc[r++];
      ASSERT_EQ(c.wr_id, ops + i) << "receive completion out of order";
      ASSERT_EQ(c.status, IBV_WC_SUCCESS) << op_name(it.op) << " op " << ops + i << ": " << ibv_wc_status_str(c.status);
      EXPECT_EQ(c.opcode, it.op == Op::WriteImm ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV) << "op " << ops + i;
      EXPECT_EQ(c.byte_len, it.len) << op_name(it.op) << " op " << ops + i;
      const bool imm = it.op != Op::Send;
      EXPECT_EQ((c.wc_flags & IBV_WC_WITH_IMM) != 0, imm) << "op " << ops + i;
      if (imm) {
        EXPECT_EQ(ntohl(c.imm_data), it.imm) << "op " << ops + i;
      }
      EXPECT_EQ(c.qp_num, b.qp->qp_num);
    }
    // Every byte: a hash of the source (one side's memory) against a hash of the destination (the other's),
    // and the guard after each destination untouched.
    for (size_t i = 0; i < w.size(); ++i) {
      const WorkItem& it = w[i];
      Mr& src = it.op == Op::Read ? b_rsrc : a_out;
      Mr& dst = it.op == Op::Read ? a_rdst : (it.op == Op::Write || it.op == Op::WriteImm) ? b_wdst : b_recv;
      EXPECT_EQ(fnv1a(src.at(it.src_off), it.len), fnv1a(dst.at(it.dst_off), it.len))
          << op_name(it.op) << " op " << ops + i << " len " << it.len << ": data differs";
      const uint8_t* g = dst.at(it.dst_off + it.len);
      EXPECT_TRUE(std::all_of(g, g + kGuard, [](uint8_t v) { return v == kGuardByte; }))
          << op_name(it.op) << " op " << ops + i << " wrote past its end";
      ++per_op[it.op];
    }
    ops += w.size();
    *nops = ops;
  }
  expect_cq_empty(a.scq, "requester send CQ");
  expect_cq_empty(b.rcq, "responder receive CQ");
  expect_cq_empty(a.rcq, "requester receive CQ");
  expect_cq_empty(b.scq, "responder send CQ");
  std::printf("mixed: %zu operations, %llu bytes (", ops, static_cast<unsigned long long>(done_bytes));
  for (auto& [op, n] : per_op) std::printf(" %s %zu", op_name(op), n);
  std::printf(" )\n");
}

class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    seed = seed_or(42);
    std::printf("FAULT_SEED=%llu\n", static_cast<unsigned long long>(seed));
    RecordProperty("fault_seed", std::to_string(seed));
  }
  uint64_t seed = 0;
};

// FAULT_MIXED_MIB sets the total (default 1 GiB), spread over kPairs QP pairs running at once.
TEST_F(Faults, MixedOperationsUnderLossDupReorderCorruption) {
  const int kPairs = std::getenv("FAULT_PAIRS") ? std::atoi(std::getenv("FAULT_PAIRS")) : 3;
  const char* mib_env = std::getenv("FAULT_MIXED_MIB");
  const uint64_t total = (mib_env && *mib_env ? std::strtoull(mib_env, nullptr, 10) : 1024) << 20;
  const std::string spec_a = impair_spec(seed), spec_b = impair_spec(seed + 1);
  Context ca(spec_a.c_str()), cb(spec_b.c_str());
  ASSERT_TRUE(ca.ctx && cb.ctx) << "softrdma_lo did not open";
  std::vector<std::unique_ptr<Qp>> as, bs;
  for (int i = 0; i < kPairs; ++i) {
    as.push_back(std::make_unique<Qp>(ca, 64));
    bs.push_back(std::make_unique<Qp>(cb, 64));
    ASSERT_TRUE(as.back()->qp && bs.back()->qp);
    ASSERT_TRUE(connect(*as.back(), *bs.back(), 0x100 + i, 0x200 + i, Timing{}));
  }
  std::vector<size_t> ops(kPairs);
  std::vector<std::thread> threads;
  for (int i = 0; i < kPairs; ++i)
    threads.emplace_back([&, i] { run_mixed(*as[i], *bs[i], seed * 31 + i, total / kPairs, &ops[i]); });
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kPairs; ++i) EXPECT_GT(ops[i], 20u) << "pair " << i;
}

TEST_F(Faults, PsnWrapUnderFaults) {
  const std::string spec_a = impair_spec(seed), spec_b = impair_spec(seed + 1);
  Context ca(spec_a.c_str()), cb(spec_b.c_str());
  ASSERT_TRUE(ca.ctx && cb.ctx);
  Qp a(ca, 64), b(cb, 64);
  ASSERT_TRUE(a.qp && b.qp);
  // Both directions start 16 PSNs before 2^24: requests, ACKs and READ responses all cross the wrap.
  ASSERT_TRUE(connect(a, b, 0xFFFFF0, 0xFFFFF0, Timing{}));
  size_t ops = 0;
  run_mixed(a, b, seed, 16ull << 20, &ops);
  EXPECT_GT(ops, 20u);
}

TEST_F(Faults, ConcurrentFetchAddExecuteExactlyOnce) {
  constexpr int kQps = 3, kWords = 4, kPerQp = 1000, kWindow = 16;
  const std::string spec_a = impair_spec(seed), spec_b = impair_spec(seed + 1);
  Context ca(spec_a.c_str()), cb(spec_b.c_str());
  ASSERT_TRUE(ca.ctx && cb.ctx);
  if (ca.attr.atomic_cap == IBV_ATOMIC_NONE) GTEST_SKIP() << "no atomics";
  Mr words(cb.pd, kWords * 8);
  Mr results(ca.pd, kQps * kPerQp * 8);
  ASSERT_TRUE(words.mr && results.mr);
  std::memset(words.at(0), 0, kWords * 8);
  std::vector<std::unique_ptr<Qp>> qa, qb;
  for (int q = 0; q < kQps; ++q) {
    qa.push_back(std::make_unique<Qp>(ca, kWindow * 2));
    qb.push_back(std::make_unique<Qp>(cb, kWindow * 2));
    ASSERT_TRUE(qa.back()->qp && qb.back()->qp);
    ASSERT_TRUE(connect(*qa.back(), *qb.back(), 0x1000u * (q + 1), 0x7000u * (q + 1), Timing{}));
  }
  // Every add is 1 and QPs interleave on the same words: the old values a word returned must be exactly
  // 0, 1, ..., n-1, each once, and its final value n (a re-executed duplicate breaks both).
  std::vector<std::thread> threads;
  for (int q = 0; q < kQps; ++q) {
    threads.emplace_back([&, q] {
      Qp& qp = *qa[q];
      int posted = 0, completed = 0;
      while (completed < kPerQp && !::testing::Test::HasFailure()) {
        while (posted < kPerQp && posted - completed < kWindow) {
          const size_t slot = static_cast<size_t>(q) * kPerQp + posted;
          ibv_sge sge{results.addr(slot * 8), 8, results.mr->lkey};
          ibv_send_wr sw{};
          sw.wr_id = static_cast<uint64_t>(posted);
          sw.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
          sw.send_flags = IBV_SEND_SIGNALED;
          sw.sg_list = &sge;
          sw.num_sge = 1;
          sw.wr.atomic.remote_addr = words.addr(static_cast<size_t>((posted + q) % kWords) * 8);
          sw.wr.atomic.rkey = words.mr->rkey;
          sw.wr.atomic.compare_add = 1;
          ibv_send_wr* bad = nullptr;
          if (ibv_post_send(qp.qp, &sw, &bad) != 0) {
            ADD_FAILURE() << "post fetch_add";
            return;
          }
          ++posted;
        }
        auto wc = poll_n(qp.scq, 1);
        if (wc.empty()) return;
        EXPECT_EQ(wc[0].wr_id, static_cast<uint64_t>(completed)) << "QP " << q;
        EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS) << "QP " << q << ": " << ibv_wc_status_str(wc[0].status);
        EXPECT_EQ(wc[0].opcode, IBV_WC_FETCH_ADD);
        EXPECT_EQ(wc[0].byte_len, 8u);
        if (wc[0].status != IBV_WC_SUCCESS) return;
        ++completed;
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_FALSE(HasFailure());
  std::vector<std::vector<uint64_t>> old(kWords);
  for (int q = 0; q < kQps; ++q)
    for (int i = 0; i < kPerQp; ++i) {
      uint64_t v;
      std::memcpy(&v, results.at((static_cast<size_t>(q) * kPerQp + i) * 8), 8);
      old[(i + q) % kWords].push_back(v);
    }
  for (int w = 0; w < kWords; ++w) {
    const uint64_t n = old[w].size();
    uint64_t final_value;
    std::memcpy(&final_value, words.at(static_cast<size_t>(w) * 8), 8);
    EXPECT_EQ(final_value, n) << "word " << w << ": an atomic ran more or less than once";
    std::sort(old[w].begin(), old[w].end());
    for (uint64_t k = 0; k < n; ++k) {
      ASSERT_EQ(old[w][k], k) << "word " << w << ": returned old values are not 0.." << n - 1 << " once each";
    }
  }
  for (auto& q : qa) expect_cq_empty(q->scq, "fetch_add send CQ");
}

TEST_F(Faults, BurstLossExhaustsRetryThenNewPairWorks) {
  // A's transmit path loses a known run of datagrams: the first 4 single-packet SENDs, sent once and
  // retransmitted retry_cnt = 7 times (go-back-N: 4 packets a round), are 32 datagrams.
  // SOFTRDMA_PEER_PAUSE_MS=0: IBTA's retry counting alone. Otherwise B's kernel vouches for B (it is
  // this process) and A would wait past retry_cnt for a peer it takes to be paused (reliability.md).
  const std::string spec_a = "seed=" + std::to_string(seed) + ",tx_burst_at=1,tx_burst_len=32;SOFTRDMA_PEER_PAUSE_MS=0";
  Context ca(spec_a.c_str()), cb(nullptr);
  ASSERT_TRUE(ca.ctx && cb.ctx);
  Mr src(ca.pd, 4096), dst(cb.pd, 4096);
  ASSERT_TRUE(src.mr && dst.mr);
  constexpr int kWrs = 4;
  {
    Qp a(ca, 16), b(cb, 16);
    ASSERT_TRUE(a.qp && b.qp);
    // A long timeout (268 ms): a retransmit timer that fires a whole timeout late is not counted as
    // a retry (the engine itself was starved), so on a loaded machine a short one could let the
    // 8 counted rounds outlast the 32-datagram burst.
    ASSERT_TRUE(connect(a, b, 10, 20, Timing{16, 7, 7}));
    for (int i = 0; i < kWrs; ++i) {
      ibv_sge rs{dst.addr(i * 64), 64, dst.mr->lkey};
      ibv_recv_wr rw{};
      rw.wr_id = i;
      rw.sg_list = &rs;
      rw.num_sge = 1;
      ibv_recv_wr* rbad = nullptr;
      ASSERT_EQ(ibv_post_recv(b.qp, &rw, &rbad), 0);
    }
    for (int i = 0; i < kWrs; ++i) {
      ibv_sge sge{src.addr(i * 64), 64, src.mr->lkey};
      ibv_send_wr sw{};
      sw.wr_id = 100 + i;
      sw.opcode = IBV_WR_SEND;
      sw.send_flags = IBV_SEND_SIGNALED;
      sw.sg_list = &sge;
      sw.num_sge = 1;
      ibv_send_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_send(a.qp, &sw, &bad), 0);
    }
    auto wc = poll_n(a.scq, kWrs);
    ASSERT_EQ(wc.size(), static_cast<size_t>(kWrs));
    EXPECT_EQ(wc[0].wr_id, 100u);
    EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR) << ibv_wc_status_str(wc[0].status);
    for (int i = 1; i < kWrs; ++i) {
      EXPECT_EQ(wc[i].wr_id, 100u + i);
      EXPECT_EQ(wc[i].status, IBV_WC_WR_FLUSH_ERR) << ibv_wc_status_str(wc[i].status);
    }
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    ASSERT_EQ(ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qi), 0);
    EXPECT_EQ(qa.qp_state, IBV_QPS_ERR);
    // Nothing reached the responder.
    expect_cq_empty(b.rcq, "responder receive CQ");
    // A WQE posted now is flushed too.
    ibv_sge sge{src.addr(0), 64, src.mr->lkey};
    ibv_send_wr sw{};
    sw.wr_id = 200;
    sw.opcode = IBV_WR_SEND;
    sw.send_flags = IBV_SEND_SIGNALED;
    sw.sg_list = &sge;
    sw.num_sge = 1;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(a.qp, &sw, &bad), 0);
    auto late = poll_n(a.scq, 1);
    ASSERT_EQ(late.size(), 1u);
    EXPECT_EQ(late[0].wr_id, 200u);
    EXPECT_EQ(late[0].status, IBV_WC_WR_FLUSH_ERR);
  }
  // A new pair on the same contexts: works (through the end of the burst).
  Qp a(ca, 16), b(cb, 16);
  ASSERT_TRUE(a.qp && b.qp);
  ASSERT_TRUE(connect(a, b, 30, 40, Timing{}));
  for (int i = 0; i < 64; ++i) src.mem[i] = static_cast<uint8_t>(i * 3 + 1);
  ibv_sge rs{dst.addr(1024), 64, dst.mr->lkey};
  ibv_recv_wr rw{};
  rw.wr_id = 7;
  rw.sg_list = &rs;
  rw.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  ASSERT_EQ(ibv_post_recv(b.qp, &rw, &rbad), 0);
  ibv_sge sge{src.addr(0), 64, src.mr->lkey};
  ibv_send_wr sw{};
  sw.wr_id = 300;
  sw.opcode = IBV_WR_SEND_WITH_IMM;
  sw.imm_data = htonl(0xC0FFEE);
  sw.send_flags = IBV_SEND_SIGNALED;
  sw.sg_list = &sge;
  sw.num_sge = 1;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a.qp, &sw, &bad), 0);
  auto swc = poll_n(a.scq, 1);
  ASSERT_EQ(swc.size(), 1u);
  EXPECT_EQ(swc[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(swc[0].status);
  auto rwc = poll_n(b.rcq, 1);
  ASSERT_EQ(rwc.size(), 1u);
  EXPECT_EQ(rwc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(rwc[0].byte_len, 64u);
  EXPECT_EQ(ntohl(rwc[0].imm_data), 0xC0FFEEu);
  EXPECT_EQ(std::memcmp(dst.at(1024), src.at(0), 64), 0);
}

}  // namespace
}  // namespace softrdma::faults
