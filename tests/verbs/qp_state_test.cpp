// The RC QP state machine: legal/illegal transitions, required attribute masks,
// ibv_query_qp, posting in the wrong state, creation limits.
#include "helpers.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace softrdma::verbs_test {
namespace {

class QpStateBase : public RcPair {
 protected:
  ibv_qp_attr init_attr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = kPort;
    a.qp_access_flags = kAllAccess;
    return a;
  }
  static constexpr int kInitMask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  ibv_qp_attr rtr_attr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = b.qpn();
    a.rq_psn = 1;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = dev.gid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.sgid_index = sgid_index();
    a.ah_attr.port_num = kPort;
    return a;
  }
  static constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  ibv_qp_attr rts_attr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 2;
    a.max_rd_atomic = 1;
    return a;
  }
  static constexpr int kRtsMask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  int modify(ibv_qp_attr a, int mask) { return ibv_modify_qp(this->a.qp, &a, mask); }
};
using QpState = OverPaths<QpStateBase>;

TEST_P(QpState, IllegalTransitionsAndMasksReturnEinval) {
  ASSERT_TRUE(a.create(dev, qcfg));
  ASSERT_TRUE(b.create(dev, qcfg));
  EXPECT_EQ(qp_state(a.qp), IBV_QPS_RESET);
  // RESET can only go to INIT (or RESET/ERR).
  EXPECT_EQ(modify(rtr_attr(), kRtrMask), EINVAL);
  EXPECT_EQ(modify(rts_attr(), kRtsMask), EINVAL);
  // RESET -> INIT: missing required attributes, or one that belongs to another transition.
  EXPECT_EQ(modify(init_attr(), kInitMask & ~IBV_QP_PORT), EINVAL);
  EXPECT_EQ(modify(init_attr(), kInitMask & ~IBV_QP_ACCESS_FLAGS), EINVAL);
  EXPECT_EQ(modify(init_attr(), kInitMask & ~IBV_QP_PKEY_INDEX), EINVAL);
  EXPECT_EQ(modify(init_attr(), kInitMask | IBV_QP_SQ_PSN), EINVAL);
  // Attribute values out of range.
  ibv_qp_attr bad = init_attr();
  bad.port_num = dev.attr.phys_port_cnt + 1;
  EXPECT_EQ(modify(bad, kInitMask), EINVAL) << "nonexistent port";
  bad = init_attr();
  bad.port_num = 0;
  EXPECT_EQ(modify(bad, kInitMask), EINVAL) << "port 0";
  bad = init_attr();
  bad.pkey_index = static_cast<uint16_t>(dev.port.pkey_tbl_len);
  EXPECT_EQ(modify(bad, kInitMask), EINVAL) << "pkey_index past the table";
  EXPECT_EQ(qp_state(a.qp), IBV_QPS_RESET) << "a failed modify must not change the state";

  ASSERT_EQ(modify(init_attr(), kInitMask), 0);
  EXPECT_EQ(qp_state(a.qp), IBV_QPS_INIT);
  EXPECT_EQ(modify(rts_attr(), kRtsMask), EINVAL) << "INIT -> RTS";
  // INIT -> RTR with each required attribute missing.
  for (int missing : {IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, IBV_QP_RQ_PSN, IBV_QP_MAX_DEST_RD_ATOMIC,
                      IBV_QP_MIN_RNR_TIMER}) {
    EXPECT_EQ(modify(rtr_attr(), kRtrMask & ~missing), EINVAL) << "RTR without mask bit " << missing;
  }
  EXPECT_EQ(modify(rtr_attr(), kRtrMask | IBV_QP_SQ_PSN), EINVAL) << "SQ_PSN is not an RTR attribute";
  bad = rtr_attr();
  bad.path_mtu = static_cast<ibv_mtu>(7);
  EXPECT_EQ(modify(bad, kRtrMask), EINVAL) << "invalid path_mtu";
  bad = rtr_attr();
  bad.max_dest_rd_atomic = static_cast<uint8_t>(std::min(dev.attr.max_qp_rd_atom + 1, 255));
  if (dev.attr.max_qp_rd_atom < 255) {
    EXPECT_EQ(modify(bad, kRtrMask), EINVAL) << "max_dest_rd_atomic above the device's max_qp_rd_atom";
  }
  EXPECT_EQ(qp_state(a.qp), IBV_QPS_INIT);

  ASSERT_EQ(modify(rtr_attr(), kRtrMask), 0);
  EXPECT_EQ(qp_state(a.qp), IBV_QPS_RTR);
  for (int missing : {IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_SQ_PSN, IBV_QP_MAX_QP_RD_ATOMIC}) {
    EXPECT_EQ(modify(rts_attr(), kRtsMask & ~missing), EINVAL) << "RTS without mask bit " << missing;
  }
  bad = rts_attr();
  bad.max_rd_atomic = static_cast<uint8_t>(std::min(dev.attr.max_qp_init_rd_atom + 1, 255));
  if (dev.attr.max_qp_init_rd_atom < 255) {
    EXPECT_EQ(modify(bad, kRtsMask), EINVAL) << "max_rd_atomic above max_qp_init_rd_atom";
  }
  EXPECT_EQ(modify(init_attr(), kInitMask), EINVAL) << "RTR -> INIT";
  EXPECT_EQ(qp_state(a.qp), IBV_QPS_RTR);

  ASSERT_EQ(modify(rts_attr(), kRtsMask), 0);
  EXPECT_EQ(qp_state(a.qp), IBV_QPS_RTS);
  EXPECT_EQ(modify(rtr_attr(), kRtrMask), EINVAL) << "RTS -> RTR";
  EXPECT_EQ(modify(init_attr(), kInitMask), EINVAL) << "RTS -> INIT";
  // RTS -> RTS with no attribute is legal.
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  EXPECT_EQ(modify(rts, IBV_QP_STATE), 0);
  // Any state -> ERR and -> RESET.
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(modify(err, IBV_QP_STATE), 0);
  EXPECT_EQ(qp_state(a.qp), IBV_QPS_ERR);
  EXPECT_EQ(modify(rts_attr(), kRtsMask), EINVAL) << "ERR -> RTS";
  ibv_qp_attr reset{};
  reset.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(modify(reset, IBV_QP_STATE), 0);
  EXPECT_EQ(qp_state(a.qp), IBV_QPS_RESET);
  ASSERT_EQ(modify(init_attr(), kInitMask), 0);
  ASSERT_EQ(modify(reset, IBV_QP_STATE), 0) << "INIT -> RESET";
  ASSERT_EQ(modify(err, IBV_QP_STATE), 0) << "RESET -> ERR";
}

TEST_P(QpState, QueryReturnsWhatWasSet) {
  conn.path_mtu = IBV_MTU_2048;
  conn.timeout = 13;
  conn.retry_cnt = 5;
  conn.rnr_retry = 6;
  conn.min_rnr_timer = 9;
  conn.max_rd_atomic = 1;
  conn.max_dest_rd_atomic = 1;
  conn.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  qcfg.sq_sig_all = true;
  ASSERT_TRUE(connect());
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  const int mask = IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_SQ_PSN |
                   IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MIN_RNR_TIMER |
                   IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ACCESS_FLAGS | IBV_QP_AV |
                   IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_CAP;
  ASSERT_EQ(ibv_query_qp(a.qp, &q, mask, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(q.path_mtu, IBV_MTU_2048);
  EXPECT_EQ(q.dest_qp_num, b.qpn());
  EXPECT_EQ(q.rq_psn, b.psn);
  EXPECT_EQ(q.sq_psn, a.psn);
  EXPECT_EQ(q.timeout, 13);
  EXPECT_EQ(q.retry_cnt, 5);
  EXPECT_EQ(q.rnr_retry, 6);
  EXPECT_EQ(q.min_rnr_timer, 9);
  EXPECT_EQ(q.max_rd_atomic, 1);
  EXPECT_EQ(q.max_dest_rd_atomic, 1);
  EXPECT_EQ(q.qp_access_flags, conn.access);
  EXPECT_EQ(q.port_num, kPort);
  EXPECT_EQ(q.pkey_index, 0);
  EXPECT_EQ(q.ah_attr.is_global, 1);
  EXPECT_TRUE(gid_equal(q.ah_attr.grh.dgid, dev.gid)) << gid_str(q.ah_attr.grh.dgid);
  EXPECT_EQ(q.ah_attr.grh.sgid_index, sgid_index());
  EXPECT_EQ(q.ah_attr.grh.hop_limit, 64);
  EXPECT_EQ(q.ah_attr.port_num, kPort);
  EXPECT_EQ(q.cap.max_send_wr, a.cap.max_send_wr);
  EXPECT_EQ(q.cap.max_recv_wr, a.cap.max_recv_wr);
  EXPECT_EQ(q.cap.max_send_sge, a.cap.max_send_sge);
  EXPECT_EQ(q.cap.max_recv_sge, a.cap.max_recv_sge);
  EXPECT_EQ(q.cap.max_inline_data, a.cap.max_inline_data);
  EXPECT_EQ(qi.qp_type, IBV_QPT_RC);
  EXPECT_EQ(qi.send_cq, a.scq);
  EXPECT_EQ(qi.recv_cq, a.rcq);
  EXPECT_EQ(qi.sq_sig_all, 1);
  EXPECT_EQ(qi.cap.max_send_wr, a.cap.max_send_wr);
  EXPECT_EQ(qi.cap.max_recv_sge, a.cap.max_recv_sge);
  // And the other side mirrors it.
  ASSERT_EQ(ibv_query_qp(b.qp, &q, mask, &qi), 0);
  EXPECT_EQ(q.dest_qp_num, a.qpn());
  EXPECT_EQ(q.rq_psn, a.psn);
  EXPECT_EQ(q.sq_psn, b.psn);
}

TEST_P(QpState, PostInWrongStateFails) {
  ASSERT_TRUE(a.create(dev, qcfg));
  ASSERT_TRUE(b.create(dev, qcfg));
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  auto try_send = [&](uint64_t id) {
    SendWr w(id, IBV_WR_RDMA_WRITE, {src->sge(0, 64)});
    w.rdma(dst->addr(), dst->rkey());
    return post_send(a.qp, w);
  };
  EXPECT_NE(try_send(1), 0) << "post_send in RESET";
  EXPECT_NE(post_recv(a.qp, 2, {src->sge(0, 64)}), 0) << "post_recv in RESET";
  ASSERT_EQ(modify_to_init(a.qp, kAllAccess), 0);
  EXPECT_NE(try_send(3), 0) << "post_send in INIT";
  EXPECT_EQ(post_recv(a.qp, 4, {src->sge(0, 64)}), 0) << "post_recv is allowed in INIT";
  ASSERT_EQ(modify_to_rtr(a.qp, b.qpn(), b.psn, dev.gid, conn, dev.attr), 0);
  EXPECT_NE(try_send(5), 0) << "post_send in RTR";
  ASSERT_EQ(modify_to_rts(a.qp, a.psn, conn, dev.attr), 0);
  ASSERT_EQ(bring_up(b.qp, b.psn, a.qpn(), a.psn, dev.gid, conn, dev.attr), 0);
  // The refused WRs left nothing behind: one WRITE, one completion.
  ASSERT_EQ(try_send(6), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 6, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  EXPECT_EQ(drain_cq(a.scq), 0);
  // The receive posted in INIT is live: a SEND lands in it.
  SendWr s(7, IBV_WR_SEND, {dst->sge(0, 64)});
  fill_pattern(dst->data, 64, 91);
  ASSERT_EQ(post_send(b.qp, s), 0);
  ASSERT_TRUE(poll_wc(a.rcq, &wc));
  expect_wc(wc, {.wr_id = 4, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = a.qpn()});
  EXPECT_EQ(check_pattern(src->data, 64, 91), 64u);
}

// ERR -> RESET -> reconnect with fresh PSNs: the QP is fully usable again.
TEST_P(QpState, RecoverThroughReset) {
  ASSERT_TRUE(connect());
  ibv_qp_attr s{};
  s.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(a.qp, &s, IBV_QP_STATE), 0);
  ASSERT_EQ(ibv_modify_qp(b.qp, &s, IBV_QP_STATE), 0);
  s.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(a.qp, &s, IBV_QP_STATE), 0);
  ASSERT_EQ(ibv_modify_qp(b.qp, &s, IBV_QP_STATE), 0);
  drain_cq(a.scq);
  drain_cq(b.rcq);
  a.psn = random_psn();
  b.psn = random_psn();
  ASSERT_EQ(bring_up(a.qp, a.psn, b.qpn(), b.psn, dev.gid, conn, dev.attr), 0);
  ASSERT_EQ(bring_up(b.qp, b.psn, a.qpn(), a.psn, dev.gid, conn, dev.attr), 0);
  VT_BUF(src, a, 1000);
  VT_BUF(dst, b, 1000);
  fill_pattern(src->data, 1000, 92);
  ASSERT_EQ(post_recv(b.qp, 1, {dst->sge(0, 1000)}), 0);
  SendWr w(2, IBV_WR_SEND, {src->sge(0, 1000)});
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 2, .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 1, .opcode = IBV_WC_RECV, .byte_len = 1000, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(dst->data, 1000, 92), 1000u);
}

TEST_P(QpState, CreateBeyondDeviceLimitsFails) {
  ASSERT_TRUE(a.create(dev, qcfg));  // for PD and CQs
  auto try_create = [&](ibv_qp_cap cap) {
    ibv_qp_init_attr ia{};
    ia.send_cq = a.scq;
    ia.recv_cq = a.rcq;
    ia.cap = cap;
    ia.qp_type = IBV_QPT_RC;
    ibv_qp* qp = ibv_create_qp(a.pd, &ia);
    if (qp) ibv_destroy_qp(qp);
    return qp != nullptr;
  };
  const ibv_qp_cap ok{16, 16, 1, 1, 0};
  EXPECT_TRUE(try_create(ok));
  ibv_qp_cap c = ok;
  c.max_send_wr = dev.attr.max_qp_wr + 1;
  EXPECT_FALSE(try_create(c)) << "max_send_wr above max_qp_wr";
  c = ok;
  c.max_recv_wr = dev.attr.max_qp_wr + 1;
  EXPECT_FALSE(try_create(c)) << "max_recv_wr above max_qp_wr";
  c = ok;
  c.max_send_sge = dev.attr.max_sge + 1;
  EXPECT_FALSE(try_create(c)) << "max_send_sge above max_sge";
  c = ok;
  c.max_recv_sge = dev.attr.max_sge + 1;
  EXPECT_FALSE(try_create(c)) << "max_recv_sge above max_sge";
  c = ok;
  c.max_inline_data = 1u << 30;
  EXPECT_FALSE(try_create(c)) << "1 GiB of inline data";
}

// Off iWARP: RTR and RTS come from its connection only, with no PSNs or IB path (docs/iwarp.md).
VT_INSTANTIATE_PATHS(QpState, VT_ROCE_PATHS);

}  // namespace
}  // namespace softrdma::verbs_test
