// Settings a test gives without the environment (verbs/private_abi.h): a context's own
// (softrdma_open_device_with) over the process's (softrdma_set_option), checked against the
// configuration table, and each applied where it belongs.
#include "two_process.h"  // my_counter
#include "verbs/private_abi.h"

#include <cerrno>
#include <cstdlib>

namespace softrdma::verbs_test {
namespace {

ibv_context* open_with(const char* settings, uint32_t flags = 0) {
  errno = 0;
  return softrdma_open_device_with("softrdma_lo", flags, settings);
}

TEST(PrivateSettings, OpenRefusesWhatTheTableDoesNotTake) {
  if (std::getenv("VT_DEVICE")) GTEST_SKIP() << "softrdma's private ABI";
  for (const char* bad : {"SOFTRDMA_NO_SUCH=1", "SOFTRDMA_DIRECT", "SOFTRDMA_DIRECT=yes", "SOFTRDMA_SPIN_US=-1",
                          "SOFTRDMA_GSO=0;;SOFTRDMA_DIRECT=0", "VT_DEVICE=softrdma_lo"}) {
    EXPECT_EQ(open_with(bad), nullptr) << bad;
    EXPECT_EQ(errno, EINVAL) << bad;
  }
  // Variables that are not a context's: the process reads them (softrdma_set_option).
  for (const char* process : {"SOFTRDMA_TRANSPORT=iwarp", "SOFTRDMA_REGISTRY=/dev/shm/x", "SOFTRDMA_CM_RETRIES=1"}) {
    EXPECT_EQ(open_with(process), nullptr) << process;
    EXPECT_EQ(errno, EINVAL) << process;
  }
  EXPECT_EQ(open_with("", 1u << 7), nullptr);
  EXPECT_EQ(errno, EINVAL) << "unknown flags";
  EXPECT_EQ(softrdma_open_device_with("softrdma_no_such", 0, "SOFTRDMA_DIRECT=0"), nullptr);
  EXPECT_EQ(errno, ENODEV);
  for (const char* good : {static_cast<const char*>(nullptr), "", "SOFTRDMA_DIRECT=0;SOFTRDMA_SPIN_US=0",
                           "SOFTRDMA_IMPAIR=seed=1,rx_dup=0.01;SOFTRDMA_GSO=;SOFTRDMA_COUNTERS=1;",
                           "SOFTRDMA_DIRECT_PEERS=any;SOFTRDMA_STATS_MODE=0644"}) {
    ibv_context* ctx = open_with(good);
    EXPECT_NE(ctx, nullptr) << (good ? good : "(null)") << ": " << errno;
    if (ctx) ibv_close_device(ctx);
  }
  EXPECT_EQ(softrdma_set_option("SOFTRDMA_NO_SUCH", "1"), EINVAL);
  EXPECT_EQ(softrdma_set_option("SOFTRDMA_TRANSPORT", "infiniband"), EINVAL);
  EXPECT_EQ(softrdma_set_option(nullptr, "1"), EINVAL);
}

// RDMA WRITEs of 4 KiB between two QPs of one context, opened with `settings`: the direct path's
// operations and the packets sent meanwhile.
struct Took {
  uint64_t direct_ops, tx_packets;
};
Took write_between_two_qps(const char* settings) {
  Took t{~0ull, ~0ull};
  Device dev(settings);
  EXPECT_TRUE(dev.ok());
  if (!dev.ok()) return t;
  Side a, b;
  if (!a.create(dev, QpConfig{}) || !b.create(dev, QpConfig{})) return t;
  auto src = a.buf(4096), dst = b.buf(4096);
  EXPECT_TRUE(src->mr && dst->mr);
  ConnConfig c;
  EXPECT_EQ(bring_up(a.qp, a.psn, b.qpn(), b.psn, dev.gid, c, dev.attr), 0);
  EXPECT_EQ(bring_up(b.qp, b.psn, a.qpn(), a.psn, dev.gid, c, dev.attr), 0);
  const uint64_t ops = my_counter(&core::Counters::direct_ops), tx = my_counter(&core::Counters::tx_packets);
  for (uint32_t i = 0; i < 4; ++i) {
    fill_pattern(src->data, 4096, 70 + i);
    SendWr w(i, IBV_WR_RDMA_WRITE, {src->sge(0, 4096)});
    w.rdma(dst->addr(), dst->rkey());
    EXPECT_EQ(post_send(a.qp, w), 0);
    ibv_wc wc{};
    EXPECT_TRUE(poll_wc(a.scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(check_pattern(dst->data, 4096, 70 + i), 4096u);
  }
  t = {my_counter(&core::Counters::direct_ops) - ops, my_counter(&core::Counters::tx_packets) - tx};
  return t;
}

// A context's SOFTRDMA_DIRECT wins over the process's, which wins over the environment's, and each
// context keeps what it opened with.
TEST(PrivateSettings, ContextsOwnWinOverTheProcesss) {
  if (std::getenv("VT_DEVICE")) GTEST_SKIP() << "softrdma's private ABI";
  {
    ScopedOption off("SOFTRDMA_DIRECT", "0");
    const Took packets = write_between_two_qps(nullptr);
    EXPECT_EQ(packets.direct_ops, 0u) << "the process's SOFTRDMA_DIRECT=0";
    EXPECT_GT(packets.tx_packets, 0u);
    EXPECT_GT(write_between_two_qps("SOFTRDMA_DIRECT=1").direct_ops, 0u) << "the context's own SOFTRDMA_DIRECT=1";
  }
  ScopedOption on("SOFTRDMA_DIRECT", "1");  // whatever the environment says (tools/test.sh's second pass)
  EXPECT_GT(write_between_two_qps(nullptr).direct_ops, 0u);
  const Took own = write_between_two_qps("SOFTRDMA_DIRECT=0");
  EXPECT_EQ(own.direct_ops, 0u);
  EXPECT_GT(own.tx_packets, 0u);
  // "": the default, not the process's 1: off under SOFTRDMA_IMPAIR.
  EXPECT_EQ(write_between_two_qps("SOFTRDMA_IMPAIR=seed=3;SOFTRDMA_DIRECT=").direct_ops, 0u);
  EXPECT_GT(write_between_two_qps("SOFTRDMA_IMPAIR=seed=3").direct_ops, 0u) << "the process's SOFTRDMA_DIRECT=1";
}

}  // namespace
}  // namespace softrdma::verbs_test
