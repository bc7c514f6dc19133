// Hostile datagrams at a live wire-protected RC QP (softrdma_qp_set_wire_key, docs/security.md):
// from a plain UDP socket, at b's QPN and the PSN b expects next, in the protected form (TVer 1, the
// ICRC's 4 bytes zero, as a sender's: nothing checks them) or, every other one, with a valid ICRC:
//   - packets sealed under the real key with counters a already used (what a replay of captured
//     packets is, even with its PSN made acceptable): refused by the replay window (auth_replay);
//   - those packets with one byte changed (headers, payload, counter, tag): refused (auth_fail);
//   - forged trailers, and plain RoCEv2 requests with the right rkey: refused (auth_fail).
// Nothing is accepted (auth_ok unchanged), no memory changes, no completion appears, and the pair
// still carries a WRITE and a SEND byte for byte afterwards. The contexts run with SOFTRDMA_DIRECT=0
// (their own setting), so their own traffic is packets too.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "hostile.h"
#include "verbs/private_abi.h"
#include "wire/protect.h"

namespace softrdma::hostile_test {
namespace {

constexpr uint8_t kSecret[32] = {7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2,
                                 3, 5, 3, 6, 0, 2, 8, 7, 4, 7, 1, 3, 5, 2, 6, 6};
constexpr uint32_t kLoopbackBe = 0x0100007f;  // 127.0.0.1 in network order (little-endian host)
constexpr uint32_t kWrite = 16 * 1024, kSend = 4 * 1024;  // 16 + 4 packets at MTU 1024

class WireProtected : public ::testing::TestWithParam<wire::Protection> {
 protected:
  void SetUp() override {
    da_ = std::make_unique<Device>("SOFTRDMA_DIRECT=0");
    db_ = std::make_unique<Device>("SOFTRDMA_DIRECT=0");
    ASSERT_TRUE(da_->ok() && db_->ok());
    QpConfig qc;
    ASSERT_TRUE(a_.create(*da_, qc));
    ASSERT_TRUE(b_.create(*db_, qc));
    conn_.path_mtu = IBV_MTU_1024;
    const uint32_t mode = static_cast<uint32_t>(GetParam());
    for (Side* s : {&a_, &b_}) {
      ASSERT_EQ(0, modify_to_init(s->qp, conn_.access));
      ASSERT_EQ(0, softrdma_qp_set_wire_key(s->qp, mode, kSecret, sizeof kSecret));
    }
    EXPECT_EQ(EINVAL, softrdma_qp_set_wire_key(a_.qp, mode, kSecret, 15));
    ASSERT_EQ(0, modify_to_rtr(a_.qp, b_.qpn(), b_.psn, db_->gid, conn_, db_->attr));
    ASSERT_EQ(0, modify_to_rtr(b_.qp, a_.qpn(), a_.psn, da_->gid, conn_, da_->attr));
    EXPECT_EQ(EINVAL, softrdma_qp_set_wire_key(a_.qp, mode, kSecret, 32)) << "only before RTR";
    ASSERT_EQ(0, modify_to_rts(a_.qp, a_.psn, conn_, da_->attr));
    ASSERT_EQ(0, modify_to_rts(b_.qp, b_.psn, conn_, db_->attr));
    src_ = a_.buf(kWrite + kSend);
    target_ = b_.buf(kTargetLen);
    rbuf_ = b_.buf(kSend);
    ASSERT_TRUE(src_ && src_->mr && target_ && target_->mr && rbuf_ && rbuf_->mr);
    auto e = net::Registry::instance().lookup(b_.qpn());
    ASSERT_TRUE(e);
    ep_ = *e;
  }

  // a WRITEs kWrite bytes at target+off and SENDs kSend bytes into a receive posted on b; all checked.
  void traffic(size_t off, uint8_t seed) {
    for (uint32_t i = 0; i < kWrite + kSend; ++i) src_->data[i] = static_cast<uint8_t>(i * 13 + seed);
    ibv_sge rs = rbuf_->sge(0, kSend);
    ibv_recv_wr rwr{};
    rwr.wr_id = 100 + seed;
    rwr.sg_list = &rs;
    rwr.num_sge = 1;
    ibv_recv_wr* bad_r = nullptr;
    ASSERT_EQ(0, ibv_post_recv(b_.qp, &rwr, &bad_r));
    ibv_sge s1 = src_->sge(0, kWrite), s2 = src_->sge(kWrite, kSend);
    ibv_send_wr w2{};
    w2.wr_id = 2;
    w2.sg_list = &s2;
    w2.num_sge = 1;
    w2.opcode = IBV_WR_SEND;
    w2.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr w1{};
    w1.wr_id = 1;
    w1.sg_list = &s1;
    w1.num_sge = 1;
    w1.opcode = IBV_WR_RDMA_WRITE;
    w1.wr.rdma.remote_addr = target_->addr(off);
    w1.wr.rdma.rkey = target_->rkey();
    w1.next = &w2;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(0, ibv_post_send(a_.qp, &w1, &bad));
    ibv_wc wc;
    ASSERT_TRUE(poll_wc(a_.scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, 2u);
    ASSERT_TRUE(poll_wc(b_.rcq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.byte_len, kSend);
    EXPECT_EQ(0, std::memcmp(target_->data + off, src_->data, kWrite));
    EXPECT_EQ(0, std::memcmp(rbuf_->data, src_->data + kWrite, kSend));
    a_next_ += (kWrite + kSend) / 1024;
  }

  // A WRITE ONLY of 64 bytes at target, at b's expected PSN, sealed under a's real key with counter.
  std::vector<uint8_t> sealed_write(uint64_t counter) {
    wire::Packet p{};
    p.bth.opcode = wire::kRcWriteOnly;
    p.bth.pkey = wire::kDefaultPkey;
    p.bth.dest_qp = b_.qpn();
    p.bth.psn = a_next_ & 0xFFFFFF;
    p.bth.ack_req = true;
    p.bth.tver = wire::kProtectTver;
    p.reth = {target_->addr(), target_->rkey(), 64};
    const uint32_t hdr = wire::opcode_info(p.bth.opcode).header_len;
    std::vector<uint8_t> d(hdr + 64 + wire::kProtectTrailerLen, 0x99);
    wire::write_headers(p, d.data());
    wire::DirectionKey k{};
    EXPECT_TRUE(wire::derive_direction_key(kSecret, 32, GetParam(), wire::IpAddress::v4(kLoopbackBe), a_.qpn(),
                                           wire::IpAddress::v4(kLoopbackBe), b_.qpn(), &k));
    wire::PacketCipher c;
    EXPECT_TRUE(c.init(GetParam(), k, true));
    EXPECT_TRUE(c.seal(d.data(), hdr, 64, counter));
    return d;
  }
  // icrc: a valid ICRC after the packet; otherwise 4 zero bytes, as a protected packet carries.
  void send(std::vector<uint8_t> d, bool icrc = true) {
    if (icrc) {
      add_icrc(d, sock_.port(), ep_.port);
    } else {
      d.insert(d.end(), 4, 0);
    }
    sock_.send(d, ep_.port);
    ++sent_;
  }
  Stats wait_for(const Stats& before, uint64_t n) {
    Stats s{};
    for (int i = 0; i < 3000; ++i) {
      s = *read_stats(b_.qpn());
      if (s.dev.rx_packets - before.dev.rx_packets >= n) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return s;
  }

  std::unique_ptr<Device> da_, db_;
  Side a_, b_;
  ConnConfig conn_;
  std::unique_ptr<Buffer> src_, target_, rbuf_;
  net::Endpoint ep_{};
  HostileSocket sock_;
  uint64_t sent_ = 0;
  uint32_t a_next_ = 0;
};

TEST_P(WireProtected, ForgedTamperedAndReplayedDatagramsAreRefused) {
  a_next_ = a_.psn;
  traffic(0, 1);  // a has now used counters 0.. at least 19
  const Stats s0 = *read_stats(b_.qpn());
  EXPECT_GE(s0.qp.auth_ok, 20u);
  EXPECT_EQ(s0.qp.auth_fail, 0u);
  std::vector<uint8_t> mem_before(target_->data, target_->data + kTargetLen);
  // Replays: genuine packets with counters a already used, at the PSN b expects.
  const uint64_t replays = 8;
  for (uint64_t c = 0; c < replays; ++c) send(sealed_write(c), c % 2);
  // Tampering: a genuine packet with a fresh counter, one byte changed at each place in turn, and its
  // TVer set back to RoCEv2's 0.
  const std::vector<uint8_t> fresh = sealed_write(1ull << 40);
  uint64_t tampered = 0;
  for (size_t pos = 0; pos < fresh.size(); pos += 3) {
    if (pos == 4 || (pos >= 5 && pos <= 7)) continue;  // ECN bits (masked); the QPN (another QP's drop)
    std::vector<uint8_t> d = fresh;
    d[pos] ^= 0x20;
    send(d, tampered % 2);
    ++tampered;
  }
  std::vector<uint8_t> tver0 = fresh;
  tver0[1] &= 0xF0;
  send(tver0);
  ++tampered;
  // Forgeries: a made-up tag; and a plain RoCEv2 WRITE (no trailer) with the right rkey.
  std::vector<uint8_t> forged = fresh;
  for (size_t i = forged.size() - 16; i < forged.size(); ++i) forged[i] = static_cast<uint8_t>(i);
  send(forged);
  wire::Packet p{};
  p.bth.opcode = wire::kRcWriteOnly;
  p.bth.pkey = wire::kDefaultPkey;
  p.bth.dest_qp = b_.qpn();
  p.bth.psn = a_next_ & 0xFFFFFF;
  p.reth = {target_->addr(), target_->rkey(), 64};
  const uint8_t payload[64] = {0xBA, 0xD0};
  send(build_body(p, payload, 64));
  const uint64_t failed = tampered + 2;
  const Stats s1 = wait_for(s0, sent_);
  EXPECT_EQ(s1.dev.rx_packets - s0.dev.rx_packets, sent_);
  EXPECT_EQ(s1.qp.auth_replay - s0.qp.auth_replay, replays);
  EXPECT_EQ(s1.qp.auth_fail - s0.qp.auth_fail, failed);
  EXPECT_EQ(s1.dev.auth_fail - s0.dev.auth_fail, failed);
  EXPECT_EQ(s1.qp.auth_ok, s0.qp.auth_ok) << "nothing hostile was accepted";
  EXPECT_EQ(s1.dev.drop_icrc, s0.dev.drop_icrc) << "the protected QP checks tags, not ICRCs";
  EXPECT_EQ(s1.dev.drop_malformed, s0.dev.drop_malformed);
  EXPECT_EQ(0, std::memcmp(target_->data, mem_before.data(), kTargetLen));
  EXPECT_EQ(0, drain_cq(b_.rcq)) << "no receive completed";
  EXPECT_EQ(qp_state(b_.qp), IBV_QPS_RTS);
  // The connection still works.
  traffic(4096, 2);
  const Stats s2 = *read_stats(b_.qpn());
  EXPECT_GE(s2.qp.auth_ok - s1.qp.auth_ok, 20u);
}

INSTANTIATE_TEST_SUITE_P(Modes, WireProtected, ::testing::Values(wire::Protection::Auth, wire::Protection::Encrypt),
                         [](const auto& info) { return std::string(wire::protection_name(info.param)); });

}  // namespace
}  // namespace softrdma::hostile_test
