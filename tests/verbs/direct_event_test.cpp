// Two processes on one host in qperf's event mode (rc_lat, rc_rdma_write_lat): each has one CQ for
// send and receive with one completion channel, and waits with ibv_get_cq_event, then
// ibv_req_notify_cq, ibv_ack_cq_events and one ibv_poll_cq of up to 2 CQEs, where its own send CQE
// and the peer's message may arrive in either order. Thousands of round trips of SENDs and of
// RDMA_WRITE_WITH_IMMs; every wake-up must come from an event raised for a CQE: none may be lost and
// left to a timer (docs/direct-path.md, "Wake-ups").
//
// The progress threads do not spin here (SOFTRDMA_SPIN_US=0, each side's contexts' own setting), so a
// lost wake-up cannot be hidden by a spinning thread that happens to place the message: it waits for a
// timer (counted by the engine as direct_late_events) or forever (the wait below gives up after
// kLostWakeupMs and says so). Both are asserted zero, on both sides.
#include "two_process.h"

#include <poll.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace softrdma::verbs_test {
namespace {

constexpr uint32_t kRoundTrips = 2000;
// No event for this long while the peer's message is due: the wake-up was lost (not a latency bound:
// a delivered event takes microseconds, a lost one a timer's period or forever).
constexpr int kLostWakeupMs = 2000;
constexpr size_t kBufLen = 4096;
constexpr uint64_t kWrIdSend = 1, kWrIdRecv = 2;
// Both processes' contexts: progress threads that never spin.
constexpr const char* kNoSpin = "SOFTRDMA_SPIN_US=0";

struct Info {
  uint32_t qpn, psn, rkey;
  uint64_t addr;
  uint8_t gid[16];
};

struct Cmd {
  char op = 0;  // 'g': a ping-pong (then the target's Tally); 'x': exit
  uint32_t n = 0;
  int32_t opcode = 0;  // IBV_WR_SEND or IBV_WR_RDMA_WRITE_WITH_IMM
};

// What one side of a ping-pong saw.
struct Tally {
  uint32_t received = 0;     // receive CQEs (the peer's messages)
  uint32_t lost = 0;         // waits for an event that gave up: lost wake-ups (the loop stops at one)
  uint32_t errors = 0;       // failed verbs calls or CQEs with an error
  uint64_t late_events = 0;  // direct_late_events of this process during the ping-pong
  uint64_t channel_wakes = 0;  // direct_channel_wakes: messages placed by the thread an initiator woke
};

// One side: a QP whose send and receive CQ are one CQ, with one completion channel.
struct Endpoint {
  ibv_comp_channel* ch = nullptr;
  Side s;
  std::unique_ptr<Buffer> buf;

  bool open(Device& dev) {
    ch = ibv_create_comp_channel(dev.ctx);
    if (!ch) return false;
    QpConfig qc;
    qc.shared_cq = true;
    qc.recv_channel = ch;
    qc.max_send_wr = qc.max_recv_wr = 4;
    if (!s.create(dev, qc)) return false;
    buf = s.buf(kBufLen);
    return buf->mr && modify_to_init(s.qp, kAllAccess) == 0;
  }
  void close() {
    buf.reset();
    s.reset();  // its CQ before the channel
    if (ch) ibv_destroy_comp_channel(ch);
    ch = nullptr;
  }

  int post_recv() { return verbs_test::post_recv(s.qp, kWrIdRecv, {buf->sge(0, kBufLen)}); }
  int post_message(ibv_wr_opcode op, const Info& peer, uint32_t seq) {
    buf->data[kBufLen - 1] = static_cast<uint8_t>(seq);
    SendWr w(kWrIdSend, op, {buf->sge(kBufLen - 1, 1)}, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
    if (op == IBV_WR_RDMA_WRITE_WITH_IMM) w.rdma(peer.addr, peer.rkey).imm(seq);
    return post_send(s.qp, w);
  }

  // qperf's rd_poll: an event, the re-arm, the ack, one poll. -1 on a verbs error; a wait that gives
  // up counts in t.lost (and polls anyway).
  int poll_event(ibv_wc* wc, Tally& t) {
    pollfd pf{ch->fd, POLLIN, 0};
    if (poll(&pf, 1, kLostWakeupMs) != 1) {
      ++t.lost;
    } else {
      ibv_cq* ev_cq = nullptr;
      void* ev_ctx = nullptr;
      if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) || ev_cq != s.rcq || ibv_req_notify_cq(s.rcq, 0)) return -1;
      ibv_ack_cq_events(ev_cq, 1);
    }
    return ibv_poll_cq(s.rcq, 2, wc);
  }

  // qperf's rd_pp_lat_loop: n messages each way; the initiator sends first, each side sends the next
  // once its last send has completed and the peer's message has arrived. The CQ is armed and a
  // receive posted before the peer may send.
  Tally ping_pong(ibv_wr_opcode op, const Info& peer, uint32_t n, bool initiator) {
    Tally t;
    const uint64_t late_before = my_counter(&core::Counters::direct_late_events);
    const uint64_t wakes_before = my_counter(&core::Counters::direct_channel_wakes);
    uint32_t sent = 0;
    int done = 1;  // bit 0: the last send completed; bit 1: the peer's message arrived
    if (initiator) {
      if (post_message(op, peer, sent++)) ++t.errors;
      done = 0;
    }
    while (t.received < n && !t.lost && !t.errors) {
      ibv_wc wc[2];
      int got = poll_event(wc, t);
      if (got < 0) ++t.errors;
      for (int i = 0; i < got; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS) ++t.errors;
        if (wc[i].wr_id == kWrIdRecv) {
          ++t.received;
          if (t.received < n && post_recv()) ++t.errors;
          done |= 2;
        } else {
          done |= 1;
        }
      }
      if (done == 3 && sent < n) {
        if (post_message(op, peer, sent++)) ++t.errors;
        done = 0;
      }
    }
    t.late_events = my_counter(&core::Counters::direct_late_events) - late_before;
    t.channel_wakes = my_counter(&core::Counters::direct_channel_wakes) - wakes_before;
    return t;
  }
};

// The target: connects, then runs the ping-pongs it is told to, answering each with its Tally.
int target_main(int sock) {
  Device dev(kNoSpin);
  if (!dev.ok()) return 10;
  Endpoint ep;
  if (!ep.open(dev)) return 11;
  Info peer{};
  if (int rc = serve_connect(sock, dev, ep.s, Info{ep.s.qpn(), ep.s.psn, ep.buf->rkey(), ep.buf->addr(), {}}, peer, 12))
    return rc;
  int status = 0;
  for (;;) {
    Cmd cmd;
    if (!read_full(sock, &cmd, sizeof cmd)) {
      status = 14;
      break;
    }
    if (cmd.op == 'x') break;
    if (cmd.op != 'g') {
      status = 15;
      break;
    }
    if (ibv_req_notify_cq(ep.s.rcq, 0) || ep.post_recv()) {
      status = 16;
      break;
    }
    const char go = 'g';
    if (!write_full(sock, &go, 1)) {
      status = 17;
      break;
    }
    Tally t = ep.ping_pong(static_cast<ibv_wr_opcode>(cmd.opcode), peer, cmd.n, false);
    if (!write_full(sock, &t, sizeof t)) {
      status = 18;
      break;
    }
  }
  ep.close();
  return status;
}

class DirectEvents : public ForkedTarget {
 protected:
  DirectEvents() : ForkedTarget(target_main) {}

  void TearDown() override {
    ep.close();
    dev.reset();
    Cmd x;
    x.op = 'x';
    stop_target(&x, sizeof x);
  }

  void connect() {
    dev = std::make_unique<Device>(kNoSpin);
    ASSERT_TRUE(dev->ok());
    ASSERT_TRUE(ep.open(*dev));
    ASSERT_NO_FATAL_FAILURE(
        connect_target(Info{ep.s.qpn(), ep.s.psn, ep.buf->rkey(), ep.buf->addr(), {}}, peer, ep.s, *dev, ConnConfig{}));
  }

  // kRoundTrips round trips of `op`, both sides in event mode; asserts that every message arrived
  // and that no wake-up was lost, on either side.
  void round_trips(ibv_wr_opcode op) {
    ASSERT_NO_FATAL_FAILURE(connect());
    ASSERT_EQ(ibv_req_notify_cq(ep.s.rcq, 0), 0);
    ASSERT_EQ(ep.post_recv(), 0);
    Cmd c;
    c.op = 'g';
    c.n = kRoundTrips;
    c.opcode = op;
    ASSERT_TRUE(write_full(sock, &c, sizeof c));
    char go = 0;
    ASSERT_TRUE(read_full(sock, &go, 1));
    ASSERT_EQ(go, 'g');
    const uint64_t direct_before = my_counter(&core::Counters::direct_ops);
    Tally mine = ep.ping_pong(op, peer, kRoundTrips, true);
    const uint64_t direct_ops = my_counter(&core::Counters::direct_ops) - direct_before;
    Tally theirs{};
    ASSERT_TRUE(read_full(sock, &theirs, sizeof theirs)) << "no tally from the target";
    EXPECT_EQ(mine.errors, 0u);
    EXPECT_EQ(theirs.errors, 0u);
    EXPECT_EQ(mine.lost, 0u) << "the initiator waited " << kLostWakeupMs << " ms for an event after "
                             << mine.received << " replies";
    EXPECT_EQ(theirs.lost, 0u) << "the target waited " << kLostWakeupMs << " ms for an event after "
                               << theirs.received << " messages";
    EXPECT_EQ(mine.late_events, 0u) << "events raised only by a progress thread woken without a doorbell";
    EXPECT_EQ(theirs.late_events, 0u) << "the target's events raised only by a wake-up without a doorbell";
    EXPECT_EQ(mine.received, kRoundTrips);
    EXPECT_EQ(theirs.received, kRoundTrips);
    // PATH ASSERTION: the messages went by the direct path when it is on.
    const char* d = getenv("SOFTRDMA_DIRECT");
    if (getenv("VT_DEVICE") == nullptr && (d ? std::strcmp(d, "0") != 0 : getenv("SOFTRDMA_IMPAIR") == nullptr)) {
      EXPECT_GE(direct_ops, mine.received) << "messages on the direct path";
      // One wake-up per message: the initiator wakes the thread blocked on the channel, which places
      // the message itself, rather than the target's progress thread (a second wake-up).
      EXPECT_GT(mine.channel_wakes, 0u) << "no reply was placed by the thread its initiator woke";
      EXPECT_GT(theirs.channel_wakes, 0u) << "no message was placed by the thread its initiator woke";
    }
  }

  std::unique_ptr<Device> dev;
  Endpoint ep;
  Info peer{};
};

TEST_F(DirectEvents, SendPingPongOnOneCqNeverWaitsForATimer) { round_trips(IBV_WR_SEND); }

TEST_F(DirectEvents, WriteWithImmPingPongOnOneCqNeverWaitsForATimer) { round_trips(IBV_WR_RDMA_WRITE_WITH_IMM); }

}  // namespace
}  // namespace softrdma::verbs_test
