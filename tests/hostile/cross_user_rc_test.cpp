// Cross-user RC over packets: a process of uid 61234 and this one (root) connect RC QPs on the
// loopback device. Each finds the other's QPN in the other's per-user registry file (the registry
// lets no user write another's file, yet lookups must work across users), and data moves both
// ways byte for byte. Needs root; skips otherwise. The direct path is off: this is the packet path.
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "hostile.h"
#include "two_process.h"

namespace softrdma::hostile_test {
namespace {

constexpr uid_t kOtherUid = 61234;
constexpr size_t kHalf = 1u << 20;
constexpr uint32_t kSeedChild = 500, kSeedParent = 501;
constexpr int kBound = 60;
// Both sides' contexts: the direct path off, their own setting (Device(settings)).
constexpr const char* kPackets = "SOFTRDMA_DIRECT=0";

struct Facts {
  uint32_t qpn, psn, rkey;
  uint64_t addr;
  int32_t uid;
};

// The other user's process: drops to uid 61234 before it opens anything, serves its memory, and on
// 'c' checks what the parent wrote into its second half.
int child_main(int sock) {
  char go;
  if (!read_full(sock, &go, 1, kBound)) return 9;
  if (setgroups(0, nullptr) != 0 || setresgid(kOtherUid, kOtherUid, kOtherUid) != 0 ||
      setresuid(kOtherUid, kOtherUid, kOtherUid) != 0)
    return 10;
  Device dev(kPackets);
  if (!dev.ok()) return 11;
  Side s;
  if (!s.create(dev, QpConfig{})) return 12;
  auto buf = s.buf(2 * kHalf);
  if (!buf->mr) return 13;
  fill_pattern(buf->data, kHalf, kSeedChild);
  std::memset(buf->data + kHalf, 0, kHalf);
  Facts me{s.qpn(), s.psn, buf->rkey(), buf->addr(), static_cast<int32_t>(geteuid())};
  Facts peer{};
  if (!write_full(sock, &me, sizeof me) || !read_full(sock, &peer, sizeof peer, kBound)) return 14;
  ConnConfig c;
  if (bring_up(s.qp, s.psn, peer.qpn, peer.psn, dev.gid, c, dev.attr)) return 15;
  char ready = 'r';
  if (!write_full(sock, &ready, 1)) return 16;
  char cmd = 0;
  if (!read_full(sock, &cmd, 1, kBound) || cmd != 'c') return 17;
  char verdict = check_pattern(buf->data + kHalf, kHalf, kSeedParent) == kHalf ? 'y' : 'n';
  if (!write_full(sock, &verdict, 1)) return 18;
  (void)!read(sock, &cmd, 1);  // EOF: the parent is done
  return 0;
}

TEST(CrossUser, RcOverPacketsBetweenTwoUsers) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (the peer runs as uid 61234)";
  int sock = -1;
  pid_t pid = fork_target(child_main, &sock);
  ASSERT_GE(pid, 0);
  struct Reaper {
    pid_t pid;
    int sock;
    ~Reaper() {
      close(sock);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reaper{pid, sock};

  Device dev(kPackets);
  ASSERT_TRUE(dev.ok());
  Side s;
  ASSERT_TRUE(s.create(dev, QpConfig{}));
  auto buf = s.buf(2 * kHalf);
  ASSERT_TRUE(buf && buf->mr);
  fill_pattern(buf->data + kHalf, kHalf, kSeedParent);
  std::memset(buf->data, 0, kHalf);

  char go = 'g';
  ASSERT_TRUE(write_full(sock, &go, 1));
  Facts peer{};
  ASSERT_TRUE(read_full(sock, &peer, sizeof peer, kBound)) << "the other user's process sent nothing";
  EXPECT_EQ(peer.uid, static_cast<int32_t>(kOtherUid));
  Facts me{s.qpn(), s.psn, 0, 0, 0};
  ASSERT_TRUE(write_full(sock, &me, sizeof me));
  // The peer's QPN lives in uid 61234's registry file, which we read but cannot write.
  auto entry = net::Registry::instance().lookup(peer.qpn);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->pid, pid);
  ConnConfig c;
  ASSERT_EQ(bring_up(s.qp, s.psn, peer.qpn, peer.psn, dev.gid, c, dev.attr), 0);
  char ready = 0;
  ASSERT_TRUE(read_full(sock, &ready, 1, kBound));
  ASSERT_EQ(ready, 'r');

  SendWr rd(1, IBV_WR_RDMA_READ, {buf->sge(0, kHalf)});
  rd.rdma(peer.addr, peer.rkey);
  ASSERT_EQ(post_send(s.qp, rd), 0);
  SendWr wr(2, IBV_WR_RDMA_WRITE, {buf->sge(kHalf, kHalf)});
  wr.rdma(peer.addr + kHalf, peer.rkey);
  ASSERT_EQ(post_send(s.qp, wr), 0);
  for (uint64_t id : {1u, 2u}) {
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(s.scq, &wc, kBound));
    EXPECT_EQ(wc.wr_id, id);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  }
  EXPECT_EQ(check_pattern(buf->data, kHalf, kSeedChild), kHalf) << "READ from the other user's memory";
  char check = 'c', verdict = 0;
  ASSERT_TRUE(write_full(sock, &check, 1));
  ASSERT_TRUE(read_full(sock, &verdict, 1, kBound));
  EXPECT_EQ(verdict, 'y') << "WRITE into the other user's memory";
}

}  // namespace
}  // namespace softrdma::hostile_test
