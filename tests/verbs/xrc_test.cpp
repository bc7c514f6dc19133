// XRC (IBTA 9.2, 10.2.10; ibv_open_xrcd(3), ibv_create_srq_ex(3), ibv_get_srq_num(3),
// ibv_create_qp_ex(3)): one XRC_SEND QP in one context reaches two XRC SRQs of one domain through one
// XRC_RECV QP in another; every message lands in the SRQ its work request names, with that SRQ's CQ.
#include "two_process.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace softrdma::verbs_test {
namespace {

constexpr uint32_t kDepth = 64;

ibv_xrcd* open_private_xrcd(ibv_context* ctx) {
  ibv_xrcd_init_attr a{};
  a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  a.fd = -1;
  a.oflags = O_CREAT;
  return ibv_open_xrcd(ctx, &a);
}

ibv_srq* create_xrc_srq(ibv_context* ctx, ibv_pd* pd, ibv_xrcd* xrcd, ibv_cq* cq) {
  ibv_srq_init_attr_ex a{};
  a.attr.max_wr = kDepth;
  a.attr.max_sge = 2;
  a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
  a.srq_type = IBV_SRQT_XRC;
  a.pd = pd;
  a.xrcd = xrcd;
  a.cq = cq;
  return ibv_create_srq_ex(ctx, &a);
}

uint32_t srq_num(ibv_srq* srq) {
  uint32_t n = 0;
  EXPECT_EQ(ibv_get_srq_num(srq, &n), 0);
  return n;
}

int post_srq(ibv_srq* srq, uint64_t wr_id, ibv_sge sge) {
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_srq_recv(srq, &wr, &bad);
}

class Xrc : public ::testing::Test {
 protected:
  Device ini, tgt;  // the initiator's context and the target's
  ibv_pd* ipd = nullptr;
  ibv_pd* tpd = nullptr;
  ibv_cq* scq = nullptr;               // the XRC_SEND QP's completions
  ibv_cq* cq_a = nullptr;              // SRQ a's receive completions
  ibv_cq* cq_b = nullptr;              // SRQ b's
  ibv_xrcd* xrcd = nullptr;
  ibv_srq* srq_a = nullptr;
  ibv_srq* srq_b = nullptr;
  ibv_qp* send_qp = nullptr;           // XRC_SEND (initiator)
  ibv_qp* recv_qp = nullptr;           // XRC_RECV (target)
  ConnConfig conn;

  void SetUp() override {
    ASSERT_TRUE(ini.ok() && tgt.ok());
    if (!(tgt.attr.device_cap_flags & IBV_DEVICE_XRC)) GTEST_SKIP() << "no XRC";
    ipd = ibv_alloc_pd(ini.ctx);
    tpd = ibv_alloc_pd(tgt.ctx);
    scq = ibv_create_cq(ini.ctx, 256, nullptr, nullptr, 0);
    cq_a = ibv_create_cq(tgt.ctx, 256, nullptr, nullptr, 0);
    cq_b = ibv_create_cq(tgt.ctx, 256, nullptr, nullptr, 0);
    ASSERT_TRUE(ipd && tpd && scq && cq_a && cq_b);
    xrcd = open_private_xrcd(tgt.ctx);
    ASSERT_NE(xrcd, nullptr) << strerror(errno);
    srq_a = create_xrc_srq(tgt.ctx, tpd, xrcd, cq_a);
    srq_b = create_xrc_srq(tgt.ctx, tpd, xrcd, cq_b);
    ASSERT_TRUE(srq_a && srq_b) << strerror(errno);
    EXPECT_NE(srq_num(srq_a), srq_num(srq_b));

    ibv_qp_init_attr_ex r{};
    r.qp_type = IBV_QPT_XRC_RECV;
    r.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    r.xrcd = xrcd;
    recv_qp = ibv_create_qp_ex(tgt.ctx, &r);
    ASSERT_NE(recv_qp, nullptr) << strerror(errno);

    ibv_qp_init_attr_ex s{};
    s.qp_type = IBV_QPT_XRC_SEND;
    s.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    s.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE;
    s.pd = ipd;
    s.send_cq = scq;
    s.cap.max_send_wr = kDepth;
    s.cap.max_send_sge = 2;
    send_qp = ibv_create_qp_ex(ini.ctx, &s);
    ASSERT_NE(send_qp, nullptr) << strerror(errno);

    const uint32_t spsn = random_psn(), rpsn = random_psn();
    // The target: the responder's attributes, and the ACK timeout at RTS.
    ASSERT_EQ(modify_to_init(recv_qp, kAllAccess), 0);
    ASSERT_EQ(modify_to_rtr(recv_qp, send_qp->qp_num, spsn, ini.gid, conn, tgt.attr), 0);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.sq_psn = rpsn;
    ASSERT_EQ(ibv_modify_qp(recv_qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN), 0);
    // The initiator: the requester's attributes (no responder resources, no RNR timer).
    ASSERT_EQ(modify_to_init(send_qp, 0), 0);
    ibv_qp_attr b{};
    b.qp_state = IBV_QPS_RTR;
    b.path_mtu = conn.path_mtu;
    b.dest_qp_num = recv_qp->qp_num;
    b.rq_psn = rpsn;
    b.ah_attr.is_global = 1;
    b.ah_attr.grh.dgid = tgt.gid;
    b.ah_attr.grh.sgid_index = sgid_index();
    b.ah_attr.grh.hop_limit = 64;
    b.ah_attr.port_num = kPort;
    ASSERT_EQ(ibv_modify_qp(send_qp, &b,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN),
              0);
    ASSERT_EQ(modify_to_rts(send_qp, spsn, conn, ini.attr), 0);
  }

  void TearDown() override {
    if (send_qp) {
      EXPECT_EQ(ibv_destroy_qp(send_qp), 0);
    }
    if (recv_qp) {
      EXPECT_EQ(ibv_destroy_qp(recv_qp), 0);
    }
    for (ibv_srq* s : {srq_a, srq_b})
      if (s) {
      EXPECT_EQ(ibv_destroy_srq(s), 0);
    }
    if (xrcd) {
      EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
    }
    for (ibv_cq* c : {scq, cq_a, cq_b})
      if (c) ibv_destroy_cq(c);
    if (ipd) ibv_dealloc_pd(ipd);
    if (tpd) ibv_dealloc_pd(tpd);
  }

  // Posts one WR on the XRC_SEND QP for the remote SRQ srqn.
  int post(SendWr& w, uint32_t srqn) {
    w.get()->qp_type.xrc.remote_srqn = srqn;
    return post_send(send_qp, w);
  }
};

TEST_F(Xrc, SendsLandInTheSrqTheyNameWithItsCq) {
  auto ibuf = std::make_unique<Buffer>(64 * 1024);
  auto tbuf = std::make_unique<Buffer>(64 * 1024);
  ASSERT_TRUE(ibuf->reg(ipd, kAllAccess) && tbuf->reg(tpd, kAllAccess));
  constexpr uint32_t kBig = 5000;  // five packets at MTU 1024: every one carries the XRCETH
  fill_pattern(ibuf->data, kBig, 1);
  fill_pattern(ibuf->data + 8192, 100, 2);
  fill_pattern(ibuf->data + 16384, 40, 3);
  ASSERT_EQ(post_srq(srq_a, 10, tbuf->sge(0, 8192)), 0);
  ASSERT_EQ(post_srq(srq_b, 20, tbuf->sge(16384, 4096)), 0);
  ASSERT_EQ(post_srq(srq_b, 21, tbuf->sge(24576, 4096)), 0);

  SendWr s1(1, IBV_WR_SEND, {ibuf->sge(0, kBig)});
  SendWr s2(2, IBV_WR_SEND, {ibuf->sge(8192, 100)});
  SendWr s3(3, IBV_WR_SEND_WITH_IMM, {ibuf->sge(16384, 40)});
  s3.imm(0xC0FFEE);
  ASSERT_EQ(post(s1, srq_num(srq_a)), 0);
  ASSERT_EQ(post(s2, srq_num(srq_b)), 0);
  ASSERT_EQ(post(s3, srq_num(srq_b)), 0);
  for (const ibv_wc& wc : poll_wcs(scq, 3)) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.opcode, IBV_WC_SEND);
    EXPECT_EQ(wc.qp_num, send_qp->qp_num);
  }
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(cq_a, &wc));
  expect_wc(wc, {10, IBV_WC_SUCCESS, IBV_WC_RECV, kBig, std::nullopt, true, recv_qp->qp_num});
  EXPECT_EQ(check_pattern(tbuf->data, kBig, 1), kBig);
  auto wcs = poll_wcs(cq_b, 2);
  ASSERT_EQ(wcs.size(), 2u);
  expect_wc(wcs[0], {20, IBV_WC_SUCCESS, IBV_WC_RECV, 100u, std::nullopt, true, recv_qp->qp_num});
  expect_wc(wcs[1], {21, IBV_WC_SUCCESS, IBV_WC_RECV, 40u, 0xC0FFEEu, false, recv_qp->qp_num});
  EXPECT_EQ(check_pattern(tbuf->data + 16384, 100, 2), 100u);
  EXPECT_EQ(check_pattern(tbuf->data + 24576, 40, 3), 40u);
  EXPECT_EQ(drain_cq(cq_a), 0) << "nothing went to the other SRQ's CQ";
}

TEST_F(Xrc, WriteReadAndAtomicsReachTheTargetMemory) {
  if (tgt.attr.atomic_cap == IBV_ATOMIC_NONE) GTEST_SKIP() << "no atomics";
  auto ibuf = std::make_unique<Buffer>(16384);
  auto tbuf = std::make_unique<Buffer>(16384);
  ASSERT_TRUE(ibuf->reg(ipd, kAllAccess) && tbuf->reg(tpd, kAllAccess));
  const uint32_t srqn = srq_num(srq_a);
  fill_pattern(ibuf->data, 3000, 7);
  fill_pattern(tbuf->data + 8192, 2500, 8);
  tbuf->u64(12288) = 40;
  tbuf->u64(12296) = 5;

  SendWr w(1, IBV_WR_RDMA_WRITE, {ibuf->sge(0, 3000)});
  w.rdma(tbuf->addr(0), tbuf->rkey());
  SendWr r(2, IBV_WR_RDMA_READ, {ibuf->sge(4096, 2500)});
  r.rdma(tbuf->addr(8192), tbuf->rkey());
  SendWr fa(3, IBV_WR_ATOMIC_FETCH_AND_ADD, {ibuf->sge(8192, 8)});
  fa.fetch_add(tbuf->addr(12288), tbuf->rkey(), 2);
  SendWr cs(4, IBV_WR_ATOMIC_CMP_AND_SWP, {ibuf->sge(8200, 8)});
  cs.cmp_swp(tbuf->addr(12296), tbuf->rkey(), 5, 77);
  // WRITE with immediate takes a receive WQE of the SRQ it names.
  ASSERT_EQ(post_srq(srq_b, 30, tbuf->sge(0, 0)), 0);
  SendWr wi(5, IBV_WR_RDMA_WRITE_WITH_IMM, {ibuf->sge(0, 16)});
  wi.rdma(tbuf->addr(4096), tbuf->rkey()).imm(0x1234);
  ASSERT_EQ(post(w, srqn), 0);
  ASSERT_EQ(post(r, srqn), 0);
  ASSERT_EQ(post(fa, srqn), 0);
  ASSERT_EQ(post(cs, srqn), 0);
  ASSERT_EQ(post(wi, srq_num(srq_b)), 0);
  auto wcs = poll_wcs(scq, 5);
  ASSERT_EQ(wcs.size(), 5u);
  const ibv_wc_opcode ops[] = {IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD, IBV_WC_COMP_SWAP,
                               IBV_WC_RDMA_WRITE};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(wcs[i].wr_id, i + 1);
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS) << ibv_wc_status_str(wcs[i].status);
    EXPECT_EQ(wcs[i].opcode, ops[i]);
  }
  EXPECT_EQ(check_pattern(tbuf->data, 3000, 7), 3000u);
  EXPECT_EQ(check_pattern(ibuf->data + 4096, 2500, 8), 2500u);
  EXPECT_EQ(ibuf->u64(8192), 40u);
  EXPECT_EQ(tbuf->u64(12288), 42u);
  EXPECT_EQ(ibuf->u64(8200), 5u);
  EXPECT_EQ(tbuf->u64(12296), 77u);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(cq_b, &wc));
  expect_wc(wc, {30, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, 16u, 0x1234u, false, recv_qp->qp_num});
  EXPECT_EQ(check_pattern(tbuf->data + 4096, 16, 7), 16u);
}

// No XRC opcode carries RDMA ATOMIC WRITE (an RC operation, IBTA 1.5): refused at post time.
TEST_F(Xrc, AtomicWriteIsRefused) {
  auto ibuf = std::make_unique<Buffer>(4096);
  auto tbuf = std::make_unique<Buffer>(4096);
  ASSERT_TRUE(ibuf->reg(ipd, kAllAccess) && tbuf->reg(tpd, kAllAccess));
  SendWr w(1, IBV_WR_ATOMIC_WRITE, {ibuf->sge(0, 8)});
  w.rdma(tbuf->addr(0), tbuf->rkey());
  EXPECT_EQ(post(w, srq_num(srq_a)), EINVAL);
  EXPECT_EQ(drain_cq(scq), 0);
}

TEST_F(Xrc, WrApiNamesTheSrqWithSetXrcSrqn) {
  auto ibuf = std::make_unique<Buffer>(4096);
  auto tbuf = std::make_unique<Buffer>(4096);
  ASSERT_TRUE(ibuf->reg(ipd, kAllAccess) && tbuf->reg(tpd, kAllAccess));
  fill_pattern(ibuf->data, 64, 9);
  ASSERT_EQ(post_srq(srq_b, 40, tbuf->sge(0, 4096)), 0);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(send_qp);
  ibv_wr_start(x);
  x->wr_id = 7;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send_imm(x, htonl(99));
  ibv_wr_set_sge(x, ibuf->lkey(), ibuf->addr(), 64);
  ibv_wr_set_xrc_srqn(x, srq_num(srq_b));
  ASSERT_EQ(ibv_wr_complete(x), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(scq, &wc));
  expect_wc(wc, {7, IBV_WC_SUCCESS, IBV_WC_SEND});
  ASSERT_TRUE(poll_wc(cq_b, &wc));
  expect_wc(wc, {40, IBV_WC_SUCCESS, IBV_WC_RECV, 64u, 99u, false, recv_qp->qp_num});
  EXPECT_EQ(check_pattern(tbuf->data, 64, 9), 64u);
}

// An XRCETH that names no XRC SRQ of the target's domain: NAK invalid request (IBTA 10.2.10), the
// initiator's WQE completes in REM_INV_REQ_ERR and both QPs go to the error state.
void expect_refused(Xrc& t, ibv_qp* send_qp, ibv_cq* scq, ibv_pd* ipd, uint32_t srqn, ibv_qp* recv_qp) {
  auto ibuf = std::make_unique<Buffer>(4096);
  ASSERT_TRUE(ibuf->reg(ipd, kAllAccess));
  SendWr s(1, IBV_WR_SEND, {ibuf->sge(0, 32)});
  s.get()->qp_type.xrc.remote_srqn = srqn;
  ASSERT_EQ(post_send(send_qp, s), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(scq, &wc));
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_TRUE(wait_qp_state(send_qp, IBV_QPS_ERR));
  EXPECT_TRUE(wait_qp_state(recv_qp, IBV_QPS_ERR));
  (void)t;
}

TEST_F(Xrc, UnknownSrqNumberIsRemoteInvalidRequest) {
  ASSERT_EQ(post_srq(srq_a, 1, ibv_sge{0, 0, 0}), 0);
  const uint32_t unused = (srq_num(srq_a) ^ srq_num(srq_b)) | 0x800000;
  expect_refused(*this, send_qp, scq, ipd, unused, recv_qp);
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(cq_a, 1, &wc), 0) << "no SRQ WQE was consumed";
}

TEST_F(Xrc, SrqOfAnotherDomainIsRemoteInvalidRequest) {
  ibv_xrcd* other = open_private_xrcd(tgt.ctx);
  ASSERT_NE(other, nullptr);
  ibv_srq* foreign = create_xrc_srq(tgt.ctx, tpd, other, cq_a);
  ASSERT_NE(foreign, nullptr);
  auto tbuf = std::make_unique<Buffer>(4096);
  ASSERT_TRUE(tbuf->reg(tpd, kAllAccess));
  ASSERT_EQ(post_srq(foreign, 5, tbuf->sge(0, 4096)), 0);
  expect_refused(*this, send_qp, scq, ipd, srq_num(foreign), recv_qp);
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(cq_a, 1, &wc), 0) << "the foreign SRQ's WQE stays";
  tbuf.reset();
  EXPECT_EQ(ibv_destroy_srq(foreign), 0);
  EXPECT_EQ(ibv_close_xrcd(other), 0);
}

TEST_F(Xrc, BasicSrqNumberIsRemoteInvalidRequest) {
  ibv_srq_init_attr ia{};
  ia.attr.max_wr = 4;
  ia.attr.max_sge = 1;
  ibv_srq* basic = ibv_create_srq(tpd, &ia);
  ASSERT_NE(basic, nullptr);
  expect_refused(*this, send_qp, scq, ipd, srq_num(basic), recv_qp);
  EXPECT_EQ(ibv_destroy_srq(basic), 0);
}

TEST_F(Xrc, ObjectRulesAndErrors) {
  // A domain in use cannot be closed; a CQ that an XRC SRQ completes into cannot be destroyed.
  EXPECT_EQ(ibv_close_xrcd(xrcd), EBUSY);
  EXPECT_EQ(ibv_destroy_cq(cq_a), EBUSY);
  // The target has neither send nor receive queue; the initiator no receive queue.
  auto tbuf = std::make_unique<Buffer>(4096);
  ASSERT_TRUE(tbuf->reg(tpd, kAllAccess));
  SendWr s(1, IBV_WR_SEND, {tbuf->sge(0, 8)});
  EXPECT_EQ(post_send(recv_qp, s), EINVAL);
  EXPECT_EQ(post_recv(recv_qp, 1, {tbuf->sge(0, 8)}), EINVAL);
  EXPECT_EQ(post_recv(send_qp, 1, {tbuf->sge(0, 8)}), EINVAL);
  // An XRC_RECV QP needs its domain; an XRC SRQ its domain and CQ.
  ibv_qp_init_attr_ex r{};
  r.qp_type = IBV_QPT_XRC_RECV;
  r.comp_mask = IBV_QP_INIT_ATTR_PD;
  r.pd = tpd;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(tgt.ctx, &r), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_srq_init_attr_ex a{};
  a.attr.max_wr = 4;
  a.attr.max_sge = 1;
  a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD;
  a.srq_type = IBV_SRQT_XRC;
  a.pd = tpd;
  a.xrcd = xrcd;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(tgt.ctx, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // XRC_RECV goes INIT -> RTR with the responder's attributes only (no SQE either way).
  ibv_qp_attr q{};
  q.qp_state = IBV_QPS_SQE;
  EXPECT_EQ(ibv_modify_qp(recv_qp, &q, IBV_QP_STATE), EINVAL);
}

// ibv_open_qp(3): another handle on the target QP; the QP lives while any handle does.
TEST_F(Xrc, OpenQpSharesTheTargetUntilItsLastHandle) {
  ibv_qp_open_attr oa{};
  oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  oa.qp_num = recv_qp->qp_num;
  oa.xrcd = xrcd;
  oa.qp_type = IBV_QPT_XRC_RECV;
  ibv_qp* h = ibv_open_qp(tgt.ctx, &oa);
  ASSERT_NE(h, nullptr) << strerror(errno);
  EXPECT_EQ(h->qp_num, recv_qp->qp_num);
  EXPECT_EQ(h->qp_type, IBV_QPT_XRC_RECV);
  // Not in another domain, not under another number.
  ibv_xrcd* other = open_private_xrcd(tgt.ctx);
  ASSERT_NE(other, nullptr);
  oa.xrcd = other;
  errno = 0;
  EXPECT_EQ(ibv_open_qp(tgt.ctx, &oa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_close_xrcd(other), 0);
  oa.xrcd = xrcd;
  oa.qp_num = send_qp->qp_num;
  EXPECT_EQ(ibv_open_qp(tgt.ctx, &oa), nullptr);
  // The creator's handle goes; the QP stays, reached through the opened one.
  EXPECT_EQ(ibv_destroy_qp(recv_qp), 0);
  recv_qp = h;
  EXPECT_EQ(qp_state(h), IBV_QPS_RTS);
  auto ibuf = std::make_unique<Buffer>(4096);
  auto tbuf = std::make_unique<Buffer>(4096);
  ASSERT_TRUE(ibuf->reg(ipd, kAllAccess) && tbuf->reg(tpd, kAllAccess));
  fill_pattern(ibuf->data, 128, 11);
  ASSERT_EQ(post_srq(srq_a, 50, tbuf->sge(0, 4096)), 0);
  SendWr s(1, IBV_WR_SEND, {ibuf->sge(0, 128)});
  ASSERT_EQ(post(s, srq_num(srq_a)), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(scq, &wc));
  expect_wc(wc, {1, IBV_WC_SUCCESS, IBV_WC_SEND});
  ASSERT_TRUE(poll_wc(cq_a, &wc));
  expect_wc(wc, {50, IBV_WC_SUCCESS, IBV_WC_RECV, 128u, std::nullopt, true, h->qp_num});
  EXPECT_EQ(check_pattern(tbuf->data, 128, 11), 128u);
  EXPECT_EQ(ibv_close_xrcd(xrcd), EBUSY) << "the opened handle still uses the domain";
}

// ---- Domains shared by file (O_CREAT / O_EXCL), across two processes ----

std::string xrcd_file() {
  const char* dir = getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/softrdma-xrcd-test-" + std::to_string(getpid());
}

ibv_xrcd* open_file_xrcd(ibv_context* ctx, const std::string& path, int oflags) {
  int fd = open(path.c_str(), O_RDONLY | O_CREAT, 0600);
  if (fd < 0) return nullptr;
  ibv_xrcd_init_attr a{};
  a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  a.fd = fd;
  a.oflags = oflags;
  ibv_xrcd* x = ibv_open_xrcd(ctx, &a);
  const int saved = errno;
  close(fd);  // the domain outlives the descriptor it was opened with
  errno = saved;
  return x;
}

// The other process: opens the domain the parent created, checks O_EXCL, then, once the parent has
// closed its own, finds none left.
int file_peer(int sock) {
  char path[256] = {};
  if (!read_full(sock, path, sizeof path)) return 10;
  Device dev;
  if (!dev.ok()) return 11;
  ibv_xrcd* shared = open_file_xrcd(dev.ctx, path, 0);  // exists: no O_CREAT needed
  if (!shared) return 12;
  if (open_file_xrcd(dev.ctx, path, O_CREAT | O_EXCL)) return 13;
  if (errno != EINVAL) return 14;
  if (ibv_close_xrcd(shared)) return 15;
  const char done = 'c';
  if (!write_full(sock, &done, 1)) return 16;
  char next = 0;
  if (!read_full(sock, &next, 1) || next != 'p') return 17;
  // The parent closed the last handle: no domain on the file any more.
  errno = 0;
  if (open_file_xrcd(dev.ctx, path, 0) || errno != EAGAIN) return 18;
  ibv_xrcd* fresh = open_file_xrcd(dev.ctx, path, O_CREAT | O_EXCL);
  if (!fresh) return 19;
  if (ibv_close_xrcd(fresh)) return 20;
  return 0;
}

TEST(XrcDomain, SharedByFileAcrossProcesses) {
  int sock = -1;
  pid_t pid = fork_target(file_peer, &sock);
  ASSERT_GT(pid, 0);
  const std::string path = xrcd_file();
  Device dev;
  ASSERT_TRUE(dev.ok());
  errno = 0;
  ibv_xrcd* x = open_file_xrcd(dev.ctx, path, 0);
  EXPECT_EQ(x, nullptr) << "no domain on a new file without O_CREAT";
  EXPECT_EQ(errno, EAGAIN);
  x = open_file_xrcd(dev.ctx, path, O_CREAT);
  ASSERT_NE(x, nullptr) << strerror(errno);
  // In this process too: the same file is the same domain, and O_EXCL refuses it.
  ibv_xrcd* again = open_file_xrcd(dev.ctx, path, 0);
  EXPECT_NE(again, nullptr);
  errno = 0;
  EXPECT_EQ(open_file_xrcd(dev.ctx, path, O_CREAT | O_EXCL), nullptr);
  EXPECT_EQ(errno, EINVAL);
  char buf[256] = {};
  std::snprintf(buf, sizeof buf, "%s", path.c_str());
  ASSERT_TRUE(write_full(sock, buf, sizeof buf));
  char c = 0;
  ASSERT_TRUE(read_full(sock, &c, 1));
  EXPECT_EQ(c, 'c');
  if (again) {
      EXPECT_EQ(ibv_close_xrcd(again), 0);
    }
  EXPECT_EQ(ibv_close_xrcd(x), 0);
  const char p = 'p';
  ASSERT_TRUE(write_full(sock, &p, 1));
  int st = 0;
  ASSERT_TRUE(reap_within(pid, kWaitSeconds, &st));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "peer failed at step " << WEXITSTATUS(st);
  close(sock);
  unlink(path.c_str());
}

}  // namespace
}  // namespace softrdma::verbs_test
