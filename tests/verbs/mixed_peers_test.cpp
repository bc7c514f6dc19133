// A context with an intra-host direct peer and a peer by packets (UCX connects an MPI rank to itself
// as well as to the ranks of other hosts): its empty polls must serve the sockets as those of a
// context without direct peers do, each one a progress pass in the caller's thread (run to
// completion), not only every 1024th one, which left the other host's packets to the progress
// thread. Counted by the device's poll_passes: no timing.
#include "two_process.h"  // my_counter

#include <cstdlib>

namespace softrdma::verbs_test {
namespace {

constexpr int kPolls = 16;

// Passes that `polls` empty polls of cq ran.
uint64_t passes_of_empty_polls(ibv_cq* cq, int polls = kPolls) {
  const uint64_t before = my_counter(&core::Counters::poll_passes);
  for (int i = 0; i < polls; ++i) {
    ibv_wc wc{};
    EXPECT_EQ(ibv_poll_cq(cq, 1, &wc), 0);
  }
  return my_counter(&core::Counters::poll_passes) - before;
}

TEST(MixedPeers, EmptyPollsServePacketsBesideADirectPeer) {
  if (std::getenv("VT_DEVICE")) GTEST_SKIP() << "softrdma's private ABI and counters";
  Device mixed("SOFTRDMA_DIRECT=1");
  Device remote(Device::Later{});
  ASSERT_TRUE(mixed.ok());
  ASSERT_TRUE(remote.open(Path::Packets)) << "the loopback device without the direct path";
  // self_a <-> self_b: two QPs of the mixed context, on the direct path; near <-> far: the mixed
  // context's QP towards one of a context that takes packets only (a peer on another host, as far as
  // the direct path goes: nobody answers there).
  Side self_a, self_b, near, far;
  ASSERT_TRUE(self_a.create(mixed, QpConfig{}) && self_b.create(mixed, QpConfig{}));
  ASSERT_TRUE(near.create(mixed, QpConfig{}) && far.create(remote, QpConfig{}));
  ConnConfig c;
  ASSERT_EQ(bring_up(self_a.qp, self_a.psn, self_b.qpn(), self_b.psn, mixed.gid, c, mixed.attr), 0);
  ASSERT_EQ(bring_up(self_b.qp, self_b.psn, self_a.qpn(), self_a.psn, mixed.gid, c, mixed.attr), 0);
  ASSERT_EQ(bring_up(near.qp, near.psn, far.qpn(), far.psn, remote.gid, c, mixed.attr), 0);
  ASSERT_EQ(bring_up(far.qp, far.psn, near.qpn(), near.psn, mixed.gid, c, remote.attr), 0);

  // Both kinds of peer work: a WRITE on the direct path, a SEND by packets.
  auto src = self_a.buf(4096), dst = self_b.buf(4096), msg = far.buf(64), in = near.buf(64);
  ASSERT_TRUE(src->mr && dst->mr && msg->mr && in->mr);
  const uint64_t direct_ops = my_counter(&core::Counters::direct_ops);
  SendWr w(1, IBV_WR_RDMA_WRITE, {src->sge(0, 4096)});
  w.rdma(dst->addr(), dst->rkey());
  ASSERT_EQ(post_send(self_a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(self_a.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_GT(my_counter(&core::Counters::direct_ops), direct_ops) << "the direct peer is not on the direct path";
  // A SEND by packets, far -> near, received and completed.
  auto send_by_packets = [&](uint64_t id) {
    ASSERT_EQ(post_recv(near.qp, id, {in->sge(0, 64)}), 0);
    SendWr s(id + 1, IBV_WR_SEND, {msg->sge(0, 64)});
    ASSERT_EQ(post_send(far.qp, s), 0);
    ASSERT_TRUE(poll_wc(near.rcq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    ASSERT_TRUE(poll_wc(far.scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  };
  ASSERT_NO_FATAL_FAILURE(send_by_packets(2));

  EXPECT_EQ(passes_of_empty_polls(near.rcq), static_cast<uint64_t>(kPolls))
      << "an empty poll of a context with a peer by packets did not serve its sockets";
  EXPECT_EQ(passes_of_empty_polls(self_a.scq), static_cast<uint64_t>(kPolls)) << "any CQ of that context";

  // Thousands of passes with no packet either way (UCX's UD wire-up QP, once its connections went
  // direct): a pass on every 64th empty poll only, until packets move again.
  constexpr int kMany = 16384;
  EXPECT_LT(passes_of_empty_polls(self_a.scq, kMany), static_cast<uint64_t>(kMany / 2))
      << "a quiet packet peer kept every empty poll on the sockets";
  ASSERT_NO_FATAL_FAILURE(send_by_packets(4));
  EXPECT_EQ(passes_of_empty_polls(near.rcq), static_cast<uint64_t>(kPolls)) << "packets moved: every poll again";

  // With the peer by packets gone (its QP reset), the direct peer's polls keep their speed again:
  // they leave the sockets to the progress thread (a pass every 1024th empty poll).
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(near.qp, &r, IBV_QP_STATE), 0);
  EXPECT_LE(passes_of_empty_polls(self_a.scq), 1u);
}

}  // namespace
}  // namespace softrdma::verbs_test
