// Hostile iWARP input at a live QP of an iWARP device (softrdma_iw_lo, opened by name; its
// progress thread running): the QP is attached through libibverbs' softrdma_iwarp_attach over a
// loopback TCP connection whose other end is a plain socket of this test, which writes crafted FPDUs
// (bad STag, TO out of bounds, bad CRC, bad MSN). Each gets one
// Terminate back with the RFC's codes, is counted in the stats page (what `softrdma stat` shows),
// moves the QP to ERROR with the async event RoCE raises for the class, and touches no memory.
// Every refusal, stepped deterministically (READ beyond IRD, Terminate received ...), is in
// tests/unit/transport/iwarp_input_test.cpp.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>

#include "hostile.h"
#include "verbs/private_abi.h"
#include "wire/iwarp.h"

namespace softrdma::hostile_test {
namespace {

namespace iw = wire::iwarp;
using C = core::Counters;

bool tcp_pair(int fds[2]) {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bool ok = l >= 0 && bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && listen(l, 1) == 0 &&
            getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  fds[0] = fds[1] = -1;
  if (ok) {
    fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ok = fds[0] >= 0 && connect(fds[0], reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  if (ok) fds[1] = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
  if (l >= 0) close(l);
  return ok && fds[1] >= 0;
}

class IwarpHostile : public ::testing::TestWithParam<bool> {  // MPA CRC on or off
 protected:
  void SetUp() override {
    // By name, whatever SOFTRDMA_TRANSPORT selects; the process's settings, as ibv_open_device.
    ctx_ = softrdma_open_device("softrdma_iw_lo", 0);
    ASSERT_NE(ctx_, nullptr) << "no softrdma_iw_lo";
    pd_ = ibv_alloc_pd(ctx_);
    cq_ = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
    ASSERT_TRUE(pd_ && cq_);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq_;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    qp_ = ibv_create_qp(pd_, &ia);
    ASSERT_NE(qp_, nullptr);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    ASSERT_EQ(ibv_modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS), 0);
    mem_ = std::make_unique<Buffer>(3 * 4096);
    ASSERT_TRUE(mem_->reg(pd_, a.qp_access_flags));
    fill_pattern(mem_->data, mem_->len, 7);
    int fds[2];
    ASSERT_TRUE(tcp_pair(fds));
    raw_ = fds[1];
    softrdma_iwarp_conn c{};
    c.fd = fds[0];
    c.flags = GetParam() ? SOFTRDMA_IW_CRC : 0;
    c.rtr = SOFTRDMA_IW_RTR_NONE;
    c.ird = 1;
    c.ord = 4;
    ASSERT_EQ(softrdma_iwarp_attach(qp_, &c), 0);
    close(fds[0]);  // libibverbs keeps its own dup
    ASSERT_TRUE(wait_qp_state(qp_, IBV_QPS_RTS));
    auto s = read_stats(qp_->qp_num);
    ASSERT_TRUE(s);
    before_ = *s;
  }
  void TearDown() override {
    if (qp_) ibv_destroy_qp(qp_);
    mem_.reset();
    if (cq_) ibv_destroy_cq(cq_);
    if (pd_) ibv_dealloc_pd(pd_);
    if (ctx_) ibv_close_device(ctx_);
    if (raw_ >= 0) close(raw_);
  }

  void send_ulpdu(const std::vector<uint8_t>& u, bool corrupt_crc = false) {
    iovec in{const_cast<uint8_t*>(u.data()), u.size()};
    std::vector<uint8_t> scratch(iw::FpduSender::scratch_len(u.size()));
    iovec out[iw::kFrameIov];
    const int n = tx_.frame(&in, 1, scratch.data(), out, iw::kFrameIov);
    std::vector<uint8_t> bytes;
    for (int i = 0; i < n; ++i) {
      auto* p = static_cast<const uint8_t*>(out[i].iov_base);
      bytes.insert(bytes.end(), p, p + out[i].iov_len);
    }
    if (corrupt_crc) bytes.back() ^= 1;
    ASSERT_EQ(write(raw_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  static std::vector<uint8_t> ulpdu(const iw::DdpHeader& h, const uint8_t* payload, size_t len) {
    std::vector<uint8_t> u(iw::kMaxHeaderLen);
    u.resize(iw::encode_header(h, u.data()));
    u.insert(u.end(), payload, payload + len);
    return u;
  }
  // Reads until the QP has ended the stream (bounded); returns the ULPDUs it sent.
  std::vector<std::vector<uint8_t>> read_until_eof() {
    std::vector<uint8_t> in;
    for (;;) {
      pollfd p{raw_, POLLIN, 0};
      if (poll(&p, 1, kWaitSeconds * 1000) <= 0) {
        ADD_FAILURE() << "no end of stream";
        break;
      }
      uint8_t buf[65536];
      const ssize_t n = read(raw_, buf, sizeof buf);
      if (n <= 0) break;
      in.insert(in.end(), buf, buf + n);
    }
    std::vector<std::vector<uint8_t>> out;
    size_t off = 0;
    for (;;) {
      iw::FpduReceiver::Fpdu f;
      if (rx_.next(in.data() + off, in.size() - off, nullptr, f) != iw::FpduReceiver::Status::Ok) break;
      out.emplace_back(f.ulpdu, f.ulpdu + f.ulpdu_len);
      off += f.consumed;
    }
    return out;
  }
  // The one Terminate, its codes, the counter, ERROR, the async event, the memory untouched.
  void expect_terminated(iw::TermLayer layer, uint8_t etype, uint8_t ecode, Counter counter, ibv_event_type ev) {
    auto ulpdus = read_until_eof();
    ASSERT_FALSE(ulpdus.empty());
    const auto& u = ulpdus.back();
    iw::DdpHeader h;
    iw::ParseError err{};
    const size_t hl = iw::parse_header(u.data(), u.size(), h, err);
    ASSERT_GT(hl, 0u);
    ASSERT_EQ(h.opcode, iw::Opcode::Terminate);
    iw::Terminate t;
    ASSERT_TRUE(iw::parse_terminate(u.data() + hl, u.size() - hl, t));
    EXPECT_EQ(t.layer, layer);
    EXPECT_EQ(t.etype, etype);
    EXPECT_EQ(t.ecode, ecode);
    EXPECT_TRUE(wait_qp_state(qp_, IBV_QPS_ERR));
    auto after = read_stats(qp_->qp_num);
    ASSERT_TRUE(after);
    EXPECT_EQ(get(after->qp, counter) - get(before_.qp, counter), 1u);
    EXPECT_EQ(after->qp.iw_terminate_sent - before_.qp.iw_terminate_sent, 1u);
    pollfd p{ctx_->async_fd, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, kWaitSeconds * 1000), 1) << "no async event";
    ibv_async_event e{};
    ASSERT_EQ(ibv_get_async_event(ctx_, &e), 0);
    EXPECT_EQ(e.event_type, ev);
    EXPECT_EQ(e.element.qp, qp_);
    ibv_ack_async_event(&e);
    EXPECT_EQ(check_pattern(mem_->data, mem_->len, 7), mem_->len) << "registered memory changed";
  }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  std::unique_ptr<Buffer> mem_;
  int raw_ = -1;
  Stats before_{};
  iw::FpduSender tx_{GetParam(), false};
  iw::FpduReceiver rx_{GetParam(), false};
};

iw::DdpHeader write_hdr(uint32_t stag, uint64_t to) {
  iw::DdpHeader h;
  h.tagged = true;
  h.last = true;
  h.opcode = iw::Opcode::Write;
  h.stag = stag;
  h.to = to;
  return h;
}

TEST_P(IwarpHostile, WriteWithBadStag) {
  uint8_t data[64] = {1};
  send_ulpdu(ulpdu(write_hdr(mem_->mr->rkey + 1, reinterpret_cast<uint64_t>(mem_->data)), data, 64));
  expect_terminated(iw::TermLayer::Ddp, iw::term::kDdpTagged, iw::term::kTInvalidStag, &C::iw_bad_stag,
                    IBV_EVENT_QP_ACCESS_ERR);
}

TEST_P(IwarpHostile, WriteBeyondTheRegion) {
  uint8_t data[64] = {1};
  send_ulpdu(ulpdu(write_hdr(mem_->mr->rkey, reinterpret_cast<uint64_t>(mem_->data) + mem_->len - 32), data, 64));
  expect_terminated(iw::TermLayer::Ddp, iw::term::kDdpTagged, iw::term::kTBaseBounds, &C::iw_bad_bounds,
                    IBV_EVENT_QP_ACCESS_ERR);
}

TEST_P(IwarpHostile, BadCrc) {
  if (!GetParam()) GTEST_SKIP() << "no CRC negotiated";
  uint8_t data[64] = {1};
  send_ulpdu(ulpdu(write_hdr(mem_->mr->rkey, reinterpret_cast<uint64_t>(mem_->data)), data, 64), true);
  expect_terminated(iw::TermLayer::Llp, iw::term::kLlpMpa, iw::term::kBadCrc, &C::iw_bad_crc, IBV_EVENT_QP_FATAL);
}

TEST_P(IwarpHostile, SendWithBadMsn) {
  ASSERT_EQ(post_recv(qp_, 1, {mem_->sge(0, 64)}), 0);
  iw::DdpHeader h;
  h.last = true;
  h.opcode = iw::Opcode::Send;
  h.qn = iw::kQnSend;
  h.msn = 7;  // 1 expected
  uint8_t data[8] = {};
  send_ulpdu(ulpdu(h, data, 8));
  expect_terminated(iw::TermLayer::Ddp, iw::term::kDdpUntagged, iw::term::kUtInvalidMsnRange, &C::iw_bad_msn,
                    IBV_EVENT_QP_REQ_ERR);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(cq_, &wc));
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
}

INSTANTIATE_TEST_SUITE_P(Crc, IwarpHostile, ::testing::Bool(),
                         [](const auto& i) { return std::string(i.param ? "crc" : "nocrc"); });

}  // namespace
}  // namespace softrdma::hostile_test
