// Completion and ordering semantics: signaling, fences, ordering, solicited events,
// completion channels, many outstanding READs.
#include "helpers.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace softrdma::verbs_test {
namespace {

using Semantics = OverPaths<>;
// Off iWARP: SEND with immediate data and atomics do not exist there (docs/iwarp.md), and a WRITE
// completes once its bytes are in the socket, not once placed ("Completion"): the target is not
// checked right after the WRITE's own completion there.
using SemanticsRoce = OverPaths<>;

// Unsignaled WRs make no CQE; the one signaled WR after them does.
TEST_P(SemanticsRoce, UnsignaledWrsMakeNoCompletion) {
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 4096);
  VT_BUF(dst, b, 4096);
  fill_pattern(src->data, 4096, 31);
  for (int i = 0; i < 5; ++i) {
    SendWr w(i, IBV_WR_RDMA_WRITE, {src->sge(i * 512, 512)}, 0);
    w.rdma(dst->addr(i * 512), dst->rkey());
    ASSERT_EQ(post_send(a.qp, w), 0);
  }
  SendWr last(99, IBV_WR_RDMA_WRITE, {src->sge(2560, 512)});
  last.rdma(dst->addr(2560), dst->rkey());
  ASSERT_EQ(post_send(a.qp, last), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 99, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  // The signaled WR completed, so all earlier ones have too: nothing else may appear.
  EXPECT_EQ(drain_cq(a.scq), 0);
  EXPECT_EQ(check_pattern(dst->data, 3072, 31), 3072u);
}

TEST_P(Semantics, SqSigAllSignalsEveryWr) {
  qcfg.sq_sig_all = true;
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 4096);
  VT_BUF(dst, b, 4096);
  for (int i = 0; i < 5; ++i) {
    SendWr w(40 + i, IBV_WR_RDMA_WRITE, {src->sge(i * 100, 100)}, 0);
    w.rdma(dst->addr(i * 100), dst->rkey());
    ASSERT_EQ(post_send(a.qp, w), 0);
  }
  auto wcs = poll_wcs(a.scq, 5);
  ASSERT_EQ(wcs.size(), 5u);
  for (int i = 0; i < 5; ++i) expect_wc(wcs[i], {.wr_id = uint64_t(40 + i), .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
}

// Unsignaled WRs still free their send queue slots once a later signaled WR is polled:
// far more WRs than max_send_wr go through.
TEST_P(Semantics, UnsignaledWrsRecycleSendQueue) {
  qcfg.max_send_wr = 16;
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  const uint32_t per_batch = a.cap.max_send_wr;
  for (int batch = 0; batch < 10; ++batch) {
    for (uint32_t i = 0; i < per_batch; ++i) {
      const bool last = i + 1 == per_batch;
      SendWr w(batch * 1000 + i, IBV_WR_RDMA_WRITE, {src->sge(0, 8)}, last ? IBV_SEND_SIGNALED : 0);
      w.rdma(dst->addr(0), dst->rkey());
      ASSERT_EQ(post_send(a.qp, w), 0) << "batch " << batch << " wr " << i;
    }
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(a.scq, &wc));
    expect_wc(wc, {.wr_id = batch * 1000 + per_batch - 1, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  }
}

// The send queue is bounded: with completions never polled, posting eventually fails with
// ENOMEM (ibv_post_send(3)), never before max_send_wr WRs, and every accepted WR completes.
// (A NIC may round its ring up, so the exact refusal point is not asserted.)
TEST_P(Semantics, SendQueueFullReturnsEnomem) {
  qcfg.max_send_wr = 8;
  qcfg.send_cqe = 256;
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  const uint32_t bound = 4 * a.cap.max_send_wr + 16;
  ASSERT_LE(bound, uint32_t(a.scq->cqe)) << "CQ must hold every accepted WR";
  uint32_t accepted = 0;
  int rc = 0;
  for (; accepted < bound; ++accepted) {
    SendWr w(accepted, IBV_WR_RDMA_WRITE, {src->sge(0, 8)});
    w.rdma(dst->addr(0), dst->rkey());
    rc = post_send(a.qp, w);
    if (rc) break;
  }
  EXPECT_EQ(rc, ENOMEM) << "send queue accepted " << accepted << " WRs with max_send_wr " << a.cap.max_send_wr;
  EXPECT_GE(accepted, a.cap.max_send_wr);
  auto wcs = poll_wcs(a.scq, accepted);
  ASSERT_EQ(wcs.size(), accepted);
  for (uint32_t i = 0; i < accepted; ++i) expect_wc(wcs[i], {.wr_id = i, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  EXPECT_EQ(drain_cq(a.scq), 0);
}

// IBV_SEND_FENCE: a WRITE/SEND whose source is the destination of an earlier READ
// carries the READ's data.
TEST_P(Semantics, FenceOrdersAfterRead) {
  ASSERT_TRUE(connect());
  constexpr uint32_t kLen = 64 * 1024;
  VT_BUF(remote, b, kLen);
  VT_BUF(copy, b, kLen);
  VT_BUF(recv, b, kLen);
  VT_BUF(bounce, a, kLen);
  fill_pattern(remote->data, kLen, 41);
  std::memset(bounce->data, 0, kLen);
  ASSERT_EQ(post_recv(b.qp, 7, {recv->sge(0, kLen)}), 0);
  SendWr rd(1, IBV_WR_RDMA_READ, {bounce->sge(0, kLen)});
  rd.rdma(remote->addr(), remote->rkey());
  SendWr wr(2, IBV_WR_RDMA_WRITE, {bounce->sge(0, kLen)}, IBV_SEND_SIGNALED | IBV_SEND_FENCE);
  wr.rdma(copy->addr(), copy->rkey());
  SendWr sd(3, IBV_WR_SEND, {bounce->sge(0, kLen)}, IBV_SEND_SIGNALED | IBV_SEND_FENCE);
  // Posted as one chained list.
  rd.get()->next = wr.get();
  wr.wr.next = sd.get();
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a.qp, &rd.wr, &bad), 0);
  auto wcs = poll_wcs(a.scq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  expect_wc(wcs[0], {.wr_id = 1, .opcode = IBV_WC_RDMA_READ, .byte_len = kLen, .qp_num = a.qpn()});
  expect_wc(wcs[1], {.wr_id = 2, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qpn()});
  expect_wc(wcs[2], {.wr_id = 3, .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 7, .opcode = IBV_WC_RECV, .byte_len = kLen, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(copy->data, kLen, 41), kLen);
  EXPECT_EQ(check_pattern(recv->data, kLen, 41), kLen);
}

// When the SEND completes at the receiver, all WRITEs posted before it are visible.
TEST_P(Semantics, WritesVisibleWhenLaterSendCompletes) {
  ASSERT_TRUE(connect());
  constexpr int kWrites = 20;
  constexpr uint32_t kChunk = 16 * 1024;
  VT_BUF(src, a, kWrites * kChunk);
  VT_BUF(dst, b, kWrites * kChunk);
  VT_BUF(msg, a, 16);
  VT_BUF(rmsg, b, 16);
  fill_pattern(src->data, kWrites * kChunk, 51);
  ASSERT_EQ(post_recv(b.qp, 1, {rmsg->sge(0, 16)}), 0);
  for (int i = 0; i < kWrites; ++i) {
    SendWr w(100 + i, IBV_WR_RDMA_WRITE, {src->sge(i * kChunk, kChunk)}, 0);
    w.rdma(dst->addr(i * kChunk), dst->rkey());
    ASSERT_EQ(post_send(a.qp, w), 0);
  }
  SendWr s(2, IBV_WR_SEND, {msg->sge(0, 16)});
  ASSERT_EQ(post_send(a.qp, s), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 1, .opcode = IBV_WC_RECV, .byte_len = 16, .qp_num = b.qpn()});
  // Checked before the requester's completion is even looked at.
  EXPECT_EQ(check_pattern(dst->data, kWrites * kChunk, 51), size_t{kWrites * kChunk});
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 2, .opcode = IBV_WC_SEND, .qp_num = a.qpn()});
}

// Waits for one CQ event on a channel (bounded); returns the CQ or nullptr.
ibv_cq* wait_cq_event(ibv_comp_channel* ch, void** ctx_out, int timeout_s = kWaitSeconds) {
  pollfd p{ch->fd, POLLIN, 0};
  int n = poll(&p, 1, timeout_s * 1000);
  if (n != 1) {
    ADD_FAILURE() << "no CQ event within " << timeout_s << " s";
    return nullptr;
  }
  ibv_cq* cq = nullptr;
  if (ibv_get_cq_event(ch, &cq, ctx_out)) {
    ADD_FAILURE() << "ibv_get_cq_event: " << strerror(errno);
    return nullptr;
  }
  return cq;
}

// True when an event is pending on the (non-blocking) channel right now.
bool cq_event_pending(ibv_comp_channel* ch) {
  pollfd p{ch->fd, POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

TEST_P(Semantics, CompletionChannelEvents) {
  ASSERT_TRUE(dev.ok());
  ibv_comp_channel* ch = make_channel();
  ASSERT_TRUE(ch);
  qcfg.recv_channel = ch;
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  EXPECT_FALSE(cq_event_pending(ch)) << "event without arming";
  ASSERT_EQ(ibv_req_notify_cq(b.rcq, 0), 0);
  ASSERT_EQ(post_recv(b.qp, 1, {dst->sge(0, 64)}), 0);
  ASSERT_EQ(post_recv(b.qp, 2, {dst->sge(0, 64)}), 0);
  SendWr s(3, IBV_WR_SEND, {src->sge(0, 64)});
  ASSERT_EQ(post_send(a.qp, s), 0);
  void* cq_ctx = reinterpret_cast<void*>(1);
  ibv_cq* cq = wait_cq_event(ch, &cq_ctx);
  ASSERT_EQ(cq, b.rcq);
  EXPECT_EQ(cq_ctx, nullptr) << "cq_context given at ibv_create_cq";
  ibv_ack_cq_events(cq, 1);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 1, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = b.qpn()});

  // Not re-armed: the next completion makes no event.
  ASSERT_EQ(post_send(a.qp, s), 0);
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 2, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = b.qpn()});
  EXPECT_FALSE(cq_event_pending(ch)) << "event from a CQ that was not re-armed";

  // Re-armed: one more event.
  ASSERT_EQ(ibv_req_notify_cq(b.rcq, 0), 0);
  ASSERT_EQ(post_recv(b.qp, 4, {dst->sge(0, 64)}), 0);
  ASSERT_EQ(post_send(a.qp, s), 0);
  cq = wait_cq_event(ch, &cq_ctx);
  ASSERT_EQ(cq, b.rcq);
  ibv_ack_cq_events(cq, 1);
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 4, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = b.qpn()});
  auto swcs = poll_wcs(a.scq, 3);
  EXPECT_EQ(swcs.size(), 3u);
}

// Completion channels whose fd blocks: ibv_get_cq_event is the application's only wait.
class ChannelWait : public OverPaths<> {
 protected:
  // Both receive CQs on one blocking channel (channel, destroyed after the CQs), connected.
  void connect_with_channel() {
    ASSERT_TRUE(dev.ok());
    channel = ibv_create_comp_channel(dev.ctx);
    ASSERT_TRUE(channel);
    qcfg.recv_channel = channel;
    ASSERT_TRUE(connect());
  }
  void wait_through(int sig, int flags, bool stop, bool deliver);
};

// ibv_get_cq_event on a blocking channel as the only wait, as ib_send_lat -e and qperf -cm1 use it:
// a ping-pong between the two QPs, each message waited for on the channel, arrives in order with its
// payload (the waiting thread does the transport's work itself: Engine::waiter_pass).
TEST_P(ChannelWait, PingPong) {
  ASSERT_NO_FATAL_FAILURE(connect_with_channel());
  ibv_comp_channel* ch = channel;
  VT_BUF(abuf, a, 64);
  VT_BUF(bbuf, b, 64);
  Side* side[2] = {&a, &b};
  Buffer* buf[2] = {abuf.get(), bbuf.get()};
  for (int k = 0; k < 2; ++k) ASSERT_EQ(post_recv(side[k]->qp, 0, {buf[k]->sge(32, 32)}), 0);
  constexpr int kRounds = 300;
  for (int i = 0; i < kRounds; ++i) {
    const int from = i & 1, to = from ^ 1;
    ASSERT_EQ(ibv_req_notify_cq(side[to]->rcq, 0), 0);
    std::memset(buf[from]->data, 0, 32);
    std::memcpy(buf[from]->data, &i, sizeof i);
    SendWr s(i, IBV_WR_SEND, {buf[from]->sge(0, 32)});
    ASSERT_EQ(post_send(side[from]->qp, s), 0);
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    ASSERT_EQ(ibv_get_cq_event(ch, &cq, &ctx), 0) << strerror(errno) << " in round " << i;
    ASSERT_EQ(cq, side[to]->rcq) << "round " << i;
    ibv_ack_cq_events(cq, 1);
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(cq, &wc)) << "round " << i;
    expect_wc(wc, {.wr_id = uint64_t(i / 2), .opcode = IBV_WC_RECV, .byte_len = 32, .qp_num = side[to]->qpn()});
    int got = -1;
    std::memcpy(&got, buf[to]->data + 32, sizeof got);
    ASSERT_EQ(got, i);
    ASSERT_EQ(post_recv(side[to]->qp, uint64_t(i / 2 + 1), {buf[to]->sge(32, 32)}), 0);
    ASSERT_TRUE(poll_wc(side[from]->scq, &wc)) << "round " << i;
    expect_wc(wc, {.wr_id = uint64_t(i), .opcode = IBV_WC_SEND, .qp_num = side[from]->qpn()});
  }
}

// A thread blocked in ibv_get_cq_event does not hold back another thread's post: the message it
// waits for is sent by that post, after the wait began.
TEST_P(ChannelWait, WakesForAnotherThreadsPost) {
  ASSERT_NO_FATAL_FAILURE(connect_with_channel());
  ibv_comp_channel* ch = channel;
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  fill_pattern(src->data, 64, 7);
  ASSERT_EQ(post_recv(b.qp, 5, {dst->sge(0, 64)}), 0);
  ASSERT_EQ(ibv_req_notify_cq(b.rcq, 0), 0);
  std::thread poster([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    SendWr s(6, IBV_WR_SEND, {src->sge(0, 64)});
    EXPECT_EQ(post_send(a.qp, s), 0);
  });
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  const int rc = ibv_get_cq_event(ch, &cq, &ctx);
  poster.join();
  ASSERT_EQ(rc, 0) << strerror(errno);
  ASSERT_EQ(cq, b.rcq);
  ibv_ack_cq_events(cq, 1);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 5, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = b.qpn()});
  EXPECT_EQ(check_pattern(dst->data, 64, 7), 64u);
  ASSERT_TRUE(poll_wc(a.scq, &wc));
}

// A QP moved to the error state while a thread waits for its receive CQ's event: the flushed receive
// raises the event (rping's server joins its CQ thread after rdma_disconnect, which ends on that flush).
TEST_P(ChannelWait, WakesForTheFlushOfAQpInError) {
  ASSERT_NO_FATAL_FAILURE(connect_with_channel());
  ibv_comp_channel* ch = channel;
  VT_BUF(dst, b, 64);
  ASSERT_EQ(post_recv(b.qp, 5, {dst->sge(0, 64)}), 0);
  ASSERT_EQ(ibv_req_notify_cq(b.rcq, 0), 0);
  std::thread breaker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    EXPECT_EQ(ibv_modify_qp(b.qp, &attr, IBV_QP_STATE), 0);
  });
  // Bounded: SIGALRM (no SA_RESTART) ends a wait that nothing wakes with EINTR.
  struct sigaction sa{}, old{};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGALRM, &sa, &old), 0);
  alarm(kWaitSeconds);
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  const int rc = ibv_get_cq_event(ch, &cq, &ctx);
  const int err = errno;
  alarm(0);
  sigaction(SIGALRM, &old, nullptr);
  breaker.join();
  ASSERT_EQ(rc, 0) << "no event for the flush within " << kWaitSeconds << " s: " << strerror(err);
  ASSERT_EQ(cq, b.rcq);
  ibv_ack_cq_events(cq, 1);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR) << ibv_wc_status_str(wc.status);
}

// A signal ends a blocking ibv_get_cq_event with EINTR, as it ends the read of the kernel's channel
// fd (qperf ends its timed loop from SIGALRM), and the channel works afterwards.
TEST_P(ChannelWait, EndsOnSignal) {
  ASSERT_NO_FATAL_FAILURE(connect_with_channel());
  ibv_comp_channel* ch = channel;
  ASSERT_EQ(ibv_req_notify_cq(b.rcq, 0), 0);
  struct sigaction sa{}, old{};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART
  ASSERT_EQ(sigaction(SIGALRM, &sa, &old), 0);
  itimerval t{};
  t.it_value.tv_usec = 50000;
  ASSERT_EQ(setitimer(ITIMER_REAL, &t, nullptr), 0);
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  errno = 0;
  const int rc = ibv_get_cq_event(ch, &cq, &ctx);
  const int err = errno;
  sigaction(SIGALRM, &old, nullptr);
  EXPECT_EQ(rc, -1);
  EXPECT_EQ(err, EINTR);
  // Still a channel: a message now raises the event.
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  ASSERT_EQ(post_recv(b.qp, 1, {dst->sge(0, 64)}), 0);
  SendWr s(2, IBV_WR_SEND, {src->sge(0, 64)});
  ASSERT_EQ(post_send(a.qp, s), 0);
  ASSERT_EQ(ibv_get_cq_event(ch, &cq, &ctx), 0) << strerror(errno);
  EXPECT_EQ(cq, b.rcq);
  ibv_ack_cq_events(cq, 1);
}

// What does not end a read of the kernel's channel fd does not end ibv_get_cq_event either: the
// process stopped and continued (SIGSTOP, a debugger's attach), here while a handler without
// SA_RESTART is installed (qperf has one for SIGALRM), and a handler with SA_RESTART that runs.
void ChannelWait::wait_through(int sig, int flags, bool stop, bool deliver) {
  ASSERT_NO_FATAL_FAILURE(connect_with_channel());
  ibv_comp_channel* ch = channel;
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  ASSERT_EQ(post_recv(b.qp, 1, {dst->sge(0, 64)}), 0);
  ASSERT_EQ(ibv_req_notify_cq(b.rcq, 0), 0);
  struct sigaction sa{}, old{};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = flags;
  ASSERT_EQ(sigaction(sig, &sa, &old), 0);
  const pthread_t waiter = pthread_self();
  const pid_t self = getpid();
  // A child stops and continues this process (a process cannot stop itself and go on).
  pid_t child = -1;
  if (stop) {
    child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      usleep(30000);
      kill(self, SIGSTOP);
      usleep(20000);
      kill(self, SIGCONT);
      _exit(0);
    }
  }
  std::thread poster([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (deliver) pthread_kill(waiter, sig);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    SendWr s(2, IBV_WR_SEND, {src->sge(0, 64)});
    EXPECT_EQ(post_send(a.qp, s), 0);
  });
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  const int rc = ibv_get_cq_event(ch, &cq, &ctx);
  const int err = errno;
  poster.join();
  int status = 0;
  if (child > 0) waitpid(child, &status, 0);
  sigaction(sig, &old, nullptr);
  ASSERT_EQ(rc, 0) << strerror(err);
  EXPECT_EQ(cq, b.rcq);
  ibv_ack_cq_events(cq, 1);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 1, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = b.qpn()});
}

TEST_P(ChannelWait, SurvivesStop) { wait_through(SIGUSR2, 0, true, false); }

TEST_P(ChannelWait, SurvivesRestartingHandler) { wait_through(SIGUSR1, SA_RESTART, false, true); }

TEST_P(SemanticsRoce, SolicitedOnlyNotification) {
  ASSERT_TRUE(dev.ok());
  ibv_comp_channel* ch = make_channel();
  ASSERT_TRUE(ch);
  qcfg.recv_channel = ch;
  ASSERT_TRUE(connect());
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(post_recv(b.qp, 10 + i, {dst->sge(0, 64)}), 0);
  ASSERT_EQ(ibv_req_notify_cq(b.rcq, 1), 0);
  // An unsolicited SEND completes but raises no event.
  SendWr plain(1, IBV_WR_SEND, {src->sge(0, 64)});
  ASSERT_EQ(post_send(a.qp, plain), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 10, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = b.qpn()});
  EXPECT_FALSE(cq_event_pending(ch)) << "event for an unsolicited completion";
  // A solicited one does.
  SendWr sol(2, IBV_WR_SEND_WITH_IMM, {src->sge(0, 64)}, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
  sol.imm(5);
  ASSERT_EQ(post_send(a.qp, sol), 0);
  void* cq_ctx = nullptr;
  ibv_cq* cq = wait_cq_event(ch, &cq_ctx);
  ASSERT_EQ(cq, b.rcq);
  ibv_ack_cq_events(cq, 1);
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 11, .opcode = IBV_WC_RECV, .byte_len = 64, .imm = 5, .qp_num = b.qpn()});
  EXPECT_EQ(poll_wcs(a.scq, 2).size(), 2u);
}

// More READs in flight than max_rd_atomic: the requester must throttle, not fail.
TEST_P(Semantics, ManyReadsBeyondMaxRdAtomic) {
  conn.max_rd_atomic = 2;
  conn.max_dest_rd_atomic = 2;
  qcfg.max_send_wr = 128;
  ASSERT_TRUE(connect());
  constexpr int kReads = 100;
  constexpr uint32_t kLen = 3000;
  VT_BUF(remote, b, kReads * kLen);
  VT_BUF(local, a, kReads * kLen);
  fill_pattern(remote->data, kReads * kLen, 61);
  for (int i = 0; i < kReads; ++i) {
    SendWr r(i, IBV_WR_RDMA_READ, {local->sge(i * kLen, kLen)});
    r.rdma(remote->addr((kReads - 1 - i) * kLen), remote->rkey());
    ASSERT_EQ(post_send(a.qp, r), 0) << i;
  }
  auto wcs = poll_wcs(a.scq, kReads);
  ASSERT_EQ(wcs.size(), size_t{kReads});
  for (int i = 0; i < kReads; ++i) {
    expect_wc(wcs[i], {.wr_id = uint64_t(i), .opcode = IBV_WC_RDMA_READ, .byte_len = kLen, .qp_num = a.qpn()});
    EXPECT_EQ(check_pattern(local->data + i * kLen, kLen, 61, (kReads - 1 - i) * kLen), kLen) << i;
  }
}

// The same with the device's own max_rd_atomic and a mix of READs and atomics.
TEST_P(SemanticsRoce, ManyReadsAndAtomicsAtDeviceMax) {
  conn.max_rd_atomic = 255;
  conn.max_dest_rd_atomic = 255;
  qcfg.max_send_wr = 128;
  ASSERT_TRUE(connect());
  const bool atomics = atomics_supported();
  constexpr int kOps = 120;
  VT_BUF(remote, b, kOps * 256 + 8);
  VT_BUF(local, a, kOps * 256);
  fill_pattern(remote->data, kOps * 256, 62);
  remote->u64(kOps * 256) = 0;
  for (int i = 0; i < kOps; ++i) {
    if (atomics && i % 3 == 2) {
      SendWr f(i, IBV_WR_ATOMIC_FETCH_AND_ADD, {local->sge(i * 256, 8)});
      f.fetch_add(remote->addr(kOps * 256), remote->rkey(), 1);
      ASSERT_EQ(post_send(a.qp, f), 0) << i;
    } else {
      SendWr r(i, IBV_WR_RDMA_READ, {local->sge(i * 256, 256)});
      r.rdma(remote->addr(i * 256), remote->rkey());
      ASSERT_EQ(post_send(a.qp, r), 0) << i;
    }
  }
  auto wcs = poll_wcs(a.scq, kOps);
  ASSERT_EQ(wcs.size(), size_t{kOps});
  uint64_t expected_old = 0;
  for (int i = 0; i < kOps; ++i) {
    EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS) << i;
    EXPECT_EQ(wcs[i].wr_id, uint64_t(i));
    if (atomics && i % 3 == 2) {
      EXPECT_EQ(local->u64(i * 256), expected_old++) << i;
    } else {
      EXPECT_EQ(check_pattern(local->data + i * 256, 256, 62, i * 256), 256u) << i;
    }
  }
  if (atomics) {
    EXPECT_EQ(remote->u64(kOps * 256), expected_old);
  }
}

VT_INSTANTIATE_PATHS(Semantics, VT_ALL_PATHS);
VT_INSTANTIATE_PATHS(ChannelWait, VT_ALL_PATHS);
VT_INSTANTIATE_PATHS(SemanticsRoce, VT_ROCE_PATHS);

}  // namespace
}  // namespace softrdma::verbs_test
