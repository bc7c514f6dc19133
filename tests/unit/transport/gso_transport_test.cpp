// RC over segmentation offload (MemoryNetwork::Options::gso): engines' packets to one another's context
// ports leave as segmented datagrams, segment k with IP identification k, which its ICRC covers, and the
// receiver checks each segment with the identification its index implies. Asserted in virtual time:
// a workload of WRITE, SEND and READ completes with exact data; a flight may carry the packets of two
// QPs; a message whose length is not a multiple of the path MTU ends a flight with a shorter segment;
// a flight with one corrupted segment loses that packet alone, which the transport resends. Undisturbed,
// every segment checks out Exact (no icrc_moved_segment). GSO_TRACE=1 prints every flight.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>
#include <sstream>
#include <tuple>

#include "fabric.h"
#include "net/udp_port.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace softrdma::transport::test {
namespace {

const wire::IpAddress kIpA = wire::IpAddress::v4(0x0100000A), kIpB = wire::IpAddress::v4(0x0200000A);

// One flight as the policy saw it: its segments, parsed.
struct Flight {
  bool from_a;
  uint16_t from_port, to_port;
  uint32_t seg_size;  // 0: a datagram alone
  std::vector<uint32_t> lens;
  std::vector<PacketView> pkts;
  size_t segments() const { return pkts.size(); }
};

void fill(Region& r, uint32_t salt) {
  for (size_t i = 0; i < r.bytes.size(); ++i) r.bytes[i] = static_cast<uint8_t>(i * 7 + (i >> 9) * 13 + salt);
}

class GsoTransport : public ::testing::Test {
 protected:
  Fabric f{net::MemoryNetwork::Options{.latency_ns = 2000, .gso = true}};
  Host* ha = nullptr;
  Host* hb = nullptr;
  RcParams params;
  std::deque<RcPair> pairs;  // references stay valid as pairs are added
  std::vector<Flight> flights;
  // Decides a flight's fate; nullptr: deliver.
  std::function<net::MemoryNetwork::Fate(const net::MemoryNetwork::Offer&, const Flight&)> faults;

  void SetUp() override {
    ha = &f.add_host(kIpA);
    hb = &f.add_host(kIpB);
    f.net.set_policy([this](const net::MemoryNetwork::Offer& o) {
      Flight fl{o.from.ip == kIpA, o.from.port, o.to.port, o.seg_size, {}, {}};
      for (const Segment& s : segments(o)) {
        fl.lens.push_back(s.len);
        fl.pkts.push_back(view(s.data, s.len));
      }
      flights.push_back(fl);
      return faults ? faults(o, fl) : net::MemoryNetwork::Fate{};
    });
  }
  void TearDown() override {
    if (getenv("GSO_TRACE")) std::printf("%s", dump().c_str());  // every flight, segment by segment
    faults = nullptr;  // it may refer to the test body's locals
    for (RcPair& p : pairs) {
      destroy(p.a);
      destroy(p.b);
    }
    f.net.set_policy(nullptr);  // the engines' ports close after this fixture's members are gone
  }
  RcPair& connect() {
    RcParams p = params;
    p.psn_a += 0x1000 * static_cast<uint32_t>(pairs.size());
    p.psn_b += 0x1000 * static_cast<uint32_t>(pairs.size());
    pairs.push_back(connect_rc(f, *ha, *hb, p));
    EXPECT_TRUE(pairs.back().a.qp && pairs.back().b.qp);
    return pairs.back();
  }
  // Runs until every (end, cq) has its count of completions; returns them, per end.
  std::vector<std::vector<core::Cqe>> run(const std::vector<std::tuple<End*, core::CompletionQueue*, size_t>>& want) {
    std::vector<std::vector<core::Cqe>> got(want.size());
    bool ok = f.run_until(
        [&] {
          bool all = true;
          for (size_t i = 0; i < want.size(); ++i) {
            auto [e, cq, n] = want[i];
            for (auto& c : poll_all(*e, *cq)) got[i].push_back(c);
            all &= got[i].size() >= n;
          }
          return all;
        },
        10'000'000'000ull);
    EXPECT_TRUE(ok) << "did not complete\n" << dump();
    return got;
  }
  std::string dump() const {
    std::ostringstream s;
    for (const Flight& fl : flights) {
      s << (fl.from_a ? "a>" : "b>") << " flight of " << fl.segments() << " (seg " << fl.seg_size << ") to port "
        << fl.to_port << "\n";
      for (size_t k = 0; k < fl.segments(); ++k)
        s << "    " << k << ": qp " << std::hex << fl.pkts[k].dest_qp << std::dec << " " << describe(fl.pkts[k])
          << " len " << fl.lens[k] << "\n";
    }
    return s.str();
  }
  size_t segments_from(bool a) const {
    size_t n = 0;
    for (const Flight& fl : flights) n += fl.from_a == a ? fl.segments() : 0;
    return n;
  }
  bool has_segmented_flight(bool from_a) const {
    for (const Flight& fl : flights)
      if (fl.from_a == from_a && fl.segments() > 1) return true;
    return false;
  }
  // No packet failed its ICRC, and each checked out with its own segment's identification (Exact).
  void expect_all_exact(Engine& e, const char* who) {
    const core::Counters c = e.counters();
    EXPECT_EQ(c.icrc_moved_segment, 0u) << who << ": a segment did not check out with its own identification";
    EXPECT_EQ(c.drop_icrc, 0u) << who;
    EXPECT_EQ(c.drop_icrc_ip_id, 0u) << who;
    EXPECT_EQ(c.icrc_solved_ip_id, 0u) << who;
    EXPECT_EQ(c.drop_malformed, 0u) << who;
  }
};

TEST_F(GsoTransport, WriteSendAndReadCompleteOverSegmentedFlights) {
  RcPair& p = connect();
  auto src = register_region(*ha->engine, 1, 256 << 10, core::kLocalWrite);
  auto sink = register_region(*ha->engine, 1, 64 << 10, core::kLocalWrite);
  auto dst = register_region(*hb->engine, 1, 256 << 10, params.access);
  auto rbuf = register_region(*hb->engine, 1, 32 << 10, core::kLocalWrite);
  fill(*src, 1);
  fill(*dst, 2);
  const std::vector<uint8_t> dst_before = dst->bytes;
  ASSERT_EQ(post(p.b, recv_wqe(50, *rbuf, 0, 32 << 10)), 0);
  ASSERT_EQ(post(p.a, write_wqe(1, *src, 0, 64 << 10, dst->addr(0), dst->mr.rkey)), 0);
  ASSERT_EQ(post(p.a, send_wqe(2, *src, 100000, 20000)), 0);
  ASSERT_EQ(post(p.a, read_wqe(3, *sink, 0, 48 << 10, dst->addr(128 << 10), dst->mr.rkey)), 0);
  ASSERT_EQ(post(p.a, write_wqe(4, *src, 70000, 30000, dst->addr(200 << 10), dst->mr.rkey)), 0);
  auto got = run({{&p.a, p.a.scq.get(), 4}, {&p.b, p.b.rcq.get(), 1}});
  ASSERT_EQ(got[0].size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(got[0][i].wr_id, i + 1);
    EXPECT_EQ(got[0][i].status, WcStatus::Success) << "wr " << i + 1;
  }
  ASSERT_EQ(got[1].size(), 1u);
  EXPECT_EQ(got[1][0].status, WcStatus::Success);
  EXPECT_EQ(got[1][0].byte_len, 20000u);
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), 64 << 10), 0) << "WRITE 1";
  EXPECT_EQ(std::memcmp(dst->data() + (200 << 10), src->data() + 70000, 30000), 0) << "WRITE 4";
  EXPECT_EQ(std::memcmp(rbuf->data(), src->data() + 100000, 20000), 0) << "SEND";
  EXPECT_EQ(std::memcmp(sink->data(), dst_before.data() + (128 << 10), 48 << 10), 0) << "READ";
  // Bytes no request targets are as they were.
  EXPECT_EQ(std::memcmp(dst->data() + (64 << 10), dst_before.data() + (64 << 10), (200 - 64) << 10), 0);
  EXPECT_EQ(std::memcmp(dst->data() + (200 << 10) + 30000, dst_before.data() + (200 << 10) + 30000,
                        (56 << 10) - 30000), 0);
  ASSERT_TRUE(f.settle());

  // It went segmented both ways (requests; READ responses), and every segment arrived and checked out.
  EXPECT_TRUE(has_segmented_flight(true)) << dump();
  EXPECT_TRUE(has_segmented_flight(false)) << dump();
  size_t longest = 0;
  for (const Flight& fl : flights) longest = std::max(longest, fl.segments());
  EXPECT_GE(longest, 8u) << "a window's worth of full-MTU packets leaves as one flight\n" << dump();
  const core::Counters ca = ha->engine->counters(), cb = hb->engine->counters();
  EXPECT_EQ(ca.tx_packets, segments_from(true));
  EXPECT_EQ(cb.tx_packets, segments_from(false));
  EXPECT_EQ(cb.rx_packets, segments_from(true)) << "every segment was received as a packet of its own";
  EXPECT_EQ(ca.rx_packets, segments_from(false));
  EXPECT_EQ(ca.retransmits, 0u);
  expect_all_exact(*ha->engine, "a");
  expect_all_exact(*hb->engine, "b");
}

TEST_F(GsoTransport, AFlightCarriesThePacketsOfTwoQps) {
  // Two QPs of a's context to two QPs of b's: one source port, one destination port, so their packets
  // may leave in one segmented send and arrive in one buffer.
  RcPair& p1 = connect();
  RcPair& p2 = connect();
  const uint32_t q1 = p1.b.qp->qpn, q2 = p2.b.qp->qpn;
  auto src = register_region(*ha->engine, 1, 128 << 10, core::kLocalWrite);
  auto dst1 = register_region(*hb->engine, 1, 128 << 10, params.access);
  auto dst2 = register_region(*hb->engine, 1, 128 << 10, params.access);
  auto rbuf = register_region(*hb->engine, 1, 64 << 10, core::kLocalWrite);
  fill(*src, 3);
  ASSERT_EQ(post(p1.b, recv_wqe(1, *rbuf, 0, 16 << 10)), 0);
  ASSERT_EQ(post(p2.b, recv_wqe(2, *rbuf, 32 << 10, 16 << 10)), 0);
  // Each QP: two WRITEs and a SEND, posted in turn, so that both have packets in the port at once.
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(post(p1.a, write_wqe(10 + round, *src, round * 32768, 32768, dst1->addr(round * 32768), dst1->mr.rkey)), 0);
    ASSERT_EQ(post(p2.a, write_wqe(20 + round, *src, 65536 + round * 32768, 32768, dst2->addr(round * 32768),
                                   dst2->mr.rkey)), 0);
  }
  ASSERT_EQ(post(p1.a, send_wqe(12, *src, 1000, 12288)), 0);
  ASSERT_EQ(post(p2.a, send_wqe(22, *src, 5000, 12288)), 0);
  auto got = run({{&p1.a, p1.a.scq.get(), 3}, {&p2.a, p2.a.scq.get(), 3}, {&p1.b, p1.b.rcq.get(), 1},
                  {&p2.b, p2.b.rcq.get(), 1}});
  for (int q = 0; q < 2; ++q) {
    ASSERT_EQ(got[q].size(), 3u);
    for (const core::Cqe& c : got[q]) EXPECT_EQ(c.status, WcStatus::Success) << "wr " << c.wr_id;
    ASSERT_EQ(got[2 + q].size(), 1u);
    EXPECT_EQ(got[2 + q][0].status, WcStatus::Success);
    EXPECT_EQ(got[2 + q][0].byte_len, 12288u);
  }
  EXPECT_EQ(std::memcmp(dst1->data(), src->data(), 65536), 0) << "QP 1's WRITEs";
  EXPECT_EQ(std::memcmp(dst2->data(), src->data() + 65536, 65536), 0) << "QP 2's WRITEs";
  EXPECT_EQ(std::memcmp(rbuf->data(), src->data() + 1000, 12288), 0) << "QP 1's SEND";
  EXPECT_EQ(std::memcmp(rbuf->data() + (32 << 10), src->data() + 5000, 12288), 0) << "QP 2's SEND";
  ASSERT_TRUE(f.settle());

  // Some flight of requests held packets of both QPs (and so did a flight of b's ACKs, likely).
  int mixed_requests = 0;
  for (const Flight& fl : flights) {
    if (!fl.from_a) continue;
    std::set<uint32_t> qps;
    for (const PacketView& v : fl.pkts) qps.insert(v.dest_qp);
    if (qps.count(q1) && qps.count(q2)) ++mixed_requests;
  }
  EXPECT_GT(mixed_requests, 0) << "no flight mixed the two QPs\n" << dump();
  EXPECT_EQ(ha->engine->counters().retransmits, 0u);
  expect_all_exact(*ha->engine, "a");
  expect_all_exact(*hb->engine, "b");
}

TEST_F(GsoTransport, AShortLastPacketIsTheShortLastSegment) {
  RcPair& p = connect();
  constexpr uint32_t kWrite = 5 * 1024 + 77, kSend = 2 * 1024 + 3, kRead = 3 * 1024 + 5;
  auto src = register_region(*ha->engine, 1, 16 << 10, core::kLocalWrite);
  auto sink = register_region(*ha->engine, 1, 8 << 10, core::kLocalWrite);
  auto dst = register_region(*hb->engine, 1, 16 << 10, params.access);
  auto rbuf = register_region(*hb->engine, 1, 8 << 10, core::kLocalWrite);
  fill(*src, 5);
  fill(*dst, 6);
  std::memset(sink->data(), 0xEE, sink->bytes.size());
  std::memset(rbuf->data(), 0xEE, rbuf->bytes.size());
  const std::vector<uint8_t> dst_before = dst->bytes;
  ASSERT_EQ(post(p.b, recv_wqe(9, *rbuf, 0, 8 << 10)), 0);
  ASSERT_EQ(post(p.a, write_wqe(1, *src, 0, kWrite, dst->addr(0), dst->mr.rkey)), 0);
  ASSERT_EQ(post(p.a, send_wqe(2, *src, 8192, kSend)), 0);
  ASSERT_EQ(post(p.a, read_wqe(3, *sink, 0, kRead, dst->addr(8192), dst->mr.rkey)), 0);
  auto got = run({{&p.a, p.a.scq.get(), 3}, {&p.b, p.b.rcq.get(), 1}});
  ASSERT_EQ(got[0].size(), 3u);
  for (const core::Cqe& c : got[0]) EXPECT_EQ(c.status, WcStatus::Success) << "wr " << c.wr_id;
  ASSERT_EQ(got[1].size(), 1u);
  EXPECT_EQ(got[1][0].byte_len, kSend);
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), kWrite), 0);
  EXPECT_EQ(std::memcmp(dst->data() + kWrite, dst_before.data() + kWrite, 8192 - kWrite), 0)
      << "nothing past the WRITE's last byte (its pad) reached memory";
  EXPECT_EQ(std::memcmp(rbuf->data(), src->data() + 8192, kSend), 0);
  EXPECT_EQ(rbuf->data()[kSend], 0xEE);
  EXPECT_EQ(std::memcmp(sink->data(), dst_before.data() + 8192, kRead), 0);
  EXPECT_EQ(sink->data()[kRead], 0xEE);
  ASSERT_TRUE(f.settle());

  // The WRITE's and the READ's last packets each ended a segmented flight as its shorter last segment.
  auto short_last = [&](bool from_a, uint8_t opcode) {
    for (const Flight& fl : flights)
      if (fl.from_a == from_a && fl.segments() > 1 && fl.pkts.back().opcode == opcode &&
          fl.lens.back() < fl.seg_size) {
        for (size_t k = 0; k + 1 < fl.segments(); ++k)
          if (fl.lens[k] != fl.seg_size) return false;
        return true;
      }
    return false;
  };
  EXPECT_TRUE(short_last(true, wire::kRcWriteLast)) << dump();
  EXPECT_TRUE(short_last(false, wire::kRcReadResponseLast)) << dump();
  expect_all_exact(*ha->engine, "a");
  expect_all_exact(*hb->engine, "b");
}

TEST_F(GsoTransport, APeerReachedAt4791IsLearnedAtItsContextPortAndThenSegmented) {
  // a reaches b as a QP of another host's process is reached: at UDP 4791, whose holder there (b's
  // engine) takes the packets; those may not coalesce (RoCE stacks listen there). b's replies come from
  // its context port: from then on a sends there, segmented.
  RcPair& p = connect();
  p.a.qp->dest_port = wire::kRoceUdpPort;
  auto src = register_region(*ha->engine, 1, 64 << 10, core::kLocalWrite);
  auto dst = register_region(*hb->engine, 1, 64 << 10, params.access);
  fill(*src, 9);
  ASSERT_EQ(post(p.a, write_wqe(1, *src, 0, 16 << 10, dst->addr(), dst->mr.rkey)), 0);
  auto got = run({{&p.a, p.a.scq.get(), 1}});
  ASSERT_EQ(got[0].size(), 1u);
  EXPECT_EQ(got[0][0].status, WcStatus::Success);
  ASSERT_TRUE(f.settle());
  uint16_t b_port = 0;
  size_t first_flights = flights.size();
  for (const Flight& fl : flights) {
    if (fl.from_a) {
      EXPECT_EQ(fl.to_port, wire::kRoceUdpPort) << dump();
      EXPECT_EQ(fl.segments(), 1u) << "nothing to 4791 is segmented\n" << dump();
    } else {
      b_port = fl.from_port;
    }
  }
  ASSERT_GE(b_port, net::UdpPort::kContextPortBegin);
  ASSERT_LT(b_port, net::UdpPort::kContextPortEnd);
  EXPECT_EQ(p.a.qp->dest_port, b_port) << "learned from b's replies";
  EXPECT_EQ(ha->engine->counters().peer_port_learned, 1u);
  EXPECT_EQ(hb->engine->counters().peer_port_learned, 0u) << "b reached a at its port from the start";

  ASSERT_EQ(post(p.a, write_wqe(2, *src, 16 << 10, 48 << 10, dst->addr(16 << 10), dst->mr.rkey)), 0);
  got = run({{&p.a, p.a.scq.get(), 1}});
  ASSERT_EQ(got[0].size(), 1u);
  EXPECT_EQ(got[0][0].status, WcStatus::Success);
  ASSERT_TRUE(f.settle());
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), 64 << 10), 0);
  bool segmented = false;
  for (size_t i = first_flights; i < flights.size(); ++i)
    if (flights[i].from_a) {
      EXPECT_EQ(flights[i].to_port, b_port);
      segmented |= flights[i].segments() > 1;
    }
  EXPECT_TRUE(segmented) << dump();
  EXPECT_EQ(ha->engine->counters().peer_port_learned, 1u) << "once";
  expect_all_exact(*ha->engine, "a");
  expect_all_exact(*hb->engine, "b");
}

// A bit flipped in segment j of the first flight of at least four segments (of a's requests, or of b's
// READ responses): that packet alone is dropped for its ICRC, the ones before it are taken, and the
// transport resends from it; the data is exact.
struct Corruption {
  bool in_requests;
  int segment;  // -1: the last
};

class GsoCorruption : public GsoTransport, public ::testing::WithParamInterface<Corruption> {};

TEST_P(GsoCorruption, OneCorruptedSegmentIsDroppedAloneAndResent) {
  const Corruption cfg = GetParam();
  RcPair& p = connect();
  constexpr uint32_t kLen = 16 << 10;  // 16 packets
  auto src = register_region(*ha->engine, 1, kLen, core::kLocalWrite);
  auto dst = register_region(*hb->engine, 1, kLen, params.access);
  fill(*src, 7);
  fill(*dst, 8);
  const std::vector<uint8_t> dst_before = dst->bytes;
  bool done = false;
  uint32_t bad_psn = 0;
  size_t bad_flight = 0, bad_index = 0;
  faults = [&](const net::MemoryNetwork::Offer& o, const Flight& fl) {
    net::MemoryNetwork::Fate fate;
    if (done || fl.from_a != cfg.in_requests || fl.segments() < 4) return fate;
    const auto segs = segments(o);
    const size_t j = cfg.segment < 0 ? segs.size() - 1 : static_cast<size_t>(cfg.segment);
    // A payload bit: the packet still parses, only its ICRC tells.
    const uint32_t at = segs[j].offset + wire::opcode_info(fl.pkts[j].opcode).header_len + 100;
    fate.flip_bit = at * 8 + 3;
    bad_psn = fl.pkts[j].psn;
    bad_flight = flights.size() - 1;
    bad_index = j;
    done = true;
    return fate;
  };
  if (cfg.in_requests)
    ASSERT_EQ(post(p.a, write_wqe(1, *src, 0, kLen, dst->addr(), dst->mr.rkey)), 0);
  else
    ASSERT_EQ(post(p.a, read_wqe(1, *src, 0, kLen, dst->addr(), dst->mr.rkey)), 0);
  auto got = run({{&p.a, p.a.scq.get(), 1}});
  ASSERT_EQ(got[0].size(), 1u);
  EXPECT_EQ(got[0][0].status, WcStatus::Success);
  ASSERT_TRUE(done) << "no flight of four segments to corrupt\n" << dump();
  if (cfg.in_requests)
    EXPECT_EQ(std::memcmp(dst->data(), src->data(), kLen), 0);
  else
    EXPECT_EQ(std::memcmp(src->data(), dst_before.data(), kLen), 0);
  ASSERT_TRUE(f.settle());

  Engine& receiver = cfg.in_requests ? *hb->engine : *ha->engine;
  Engine& sender = cfg.in_requests ? *ha->engine : *hb->engine;
  const core::Counters rc = receiver.counters();
  EXPECT_EQ(rc.drop_icrc, 1u) << "the corrupted segment, and it alone\n" << dump();
  EXPECT_EQ(rc.icrc_moved_segment, 0u) << "the other segments checked out with their own identification";
  EXPECT_EQ(rc.drop_malformed, 0u);
  EXPECT_EQ(rc.rx_packets, segments_from(cfg.in_requests));
  expect_all_exact(sender, "sender");
  // What came after the corrupted packet: the resend starts at its PSN.
  bool resent = false;
  for (size_t i = bad_flight + 1; i < flights.size() && !resent; ++i)
    if (flights[i].from_a == cfg.in_requests)
      for (const PacketView& v : flights[i].pkts) resent |= v.psn == bad_psn;
  EXPECT_TRUE(resent) << "psn " << bad_psn << " (segment " << bad_index << ") was not sent again\n" << dump();
  if (cfg.in_requests) {
    // b took the segments before it and asked for the corrupted one (a PSN sequence NAK naming it), unless
    // it was the last of the message, whose loss only the timer finds.
    int naks = 0;
    for (const Flight& fl : flights)
      for (const PacketView& v : fl.pkts)
        if (!fl.from_a && wire::aeth_type(v.syndrome) == wire::AethType::Nak) {
          ++naks;
          EXPECT_EQ(wire::aeth_value(v.syndrome), wire::kNakPsnSeqErr);
          EXPECT_EQ(v.psn, bad_psn) << "b expected the corrupted packet next: the ones before it were taken";
        }
    const bool last_of_message = flights[bad_flight].pkts[bad_index].opcode == wire::kRcWriteLast;
    if (!last_of_message) {
      EXPECT_EQ(naks, 1) << dump();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Segments, GsoCorruption,
                         ::testing::Values(Corruption{true, 1}, Corruption{true, 2}, Corruption{true, -1},
                                           Corruption{false, 1}, Corruption{false, -1}),
                         [](const ::testing::TestParamInfo<Corruption>& i) {
                           return std::string(i.param.in_requests ? "Request" : "ReadResponse") + "Segment" +
                                  (i.param.segment < 0 ? std::string("Last") : std::to_string(i.param.segment));
                         });

}  // namespace
}  // namespace softrdma::transport::test
