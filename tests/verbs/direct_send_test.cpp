// Two processes on one host (the target forked before either opens a device): RC two-sided operations
// between them -- SEND, SEND_WITH_IMM and RDMA_WRITE_WITH_IMM consuming the target's receive WQEs, in
// order, with RNR, a receive buffer too small, a completion channel and messages past 64 KiB; each
// case twice, with the target's QP on its own receive queue and on an SRQ (as UCX's rc_verbs). Every
// case asserts what RC verbs promise (data byte by byte, receive CQE fields exactly), so it holds on
// real hardware and on both of softrdma's paths (packets, and the intra-host direct path of
// docs/direct-path.md).
//
// Which path was taken is checked through this process's stats page only where it is stated:
//  - "packets" (RNR, receive too small, > 64 KiB): whenever the stats page exists (not $VT_DEVICE);
//  - "direct" (SENDs into pre-posted receives): whenever the direct path is on (SOFTRDMA_DIRECT not "0").
// The target process does no assertions itself: it reports its CQEs and memory to the test process.
#include "two_process.h"

#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

namespace softrdma::verbs_test {
namespace {

constexpr size_t kRLen = 320 * 1024;  // the target's receive buffer (receive WQEs point into it)
constexpr size_t kWLen = 64 * 1024;   // the target's RDMA WRITE destination
constexpr size_t kSrcLen = 320 * 1024;
constexpr uint8_t kSentinel = 0xA5;  // R starts filled with it: bytes no message may touch keep it
constexpr uint32_t kWSeed = 31;      // W starts as this pattern
// A command reply may follow a target-side wait of kWaitSeconds: wait longer for it.
constexpr int kReplySeconds = 3 * kWaitSeconds;

struct Info {
  uint32_t qpn, psn, r_rkey, w_rkey;
  uint64_t r_addr, w_addr;
  uint8_t gid[16];
};

struct Cmd {
  char op = 0;
  uint32_t n = 0;         // receives to post / CQEs to wait for / messages
  uint32_t slots = 0;     // 'm': receive slots
  uint32_t delay_ms = 0;  // 'p': sleep before posting
  uint64_t wr_id = 0;     // 'p': first wr_id
  uint64_t off = 0;       // 'p': R offset of the first receive; 'w'/'c': W/region offset
  uint64_t len = 0;       // 'p': receive length (0: no SGE); 'w': W bytes to snapshot; 'c': bytes
  uint64_t stride = 0;    // 'p': R distance between receives; 'm': slot size; 'c': 0 = R, 1 = W
};

// A record of the completion-channel command: code 0 with a CQE, or 1 when no wake-up came.
struct NotifyRecord {
  int32_t code;
  ibv_wc wc;
};

// Every read from the other process here, on either side, may wait up to kReplySeconds.
bool read_reply(int fd, void* p, size_t n) { return read_full(fd, p, n, kReplySeconds); }

// One CQE within timeout_s (no gtest failure: the target reports, the test process asserts).
bool poll_one(ibv_cq* cq, ibv_wc* wc, int timeout_s = kWaitSeconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (unsigned spins = 0;; ++spins) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n == 1) return true;
    if (n < 0 || std::chrono::steady_clock::now() > deadline) return false;
    if (spins < 1000)
      sched_yield();
    else
      usleep(100);
  }
}

// The target's QP takes its receive WQEs from its own receive queue, or from an SRQ.
enum class RecvQueue { Rq, Srq };

// The target: registers R and W, connects, then obeys commands until 'x'. Returns the exit status.
int serve(int sock, Device& dev, ibv_comp_channel* ch, RecvQueue rq) {
  QpConfig qc;
  qc.recv_channel = ch;
  qc.srq_wr = rq == RecvQueue::Srq ? 1024 : 0;
  qc.max_recv_wr = 1024;
  qc.recv_cqe = 1024;
  Side s;
  if (!s.create(dev, qc)) return 12;
  auto r = s.buf(kRLen);
  auto w = s.buf(kWLen);
  if (!r->mr || !w->mr) return 13;
  std::memset(r->data, kSentinel, kRLen);
  fill_pattern(w->data, kWLen, kWSeed);
  if (modify_to_init(s.qp, kAllAccess)) return 14;
  Info peer{};
  if (int rc = serve_connect(sock, dev, s, Info{s.qpn(), s.psn, r->rkey(), w->rkey(), r->addr(), w->addr(), {}},
                             peer, 15, kReplySeconds))
    return rc;
  auto post = [&](uint64_t wr_id, uint64_t off, uint64_t len) {
    if (off + len > kRLen) return EINVAL;
    std::vector<ibv_sge> sges;
    if (len) sges.push_back(r->sge(off, uint32_t(len)));
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = sges.empty() ? nullptr : sges.data();
    wr.num_sge = int(sges.size());
    ibv_recv_wr* bad = nullptr;
    return s.srq ? ibv_post_srq_recv(s.srq, &wr, &bad) : ibv_post_recv(s.qp, &wr, &bad);
  };
  for (;;) {
    Cmd cmd;
    if (!read_reply(sock, &cmd, sizeof cmd)) return 17;
    switch (cmd.op) {
      case 'p': {  // post n receives
        if (cmd.delay_ms) usleep(cmd.delay_ms * 1000);
        int32_t rc = 0;
        for (uint32_t i = 0; i < cmd.n && !rc; ++i) rc = post(cmd.wr_id + i, cmd.off + i * cmd.stride, cmd.len);
        if (!write_full(sock, &rc, sizeof rc)) return 18;
        break;
      }
      case 'w': {  // wait for n receive CQEs, one at a time, snapshotting W after each
        if (cmd.off + cmd.len > kWLen) return 19;
        std::vector<ibv_wc> wcs;
        std::vector<uint8_t> snaps;
        ibv_wc wc{};
        while (wcs.size() < cmd.n && poll_one(s.rcq, &wc)) {
          wcs.push_back(wc);
          snaps.insert(snaps.end(), w->data + cmd.off, w->data + cmd.off + cmd.len);
        }
        uint32_t got = uint32_t(wcs.size());
        if (!write_full(sock, &got, sizeof got) || !write_full(sock, wcs.data(), got * sizeof(ibv_wc)) ||
            !write_full(sock, snaps.data(), snaps.size()))
          return 20;
        break;
      }
      case 'e': {  // the receive CQEs there right now
        std::vector<ibv_wc> wcs;
        ibv_wc wc{};
        while (ibv_poll_cq(s.rcq, 1, &wc) == 1) wcs.push_back(wc);
        uint32_t got = uint32_t(wcs.size());
        if (!write_full(sock, &got, sizeof got) || !write_full(sock, wcs.data(), got * sizeof(ibv_wc))) return 21;
        break;
      }
      case 'c': {  // contents of R (stride 0) or W (stride 1)
        const Buffer& b = cmd.stride ? *w : *r;
        if (cmd.off + cmd.len > b.len) return 22;
        if (!write_full(sock, b.data + cmd.off, cmd.len)) return 22;
        break;
      }
      case 'm': {  // n messages into `slots` receive slots of `stride` bytes, re-posted as consumed;
                   // replies once the first receives are posted, then at the end
        if (!cmd.slots || uint64_t(cmd.slots) * cmd.stride > kRLen) return 23;
        uint32_t posted = 0;
        int rc = 0;
        for (uint32_t i = 0; i < cmd.slots && posted < cmd.n && !rc; ++i, ++posted) rc = post(i, i * cmd.stride, cmd.stride);
        if (rc) return 23;
        int32_t ack = 0;  // the first receives are posted: the SENDs may start
        if (!write_full(sock, &ack, sizeof ack)) return 24;
        std::vector<ibv_wc> wcs;
        std::vector<uint8_t> data;
        ibv_wc wc{};
        while (wcs.size() < cmd.n && poll_one(s.rcq, &wc)) {
          wcs.push_back(wc);
          if (wc.status != IBV_WC_SUCCESS || wc.wr_id >= cmd.slots || wc.byte_len > cmd.stride) break;
          const uint8_t* p = r->data + wc.wr_id * cmd.stride;
          data.insert(data.end(), p, p + wc.byte_len);  // before the slot is posted again
          if (posted < cmd.n) {
            if (post(wc.wr_id, wc.wr_id * cmd.stride, cmd.stride)) break;
            ++posted;
          }
        }
        uint32_t got = uint32_t(wcs.size());
        uint64_t bytes = data.size();
        if (!write_full(sock, &got, sizeof got) || !write_full(sock, wcs.data(), got * sizeof(ibv_wc)) ||
            !write_full(sock, &bytes, sizeof bytes) || !write_full(sock, data.data(), bytes))
          return 24;
        break;
      }
      case 'n': {  // n receive CQEs through the completion channel: arm, drain, wait, get, ack, arm...
        uint32_t events = 0, got = 0;
        bool armed = ibv_req_notify_cq(s.rcq, 0) == 0;
        while (armed && got < cmd.n) {
          NotifyRecord rec{};
          while (got < cmd.n && ibv_poll_cq(s.rcq, 1, &rec.wc) == 1) {
            ++got;
            if (!write_full(sock, &rec, sizeof rec)) return 25;
          }
          if (got >= cmd.n) break;
          pollfd pf{ch->fd, POLLIN, 0};
          if (poll(&pf, 1, kWaitSeconds * 1000) != 1) {
            rec.code = 1;  // a CQE never woke us
            if (!write_full(sock, &rec, sizeof rec)) return 25;
            break;
          }
          ibv_cq* ev_cq = nullptr;
          void* ev_ctx = nullptr;
          if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) || ev_cq != s.rcq) return 26;
          ++events;
          ibv_ack_cq_events(ev_cq, 1);
          armed = ibv_req_notify_cq(s.rcq, 0) == 0;
        }
        if (!armed) return 27;
        if (!write_full(sock, &events, sizeof events)) return 25;
        break;
      }
      case 'f': {  // move the QP to the error state, without polling first
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_ERR;
        int32_t rc = ibv_modify_qp(s.qp, &a, IBV_QP_STATE);
        if (!write_full(sock, &rc, sizeof rc)) return 29;
        break;
      }
      case 'x':
        return 0;
      default:
        return 28;
    }
  }
}

template <RecvQueue rq>
int target_main(int sock) {
  Device dev;
  if (!dev.ok()) return 10;
  ibv_comp_channel* ch = ibv_create_comp_channel(dev.ctx);
  if (!ch) return 11;
  int rc = serve(sock, dev, ch, rq);  // its CQs are gone before the channel
  ibv_destroy_comp_channel(ch);
  return rc;
}

// softrdma's stats page is there to read (not another provider under $VT_DEVICE).
bool stats_available() { return getenv("VT_DEVICE") == nullptr; }

// PATH ASSERTION SWITCH: SENDs, SEND_WITH_IMMs and WRITE_WITH_IMMs are expected on the direct path when
// it is on (SOFTRDMA_DIRECT not "0", no SOFTRDMA_IMPAIR unless SOFTRDMA_DIRECT=1), as in direct_test.cpp.
bool direct_send_expected() {
  if (!stats_available()) return false;
  const char* s = getenv("SOFTRDMA_DIRECT");
  return s ? std::strcmp(s, "0") != 0 : getenv("SOFTRDMA_IMPAIR") == nullptr;
}

struct PathProbe {
  uint64_t ops = 0, tx = 0;
};
PathProbe probe() { return {my_counter(&core::Counters::direct_ops), my_counter(&core::Counters::tx_packets)}; }

// PATH ASSERTION: at least `ops` operations went by the direct path since `before`; with
// `no_packets`, this process sent no packet either.
void expect_direct(const PathProbe& before, uint64_t ops, bool no_packets) {
  if (!direct_send_expected()) return;
  PathProbe now = probe();
  EXPECT_GE(now.ops - before.ops, ops) << "operations on the direct path";
  if (no_packets) {
    EXPECT_EQ(now.tx, before.tx) << "packets sent where everything should be direct";
  }
}

// PATH ASSERTION: what can only be done by packets was (RNR, receive too small, > 64 KiB).
void expect_packets(const PathProbe& before) {
  if (!stats_available()) return;
  EXPECT_GT(probe().tx, before.tx) << "this case goes by packets";
}

class DirectSend : public ForkedTarget, public ::testing::WithParamInterface<RecvQueue> {
 protected:
  DirectSend()
      : ForkedTarget(GetParam() == RecvQueue::Srq ? target_main<RecvQueue::Srq> : target_main<RecvQueue::Rq>,
                     kReplySeconds) {}
  bool on_srq() const { return GetParam() == RecvQueue::Srq; }

  Info peer{};
  std::unique_ptr<Device> dev;
  Side s;
  std::unique_ptr<Buffer> src;
  ConnConfig conn;  // ours; the target uses the defaults (rnr_retry 7)
  QpConfig qcfg;

  void TearDown() override {
    src.reset();  // MRs before their PD
    s.reset();
    dev.reset();
    Cmd x;  // the target reads whole commands
    x.op = 'x';
    stop_target(&x, sizeof x);
  }

  // Opens our side and connects it to the target's QP.
  void connect() {
    dev = std::make_unique<Device>();
    ASSERT_TRUE(dev->ok());
    ASSERT_TRUE(s.create(*dev, qcfg));
    src = s.buf(kSrcLen);
    ASSERT_TRUE(src->mr);
    ASSERT_EQ(modify_to_init(s.qp, kAllAccess), 0);
    ASSERT_NO_FATAL_FAILURE(connect_target(Info{s.qpn(), s.psn, 0, 0, 0, 0, {}}, peer, s, *dev, conn));
  }

  void send_cmd(const Cmd& c) { ASSERT_TRUE(write_full(sock, &c, sizeof c)); }

  // Target: post n receives wr_id, wr_id+1, ... at R+off, R+off+stride, ... of len bytes each.
  Cmd recv_cmd(uint32_t n, uint64_t wr_id, uint64_t off, uint64_t len, uint64_t stride = 0, uint32_t delay_ms = 0) {
    Cmd c;
    c.op = 'p';
    c.n = n;
    c.wr_id = wr_id;
    c.off = off;
    c.len = len;
    c.stride = stride;
    c.delay_ms = delay_ms;
    return c;
  }
  void recv_ack() {
    int32_t rc = -1;
    ASSERT_TRUE(read_reply(sock, &rc, sizeof rc)) << "no reply to the post-receive command";
    ASSERT_EQ(rc, 0) << "target's ibv_post_recv failed";
  }
  void post_recvs(uint32_t n, uint64_t wr_id, uint64_t off, uint64_t len, uint64_t stride = 0) {
    ASSERT_NO_FATAL_FAILURE(send_cmd(recv_cmd(n, wr_id, off, len, stride)));
    ASSERT_NO_FATAL_FAILURE(recv_ack());
  }

  // Target: wait for n receive CQEs (fewer only on a timeout there); `snaps` gets W[off, off+len)
  // as it was right after each CQE was polled.
  std::vector<ibv_wc> wait_recvs(uint32_t n, uint64_t off = 0, uint64_t len = 0,
                                 std::vector<std::vector<uint8_t>>* snaps = nullptr) {
    Cmd c;
    c.op = 'w';
    c.n = n;
    c.off = off;
    c.len = len;
    EXPECT_TRUE(write_full(sock, &c, sizeof c));
    uint32_t got = 0;
    if (!read_reply(sock, &got, sizeof got) || got > n) {
      ADD_FAILURE() << "no reply to the wait command";
      return {};
    }
    std::vector<ibv_wc> wcs(got);
    EXPECT_TRUE(read_reply(sock, wcs.data(), got * sizeof(ibv_wc)));
    for (uint32_t i = 0; i < got; ++i) {
      std::vector<uint8_t> snap(len);
      EXPECT_TRUE(read_reply(sock, snap.data(), len));
      if (snaps) snaps->push_back(std::move(snap));
    }
    EXPECT_EQ(got, n) << "receive completions at the target within " << kWaitSeconds << " s";
    return wcs;
  }

  // Target: the receive CQEs available now.
  std::vector<ibv_wc> drain_recvs() {
    Cmd c;
    c.op = 'e';
    EXPECT_TRUE(write_full(sock, &c, sizeof c));
    uint32_t got = 0;
    if (!read_reply(sock, &got, sizeof got) || got > 1024) {
      ADD_FAILURE() << "no reply to the drain command";
      return {};
    }
    std::vector<ibv_wc> wcs(got);
    EXPECT_TRUE(read_reply(sock, wcs.data(), got * sizeof(ibv_wc)));
    return wcs;
  }

  // Target memory: R (w = false) or W (w = true), [off, off+len).
  std::vector<uint8_t> region(bool w, uint64_t off, uint64_t len) {
    Cmd c;
    c.op = 'c';
    c.off = off;
    c.len = len;
    c.stride = w;
    std::vector<uint8_t> out(len);
    EXPECT_TRUE(write_full(sock, &c, sizeof c));
    EXPECT_TRUE(read_reply(sock, out.data(), len)) << "no reply to the contents command";
    return out;
  }

  // A successful receive CQE, every field that RC defines.
  void expect_recv(const ibv_wc& wc, uint64_t wr_id, ibv_wc_opcode opcode, uint32_t byte_len,
                   std::optional<uint32_t> imm = std::nullopt) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "wr_id " << wc.wr_id << ": " << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, wr_id);
    EXPECT_EQ(wc.opcode, opcode) << "wr_id " << wc.wr_id;
    EXPECT_EQ(wc.byte_len, byte_len) << "wr_id " << wc.wr_id;
    EXPECT_EQ(wc.wc_flags, imm ? unsigned(IBV_WC_WITH_IMM) : 0u) << "wr_id " << wc.wr_id;
    if (imm) {
      EXPECT_EQ(ntohl(wc.imm_data), *imm) << "wr_id " << wc.wr_id;
    }
    EXPECT_EQ(wc.qp_num, peer.qpn) << "wr_id " << wc.wr_id;
    EXPECT_EQ(wc.src_qp, s.qpn()) << "wr_id " << wc.wr_id;
  }

  void expect_sent(const ibv_wc& wc, uint64_t wr_id, ibv_wc_opcode opcode) {
    expect_wc(wc, {.wr_id = wr_id, .opcode = opcode, .qp_num = s.qpn()});
  }

  // Polls exactly n send CQEs in order: wr_ids first, first+1, ...
  void expect_sends(std::initializer_list<std::pair<uint64_t, ibv_wc_opcode>> want) {
    auto wcs = poll_wcs(s.scq, want.size());
    ASSERT_EQ(wcs.size(), want.size());
    size_t i = 0;
    for (auto& [id, op] : want) expect_sent(wcs[i++], id, op);
  }
};

// Bytes [from, to) of `v` are all kSentinel (never written).
size_t first_not_sentinel(const std::vector<uint8_t>& v, size_t from, size_t to) {
  for (size_t i = from; i < to; ++i)
    if (v[i] != kSentinel) return i;
  return to;
}

TEST_P(DirectSend, SendsOfSeveralSizesArriveIntact) {
  ASSERT_NO_FATAL_FAILURE(connect());
  const uint32_t sizes[] = {0, 1, 8, 4096, 60 * 1024};
  constexpr size_t kStride = 64 * 1024, kRecvLen = 62 * 1024;
  ASSERT_NO_FATAL_FAILURE(post_recvs(5, 100, 0, kRecvLen, kStride));
  const PathProbe before = probe();
  for (uint32_t i = 0; i < 5; ++i) {
    fill_pattern(src->data + i * kStride, sizes[i], 100 + i);
    std::vector<ibv_sge> sges;
    if (sizes[i] > 1000)  // the big ones gathered from two SGEs
      sges = {src->sge(i * kStride, 1000), src->sge(i * kStride + 1000, sizes[i] - 1000)};
    else if (sizes[i])
      sges = {src->sge(i * kStride, sizes[i])};
    SendWr w(i, IBV_WR_SEND, sges);
    ASSERT_EQ(post_send(s.qp, w), 0) << "size " << sizes[i];
  }
  ASSERT_NO_FATAL_FAILURE(expect_sends(
      {{0, IBV_WC_SEND}, {1, IBV_WC_SEND}, {2, IBV_WC_SEND}, {3, IBV_WC_SEND}, {4, IBV_WC_SEND}}));
  auto wcs = wait_recvs(5);
  ASSERT_EQ(wcs.size(), 5u);
  for (uint32_t i = 0; i < 5; ++i) expect_recv(wcs[i], 100 + i, IBV_WC_RECV, sizes[i]);
  auto r = region(false, 0, kRLen);
  for (uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(check_pattern(r.data() + i * kStride, sizes[i], 100 + i), sizes[i]) << "message of " << sizes[i];
    EXPECT_EQ(first_not_sentinel(r, i * kStride + sizes[i], (i + 1) * kStride), (i + 1) * kStride)
        << "written past the message of " << sizes[i];
  }
  expect_direct(before, 5, true);  // PATH ASSERTION
}

TEST_P(DirectSend, SendWithImmCarriesImmediate) {
  ASSERT_NO_FATAL_FAILURE(connect());
  ASSERT_NO_FATAL_FAILURE(post_recvs(3, 10, 0, 4096, 4096));
  const PathProbe before = probe();
  fill_pattern(src->data, 1000, 51);
  fill_pattern(src->data + 4096, 4096, 52);
  SendWr a(1, IBV_WR_SEND_WITH_IMM, {src->sge(0, 1000)});
  a.imm(0xdeadbeef);
  SendWr b(2, IBV_WR_SEND_WITH_IMM, {});
  b.imm(0);  // zero is an immediate too: the flag says it is there
  SendWr c(3, IBV_WR_SEND_WITH_IMM, {src->sge(4096, 4096)});
  c.imm(0x01020304);
  ASSERT_EQ(post_send(s.qp, a), 0);
  ASSERT_EQ(post_send(s.qp, b), 0);
  ASSERT_EQ(post_send(s.qp, c), 0);
  ASSERT_NO_FATAL_FAILURE(expect_sends({{1, IBV_WC_SEND}, {2, IBV_WC_SEND}, {3, IBV_WC_SEND}}));
  auto wcs = wait_recvs(3);
  ASSERT_EQ(wcs.size(), 3u);
  expect_recv(wcs[0], 10, IBV_WC_RECV, 1000, 0xdeadbeef);
  expect_recv(wcs[1], 11, IBV_WC_RECV, 0, 0);
  expect_recv(wcs[2], 12, IBV_WC_RECV, 4096, 0x01020304);
  auto r = region(false, 0, 3 * 4096);
  EXPECT_EQ(check_pattern(r.data(), 1000, 51), 1000u);
  EXPECT_EQ(first_not_sentinel(r, 1000, 2 * 4096), 2u * 4096) << "bytes past the first message, and the empty one";
  EXPECT_EQ(check_pattern(r.data() + 2 * 4096, 4096, 52), 4096u);
  expect_direct(before, 3, true);  // PATH ASSERTION
}

TEST_P(DirectSend, WriteWithImmPlacesDataAndConsumesReceive) {
  ASSERT_NO_FATAL_FAILURE(connect());
  ASSERT_NO_FATAL_FAILURE(post_recvs(1, 20, 0, 4096));
  ASSERT_NO_FATAL_FAILURE(post_recvs(1, 21, 0, 0));  // no SGE: enough for a WRITE_WITH_IMM
  const PathProbe before = probe();
  constexpr size_t kOff = 100, kLen = 3000;
  fill_pattern(src->data, kLen, 41);
  SendWr w(1, IBV_WR_RDMA_WRITE_WITH_IMM, {src->sge(0, 1200), src->sge(1200, kLen - 1200)});
  w.rdma(peer.w_addr + kOff, peer.w_rkey).imm(0x12345678);
  SendWr z(2, IBV_WR_RDMA_WRITE_WITH_IMM, {});
  z.rdma(peer.w_addr, peer.w_rkey).imm(7);
  ASSERT_EQ(post_send(s.qp, w), 0);
  ASSERT_EQ(post_send(s.qp, z), 0);
  ASSERT_NO_FATAL_FAILURE(expect_sends({{1, IBV_WC_RDMA_WRITE}, {2, IBV_WC_RDMA_WRITE}}));
  std::vector<std::vector<uint8_t>> snaps;
  auto wcs = wait_recvs(2, 0, kWLen, &snaps);
  ASSERT_EQ(wcs.size(), 2u);
  expect_recv(wcs[0], 20, IBV_WC_RECV_RDMA_WITH_IMM, kLen, 0x12345678);
  expect_recv(wcs[1], 21, IBV_WC_RECV_RDMA_WITH_IMM, 0, 7);
  const auto& m = snaps[0];  // W as the first receive CQE was polled: the data is there
  EXPECT_EQ(check_pattern(m.data(), kOff, kWSeed), kOff) << "bytes before the WRITE";
  EXPECT_EQ(check_pattern(m.data() + kOff, kLen, 41), kLen);
  EXPECT_EQ(check_pattern(m.data() + kOff + kLen, kWLen - kOff - kLen, kWSeed, kOff + kLen), kWLen - kOff - kLen)
      << "bytes after the WRITE";
  EXPECT_EQ(snaps[1], snaps[0]) << "the empty WRITE_WITH_IMM changed memory";
  auto r = region(false, 0, 8192);
  EXPECT_EQ(first_not_sentinel(r, 0, r.size()), r.size()) << "a WRITE_WITH_IMM wrote into the receive buffer";
  expect_direct(before, 2, true);  // PATH ASSERTION
}

// More messages than a 64-entry ring, > 64 KiB in all, while the target re-posts receives as it goes.
TEST_P(DirectSend, ManySendsArriveInOrder) {
  ASSERT_NO_FATAL_FAILURE(connect());
  constexpr uint32_t kN = 500, kSlots = 64, kSlotLen = 3072, kSrcSlots = 100;
  auto size_of = [](uint32_t k) { return 4 + (k * 977 + 13) % 2997; };  // 4..3000 bytes
  Cmd m;
  m.op = 'm';
  m.n = kN;
  m.slots = kSlots;
  m.stride = kSlotLen;
  ASSERT_NO_FATAL_FAILURE(send_cmd(m));
  ASSERT_NO_FATAL_FAILURE(recv_ack());  // the first kSlots receives are posted
  const PathProbe before = probe();
  uint32_t completed = 0;
  auto reap = [&]() {
    ibv_wc wc{};
    if (!poll_wc(s.scq, &wc)) return false;
    expect_sent(wc, completed, IBV_WC_SEND);
    ++completed;
    return wc.status == IBV_WC_SUCCESS;
  };
  uint64_t total = 0;
  for (uint32_t k = 0; k < kN; ++k) {
    // A source slot is reused only once the SEND that used it has completed.
    while (k - completed >= kSrcSlots) ASSERT_TRUE(reap()) << "SEND " << completed;
    uint8_t* p = src->data + (k % kSrcSlots) * kSlotLen;
    std::memcpy(p, &k, 4);
    fill_pattern(p + 4, size_of(k) - 4, 1000 + k, 4);
    SendWr w(k, IBV_WR_SEND, {src->sge((k % kSrcSlots) * kSlotLen, size_of(k))});
    ASSERT_EQ(post_send(s.qp, w), 0) << "SEND " << k;
    total += size_of(k);
  }
  ASSERT_GT(total, 64u * 1024);
  while (completed < kN) ASSERT_TRUE(reap()) << "SEND " << completed;

  uint32_t got = 0;
  ASSERT_TRUE(read_reply(sock, &got, sizeof got)) << "no reply to the many-messages command";
  ASSERT_LE(got, kN);
  std::vector<ibv_wc> wcs(got);
  ASSERT_TRUE(read_reply(sock, wcs.data(), got * sizeof(ibv_wc)));
  uint64_t bytes = 0;
  ASSERT_TRUE(read_reply(sock, &bytes, sizeof bytes));
  ASSERT_LE(bytes, uint64_t(kN) * kSlotLen);
  std::vector<uint8_t> data(bytes);
  ASSERT_TRUE(read_reply(sock, data.data(), bytes));
  ASSERT_EQ(got, kN) << "receive completions at the target";
  size_t at = 0;
  for (uint32_t k = 0; k < kN; ++k) {
    // Receive WQEs are consumed in order: slot k % kSlots, posted again right after its CQE.
    expect_recv(wcs[k], k % kSlots, IBV_WC_RECV, size_of(k));
    if (HasFailure()) FAIL() << "at message " << k;
    ASSERT_LE(at + size_of(k), data.size());
    uint32_t seq = 0;
    std::memcpy(&seq, data.data() + at, 4);
    ASSERT_EQ(seq, k) << "messages out of order";
    ASSERT_EQ(check_pattern(data.data() + at + 4, size_of(k) - 4, 1000 + k, 4), size_of(k) - 4u)
        << "message " << k;
    at += size_of(k);
  }
  EXPECT_EQ(at, data.size());
  // PATH ASSERTION: at least the first SEND (its receive was posted); later ones may meet an RNR
  // when the target lags in re-posting, and those go by packets.
  expect_direct(before, 1, false);
}

// Receive CQEs come in post order across SEND, WRITE, SEND_WITH_IMM, WRITE_WITH_IMM, and an earlier
// WRITE's data is in place when a later receive CQE is polled.
TEST_P(DirectSend, MixedOperationsCompleteInPostOrder) {
  ASSERT_NO_FATAL_FAILURE(connect());
  ASSERT_NO_FATAL_FAILURE(post_recvs(3, 50, 0, 4096, 4096));
  const PathProbe before = probe();
  fill_pattern(src->data, 100, 61);
  fill_pattern(src->data + 4096, 2000, 62);
  fill_pattern(src->data + 8192, 300, 63);
  fill_pattern(src->data + 12288, 1000, 64);
  SendWr a(1, IBV_WR_SEND, {src->sge(0, 100)});
  SendWr b(2, IBV_WR_RDMA_WRITE, {src->sge(4096, 2000)});
  b.rdma(peer.w_addr, peer.w_rkey);
  SendWr c(3, IBV_WR_SEND_WITH_IMM, {src->sge(8192, 300)});
  c.imm(0xC);
  SendWr d(4, IBV_WR_RDMA_WRITE_WITH_IMM, {src->sge(12288, 1000)});
  d.rdma(peer.w_addr + 8192, peer.w_rkey).imm(0xD);
  for (SendWr* w : {&a, &b, &c, &d}) ASSERT_EQ(post_send(s.qp, *w), 0) << "wr " << w->wr.wr_id;
  ASSERT_NO_FATAL_FAILURE(
      expect_sends({{1, IBV_WC_SEND}, {2, IBV_WC_RDMA_WRITE}, {3, IBV_WC_SEND}, {4, IBV_WC_RDMA_WRITE}}));
  std::vector<std::vector<uint8_t>> snaps;
  auto wcs = wait_recvs(3, 0, 12288, &snaps);
  ASSERT_EQ(wcs.size(), 3u);
  expect_recv(wcs[0], 50, IBV_WC_RECV, 100);
  expect_recv(wcs[1], 51, IBV_WC_RECV, 300, 0xC);
  expect_recv(wcs[2], 52, IBV_WC_RECV_RDMA_WITH_IMM, 1000, 0xD);
  EXPECT_EQ(check_pattern(snaps[1].data(), 2000, 62), 2000u) << "the WRITE before the SEND_WITH_IMM";
  EXPECT_EQ(check_pattern(snaps[2].data(), 2000, 62), 2000u);
  EXPECT_EQ(check_pattern(snaps[2].data() + 8192, 1000, 64), 1000u) << "the WRITE_WITH_IMM's own data";
  EXPECT_EQ(check_pattern(snaps[2].data() + 2000, 8192 - 2000, kWSeed, 2000), 8192u - 2000) << "W between";
  auto r = region(false, 0, 3 * 4096);
  EXPECT_EQ(check_pattern(r.data(), 100, 61), 100u);
  EXPECT_EQ(first_not_sentinel(r, 100, 4096), 4096u);
  EXPECT_EQ(check_pattern(r.data() + 4096, 300, 63), 300u);
  EXPECT_EQ(first_not_sentinel(r, 4096 + 300, 3 * 4096), 3u * 4096) << "incl. the WRITE_WITH_IMM's receive buffer";
  expect_direct(before, 4, true);  // PATH ASSERTION
}

// No receive WQE when the SEND arrives: RNR NAKs, retried without limit (rnr_retry 7), until the
// target posts one ~100 ms later.
TEST_P(DirectSend, SendWaitsForLateReceiveWithInfiniteRnrRetry) {
  conn.rnr_retry = 7;
  ASSERT_NO_FATAL_FAILURE(connect());
  const PathProbe before = probe();
  fill_pattern(src->data, 2500, 71);
  SendWr w(1, IBV_WR_SEND_WITH_IMM, {src->sge(0, 2500)});
  w.imm(71);
  ASSERT_EQ(post_send(s.qp, w), 0);
  ASSERT_NO_FATAL_FAILURE(send_cmd(recv_cmd(1, 70, 0, 4096, 0, 100)));
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(s.scq, &wc));
  expect_sent(wc, 1, IBV_WC_SEND);
  ASSERT_NO_FATAL_FAILURE(recv_ack());
  auto wcs = wait_recvs(1);
  ASSERT_EQ(wcs.size(), 1u);
  expect_recv(wcs[0], 70, IBV_WC_RECV, 2500, 71);
  auto r = region(false, 0, 8192);
  EXPECT_EQ(check_pattern(r.data(), 2500, 71), 2500u);
  EXPECT_EQ(first_not_sentinel(r, 2500, r.size()), r.size());
  // And the connection goes on: a SEND into a posted receive.
  ASSERT_NO_FATAL_FAILURE(post_recvs(1, 72, 4096, 4096));
  fill_pattern(src->data + 4096, 10, 72);
  SendWr w2(2, IBV_WR_SEND, {src->sge(4096, 10)});
  ASSERT_EQ(post_send(s.qp, w2), 0);
  ASSERT_TRUE(poll_wc(s.scq, &wc));
  expect_sent(wc, 2, IBV_WC_SEND);
  wcs = wait_recvs(1);
  ASSERT_EQ(wcs.size(), 1u);
  expect_recv(wcs[0], 72, IBV_WC_RECV, 10);
  r = region(false, 4096, 10);
  EXPECT_EQ(check_pattern(r.data(), 10, 72), 10u);
  expect_packets(before);  // PATH ASSERTION: the RNR exchange
}

TEST_P(DirectSend, SendWithoutReceiveIsRnrRetryExceeded) {
  conn.rnr_retry = 0;
  ASSERT_NO_FATAL_FAILURE(connect());
  const PathProbe before = probe();
  fill_pattern(src->data, 64, 81);
  SendWr w(1, IBV_WR_SEND, {src->sge(0, 64)});
  ASSERT_EQ(post_send(s.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(s.scq, &wc));
  expect_wc(wc, {.wr_id = 1, .status = IBV_WC_RNR_RETRY_EXC_ERR, .qp_num = s.qpn()});
  EXPECT_TRUE(wait_qp_state(s.qp, IBV_QPS_ERR));
  EXPECT_TRUE(drain_recvs().empty()) << "a receive CQE at the target without a receive WQE";
  auto r = region(false, 0, 4096);
  EXPECT_EQ(first_not_sentinel(r, 0, r.size()), r.size());
  expect_packets(before);  // PATH ASSERTION
}

// A message longer than the receive WQE: the sender gets REM_INV_REQ_ERR, the receive completes with
// LOC_LEN_ERR, and nothing is written past the receive buffer.
TEST_P(DirectSend, ReceiveTooSmallIsLengthError) {
  ASSERT_NO_FATAL_FAILURE(connect());
  constexpr size_t kRecvOff = 4096, kRecvLen = 2000, kSendLen = 3000;
  ASSERT_NO_FATAL_FAILURE(post_recvs(1, 90, kRecvOff, kRecvLen));
  const PathProbe before = probe();
  fill_pattern(src->data, kSendLen, 91);
  SendWr w(1, IBV_WR_SEND, {src->sge(0, kSendLen)});
  ASSERT_EQ(post_send(s.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(s.scq, &wc));
  expect_wc(wc, {.wr_id = 1, .status = IBV_WC_REM_INV_REQ_ERR, .qp_num = s.qpn()});
  auto wcs = wait_recvs(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_LOC_LEN_ERR) << ibv_wc_status_str(wcs[0].status);
  EXPECT_EQ(wcs[0].wr_id, 90u);
  EXPECT_EQ(wcs[0].qp_num, peer.qpn);
  auto r = region(false, 0, 3 * 4096);
  EXPECT_EQ(first_not_sentinel(r, 0, kRecvOff), kRecvOff) << "written before the receive buffer";
  EXPECT_EQ(first_not_sentinel(r, kRecvOff + kRecvLen, r.size()), r.size()) << "written past the receive buffer";
  expect_packets(before);  // PATH ASSERTION
}

// The target sleeps on its receive CQ's completion channel and each SEND wakes it.
TEST_P(DirectSend, CompletionChannelWakesTargetForEachSend) {
  ASSERT_NO_FATAL_FAILURE(connect());
  constexpr uint32_t kN = 20, kStride = 512;
  ASSERT_NO_FATAL_FAILURE(post_recvs(kN, 200, 0, kStride, kStride));
  Cmd n;
  n.op = 'n';
  n.n = kN;
  ASSERT_NO_FATAL_FAILURE(send_cmd(n));
  const PathProbe before = probe();
  auto size_of = [](uint32_t i) { return 1 + i * 23; };
  for (uint32_t i = 0; i < kN; ++i) {
    // Give the target a moment to go back to sleep (not asserted: it only makes each wake-up count).
    usleep(2000);
    fill_pattern(src->data + i * kStride, size_of(i), 300 + i);
    SendWr w(i, IBV_WR_SEND, {src->sge(i * kStride, size_of(i))});
    ASSERT_EQ(post_send(s.qp, w), 0);
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(s.scq, &wc));
    expect_sent(wc, i, IBV_WC_SEND);
    NotifyRecord rec{};
    ASSERT_TRUE(read_reply(sock, &rec, sizeof rec)) << "no word from the target after SEND " << i;
    ASSERT_EQ(rec.code, 0) << "the target was not woken within " << kWaitSeconds << " s for SEND " << i;
    expect_recv(rec.wc, 200 + i, IBV_WC_RECV, size_of(i));
  }
  uint32_t events = 0;
  ASSERT_TRUE(read_reply(sock, &events, sizeof events));
  EXPECT_GE(events, 1u);
  EXPECT_LE(events, kN);
  auto r = region(false, 0, kN * kStride);
  for (uint32_t i = 0; i < kN; ++i) {
    EXPECT_EQ(check_pattern(r.data() + i * kStride, size_of(i), 300 + i), size_of(i)) << "message " << i;
    EXPECT_EQ(first_not_sentinel(r, i * kStride + size_of(i), (i + 1) * kStride), (i + 1) * kStride);
  }
  expect_direct(before, kN, true);  // PATH ASSERTION
}

// Messages the initiator completed are received even when the target's QP goes to the error state
// before it polls (an HCA placed them before it failed); the receives left are flushed after them --
// unless they are an SRQ's, which stay there for its other QPs (IBTA 10.3.1, 11.6.3.1).
TEST_P(DirectSend, CompletedSendsAreReceivedBeforeTheErrorFlush) {
  ASSERT_NO_FATAL_FAILURE(connect());
  ASSERT_NO_FATAL_FAILURE(post_recvs(5, 30, 0, 4096, 4096));
  const PathProbe before = probe();
  const uint32_t sizes[] = {100, 2000, 8};
  for (uint32_t i = 0; i < 3; ++i) {
    fill_pattern(src->data + i * 4096, sizes[i], 60 + i);
    SendWr w(i, IBV_WR_SEND, {src->sge(i * 4096, sizes[i])});
    ASSERT_EQ(post_send(s.qp, w), 0);
  }
  ASSERT_NO_FATAL_FAILURE(expect_sends({{0, IBV_WC_SEND}, {1, IBV_WC_SEND}, {2, IBV_WC_SEND}}));
  Cmd f;
  f.op = 'f';
  ASSERT_NO_FATAL_FAILURE(send_cmd(f));
  ASSERT_NO_FATAL_FAILURE(recv_ack());
  auto wcs = wait_recvs(on_srq() ? 3 : 5);
  ASSERT_EQ(wcs.size(), on_srq() ? 3u : 5u);
  for (uint32_t i = 0; i < 3; ++i) expect_recv(wcs[i], 30 + i, IBV_WC_RECV, sizes[i]);
  for (uint32_t i = 3; i < wcs.size(); ++i) {
    EXPECT_EQ(wcs[i].wr_id, 30u + i);
    EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << ibv_wc_status_str(wcs[i].status);
  }
  if (on_srq()) {
    EXPECT_TRUE(drain_recvs().empty()) << "an SRQ's WQE flushed with its QP";
  }
  auto r = region(false, 0, 5 * 4096);
  for (uint32_t i = 0; i < 3; ++i)
    EXPECT_EQ(check_pattern(r.data() + i * 4096, sizes[i], 60 + i), sizes[i]) << "message " << i;
  EXPECT_EQ(first_not_sentinel(r, 3 * 4096, 5 * 4096), 5u * 4096) << "the flushed receives' buffers";
  expect_direct(before, 3, true);  // PATH ASSERTION
}

// A WRITE_WITH_IMM the target's responder refuses (a wrong rkey) writes nothing and takes no receive
// WQE for a completion: the initiator gets REM_ACCESS_ERR, the target's QP goes to error and its
// receive is flushed (an SRQ's stays in the SRQ).
TEST_P(DirectSend, WriteWithImmWithWrongRkeyTouchesNothing) {
  ASSERT_NO_FATAL_FAILURE(connect());
  ASSERT_NO_FATAL_FAILURE(post_recvs(1, 40, 0, 4096));
  fill_pattern(src->data, 512, 71);
  SendWr w(1, IBV_WR_RDMA_WRITE_WITH_IMM, {src->sge(0, 512)});
  w.rdma(peer.w_addr, peer.w_rkey ^ 0x5a5a00).imm(9);
  ASSERT_EQ(post_send(s.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(s.scq, &wc));
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  if (on_srq()) {
    EXPECT_TRUE(drain_recvs().empty()) << "the SRQ's WQE flushed with the QP";
  } else {
    auto wcs = wait_recvs(1);
    ASSERT_EQ(wcs.size(), 1u);
    EXPECT_EQ(wcs[0].wr_id, 40u);
    EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR) << ibv_wc_status_str(wcs[0].status);
  }
  auto wm = region(true, 0, kWLen);
  EXPECT_EQ(check_pattern(wm.data(), kWLen, kWSeed), kWLen) << "target bytes of W";
  auto r = region(false, 0, 4096);
  EXPECT_EQ(first_not_sentinel(r, 0, 4096), 4096u) << "the receive buffer";
}

TEST_P(DirectSend, SendLargerThan64KiBArrivesIntact) {
  ASSERT_NO_FATAL_FAILURE(connect());
  constexpr size_t kLen = 256 * 1024, kRecvLen = 300 * 1024;
  ASSERT_NO_FATAL_FAILURE(post_recvs(1, 9, 0, kRecvLen));
  const PathProbe before = probe();
  fill_pattern(src->data, kLen, 95);
  SendWr w(1, IBV_WR_SEND_WITH_IMM, {src->sge(0, 1000), src->sge(1000, 100000), src->sge(101000, kLen - 101000)});
  w.imm(0x95);
  ASSERT_EQ(post_send(s.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(s.scq, &wc));
  expect_sent(wc, 1, IBV_WC_SEND);
  auto wcs = wait_recvs(1);
  ASSERT_EQ(wcs.size(), 1u);
  expect_recv(wcs[0], 9, IBV_WC_RECV, kLen, 0x95);
  auto r = region(false, 0, kRLen);
  EXPECT_EQ(check_pattern(r.data(), kLen, 95), kLen);
  EXPECT_EQ(first_not_sentinel(r, kLen, kRLen), kRLen);
  expect_packets(before);  // PATH ASSERTION: past 64 KiB
}

// A burst of WRITE_WITH_IMMs as deep as the receive queues posted, into a target that does not run
// (SIGSTOP): the immediates wait in its inbox for its engine, and none may go by packets for want of
// room there (rsockets keeps 384 messages in flight to a receiver asleep in a blocking call; once one
// went by packets, those after it followed, a hundred times slower).
TEST_P(DirectSend, BurstAsDeepAsTheReceiveQueueStaysDirect) {
  constexpr uint32_t kN = 600;
  qcfg.max_send_wr = kN;
  qcfg.send_cqe = kN;
  ASSERT_NO_FATAL_FAILURE(connect());
  ASSERT_NO_FATAL_FAILURE(post_recvs(kN + 1, 1000, 0, 0));  // no SGE: enough for a WRITE_WITH_IMM
  // One message first, with the target running: the direct path asks the target for what it shares
  // at the first operation, which a stopped target would not answer (the burst would go by packets).
  SendWr first(kN, IBV_WR_RDMA_WRITE_WITH_IMM, {});
  first.rdma(peer.w_addr, peer.w_rkey).imm(kN);
  ASSERT_EQ(post_send(s.qp, first), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(s.scq, &wc));
  expect_sent(wc, kN, IBV_WC_RDMA_WRITE);
  auto got = wait_recvs(1);
  ASSERT_EQ(got.size(), 1u);
  expect_recv(got[0], 1000, IBV_WC_RECV_RDMA_WITH_IMM, 0, kN);
  const PathProbe before = probe();
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  struct Resume {
    pid_t p;
    ~Resume() { kill(p, SIGCONT); }
  } resume{pid};
  for (uint32_t k = 0; k < kN; ++k) {
    SendWr w(k, IBV_WR_RDMA_WRITE_WITH_IMM, {});
    w.rdma(peer.w_addr, peer.w_rkey).imm(k);
    ASSERT_EQ(post_send(s.qp, w), 0) << "WRITE_WITH_IMM " << k;
  }
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  auto sent = poll_wcs(s.scq, kN);
  ASSERT_EQ(sent.size(), kN);
  for (uint32_t k = 0; k < kN; ++k) expect_sent(sent[k], k, IBV_WC_RDMA_WRITE);
  auto wcs = wait_recvs(kN);
  ASSERT_EQ(wcs.size(), kN);
  for (uint32_t k = 0; k < kN; ++k) expect_recv(wcs[k], 1001 + k, IBV_WC_RECV_RDMA_WITH_IMM, 0, k);
  expect_direct(before, kN, true);  // PATH ASSERTION
}

INSTANTIATE_TEST_SUITE_P(RecvQueues, DirectSend, ::testing::Values(RecvQueue::Rq, RecvQueue::Srq),
                         [](const ::testing::TestParamInfo<RecvQueue>& i) {
                           return std::string(i.param == RecvQueue::Srq ? "srq" : "rq");
                         });

}  // namespace
}  // namespace softrdma::verbs_test
