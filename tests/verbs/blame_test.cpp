// A bad request behind outstanding READs and ATOMICs: the work requests before it complete
// successfully, the bad one takes the error the spec names (IBTA 9.7.5.1.2, 10.8.3.1: its NAK names
// its PSN), and the ones after it are flushed (issue 12, defect 2). Run between two contexts of one
// process, so on softrdma the intra-host direct path serves it, and with SOFTRDMA_DIRECT=0 by packets.
#include "helpers.h"

#include <cstring>
#include <string>
#include <tuple>

namespace softrdma::verbs_test {
namespace {

enum class Bad { Rkey, Range, Access };
enum class Behind { Read, Atomic, Both };

struct Case {
  Bad bad;
  Behind behind;
  ibv_wr_opcode op;  // of the bad request
};

std::string name(const ::testing::TestParamInfo<Case>& i) {
  const char* bad[] = {"BadRkey", "OutOfRange", "NoAccess"};
  const char* behind[] = {"BehindRead", "BehindAtomic", "BehindBoth"};
  const char* op = i.param.op == IBV_WR_RDMA_WRITE ? "Write" : i.param.op == IBV_WR_RDMA_READ ? "Read" : "FetchAdd";
  return std::string(op) + bad[static_cast<int>(i.param.bad)] + behind[static_cast<int>(i.param.behind)];
}

class Blame : public ::testing::TestWithParam<Case> {
 protected:
  Device dev_a, dev_b;  // two contexts: what two processes on one host would have
  Side a, b;
  ConnConfig conn;
  QpConfig qcfg;

  bool connect() {
    if (!a.create(dev_a, qcfg) || !b.create(dev_b, qcfg)) return false;
    return bring_up(a.qp, a.psn, b.qpn(), b.psn, dev_b.gid, conn, dev_a.attr) == 0 &&
           bring_up(b.qp, b.psn, a.qpn(), a.psn, dev_a.gid, conn, dev_b.attr) == 0;
  }
};

TEST_P(Blame, TheBadRequestTakesTheError) {
  const Case c = GetParam();
  ASSERT_TRUE(dev_a.ok() && dev_b.ok());
  if (dev_a.attr.atomic_cap == IBV_ATOMIC_NONE) GTEST_SKIP() << "no atomics";
  ASSERT_TRUE(connect());
  constexpr size_t kLen = 64 * 1024;
  VT_BUF(local, a, kLen + 64);
  VT_BUF(remote, b, kLen);
  VT_BUF(word, b, 64);
  // The target of the bad request: registered without the access it needs when that is the fault.
  const int needs = c.op == IBV_WR_RDMA_WRITE ? IBV_ACCESS_REMOTE_WRITE
                    : c.op == IBV_WR_RDMA_READ ? IBV_ACCESS_REMOTE_READ
                                               : IBV_ACCESS_REMOTE_ATOMIC;
  VT_BUF(victim, b, 4096, c.bad == Bad::Access ? (kAllAccess & ~needs) : kAllAccess);
  std::memset(victim->data, 0x5A, 4096);
  fill_pattern(remote->data, kLen, 7);
  word->u64(0) = 100;

  // The outstanding READ and/or ATOMIC, then the bad request, then two that must be flushed.
  std::vector<SendWr> wrs;
  SendWr write(1, IBV_WR_RDMA_WRITE, {local->sge(0, 256)});
  fill_pattern(local->data, 256, 8);
  write.rdma(remote->addr(kLen - 256), remote->rkey());
  wrs.push_back(write);
  if (c.behind != Behind::Atomic) {
    SendWr read(2, IBV_WR_RDMA_READ, {local->sge(0, kLen - 256)});
    read.rdma(remote->addr(), remote->rkey());
    wrs.push_back(read);
  }
  if (c.behind != Behind::Read) {
    SendWr fa(3, IBV_WR_ATOMIC_FETCH_AND_ADD, {local->sge(kLen, 8)});
    fa.fetch_add(word->addr(), word->rkey(), 5);
    wrs.push_back(fa);
  }
  uint64_t addr = victim->addr(c.op == IBV_WR_ATOMIC_FETCH_AND_ADD ? 8 : 0);
  uint32_t rkey = victim->rkey();
  uint32_t len = c.op == IBV_WR_ATOMIC_FETCH_AND_ADD ? 8 : 128;
  if (c.bad == Bad::Rkey) rkey = 0;
  if (c.bad == Bad::Range) addr = victim->addr(4096 - len + 8);  // ends 8 bytes past the MR
  SendWr bad(4, c.op, {local->sge(kLen + 8, c.op == IBV_WR_ATOMIC_FETCH_AND_ADD ? 8 : 56)});
  if (c.op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    bad.fetch_add(addr, rkey, 1);
  } else {
    bad.sges[0] = local->sge(0, len);
    bad.rdma(addr, rkey);
  }
  wrs.push_back(bad);
  SendWr after1(5, IBV_WR_RDMA_WRITE, {local->sge(0, 8)});
  after1.rdma(remote->addr(), remote->rkey());
  wrs.push_back(after1);
  SendWr after2(6, IBV_WR_ATOMIC_FETCH_AND_ADD, {local->sge(kLen, 8)});
  after2.fetch_add(word->addr(), word->rkey(), 1000);
  wrs.push_back(after2);
  for (SendWr& w : wrs) ASSERT_EQ(post_send(a.qp, w), 0);

  auto wcs = poll_wcs(a.scq, wrs.size());
  ASSERT_EQ(wcs.size(), wrs.size());
  for (size_t i = 0; i < wcs.size(); ++i) {
    const uint64_t id = wrs[i].wr.wr_id;
    EXPECT_EQ(wcs[i].wr_id, id) << "completions in posting order";
    ibv_wc_status want = id < 4 ? IBV_WC_SUCCESS : id == 4 ? IBV_WC_REM_ACCESS_ERR : IBV_WC_WR_FLUSH_ERR;
    EXPECT_EQ(wcs[i].status, want) << "wr_id " << id << ": " << ibv_wc_status_str(wcs[i].status);
  }
  if (c.behind != Behind::Atomic) {
    EXPECT_EQ(check_pattern(local->data, kLen - 256, 7), kLen - 256) << "the READ before the bad request";
  }
  if (c.behind != Behind::Read) {
    EXPECT_EQ(local->u64(kLen), 100u) << "the FETCH_ADD before it returned the original value";
    EXPECT_EQ(word->u64(0), 105u) << "executed exactly once, and the flushed one not at all";
  } else {
    EXPECT_EQ(word->u64(0), 100u) << "the flushed FETCH_ADD was not executed";
  }
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(victim->data[i], 0x5A) << "the refused request touched memory at " << i;
  EXPECT_TRUE(wait_qp_state(a.qp, IBV_QPS_ERR));
}

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (Bad bad : {Bad::Rkey, Bad::Range, Bad::Access})
    for (Behind behind : {Behind::Read, Behind::Atomic, Behind::Both})
      for (ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD})
        v.push_back({bad, behind, op});
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllCombinations, Blame, ::testing::ValuesIn(all_cases()), name);

}  // namespace
}  // namespace softrdma::verbs_test
