// Shared receive queues: many RC QPs consuming one SRQ, the limit (low watermark) event, the Last
// WQE Reached event of a QP leaving an SRQ in error, capacity and lifetime errors, and a receive
// buffer with a bad lkey. Only the public verbs API: these run unchanged on an RDMA NIC.
#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "helpers.h"

namespace softrdma::verbs_test {
namespace {

constexpr uint32_t kSlot = 4096;  // bytes of each SRQ receive buffer

// A receive side (one PD, one SRQ, one receive CQ shared by all its QPs) and a send side, each
// pair of QPs connected on the loopback device over the path (RcPair's device; its a and b unused).
class SrqBase : public RcPair {
 protected:
  ibv_pd* pd = nullptr;
  ibv_cq* rcq = nullptr;  // receive completions of every server QP
  ibv_cq* scq = nullptr;  // send completions of every QP
  ibv_srq* srq = nullptr;
  std::vector<ibv_qp*> servers, clients;
  std::unique_ptr<Buffer> rbuf, sbuf;
  static constexpr uint32_t kSendSlots = 512;
  uint32_t next_send_slot_ = 0;

  void SetUp() override {
    RcPair::SetUp();
    if (HasFatalFailure()) return;
    pd = ibv_alloc_pd(dev.ctx);
    ASSERT_NE(pd, nullptr);
    rcq = ibv_create_cq(dev.ctx, 4096, nullptr, nullptr, 0);
    scq = ibv_create_cq(dev.ctx, 4096, nullptr, nullptr, 0);
    ASSERT_TRUE(rcq && scq);
  }
  void TearDown() override {
    for (ibv_qp* q : servers) EXPECT_EQ(ibv_destroy_qp(q), 0);
    for (ibv_qp* q : clients) EXPECT_EQ(ibv_destroy_qp(q), 0);
    if (srq) {
      EXPECT_EQ(ibv_destroy_srq(srq), 0);
    }
    rbuf.reset();
    sbuf.reset();
    if (rcq) ibv_destroy_cq(rcq);
    if (scq) ibv_destroy_cq(scq);
    if (pd) {
      EXPECT_EQ(ibv_dealloc_pd(pd), 0);
    }
    RcPair::TearDown();
  }

  // An SRQ of max_wr WQEs, each able to take kSlot bytes of rbuf (max_wr slots).
  void make_srq(uint32_t max_wr) {
    ibv_srq_init_attr ia{};
    ia.attr.max_wr = max_wr;
    ia.attr.max_sge = 1;
    srq = ibv_create_srq(pd, &ia);
    ASSERT_NE(srq, nullptr) << strerror(errno);
    ASSERT_GE(ia.attr.max_wr, max_wr);
    ASSERT_GE(ia.attr.max_sge, 1u);
    rbuf = std::make_unique<Buffer>(size_t{kSlot} * ia.attr.max_wr);
    ASSERT_TRUE(rbuf->reg(pd, kAllAccess));
    sbuf = std::make_unique<Buffer>(size_t{kSlot} * kSendSlots);
    ASSERT_TRUE(sbuf->reg(pd, kAllAccess));
  }

  int post_slot(uint32_t slot, uint32_t lkey_xor = 0) {
    ibv_sge sge = rbuf->sge(size_t{slot} * kSlot, kSlot);
    sge.lkey ^= lkey_xor;
    ibv_recv_wr wr{};
    wr.wr_id = slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_srq_recv(srq, &wr, &bad);
  }

  ibv_qp* create_qp(ibv_srq* s) {
    ibv_qp_init_attr ia{};
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.srq = s;
    ia.cap.max_send_wr = 64;
    ia.cap.max_recv_wr = s ? 0 : 64;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = s ? 0 : 1;
    ia.qp_type = IBV_QPT_RC;
    ibv_qp* q = ibv_create_qp(pd, &ia);
    EXPECT_NE(q, nullptr) << strerror(errno);
    return q;
  }

  // n server QPs on the SRQ, each connected to a client QP with its own (unused) RQ.
  void connect(int n) {
    for (int i = 0; i < n; ++i) {
      ibv_qp* s = create_qp(srq);
      ibv_qp* c = create_qp(nullptr);
      ASSERT_TRUE(s && c);
      servers.push_back(s);
      clients.push_back(c);
      ASSERT_TRUE(join(c, random_psn(), dev, s, random_psn(), dev));
    }
  }

  // Client i sends `len` bytes of the pattern seeded with `imm`, with immediate `imm`, from the next
  // slot of sbuf (slots are reused only after kSendSlots sends, long completed by then). On iWARP,
  // which has no immediate data, a plain SEND: the bodies run there read no immediate.
  int send(int i, uint32_t len, uint32_t imm) {
    size_t off = size_t{next_send_slot_++ % kSendSlots} * kSlot;
    fill_pattern(sbuf->data + off, len, imm);
    SendWr w(imm, path == Path::Iwarp ? IBV_WR_SEND : IBV_WR_SEND_WITH_IMM, {sbuf->sge(off, len)});
    if (path != Path::Iwarp) w.imm(imm);
    return post_send(clients[i], w);
  }

  // The next async event within kWaitSeconds (false with a gtest failure when none comes).
  bool next_event(ibv_async_event& ev) {
    pollfd p{dev.ctx->async_fd, POLLIN, 0};
    if (poll(&p, 1, kWaitSeconds * 1000) != 1) {
      ADD_FAILURE() << "no async event within " << kWaitSeconds << " s";
      return false;
    }
    return ibv_get_async_event(dev.ctx, &ev) == 0;
  }
  // True when an async event is pending now (it is consumed and acknowledged).
  bool event_pending(ibv_async_event* out = nullptr) {
    pollfd p{dev.ctx->async_fd, POLLIN, 0};
    if (poll(&p, 1, 0) != 1) return false;
    ibv_async_event ev{};
    if (ibv_get_async_event(dev.ctx, &ev) != 0) return false;
    if (out) *out = ev;
    ibv_ack_async_event(&ev);
    return true;
  }
};
using Srq = OverPaths<SrqBase>;
// Off iWARP: bodies that read the immediate data (which iWARP does not have), that resize the SRQ (an
// iWARP device, as siw, has no IBV_DEVICE_SRQ_RESIZE), or that expect the responder's error in the
// SEND's own completion (iWARP completes a SEND once its bytes are in the socket: docs/iwarp.md,
// "Completion").
using SrqRoce = Srq;
// UD over an SRQ: a service that goes by packets only, on the default device.
using SrqUd = SrqBase;

uint32_t msg_len(int client, int msg) { return 1 + static_cast<uint32_t>(client * 977 + msg * 1511) % kSlot; }

TEST_P(Srq, DeviceReportsSrqCaps) {
  EXPECT_GT(dev.attr.max_srq, 0);
  EXPECT_GT(dev.attr.max_srq_wr, 0);
  EXPECT_GT(dev.attr.max_srq_sge, 0);
}

// 16 QPs share 64 receive WQEs; 16 x 24 messages of 1 B .. 4 KiB (up to 4 packets at MTU 1024, so
// multi-packet messages of different QPs interleave) land in SRQ buffers, reposted as consumed.
TEST_P(SrqRoce, SixteenQpsShareOneSrq) {
  constexpr int kQps = 16, kMsgs = 24, kWqes = 64;
  ASSERT_NO_FATAL_FAILURE(make_srq(kWqes));
  ASSERT_NO_FATAL_FAILURE(connect(kQps));
  for (uint32_t s = 0; s < kWqes; ++s) ASSERT_EQ(post_slot(s), 0);
  std::map<uint32_t, int> client_of;  // server qp_num -> client index
  for (int i = 0; i < kQps; ++i) client_of[servers[i]->qp_num] = i;

  // Round-robin over the clients so every QP has messages in flight at once. A send queue holds
  // 64 WQEs: at most kMsgs per client are ever outstanding.
  for (int m = 0; m < kMsgs; ++m)
    for (int i = 0; i < kQps; ++i)
      ASSERT_EQ(send(i, msg_len(i, m), (i << 16) | m), 0);
  std::vector<int> next_msg(kQps, 0);
  int received = 0;
  while (received < kQps * kMsgs) {
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(rcq, &wc)) << received << " received";
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    ASSERT_EQ(wc.opcode, IBV_WC_RECV);
    ASSERT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
    uint32_t imm = ntohl(wc.imm_data);
    int i = static_cast<int>(imm >> 16), m = static_cast<int>(imm & 0xFFFF);
    ASSERT_LT(i, kQps);
    ASSERT_EQ(client_of.at(wc.qp_num), i) << "completion on the wrong QP";
    // RC: each QP's messages arrive in order, whichever SRQ WQE they took.
    ASSERT_EQ(m, next_msg[i]) << "client " << i;
    ++next_msg[i];
    ASSERT_EQ(wc.byte_len, msg_len(i, m));
    ASSERT_LT(wc.wr_id, static_cast<uint64_t>(kWqes));
    const uint8_t* got = rbuf->data + wc.wr_id * kSlot;
    ASSERT_EQ(check_pattern(got, wc.byte_len, imm), wc.byte_len) << "client " << i << " msg " << m;
    std::memset(rbuf->data + wc.wr_id * kSlot, 0, kSlot);
    ASSERT_EQ(post_slot(static_cast<uint32_t>(wc.wr_id)), 0);
    ++received;
  }
  auto sends = poll_wcs(scq, kQps * kMsgs);
  ASSERT_EQ(sends.size(), static_cast<size_t>(kQps * kMsgs));
  for (const ibv_wc& wc : sends) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(drain_cq(rcq), 0);
}

// ibv_modify_srq(3): setting srq_limit arms the event; it fires once when the WQEs left drop below
// the limit, the SRQ is then disarmed (query shows 0) until the limit is set again.
TEST_P(Srq, LimitEventFiresOnceAndRearms) {
  ASSERT_NO_FATAL_FAILURE(make_srq(16));
  ASSERT_NO_FATAL_FAILURE(connect(1));
  int fl = fcntl(dev.ctx->async_fd, F_GETFL);
  ASSERT_EQ(fcntl(dev.ctx->async_fd, F_SETFL, fl | O_NONBLOCK), 0);
  for (uint32_t s = 0; s < 16; ++s) ASSERT_EQ(post_slot(s), 0);
  ibv_srq_attr a{};
  a.srq_limit = 8;
  ASSERT_EQ(ibv_modify_srq(srq, &a, IBV_SRQ_LIMIT), 0);
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 8u);

  auto exchange = [&](int n, int first) {
    for (int k = 0; k < n; ++k) ASSERT_EQ(send(0, 64, first + k), 0);
    auto r = poll_wcs(rcq, n);
    ASSERT_EQ(r.size(), static_cast<size_t>(n));
    for (const ibv_wc& wc : r) ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    auto s = poll_wcs(scq, n);
    ASSERT_EQ(s.size(), static_cast<size_t>(n));
  };
  // 16 -> 8 WQEs left: not below the limit yet.
  ASSERT_NO_FATAL_FAILURE(exchange(8, 0));
  EXPECT_FALSE(event_pending()) << "limit event before the count dropped below the limit";
  // 8 -> 7: below.
  ASSERT_NO_FATAL_FAILURE(exchange(1, 8));
  ibv_async_event ev{};
  ASSERT_TRUE(next_event(ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(ev.element.srq, srq);
  ibv_ack_async_event(&ev);
  EXPECT_EQ(srq->events_completed, 1u);
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 0u) << "the limit disarms when its event fires";
  // 7 -> 4: disarmed, no second event.
  ASSERT_NO_FATAL_FAILURE(exchange(3, 9));
  EXPECT_FALSE(event_pending()) << "a second limit event without re-arming";

  // Refill to 16, re-arm at 14: 16 -> 14 nothing, 14 -> 13 the event again.
  for (uint32_t s = 0; s < 12; ++s) ASSERT_EQ(post_slot(s), 0);
  a.srq_limit = 14;
  ASSERT_EQ(ibv_modify_srq(srq, &a, IBV_SRQ_LIMIT), 0);
  ASSERT_NO_FATAL_FAILURE(exchange(2, 12));
  EXPECT_FALSE(event_pending());
  ASSERT_NO_FATAL_FAILURE(exchange(1, 14));
  ASSERT_TRUE(next_event(ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(ev.element.srq, srq);
  ibv_ack_async_event(&ev);
  ASSERT_NO_FATAL_FAILURE(exchange(2, 15));
  EXPECT_FALSE(event_pending());
}

TEST_P(Srq, LimitAboveMaxWrIsEinval) {
  ASSERT_NO_FATAL_FAILURE(make_srq(16));
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 0u) << "an SRQ starts disarmed";
  ibv_srq_attr a{};
  a.srq_limit = q.max_wr + 1;
  EXPECT_EQ(ibv_modify_srq(srq, &a, IBV_SRQ_LIMIT), EINVAL);
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 0u);
}

TEST_P(Srq, PostBeyondMaxWrIsEnomem) {
  ASSERT_NO_FATAL_FAILURE(make_srq(8));
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  ASSERT_GE(q.max_wr, 8u);
  ASSERT_GE(q.max_sge, 1u);
  // A chain of max_wr + 1: all but the last are queued, bad_wr names the last.
  std::vector<ibv_sge> sges(q.max_wr + 1);
  std::vector<ibv_recv_wr> wrs(q.max_wr + 1);
  for (uint32_t i = 0; i <= q.max_wr; ++i) {
    sges[i] = rbuf->sge(0, 64);
    wrs[i] = {};
    wrs[i].wr_id = i;
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
    wrs[i].next = i < q.max_wr ? &wrs[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_srq_recv(srq, wrs.data(), &bad), ENOMEM);
  EXPECT_EQ(bad, &wrs[q.max_wr]);
  // More SGEs than the SRQ takes.
  std::vector<ibv_sge> many(q.max_sge + 1, rbuf->sge(0, 8));
  ibv_recv_wr w{};
  w.sg_list = many.data();
  w.num_sge = static_cast<int>(many.size());
  bad = nullptr;
  EXPECT_EQ(ibv_post_srq_recv(srq, &w, &bad), EINVAL);
  EXPECT_EQ(bad, &w);
}

TEST_P(SrqRoce, ResizeKeepsPostedWqes) {
  if (!(dev.attr.device_cap_flags & IBV_DEVICE_SRQ_RESIZE)) GTEST_SKIP() << "no IBV_DEVICE_SRQ_RESIZE";
  ASSERT_NO_FATAL_FAILURE(make_srq(4));
  ASSERT_NO_FATAL_FAILURE(connect(1));
  for (uint32_t s = 0; s < 4; ++s) ASSERT_EQ(post_slot(s), 0);
  ibv_srq_attr a{};
  a.max_wr = 2;  // below the 4 WQEs posted
  EXPECT_EQ(ibv_modify_srq(srq, &a, IBV_SRQ_MAX_WR), EINVAL);
  a.max_wr = 32;
  ASSERT_EQ(ibv_modify_srq(srq, &a, IBV_SRQ_MAX_WR), 0);
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_GE(q.max_wr, 32u);
  // rbuf has 4 slots: the new WQEs reuse them; all 8 complete in posting order.
  for (uint32_t s = 0; s < 4; ++s) ASSERT_EQ(post_slot(s), 0);
  for (int k = 0; k < 8; ++k) ASSERT_EQ(send(0, 100 + k, k), 0);
  auto r = poll_wcs(rcq, 8);
  ASSERT_EQ(r.size(), 8u);
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(r[k].status, IBV_WC_SUCCESS);
    EXPECT_EQ(r[k].wr_id, static_cast<uint64_t>(k % 4));
    EXPECT_EQ(r[k].byte_len, static_cast<uint32_t>(100 + k));
  }
  EXPECT_EQ(poll_wcs(scq, 8).size(), 8u);
}

TEST_P(Srq, DestroyWhileInUseIsEbusy) {
  ASSERT_NO_FATAL_FAILURE(make_srq(8));
  ibv_qp* q = create_qp(srq);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->srq, srq);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(q, &attr, IBV_QP_CAP, &init), 0);
  EXPECT_EQ(init.srq, srq);
  EXPECT_EQ(ibv_destroy_srq(srq), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  ASSERT_EQ(ibv_destroy_qp(q), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  srq = nullptr;
}

// ibv_post_recv(3): a QP attached to an SRQ has no receive queue; posting to it fails.
TEST_P(Srq, PostRecvOnSrqQpFails) {
  ASSERT_NO_FATAL_FAILURE(make_srq(8));
  ASSERT_NO_FATAL_FAILURE(connect(1));
  ibv_sge sge = rbuf->sge(0, 64);
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  EXPECT_NE(ibv_post_recv(servers[0], &wr, &bad), 0);
  EXPECT_EQ(bad, &wr);
}

// A QP of an SRQ moved to ERR reports Last WQE Reached; the SRQ's WQEs are not flushed and another
// QP consumes them afterwards.
TEST_P(SrqRoce, QpErrorGivesLastWqeReachedAndSrqWqesSurvive) {
  ASSERT_NO_FATAL_FAILURE(make_srq(8));
  ASSERT_NO_FATAL_FAILURE(connect(2));
  for (uint32_t s = 0; s < 8; ++s) ASSERT_EQ(post_slot(s), 0);
  for (int k = 0; k < 2; ++k) ASSERT_EQ(send(0, 200, k), 0);
  auto r = poll_wcs(rcq, 2);
  ASSERT_EQ(r.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    expect_wc(r[k], {.wr_id = static_cast<uint64_t>(k), .opcode = IBV_WC_RECV, .byte_len = 200u,
                     .qp_num = servers[0]->qp_num});
  }
  ASSERT_EQ(poll_wcs(scq, 2).size(), 2u);

  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(servers[0], &err, IBV_QP_STATE), 0);
  ibv_async_event ev{};
  ASSERT_TRUE(next_event(ev));
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
  EXPECT_EQ(ev.element.qp, servers[0]);
  ibv_ack_async_event(&ev);
  EXPECT_EQ(servers[0]->events_completed, 1u);
  EXPECT_EQ(drain_cq(rcq), 0) << "the SRQ's WQEs were flushed with the QP";

  for (int k = 0; k < 6; ++k) ASSERT_EQ(send(1, 300 + k, 100 + k), 0);
  r = poll_wcs(rcq, 6);
  ASSERT_EQ(r.size(), 6u);
  for (int k = 0; k < 6; ++k) {
    expect_wc(r[k], {.wr_id = static_cast<uint64_t>(2 + k), .opcode = IBV_WC_RECV,
                     .byte_len = static_cast<uint32_t>(300 + k), .imm = static_cast<uint32_t>(100 + k),
                     .qp_num = servers[1]->qp_num});
    EXPECT_EQ(check_pattern(rbuf->data + r[k].wr_id * kSlot, 300 + k, 100 + k), static_cast<size_t>(300 + k));
  }
  ASSERT_EQ(poll_wcs(scq, 6).size(), 6u);
  EXPECT_FALSE(event_pending());
}

// A receive buffer with a bad lkey: the receiving QP's completion is LOC_PROT_ERR (as for an RQ),
// the requester gets REM_OP_ERR, and the failed QP reports Last WQE Reached.
TEST_P(SrqRoce, BadLkeyInSrqWqeIsLocProtErr) {
  ASSERT_NO_FATAL_FAILURE(make_srq(8));
  ASSERT_NO_FATAL_FAILURE(connect(2));
  ASSERT_EQ(post_slot(0, 0x00a5a5a5), 0);
  ASSERT_EQ(post_slot(1), 0);
  std::memset(rbuf->data, 0x33, kSlot);
  ASSERT_EQ(send(0, 64, 7), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(rcq, &wc));
  expect_wc(wc, {.wr_id = 0, .status = IBV_WC_LOC_PROT_ERR, .qp_num = servers[0]->qp_num});
  ASSERT_TRUE(poll_wc(scq, &wc));
  expect_wc(wc, {.wr_id = 7, .status = IBV_WC_REM_OP_ERR, .qp_num = clients[0]->qp_num});
  for (uint32_t i = 0; i < kSlot; ++i) ASSERT_EQ(rbuf->data[i], 0x33) << i;
  // The failed QP may also report its error itself (e.g. QP_FATAL) before Last WQE Reached.
  ibv_async_event ev{};
  for (int k = 0;; ++k) {
    ASSERT_LT(k, 3) << "no IBV_EVENT_QP_LAST_WQE_REACHED";
    ASSERT_TRUE(next_event(ev));
    EXPECT_EQ(ev.element.qp, servers[0]) << ibv_event_type_str(ev.event_type);
    ibv_ack_async_event(&ev);
    if (ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED) break;
  }
  // The other QP still receives into the SRQ's next WQE.
  ASSERT_EQ(send(1, 500, 8), 0);
  ASSERT_TRUE(poll_wc(rcq, &wc));
  expect_wc(wc, {.wr_id = 1, .opcode = IBV_WC_RECV, .byte_len = 500u, .qp_num = servers[1]->qp_num});
  EXPECT_EQ(check_pattern(rbuf->data + kSlot, 500, 8), 500u);
}

// UD QPs on an SRQ: each datagram lands, GRH area first, in the SRQ's next WQE and completes on the
// QP it was sent to.
TEST_F(SrqUd, UdQpsShareOneSrq) {
  constexpr uint32_t kQkey = 0x2222;
  ASSERT_NO_FATAL_FAILURE(make_srq(8));
  auto ud_qp = [&](ibv_srq* s) -> ibv_qp* {
    ibv_qp_init_attr ia{};
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.srq = s;
    ia.qp_type = IBV_QPT_UD;
    ia.cap.max_send_wr = 16;
    ia.cap.max_recv_wr = s ? 0 : 16;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = s ? 0 : 1;
    ibv_qp* q = ibv_create_qp(pd, &ia);
    if (!q) return nullptr;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = kPort;
    a.qkey = kQkey;
    if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return q;
    a = {};
    a.qp_state = IBV_QPS_RTR;
    if (ibv_modify_qp(q, &a, IBV_QP_STATE)) return q;
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = random_psn();
    ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
    return q;
  };
  for (int i = 0; i < 2; ++i) {
    servers.push_back(ud_qp(srq));
    ASSERT_NE(servers.back(), nullptr) << strerror(errno);
    ASSERT_EQ(qp_state(servers.back()), IBV_QPS_RTS);
  }
  clients.push_back(ud_qp(nullptr));
  ASSERT_NE(clients.back(), nullptr) << strerror(errno);
  ibv_ah_attr at{};
  at.is_global = 1;
  at.grh.dgid = dev.gid;
  at.grh.hop_limit = 64;
  at.port_num = kPort;
  ibv_ah* ah = ibv_create_ah(pd, &at);
  ASSERT_NE(ah, nullptr) << strerror(errno);
  for (uint32_t s = 0; s < 8; ++s) ASSERT_EQ(post_slot(s), 0);
  for (int k = 0; k < 8; ++k) {
    uint32_t len = 100 + 37 * k;
    size_t off = size_t{next_send_slot_++ % kSendSlots} * kSlot;
    fill_pattern(sbuf->data + off, len, 500 + k);
    ibv_sge sge = sbuf->sge(off, len);
    ibv_send_wr wr{};
    wr.wr_id = k;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = servers[k % 2]->qp_num;
    wr.wr.ud.remote_qkey = kQkey;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(clients[0], &wr, &bad), 0);
    // One at a time: UD may drop datagrams, and the order of WQE use is checked below.
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(rcq, &wc));
    expect_wc(wc, {.wr_id = static_cast<uint64_t>(k), .opcode = IBV_WC_RECV, .byte_len = 40 + len,
                   .qp_num = servers[k % 2]->qp_num});
    EXPECT_EQ(wc.src_qp, clients[0]->qp_num);
    EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
    EXPECT_EQ(check_pattern(rbuf->data + wc.wr_id * kSlot + 40, len, 500 + k), len);
    ASSERT_TRUE(poll_wc(scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  }
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

TEST_P(Srq, CreateSrqExBasicWorksOthersRefused) {
  ibv_srq_init_attr_ex ia{};
  ia.attr.max_wr = 16;
  ia.attr.max_sge = 2;
  ia.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
  ia.srq_type = IBV_SRQT_BASIC;
  ia.pd = pd;
  ibv_srq* s = ibv_create_srq_ex(dev.ctx, &ia);
  ASSERT_NE(s, nullptr) << strerror(errno);
  EXPECT_GE(ia.attr.max_wr, 16u);
  EXPECT_GE(ia.attr.max_sge, 2u);
  EXPECT_EQ(ibv_destroy_srq(s), 0);
  if (!(dev.attr.device_cap_flags & IBV_DEVICE_XRC)) {
    ia.srq_type = IBV_SRQT_XRC;
    ia.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ;
    ia.cq = rcq;
    errno = 0;
    EXPECT_EQ(ibv_create_srq_ex(dev.ctx, &ia), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
  }
  // More than the device's limits.
  ibv_srq_init_attr big{};
  big.attr.max_wr = static_cast<uint32_t>(dev.attr.max_srq_wr) + 1;
  big.attr.max_sge = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_srq(pd, &big), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

VT_INSTANTIATE_PATHS(Srq, VT_ALL_PATHS);
VT_INSTANTIATE_PATHS(SrqRoce, VT_ROCE_PATHS);

}  // namespace
}  // namespace softrdma::verbs_test
