// Dying peer: a child process connects an RC QP to ours and is SIGKILLed while our big WRITEs stream
// into it. Our outstanding WRs must end with RETRY_EXC_ERR then WR_FLUSH_ERR within the transport
// timeout, the dead child's QPN must leave the registry, and a new child on a new QP must work.
// Both children are forked before this process opens a device (no fork after ibv_open_device).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "hostile.h"
#include "two_process.h"

namespace softrdma::hostile_test {
namespace {

struct PeerInfo {
  uint32_t qpn;
  uint32_t psn;
  uint32_t rkey;
  uint64_t addr;
  uint64_t len;
};

constexpr size_t kChildLen = 8u << 20;   // the child's MR
constexpr uint32_t kChunk = 1u << 20;    // one WRITE
constexpr size_t kReadOff = 4u << 20;    // the second child fills [4 MiB, 8 MiB) for our READ
constexpr uint32_t kSeedChild = 300;
constexpr int kBound = 60;               // seconds any step may take before the test fails

// The child: waits for "go", opens the device, connects to the parent's QP and serves until the
// parent closes the socket (or kills it). Returns its exit code; 0 when all went well.
int child_main(int sock) {
  char go;
  if (!read_full(sock, &go, 1, kBound)) return 9;
  Device dev;
  if (!dev.ok()) return 10;
  Side s;
  if (!s.create(dev, QpConfig{})) return 11;
  auto buf = s.buf(kChildLen);
  if (!buf->mr) return 12;
  std::memset(buf->data, 0, kReadOff);
  fill_pattern(buf->data + kReadOff, kChildLen - kReadOff, kSeedChild, kReadOff);
  PeerInfo me{s.qpn(), s.psn, buf->rkey(), buf->addr(), kChildLen};
  PeerInfo peer{};
  if (!write_full(sock, &me, sizeof me) || !read_full(sock, &peer, sizeof peer, kBound)) return 13;
  ConnConfig c;
  if (bring_up(s.qp, s.psn, peer.qpn, peer.psn, loopback_gid(), c, dev.attr)) return 14;
  char ready = 'r';
  if (!write_full(sock, &ready, 1)) return 15;
  char done;
  // EOF or a byte: the parent is finished with us.
  pollfd pf{sock, POLLIN, 0};
  if (poll(&pf, 1, kBound * 1000) != 1) return 16;
  (void)!read(sock, &done, 1);
  return 0;
}

struct Child {
  pid_t pid = -1;
  int sock = -1;
  void fork_it() {
    pid = fork_target(child_main, &sock);
    ASSERT_GE(pid, 0) << "socketpair or fork: " << strerror(errno);
  }
  ~Child() {
    if (sock >= 0) close(sock);
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  // Starts the child, exchanges QP facts, brings ours up and waits until the child's QP is in RTS.
  bool connect(Side& s, Device& dev, const ConnConfig& c, PeerInfo& peer) {
    char go = 'g';
    if (!write_full(sock, &go, 1)) return false;
    if (!read_full(sock, &peer, sizeof peer, kBound)) {
      ADD_FAILURE() << "child sent no QP facts";
      return false;
    }
    PeerInfo me{s.qpn(), s.psn, 0, 0, 0};
    if (!write_full(sock, &me, sizeof me)) return false;
    if (int rc = bring_up(s.qp, s.psn, peer.qpn, peer.psn, dev.gid, c, dev.attr)) {
      ADD_FAILURE() << "bring up: " << strerror(rc);
      return false;
    }
    char ready;
    if (!read_full(sock, &ready, 1, kBound)) {
      ADD_FAILURE() << "child never got ready";
      return false;
    }
    return true;
  }
  int reap() {
    int st = 0;
    EXPECT_EQ(waitpid(pid, &st, 0), pid);
    pid = -1;
    return st;
  }
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(DyingPeer, KilledMidTransferThenNewPeerWorks) {
  Child victim, second;
  victim.fork_it();
  second.fork_it();
  if (HasFatalFailure()) return;

  Device dev;
  ASSERT_TRUE(dev.ok());
  Side s;
  QpConfig qc;
  qc.max_send_wr = 64;
  ASSERT_TRUE(s.create(dev, qc));
  auto src = s.buf(kChunk);
  ASSERT_TRUE(src && src->mr);
  fill_pattern(src->data, kChunk, 301);
  ConnConfig c;
  c.timeout = 12;   // 4.096 us * 2^12 = 16.8 ms per try
  c.retry_cnt = 3;  // about 70 ms from the last answer to RETRY_EXC_ERR
  PeerInfo peer{};
  ASSERT_TRUE(victim.connect(s, dev, c, peer));
  auto entry = net::Registry::instance().lookup(peer.qpn);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->pid, victim.pid);

  // Keep 16 MiB of WRITEs in flight; kill the child once 8 have completed.
  constexpr int kInFlight = 16;
  const auto start = std::chrono::steady_clock::now();
  uint64_t posted = 0;
  std::vector<ibv_wc> after_kill;
  int ok_before_kill = 0;
  auto post_one = [&] {
    SendWr w(posted, IBV_WR_RDMA_WRITE, {src->sge(0, kChunk)});
    w.rdma(peer.addr + (posted % (kChildLen / kChunk)) * kChunk, peer.rkey);
    ASSERT_EQ(post_send(s.qp, w), 0);
    ++posted;
  };
  while (ok_before_kill < 8) {
    while (posted - static_cast<uint64_t>(ok_before_kill) < kInFlight) post_one();
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(s.scq, &wc, kBound));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << "wr " << wc.wr_id << ": " << ibv_wc_status_str(wc.status);
    ++ok_before_kill;
    ASSERT_LT(seconds_since(start), kBound) << "the transfer made no progress";
  }
  const pid_t dead_pid = victim.pid;
  ASSERT_EQ(kill(dead_pid, SIGKILL), 0);
  const auto killed_at = std::chrono::steady_clock::now();
  // More WRs after the death: outstanding whatever the timing of the kill.
  for (int i = 0; i < 4; ++i) post_one();
  int st = victim.reap();
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);

  // Keep writing until the death shows. Over packets the outstanding WRs already fail; on the
  // intra-host direct path the survivor notices the dead target within milliseconds, then sends by
  // packets, which time out. Until then a write into the dead process's memory may still succeed, as
  // a write that reaches an HCA before the kernel tears the QP down does.
  auto completed = [&] { return static_cast<uint64_t>(ok_before_kill) + after_kill.size(); };
  while (after_kill.empty() || after_kill.back().status == IBV_WC_SUCCESS) {
    if (posted - completed() < 4) post_one();
    ibv_wc wc{};
    if (!poll_wc(s.scq, &wc, kBound)) break;
    after_kill.push_back(wc);
    if (seconds_since(killed_at) > kBound) break;
  }
  while (completed() < posted) {
    ibv_wc wc{};
    if (!poll_wc(s.scq, &wc, kBound)) break;
    after_kill.push_back(wc);
  }
  const double took = seconds_since(killed_at);
  ASSERT_EQ(static_cast<uint64_t>(ok_before_kill) + after_kill.size(), posted) << "every WR completes";
  EXPECT_LT(took, 30.0) << "errors took " << took << " s (timeout 12, retry_cnt 3: about 0.1 s)";
  // In send-queue order: successes (acknowledged before the death), one RETRY_EXC_ERR, then flushes.
  size_t i = 0;
  while (i < after_kill.size() && after_kill[i].status == IBV_WC_SUCCESS) ++i;
  ASSERT_LT(i, after_kill.size()) << "no WR failed";
  EXPECT_EQ(after_kill[i].status, IBV_WC_RETRY_EXC_ERR) << ibv_wc_status_str(after_kill[i].status);
  for (size_t j = i + 1; j < after_kill.size(); ++j)
    EXPECT_EQ(after_kill[j].status, IBV_WC_WR_FLUSH_ERR) << "wr " << after_kill[j].wr_id << ": "
                                                        << ibv_wc_status_str(after_kill[j].status);
  for (size_t j = 0; j < after_kill.size(); ++j) {
    EXPECT_EQ(after_kill[j].wr_id, static_cast<uint64_t>(ok_before_kill) + j) << "completions in order";
    EXPECT_EQ(after_kill[j].qp_num, s.qpn());
  }
  EXPECT_EQ(qp_state(s.qp), IBV_QPS_ERR);
  auto ours = read_stats(s.qpn());
  ASSERT_TRUE(ours.has_value());
  // The dead process's kernel refuses or ends the liveness connection (docs/reliability.md, "Pauses
  // and deaths"): the first timeout after the death fails the WR (peer_gone). Without that evidence
  // retry_cnt runs out (retry_exceeded). One of the two, once.
  EXPECT_EQ(ours->qp.retry_exceeded + ours->qp.peer_gone, 1u);
  EXPECT_GE(ours->qp.timeouts, 1u);

  // The registry: lookup does not judge liveness, so the dead child's entry may still be there (with
  // its pid) until reclaim_dead() frees it; after that it is gone.
  if (auto e = net::Registry::instance().lookup(peer.qpn)) {
    EXPECT_EQ(e->pid, dead_pid);
  }
  net::Registry::instance().reclaim_dead();
  EXPECT_FALSE(net::Registry::instance().lookup(peer.qpn).has_value()) << "dead child's QPN " << peer.qpn;
  for (const auto& [qpn, ep] : net::Registry::instance().entries()) EXPECT_NE(ep.pid, dead_pid) << "QPN " << qpn;
  // Its stats page is no longer reported (read_all removes pages of dead processes).
  for (const auto& snap : core::StatsPage::read_all()) EXPECT_NE(snap.pid, dead_pid);

  // A new child on a new QP of ours: WRITE + READ with data checks.
  Side s2;
  ASSERT_TRUE(s2.create(dev, QpConfig{}));
  auto dst = s2.buf(kChunk);
  auto src2 = s2.buf(kChunk);
  ASSERT_TRUE(dst && dst->mr && src2 && src2->mr);
  fill_pattern(src2->data, kChunk, 302);
  PeerInfo peer2{};
  ASSERT_TRUE(second.connect(s2, dev, c, peer2));
  ASSERT_NE(peer2.qpn, peer.qpn);
  SendWr w(1, IBV_WR_RDMA_WRITE, {src2->sge(0, kChunk)});
  w.rdma(peer2.addr, peer2.rkey);
  SendWr r(2, IBV_WR_RDMA_READ, {dst->sge(0, kChunk)});
  r.rdma(peer2.addr + kReadOff, peer2.rkey);
  ASSERT_EQ(post_send(s2.qp, w), 0);
  ASSERT_EQ(post_send(s2.qp, r), 0);
  auto wcs = poll_wcs(s2.scq, 2, kBound);
  ASSERT_EQ(wcs.size(), 2u);
  expect_wc(wcs[0], {.wr_id = 1, .opcode = IBV_WC_RDMA_WRITE, .qp_num = s2.qpn()});
  expect_wc(wcs[1], {.wr_id = 2, .opcode = IBV_WC_RDMA_READ, .byte_len = kChunk, .qp_num = s2.qpn()});
  EXPECT_EQ(check_pattern(dst->data, kChunk, kSeedChild, kReadOff), kChunk) << "READ data";
  // What we wrote, read back.
  std::memset(dst->data, 0, kChunk);
  SendWr r2(3, IBV_WR_RDMA_READ, {dst->sge(0, kChunk)});
  r2.rdma(peer2.addr, peer2.rkey);
  ASSERT_EQ(post_send(s2.qp, r2), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(s2.scq, &wc, kBound));
  expect_wc(wc, {.wr_id = 3, .opcode = IBV_WC_RDMA_READ, .qp_num = s2.qpn()});
  EXPECT_EQ(check_pattern(dst->data, kChunk, 302), kChunk) << "WRITE data read back";
  char done = 'd';
  ASSERT_TRUE(write_full(second.sock, &done, 1));
  int st2 = second.reap();
  EXPECT_TRUE(WIFEXITED(st2) && WEXITSTATUS(st2) == 0) << "second child status " << st2;
}

}  // namespace
}  // namespace softrdma::hostile_test
