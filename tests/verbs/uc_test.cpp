// UC queue pairs: SEND and RDMA WRITE (with immediate) over a connection without acknowledgements,
// segmented by the path MTU, a WRITE through a type 2 memory window bound on the UC QP, and what UC
// refuses (READ, ATOMIC) or silently drops (a WRITE with a bad R_Key). Only the public verbs API is used.
#include <cstring>

#include "helpers.h"

namespace softrdma::verbs_test {
namespace {

struct PdOwner {
  ibv_pd* pd = nullptr;
  ~PdOwner() {
    if (pd) ibv_dealloc_pd(pd);
  }
};

struct UcQp {
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  ibv_qp* qp = nullptr;
  ~UcQp() {
    if (qp) ibv_destroy_qp(qp);
    if (scq) ibv_destroy_cq(scq);
    if (rcq) ibv_destroy_cq(rcq);
  }
  bool create(ibv_context* ctx, ibv_pd* pd) {
    scq = ibv_create_cq(ctx, 128, nullptr, nullptr, 0);
    rcq = ibv_create_cq(ctx, 128, nullptr, nullptr, 0);
    if (!scq || !rcq) return false;
    ibv_qp_init_attr ia{};
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.qp_type = IBV_QPT_UC;
    ia.cap.max_send_wr = 64;
    ia.cap.max_recv_wr = 64;
    ia.cap.max_send_sge = 2;
    ia.cap.max_recv_sge = 2;
    qp = ibv_create_qp(pd, &ia);
    return qp != nullptr;
  }
};

// The UC transitions with exactly what the spec requires (no RC-only attributes).
int connect_uc(ibv_qp* qp, uint32_t my_psn, uint32_t dest_qpn, uint32_t dest_psn, const ibv_gid& gid,
               ibv_mtu mtu) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = kPort;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return r;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = mtu;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = dest_psn;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = kPort;
  if (int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN))
    return r;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = my_psn;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

class Uc : public ::testing::Test {
 protected:
  Device dev;
  PdOwner pd_owner;
  ibv_pd* pd = nullptr;
  UcQp a, b;
  std::unique_ptr<Buffer> src, dst;

  void SetUp() override {
    ASSERT_TRUE(dev.ok()) << "no loopback device";
    pd = pd_owner.pd = ibv_alloc_pd(dev.ctx);
    ASSERT_NE(pd, nullptr);
    ASSERT_TRUE(a.create(dev.ctx, pd));
    ASSERT_TRUE(b.create(dev.ctx, pd));
    uint32_t pa = random_psn(), pb = random_psn();
    ASSERT_EQ(connect_uc(a.qp, pa, b.qp->qp_num, pb, dev.gid, IBV_MTU_1024), 0);
    ASSERT_EQ(connect_uc(b.qp, pb, a.qp->qp_num, pa, dev.gid, IBV_MTU_1024), 0);
    src = std::make_unique<Buffer>(1 << 20);
    dst = std::make_unique<Buffer>(1 << 20);
    ASSERT_TRUE(src->reg(pd, IBV_ACCESS_LOCAL_WRITE));
    ASSERT_TRUE(dst->reg(pd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  }

  void send_done(uint64_t wr_id, ibv_wc_opcode op) {
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(a.scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, wr_id);
    EXPECT_EQ(wc.opcode, op);
  }
};

TEST_F(Uc, SendSegmentedWithData) {
  for (uint32_t len : {0u, 1u, 1024u, 1025u, 70000u}) {
    std::memset(dst->data, 0, 80000);
    ASSERT_EQ(post_recv(b.qp, len, {dst->sge(0, 80000)}), 0);
    fill_pattern(src->data, len, len + 1);
    SendWr w(1000 + len, IBV_WR_SEND, {src->sge(0, len)});
    ASSERT_EQ(post_send(a.qp, w), 0);
    send_done(1000 + len, IBV_WC_SEND);
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(b.rcq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << len;
    EXPECT_EQ(wc.wr_id, len);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV);
    EXPECT_EQ(wc.byte_len, len);
    EXPECT_FALSE(wc.wc_flags & IBV_WC_WITH_IMM);
    EXPECT_EQ(check_pattern(dst->data, len, len + 1), len);
  }
}

TEST_F(Uc, SendWithImmScattered) {
  ASSERT_EQ(post_recv(b.qp, 9, {dst->sge(0, 1000), dst->sge(4096, 3000)}), 0);
  fill_pattern(src->data, 3500, 77);
  SendWr w(10, IBV_WR_SEND_WITH_IMM, {src->sge(0, 3500)});
  w.imm(0xABCD);
  ASSERT_EQ(post_send(a.qp, w), 0);
  send_done(10, IBV_WC_SEND);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 3500u);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(wc.imm_data), 0xABCDu);
  EXPECT_EQ(check_pattern(dst->data, 1000, 77), 1000u);
  EXPECT_EQ(check_pattern(dst->data + 4096, 2500, 77, 1000), 2500u);
}

TEST_F(Uc, WriteAndWriteWithImm) {
  constexpr uint32_t len = 300000;
  fill_pattern(src->data, len, 5);
  SendWr w(20, IBV_WR_RDMA_WRITE, {src->sge(0, len)});
  w.rdma(dst->addr(100), dst->rkey());
  ASSERT_EQ(post_send(a.qp, w), 0);
  send_done(20, IBV_WC_RDMA_WRITE);

  // The WRITE with immediate follows it: when its completion arrives, both are placed.
  ASSERT_EQ(post_recv(b.qp, 21, {}), 0);
  fill_pattern(src->data + len, 5000, 6);
  SendWr wi(22, IBV_WR_RDMA_WRITE_WITH_IMM, {src->sge(len, 5000)});
  wi.rdma(dst->addr(500000), dst->rkey()).imm(0x1234);
  ASSERT_EQ(post_send(a.qp, wi), 0);
  send_done(22, IBV_WC_RDMA_WRITE);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 21u);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(wc.byte_len, 5000u);
  EXPECT_EQ(ntohl(wc.imm_data), 0x1234u);
  EXPECT_EQ(check_pattern(dst->data + 100, len, 5), len);
  EXPECT_EQ(check_pattern(dst->data + 500000, 5000, 6), 5000u);
}

// A type 2 window is bound to the QP that bound it (IBTA 10.6.7.2): its peer writes through it on UC
// as on RC. The WRITE with immediate behind it tells when both are placed (UC has no ACK).
TEST_F(Uc, WriteThroughTypeTwoWindowBoundOnTheQp) {
  Buffer mem(16384);
  ASSERT_TRUE(mem.reg(pd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND));
  ibv_mw* mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  const uint32_t key = ibv_inc_rkey(mw->rkey);
  ibv_send_wr bind{};
  bind.wr_id = 30;
  bind.opcode = IBV_WR_BIND_MW;
  bind.send_flags = IBV_SEND_SIGNALED;
  bind.bind_mw.mw = mw;
  bind.bind_mw.rkey = key;
  bind.bind_mw.bind_info.mr = mem.mr;
  bind.bind_mw.bind_info.addr = mem.addr(1024);
  bind.bind_mw.bind_info.length = 8192;
  bind.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(b.qp, &bind, &bad), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.scq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_BIND_MW);

  fill_pattern(src->data, 8192, 9);
  SendWr w(31, IBV_WR_RDMA_WRITE, {src->sge(0, 8192)});
  w.rdma(mem.addr(1024), key);
  ASSERT_EQ(post_send(a.qp, w), 0);
  send_done(31, IBV_WC_RDMA_WRITE);
  ASSERT_EQ(post_recv(b.qp, 32, {}), 0);
  SendWr wi(33, IBV_WR_RDMA_WRITE_WITH_IMM, {src->sge(0, 16)});
  wi.rdma(dst->addr(0), dst->rkey()).imm(7);
  ASSERT_EQ(post_send(a.qp, wi), 0);
  send_done(33, IBV_WC_RDMA_WRITE);
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 32u);
  EXPECT_EQ(check_pattern(mem.data + 1024, 8192, 9), 8192u) << "the WRITE through the window was dropped";
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

TEST_F(Uc, BadRkeyWriteIsDroppedAndTheQpGoesOn) {
  dst->data[0] = 0x5A;
  fill_pattern(src->data, 2048, 8);
  SendWr bad(30, IBV_WR_RDMA_WRITE, {src->sge(0, 2048)});
  bad.rdma(dst->addr(0), dst->rkey() ^ 0x80);
  ASSERT_EQ(post_send(a.qp, bad), 0);
  send_done(30, IBV_WC_RDMA_WRITE);  // no NAK on UC: the requester cannot know

  ASSERT_EQ(post_recv(b.qp, 31, {}), 0);
  SendWr good(32, IBV_WR_RDMA_WRITE_WITH_IMM, {src->sge(0, 2048)});
  good.rdma(dst->addr(8192), dst->rkey()).imm(7);
  ASSERT_EQ(post_send(a.qp, good), 0);
  send_done(32, IBV_WC_RDMA_WRITE);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 31u);
  EXPECT_EQ(check_pattern(dst->data + 8192, 2048, 8), 2048u);
  EXPECT_EQ(dst->data[0], 0x5A) << "the WRITE with the bad R_Key changed memory";
  EXPECT_EQ(qp_state(b.qp), IBV_QPS_RTS);
}

TEST_F(Uc, ReadAndAtomicAreNotUcOperations) {
  ibv_send_wr* bad = nullptr;
  SendWr r(40, IBV_WR_RDMA_READ, {src->sge(0, 8)});
  r.rdma(dst->addr(0), dst->rkey());
  EXPECT_EQ(ibv_post_send(a.qp, r.get(), &bad), EINVAL);
  EXPECT_EQ(bad, r.get());
  SendWr c(41, IBV_WR_ATOMIC_CMP_AND_SWP, {src->sge(0, 8)});
  c.cmp_swp(dst->addr(0), dst->rkey(), 0, 1);
  EXPECT_EQ(ibv_post_send(a.qp, c.get(), &bad), EINVAL);
  SendWr f(42, IBV_WR_ATOMIC_FETCH_AND_ADD, {src->sge(0, 8)});
  f.fetch_add(dst->addr(0), dst->rkey(), 1);
  EXPECT_EQ(ibv_post_send(a.qp, f.get(), &bad), EINVAL);
  // Nothing was queued: no completion ever comes.
  EXPECT_EQ(drain_cq(a.scq), 0);
}

TEST_F(Uc, RcOnlyAttributesAreRefused) {
  UcQp c;
  ASSERT_TRUE(c.create(dev.ctx, pd));
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.port_num = kPort;
  ASSERT_EQ(ibv_modify_qp(c.qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  at = {};
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = IBV_MTU_1024;
  at.dest_qp_num = a.qp->qp_num;
  at.ah_attr.is_global = 1;
  at.ah_attr.grh.dgid = dev.gid;
  at.ah_attr.port_num = kPort;
  at.max_dest_rd_atomic = 1;
  EXPECT_EQ(ibv_modify_qp(c.qp, &at,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC),
            EINVAL);
  ASSERT_EQ(ibv_modify_qp(c.qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN),
            0);
  at = {};
  at.qp_state = IBV_QPS_RTS;
  at.retry_cnt = 7;
  EXPECT_EQ(ibv_modify_qp(c.qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT), EINVAL);
  EXPECT_EQ(ibv_modify_qp(c.qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
}

}  // namespace
}  // namespace softrdma::verbs_test
