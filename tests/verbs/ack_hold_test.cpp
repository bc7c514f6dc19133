// A receiver that ends right after polling its last message (it exits, destroys its QP, or moves it
// to ERR as rdma_disconnect does): the sender's SEND still completes successfully, as on an HCA, which
// acknowledged the message when it placed it. softrdma may hold the ACK of what a polling application
// is about to see for the answer it posts next (transport/engine.h, held_); these are the ends that
// must send it all the same.
#include "two_process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace softrdma::verbs_test {
namespace {

enum class End { Exit, DestroyQp, ErrorQp };
const char* end_name(End e) {
  switch (e) {
    case End::Exit: return "Exit";
    case End::DestroyQp: return "DestroyQp";
    case End::ErrorQp: return "ErrorQp";
  }
  return "?";
}

struct Info {
  uint32_t qpn;
  uint32_t psn;
  uint8_t gid[16];
};

constexpr uint32_t kLen = 64;
constexpr int kRounds = 4;

// The receiver: by packets (the held ACK is the transport's), polls until two SENDs arrived, then ends.
template <End end>
int receiver_main(int sock) {
  Device dev(Device::Later{});
  if (!dev.open(Path::Packets)) return 10;
  Side s;
  if (!s.create(dev, QpConfig{})) return 11;
  auto buf = s.buf(4096);
  if (!buf->mr || modify_to_init(s.qp, kAllAccess) || post_recv(s.qp, 1, {buf->sge(0, kLen)}) ||
      post_recv(s.qp, 2, {buf->sge(kLen, kLen)}))
    return 12;
  Info peer{};
  if (int rc = serve_connect(sock, dev, s, Info{s.qpn(), s.psn, {}}, peer, 13)) return rc;
  // Spinning in ibv_poll_cq: the application drives its engine. The first SEND wakes the progress
  // thread, which then sees the poller and goes quiet; the second finds it quiet (the hold's case).
  for (uint64_t id = 1; id <= 2; ++id) {
    ibv_wc wc{};
    if (!poll_wc(s.rcq, &wc) || wc.status != IBV_WC_SUCCESS || wc.wr_id != id || wc.byte_len != kLen) return 20;
  }
  if (check_pattern(buf->data, kLen, 31) != kLen || check_pattern(buf->data + kLen, kLen, 32) != kLen) return 21;
  switch (end) {
    case End::Exit:
      exit(0);  // atexit handlers run; no verbs object is destroyed
    case End::DestroyQp:
      _exit(ibv_destroy_qp(s.qp) ? 22 : 0);
    case End::ErrorQp: {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_ERR;
      _exit(ibv_modify_qp(s.qp, &a, IBV_QP_STATE) ? 23 : 0);
    }
  }
  return 24;
}

int (*receiver_for(End e))(int) {
  switch (e) {
    case End::Exit: return receiver_main<End::Exit>;
    case End::DestroyQp: return receiver_main<End::DestroyQp>;
    case End::ErrorQp: return receiver_main<End::ErrorQp>;
  }
  return nullptr;
}

class AckHold : public ::testing::TestWithParam<End> {};

TEST_P(AckHold, ReceiverThatEndsRightAfterItsPollAcknowledges) {
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    int sock = -1;
    const pid_t pid = fork_target(receiver_for(GetParam()), &sock);
    ASSERT_GT(pid, 0);
    {
      Device dev(Device::Later{});
      ASSERT_TRUE(dev.open(Path::Packets));
      Side s;
      ASSERT_TRUE(s.create(dev, QpConfig{}));
      auto src = s.buf(4096);
      ASSERT_TRUE(src->mr);
      fill_pattern(src->data, kLen, 31);
      fill_pattern(src->data + kLen, kLen, 32);
      ASSERT_EQ(modify_to_init(s.qp, kAllAccess), 0);
      Info me{s.qpn(), s.psn, {}}, peer{};
      std::memcpy(me.gid, dev.gid.raw, 16);
      ASSERT_TRUE(read_full(sock, &peer, sizeof peer));
      ASSERT_TRUE(write_full(sock, &me, sizeof me));
      ibv_gid pg{};
      std::memcpy(pg.raw, peer.gid, 16);
      const ConnConfig conn;
      ASSERT_EQ(modify_to_rtr(s.qp, peer.qpn, peer.psn, pg, conn, dev.attr), 0);
      ASSERT_EQ(modify_to_rts(s.qp, s.psn, conn, dev.attr), 0);
      char ready = 0;
      ASSERT_TRUE(read_full(sock, &ready, 1));
      ASSERT_EQ(ready, 'r');
      for (uint64_t id = 1; id <= 2; ++id) {
        usleep(50000);  // the receiver spins in its poll meanwhile
        SendWr w(id, IBV_WR_SEND, {src->sge((id - 1) * kLen, kLen)});
        ASSERT_EQ(post_send(s.qp, w), 0);
        ibv_wc wc{};
        ASSERT_TRUE(poll_wc(s.scq, &wc));
        expect_wc(wc, {.wr_id = id, .status = IBV_WC_SUCCESS, .opcode = IBV_WC_SEND, .qp_num = s.qpn()});
      }
    }
    int st = 0;
    ASSERT_TRUE(reap_within(pid, kWaitSeconds, &st));
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "receiver status " << st;
    close(sock);
  }
}

INSTANTIATE_TEST_SUITE_P(Ends, AckHold, ::testing::Values(End::Exit, End::DestroyQp, End::ErrorQp),
                         [](const ::testing::TestParamInfo<End>& i) { return std::string(end_name(i.param)); });

}  // namespace
}  // namespace softrdma::verbs_test
