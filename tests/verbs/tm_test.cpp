// Tag-matching SRQs (ibv_create_srq_ex(3) "Tag matching", ibv_post_srq_ops(3), ibv_wc_read_tm_info):
// tagged buffers matched by the TMH of arriving SENDs (expected eager messages, in posting order and
// under the mask), unexpected and no-tag messages in ordinary SRQ WQEs, the phase synchronisation after
// an unexpected message, rendezvous (the device READs the sender's data and answers with a FIN), DEL
// and SYNC, and the errors of bad list operations. Only the public verbs API: these run unchanged on
// an RDMA NIC with tag matching (ConnectX-5 and later).
#include <infiniband/tm_types.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "helpers.h"

namespace softrdma::verbs_test {
namespace {

constexpr size_t kBuf = 64 * 1024;
constexpr uint32_t kTmh = sizeof(ibv_tmh);

struct TmWc {
  uint64_t wr_id = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;
  ibv_wc_opcode opcode = IBV_WC_SEND;
  unsigned flags = 0;
  uint32_t byte_len = 0;
  ibv_wc_tm_info tm{};
};

void put_be(uint8_t* p, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; --i, v >>= 8) p[i] = static_cast<uint8_t>(v);
}
uint64_t get_be(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = v << 8 | p[i];
  return v;
}

// A server QP on a tag-matching SRQ whose completions (list operations, receives, its sends) go to one
// extended CQ with TM info, and a client QP with its own receive queue, connected on the loopback device.
class TagMatching : public ::testing::Test {
 protected:
  Device dev;
  ibv_device_attr_ex attrx{};
  ibv_pd* pd = nullptr;
  ibv_cq_ex* scq = nullptr;
  ibv_cq* ccq = nullptr;
  ibv_srq* srq = nullptr;
  ibv_qp* server = nullptr;
  ibv_qp* client = nullptr;
  std::unique_ptr<Buffer> sbuf, cbuf;
  ConnConfig conn;

  void SetUp() override {
    if (!dev.ok()) GTEST_SKIP() << "no loopback device";
    ASSERT_EQ(ibv_query_device_ex(dev.ctx, nullptr, &attrx), 0);
    if (!(attrx.tm_caps.flags & IBV_TM_CAP_RC)) GTEST_SKIP() << "no tag matching";
    pd = ibv_alloc_pd(dev.ctx);
    ASSERT_NE(pd, nullptr);
    ibv_cq_init_attr_ex ca{};
    ca.cqe = 256;
    ca.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_TM_INFO;
    scq = ibv_create_cq_ex(dev.ctx, &ca);
    ASSERT_NE(scq, nullptr) << strerror(errno);
    ccq = ibv_create_cq(dev.ctx, 256, nullptr, nullptr, 0);
    ASSERT_NE(ccq, nullptr);
    srq = make_srq(attrx.tm_caps.max_num_tags);
    ASSERT_NE(srq, nullptr) << strerror(errno);
    sbuf = std::make_unique<Buffer>(kBuf);
    cbuf = std::make_unique<Buffer>(kBuf);
    ASSERT_TRUE(sbuf->reg(pd, kAllAccess) && cbuf->reg(pd, kAllAccess));
    server = make_qp(srq, ibv_cq_ex_to_cq(scq));
    client = make_qp(nullptr, ccq);
    ASSERT_TRUE(server && client);
    uint32_t spsn = random_psn(), cpsn = random_psn();
    ASSERT_EQ(bring_up(server, spsn, client->qp_num, cpsn, dev.gid, conn, dev.attr), 0);
    ASSERT_EQ(bring_up(client, cpsn, server->qp_num, spsn, dev.gid, conn, dev.attr), 0);
  }
  void TearDown() override {
    if (server) {
      EXPECT_EQ(ibv_destroy_qp(server), 0);
    }
    if (client) {
      EXPECT_EQ(ibv_destroy_qp(client), 0);
    }
    if (srq) {
      EXPECT_EQ(ibv_destroy_srq(srq), 0);
    }
    sbuf.reset();
    cbuf.reset();
    if (scq) {
      EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(scq)), 0);
    }
    if (ccq) {
      EXPECT_EQ(ibv_destroy_cq(ccq), 0);
    }
    if (pd) {
      EXPECT_EQ(ibv_dealloc_pd(pd), 0);
    }
  }

  ibv_srq* make_srq(uint32_t max_num_tags) {
    ibv_srq_init_attr_ex a{};
    a.attr.max_wr = 64;
    a.attr.max_sge = 1;
    a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
    a.srq_type = IBV_SRQT_TM;
    a.pd = pd;
    a.cq = ibv_cq_ex_to_cq(scq);
    a.tm_cap.max_num_tags = max_num_tags;
    a.tm_cap.max_ops = 16;
    return ibv_create_srq_ex(dev.ctx, &a);
  }

  ibv_qp* make_qp(ibv_srq* s, ibv_cq* cq, ibv_qp_type type = IBV_QPT_RC) {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.srq = s;
    ia.cap.max_send_wr = 16;
    ia.cap.max_recv_wr = s ? 0 : 16;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = s ? 0 : 1;
    ia.qp_type = type;
    return ibv_create_qp(pd, &ia);
  }

  // One completion of the server's extended CQ, waited for (bounded).
  bool poll(TmWc* out) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kWaitSeconds);
    ibv_poll_cq_attr attr{};
    int rc;
    while ((rc = ibv_start_poll(scq, &attr)) == ENOENT)
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "no completion on the tag-matching CQ";
        return false;
      }
    EXPECT_EQ(rc, 0);
    if (rc) return false;
    out->wr_id = scq->wr_id;
    out->status = scq->status;
    out->opcode = ibv_wc_read_opcode(scq);
    out->flags = ibv_wc_read_wc_flags(scq);
    out->byte_len = ibv_wc_read_byte_len(scq);
    ibv_wc_read_tm_info(scq, &out->tm);
    ibv_end_poll(scq);
    return true;
  }
  bool cq_empty() {
    ibv_poll_cq_attr attr{};
    if (ibv_start_poll(scq, &attr) == ENOENT) return true;
    ibv_end_poll(scq);
    return false;
  }

  int post_op(ibv_ops_wr& wr) {
    ibv_ops_wr* bad = nullptr;
    int rc = ibv_post_srq_ops(srq, &wr, &bad);
    if (rc) {
      EXPECT_EQ(bad, &wr);
    }
    return rc;
  }
  // ADD of a tagged buffer at sbuf[off, off + len); the handle, or ~0u on failure.
  uint32_t add(uint64_t tag, uint64_t mask, uint64_t recv_wr_id, size_t off, uint32_t len, uint32_t unexpected = 0,
               int flags = IBV_OPS_SIGNALED) {
    ibv_sge sge = sbuf->sge(off, len);
    ibv_ops_wr wr{};
    wr.wr_id = 1000 + recv_wr_id;
    wr.opcode = IBV_WR_TAG_ADD;
    wr.flags = flags;
    wr.tm.unexpected_cnt = unexpected;
    wr.tm.add.recv_wr_id = recv_wr_id;
    wr.tm.add.sg_list = &sge;
    wr.tm.add.num_sge = 1;
    wr.tm.add.tag = tag;
    wr.tm.add.mask = mask;
    if (post_op(wr)) return ~0u;
    return wr.tm.handle;
  }
  // Waits for the list operation's completion and checks it.
  void expect_op(uint64_t wr_id, ibv_wc_opcode op, ibv_wc_status st = IBV_WC_SUCCESS, unsigned flags = 0) {
    TmWc wc;
    ASSERT_TRUE(poll(&wc));
    EXPECT_EQ(wc.wr_id, wr_id);
    EXPECT_EQ(wc.status, st) << ibv_wc_status_str(wc.status);
    if (st == IBV_WC_SUCCESS) {
      EXPECT_EQ(wc.opcode, op);
    }
    EXPECT_EQ(wc.flags & (IBV_WC_TM_SYNC_REQ | IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), flags);
  }
  int simple_op(uint32_t op, uint64_t wr_id, uint32_t handle, uint32_t unexpected, int flags) {
    ibv_ops_wr wr{};
    wr.wr_id = wr_id;
    static_assert(sizeof wr.opcode == sizeof op);
    std::memcpy(&wr.opcode, &op, sizeof op);  // any value, also one outside the enum
    wr.flags = flags;
    wr.tm.handle = handle;
    wr.tm.unexpected_cnt = unexpected;
    return post_op(wr);
  }
  void post_srq_wqe(uint64_t wr_id, size_t off, uint32_t len) {
    ibv_sge sge = sbuf->sge(off, len);
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
  }
  // Writes a TMH (and payload_len pattern bytes after it) at cbuf[off] and sends it all.
  void send_tm(uint8_t op, uint64_t tag, uint32_t app_ctx, uint32_t payload_len, uint32_t seed, size_t off = 0) {
    uint8_t* h = cbuf->data + off;
    std::memset(h, 0, kTmh);
    h[0] = op;
    put_be(h + 4, app_ctx, 4);
    put_be(h + 8, tag, 8);
    fill_pattern(h + kTmh, payload_len, seed);
    send_raw(off, kTmh + payload_len);
  }
  void send_raw(size_t off, uint32_t len) {
    SendWr w(77, IBV_WR_SEND, {cbuf->sge(off, len)});
    ASSERT_EQ(post_send(client, w), 0);
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(ccq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.opcode, IBV_WC_SEND);
  }
  // Expects the receive completion of an eager message that matched recv_wr_id's tagged buffer.
  void expect_expected(uint64_t recv_wr_id, uint64_t tag, uint32_t app_ctx, uint32_t len) {
    TmWc wc;
    ASSERT_TRUE(poll(&wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, recv_wr_id);
    EXPECT_EQ(wc.opcode, IBV_WC_TM_RECV);
    EXPECT_EQ(wc.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), unsigned{IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID});
    EXPECT_EQ(wc.byte_len, len);
    EXPECT_EQ(wc.tm.tag, tag);
    EXPECT_EQ(wc.tm.priv, app_ctx);
  }
  // Expects an ordinary SRQ WQE to have taken a whole message (TMH included) as opcode.
  void expect_in_wqe(uint64_t wr_id, ibv_wc_opcode opcode, uint32_t len) {
    TmWc wc;
    ASSERT_TRUE(poll(&wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, wr_id);
    EXPECT_EQ(wc.opcode, opcode);
    EXPECT_EQ(wc.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), 0u);
    EXPECT_EQ(wc.byte_len, len);
    EXPECT_EQ(wc.tm.tag, 0u);
  }
};

TEST_F(TagMatching, DeviceReportsTmCaps) {
  EXPECT_TRUE(attrx.tm_caps.flags & IBV_TM_CAP_RC);
  EXPECT_GE(attrx.tm_caps.max_num_tags, 1u);
  EXPECT_GE(attrx.tm_caps.max_ops, 1u);
  EXPECT_GE(attrx.tm_caps.max_sge, 1u);
  EXPECT_GE(attrx.tm_caps.max_rndv_hdr_size, sizeof(ibv_tmh) + sizeof(ibv_rvh));
}

TEST_F(TagMatching, ExpectedEagerMessageLandsAfterItsTmh) {
  uint32_t h = add(0x5, ~0ull, 1, 0, 8192);
  ASSERT_NE(h, ~0u);
  expect_op(1001, IBV_WC_TM_ADD);
  // Three packets at the 1024-byte path MTU: the TMH is stripped from the first only.
  constexpr uint32_t kLen = 3000;
  send_tm(IBV_TMH_EAGER, 0x5, 0xABCD, kLen, 11);
  expect_expected(1, 0x5, 0xABCD, kLen);
  EXPECT_EQ(check_pattern(sbuf->data, kLen, 11), kLen);
}

TEST_F(TagMatching, MatchingFollowsPostingOrderAndMask) {
  // Entry 1 takes any tag 0x1? (mask 0xF0); entry 2 exactly 0x11; entry 3 exactly 0x22.
  ASSERT_NE(add(0x10, 0xF0, 1, 0, 1024), ~0u);
  expect_op(1001, IBV_WC_TM_ADD);
  ASSERT_NE(add(0x11, ~0ull, 2, 4096, 1024), ~0u);
  expect_op(1002, IBV_WC_TM_ADD);
  ASSERT_NE(add(0x22, ~0ull, 3, 8192, 1024), ~0u);
  expect_op(1003, IBV_WC_TM_ADD);
  send_tm(IBV_TMH_EAGER, 0x22, 3, 100, 3);
  expect_expected(3, 0x22, 3, 100);
  send_tm(IBV_TMH_EAGER, 0x11, 1, 100, 1);
  expect_expected(1, 0x11, 1, 100);  // the first posted entry that matches
  send_tm(IBV_TMH_EAGER, 0x11, 2, 100, 2);
  expect_expected(2, 0x11, 2, 100);
  EXPECT_EQ(check_pattern(sbuf->data, 100, 1), 100u);
  EXPECT_EQ(check_pattern(sbuf->data + 4096, 100, 2), 100u);
  EXPECT_EQ(check_pattern(sbuf->data + 8192, 100, 3), 100u);
}

TEST_F(TagMatching, NoTagMessageTakesAnOrdinaryWqe) {
  post_srq_wqe(50, 16384, 4096);
  send_tm(IBV_TMH_NO_TAG, 0, 0, 200, 5);
  expect_in_wqe(50, IBV_WC_TM_NO_TAG, kTmh + 200);
  EXPECT_EQ(sbuf->data[16384], IBV_TMH_NO_TAG);
  EXPECT_EQ(check_pattern(sbuf->data + 16384 + kTmh, 200, 5), 200u);
}

TEST_F(TagMatching, UnexpectedMessagePausesMatchingUntilSync) {
  post_srq_wqe(50, 16384, 4096);
  post_srq_wqe(51, 20480, 4096);
  // Nothing posted for tag 8: unexpected, the whole message (TMH included) in an SRQ WQE.
  send_tm(IBV_TMH_EAGER, 0x8, 0x88, 300, 8);
  expect_in_wqe(50, IBV_WC_TM_RECV, kTmh + 300);
  EXPECT_EQ(get_be(sbuf->data + 16384 + 8, 8), 0x8u);
  EXPECT_EQ(check_pattern(sbuf->data + 16384 + kTmh, 300, 8), 300u);
  // A tag added before software has accounted for that message needs synchronisation first.
  uint32_t stale = add(0x7, ~0ull, 70, 0, 4096, 0);
  ASSERT_NE(stale, ~0u);
  expect_op(1070, IBV_WC_TM_ADD, IBV_WC_SUCCESS, IBV_WC_TM_SYNC_REQ);
  send_tm(IBV_TMH_EAGER, 0x7, 0x77, 300, 7);
  expect_in_wqe(51, IBV_WC_TM_RECV, kTmh + 300);
  // Software reports both unexpected messages handled: matching resumes.
  ASSERT_EQ(simple_op(IBV_WR_TAG_SYNC, 27, 0, 2, IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC), 0);
  expect_op(27, IBV_WC_TM_SYNC);
  ASSERT_EQ(simple_op(IBV_WR_TAG_DEL, 28, stale, 2, IBV_OPS_SIGNALED), 0);
  expect_op(28, IBV_WC_TM_DEL);
  ASSERT_NE(add(0x7, ~0ull, 71, 4096, 4096, 2), ~0u);
  expect_op(1071, IBV_WC_TM_ADD);
  send_tm(IBV_TMH_EAGER, 0x7, 0x77, 300, 9);
  expect_expected(71, 0x7, 0x77, 300);
  EXPECT_EQ(check_pattern(sbuf->data + 4096, 300, 9), 300u);
}

TEST_F(TagMatching, DelRemovesATagAndFailsOnAConsumedOne) {
  post_srq_wqe(50, 16384, 4096);
  uint32_t h = add(0x9, ~0ull, 9, 0, 4096);
  ASSERT_NE(h, ~0u);
  expect_op(1009, IBV_WC_TM_ADD);
  uint32_t h2 = add(0xA, ~0ull, 10, 4096, 4096);
  ASSERT_NE(h2, ~0u);
  expect_op(1010, IBV_WC_TM_ADD);
  send_tm(IBV_TMH_EAGER, 0xA, 0, 64, 10);
  expect_expected(10, 0xA, 0, 64);
  // h2 was consumed by that message: its DEL completes in error.
  ASSERT_EQ(simple_op(IBV_WR_TAG_DEL, 30, h2, 0, IBV_OPS_SIGNALED), 0);
  expect_op(30, IBV_WC_TM_DEL, IBV_WC_TM_ERR);
  ASSERT_EQ(simple_op(IBV_WR_TAG_DEL, 31, h, 0, IBV_OPS_SIGNALED), 0);
  expect_op(31, IBV_WC_TM_DEL);
  // Deleted: a message for tag 9 is unexpected now.
  send_tm(IBV_TMH_EAGER, 0x9, 0, 64, 11);
  expect_in_wqe(50, IBV_WC_TM_RECV, kTmh + 64);
}

TEST_F(TagMatching, UnsignaledOperationsCompleteSilently) {
  uint32_t h = add(0x3, ~0ull, 3, 0, 4096, 0, 0);
  ASSERT_NE(h, ~0u);
  ASSERT_EQ(simple_op(IBV_WR_TAG_SYNC, 40, 0, 0, IBV_OPS_TM_SYNC), 0);
  ASSERT_EQ(simple_op(IBV_WR_TAG_SYNC, 41, 0, 0, IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC), 0);
  expect_op(41, IBV_WC_TM_SYNC);  // the first CQE is the signaled SYNC's
  send_tm(IBV_TMH_EAGER, 0x3, 0, 64, 3);
  expect_expected(3, 0x3, 0, 64);
  EXPECT_TRUE(cq_empty());
}

TEST_F(TagMatching, RendezvousReadsTheSendersBufferAndAnswersWithFin) {
  constexpr uint32_t kLen = 10000;  // several READ response packets
  constexpr size_t kData = 32768;
  fill_pattern(cbuf->data + kData, kLen, 21);
  ASSERT_NE(add(0x44, ~0ull, 4, 0, 16384), ~0u);
  expect_op(1004, IBV_WC_TM_ADD);
  // The FIN comes back into one of the client's receive WQEs.
  ASSERT_EQ(post_recv(client, 90, {cbuf->sge(60000, 64)}), 0);
  uint8_t* h = cbuf->data;
  std::memset(h, 0, kTmh + sizeof(ibv_rvh));
  h[0] = IBV_TMH_RNDV;
  put_be(h + 4, 0x1234, 4);
  put_be(h + 8, 0x44, 8);
  put_be(h + 16, cbuf->addr(kData), 8);
  put_be(h + 24, cbuf->rkey(), 4);
  put_be(h + 28, kLen, 4);
  send_raw(0, kTmh + sizeof(ibv_rvh));
  TmWc wc;
  ASSERT_TRUE(poll(&wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.wr_id, 4u);
  EXPECT_EQ(wc.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(wc.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), unsigned{IBV_WC_TM_MATCH});
  EXPECT_EQ(wc.tm.tag, 0x44u);
  EXPECT_EQ(wc.tm.priv, 0x1234u);
  ASSERT_TRUE(poll(&wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.wr_id, 4u);
  EXPECT_EQ(wc.opcode, IBV_WC_TM_RECV);
  EXPECT_EQ(wc.flags & (IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID), unsigned{IBV_WC_TM_DATA_VALID});
  EXPECT_EQ(wc.byte_len, kLen);
  EXPECT_EQ(check_pattern(sbuf->data, kLen, 21), kLen);
  ibv_wc cwc{};
  ASSERT_TRUE(poll_wc(ccq, &cwc));
  EXPECT_EQ(cwc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(cwc.status);
  EXPECT_EQ(cwc.wr_id, 90u);
  EXPECT_EQ(cwc.opcode, IBV_WC_RECV);
  EXPECT_EQ(cwc.byte_len, kTmh);
  EXPECT_EQ(cbuf->data[60000], IBV_TMH_FIN);
  EXPECT_EQ(get_be(cbuf->data + 60004, 4), 0x1234u);
  EXPECT_EQ(get_be(cbuf->data + 60008, 8), 0x44u);
}

TEST_F(TagMatching, RendezvousWithABadRkeyCompletesInError) {
  ASSERT_NE(add(0x45, ~0ull, 5, 0, 16384), ~0u);
  expect_op(1005, IBV_WC_TM_ADD);
  uint8_t* h = cbuf->data;
  std::memset(h, 0, kTmh + sizeof(ibv_rvh));
  h[0] = IBV_TMH_RNDV;
  put_be(h + 8, 0x45, 8);
  put_be(h + 16, cbuf->addr(32768), 8);
  put_be(h + 24, cbuf->rkey() ^ 0x5A5A00, 4);
  put_be(h + 28, 4096, 4);
  send_raw(0, kTmh + sizeof(ibv_rvh));
  TmWc wc;
  ASSERT_TRUE(poll(&wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.flags & IBV_WC_TM_MATCH, unsigned{IBV_WC_TM_MATCH});
  // The READ is refused by the sender's responder (IBTA 9.7.5.2.3): the data never becomes valid.
  ASSERT_TRUE(poll(&wc));
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_TRUE(wait_qp_state(server, IBV_QPS_ERR));
}

TEST_F(TagMatching, BadListOperationsAreRefused) {
  // An opcode that does not exist.
  EXPECT_EQ(simple_op(7, 1, 0, 0, IBV_OPS_SIGNALED), EINVAL);
  // A DEL of a handle this SRQ never gave out.
  EXPECT_EQ(simple_op(IBV_WR_TAG_DEL, 2, 1u << 30, 0, IBV_OPS_SIGNALED), EINVAL);
  // An ADD with more SGEs than tm_caps.max_sge.
  std::vector<ibv_sge> sges(attrx.tm_caps.max_sge + 1, sbuf->sge(0, 64));
  ibv_ops_wr wr{};
  wr.opcode = IBV_WR_TAG_ADD;
  wr.flags = IBV_OPS_SIGNALED;
  wr.tm.add.sg_list = sges.data();
  wr.tm.add.num_sge = static_cast<int>(sges.size());
  EXPECT_EQ(post_op(wr), EINVAL);
  // List operations on an SRQ that is not a tag-matching one.
  ibv_srq_init_attr ia{};
  ia.attr.max_wr = 4;
  ia.attr.max_sge = 1;
  ibv_srq* basic = ibv_create_srq(pd, &ia);
  ASSERT_NE(basic, nullptr);
  ibv_ops_wr sync{};
  sync.opcode = IBV_WR_TAG_SYNC;
  sync.flags = IBV_OPS_SIGNALED;
  ibv_ops_wr* bad = nullptr;
  EXPECT_NE(ibv_post_srq_ops(basic, &sync, &bad), 0);
  EXPECT_EQ(ibv_destroy_srq(basic), 0);
  EXPECT_TRUE(cq_empty());
}

TEST_F(TagMatching, TagListIsBoundedByMaxNumTags) {
  ibv_srq* small = make_srq(2);
  ASSERT_NE(small, nullptr) << strerror(errno);
  std::swap(small, srq);
  EXPECT_NE(add(1, ~0ull, 1, 0, 64, 0, 0), ~0u);
  EXPECT_NE(add(2, ~0ull, 2, 64, 64, 0, 0), ~0u);
  EXPECT_EQ(add(3, ~0ull, 3, 128, 64, 0, 0), ~0u);  // ENOMEM: the list is full
  std::swap(small, srq);
  EXPECT_EQ(ibv_destroy_srq(small), 0);
}

TEST_F(TagMatching, CreationChecksItsAttributes) {
  ibv_srq_init_attr_ex a{};
  a.attr.max_wr = 4;
  a.attr.max_sge = 1;
  a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TM;  // no CQ
  a.srq_type = IBV_SRQT_TM;
  a.pd = pd;
  a.tm_cap.max_num_tags = 4;
  a.tm_cap.max_ops = 4;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(dev.ctx, &a), nullptr);
  EXPECT_NE(errno, 0);
  a.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
  a.cq = ibv_cq_ex_to_cq(scq);
  a.tm_cap.max_num_tags = attrx.tm_caps.max_num_tags + 1;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(dev.ctx, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // The CQ of a tag-matching SRQ stays while the SRQ does.
  ibv_cq* cq2 = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq2, nullptr);
  a.cq = cq2;
  a.tm_cap.max_num_tags = 4;
  ibv_srq* s = ibv_create_srq_ex(dev.ctx, &a);
  ASSERT_NE(s, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_destroy_cq(cq2), EBUSY);
  // Tag matching is for RC QPs (IBV_TM_CAP_RC).
  ibv_qp* ud = make_qp(s, cq2, IBV_QPT_UD);
  EXPECT_EQ(ud, nullptr);
  if (ud) ibv_destroy_qp(ud);
  EXPECT_EQ(ibv_destroy_srq(s), 0);
  EXPECT_EQ(ibv_destroy_cq(cq2), 0);
}

}  // namespace
}  // namespace softrdma::verbs_test
