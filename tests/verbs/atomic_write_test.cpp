// RDMA ATOMIC WRITE (IBTA 1.5; ibv_wr_atomic_write, IBV_WR_ATOMIC_WRITE): 8 bytes written at an 8-byte
// aligned remote address as one store, checked against the target's REMOTE_WRITE rights, completing
// with IBV_WC_ATOMIC_WRITE. Errors: a misaligned address is an invalid request, a bad key or missing
// right a remote access error, a gather list of other than 8 bytes a local length error.
#include "helpers.h"

#include <cstring>

namespace softrdma::verbs_test {
namespace {

class AtomicWriteBase : public RcPair {
 protected:
  void SetUp() override {
    RcPair::SetUp();
    qcfg.extended = true;
    qcfg.send_ops_flags |= IBV_QP_EX_WITH_ATOMIC_WRITE;
  }
  // One ibv_wr_atomic_write of the 8 bytes at value, signaled; ibv_wr_complete's result.
  int atomic_write(uint64_t wr_id, uint32_t rkey, uint64_t raddr, const void* value) {
    ibv_wr_start(a.qpx);
    a.qpx->wr_id = wr_id;
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_write(a.qpx, rkey, raddr, value);
    return ibv_wr_complete(a.qpx);
  }
  // The single completion of a failed request, and the requester's QP in error afterwards.
  void expect_failure(uint64_t wr_id, ibv_wc_status status) {
    auto wcs = poll_wcs(a.scq, 1);
    ASSERT_EQ(wcs.size(), 1u);
    expect_wc(wcs[0], {.wr_id = wr_id, .status = status, .qp_num = a.qpn()});
    EXPECT_TRUE(wait_qp_state(a.qp, IBV_QPS_ERR));
  }
};
using AtomicWrite = OverPaths<AtomicWriteBase>;

// The device says so as the kernel does: IB_UVERBS_DEVICE_ATOMIC_WRITE (bit 40) in device_cap_flags_ex.
TEST_P(AtomicWrite, DeviceReportsTheCapability) {
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(dev.ctx, nullptr, &ex), 0);
  EXPECT_NE(ex.device_cap_flags_ex & (uint64_t{1} << 40), 0u);
}

// An RC operation only: a UC or UD QP asking for it in send_ops_flags is refused at creation, and the
// classic post on a UC QP is refused at post time.
TEST_P(AtomicWrite, RcOnly) {
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  for (ibv_qp_type type : {IBV_QPT_UC, IBV_QPT_UD}) {
    ibv_qp_init_attr_ex ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.cap = {4, 4, 1, 1, 0};
    ia.qp_type = type;
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ia.pd = pd;
    ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_WRITE;
    errno = 0;
    ibv_qp* qp = ibv_create_qp_ex(dev.ctx, &ia);
    EXPECT_EQ(qp, nullptr) << "type " << type;
    EXPECT_EQ(errno, EOPNOTSUPP);
    if (qp) ibv_destroy_qp(qp);
  }
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.cap = {4, 4, 1, 1, 0};
  ia.qp_type = IBV_QPT_UC;
  ibv_qp* uc = ibv_create_qp(pd, &ia);
  ASSERT_NE(uc, nullptr);
  // UC transitions (no RC-only attributes), connected to itself: only the post matters here.
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.port_num = kPort;
  at.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(ibv_modify_qp(uc, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  at = {};
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = IBV_MTU_1024;
  at.dest_qp_num = uc->qp_num;
  at.rq_psn = 1;
  at.ah_attr.is_global = 1;
  at.ah_attr.grh.dgid = dev.gid;
  at.ah_attr.grh.sgid_index = sgid_index();
  at.ah_attr.grh.hop_limit = 64;
  at.ah_attr.port_num = kPort;
  ASSERT_EQ(ibv_modify_qp(uc, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN), 0);
  at = {};
  at.qp_state = IBV_QPS_RTS;
  at.sq_psn = 1;
  ASSERT_EQ(ibv_modify_qp(uc, &at, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  Buffer b(64);
  ASSERT_TRUE(b.reg(pd, kAllAccess));
  SendWr w(1, IBV_WR_ATOMIC_WRITE, {b.sge(0, 8)});
  w.rdma(b.addr(8), b.rkey());
  EXPECT_EQ(post_send(uc, w), EINVAL);
  EXPECT_EQ(ibv_destroy_qp(uc), 0);
  EXPECT_EQ(ibv_dereg_mr(b.mr), 0);
  b.mr = nullptr;
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

TEST_P(AtomicWrite, ExtendedApiWritesEightBytesAndCompletes) {
  ASSERT_TRUE(connect());
  VT_BUF(remote, b, 4096);
  std::memset(remote->data, 0xEE, 64);
  const uint64_t v1 = 0x0123456789ABCDEFull, v2 = 0xFEDCBA9876543210ull;
  uint64_t value = v1;
  ASSERT_EQ(atomic_write(1, remote->rkey(), remote->addr(8), &value), 0);
  value = 0;  // the 8 bytes were taken at post time
  auto wcs = poll_wcs(a.scq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  expect_wc(wcs[0], {.wr_id = 1, .opcode = IBV_WC_ATOMIC_WRITE, .qp_num = a.qpn()});
  EXPECT_EQ(remote->u64(8), v1);
  // Exactly those 8 bytes: the neighbours are untouched.
  EXPECT_EQ(remote->u64(0), 0xEEEEEEEEEEEEEEEEull);
  EXPECT_EQ(remote->u64(16), 0xEEEEEEEEEEEEEEEEull);

  // A batch: ATOMIC WRITEs and a READ behind them, which sees the last value (requests execute in order).
  VT_BUF(local, a, 4096);
  const uint64_t vals[3] = {v2, v1 ^ v2, v2};
  ibv_wr_start(a.qpx);
  for (int i = 0; i < 3; ++i) {
    a.qpx->wr_id = 10 + i;
    a.qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_write(a.qpx, remote->rkey(), remote->addr(64 + 8 * (i % 2)), &vals[i]);
  }
  a.qpx->wr_id = 13;
  a.qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_read(a.qpx, remote->rkey(), remote->addr(64));
  ibv_wr_set_sge(a.qpx, local->lkey(), local->addr(0), 16);
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  wcs = poll_wcs(a.scq, 4);
  ASSERT_EQ(wcs.size(), 4u);
  for (int i = 0; i < 3; ++i)
    expect_wc(wcs[i], {.wr_id = uint64_t(10 + i), .opcode = IBV_WC_ATOMIC_WRITE, .qp_num = a.qpn()});
  expect_wc(wcs[3], {.wr_id = 13, .opcode = IBV_WC_RDMA_READ, .byte_len = 16, .qp_num = a.qpn()});
  EXPECT_EQ(remote->u64(64), v2);
  EXPECT_EQ(remote->u64(72), v1 ^ v2);
  EXPECT_EQ(local->u64(0), v2);
  EXPECT_EQ(local->u64(8), v1 ^ v2);
}

// The classic API: IBV_WR_ATOMIC_WRITE takes its 8 bytes from the gather list, wr.rdma names the target.
TEST_P(AtomicWrite, PostSendTakesTheGatherList) {
  ASSERT_TRUE(connect());
  VT_BUF(remote, b, 4096);
  VT_BUF(local, a, 4096);
  local->u64(0) = 0x1122334455667788ull;
  SendWr w(5, IBV_WR_ATOMIC_WRITE, {local->sge(0, 4), local->sge(4, 4)});
  w.rdma(remote->addr(128), remote->rkey());
  ASSERT_EQ(post_send(a.qp, w), 0);
  auto wcs = poll_wcs(a.scq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  expect_wc(wcs[0], {.wr_id = 5, .opcode = IBV_WC_ATOMIC_WRITE, .qp_num = a.qpn()});
  EXPECT_EQ(remote->u64(128), 0x1122334455667788ull);
}

TEST_P(AtomicWrite, MisalignedAddressIsAnInvalidRequest) {
  ASSERT_TRUE(connect());
  VT_BUF(remote, b, 4096);
  std::memset(remote->data, 0, 64);
  uint64_t value = ~0ull;
  ASSERT_EQ(atomic_write(2, remote->rkey(), remote->addr(4), &value), 0);
  expect_failure(2, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(remote->u64(0), 0u);
  EXPECT_EQ(remote->u64(8), 0u);
}

TEST_P(AtomicWrite, WrongKeyIsARemoteAccessError) {
  ASSERT_TRUE(connect());
  VT_BUF(remote, b, 4096);
  uint64_t value = 7;
  ASSERT_EQ(atomic_write(3, remote->rkey() ^ 0x100, remote->addr(0), &value), 0);
  expect_failure(3, IBV_WC_REM_ACCESS_ERR);
}

TEST_P(AtomicWrite, PastTheEndOfTheRegionIsARemoteAccessError) {
  ASSERT_TRUE(connect());
  VT_BUF(remote, b, 4096);
  uint64_t value = 7;
  ASSERT_EQ(atomic_write(4, remote->rkey(), remote->addr(4096), &value), 0);
  expect_failure(4, IBV_WC_REM_ACCESS_ERR);
}

// The right checked is REMOTE_WRITE, on the region and on the responder QP.
TEST_P(AtomicWrite, RegionWithoutRemoteWriteIsARemoteAccessError) {
  ASSERT_TRUE(connect());
  VT_BUF(remote, b, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  remote->u64(0) = 1;
  uint64_t value = 9;
  ASSERT_EQ(atomic_write(5, remote->rkey(), remote->addr(0), &value), 0);
  expect_failure(5, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(remote->u64(0), 1u);
}

TEST_P(AtomicWrite, QpWithoutRemoteWriteIsARemoteAccessError) {
  conn.access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  ASSERT_TRUE(connect());
  VT_BUF(remote, b, 4096);
  remote->u64(0) = 1;
  uint64_t value = 9;
  ASSERT_EQ(atomic_write(6, remote->rkey(), remote->addr(0), &value), 0);
  expect_failure(6, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(remote->u64(0), 1u);
}

TEST_P(AtomicWrite, GatherListOfOtherThanEightBytesIsALocalLengthError) {
  ASSERT_TRUE(connect());
  VT_BUF(remote, b, 4096);
  VT_BUF(local, a, 4096);
  SendWr w(7, IBV_WR_ATOMIC_WRITE, {local->sge(0, 16)});
  w.rdma(remote->addr(0), remote->rkey());
  ASSERT_EQ(post_send(a.qp, w), 0);
  expect_failure(7, IBV_WC_LOC_LEN_ERR);
}

// Off iWARP: it has no ATOMIC WRITE (docs/iwarp.md).
VT_INSTANTIATE_PATHS(AtomicWrite, VT_ROCE_PATHS);

}  // namespace
}  // namespace softrdma::verbs_test
