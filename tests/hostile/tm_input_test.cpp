// Tag-matching SRQs fed messages whose TMH they cannot act on: too short for a TMH, an opcode that does
// not exist, a rendezvous request too short for its RVH. Each is an ordinary receive into an SRQ WQE,
// counted in tm_no_header, and the QP and its matching list go on working.
#include <infiniband/tm_types.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "hostile.h"

namespace softrdma::hostile_test {
namespace {

TEST(TmHostile, MessagesWithoutAUsableTmhAreOrdinaryReceives) {
  Device dev;
  if (!dev.ok()) GTEST_SKIP() << "no loopback device";
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  ibv_cq* scq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ibv_cq* ccq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ASSERT_TRUE(scq && ccq);
  ibv_srq_init_attr_ex sa{};
  sa.attr.max_wr = 16;
  sa.attr.max_sge = 1;
  sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
  sa.srq_type = IBV_SRQT_TM;
  sa.pd = pd;
  sa.cq = scq;
  sa.tm_cap.max_num_tags = 8;
  sa.tm_cap.max_ops = 8;
  ibv_srq* srq = ibv_create_srq_ex(dev.ctx, &sa);
  ASSERT_NE(srq, nullptr) << strerror(errno);
  auto sbuf_owner = std::make_unique<Buffer>(64 * 1024), cbuf_owner = std::make_unique<Buffer>(64 * 1024);
  Buffer& sbuf = *sbuf_owner;
  Buffer& cbuf = *cbuf_owner;
  ASSERT_TRUE(sbuf.reg(pd, kAllAccess) && cbuf.reg(pd, kAllAccess));
  auto make_qp = [&](ibv_srq* s, ibv_cq* cq) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.srq = s;
    ia.cap.max_send_wr = 8;
    ia.cap.max_recv_wr = s ? 0 : 8;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = s ? 0 : 1;
    ia.qp_type = IBV_QPT_RC;
    return ibv_create_qp(pd, &ia);
  };
  ibv_qp* server = make_qp(srq, scq);
  ibv_qp* client = make_qp(nullptr, ccq);
  ASSERT_TRUE(server && client);
  ConnConfig conn;
  uint32_t spsn = random_psn(), cpsn = random_psn();
  ASSERT_EQ(bring_up(server, spsn, client->qp_num, cpsn, dev.gid, conn, dev.attr), 0);
  ASSERT_EQ(bring_up(client, cpsn, server->qp_num, spsn, dev.gid, conn, dev.attr), 0);

  for (uint64_t i = 0; i < 3; ++i) {
    ibv_sge sge = sbuf.sge(i * 4096, 4096);
    ibv_recv_wr wr{};
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
  }
  ibv_sge tagged = sbuf.sge(16384, 4096);
  ibv_ops_wr add{};
  add.wr_id = 100;
  add.opcode = IBV_WR_TAG_ADD;
  add.flags = IBV_OPS_SIGNALED;
  add.tm.add.recv_wr_id = 55;
  add.tm.add.sg_list = &tagged;
  add.tm.add.num_sge = 1;
  add.tm.add.tag = 5;
  add.tm.add.mask = ~0ull;
  ibv_ops_wr* bad_op = nullptr;
  ASSERT_EQ(ibv_post_srq_ops(srq, &add, &bad_op), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(scq, &wc));
  EXPECT_EQ(wc.opcode, IBV_WC_TM_ADD);

  auto before = read_stats(server->qp_num);
  ASSERT_TRUE(before);
  // A 4-byte message, a TMH with opcode 9, a rendezvous header cut short after 20 bytes (tag 5 matches).
  struct Case {
    uint32_t len;
    uint8_t op;
  } cases[] = {{4, IBV_TMH_EAGER}, {16, 9}, {20, IBV_TMH_RNDV}};
  for (uint64_t i = 0; i < 3; ++i) {
    fill_pattern(cbuf.data, 64, static_cast<uint32_t>(i));
    cbuf.data[0] = cases[i].op;
    if (cases[i].len >= 16) {
      std::memset(cbuf.data + 8, 0, 7);  // tag 5
      cbuf.data[15] = 5;
    }
    SendWr w(i, IBV_WR_SEND, {cbuf.sge(0, cases[i].len)});
    ASSERT_EQ(post_send(client, w), 0);
    ASSERT_TRUE(poll_wc(ccq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    ASSERT_TRUE(poll_wc(scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, i);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV);
    EXPECT_EQ(wc.byte_len, cases[i].len);
    EXPECT_EQ(wc.wc_flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), 0u);
    EXPECT_EQ(std::memcmp(sbuf.data + i * 4096, cbuf.data, cases[i].len), 0);
  }
  auto after = read_stats(server->qp_num);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->qp.tm_no_header - before->qp.tm_no_header, 3u);
  EXPECT_EQ(after->qp.tm_expected - before->qp.tm_expected, 0u);

  // The tag was not consumed: an eager message for it still matches.
  std::memset(cbuf.data, 0, 16);
  cbuf.data[0] = IBV_TMH_EAGER;
  cbuf.data[15] = 5;
  fill_pattern(cbuf.data + 16, 100, 9);
  SendWr w(9, IBV_WR_SEND, {cbuf.sge(0, 116)});
  ASSERT_EQ(post_send(client, w), 0);
  ASSERT_TRUE(poll_wc(ccq, &wc));
  ASSERT_TRUE(poll_wc(scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 55u);
  EXPECT_EQ(wc.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(wc.byte_len, 100u);
  EXPECT_EQ(wc.wc_flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(check_pattern(sbuf.data + 16384, 100, 9), 100u);

  EXPECT_EQ(ibv_destroy_qp(server), 0);
  EXPECT_EQ(ibv_destroy_qp(client), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  sbuf_owner.reset();
  cbuf_owner.reset();
  EXPECT_EQ(ibv_destroy_cq(scq), 0);
  EXPECT_EQ(ibv_destroy_cq(ccq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

}  // namespace
}  // namespace softrdma::hostile_test
