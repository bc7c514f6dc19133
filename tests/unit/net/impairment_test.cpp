#include "net/impairment.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "net/udp_port.h"

namespace softrdma::net {
namespace {

const wire::IpAddress kLo = wire::IpAddress::v4(htonl(INADDR_LOOPBACK));

// The environment's settings with SOFTRDMA_IMPAIR set to spec: what a port opened under it gets.
config::Settings impaired(const char* spec) {
  config::Settings s = config::parse();
  s.impair = spec;
  return s;
}

// What came out of a DirectionImpairment, in order.
struct Out {
  std::vector<uint8_t> bytes;
  uint32_t seq;  // the first 4 bytes: the datagram's number
};

struct Harness {
  ImpairmentStats stats;
  DirectionImpairment imp;
  std::vector<Out> out;
  uint32_t offered = 0;
  std::map<uint32_t, uint32_t> offered_at;  // seq -> datagrams offered before it
  std::map<uint32_t, uint32_t> emitted_at;  // seq -> datagrams offered when it (first) came out
  Harness(const ImpairmentRates& r, uint64_t seed) : imp(r, seed, stats) {}
  DirectionImpairment::Emit emit() {
    return [this](const uint8_t* d, uint32_t n, const DirectionImpairment::Meta&) {
      uint32_t seq = 0;
      std::memcpy(&seq, d, 4);
      out.push_back({std::vector<uint8_t>(d, d + n), seq});
      emitted_at.emplace(seq, offered);
    };
  }
  void offer(uint32_t seq, uint32_t len = 64) {
    std::vector<uint8_t> d(len);
    for (uint32_t i = 0; i < len; ++i) d[i] = static_cast<uint8_t>(i * 7 + seq);
    std::memcpy(d.data(), &seq, 4);
    offered_at[seq] = offered++;
    imp.offer(d.data(), len, {}, emit());
  }
  void tick() { imp.tick(emit()); }
};

std::vector<uint8_t> original(uint32_t seq, uint32_t len = 64) {
  std::vector<uint8_t> d(len);
  for (uint32_t i = 0; i < len; ++i) d[i] = static_cast<uint8_t>(i * 7 + seq);
  std::memcpy(d.data(), &seq, 4);
  return d;
}

ImpairmentRates mixed() {
  ImpairmentRates r;
  r.drop = 0.05;
  r.dup = 0.05;
  r.reorder = 0.05;
  r.corrupt = 0.01;
  r.burst = 0.002;
  r.burst_len = 5;
  r.reorder_depth = 8;
  return r;
}

TEST(ImpairmentParse, FullSpec) {
  std::string err;
  auto c = parse_impairment(
      "seed=42,tx_drop=0.05,tx_dup=0.04,tx_reorder=0.03,reorder_depth=6,tx_corrupt=0.01,burst=0.1,burst_len=3,"
      "rx_drop=0.2",
      &err);
  ASSERT_TRUE(c) << err;
  EXPECT_EQ(c->seed, 42u);
  EXPECT_DOUBLE_EQ(c->tx.drop, 0.05);
  EXPECT_DOUBLE_EQ(c->tx.dup, 0.04);
  EXPECT_DOUBLE_EQ(c->tx.reorder, 0.03);
  EXPECT_DOUBLE_EQ(c->tx.corrupt, 0.01);
  EXPECT_DOUBLE_EQ(c->rx.drop, 0.2);
  EXPECT_DOUBLE_EQ(c->rx.dup, 0.0);
  // Unprefixed keys set both directions.
  EXPECT_EQ(c->tx.reorder_depth, 6u);
  EXPECT_EQ(c->rx.reorder_depth, 6u);
  EXPECT_DOUBLE_EQ(c->rx.burst, 0.1);
  EXPECT_EQ(c->tx.burst_len, 3u);
  EXPECT_TRUE(c->active());
}

TEST(ImpairmentParse, ZeroIsInactive) {
  auto c = parse_impairment("seed=1,burst=0.5,burst_len=0,drop=0", nullptr);
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->active());
}

TEST(ImpairmentParse, Errors) {
  for (const char* bad : {"tx_drop=1.5", "tx_drop=-0.1", "tx_drop=abc", "tx_fly=0.1", "seed", "seed=x",
                          "rx_burst_len=-1", "drop=0.1,reorder=0.1,reorder_depth=0", "tx_drop=0.1x",
                          "rx_hold=0.1", "hold=0.1", "tx_hold=1.1"}) {
    std::string err;
    EXPECT_FALSE(parse_impairment(bad, &err)) << bad;
    EXPECT_FALSE(err.empty()) << bad;
  }
}

TEST(ImpairmentParse, BadEnvironmentPrintsOneLineAndIsIgnored) {
  testing::internal::CaptureStderr();
  auto c = impairment_from("tx_drop=2");
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(c);
  EXPECT_NE(err.find("SOFTRDMA_IMPAIR"), std::string::npos);
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1);
  // And a port created with it is not impaired.
  testing::internal::CaptureStderr();
  UdpPort p(kLo, 0, impaired("tx_drop=2"));
  (void)testing::internal::GetCapturedStderr();
  EXPECT_EQ(p.impairment(), nullptr);
}

TEST(Impairment, SameSeedSameDecisions) {
  auto run = [](uint64_t seed) {
    Harness h(mixed(), seed);
    for (uint32_t i = 0; i < 20000; ++i) {
      h.offer(i);
      if (i % 37 == 0) h.tick();
    }
    h.imp.release_all(h.emit());
    return h;
  };
  Harness a = run(7), b = run(7), c = run(8);
  ASSERT_EQ(a.out.size(), b.out.size());
  for (size_t i = 0; i < a.out.size(); ++i) ASSERT_EQ(a.out[i].bytes, b.out[i].bytes) << i;
  EXPECT_EQ(a.stats.dropped, b.stats.dropped);
  EXPECT_EQ(a.stats.corrupted, b.stats.corrupted);
  // Another seed gives another fault pattern.
  bool differs = a.out.size() != c.out.size();
  for (size_t i = 0; !differs && i < a.out.size(); ++i) differs = a.out[i].bytes != c.out[i].bytes;
  EXPECT_TRUE(differs);
}

TEST(Impairment, RatesRoughlyAsConfigured) {
  constexpr uint32_t kN = 100000;
  Harness h(mixed(), 12345);
  for (uint32_t i = 0; i < kN; ++i) h.offer(i);
  h.imp.release_all(h.emit());
  const ImpairmentStats& s = h.stats;
  EXPECT_EQ(s.seen, kN);
  // Burst: ~0.002 * 5 = 1% of datagrams, in bursts of exactly 5 (a burst may be cut by the end).
  EXPECT_GT(s.bursts, 100u);
  EXPECT_LT(s.bursts, 300u);
  EXPECT_LE(s.burst_dropped, s.bursts * 5);
  EXPECT_GE(s.burst_dropped, (s.bursts - 1) * 5);
  const double plain = static_cast<double>(kN - s.burst_dropped);
  EXPECT_NEAR((s.dropped - s.burst_dropped) / plain, 0.05, 0.01);
  const double kept = plain - static_cast<double>(s.dropped - s.burst_dropped);
  EXPECT_NEAR(s.corrupted / kept, 0.01, 0.004);
  EXPECT_NEAR(s.reordered / kept, 0.05, 0.01);
  EXPECT_NEAR(s.duplicated / kept, 0.05 * 0.95, 0.01);
  // Conservation: what came out is what went in, less drops, plus duplicates.
  EXPECT_EQ(h.out.size(), kN - s.dropped + s.duplicated);
  // Every surviving datagram comes out at least once (a corrupted one may carry a damaged number).
  std::set<uint32_t> seen;
  for (const Out& o : h.out) seen.insert(o.seq);
  EXPECT_GE(seen.size(), kN - s.dropped - s.corrupted);
  EXPECT_LE(seen.size(), kN - s.dropped + s.corrupted);
}

TEST(Impairment, BurstAtDropsAKnownRun) {
  auto c = parse_impairment("tx_burst_at=3,tx_burst_len=4", nullptr);
  ASSERT_TRUE(c && c->active());
  Harness h(c->tx, 1);
  for (uint32_t i = 1; i <= 20; ++i) h.offer(i);
  std::vector<uint32_t> got;
  for (const Out& o : h.out) got.push_back(o.seq);
  EXPECT_EQ(got, (std::vector<uint32_t>{1, 2, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}));
  EXPECT_EQ(h.stats.bursts, 1u);
  EXPECT_EQ(h.stats.burst_dropped, 4u);
}

TEST(Impairment, ReorderDelayIsBounded) {
  ImpairmentRates r;
  r.reorder = 0.3;
  r.reorder_depth = 5;
  Harness h(r, 99);
  constexpr uint32_t kN = 5000;
  for (uint32_t i = 0; i < kN; ++i) h.offer(i);
  h.imp.release_all(h.emit());
  ASSERT_EQ(h.out.size(), kN);
  uint32_t late = 0, max_delay = 0;
  for (uint32_t i = 0; i < kN; ++i) {
    ASSERT_TRUE(h.emitted_at.count(i));
    // Datagrams offered after this one but before it came out (release_all at the end aside).
    uint32_t delay = h.emitted_at[i] - (h.offered_at[i] + 1);
    if (h.emitted_at[i] == kN && h.offered_at[i] + 1 + r.reorder_depth >= kN) continue;
    EXPECT_LE(delay, r.reorder_depth) << "datagram " << i;
    if (delay > 0) ++late;
    max_delay = std::max(max_delay, delay);
  }
  EXPECT_GT(late, kN / 5);
  EXPECT_EQ(max_delay, r.reorder_depth);  // the whole range is used
  // Out of order indeed.
  bool inversion = false;
  for (size_t i = 1; i < h.out.size(); ++i) inversion |= h.out[i].seq < h.out[i - 1].seq;
  EXPECT_TRUE(inversion);
}

TEST(Impairment, HeldDatagramsLeaveAfterTicks) {
  ImpairmentRates r;
  r.reorder = 1.0;  // hold everything
  r.reorder_depth = 1000;
  Harness h(r, 3);
  h.offer(1);
  h.offer(2);
  EXPECT_EQ(h.imp.held(), 2u);
  EXPECT_TRUE(h.out.empty());
  for (uint32_t t = 1; t < DirectionImpairment::kMaxTicksHeld; ++t) h.tick();
  EXPECT_EQ(h.imp.held(), 2u);
  h.tick();
  EXPECT_EQ(h.imp.held(), 0u);
  ASSERT_EQ(h.out.size(), 2u);
  EXPECT_EQ(h.out[0].bytes, original(1));
  EXPECT_EQ(h.out[1].bytes, original(2));
  EXPECT_EQ(h.stats.reordered, 2u);
}

TEST(ImpairmentParse, TxHold) {
  auto c = parse_impairment("seed=3,tx_hold=0.05", nullptr);
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->tx.hold, 0.05);
  EXPECT_EQ(c->rx.hold, 0.0);
  EXPECT_TRUE(c->active());
}

// The seqs of what came out, in order.
std::vector<uint32_t> seqs(const Harness& h) {
  std::vector<uint32_t> v;
  for (const Out& o : h.out) v.push_back(o.seq);
  return v;
}

TEST(Impairment, HoldWaitsForTheNextSendHoweverLate) {
  ImpairmentRates r;
  r.hold = 1.0;  // hold whatever may be held
  Harness h(r, 8);
  h.offer(1);
  EXPECT_TRUE(h.imp.holding());
  EXPECT_TRUE(h.out.empty());
  // Flushes and receive-side ticks, far more than kMaxTicksHeld, do not let it go.
  for (uint32_t t = 0; t < 100 * DirectionImpairment::kMaxTicksHeld; ++t) h.tick();
  EXPECT_TRUE(h.imp.holding());
  EXPECT_TRUE(h.out.empty());
  // The next send, to another destination, goes first; the held one right after it, intact.
  std::vector<uint8_t> d = original(2);
  DirectionImpairment::Meta other{wire::IpAddress::v4(htonl(0x0a000002)), 4791, kLo};
  std::vector<DirectionImpairment::Meta> metas;
  h.imp.offer(d.data(), 64, other, [&](const uint8_t* p, uint32_t n, const DirectionImpairment::Meta& m) {
    h.emit()(p, n, m);
    metas.push_back(m);
  });
  ASSERT_EQ(seqs(h), (std::vector<uint32_t>{2, 1}));
  EXPECT_EQ(h.out[1].bytes, original(1));
  EXPECT_EQ(metas[0].ip, other.ip);
  EXPECT_FALSE(metas[1].ip.is_set());  // the held one keeps its own destination
  // The releasing send is never held itself; the one after it may be again.
  EXPECT_FALSE(h.imp.holding());
  h.offer(3);
  EXPECT_TRUE(h.imp.holding());
  h.offer(4);
  EXPECT_EQ(seqs(h), (std::vector<uint32_t>{2, 1, 4, 3}));
  EXPECT_EQ(h.stats.held, 2u);
  EXPECT_EQ(h.stats.seen, 4u);
  EXPECT_EQ(h.stats.reordered, 0u);
}

TEST(Impairment, HoldIsReleasedByADroppedOrDuplicatedSend) {
  ImpairmentRates r;
  r.hold = 1.0;
  r.drop = 1.0;  // everything not held is dropped...
  {
    Harness h(r, 1);
    h.offer(1);
    EXPECT_TRUE(h.out.empty());
    EXPECT_EQ(h.stats.dropped, 1u);  // drop comes first: nothing to hold
    EXPECT_FALSE(h.imp.holding());
  }
  r.drop = 0;
  r.dup = 1.0;
  Harness h(r, 1);
  h.offer(1);  // held (a held datagram is not duplicated)
  h.offer(2);  // out twice, then 1
  EXPECT_EQ(seqs(h), (std::vector<uint32_t>{2, 2, 1}));
  // ... and a send that is dropped still releases the held one.
  ImpairmentRates d;
  d.hold = 0.5;
  d.drop = 0.5;
  Harness g(d, 17);
  uint32_t checked = 0;
  for (uint32_t i = 0; i < 2000; ++i) {
    const bool was_holding = g.imp.holding();
    const size_t before = g.out.size();
    const uint64_t dropped = g.stats.dropped;
    g.offer(i);
    if (was_holding && g.stats.dropped > dropped) {
      ASSERT_EQ(g.out.size(), before + 1) << i;
      EXPECT_NE(g.out.back().seq, i);
      ++checked;
    }
  }
  EXPECT_GT(checked, 100u);
}

TEST(Impairment, HoldOrderOverManyDatagrams) {
  ImpairmentRates r;
  r.hold = 0.3;
  Harness h(r, 42);
  constexpr uint32_t kN = 5000;
  for (uint32_t i = 0; i < kN; ++i) {
    h.offer(i);
    if (i % 7 == 0) h.tick();  // flushes in between change nothing
  }
  const bool last_held = h.imp.holding();
  h.imp.release_all(h.emit());
  ASSERT_EQ(h.out.size(), kN);
  EXPECT_GT(h.stats.held, kN / 5);
  // Every datagram comes out either on time or exactly one place late, right after the next one.
  uint32_t swapped = 0;
  for (size_t i = 0; i < h.out.size();) {
    if (h.out[i].seq == i) {
      ++i;
    } else {
      ASSERT_LT(i + 1, h.out.size());
      ASSERT_EQ(h.out[i].seq, i + 1) << i;
      ASSERT_EQ(h.out[i + 1].seq, i) << i;
      ++swapped;
      i += 2;
    }
  }
  EXPECT_EQ(swapped + (last_held ? 1u : 0u), h.stats.held);
}

TEST(Impairment, HoldLeavesOtherDecisionsOfASeedAsTheyWere) {
  // Adding tx_hold must not change which datagrams a seed drops (old reproductions stay valid).
  ImpairmentRates a;
  a.drop = 0.2;
  ImpairmentRates b = a;
  b.hold = 0.2;
  Harness ha(a, 77), hb(b, 77);
  for (uint32_t i = 0; i < 1000; ++i) {
    ha.offer(i);
    hb.offer(i);
  }
  hb.imp.release_all(hb.emit());
  std::set<uint32_t> sa, sb;
  for (auto& o : ha.out) sa.insert(o.seq);
  for (auto& o : hb.out) sb.insert(o.seq);
  EXPECT_EQ(sa, sb);
  EXPECT_GT(hb.stats.held, 0u);
}

TEST(Impairment, CorruptionFlipsOneToThreeBits) {
  ImpairmentRates r;
  r.corrupt = 1.0;
  Harness h(r, 5);
  constexpr uint32_t kN = 3000;
  for (uint32_t i = 0; i < kN; ++i) h.offer(i, 256);
  ASSERT_EQ(h.out.size(), kN);
  EXPECT_EQ(h.stats.corrupted, kN);
  std::set<int> flip_counts;
  size_t header_hits = 0;
  for (uint32_t i = 0; i < kN; ++i) {
    const Out& o = h.out[i];
    std::vector<uint8_t> want = original(i, 256);
    ASSERT_EQ(o.bytes.size(), want.size());
    int bits = 0;
    for (size_t k = 0; k < want.size(); ++k) {
      int b = std::popcount(static_cast<unsigned>(o.bytes[k] ^ want[k]));
      bits += b;
      if (b && k < 4) ++header_hits;
    }
    // Two flips of the same bit cancel: 0 or 2 are possible only then; never more than 3.
    EXPECT_LE(bits, 3);
    flip_counts.insert(bits);
  }
  EXPECT_TRUE(flip_counts.count(1) && flip_counts.count(2) && flip_counts.count(3));
  EXPECT_GT(header_hits, 0u);  // anywhere in the datagram, first bytes included
}

TEST(Impairment, OffIsPassThrough) {
  UdpPort a(kLo, 0, impaired("")), b(kLo, 0, impaired(""));
  EXPECT_EQ(a.impairment(), nullptr);
  constexpr uint32_t kN = 200;
  for (uint32_t i = 0; i < kN; ++i) {
    auto d = original(i, 100 + i);
    a.send(d.data(), static_cast<uint32_t>(d.size()), kLo, b.port());
  }
  a.flush();
  std::vector<std::vector<uint8_t>> got;
  Datagram batch[UdpPort::kBatch];
  while (got.size() < kN) {
    pollfd p{b.fd(), POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) break;
    size_t n = b.receive(batch, UdpPort::kBatch);
    for (size_t i = 0; i < n; ++i) got.emplace_back(batch[i].data, batch[i].data + batch[i].len);
  }
  ASSERT_EQ(got.size(), kN);
  for (uint32_t i = 0; i < kN; ++i) EXPECT_EQ(got[i], original(i, 100 + i));
}

// Receives until the socket has gone quiet. from: only datagrams from that UDP port count (0: all).
// Other tests' processes may send to a loopback port the kernel gave us (a retransmission to a peer
// that is gone, whose port was free again), so tests that expect nothing filter by sender.
std::vector<std::vector<uint8_t>> drain(UdpPort& p, size_t max_per_call = UdpPort::kBatch, uint16_t from = 0) {
  std::vector<std::vector<uint8_t>> got;
  Datagram batch[UdpPort::kBatch];
  for (;;) {
    size_t n = p.receive(batch, max_per_call);
    for (size_t i = 0; i < n; ++i)
      if (!from || batch[i].peer_port == from) got.emplace_back(batch[i].data, batch[i].data + batch[i].len);
    if (n) continue;
    pollfd pf{p.fd(), POLLIN, 0};
    if (poll(&pf, 1, 500) <= 0) break;  // quiet: everything sent has arrived (loopback)
  }
  return got;
}

TEST(Impairment, UdpPortTxDropAndDupAreCounted) {
  UdpPort a(kLo, 0, impaired("seed=11,tx_drop=0.2,tx_dup=0.2,tx_reorder=0.2,reorder_depth=4"));
  UdpPort b(kLo, 0, impaired(""));
  ASSERT_NE(a.impairment(), nullptr);
  EXPECT_EQ(b.impairment(), nullptr);
  constexpr uint32_t kN = 1000;
  for (uint32_t i = 0; i < kN; ++i) {
    auto d = original(i);
    a.send(d.data(), 64, kLo, b.port());
    if (i % 10 == 9) a.flush();
  }
  a.flush();
  a.flush();  // held datagrams leave within kMaxTicksHeld flushes
  EXPECT_EQ(a.impairment()->tx.held(), 0u);
  const ImpairmentStats& s = a.impairment()->tx_stats;
  EXPECT_EQ(s.seen, kN);
  EXPECT_GT(s.dropped, 0u);
  EXPECT_GT(s.duplicated, 0u);
  EXPECT_GT(s.reordered, 0u);
  auto got = drain(b, UdpPort::kBatch, a.port());
  EXPECT_EQ(got.size(), kN - s.dropped + s.duplicated);
  std::map<uint32_t, int> copies;
  for (auto& g : got) {
    uint32_t seq;
    std::memcpy(&seq, g.data(), 4);
    ASSERT_LT(seq, kN);
    EXPECT_EQ(g, original(seq));  // no corruption configured
    ++copies[seq];
  }
  EXPECT_EQ(copies.size(), kN - s.dropped);
  EXPECT_EQ(a.stats().tx_packets, kN - s.dropped + s.duplicated);
}

TEST(Impairment, UdpPortRxNothingHeldOnceSocketIsEmpty) {
  UdpPort a(kLo, 0);
  UdpPort b(kLo, 0, impaired("seed=5,rx_reorder=0.5,rx_dup=0.1,rx_corrupt=0.1,reorder_depth=16"));
  ASSERT_NE(b.impairment(), nullptr);
  constexpr uint32_t kN = 500;
  for (uint32_t i = 0; i < kN; ++i) {
    auto d = original(i);
    a.send(d.data(), 64, kLo, b.port());
  }
  a.flush();
  // Small receive batches: leftovers of a call must be delivered by later calls, not lost.
  auto got = drain(b, 7);
  EXPECT_EQ(b.impairment()->rx.held(), 0u);
  const ImpairmentStats& s = b.impairment()->rx_stats;
  EXPECT_EQ(s.seen, kN);
  EXPECT_GT(s.reordered, 0u);
  EXPECT_GT(s.corrupted, 0u);
  EXPECT_EQ(got.size(), kN + s.duplicated);
  size_t damaged = 0;
  std::vector<uint32_t> order;
  for (auto& g : got) {
    uint32_t seq;
    std::memcpy(&seq, g.data(), 4);
    if (seq >= kN || g != original(seq)) ++damaged;
    else order.push_back(seq);
  }
  EXPECT_GT(damaged, 0u);
  EXPECT_LE(damaged, 2 * s.corrupted);  // a corrupted datagram may also be duplicated
  EXPECT_FALSE(std::is_sorted(order.begin(), order.end()));
}

TEST(Impairment, PortsOfOneSeedDrawDifferentStreams) {
  // The seed is mixed with the port's creation index: two ports do not drop the same datagrams.
  UdpPort a(kLo, 0, impaired("seed=1,tx_drop=0.5")), b(kLo, 0, impaired("seed=1,tx_drop=0.5"));
  UdpPort sink(kLo, 0, impaired(""));
  std::vector<uint64_t> da, db;
  for (uint32_t i = 0; i < 64; ++i) {
    auto d = original(i);
    uint64_t before_a = a.impairment()->tx_stats.dropped, before_b = b.impairment()->tx_stats.dropped;
    a.send(d.data(), 64, kLo, sink.port());
    b.send(d.data(), 64, kLo, sink.port());
    da.push_back(a.impairment()->tx_stats.dropped - before_a);
    db.push_back(b.impairment()->tx_stats.dropped - before_b);
  }
  EXPECT_NE(da, db);
}

TEST(Impairment, UdpPortTxHoldSurvivesFlushesUntilTheNextSend) {
  UdpPort a(kLo, 0, impaired("seed=1,tx_hold=1"));
  UdpPort b(kLo, 0, impaired("")), c(kLo, 0, impaired(""));
  auto d1 = original(1), d2 = original(2);
  a.send(d1.data(), 64, kLo, b.port());
  for (int i = 0; i < 10; ++i) a.flush();
  EXPECT_TRUE(a.impairment()->tx.holding());
  EXPECT_TRUE(drain(b, UdpPort::kBatch, a.port()).empty());  // not before the next send
  a.send(d2.data(), 64, kLo, c.port());  // to another port
  a.flush();
  EXPECT_FALSE(a.impairment()->tx.holding());
  auto at_c = drain(c, UdpPort::kBatch, a.port());
  auto at_b = drain(b, UdpPort::kBatch, a.port());
  ASSERT_EQ(at_c.size(), 1u);
  ASSERT_EQ(at_b.size(), 1u);
  EXPECT_EQ(at_c[0], d2);
  EXPECT_EQ(at_b[0], d1);
  EXPECT_EQ(a.stats().tx_packets, 2u);
}

}  // namespace
}  // namespace softrdma::net
