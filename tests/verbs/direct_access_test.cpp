// A target QP's remote access flags changed while it is in RTS (ibv_modify_qp with
// IBV_QP_ACCESS_FLAGS alone) govern every request that arrives afterwards, as a responder checks them
// per request: a WRITE after REMOTE_WRITE is revoked fails with REM_ACCESS_ERR and writes nothing.
// Two processes on one host, so on softrdma this runs on the direct path (docs/direct-path.md).
#include "two_process.h"

#include <cstdlib>
#include <cstring>

namespace softrdma::verbs_test {
namespace {

constexpr size_t kLen = 16 * 1024;

struct Info {
  uint32_t qpn, psn, rkey;
  uint64_t addr;
  uint8_t gid[16];
};

// The target: one buffer with every right; 'w' revokes REMOTE_WRITE from its QP in RTS, 'c' sends
// the buffer, 'x' ends.
int target_main(int sock) {
  Device dev;
  if (!dev.ok()) return 10;
  Side s;
  if (!s.create(dev, QpConfig{})) return 11;
  auto b = s.buf(kLen);
  if (!b->mr) return 12;
  fill_pattern(b->data, kLen, 31);
  if (modify_to_init(s.qp, kAllAccess)) return 13;
  Info peer{};
  if (int rc = serve_connect(sock, dev, s, Info{s.qpn(), s.psn, b->rkey(), b->addr(), {}}, peer, 14)) return rc;
  for (;;) {
    char cmd = 0;
    if (!read_full(sock, &cmd, 1)) return 16;
    switch (cmd) {
      case 'w': {
        ibv_qp_attr a{};
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
        if (ibv_modify_qp(s.qp, &a, IBV_QP_ACCESS_FLAGS)) return 17;
        break;
      }
      case 'c':
        if (!write_full(sock, b->data, kLen)) return 18;
        break;
      case 'x':
        return 0;
      default:
        return 19;
    }
    if (!write_full(sock, &cmd, 1)) return 20;
  }
}

class DirectAccess : public ForkedTarget {
 protected:
  DirectAccess() : ForkedTarget(target_main) {}
  void TearDown() override {
    src.reset();
    s.reset();
    dev.reset();
    ForkedTarget::TearDown();
  }
  void command(char c) {
    ASSERT_TRUE(write_full(sock, &c, 1));
    char ack = 0;
    ASSERT_TRUE(read_full(sock, &ack, 1));
    ASSERT_EQ(ack, c);
  }
  std::vector<uint8_t> contents() {
    std::vector<uint8_t> v(kLen);
    char cmd = 'c', ack = 0;
    EXPECT_TRUE(write_full(sock, &cmd, 1));
    EXPECT_TRUE(read_full(sock, v.data(), kLen));
    EXPECT_TRUE(read_full(sock, &ack, 1));
    return v;
  }
  ibv_wc write(uint64_t wr_id, uint32_t seed) {
    fill_pattern(src->data, kLen, seed);
    SendWr w(wr_id, IBV_WR_RDMA_WRITE, {src->sge(0, kLen)});
    w.rdma(peer.addr, peer.rkey);
    EXPECT_EQ(post_send(s.qp, w), 0);
    ibv_wc wc{};
    EXPECT_TRUE(poll_wc(s.scq, &wc));
    return wc;
  }
  std::unique_ptr<Device> dev;
  Side s;
  std::unique_ptr<Buffer> src;
  Info peer{};
};

TEST_F(DirectAccess, RemoteWriteRevokedInRtsRefusesLaterWrites) {
  dev = std::make_unique<Device>();
  ASSERT_TRUE(dev->ok());
  ASSERT_TRUE(s.create(*dev, QpConfig{}));
  src = s.buf(kLen);
  ASSERT_TRUE(src->mr);
  ASSERT_EQ(modify_to_init(s.qp, kAllAccess), 0);
  ASSERT_NO_FATAL_FAILURE(connect_target(Info{s.qpn(), s.psn, 0, 0, {}}, peer, s, *dev, ConnConfig{}));
  const uint64_t ops = my_counter(&core::Counters::direct_ops);
  ibv_wc wc = write(1, 41);
  expect_wc(wc, {.wr_id = 1, .opcode = IBV_WC_RDMA_WRITE, .qp_num = s.qpn()});
  // Where softrdma runs it on the direct path (its default), the test is about that path.
  const char* direct = getenv("SOFTRDMA_DIRECT");
  if (!getenv("VT_DEVICE") && !getenv("SOFTRDMA_IMPAIR") && !(direct && std::strcmp(direct, "0") == 0)) {
    EXPECT_GT(my_counter(&core::Counters::direct_ops), ops);
  }
  std::vector<uint8_t> c = contents();
  EXPECT_EQ(check_pattern(c.data(), kLen, 41), kLen);
  ASSERT_NO_FATAL_FAILURE(command('w'));
  wc = write(2, 42);
  EXPECT_EQ(wc.wr_id, 2u);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  c = contents();
  EXPECT_EQ(check_pattern(c.data(), kLen, 41), kLen) << "nothing of the refused WRITE is written";
}

}  // namespace
}  // namespace softrdma::verbs_test
