// ibv_rereg_mr(3): an MR changes its pages (IBV_REREG_MR_CHANGE_TRANSLATION), its PD (_CHANGE_PD),
// its rights (_CHANGE_ACCESS), or any combination, and a peer's and the owner's accesses follow at
// once; input errors leave it as it was. Run between two contexts of one process, over softrdma's
// intra-host direct path (which must follow the change too) and by packets. The keys are read from
// the ibv_mr again after each change: hardware may give new ones.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "two_process.h"  // my_counter

namespace softrdma::verbs_test {
namespace {

constexpr size_t kLen = 8192;

// Two contexts (what two processes on one host would have), each opened over the path: dev (of
// RcPair) holds a, dev_b holds b.
class ReregBase : public RcPair {
 protected:
  Device dev_b{Device::Later{}};  // b owns the memory under test, a reaches it

  ~ReregBase() override {
    a.reset();  // before the contexts go
    b.reset();
  }
  void SetUp() override {
    RcPair::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(dev_b.open(path)) << "a second context for path " << path_name(path);
  }
  bool connect() {
    const QpConfig cfg = path_qp_config();
    return a.create(dev, cfg) && b.create(dev_b, cfg) && join(a.qp, a.psn, dev, b.qp, b.psn, dev_b);
  }
  // Both QPs through RESET and back to RTS with fresh PSNs (after an error).
  bool recover() {
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RESET;
    if (ibv_modify_qp(a.qp, &r, IBV_QP_STATE) || ibv_modify_qp(b.qp, &r, IBV_QP_STATE)) return false;
    a.psn = random_psn();
    b.psn = random_psn();
    return join(a.qp, a.psn, dev, b.qp, b.psn, dev_b);
  }
  // One signaled operation from a; its completion status.
  ibv_wc_status run(SendWr& w) {
    if (post_send(a.qp, w) != 0) return IBV_WC_GENERAL_ERR;
    ibv_wc wc{};
    if (!poll_wc(a.scq, &wc)) return IBV_WC_GENERAL_ERR;
    EXPECT_EQ(wc.wr_id, w.wr.wr_id);
    return wc.status;
  }
  ibv_wc_status write(Buffer& src, uint32_t len, uint64_t raddr, uint32_t rkey, uint64_t id = 1) {
    SendWr w(id, IBV_WR_RDMA_WRITE, {src.sge(0, len)});
    w.rdma(raddr, rkey);
    return run(w);
  }
  ibv_wc_status read(Buffer& dst, uint32_t len, uint64_t raddr, uint32_t rkey, uint64_t id = 2) {
    SendWr w(id, IBV_WR_RDMA_READ, {dst.sge(0, len)});
    w.rdma(raddr, rkey);
    return run(w);
  }
};
// Off iWARP: there is no RDMA-level acknowledgement there, so a WRITE or SEND completes with success
// once its bytes are in the socket (docs/iwarp.md, "Completion"). These bodies check a WRITE's target
// at the WRITE's completion, or expect the responder's refusal in the WRITE's or SEND's own completion
// (which on iWARP reaches the requester later, as a Terminate); and an iWARP device has no device
// memory.
using Rereg = OverPaths<ReregBase>;

uint64_t addr_of(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Whether softrdma serves these contexts by its direct path (SOFTRDMA_DIRECT=0 and fault injection
// keep it off; another provider has no such counter).
bool direct_expected() {
  const char* s = getenv("SOFTRDMA_DIRECT");
  bool on = s ? std::strcmp(s, "0") != 0 : getenv("SOFTRDMA_IMPAIR") == nullptr;
  return on && getenv("VT_DEVICE") == nullptr;
}

// What libibverbs checks itself fails with IBV_REREG_MR_ERR_INPUT and EINVAL; what the device
// refuses fails too (EINVAL). Either way the MR keeps working as it was.
TEST_P(Rereg, BadInputLeavesTheMrAsItWas) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, kLen);
  VT_BUF(dst, b, kLen);
  ibv_mr* mr = dst->mr;
  Buffer other(kLen);
  ASSERT_NE(other.data, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, 1 << 3, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT) << "unknown flag";
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nullptr, kLen, 0), IBV_REREG_MR_ERR_INPUT)
      << "no address";
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, other.data, 0, 0), IBV_REREG_MR_ERR_INPUT)
      << "no length";
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, b.pd, nullptr, 0, IBV_ACCESS_LOCAL_WRITE),
            IBV_REREG_MR_ERR_INPUT)
      << "access without IBV_REREG_MR_CHANGE_ACCESS";
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_NE(ibv_rereg_mr(mr, 0, nullptr, nullptr, 0, 0), 0) << "nothing to change";
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_NE(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE), 0)
      << "REMOTE_WRITE without LOCAL_WRITE (ibv_reg_mr(3))";
  EXPECT_EQ(errno, EINVAL);

  EXPECT_EQ(mr->addr, dst->data);
  EXPECT_EQ(mr->length, kLen);
  EXPECT_EQ(mr->pd, b.pd);
  fill_pattern(src->data, kLen, 1);
  ASSERT_EQ(write(*src, kLen, dst->addr(), mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(dst->data, kLen, 1), kLen);
}

// Rights granted by a rereg are usable at once, and rights taken away are refused at once.
TEST_P(Rereg, ChangeAccessGrantsAndRevokes) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, kLen);
  VT_BUF(back, a, kLen);
  VT_BUF(dst, b, kLen, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* mr = dst->mr;
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
            0);
  fill_pattern(src->data, kLen, 2);
  ASSERT_EQ(write(*src, kLen, dst->addr(), mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(dst->data, kLen, 2), kLen);
  ASSERT_EQ(read(*back, 4096, dst->addr(4096), mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(back->data, 4096, 2, 4096), 4096u);

  // Read-only now: READs still work, a WRITE is a remote access error and changes nothing.
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ),
            0);
  std::memset(back->data, 0, kLen);
  ASSERT_EQ(read(*back, kLen, dst->addr(), mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(back->data, kLen, 2), kLen);
  fill_pattern(src->data, kLen, 3);
  EXPECT_EQ(write(*src, 64, dst->addr(), mr->rkey), IBV_WC_REM_ACCESS_ERR);
  EXPECT_TRUE(wait_qp_state(a.qp, IBV_QPS_ERR));
  EXPECT_EQ(check_pattern(dst->data, kLen, 2), kLen);
}

// New pages: a peer's WRITE with the MR's rkey lands in them, the old ones are out of reach.
TEST_P(Rereg, ChangeTranslationMovesWhatPeersReach) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, kLen);
  VT_BUF(back, a, kLen);
  Buffer fresh(2 * kLen);  // outlives the MR, which the buffer below owns
  ASSERT_NE(fresh.data, nullptr);
  VT_BUF(dst, b, kLen);
  ibv_mr* mr = dst->mr;
  std::memset(dst->data, 0x11, kLen);
  std::memset(fresh.data, 0x22, 2 * kLen);
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, fresh.data + 100, kLen + 900, 0), 0);
  EXPECT_EQ(mr->addr, fresh.data + 100);
  EXPECT_EQ(mr->length, kLen + 900);
  EXPECT_EQ(mr->pd, b.pd);
  fill_pattern(src->data, kLen, 4);
  ASSERT_EQ(write(*src, kLen, addr_of(fresh.data) + 1000, mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(fresh.data + 1000, kLen, 4), kLen);
  ASSERT_EQ(read(*back, 4096, addr_of(fresh.data) + 1000, mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(back->data, 4096, 4), 4096u);
  for (size_t i = 0; i < kLen; ++i) ASSERT_EQ(dst->data[i], 0x11) << "the old pages were written at " << i;
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(fresh.data[i], 0x22) << "written before the window at " << i;
  // The old range (a mapping of its own, so outside the new one) is no longer the MR's.
  EXPECT_EQ(write(*src, 64, dst->addr(), mr->rkey), IBV_WC_REM_ACCESS_ERR);
  EXPECT_TRUE(wait_qp_state(a.qp, IBV_QPS_ERR));
  for (size_t i = 0; i < kLen; ++i) ASSERT_EQ(dst->data[i], 0x11) << "the old pages were written at " << i;
}

// The owner's own lkey follows too: gather from the new pages works, the old address is a local
// protection error.
TEST_P(Rereg, ChangeTranslationMovesTheLkey) {
  ASSERT_TRUE(connect());
  Buffer fresh(kLen);
  ASSERT_NE(fresh.data, nullptr);
  VT_BUF(src, a, kLen);
  VT_BUF(dst, b, kLen);
  ibv_mr* mr = src->mr;
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, fresh.data, kLen, 0), 0);
  fill_pattern(fresh.data, kLen, 5);
  SendWr w(3, IBV_WR_RDMA_WRITE, {ibv_sge{addr_of(fresh.data), static_cast<uint32_t>(kLen), mr->lkey}});
  w.rdma(dst->addr(), dst->rkey());
  ASSERT_EQ(run(w), IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(dst->data, kLen, 5), kLen);
  SendWr old(4, IBV_WR_RDMA_WRITE, {ibv_sge{src->addr(), 64, mr->lkey}});
  old.rdma(dst->addr(), dst->rkey());
  EXPECT_EQ(run(old), IBV_WC_LOC_PROT_ERR);
}

// As rdma-core's test_mr_rereg_addr: a receive posted into the old pages fails when a message comes
// (the sender sees a remote operational error); after RESET both QPs work again with the new pages,
// and no completion of before the RESET comes back.
TEST_P(Rereg, ReceivePostedIntoOldPagesFails) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 256);
  Buffer fresh(4096);
  ASSERT_NE(fresh.data, nullptr);
  VT_BUF(inbox, b, 4096);
  ibv_mr* mr = inbox->mr;
  std::memset(inbox->data, 0x33, 4096);
  ASSERT_EQ(post_recv(b.qp, 10, {inbox->sge(0, 4096)}), 0);
  ASSERT_EQ(post_recv(b.qp, 11, {inbox->sge(0, 4096)}), 0);
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, fresh.data, 4096, 0), 0);
  fill_pattern(src->data, 256, 6);
  SendWr s(12, IBV_WR_SEND, {src->sge(0, 256)});
  EXPECT_EQ(run(s), IBV_WC_REM_OP_ERR);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  EXPECT_EQ(wc.wr_id, 10u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(inbox->data[i], 0x33) << "old pages written at " << i;
  EXPECT_TRUE(wait_qp_state(b.qp, IBV_QPS_ERR));
  EXPECT_TRUE(wait_qp_state(a.qp, IBV_QPS_ERR));

  ASSERT_TRUE(recover());
  ASSERT_EQ(post_recv(b.qp, 13, {ibv_sge{addr_of(fresh.data), 4096, mr->lkey}}), 0);
  SendWr s2(14, IBV_WR_SEND, {src->sge(0, 256)});
  ASSERT_EQ(run(s2), IBV_WC_SUCCESS) << "a completion from before the RESET came back?";
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 13, .opcode = IBV_WC_RECV, .byte_len = 256, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(fresh.data, 256, 6), 256u);
}

// Another PD: the QPs of the old one can no longer use the MR, by rkey or by lkey; the PD it is in
// cannot be deallocated; moved back, everything works again.
TEST_P(Rereg, ChangePd) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, kLen);
  VT_BUF(dst, b, kLen);
  VT_BUF(inbox, b, 256);
  ibv_pd* pd2 = ibv_alloc_pd(dev_b.ctx);
  ASSERT_NE(pd2, nullptr);
  ibv_mr* mr = dst->mr;
  std::memset(dst->data, 0x44, kLen);
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, nullptr, 0, 0), 0);
  EXPECT_EQ(mr->pd, pd2);
  EXPECT_EQ(ibv_dealloc_pd(pd2), EBUSY) << "an MR is in it";
  fill_pattern(src->data, kLen, 7);
  EXPECT_EQ(write(*src, 64, dst->addr(), mr->rkey), IBV_WC_REM_ACCESS_ERR);
  for (size_t i = 0; i < kLen; ++i) ASSERT_EQ(dst->data[i], 0x44) << "written at " << i;
  ASSERT_TRUE(recover());
  // b's own QP (of b.pd) cannot gather from it either.
  SendWr w(5, IBV_WR_RDMA_WRITE, {dst->sge(0, 64)});
  w.rdma(src->addr(), src->rkey());
  ASSERT_EQ(post_send(b.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR);

  ASSERT_TRUE(recover());
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, b.pd, nullptr, 0, 0), 0);
  EXPECT_EQ(mr->pd, b.pd);
  EXPECT_EQ(ibv_dealloc_pd(pd2), 0);
  ASSERT_EQ(write(*src, kLen, dst->addr(), mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(dst->data, kLen, 7), kLen);
}

// All three at once: an MR of another PD, local-only, over other pages becomes a remote-writable MR
// of b's PD over new pages.
TEST_P(Rereg, AllThreeAtOnce) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, kLen);
  Buffer fresh(kLen);
  ASSERT_NE(fresh.data, nullptr);
  ibv_pd* pd2 = ibv_alloc_pd(dev_b.ctx);
  ASSERT_NE(pd2, nullptr);
  Buffer old(4096);
  ASSERT_TRUE(old.reg(pd2, IBV_ACCESS_LOCAL_WRITE));
  ibv_mr* mr = old.mr;
  const int all = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
  ASSERT_EQ(ibv_rereg_mr(mr, all, b.pd, fresh.data, kLen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(mr->pd, b.pd);
  EXPECT_EQ(mr->addr, fresh.data);
  EXPECT_EQ(mr->length, kLen);
  EXPECT_EQ(ibv_dealloc_pd(pd2), 0) << "the MR left it";
  fill_pattern(src->data, kLen, 8);
  ASSERT_EQ(write(*src, kLen, addr_of(fresh.data), mr->rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(fresh.data, kLen, 8), kLen);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  old.mr = nullptr;
}

// Many changes back and forth while the peer keeps accessing: each access sees the MR as it is
// after the last rereg that returned (the direct path's cached lookups must not outlive one).
TEST_P(Rereg, RepeatedChangesAreSeenAtOnce) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 4096);
  Buffer x(4096), y(4096);
  ASSERT_TRUE(x.data && y.data);
  VT_BUF(owner, b, 4096);
  ibv_mr* mr = owner->mr;
  const uint64_t direct_before = my_counter(&core::Counters::direct_ops);
  for (uint32_t round = 0; round < 20; ++round) {
    Buffer& to = round % 2 ? x : y;
    Buffer& other = round % 2 ? y : x;
    std::memset(x.data, 0, 4096);
    std::memset(y.data, 0, 4096);
    ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, to.data, 4096, 0), 0);
    fill_pattern(src->data, 4096, 100 + round);
    ASSERT_EQ(write(*src, 4096, addr_of(to.data), mr->rkey, round), IBV_WC_SUCCESS) << "round " << round;
    EXPECT_EQ(check_pattern(to.data, 4096, 100 + round), 4096u) << "round " << round;
    for (int i = 0; i < 4096; ++i) ASSERT_EQ(other.data[i], 0) << "round " << round << ": the other pages";
  }
  if (path == Path::Direct && direct_expected()) {
    EXPECT_GE(my_counter(&core::Counters::direct_ops), direct_before + 20) << "the direct path served them";
  }
}

// A device-memory MR is not an IBV_MR_TYPE_MR: libibverbs refuses to re-register it.
TEST_P(Rereg, DeviceMemoryMrIsRefused) {
  ibv_alloc_dm_attr attr{};
  attr.length = 4096;
  ibv_dm* dm = ibv_alloc_dm(dev_b.ctx, &attr);
  if (!dm) GTEST_SKIP() << "no device memory";
  ibv_pd* pd = ibv_alloc_pd(dev_b.ctx);
  ASSERT_NE(pd, nullptr);
  ibv_mr* mr = ibv_reg_dm_mr(pd, dm, 0, 4096, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE),
            IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_free_dm(dm), 0);
}

VT_INSTANTIATE_PATHS(Rereg, VT_ROCE_PATHS);

}  // namespace
}  // namespace softrdma::verbs_test
