// The iWARP data path between two engines over a socketpair (Engine::iwarp_attach): SEND/RECV,
// RDMA WRITE and READ (large, multi-FPDU, non-aligned), SEND with invalidate, solicited events, the
// RTR variants, CRC and markers, completion order, flush when the connection ends. Byte for byte,
// stepped without threads or sleeps.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "iwarp_harness.h"

namespace softrdma::transport::test {
namespace {

void fill(Region& r, uint32_t seed) {
  std::mt19937 rng(seed);
  for (auto& b : r.bytes) b = static_cast<uint8_t>(rng());
}

struct Framing {
  bool crc, markers;
};
class IwarpFraming : public ::testing::TestWithParam<Framing> {
 protected:
  IwOptions opts() const {
    IwOptions o;
    o.crc = GetParam().crc;
    o.markers = GetParam().markers;
    return o;
  }
};

TEST_P(IwarpFraming, SendRecvByteForByte) {
  IwPair p(opts());
  auto src = register_region(p.a.engine(), 1, 600000, kAllAccess);
  auto dst = register_region(p.b.engine(), 1, 600000, kAllAccess);
  fill(*src, 1);
  // Zero-length, one byte, a page and one, several FPDUs (over 64 KiB ULPDUs) from an odd offset.
  const uint32_t sizes[] = {0, 1, 4097, 300001};
  uint64_t off = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_EQ(post(p.b, recv_wqe(100 + i, *dst, off, sizes[i] + 16)), 0);
    ASSERT_EQ(post(p.a, send_wqe(i, *src, off + 3, sizes[i])), 0);
    off += sizes[i] + 64;
  }
  std::vector<core::Cqe> sc, rc;
  ASSERT_TRUE(wait_cqes(p, p.a, *p.a.scq, 4, sc));
  ASSERT_TRUE(wait_cqes(p, p.b, *p.b.rcq, 4, rc));
  off = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(sc[i].wr_id, i);
    EXPECT_EQ(sc[i].status, WcStatus::Success);
    EXPECT_EQ(sc[i].opcode, core::WcOpcode::Send);
    EXPECT_EQ(rc[i].wr_id, 100 + i);
    EXPECT_EQ(rc[i].status, WcStatus::Success);
    EXPECT_EQ(rc[i].opcode, core::WcOpcode::Recv);
    EXPECT_EQ(rc[i].byte_len, sizes[i]);
    EXPECT_EQ(std::memcmp(dst->data() + off, src->data() + off + 3, sizes[i]), 0) << "message " << i;
    off += sizes[i] + 64;
  }
  const auto ca = p.a.engine().counters();
  EXPECT_GE(ca.iw_tx_fpdus, 4u + 300001u / 65535u);
  EXPECT_EQ(p.b.engine().counters().iw_rx_fpdus, ca.iw_tx_fpdus);
}

TEST_P(IwarpFraming, WriteAndReadLargeNonAligned) {
  IwPair p(opts());
  const uint32_t len = 1000003;
  auto la = register_region(p.a.engine(), 1, len + 64, kAllAccess);
  auto rb = register_region(p.b.engine(), 1, len + 64, kAllAccess);
  fill(*la, 2);
  ASSERT_EQ(post(p.a, write_wqe(1, *la, 5, len, rb->addr(11), rb->mr.rkey)), 0);
  std::vector<core::Cqe> sc;
  ASSERT_TRUE(wait_cqes(p, p.a, *p.a.scq, 1, sc));
  EXPECT_EQ(sc[0].status, WcStatus::Success);
  EXPECT_EQ(sc[0].opcode, core::WcOpcode::RdmaWrite);
  // The WRITE's CQE comes when its bytes are in the socket: run until the peer has placed them.
  ASSERT_TRUE(p.run([&] { return std::memcmp(rb->data() + 11, la->data() + 5, len) == 0; }));
  EXPECT_EQ(rb->bytes[10], 0);
  EXPECT_EQ(rb->bytes[11 + len], 0);
  EXPECT_TRUE(poll_all(p.b, *p.b.rcq).empty());  // a WRITE completes nothing at the responder

  // READ it back into another place.
  std::fill(la->bytes.begin(), la->bytes.end(), 0);
  fill(*rb, 3);
  ASSERT_EQ(post(p.a, read_wqe(2, *la, 1, len, rb->addr(7), rb->mr.rkey)), 0);
  sc.clear();
  ASSERT_TRUE(wait_cqes(p, p.a, *p.a.scq, 1, sc));
  EXPECT_EQ(sc[0].wr_id, 2u);
  EXPECT_EQ(sc[0].status, WcStatus::Success);
  EXPECT_EQ(sc[0].opcode, core::WcOpcode::RdmaRead);
  EXPECT_EQ(sc[0].byte_len, len);
  EXPECT_EQ(std::memcmp(la->data() + 1, rb->data() + 7, len), 0);
  EXPECT_EQ(la->bytes[0], 0);
  EXPECT_EQ(la->bytes[1 + len], 0);
}

TEST_P(IwarpFraming, RtrVariantsThenTraffic) {
  for (IwarpRtr rtr : {IwarpRtr::SendWrite, IwarpRtr::SendRead, IwarpRtr::SendSend}) {
    IwOptions o = opts();
    o.rtr_a = rtr;
    o.rtr_b = awaiting(rtr);
    IwPair p(o);
    auto src = register_region(p.a.engine(), 1, 4096, kAllAccess);
    auto dst = register_region(p.b.engine(), 1, 4096, kAllAccess);
    auto bsrc = register_region(p.b.engine(), 1, 4096, kAllAccess);
    auto adst = register_region(p.a.engine(), 1, 4096, kAllAccess);
    fill(*src, 4);
    fill(*bsrc, 5);
    // b (Await) sends nothing until a's RTR FPDU has arrived; then both directions work, and the RTR
    // took no receive WQE: the first SEND lands in the first one posted.
    ASSERT_EQ(post(p.b, recv_wqe(7, *dst, 0, 4096)), 0);
    ASSERT_EQ(post(p.a, recv_wqe(8, *adst, 0, 4096)), 0);
    ASSERT_EQ(post(p.b, send_wqe(9, *bsrc, 0, 1000)), 0);
    ASSERT_EQ(post(p.a, send_wqe(10, *src, 0, 2000)), 0);
    std::vector<core::Cqe> ra, rb, sa, sb;
    ASSERT_TRUE(wait_cqes(p, p.b, *p.b.rcq, 1, rb));
    ASSERT_TRUE(wait_cqes(p, p.a, *p.a.rcq, 1, ra));
    ASSERT_TRUE(wait_cqes(p, p.a, *p.a.scq, 1, sa));
    ASSERT_TRUE(wait_cqes(p, p.b, *p.b.scq, 1, sb));
    EXPECT_EQ(rb[0].wr_id, 7u);
    EXPECT_EQ(rb[0].byte_len, 2000u);
    EXPECT_EQ(ra[0].wr_id, 8u);
    EXPECT_EQ(ra[0].byte_len, 1000u);
    EXPECT_EQ(std::memcmp(dst->data(), src->data(), 2000), 0);
    EXPECT_EQ(std::memcmp(adst->data(), bsrc->data(), 1000), 0);
    EXPECT_EQ(sa.size(), 1u);  // the RTR completes nothing
    EXPECT_EQ(sa[0].wr_id, 10u);
    EXPECT_EQ(sb[0].wr_id, 9u);
    EXPECT_EQ(p.a.qp->state.load(), QpState::Rts);
    EXPECT_EQ(p.b.qp->state.load(), QpState::Rts);
  }
}

INSTANTIATE_TEST_SUITE_P(Framing, IwarpFraming,
                         ::testing::Values(Framing{false, false}, Framing{true, false}, Framing{false, true},
                                           Framing{true, true}),
                         [](const auto& i) {
                           return std::string(i.param.crc ? "crc" : "nocrc") + (i.param.markers ? "_markers" : "");
                         });

TEST(Iwarp, AwaitHoldsTransmissionUntilFirstFpdu) {
  IwOptions o;
  o.rtr_a = IwarpRtr::Await;
  o.rtr_b = IwarpRtr::Await;  // nobody sends first: nothing moves
  IwPair p(o);
  auto src = register_region(p.a.engine(), 1, 64, kAllAccess);
  auto dst = register_region(p.b.engine(), 1, 64, kAllAccess);
  ASSERT_EQ(post(p.b, recv_wqe(1, *dst, 0, 64)), 0);
  ASSERT_EQ(post(p.a, send_wqe(2, *src, 0, 64)), 0);
  for (int i = 0; i < 100; ++i) {
    p.a.engine().step();
    p.b.engine().step();
  }
  EXPECT_EQ(p.a.engine().counters().iw_tx_fpdus, 0u);
  core::Cqe c;
  EXPECT_EQ(p.a.engine().poll_cq(p.a.scq.get(), &c, 1), 0);
}

// A responder whose initiator offered no peer-to-peer mode (await_grace): it waits for the first
// FPDU as RFC 5044 says, but only for kIwarpAwaitGraceNs, as siw's responder does not wait at all;
// an application whose server sends first then works against such an initiator.
TEST(Iwarp, AwaitGraceStartsAfterItsTime) {
  IwPair p(IwOptions{});  // both attached without RTR; a is attached again below as the responder
  auto src = register_region(p.a.engine(), 1, 64, kAllAccess);
  auto dst = register_region(p.b.engine(), 1, 64, kAllAccess);
  // A fresh pair of ends: a awaits with the grace, b is an initiator that does not send first.
  End a2, b2;
  make_iw_end(a2, *p.a.host);
  make_iw_end(b2, *p.b.host);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  IwarpAttach aa;
  aa.fd = sv[0];
  aa.rtr = IwarpRtr::Await;
  aa.await_grace = true;
  aa.ird = aa.ord = 8;
  ASSERT_EQ(p.a.engine().iwarp_attach(a2.qp, aa), 0);
  IwarpAttach ab;
  ab.fd = sv[1];
  ab.ird = ab.ord = 8;
  ASSERT_EQ(p.b.engine().iwarp_attach(b2.qp, ab), 0);
  fill(*src, 3);
  ASSERT_EQ(post(b2, recv_wqe(1, *dst, 0, 64)), 0);
  const uint64_t before = p.a.engine().counters().iw_tx_fpdus;
  ASSERT_EQ(post(a2, send_wqe(2, *src, 0, 64)), 0);
  for (int i = 0; i < 100; ++i) {
    p.a.engine().step();
    p.b.engine().step();
  }
  EXPECT_EQ(p.a.engine().counters().iw_tx_fpdus, before);  // held within the grace
  p.f.net.advance_to(p.f.now() + kIwarpAwaitGraceNs + 1);
  std::vector<core::Cqe> got;
  ASSERT_TRUE(wait_cqes(p, b2, *b2.rcq, 1, got));
  EXPECT_EQ(got[0].status, core::WcStatus::Success);
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), 64), 0);
  destroy(a2);
  destroy(b2);
}

// Without peer-to-peer no RTR was agreed: a first zero-length SEND (a stock siw client's first
// message can be one) is the ULP's message, which completes a receive WQE of length 0, as any later
// one does.
TEST(Iwarp, ZeroLengthSendFirstIsAMessageWhenNoRtrWasAgreed) {
  IwOptions o;
  o.rtr_a = IwarpRtr::None;
  o.rtr_b = IwarpRtr::Await;
  IwPair p(o);
  auto src = register_region(p.a.engine(), 1, 4096, kAllAccess);
  auto dst = register_region(p.b.engine(), 1, 4096, kAllAccess);
  fill(*src, 6);
  ASSERT_EQ(post(p.b, recv_wqe(1, *dst, 0, 2048)), 0);
  ASSERT_EQ(post(p.b, recv_wqe(2, *dst, 2048, 2048)), 0);
  ASSERT_EQ(post(p.a, send_wqe(3, *src, 0, 0)), 0);
  ASSERT_EQ(post(p.a, send_wqe(4, *src, 0, 100)), 0);
  std::vector<core::Cqe> rb;
  ASSERT_TRUE(wait_cqes(p, p.b, *p.b.rcq, 2, rb));
  ASSERT_EQ(rb.size(), 2u);
  EXPECT_EQ(rb[0].wr_id, 1u);
  EXPECT_EQ(rb[0].status, WcStatus::Success);
  EXPECT_EQ(rb[0].byte_len, 0u);
  EXPECT_EQ(rb[1].wr_id, 2u);
  EXPECT_EQ(rb[1].byte_len, 100u);
  EXPECT_EQ(std::memcmp(dst->data() + 2048, src->data(), 100), 0);
  EXPECT_EQ(p.b.qp->state.load(), QpState::Rts);
}

// An initiator with rtr_hold (what our CM asks for towards any peer): its RTR and the SEND posted
// behind it stay queued for kIwarpRtrHoldNs after the attach, then leave in order, the RTR first.
// A fresh pair of ends over a socketpair: a2 an initiator whose WRITE RTR is held (rtr_hold, as our
// CM attaches towards any peer), b2 the responder awaiting it. sv1: b2's end of the socket.
void attach_held_rtr_pair(IwPair& p, End& a2, End& b2, int* sv1) {
  make_iw_end(a2, *p.a.host);
  make_iw_end(b2, *p.b.host);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  *sv1 = sv[1];
  IwarpAttach aa;
  aa.fd = sv[0];
  aa.rtr = IwarpRtr::SendWrite;
  aa.rtr_hold = true;
  aa.ird = aa.ord = 8;
  ASSERT_EQ(p.a.engine().iwarp_attach(a2.qp, aa), 0);
  IwarpAttach ab;
  ab.fd = sv[1];
  ab.rtr = IwarpRtr::AwaitWrite;
  ab.ird = ab.ord = 8;
  ASSERT_EQ(p.b.engine().iwarp_attach(b2.qp, ab), 0);
}

// Steps both engines through each of the zero-length WRITE kicks' times.
void run_through_kicks(IwPair& p) {
  for (uint64_t t : kIwarpRtrKickNs) {
    p.f.net.advance_to(p.f.now() + t);
    for (int i = 0; i < 20; ++i) {
      p.a.engine().step();
      p.b.engine().step();
    }
  }
}

TEST(Iwarp, RtrHoldDelaysTheFirstFpdu) {
  IwPair p(IwOptions{});
  auto src = register_region(p.a.engine(), 1, 64, kAllAccess);
  auto dst = register_region(p.b.engine(), 1, 64, kAllAccess);
  End a2, b2;
  int sv1 = -1;
  ASSERT_NO_FATAL_FAILURE(attach_held_rtr_pair(p, a2, b2, &sv1));
  fill(*src, 5);
  ASSERT_EQ(post(b2, recv_wqe(1, *dst, 0, 64)), 0);
  const uint64_t rx_before = p.b.engine().counters().iw_rx_fpdus;
  ASSERT_EQ(post(a2, send_wqe(2, *src, 0, 64)), 0);
  for (int i = 0; i < 100; ++i) {
    p.a.engine().step();
    p.b.engine().step();
  }
  EXPECT_EQ(p.b.engine().counters().iw_rx_fpdus, rx_before);  // nothing reached the socket yet
  int queued = -1;
  ASSERT_EQ(ioctl(sv1, FIONREAD, &queued), 0);
  EXPECT_EQ(queued, 0);
  p.f.net.advance_to(p.f.now() + kIwarpRtrHoldNs + 1);
  std::vector<core::Cqe> got;
  ASSERT_TRUE(wait_cqes(p, b2, *b2.rcq, 1, got));
  EXPECT_EQ(got[0].status, core::WcStatus::Success);
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), 64), 0);
  EXPECT_EQ(p.b.engine().counters().iw_terminate_sent, 0u);
  // The responder has said nothing: each kick is one zero-length RDMA WRITE, which touches nothing
  // and fails nothing; after the last one there are no more.
  const uint64_t rx_after_send = p.b.engine().counters().iw_rx_fpdus;
  run_through_kicks(p);
  EXPECT_EQ(p.b.engine().counters().iw_rx_fpdus, rx_after_send + std::size(kIwarpRtrKickNs));
  EXPECT_EQ(p.b.engine().counters().iw_terminate_sent, 0u);
  EXPECT_EQ(b2.qp->state.load(), QpState::Rts);
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), 64), 0);
  destroy(a2);
  destroy(b2);
}

// Once the peer has sent an FPDU, no zero-length WRITE follows.
TEST(Iwarp, NoRtrKickOnceThePeerSpoke) {
  IwPair p(IwOptions{});
  auto buf_a = register_region(p.a.engine(), 1, 64, kAllAccess);
  auto buf_b = register_region(p.b.engine(), 1, 64, kAllAccess);
  End a2, b2;
  int sv1 = -1;
  ASSERT_NO_FATAL_FAILURE(attach_held_rtr_pair(p, a2, b2, &sv1));
  ASSERT_EQ(post(a2, recv_wqe(1, *buf_a, 0, 64)), 0);
  fill(*buf_b, 9);
  ASSERT_EQ(post(b2, send_wqe(2, *buf_b, 0, 64)), 0);  // sent once our RTR came
  p.f.net.advance_to(p.f.now() + kIwarpRtrHoldNs + 1);
  std::vector<core::Cqe> got;
  ASSERT_TRUE(wait_cqes(p, a2, *a2.rcq, 1, got));
  EXPECT_EQ(got[0].status, core::WcStatus::Success);
  const uint64_t rx = p.b.engine().counters().iw_rx_fpdus;
  run_through_kicks(p);
  EXPECT_EQ(p.b.engine().counters().iw_rx_fpdus, rx);
  destroy(a2);
  destroy(b2);
}

// The peer closes after its MPA reply, before any FPDU: the initiator's RTR hold and kicks must not
// leave a deadline in the past behind, or its progress thread would spin until the QP is destroyed.
TEST(Iwarp, NoStaleDeadlineAfterAnEarlyClose) {
  IwPair p(IwOptions{});
  End a2, b2;
  int sv1 = -1;
  ASSERT_NO_FATAL_FAILURE(attach_held_rtr_pair(p, a2, b2, &sv1));
  ASSERT_EQ(shutdown(sv1, SHUT_RDWR), 0);
  for (int i = 0; i < 100 && a2.qp->state.load() != QpState::Err; ++i) {
    p.a.engine().step();
    p.b.engine().step();
  }
  ASSERT_EQ(a2.qp->state.load(), QpState::Err);
  p.f.net.advance_to(p.f.now() + kIwarpRtrKickNs[std::size(kIwarpRtrKickNs) - 1] + 1);
  for (int i = 0; i < 20; ++i) p.a.engine().step();
  const uint64_t d = p.a.engine().next_deadline();
  EXPECT_TRUE(d == 0 || d > p.f.now()) << "deadline " << d << " at " << p.f.now();
  destroy(a2);
  destroy(b2);
}

// A Terminate that arrives while the RTR is still held: nothing is written after it, the hold is
// dropped with what it held, and the progress thread has no deadline left in the past (nor work).
TEST(Iwarp, TerminateDuringTheRtrHoldLeavesNoDeadline) {
  IwPair p(IwOptions{});
  End a2, b2;
  int sv1 = -1;
  ASSERT_NO_FATAL_FAILURE(attach_held_rtr_pair(p, a2, b2, &sv1));
  // The peer's Terminate written on b2's socket as a peer would (b2 has sent nothing, no CRC).
  iw::DdpHeader h = send_hdr(1, 0, true, iw::Opcode::Terminate);
  h.qn = iw::kQnTerminate;
  iw::Terminate t{iw::TermLayer::Rdmap, iw::term::kRdmapRemoteOperation, iw::term::kUnspecified};
  uint8_t body[iw::kMaxTerminateLen];
  const size_t blen = iw::encode_terminate(t, body);
  RawPeer raw(false, false);
  raw.fd = sv1;
  raw.send_ulpdu(ulpdu(h, body, blen));
  raw.fd = -1;  // b2 owns it
  for (int i = 0; i < 50 && a2.qp->state.load() != QpState::Err; ++i) p.a.engine().step();
  ASSERT_EQ(a2.qp->state.load(), QpState::Err);
  EXPECT_EQ(transport::iwarp_state(*a2.qp)->tx_hold_until_ns, 0u);
  p.f.net.advance_to(p.f.now() + kIwarpRtrHoldNs + 1);
  for (int i = 0; i < 20; ++i) p.a.engine().step();
  const uint64_t d = p.a.engine().next_deadline();
  EXPECT_TRUE(d == 0 || d > p.f.now()) << "deadline " << d << " at " << p.f.now();
  EXPECT_EQ(p.a.engine().counters().iw_terminate_rcvd, 1u);
  destroy(a2);
  destroy(b2);
}

TEST(Iwarp, CompletionsInSendQueueOrder) {
  IwPair p;
  auto la = register_region(p.a.engine(), 1, 1 << 20, kAllAccess);
  auto rb = register_region(p.b.engine(), 1, 1 << 20, kAllAccess);
  fill(*rb, 6);
  fill(*la, 7);
  // A large READ first: the SEND and WRITE behind it are written at once, but complete after it.
  ASSERT_EQ(post(p.b, recv_wqe(50, *rb, 900000, 1000)), 0);
  ASSERT_EQ(post(p.a, read_wqe(1, *la, 0, 500000, rb->addr(0), rb->mr.rkey)), 0);
  ASSERT_EQ(post(p.a, send_wqe(2, *la, 600000, 100)), 0);
  SendWqe unsignaled = write_wqe(3, *la, 700000, 200, rb->addr(800000), rb->mr.rkey);
  unsignaled.flags = 0;
  ASSERT_EQ(post(p.a, unsignaled), 0);
  ASSERT_EQ(post(p.a, write_wqe(4, *la, 700000, 300, rb->addr(800000), rb->mr.rkey)), 0);
  std::vector<core::Cqe> sc;
  ASSERT_TRUE(wait_cqes(p, p.a, *p.a.scq, 3, sc));
  ASSERT_EQ(sc.size(), 3u);
  EXPECT_EQ(sc[0].wr_id, 1u);
  EXPECT_EQ(sc[1].wr_id, 2u);
  EXPECT_EQ(sc[2].wr_id, 4u);
  for (auto& c : sc) EXPECT_EQ(c.status, WcStatus::Success);
  EXPECT_EQ(std::memcmp(la->data(), rb->data(), 500000), 0);
}

TEST(Iwarp, OrdLimitsOutstandingReads) {
  IwOptions o;
  o.ord = 2;
  o.ird = 2;
  IwPair p(o);
  auto la = register_region(p.a.engine(), 1, 1 << 20, kAllAccess);
  auto rb = register_region(p.b.engine(), 1, 1 << 20, kAllAccess);
  fill(*rb, 8);
  for (uint32_t i = 0; i < 8; ++i)
    ASSERT_EQ(post(p.a, read_wqe(i, *la, i * 100000, 99999, rb->addr(i * 100000 + 1), rb->mr.rkey)), 0);
  std::vector<core::Cqe> sc;
  ASSERT_TRUE(wait_cqes(p, p.a, *p.a.scq, 8, sc));
  for (uint32_t i = 0; i < 8; ++i) {
    EXPECT_EQ(sc[i].wr_id, i);
    EXPECT_EQ(sc[i].status, WcStatus::Success);
    EXPECT_EQ(std::memcmp(la->data() + i * 100000, rb->data() + i * 100000 + 1, 99999), 0);
  }
  // ord 2 against ird 2: the responder never saw a third READ outstanding.
  EXPECT_EQ(p.b.engine().counters().iw_ird_exceeded, 0u);
  EXPECT_EQ(p.b.engine().counters().iw_terminate_sent, 0u);
}

TEST(Iwarp, SendWithInvalidateOfABoundWindow) {
  IwPair p;
  auto src = register_region(p.a.engine(), 1, 64, kAllAccess);
  auto dst = register_region(p.b.engine(), 1, 4096, kAllAccess | core::kMwBind);
  uint32_t handle = 0, rkey = 0;
  ASSERT_TRUE(p.b.engine().alloc_mw(core::MwType::Type2, 1, &handle, &rkey));
  SendWqe bind{};
  bind.wr_id = 77;
  bind.op = WrOp::BindMw;
  bind.flags = kSignaled;
  bind.bind = {handle, rkey, dst->mr.lkey, dst->addr(0), 4096, core::kRemoteWrite};
  ASSERT_EQ(post(p.b, bind), 0);
  std::vector<core::Cqe> sb;
  ASSERT_TRUE(wait_cqes(p, p.b, *p.b.scq, 1, sb));
  ASSERT_EQ(sb[0].status, WcStatus::Success);
  ASSERT_EQ(post(p.b, recv_wqe(5, *dst, 0, 64)), 0);
  SendWqe inv = send_wqe(6, *src, 0, 64, WrOp::SendInv);
  inv.imm_be = rkey;
  ASSERT_EQ(post(p.a, inv), 0);
  std::vector<core::Cqe> rc;
  ASSERT_TRUE(wait_cqes(p, p.b, *p.b.rcq, 1, rc));
  EXPECT_EQ(rc[0].status, WcStatus::Success);
  EXPECT_TRUE(rc[0].wc_flags & core::kWcWithInv);
  EXPECT_EQ(rc[0].imm_or_inv, rkey);
  // The window is gone: a WRITE through it now is refused with a Terminate.
  auto la = register_region(p.a.engine(), 1, 64, kAllAccess);
  ASSERT_EQ(post(p.a, write_wqe(7, *la, 0, 64, dst->addr(0), rkey)), 0);
  ASSERT_TRUE(p.run([&] { return p.b.qp->state.load() == QpState::Err && p.a.qp->state.load() == QpState::Err; }));
  EXPECT_EQ(p.b.engine().counters().iw_bad_stag, 1u);
  EXPECT_EQ(p.a.engine().counters().iw_terminate_rcvd, 1u);
}

TEST(Iwarp, SolicitedEventHonoured) {
  IwPair p;
  int events = 0;
  // A receive CQ with a completion channel, armed for solicited completions only.
  auto cq = p.b.engine().create_cq(64, [&](core::CompletionQueue&, bool) { ++events; });
  // Swap it in as b's receive CQ (no completion has gone to the old one).
  p.b.qp->cfg.recv_cq = cq.get();
  auto src = register_region(p.a.engine(), 1, 64, kAllAccess);
  auto dst = register_region(p.b.engine(), 1, 256, kAllAccess);
  p.b.engine().arm_cq(cq.get(), true);
  ASSERT_EQ(post(p.b, recv_wqe(1, *dst, 0, 64)), 0);
  ASSERT_EQ(post(p.b, recv_wqe(2, *dst, 64, 64)), 0);
  ASSERT_EQ(post(p.a, send_wqe(3, *src, 0, 8)), 0);
  std::vector<core::Cqe> rc;
  ASSERT_TRUE(wait_cqes(p, p.b, *cq, 1, rc));
  EXPECT_EQ(events, 0);
  p.b.engine().arm_cq(cq.get(), true);
  SendWqe se = send_wqe(4, *src, 0, 8);
  se.flags |= kSolicited;
  ASSERT_EQ(post(p.a, se), 0);
  ASSERT_TRUE(p.run([&] { return events == 1; }));
  ASSERT_TRUE(wait_cqes(p, p.b, *cq, 2, rc));
  EXPECT_EQ(rc[1].wr_id, 2u);
  p.b.qp->cfg.recv_cq = p.b.rcq.get();
  destroy(p.b);
  p.b.engine().destroy_cq(cq.get());
}

TEST(Iwarp, OperationsIwarpLacksAreRefusedAtPost) {
  IwPair p;
  auto r = register_region(p.a.engine(), 1, 64, kAllAccess);
  EXPECT_EQ(post(p.a, send_wqe(1, *r, 0, 8, WrOp::SendImm)), EINVAL);
  EXPECT_EQ(post(p.a, atomic_wqe(2, WrOp::FetchAdd, *r, 0, r->addr(0), r->mr.rkey, 1)), EINVAL);
  SendWqe two = read_wqe(3, *r, 0, 16, r->addr(0), r->mr.rkey);
  two.num_sge = 2;
  two.sge[1] = two.sge[0];
  EXPECT_EQ(post(p.a, two), EINVAL);  // one sink buffer per READ (siw: EINVAL)
  EXPECT_EQ(post(p.a, write_wqe(4, *r, 0, 8, r->addr(0), r->mr.rkey)), 0);
}

TEST(Iwarp, AttachRefusesAnythingButRcInInit) {
  Fabric f;
  Host& h = f.add_host(wire::IpAddress::v4(0x0100000a));
  End e;
  make_iw_end(e, h);
  QpModify m;
  m.mask = kModState;
  m.state = QpState::Reset;
  e.engine().modify_qp(e.qp, m);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  EXPECT_EQ(attach(e, sv[0], {}, IwarpRtr::None), EINVAL);
  // The engine owned the fd and closed it: the other end sees EOF.
  char c;
  EXPECT_EQ(read(sv[1], &c, 1), 0);
  close(sv[1]);
  destroy(e);
}

TEST(Iwarp, DeregistrationWhileFpdusAreQueued) {
  IwPair p;
  const uint32_t len = 4 << 20;
  auto src = register_region(p.a.engine(), 1, len, kAllAccess);
  auto dst = register_region(p.b.engine(), 1, len, kAllAccess);
  fill(*src, 31);
  ASSERT_EQ(post(p.b, recv_wqe(1, *dst, 0, len)), 0);
  ASSERT_EQ(post(p.a, send_wqe(2, *src, 0, len)), 0);
  for (int i = 0; i < 10; ++i) p.a.engine().step();  // b does not read: a's socket fills, FPDUs wait
  ASSERT_EQ(p.a.engine().deregister_mr(src->mr), 0);
  // The pages go back: what was queued was copied out, the rest of the SEND is never read.
  src.reset();
  std::vector<core::Cqe> sc;
  ASSERT_TRUE(wait_cqes(p, p.a, *p.a.scq, 1, sc));
  EXPECT_EQ(sc[0].status, WcStatus::LocProtErr);
  EXPECT_EQ(p.a.qp->state.load(), QpState::Err);
  std::vector<core::Cqe> rc;
  ASSERT_TRUE(wait_cqes(p, p.b, *p.b.rcq, 1, rc));
  EXPECT_EQ(rc[0].status, WcStatus::WrFlushErr);  // the message never ended: the stream did
  EXPECT_EQ(p.b.qp->state.load(), QpState::Err);
}

// The peer refuses a WRITE (an STag it never issued) with a Terminate and shuts its stream, so that our
// next write to the stream fails (EPIPE here; a reset over TCP). That write comes from a post, before
// any pass of ours has read the stream: the Terminate waiting in it still decides the WRITE's status.
TEST(Iwarp, ATerminateBehindAResetStreamStillNamesTheError) {
  IwPair p;
  const uint32_t len = 4 << 20;
  auto src = register_region(p.a.engine(), 1, len, kAllAccess);
  auto dst = register_region(p.b.engine(), 1, len, kAllAccess);
  ASSERT_EQ(post(p.a, write_wqe(1, *src, 0, len, dst->addr(), dst->mr.rkey ^ 0x100)), 0);
  for (int i = 0; i < 10; ++i) p.a.engine().step();  // a's socket fills
  for (int i = 0; i < 10; ++i) p.b.engine().step();  // b refuses the first FPDU, terminates, shuts down
  ASSERT_EQ(p.b.qp->state.load(), QpState::Err);
  ASSERT_EQ(post(p.a, send_wqe(2, *src, 0, 64)), 0);  // written at once, into the shut stream
  std::vector<core::Cqe> sc;
  ASSERT_TRUE(wait_cqes(p, p.a, *p.a.scq, 2, sc));
  EXPECT_EQ(sc[0].wr_id, 1u);
  EXPECT_EQ(sc[0].status, WcStatus::RemAccessErr) << "the Terminate was not read before the flush";
  EXPECT_EQ(sc[1].wr_id, 2u);
  EXPECT_EQ(sc[1].status, WcStatus::WrFlushErr);
  EXPECT_EQ(p.a.engine().counters().iw_terminate_rcvd, 1u);
}

TEST(Iwarp, PeerCloseFlushesEverything) {
  IwPair p;
  auto r = register_region(p.b.engine(), 1, 4096, kAllAccess);
  ASSERT_EQ(post(p.b, recv_wqe(1, *r, 0, 64)), 0);
  ASSERT_EQ(post(p.b, recv_wqe(2, *r, 64, 64)), 0);
  ASSERT_EQ(post(p.b, read_wqe(3, *r, 128, 64, 0x1000, 0x1234)), 0);  // never answered: a stops first
  // a goes to ERROR (as after rdma_disconnect): it shuts its socket down, and b sees the end.
  QpModify m;
  m.mask = kModState;
  m.state = QpState::Err;
  p.a.engine().modify_qp(p.a.qp, m);
  std::vector<core::Cqe> rc, sc;
  ASSERT_TRUE(wait_cqes(p, p.b, *p.b.rcq, 2, rc));
  ASSERT_TRUE(wait_cqes(p, p.b, *p.b.scq, 1, sc));
  EXPECT_EQ(p.b.qp->state.load(), QpState::Err);
  for (auto& c : rc) EXPECT_EQ(c.status, WcStatus::WrFlushErr);
  EXPECT_EQ(sc[0].wr_id, 3u);
  EXPECT_NE(sc[0].status, WcStatus::Success);
  EXPECT_EQ(p.b.engine().counters().iw_conn_lost, 1u);
}

TEST(Iwarp, ResetClosesTheSocketAndTheQpConnectsAgain) {
  IwPair p;
  QpModify m;
  m.mask = kModState;
  m.state = QpState::Reset;
  p.a.engine().modify_qp(p.a.qp, m);
  ASSERT_TRUE(p.run([&] { return p.b.qp->state.load() == QpState::Err; }));
  p.b.engine().modify_qp(p.b.qp, m);
  m.mask = kModState | kModAccessFlags;
  m.state = QpState::Init;
  m.access_flags = kAllAccess;
  p.a.engine().modify_qp(p.a.qp, m);
  p.b.engine().modify_qp(p.b.qp, m);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ASSERT_EQ(attach(p.a, sv[0], {}, IwarpRtr::None), 0);
  ASSERT_EQ(attach(p.b, sv[1], {}, IwarpRtr::None), 0);
  auto src = register_region(p.a.engine(), 1, 64, kAllAccess);
  auto dst = register_region(p.b.engine(), 1, 64, kAllAccess);
  src->bytes.assign(64, 0x5a);
  ASSERT_EQ(post(p.b, recv_wqe(1, *dst, 0, 64)), 0);
  ASSERT_EQ(post(p.a, send_wqe(2, *src, 0, 64)), 0);
  std::vector<core::Cqe> rc;
  ASSERT_TRUE(wait_cqes(p, p.b, *p.b.rcq, 1, rc));
  EXPECT_EQ(rc[0].status, WcStatus::Success);
  EXPECT_EQ(dst->bytes, src->bytes);
}

}  // namespace
}  // namespace softrdma::transport::test

namespace softrdma::transport::test {
namespace {

// A loopback TCP connection (what rdma_cm hands over), with small socket buffers so that writes are
// partial and resume on later passes.
std::pair<int, int> tcp_pair() {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(listen(l, 1), 0);
  EXPECT_EQ(getsockname(l, reinterpret_cast<sockaddr*>(&a), &len), 0);
  int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int small = 16384;
  setsockopt(c, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  setsockopt(c, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  EXPECT_EQ(connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  int s = accept(l, nullptr, nullptr);
  EXPECT_GE(s, 0);
  setsockopt(s, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  setsockopt(s, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  close(l);
  return {c, s};
}

TEST(IwarpTcp, LoopbackTcpWithPartialWrites) {
  Fabric f;
  Host& ha = f.add_host(wire::IpAddress::v4(0x0100000a));
  Host& hb = f.add_host(wire::IpAddress::v4(0x0200000a));
  End a, b;
  make_iw_end(a, ha);
  make_iw_end(b, hb);
  auto [c, s] = tcp_pair();
  IwOptions o;
  o.crc = true;
  ASSERT_EQ(attach(a, c, o, IwarpRtr::SendRead), 0);
  ASSERT_EQ(attach(b, s, o, IwarpRtr::AwaitRead), 0);
  const uint32_t len = 3 << 20;
  auto la = register_region(a.engine(), 1, len, kAllAccess);
  auto rb = register_region(b.engine(), 1, len, kAllAccess);
  fill(*la, 21);
  ASSERT_EQ(post(b, recv_wqe(1, *rb, 0, len)), 0);
  ASSERT_EQ(post(a, send_wqe(2, *la, 0, len)), 0);
  ASSERT_EQ(post(a, read_wqe(3, *la, 0, len / 2, rb->addr(len / 2), rb->mr.rkey)), 0);
  std::vector<core::Cqe> sc, rc;
  auto run = [&](const std::function<bool()>& done) {
    for (int i = 0; i < 2000000 && !done(); ++i) {
      a.engine().step();
      b.engine().step();
    }
    return done();
  };
  ASSERT_TRUE(run([&] {
    core::Cqe x[4];
    for (int k; (k = a.engine().poll_cq(a.scq.get(), x, 4)) > 0;) sc.insert(sc.end(), x, x + k);
    for (int k; (k = b.engine().poll_cq(b.rcq.get(), x, 4)) > 0;) rc.insert(rc.end(), x, x + k);
    return sc.size() == 2 && rc.size() == 1;
  }));
  EXPECT_EQ(rc[0].byte_len, len);
  EXPECT_EQ(sc[0].wr_id, 2u);
  EXPECT_EQ(sc[1].wr_id, 3u);
  EXPECT_EQ(sc[1].status, WcStatus::Success);
  // The SEND put a copy of la into rb; the READ brought rb's second half back over la's first.
  EXPECT_EQ(std::memcmp(la->data(), rb->data() + len / 2, len / 2), 0);
  EXPECT_EQ(std::memcmp(la->data() + len / 2, rb->data() + len / 2, len / 2), 0);
  destroy(a);
  destroy(b);
}

}  // namespace
}  // namespace softrdma::transport::test
