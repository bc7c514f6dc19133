// Two processes: the device is opened after fork in each, QPN/PSN/rkey/address go over a
// socketpair, then WRITE + READ + SEND one way and SEND back.
#include "two_process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace softrdma::verbs_test {
namespace {

struct PeerInfo {
  uint32_t qpn;
  uint32_t psn;
  uint32_t rkey;
  uint64_t addr;
  uint8_t gid[16];
};

constexpr size_t kWriteLen = 256 * 1024;     // parent WRITEs into child [0, 256K)
constexpr size_t kReadOff = 256 * 1024;      // parent READs child [256K, 512K)
constexpr size_t kReadLen = 256 * 1024;
constexpr size_t kRecvOff = 512 * 1024;      // child receives the SEND here
constexpr uint32_t kSendLen = 64 * 1024 + 3;
constexpr size_t kChildBuf = 1024 * 1024;

// The child: returns its exit code (0 = everything checked out).
int child_main(int sock) {
  Device dev;
  if (!dev.ok()) return 10;
  Side s;
  if (!s.create(dev, QpConfig{})) return 11;
  auto buf = s.buf(kChildBuf);
  if (!buf->mr) return 12;
  std::memset(buf->data, 0, kChildBuf);
  fill_pattern(buf->data + kReadOff, kReadLen, 202);
  // Receives can be posted from INIT on, so the SEND never meets an empty queue.
  if (modify_to_init(s.qp, kAllAccess)) return 13;
  if (post_recv(s.qp, 1, {buf->sge(kRecvOff, kSendLen)})) return 13;
  PeerInfo me{s.qpn(), s.psn, buf->rkey(), buf->addr(), {}};
  std::memcpy(me.gid, dev.gid.raw, 16);
  PeerInfo peer{};
  if (!write_full(sock, &me, sizeof(me)) || !read_full(sock, &peer, sizeof(peer))) return 14;
  ibv_gid pg{};
  std::memcpy(pg.raw, peer.gid, 16);
  const ConnConfig conn;
  if (modify_to_rtr(s.qp, peer.qpn, peer.psn, pg, conn, dev.attr) || modify_to_rts(s.qp, s.psn, conn, dev.attr))
    return 15;
  ibv_wc wc{};
  if (!poll_wc(s.rcq, &wc)) return 16;
  if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.byte_len != kSendLen || wc.wr_id != 1 ||
      wc.qp_num != s.qpn())
    return 17;
  if (check_pattern(buf->data + kRecvOff, kSendLen, 203) != kSendLen) return 18;
  // The SEND came after the WRITE: its data is in place.
  if (check_pattern(buf->data, kWriteLen, 201) != kWriteLen) return 19;
  // Answer with a SEND of our own.
  fill_pattern(buf->data, 1000, 204);
  SendWr w(2, IBV_WR_SEND, {buf->sge(0, 1000)});
  if (post_send(s.qp, w)) return 20;
  if (!poll_wc(s.scq, &wc) || wc.status != IBV_WC_SUCCESS || wc.wr_id != 2) return 21;
  const uint8_t ok = 0;
  if (!write_full(sock, &ok, 1)) return 22;
  uint8_t done = 1;
  if (!read_full(sock, &done, 1)) return 23;  // keep the QP until the parent is finished
  return 0;
}

TEST(TwoProcesses, WriteReadSendAcrossFork) {
  int sock = -1;
  const pid_t pid = fork_target(child_main, &sock);
  ASSERT_GE(pid, 0) << "socketpair or fork: " << strerror(errno);
  struct Reap {
    pid_t pid;
    int sock;
    ~Reap() {
      close(sock);
      int st = 0;
      if (pid > 0 && !reap_within(pid, kWaitSeconds, &st)) ADD_FAILURE() << "child did not exit";
    }
  } reap{pid, sock};

  Device dev;
  ASSERT_TRUE(dev.ok());
  Side s;
  ASSERT_TRUE(s.create(dev, QpConfig{}));
  VT_BUF(src, s, kWriteLen + kSendLen);
  VT_BUF(dst, s, kReadLen);
  VT_BUF(rcv, s, 4096);
  fill_pattern(src->data, kWriteLen, 201);
  fill_pattern(src->data + kWriteLen, kSendLen, 203);
  ASSERT_EQ(modify_to_init(s.qp, kAllAccess), 0);
  ASSERT_EQ(post_recv(s.qp, 9, {rcv->sge(0, 4096)}), 0);
  PeerInfo me{s.qpn(), s.psn, src->rkey(), src->addr(), {}};
  std::memcpy(me.gid, dev.gid.raw, 16);
  PeerInfo peer{};
  ASSERT_TRUE(write_full(sock, &me, sizeof(me)));
  ASSERT_TRUE(read_full(sock, &peer, sizeof(peer))) << "child never sent its QP info";
  EXPECT_NE(peer.qpn, s.qpn()) << "QPNs are unique per host, across processes";
  ibv_gid pg{};
  std::memcpy(pg.raw, peer.gid, 16);
  const ConnConfig conn;
  ASSERT_EQ(modify_to_rtr(s.qp, peer.qpn, peer.psn, pg, conn, dev.attr), 0);
  ASSERT_EQ(modify_to_rts(s.qp, s.psn, conn, dev.attr), 0);

  SendWr w(1, IBV_WR_RDMA_WRITE, {src->sge(0, kWriteLen)});
  w.rdma(peer.addr, peer.rkey);
  ASSERT_EQ(post_send(s.qp, w), 0);
  SendWr r(2, IBV_WR_RDMA_READ, {dst->sge(0, kReadLen)});
  r.rdma(peer.addr + kReadOff, peer.rkey);
  ASSERT_EQ(post_send(s.qp, r), 0);
  SendWr sd(3, IBV_WR_SEND, {src->sge(kWriteLen, kSendLen)});
  ASSERT_EQ(post_send(s.qp, sd), 0);
  auto wcs = poll_wcs(s.scq, 3);
  ASSERT_EQ(wcs.size(), 3u);
  expect_wc(wcs[0], {.wr_id = 1, .opcode = IBV_WC_RDMA_WRITE, .qp_num = s.qpn()});
  expect_wc(wcs[1], {.wr_id = 2, .opcode = IBV_WC_RDMA_READ, .byte_len = kReadLen, .qp_num = s.qpn()});
  expect_wc(wcs[2], {.wr_id = 3, .opcode = IBV_WC_SEND, .qp_num = s.qpn()});
  EXPECT_EQ(check_pattern(dst->data, kReadLen, 202), kReadLen);

  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(s.rcq, &wc));
  expect_wc(wc, {.wr_id = 9, .opcode = IBV_WC_RECV, .byte_len = 1000, .qp_num = s.qpn()});
  EXPECT_EQ(check_pattern(rcv->data, 1000, 204), 1000u);

  uint8_t child_ok = 0xff;
  EXPECT_TRUE(read_full(sock, &child_ok, 1)) << "child reported nothing";
  EXPECT_EQ(child_ok, 0);
  const uint8_t done = 1;
  write_full(sock, &done, 1);
  int st = 0;
  const bool exited = reap_within(pid, kWaitSeconds, &st);
  reap.pid = -1;  // reaped (killed if it had not exited)
  ASSERT_TRUE(exited) << "child did not exit";
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "child failed at step " << WEXITSTATUS(st);
}

}  // namespace
}  // namespace softrdma::verbs_test
