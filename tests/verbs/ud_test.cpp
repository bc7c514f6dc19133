// UD queue pairs and address handles: datagrams with the GRH area RoCE v2 fills, Q_Keys, replies
// through ibv_create_ah_from_wc, and what is dropped (wrong Q_Key, no receive posted, over the MTU).
// Only the public verbs API is used, so these run unchanged on a RoCE NIC.
#include <unistd.h>

#include <cstring>

#include "helpers.h"

namespace softrdma::verbs_test {
namespace {

constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kGrh = 40;

// One UD QP with its PD and CQs.
struct UdQp {
  ibv_pd* pd = nullptr;
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  ibv_qp* qp = nullptr;
  ~UdQp() {
    if (qp) ibv_destroy_qp(qp);
    if (scq) ibv_destroy_cq(scq);
    if (rcq) ibv_destroy_cq(rcq);
  }
  // recv_cq: a CQ to receive into instead of a new one (the QP takes it over).
  bool create(ibv_context* ctx, ibv_pd* p, uint32_t qkey = kQkey, uint32_t max_recv_sge = 2,
              ibv_cq* recv_cq = nullptr) {
    pd = p;
    scq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
    rcq = recv_cq ? recv_cq : ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
    if (!scq || !rcq) return false;
    ibv_qp_init_attr ia{};
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.qp_type = IBV_QPT_UD;
    ia.cap.max_send_wr = 32;
    ia.cap.max_recv_wr = 32;
    ia.cap.max_send_sge = 2;
    ia.cap.max_recv_sge = max_recv_sge;
    qp = ibv_create_qp(pd, &ia);
    if (!qp) return false;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = kPort;
    a.qkey = qkey;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return false;
    a = {};
    a.qp_state = IBV_QPS_RTR;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) return false;
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = random_psn();
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0;
  }
  uint32_t qpn() const { return qp->qp_num; }
};

// Deallocates the PD after everything in it (declared before those members).
struct PdOwner {
  ibv_pd* pd = nullptr;
  ~PdOwner() {
    if (pd) ibv_dealloc_pd(pd);
  }
};

class Ud : public ::testing::Test {
 protected:
  Device dev;
  PdOwner pd_owner;
  ibv_pd* pd = nullptr;
  UdQp a, b;
  ibv_ah* ah = nullptr;  // a -> b (the loopback GID)
  std::unique_ptr<Buffer> mem;  // 64 KiB registered: send area at 0, receive areas above

  void SetUp() override {
    ASSERT_TRUE(dev.ok()) << "no loopback device";
    pd = pd_owner.pd = ibv_alloc_pd(dev.ctx);
    ASSERT_NE(pd, nullptr);
    ASSERT_TRUE(a.create(dev.ctx, pd));
    ASSERT_TRUE(b.create(dev.ctx, pd));
    ah = make_ah(dev.gid);
    ASSERT_NE(ah, nullptr) << strerror(errno);
    mem = std::make_unique<Buffer>(65536);
    ASSERT_TRUE(mem->reg(pd, IBV_ACCESS_LOCAL_WRITE));
  }
  void TearDown() override {
    mem.reset();
    if (ah) ibv_destroy_ah(ah);
  }

  ibv_ah* make_ah(const ibv_gid& dgid, uint8_t sgid = 0, uint8_t is_global = 1, uint8_t port = kPort) {
    ibv_ah_attr at{};
    at.is_global = is_global;
    at.grh.dgid = dgid;
    at.grh.sgid_index = sgid;
    at.grh.hop_limit = 64;
    at.port_num = port;
    return ibv_create_ah(pd, &at);
  }

  // Posts a receive of len bytes at offset off of mem (GRH area included).
  int recv(UdQp& q, uint64_t wr_id, size_t off, uint32_t len) {
    return post_recv(q.qp, wr_id, {mem->sge(off, len)});
  }
  // Sends len bytes of pattern `seed` from offset 0 of mem.
  int send(UdQp& from, ibv_ah* to, uint32_t qpn, uint32_t qkey, uint32_t len, uint32_t seed, uint64_t wr_id,
           std::optional<uint32_t> imm = std::nullopt) {
    fill_pattern(mem->data, len, seed);
    ibv_sge sge = mem->sge(0, len);
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
    if (imm) wr.imm_data = htonl(*imm);
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = to;
    wr.wr.ud.remote_qpn = qpn;
    wr.wr.ud.remote_qkey = qkey;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(from.qp, &wr, &bad);
  }
  // Sends and waits for the send completion.
  void send_ok(UdQp& from, ibv_ah* to, uint32_t qpn, uint32_t qkey, uint32_t len, uint32_t seed, uint64_t wr_id,
               std::optional<uint32_t> imm = std::nullopt) {
    ASSERT_EQ(send(from, to, qpn, qkey, len, seed, wr_id, imm), 0);
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(from.scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, wr_id);
    EXPECT_EQ(wc.opcode, IBV_WC_SEND);
  }
  uint32_t mtu() const { return 128u << dev.port.active_mtu; }
};

TEST_F(Ud, SendRecvWithGrh) {
  constexpr uint32_t len = 777;
  ASSERT_EQ(recv(b, 7, 8192, kGrh + 1024), 0);
  std::memset(mem->data + 8192, 0xEE, kGrh + 1024);
  send_ok(a, ah, b.qpn(), kQkey, len, 1, 100);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 7u);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_EQ(wc.byte_len, kGrh + len);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
  EXPECT_FALSE(wc.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(wc.src_qp, a.qpn());
  EXPECT_EQ(wc.qp_num, b.qpn());
  EXPECT_EQ(wc.pkey_index, 0);
  EXPECT_EQ(wc.slid, 0);
  EXPECT_EQ(check_pattern(mem->data + 8192 + kGrh, len, 1), len);
  // Past the message the buffer is untouched.
  EXPECT_EQ(mem->data[8192 + kGrh + len], 0xEE);

  // The GRH area: 20 bytes, then the IPv4 header of the datagram (RoCE v2 over IPv4).
  const uint8_t* g = mem->data + 8192;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(g[i], 0) << "byte " << i;
  const uint8_t* ip = g + 20;
  EXPECT_EQ(ip[0], 0x45);  // version 4, 5 words
  EXPECT_EQ(ip[9], 17);    // UDP
  uint32_t total = uint32_t{ip[2]} << 8 | ip[3];
  // IPv4 + UDP + BTH + DETH + payload (+ pad) + ICRC
  EXPECT_GE(total, 20u + 8 + 12 + 8 + len + 4);
  EXPECT_LE(total, 20u + 8 + 12 + 8 + len + 3 + 4);
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += uint32_t{ip[i]} << 8 | ip[i + 1];
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  EXPECT_EQ(sum, 0xFFFFu) << "IPv4 header checksum";
  EXPECT_EQ(std::memcmp(ip + 12, dev.gid.raw + 12, 4), 0) << "source address";
  EXPECT_EQ(std::memcmp(ip + 16, dev.gid.raw + 12, 4), 0) << "destination address";
}

// A RoCE NIC reports the L3 header type of a UD receive in the SL field (ConnectX: bits 2:0, 2 = IPv4),
// and consumers rely on it: UCX's UD transport reads it to know that the destination address is the
// last 4 bytes of the GRH area, compares that with its GIDs and drops the packet otherwise.
TEST_F(Ud, ReceiveReportsIpv4HeaderTypeInSl) {
  ASSERT_EQ(recv(b, 5, 8192, kGrh + 64), 0);
  send_ok(a, ah, b.qpn(), kQkey, 64, 5, 105);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(wc.wc_flags & IBV_WC_GRH);
  EXPECT_EQ(wc.sl & 7, 2) << "sl " << int{wc.sl};
  ibv_gid_entry ge{};
  ASSERT_EQ(ibv_query_gid_ex(dev.ctx, kPort, 0, &ge, 0), 0);
  EXPECT_EQ(ge.gid_type, IBV_GID_TYPE_ROCE_V2);
  // What the destination check compares: the IPv4 destination, as the tail of a v4-mapped GID.
  EXPECT_EQ(std::memcmp(mem->data + 8192 + kGrh - 4, dev.gid.raw + 12, 4), 0);

  // An extended CQ reads the same SL.
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 16;
  ca.wc_flags = IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_SRC_QP;
  ibv_cq_ex* cqx = ibv_create_cq_ex(dev.ctx, &ca);
  ASSERT_NE(cqx, nullptr) << strerror(errno);
  UdQp c;
  ASSERT_TRUE(c.create(dev.ctx, pd, kQkey, 2, ibv_cq_ex_to_cq(cqx)));
  ASSERT_EQ(recv(c, 6, 16384, kGrh + 64), 0);
  send_ok(a, ah, c.qpn(), kQkey, 64, 6, 106);
  ibv_poll_cq_attr pa{};
  int rc = ENOENT;
  for (int i = 0; i < 2000 && rc == ENOENT; ++i) {
    rc = ibv_start_poll(cqx, &pa);
    if (rc == ENOENT) usleep(1000);
  }
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(cqx->status, IBV_WC_SUCCESS);
  EXPECT_EQ(cqx->wr_id, 6u);
  EXPECT_EQ(ibv_wc_read_src_qp(cqx), a.qpn());
  EXPECT_EQ(ibv_wc_read_sl(cqx) & 7, 2);
  ibv_end_poll(cqx);
}

TEST_F(Ud, SendWithImmAndScatteredGrh) {
  // The usual layout: the GRH area in one SGE, the payload in another.
  constexpr uint32_t len = 300;
  ASSERT_EQ(post_recv(b.qp, 9, {mem->sge(4096, kGrh), mem->sge(12288, 512)}), 0);
  send_ok(a, ah, b.qpn(), kQkey, len, 2, 101, 0xC0FFEE);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, kGrh + len);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
  EXPECT_EQ(ntohl(wc.imm_data), 0xC0FFEEu);
  EXPECT_EQ(wc.src_qp, a.qpn());
  EXPECT_EQ(mem->data[4096 + 20], 0x45);
  EXPECT_EQ(check_pattern(mem->data + 12288, len, 2), len);
}

TEST_F(Ud, ReplyThroughAhFromWc) {
  ASSERT_EQ(recv(b, 1, 8192, kGrh + 256), 0);
  ASSERT_EQ(recv(a, 2, 16384, kGrh + 256), 0);
  send_ok(a, ah, b.qpn(), kQkey, 64, 3, 102);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);

  ibv_ah_attr at{};
  ASSERT_EQ(ibv_init_ah_from_wc(dev.ctx, kPort, &wc, reinterpret_cast<ibv_grh*>(mem->data + 8192), &at), 0);
  EXPECT_TRUE(at.is_global);
  EXPECT_EQ(at.port_num, kPort);
  EXPECT_EQ(at.grh.sgid_index, 0);
  EXPECT_TRUE(gid_equal(at.grh.dgid, dev.gid)) << gid_str(at.grh.dgid);

  ibv_ah* back = ibv_create_ah_from_wc(pd, &wc, reinterpret_cast<ibv_grh*>(mem->data + 8192), kPort);
  ASSERT_NE(back, nullptr) << strerror(errno);
  send_ok(b, back, wc.src_qp, kQkey, 200, 4, 103);
  ibv_wc r{};
  ASSERT_TRUE(poll_wc(a.rcq, &r));
  ASSERT_EQ(r.status, IBV_WC_SUCCESS);
  EXPECT_EQ(r.wr_id, 2u);
  EXPECT_EQ(r.src_qp, b.qpn());
  EXPECT_EQ(r.byte_len, kGrh + 200);
  EXPECT_EQ(check_pattern(mem->data + 16384 + kGrh, 200, 4), 200u);
  EXPECT_EQ(ibv_destroy_ah(back), 0);
}

TEST_F(Ud, InitAhFromWcNeedsGrh) {
  ibv_wc wc{};
  wc.wc_flags = 0;
  uint8_t grh[40] = {};
  ibv_ah_attr at{};
  EXPECT_NE(ibv_init_ah_from_wc(dev.ctx, kPort, &wc, reinterpret_cast<ibv_grh*>(grh), &at), 0);
  EXPECT_EQ(ibv_create_ah_from_wc(pd, &wc, reinterpret_cast<ibv_grh*>(grh), kPort), nullptr);
}

TEST_F(Ud, QkeyHighBitSendsTheQpsOwn) {
  // a's own Q_Key is kQkey (== b's): a WR Q_Key with the high bit set means "use the QP's".
  ASSERT_EQ(recv(b, 5, 8192, kGrh + 128), 0);
  send_ok(a, ah, b.qpn(), 0x80000000u, 100, 5, 104);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(mem->data + 8192 + kGrh, 100, 5), 100u);
}

// The drops below are shown by a marker datagram that follows the dropped one on the same path:
// datagrams from one QP to one port arrive in order on a loopback link.
TEST_F(Ud, WrongQkeyIsDroppedAndConsumesNothing) {
  ASSERT_EQ(recv(b, 1, 8192, kGrh + 512), 0);
  send_ok(a, ah, b.qpn(), kQkey ^ 1, 100, 6, 105);  // the sender cannot tell: it completes
  send_ok(a, ah, b.qpn(), kQkey, 50, 7, 106);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.byte_len, kGrh + 50) << "the datagram with the wrong Q_Key was delivered";
  EXPECT_EQ(check_pattern(mem->data + 8192 + kGrh, 50, 7), 50u);
  EXPECT_EQ(drain_cq(b.rcq), 0);
}

TEST_F(Ud, NoReceivePostedIsDropped) {
  UdQp c;  // the marker's receiver, on the same device (same port) as b
  ASSERT_TRUE(c.create(dev.ctx, pd));
  ASSERT_EQ(recv(c, 50, 24576, kGrh + 64), 0);
  send_ok(a, ah, b.qpn(), kQkey, 100, 8, 107);  // b has no receive: dropped, no RNR on UD
  send_ok(a, ah, c.qpn(), kQkey, 10, 9, 108);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(c.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  // Now b has a receive: the next datagram lands in it, the dropped one never does.
  ASSERT_EQ(recv(b, 51, 8192, kGrh + 512), 0);
  send_ok(a, ah, b.qpn(), kQkey, 30, 10, 109);
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 51u);
  EXPECT_EQ(wc.byte_len, kGrh + 30);
  EXPECT_EQ(check_pattern(mem->data + 8192 + kGrh, 30, 10), 30u);
  EXPECT_EQ(drain_cq(b.rcq), 0);
  EXPECT_EQ(ibv_destroy_qp(c.qp), 0);
  c.qp = nullptr;
}

TEST_F(Ud, MessageOverPortMtuIsNotSent) {
  // C10-93.1.1: a UD message longer than the port MTU emits no packet and raises no error.
  ASSERT_LE(mtu() + 1, 8192u);
  ASSERT_EQ(recv(b, 1, 16384, kGrh + 8192), 0);
  send_ok(a, ah, b.qpn(), kQkey, mtu() + 1, 11, 110);
  send_ok(a, ah, b.qpn(), kQkey, mtu(), 12, 111);  // exactly the MTU goes
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, kGrh + mtu());
  EXPECT_EQ(check_pattern(mem->data + 16384 + kGrh, mtu(), 12), mtu());
}

TEST_F(Ud, ReceiveBufferTooSmallIsLocalLengthError) {
  ASSERT_EQ(recv(b, 3, 8192, kGrh + 16), 0);
  send_ok(a, ah, b.qpn(), kQkey, 17, 13, 112);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  EXPECT_EQ(wc.wr_id, 3u);
  EXPECT_EQ(wc.status, IBV_WC_LOC_LEN_ERR);
}

TEST_F(Ud, BadAddressHandlesAreRefused) {
  ibv_gid v6{};
  v6.raw[0] = 0xfe;
  v6.raw[1] = 0x80;
  v6.raw[15] = 1;
  errno = 0;
  EXPECT_EQ(make_ah(v6), nullptr);  // not a RoCE v2 IPv4 GID
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(make_ah(dev.gid, 1), nullptr);  // no source GID 1
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(make_ah(dev.gid, 0, 0), nullptr);  // RoCE needs the GRH
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(make_ah(dev.gid, 0, 1, 2), nullptr);  // no port 2
  EXPECT_EQ(errno, EINVAL);
  // A PD with an address handle cannot go away.
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
}

TEST_F(Ud, OnlySendOperations) {
  ibv_sge sge = mem->sge(0, 8);
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = b.qpn();
  wr.wr.ud.remote_qkey = kQkey;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(a.qp, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
  wr.opcode = IBV_WR_RDMA_READ;
  EXPECT_EQ(ibv_post_send(a.qp, &wr, &bad), EINVAL);
  wr.opcode = IBV_WR_SEND;
  wr.wr.ud.ah = nullptr;
  EXPECT_EQ(ibv_post_send(a.qp, &wr, &bad), EINVAL);
}

TEST_F(Ud, QueryQpReturnsQkey) {
  ibv_qp_attr at{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(b.qp, &at, IBV_QP_QKEY | IBV_QP_STATE, &init), 0);
  EXPECT_EQ(at.qkey, kQkey);
  EXPECT_EQ(at.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(init.qp_type, IBV_QPT_UD);
  // UD's INIT needs the Q_Key; RC-only attributes are refused.
  UdQp c;
  c.pd = pd;
  c.scq = ibv_create_cq(dev.ctx, 8, nullptr, nullptr, 0);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = c.scq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  c.qp = ibv_create_qp(pd, &ia);
  ASSERT_NE(c.qp, nullptr);
  ibv_qp_attr m{};
  m.qp_state = IBV_QPS_INIT;
  m.port_num = kPort;
  EXPECT_EQ(ibv_modify_qp(c.qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);
  m.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  EXPECT_EQ(ibv_modify_qp(c.qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY |
                                        IBV_QP_ACCESS_FLAGS),
            EINVAL);
}

TEST_F(Ud, ExtendedQpSetsUdAddress) {
  ibv_qp_init_attr_ex ia{};
  ia.send_cq = a.scq;
  ia.recv_cq = a.rcq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap.max_send_wr = 4;
  ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ia.pd = pd;
  ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  ibv_qp* qp = ibv_create_qp_ex(dev.ctx, &ia);
  ASSERT_NE(qp, nullptr) << strerror(errno);
  ibv_qp_attr m{};
  m.qp_state = IBV_QPS_INIT;
  m.port_num = kPort;
  m.qkey = kQkey;
  ASSERT_EQ(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
  m.qp_state = IBV_QPS_RTR;
  ASSERT_EQ(ibv_modify_qp(qp, &m, IBV_QP_STATE), 0);
  m.qp_state = IBV_QPS_RTS;
  m.sq_psn = 1;
  ASSERT_EQ(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);

  ASSERT_EQ(recv(b, 77, 8192, kGrh + 256), 0);
  fill_pattern(mem->data, 99, 14);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(qp);
  ibv_wr_start(x);
  x->wr_id = 500;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send_imm(x, htonl(42));
  ibv_wr_set_ud_addr(x, ah, b.qpn(), kQkey);
  ibv_wr_set_sge(x, mem->lkey(), mem->addr(0), 99);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 500u);
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 77u);
  EXPECT_EQ(ntohl(wc.imm_data), 42u);
  EXPECT_EQ(wc.src_qp, qp->qp_num);
  EXPECT_EQ(check_pattern(mem->data + 8192 + kGrh, 99, 14), 99u);

  // Without an address the batch fails.
  ibv_wr_start(x);
  ibv_wr_send(x);
  ibv_wr_set_sge(x, mem->lkey(), mem->addr(0), 8);
  EXPECT_NE(ibv_wr_complete(x), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

TEST_F(Ud, ReceivesFromASharedReceiveQueue) {
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd, &sa);
  ASSERT_NE(srq, nullptr) << strerror(errno);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.srq = srq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap.max_send_wr = 1;
  ia.cap.max_send_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  ASSERT_NE(qp, nullptr) << strerror(errno);
  ibv_qp_attr m{};
  m.qp_state = IBV_QPS_INIT;
  m.port_num = kPort;
  m.qkey = kQkey;
  ASSERT_EQ(ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
  m.qp_state = IBV_QPS_RTR;
  ASSERT_EQ(ibv_modify_qp(qp, &m, IBV_QP_STATE), 0);

  for (uint64_t i = 0; i < 2; ++i) {
    ibv_sge sge = mem->sge(8192 + i * 2048, kGrh + 1024);
    ibv_recv_wr wr{};
    wr.wr_id = 900 + i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
  }
  for (uint32_t i = 0; i < 2; ++i) {
    send_ok(a, ah, qp->qp_num, kQkey, 100 + i, 20 + i, 600 + i);
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(cq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, 900u + i);
    EXPECT_EQ(wc.qp_num, qp->qp_num);
    EXPECT_EQ(wc.byte_len, kGrh + 100 + i);
    EXPECT_EQ(check_pattern(mem->data + 8192 + i * 2048 + kGrh, 100 + i, 20 + i), 100u + i);
  }
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST_F(Ud, MulticastReachesEveryAttachedQp) {
  // A group of its own per run (parallel runs on one host must not see each other's datagrams).
  ibv_gid group{};
  group.raw[10] = group.raw[11] = 0xFF;
  group.raw[12] = 239;
  group.raw[13] = 77;
  group.raw[14] = static_cast<uint8_t>(getpid() >> 8);
  group.raw[15] = static_cast<uint8_t>(getpid());
  UdQp c;
  ASSERT_TRUE(c.create(dev.ctx, pd));
  ASSERT_EQ(ibv_attach_mcast(b.qp, &group, 0), 0);
  ASSERT_EQ(ibv_attach_mcast(c.qp, &group, 0), 0);
  ibv_ah* mah = make_ah(group);
  ASSERT_NE(mah, nullptr);
  ASSERT_EQ(recv(b, 1, 8192, kGrh + 512), 0);
  ASSERT_EQ(recv(c, 2, 16384, kGrh + 512), 0);
  send_ok(a, mah, 0xFFFFFF, kQkey, 333, 30, 700);
  for (UdQp* q : {&b, &c}) {
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(q->rcq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.byte_len, kGrh + 333);
    EXPECT_EQ(wc.src_qp, a.qpn());
    EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
    const uint8_t* g = mem->data + (q == &b ? 8192 : 16384);
    EXPECT_EQ(check_pattern(g + kGrh, 333, 30), 333u);
    EXPECT_EQ(std::memcmp(g + 20 + 16, group.raw + 12, 4), 0) << "GRH destination is the group";
    EXPECT_EQ(std::memcmp(g + 20 + 12, dev.gid.raw + 12, 4), 0) << "GRH source is the sender";
  }
  // c leaves: the next datagram reaches b only (both copies arrive on one socket of this context, so
  // when b has its copy, c would have had one).
  ASSERT_EQ(ibv_detach_mcast(c.qp, &group, 0), 0);
  EXPECT_EQ(ibv_detach_mcast(c.qp, &group, 0), EINVAL);
  ASSERT_EQ(recv(b, 3, 8192, kGrh + 512), 0);
  ASSERT_EQ(recv(c, 4, 16384, kGrh + 512), 0);
  send_ok(a, mah, 0xFFFFFF, kQkey, 44, 31, 701);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  EXPECT_EQ(wc.wr_id, 3u);
  EXPECT_EQ(check_pattern(mem->data + 8192 + kGrh, 44, 31), 44u);
  EXPECT_EQ(drain_cq(c.rcq), 0);
  EXPECT_EQ(ibv_detach_mcast(b.qp, &group, 0), 0);
  EXPECT_EQ(ibv_destroy_ah(mah), 0);

  // Only UD QPs, only multicast GIDs, only groups of the device's family (an IPv6 group, ff0e::1,
  // is no IPv4 device's).
  EXPECT_EQ(ibv_attach_mcast(b.qp, &dev.gid, 0), EINVAL);
  ibv_gid group6{};
  group6.raw[0] = 0xFF;
  group6.raw[1] = 0x0E;
  group6.raw[15] = 1;
  EXPECT_EQ(ibv_attach_mcast(b.qp, &group6, 0), EINVAL);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = c.scq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* rc = ibv_create_qp(pd, &ia);
  ASSERT_NE(rc, nullptr);
  EXPECT_EQ(ibv_attach_mcast(rc, &group, 0), EINVAL);
  EXPECT_EQ(ibv_destroy_qp(rc), 0);
}

}  // namespace
}  // namespace softrdma::verbs_test
