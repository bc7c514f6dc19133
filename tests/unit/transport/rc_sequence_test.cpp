// RC protocol sequences asserted step by step, in virtual time: what goes on the wire for a WRITE,
// the NAK and resend after a lost packet, the retransmit timer, RNR back-off, duplicate READ and ATOMIC
// requests answered from the replay cache, retry exhaustion, PSNs across the 24-bit wrap, and a QP
// re-connected through RESET starting from fresh transport state.
#include <gtest/gtest.h>

#include <cstring>

#include "fabric.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace softrdma::transport::test {
namespace {

const wire::IpAddress kIpA = wire::IpAddress::v4(0x0100000A), kIpB = wire::IpAddress::v4(0x0200000A);

struct Traced {
  bool from_a;
  PacketView v;
  uint64_t t;
};

class RcSequence : public ::testing::Test {
 protected:
  Fabric f;
  Host* ha = nullptr;
  Host* hb = nullptr;
  RcParams params;
  RcPair pair;
  std::vector<Traced> trace;
  // Decides, per datagram, what the network does with it; nullptr: deliver.
  std::function<net::MemoryNetwork::Fate(const Traced&)> faults;

  void SetUp() override {
    ha = &f.add_host(kIpA);
    hb = &f.add_host(kIpB);
    f.net.set_policy([this](const net::MemoryNetwork::Offer& o) {
      Traced t{o.from.ip == kIpA, view(o.data, o.len), f.now()};
      trace.push_back(t);
      return faults ? faults(t) : net::MemoryNetwork::Fate{};
    });
  }
  void connect() {
    pair = connect_rc(f, *ha, *hb, params);
    ASSERT_NE(pair.a.qp, nullptr);
    ASSERT_NE(pair.b.qp, nullptr);
  }
  void TearDown() override {
    destroy(pair.a);
    destroy(pair.b);
  }
  // Runs until a's send CQ has n completions; returns them.
  std::vector<core::Cqe> completions(size_t n, uint64_t limit_ns = 10'000'000'000ull) {
    std::vector<core::Cqe> got;
    f.run_until(
        [&] {
          auto more = poll_all(pair.a, *pair.a.scq);
          got.insert(got.end(), more.begin(), more.end());
          return got.size() >= n;
        },
        limit_ns);
    return got;
  }
  std::string dump() const {
    std::string s;
    for (const Traced& t : trace) s += (t.from_a ? "a> " : "b> ") + describe(t.v) + " @" + std::to_string(t.t) + "\n";
    return s;
  }
  std::vector<Traced> from(bool a) const {
    std::vector<Traced> v;
    for (const Traced& t : trace)
      if (t.from_a == a) v.push_back(t);
    return v;
  }
};

TEST_F(RcSequence, WriteIsSegmentedAndAcknowledgedOnce) {
  connect();
  auto src = register_region(pair.a.engine(), 1, 3000, core::kLocalWrite);
  auto dst = register_region(pair.b.engine(), 1, 3000, params.access);
  for (int i = 0; i < 3000; ++i) src->data()[i] = static_cast<uint8_t>(i * 13);
  ASSERT_EQ(post(pair.a, write_wqe(7, *src, 0, 3000, dst->addr(), dst->mr.rkey)), 0);
  auto c = completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 7u);
  EXPECT_EQ(c[0].status, WcStatus::Success);
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), 3000), 0);
  ASSERT_TRUE(f.settle());
  auto a = from(true), b = from(false);
  ASSERT_EQ(a.size(), 3u) << dump();
  EXPECT_EQ(a[0].v.opcode, wire::kRcWriteFirst);
  EXPECT_EQ(a[1].v.opcode, wire::kRcWriteMiddle);
  EXPECT_EQ(a[2].v.opcode, wire::kRcWriteLast);
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(a[i].v.psn, params.psn_a + i);
  EXPECT_TRUE(a[2].v.ack_req) << "the last packet of a message asks for an ACK";
  ASSERT_EQ(b.size(), 1u) << "one coalesced ACK\n" << dump();
  EXPECT_EQ(b[0].v.opcode, wire::kRcAck);
  EXPECT_EQ(b[0].v.psn, params.psn_a + 2);
  EXPECT_EQ(wire::aeth_type(b[0].v.syndrome), wire::AethType::Ack);
}

TEST_F(RcSequence, LostMiddlePacketIsNakedAndResentFromThere) {
  connect();
  auto src = register_region(pair.a.engine(), 1, 4096, core::kLocalWrite);
  auto dst = register_region(pair.b.engine(), 1, 4096, params.access);
  for (int i = 0; i < 4096; ++i) src->data()[i] = static_cast<uint8_t>(i * 7 + 1);
  bool dropped = false;
  faults = [&](const Traced& t) {
    net::MemoryNetwork::Fate fate;
    if (t.from_a && t.v.psn == params.psn_a + 1 && !dropped) fate.drop = dropped = true;
    return fate;
  };
  ASSERT_EQ(post(pair.a, write_wqe(1, *src, 0, 4096, dst->addr(), dst->mr.rkey)), 0);
  auto c = completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::Success);
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), 4096), 0);
  // b NAKs the gap once (PSN sequence error naming the PSN it expects), a resends from there.
  int naks = 0;
  for (const Traced& t : from(false))
    if (wire::aeth_type(t.v.syndrome) == wire::AethType::Nak) {
      ++naks;
      EXPECT_EQ(wire::aeth_value(t.v.syndrome), wire::kNakPsnSeqErr);
      EXPECT_EQ(t.v.psn, params.psn_a + 1);
    }
  EXPECT_EQ(naks, 1) << dump();
  auto a = from(true);
  ASSERT_GE(a.size(), 7u) << dump();
  EXPECT_EQ(a[4].v.psn, params.psn_a + 1) << "resent from the NAKed PSN\n" << dump();
  EXPECT_EQ(a.back().v.psn, params.psn_a + 3);
}

TEST_F(RcSequence, LostAckFiresTheTimerAtItsDeadline) {
  params.timeout = 12;  // 4.096 us * 2^12 = 16.8 ms
  connect();
  auto src = register_region(pair.a.engine(), 1, 64, core::kLocalWrite);
  auto dst = register_region(pair.b.engine(), 1, 64, params.access);
  int acks = 0;
  faults = [&](const Traced& t) {
    net::MemoryNetwork::Fate fate;
    if (!t.from_a && acks++ == 0) fate.drop = true;
    return fate;
  };
  const uint64_t t0 = f.now();
  ASSERT_EQ(post(pair.a, write_wqe(1, *src, 0, 64, dst->addr(), dst->mr.rkey)), 0);
  auto c = completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::Success);
  auto a = from(true);
  ASSERT_EQ(a.size(), 2u) << dump();
  EXPECT_EQ(a[1].v.psn, a[0].v.psn) << "the same request again";
  const uint64_t timeout_ns = wire::ack_timeout_us(params.timeout) * 1000;
  EXPECT_GE(a[1].t - t0, timeout_ns) << "not before the timer expired";
  EXPECT_LT(a[1].t - t0, timeout_ns + 1'000'000) << "and right when it did";
  // The duplicate is acknowledged again, and nothing is written twice (nothing to see) or lost.
  EXPECT_EQ(from(false).size(), 2u) << dump();
}

TEST_F(RcSequence, RnrNakBacksOffAndRetriesUntilAReceiveIsPosted) {
  params.min_rnr_timer = 14;  // 1.28 ms (IBTA table 45)
  connect();
  auto src = register_region(pair.a.engine(), 1, 100, core::kLocalWrite);
  auto dst = register_region(pair.b.engine(), 1, 100, core::kLocalWrite);
  for (int i = 0; i < 100; ++i) src->data()[i] = static_cast<uint8_t>(i + 5);
  ASSERT_EQ(post(pair.a, send_wqe(3, *src, 0, 100)), 0);
  // Nothing posted at b: RNR NAKs, each after the back-off b asked for.
  f.run_until([&] { return trace.size() >= 6; }, 1'000'000'000);
  int rnr = 0;
  uint64_t last_send = 0;
  for (const Traced& t : trace) {
    if (!t.from_a) {
      if (wire::aeth_type(t.v.syndrome) == wire::AethType::RnrNak) {
        ++rnr;
        EXPECT_EQ(wire::aeth_value(t.v.syndrome), params.min_rnr_timer);
      }
      continue;
    }
    if (last_send) {
      EXPECT_GE(t.t - last_send, uint64_t{wire::rnr_timer_us(params.min_rnr_timer)} * 1000) << dump();
    }
    last_send = t.t;
  }
  EXPECT_GE(rnr, 2) << dump();
  EXPECT_TRUE(poll_all(pair.a, *pair.a.scq).empty()) << "rnr_retry 7 retries for ever";
  ASSERT_EQ(post(pair.b, recv_wqe(9, *dst, 0, 100)), 0);
  auto c = completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::Success);
  auto r = poll_all(pair.b, *pair.b.rcq);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].wr_id, 9u);
  EXPECT_EQ(r[0].byte_len, 100u);
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), 100), 0);
}

TEST_F(RcSequence, RnrRetryExhaustedCompletesInError) {
  params.rnr_retry = 2;
  connect();
  auto src = register_region(pair.a.engine(), 1, 8, core::kLocalWrite);
  ASSERT_EQ(post(pair.a, send_wqe(4, *src, 0, 8)), 0);
  auto c = completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::RnrRetryExcErr);
  int sends = 0;
  for (const Traced& t : from(true)) sends += t.v.opcode == wire::kRcSendOnly;
  EXPECT_EQ(sends, 3) << "the first try and rnr_retry retries\n" << dump();
  EXPECT_EQ(pair.a.qp->state.load(), QpState::Err);
}

// Forward progress restores the RNR retry budget, as it does the timeout one (rxe resets both when
// an ACK completes a WQE): rnr_retry counts RNR NAKs of one request, not of the connection's life.
// Each of five SENDs meets one RNR NAK before its receive is posted; with rnr_retry 2 all complete.
TEST_F(RcSequence, RnrRetryBudgetIsRestoredByProgress) {
  params.rnr_retry = 2;
  params.min_rnr_timer = 14;  // 1.28 ms
  connect();
  auto src = register_region(pair.a.engine(), 1, 8, core::kLocalWrite);
  auto dst = register_region(pair.b.engine(), 1, 8, core::kLocalWrite);
  for (uint64_t i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    const size_t before = trace.size();
    ASSERT_EQ(post(pair.a, send_wqe(10 + i, *src, 0, 8)), 0);
    auto rnr_naks = [&] {
      int n = 0;
      for (size_t k = before; k < trace.size(); ++k)
        n += !trace[k].from_a && wire::aeth_type(trace[k].v.syndrome) == wire::AethType::RnrNak;
      return n;
    };
    f.run_until([&] { return rnr_naks() >= 1; }, 1'000'000'000);
    ASSERT_EQ(rnr_naks(), 1) << dump();
    ASSERT_EQ(post(pair.b, recv_wqe(20 + i, *dst, 0, 8)), 0);
    auto c = completions(1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, WcStatus::Success) << dump();
    EXPECT_EQ(c[0].wr_id, 10 + i);
    EXPECT_EQ(poll_all(pair.b, *pair.b.rcq).size(), 1u);
  }
  EXPECT_NE(pair.a.qp->state.load(), QpState::Err);
}

TEST_F(RcSequence, DuplicateAtomicIsReplayedNotReexecuted) {
  connect();
  auto res = register_region(pair.a.engine(), 1, 8, core::kLocalWrite);
  auto word = register_region(pair.b.engine(), 1, 8, params.access);
  uint64_t v = 40;
  std::memcpy(word->data(), &v, 8);
  int acks = 0;
  faults = [&](const Traced& t) {
    net::MemoryNetwork::Fate fate;
    if (!t.from_a && t.v.opcode == wire::kRcAtomicAck && acks++ == 0) fate.drop = true;  // its result is lost
    return fate;
  };
  ASSERT_EQ(post(pair.a, atomic_wqe(5, WrOp::FetchAdd, *res, 0, word->addr(), word->mr.rkey, 2)), 0);
  auto c = completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::Success);
  std::memcpy(&v, word->data(), 8);
  EXPECT_EQ(v, 42u) << "executed exactly once";
  std::memcpy(&v, res->data(), 8);
  EXPECT_EQ(v, 40u) << "the replayed result is the original one";
  EXPECT_EQ(acks, 2) << dump();
}

// ATOMIC WRITE (IBTA 1.5) is answered by a zero-length READ RESPONSE; when that is lost, the resent
// request is answered again from the replay cache and not written again: a store made at the target
// since then survives.
TEST_F(RcSequence, DuplicateAtomicWriteIsAnsweredNotRewritten) {
  connect();
  auto src = register_region(pair.a.engine(), 1, 8, core::kLocalWrite);
  auto word = register_region(pair.b.engine(), 1, 16, params.access);
  const uint64_t v = 0x1122334455667788ull, later = 77;
  std::memcpy(src->data(), &v, 8);
  int responses = 0;
  faults = [&](const Traced& t) {
    net::MemoryNetwork::Fate fate;
    if (!t.from_a && t.v.opcode == wire::kRcReadResponseOnly && responses++ == 0) {
      fate.drop = true;  // the acknowledgement of the first execution is lost...
      uint64_t now;
      std::memcpy(&now, word->data() + 8, 8);
      EXPECT_EQ(now, v) << "executed before it is answered";
      std::memcpy(word->data() + 8, &later, 8);  // ...and the target stores something else meanwhile
    }
    return fate;
  };
  SendWqe w = write_wqe(9, *src, 0, 8, word->addr(8), word->mr.rkey);
  w.op = WrOp::AtomicWrite;
  ASSERT_EQ(post(pair.a, w), 0);
  auto c = completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::Success);
  EXPECT_EQ(c[0].opcode, core::WcOpcode::AtomicWrite);
  uint64_t now;
  std::memcpy(&now, word->data() + 8, 8);
  EXPECT_EQ(now, later) << "the duplicate was not written again\n" << dump();
  int requests = 0;
  for (const Traced& t : from(true)) requests += t.v.opcode == wire::kRcAtomicWrite;
  EXPECT_EQ(requests, 2) << dump();
  EXPECT_EQ(responses, 2) << dump();
}

TEST_F(RcSequence, DuplicateReadIsAnsweredFromTheReplayCache) {
  connect();
  auto dst = register_region(pair.a.engine(), 1, 5000, core::kLocalWrite);
  auto src = register_region(pair.b.engine(), 1, 5000, params.access);
  for (int i = 0; i < 5000; ++i) src->data()[i] = static_cast<uint8_t>(i * 3 + 11);
  bool dropped = false;
  faults = [&](const Traced& t) {
    net::MemoryNetwork::Fate fate;
    // The third response packet is lost: a re-issues the READ from there, b regenerates the rest.
    if (!t.from_a && t.v.psn == params.psn_a + 2 && !dropped) fate.drop = dropped = true;
    return fate;
  };
  ASSERT_EQ(post(pair.a, read_wqe(6, *dst, 0, 5000, src->addr(), src->mr.rkey)), 0);
  auto c = completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::Success);
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), 5000), 0);
  int requests = 0;
  for (const Traced& t : from(true))
    if (t.v.opcode == wire::kRcReadRequest) ++requests;
  EXPECT_EQ(requests, 2) << dump();
  EXPECT_EQ(from(true).back().v.psn, params.psn_a + 2) << "re-issued at the first missing PSN\n" << dump();
}

TEST_F(RcSequence, SilentPeerExhaustsRetriesInVirtualTime) {
  params.timeout = 14;  // 67 ms
  params.retry_cnt = 3;
  connect();
  auto src = register_region(pair.a.engine(), 1, 8, core::kLocalWrite);
  faults = [&](const Traced& t) {
    net::MemoryNetwork::Fate fate;
    fate.drop = t.from_a;
    return fate;
  };
  const uint64_t t0 = f.now();
  ASSERT_EQ(post(pair.a, write_wqe(8, *src, 0, 8, 0x1000, 0x1234)), 0);
  auto c = completions(1, 60'000'000'000ull);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::RetryExcErr);
  EXPECT_EQ(from(true).size(), 4u) << "the first try and retry_cnt retries\n" << dump();
  const uint64_t timeout_ns = wire::ack_timeout_us(params.timeout) * 1000;
  EXPECT_GE(f.now() - t0, 4 * timeout_ns);
  EXPECT_LT(f.now() - t0, 5 * timeout_ns);
}

TEST_F(RcSequence, PsnsWrapAt24Bits) {
  params.psn_a = 0xFFFFFE;
  connect();
  auto src = register_region(pair.a.engine(), 1, 4096, core::kLocalWrite);
  auto dst = register_region(pair.b.engine(), 1, 4096, params.access);
  for (int i = 0; i < 4096; ++i) src->data()[i] = static_cast<uint8_t>(i ^ 0x5A);
  bool dropped = false;
  faults = [&](const Traced& t) {
    net::MemoryNetwork::Fate fate;
    if (t.from_a && t.v.psn == 0 && !dropped) fate.drop = dropped = true;  // the packet after the wrap
    return fate;
  };
  ASSERT_EQ(post(pair.a, write_wqe(1, *src, 0, 4096, dst->addr(), dst->mr.rkey)), 0);
  ASSERT_EQ(post(pair.a, write_wqe(2, *src, 0, 8, dst->addr(), dst->mr.rkey)), 0);
  auto c = completions(2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].status, WcStatus::Success);
  EXPECT_EQ(c[1].status, WcStatus::Success);
  EXPECT_EQ(std::memcmp(src->data() + 8, dst->data() + 8, 4088), 0);
  EXPECT_EQ(from(true).back().v.psn, 2u) << dump();
}

}  // namespace
TEST_F(RcSequence, ReconnectThroughResetStartsFromFreshTransportState) {
  params.timeout = 10;  // 4.2 ms
  connect();
  auto src = register_region(pair.a.engine(), 1, 100 * 1024, core::kLocalWrite);
  auto dst = register_region(pair.b.engine(), 1, 100 * 1024, params.access);
  for (int i = 0; i < 100 * 1024; ++i) src->data()[i] = static_cast<uint8_t>(i * 5 + 3);
  // The first connection loses a request: the retransmit timer shrinks a's congestion window to its
  // floor. b is left with the state of the SEND it received last.
  bool dropped = false;
  faults = [&](const Traced& t) {
    net::MemoryNetwork::Fate fate;
    if (t.from_a && !dropped) fate.drop = dropped = true;
    return fate;
  };
  ASSERT_EQ(post(pair.a, write_wqe(1, *src, 0, 64, dst->addr(), dst->mr.rkey)), 0);
  auto c = completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::Success);
  ASSERT_EQ(post(pair.b, recv_wqe(2, *dst, 0, 100)), 0);
  ASSERT_EQ(post(pair.a, send_wqe(3, *src, 0, 100)), 0);
  c = completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::Success);
  ASSERT_TRUE(f.settle());
  ASSERT_LT(pair.a.qp->req.cwnd, 100u) << "the timeout shrank the window";
  poll_all(pair.b, *pair.b.rcq);

  params.psn_a = 0x300;
  params.psn_b = 0x400;
  reconnect_rc(pair, params);
  EXPECT_EQ(pair.a.qp->req.cwnd, kPsnWindow);
  EXPECT_EQ(pair.b.qp->resp.last_opcode, Qp::ResponderState{}.last_opcode);
  EXPECT_EQ(pair.b.qp->resp.write_dst, nullptr);
  EXPECT_EQ(pair.b.qp->resp.recv_offset, 0u);
  // The new connection starts with the whole window: all 100 packets of a WRITE go out before b's
  // first acknowledgement, not just the shrunk window's worth.
  trace.clear();
  ASSERT_EQ(post(pair.a, write_wqe(4, *src, 0, 100 * 1024, dst->addr(), dst->mr.rkey)), 0);
  c = completions(1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, WcStatus::Success);
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), 100 * 1024), 0);
  size_t before_first_ack = 0;
  for (const Traced& t : trace) {
    if (!t.from_a) break;
    ++before_first_ack;
  }
  EXPECT_EQ(before_first_ack, 100u) << dump();
  EXPECT_EQ(trace.front().v.psn, params.psn_a);
}

}  // namespace softrdma::transport::test
