// MemoryNetwork with segmentation offload (Options::gso): consecutive coalescing datagrams of one
// length to one destination fly as one segmented datagram (one flight, one Offer to the policy), and
// the receiving port gives them back one by one with their segment indices (net/gso.h). Without gso, or
// for datagrams that may not coalesce, every datagram flies alone as before.
#include "net/memory_network.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "net/gso.h"

namespace softrdma::net {
namespace {

const wire::IpAddress kIpA = wire::IpAddress::v4(0x0100000A), kIpB = wire::IpAddress::v4(0x0200000A), kIpC = wire::IpAddress::v4(0x0300000A);

// Byte i of datagram `seq`: misplaced, truncated or merged data shows.
uint8_t pattern(uint32_t seq, uint32_t i) { return static_cast<uint8_t>(seq * 131 + i * 7 + (i >> 8)); }
std::vector<uint8_t> bytes_of(uint32_t seq, uint32_t len) {
  std::vector<uint8_t> d(len);
  for (uint32_t i = 0; i < len; ++i) d[i] = pattern(seq, i);
  return d;
}

struct Got {
  std::vector<uint8_t> bytes;
  uint32_t segment;
  wire::IpAddress peer_ip;
  uint16_t peer_port;
};

// What the policy was offered: one entry per flight.
struct Seen {
  MemoryNetwork::Endpoint from, to;
  uint32_t len, seg_size;
};

class MemoryNetworkGso : public ::testing::Test {
 protected:
  MemoryNetwork net{MemoryNetwork::Options{.latency_ns = 1000, .gso = true}};
  std::unique_ptr<PacketPort> a = net.open(kIpA, 0), b = net.open(kIpB, 0), c = net.open(kIpC, 0);
  std::vector<Seen> seen;
  std::function<MemoryNetwork::Fate(const MemoryNetwork::Offer&)> faults;

  void SetUp() override {
    net.set_policy([this](const MemoryNetwork::Offer& o) {
      seen.push_back({o.from, o.to, o.len, o.seg_size});
      return faults ? faults(o) : MemoryNetwork::Fate{};
    });
  }
  // One datagram, written in place; returns the identification reserve() gave it.
  uint16_t put(PacketPort& from, uint32_t seq, uint32_t len, const PacketPort& to, bool coalesce = true) {
    uint16_t ip_id = 0xFFFF;
    uint8_t* p = from.reserve(len, to.ip(), to.port(), coalesce, &ip_id);
    EXPECT_NE(p, nullptr);
    if (!p) return 0xFFFF;
    auto d = bytes_of(seq, len);
    if (len) std::memcpy(p, d.data(), len);  // an empty vector's data() may be null
    from.commit();
    return ip_id;
  }
  // Everything due arrives; every datagram waiting at `port`, in order.
  std::vector<Got> take(PacketPort& port, size_t max_per_call = PacketPort::kBatch) {
    net.advance_to(net.now_ns() + 1'000'000);
    net.deliver();
    std::vector<Got> got;
    Datagram batch[PacketPort::kBatch];
    for (size_t n; (n = port.receive(batch, max_per_call)) > 0;)
      for (size_t i = 0; i < n; ++i)
        got.push_back({std::vector<uint8_t>(batch[i].data, batch[i].data + batch[i].len), batch[i].segment,
                       batch[i].peer_ip, batch[i].peer_port});
    return got;
  }
};

TEST_F(MemoryNetworkGso, ConsecutiveDatagramsFlyAsOneAndArriveApart) {
  for (uint32_t k = 0; k < 5; ++k) EXPECT_EQ(put(*a, k, 200, *b), k) << "segment k carries identification k";
  EXPECT_EQ(net.stats().sent, 0u) << "the run is still being gathered";
  EXPECT_EQ(net.in_flight(), 0u);
  a->flush();
  ASSERT_EQ(seen.size(), 1u) << "one flight";
  EXPECT_EQ(seen[0].len, 1000u);
  EXPECT_EQ(seen[0].seg_size, 200u);
  EXPECT_EQ(seen[0].to.port, b->port());
  EXPECT_EQ(net.stats().sent, 1u);
  EXPECT_EQ(net.in_flight(), 1u);
  auto got = take(*b);
  ASSERT_EQ(got.size(), 5u);
  for (uint32_t k = 0; k < 5; ++k) {
    EXPECT_EQ(got[k].segment, k);
    EXPECT_EQ(got[k].bytes, bytes_of(k, 200)) << "segment " << k;
    EXPECT_EQ(got[k].peer_ip, kIpA);
    EXPECT_EQ(got[k].peer_port, a->port());
  }
  EXPECT_EQ(net.stats().delivered, 1u);
  // The next datagram opens a run of its own (the flush launched the last one).
  EXPECT_EQ(put(*a, 9, 200, *b), 0u);
  a->flush();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].seg_size, 0u) << "a run of one is an ordinary datagram";
  got = take(*b);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].segment, 0u);
  EXPECT_EQ(got[0].bytes, bytes_of(9, 200));
}

TEST_F(MemoryNetworkGso, AShorterDatagramIsTheLastSegment) {
  for (uint32_t k = 0; k < 3; ++k) EXPECT_EQ(put(*a, k, 200, *b), k);
  EXPECT_EQ(put(*a, 3, 57, *b), 3u) << "a shorter one joins, as the last";
  EXPECT_EQ(put(*a, 4, 200, *b), 0u) << "and ends the run: the next one opens another";
  EXPECT_EQ(put(*a, 5, 200, *b), 1u);
  EXPECT_EQ(put(*a, 6, 201, *b), 0u) << "a longer one cannot join";
  a->flush();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].len, 657u);
  EXPECT_EQ(seen[0].seg_size, 200u);
  EXPECT_EQ(seen[1].len, 400u);
  EXPECT_EQ(seen[1].seg_size, 200u);
  EXPECT_EQ(seen[2].len, 201u);
  EXPECT_EQ(seen[2].seg_size, 0u);
  auto got = take(*b);
  ASSERT_EQ(got.size(), 7u);
  const uint32_t segment[] = {0, 1, 2, 3, 0, 1, 0};
  const uint32_t len[] = {200, 200, 200, 57, 200, 200, 201};
  for (uint32_t k = 0; k < 7; ++k) {
    EXPECT_EQ(got[k].segment, segment[k]) << "datagram " << k;
    EXPECT_EQ(got[k].bytes, bytes_of(k, len[k])) << "datagram " << k;
  }
}

TEST_F(MemoryNetworkGso, AnotherDestinationOrANonCoalescingDatagramStartsANewRun) {
  EXPECT_EQ(put(*a, 0, 100, *b), 0u);
  EXPECT_EQ(put(*a, 1, 100, *b), 1u);
  EXPECT_EQ(put(*a, 2, 100, *c), 0u) << "another destination address";
  EXPECT_EQ(put(*a, 3, 100, *c), 1u);
  EXPECT_EQ(seen.size(), 1u) << "the run to b left when the one to c opened";
  auto b2 = net.open(kIpB, 0);  // b's address, another port
  EXPECT_EQ(put(*a, 4, 100, *b2), 0u) << "another destination port";
  EXPECT_EQ(put(*a, 5, 100, *b), 0u);
  EXPECT_EQ(put(*a, 6, 100, *b, false), 0u) << "may not coalesce: alone";
  EXPECT_EQ(put(*a, 7, 100, *b), 0u) << "and nothing joins it";
  EXPECT_EQ(put(*a, 8, 100, *b), 1u);
  a->flush();
  ASSERT_EQ(seen.size(), 6u);
  const uint32_t lens[] = {200, 200, 100, 100, 100, 200};
  const uint32_t segs[] = {100, 100, 0, 0, 0, 100};
  const uint16_t ports[] = {b->port(), c->port(), b2->port(), b->port(), b->port(), b->port()};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(seen[i].len, lens[i]) << "flight " << i;
    EXPECT_EQ(seen[i].seg_size, segs[i]) << "flight " << i;
    EXPECT_EQ(seen[i].to.port, ports[i]) << "flight " << i;
  }
  auto at_b = take(*b), at_c = take(*c), at_b2 = take(*b2);
  ASSERT_EQ(at_b.size(), 6u);
  ASSERT_EQ(at_c.size(), 2u);
  ASSERT_EQ(at_b2.size(), 1u);
  const uint32_t b_seq[] = {0, 1, 5, 6, 7, 8}, b_seg[] = {0, 1, 0, 0, 0, 1};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(at_b[i].bytes, bytes_of(b_seq[i], 100)) << "at b, " << i;
    EXPECT_EQ(at_b[i].segment, b_seg[i]) << "at b, " << i;
  }
  EXPECT_EQ(at_c[0].bytes, bytes_of(2, 100));
  EXPECT_EQ(at_c[1].bytes, bytes_of(3, 100));
  EXPECT_EQ(at_c[1].segment, 1u);
  EXPECT_EQ(at_b2[0].bytes, bytes_of(4, 100));
  EXPECT_EQ(at_b2[0].segment, 0u);
}

TEST_F(MemoryNetworkGso, ARunHoldsAtMost64SegmentsAnd65507Bytes) {
  for (uint32_t k = 0; k < 70; ++k) EXPECT_EQ(put(*a, k, 100, *b), k % kGsoMaxSegments) << "datagram " << k;
  a->flush();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].len, 6400u);
  EXPECT_EQ(seen[1].len, 600u);
  auto got = take(*b);
  ASSERT_EQ(got.size(), 70u);
  for (uint32_t k = 0; k < 70; ++k) {
    EXPECT_EQ(got[k].segment, k % 64);
    EXPECT_EQ(got[k].bytes, bytes_of(k, 100));
  }
  // 65507 = 13 * 5039: thirteen fill a run exactly, the fourteenth opens the next.
  seen.clear();
  for (uint32_t k = 0; k < 14; ++k) EXPECT_EQ(put(*a, k, 5039, *b), k % 13) << "datagram " << k;
  // 9000-byte ones: seven fit (63000), the eighth would pass 65507.
  for (uint32_t k = 0; k < 8; ++k) EXPECT_EQ(put(*a, 100 + k, 9000, *c), k % 7) << "datagram " << k;
  a->flush();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].len, kGsoMaxBytes);
  EXPECT_EQ(seen[1].len, 5039u);
  EXPECT_EQ(seen[2].len, 63000u);
  EXPECT_EQ(seen[2].seg_size, 9000u);
  EXPECT_EQ(seen[3].len, 9000u);
  got = take(*b);
  ASSERT_EQ(got.size(), 14u);
  for (uint32_t k = 0; k < 14; ++k) {
    EXPECT_EQ(got[k].segment, k % 13);
    EXPECT_EQ(got[k].bytes, bytes_of(k, 5039));
  }
  got = take(*c);
  ASSERT_EQ(got.size(), 8u);
  for (uint32_t k = 0; k < 8; ++k) {
    EXPECT_EQ(got[k].segment, k % 7);
    EXPECT_EQ(got[k].bytes, bytes_of(100 + k, 9000));
  }
}

TEST_F(MemoryNetworkGso, AFlightIsSplitAcrossReceives) {
  for (uint32_t k = 0; k < 5; ++k) put(*a, k, 300, *b);
  put(*a, 5, 300, *c);
  for (uint32_t k = 6; k < 9; ++k) put(*a, k, 64, *b);
  a->flush();
  ASSERT_EQ(seen.size(), 3u);
  auto got = take(*b, 2);  // two at a time: the split goes on where the last receive stopped
  ASSERT_EQ(got.size(), 8u);
  const uint32_t seq[] = {0, 1, 2, 3, 4, 6, 7, 8}, seg[] = {0, 1, 2, 3, 4, 0, 1, 2};
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(got[i].segment, seg[i]) << i;
    EXPECT_EQ(got[i].bytes, bytes_of(seq[i], seq[i] < 5 ? 300 : 64)) << i;
  }
}

TEST_F(MemoryNetworkGso, ThePolicySeesTheWholeFlightAndMayCorruptOneSegment) {
  const uint32_t kBit = (2 * 256 + 77) * 8 + 5;  // in segment 2
  faults = [&](const MemoryNetwork::Offer& o) {
    MemoryNetwork::Fate fate;
    EXPECT_EQ(o.seg_size, 256u);
    EXPECT_EQ(o.len, 4 * 256u);
    for (uint32_t k = 0; k < 4; ++k)
      EXPECT_EQ(std::vector<uint8_t>(o.data + k * 256, o.data + (k + 1) * 256), bytes_of(k, 256))
          << "the policy reads segment " << k << " at k * seg_size";
    fate.flip_bit = kBit;
    fate.duplicate = true;
    return fate;
  };
  for (uint32_t k = 0; k < 4; ++k) put(*a, k, 256, *b);
  a->flush();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(net.stats().flipped, 2u);  // in both copies
  auto got = take(*b);
  ASSERT_EQ(got.size(), 8u) << "two copies of four segments";
  for (uint32_t i = 0; i < 8; ++i) {
    const uint32_t k = i % 4;
    EXPECT_EQ(got[i].segment, k);
    auto want = bytes_of(k, 256);
    if (k == 2) want[77] ^= 1u << 5;
    EXPECT_EQ(got[i].bytes, want) << "copy " << i / 4 << ", segment " << k;
  }
  // A dropped flight loses every segment of it.
  faults = [](const MemoryNetwork::Offer&) { return MemoryNetwork::Fate{.drop = true}; };
  for (uint32_t k = 0; k < 4; ++k) put(*a, k, 256, *b);
  a->flush();
  EXPECT_TRUE(take(*b).empty());
  EXPECT_EQ(net.stats().dropped, 1u);
}

TEST_F(MemoryNetworkGso, AHeldFlightArrivesWholeAfterTheNextOne) {
  bool first = true;
  faults = [&](const MemoryNetwork::Offer&) {
    MemoryNetwork::Fate fate;
    fate.hold = first;
    first = false;
    return fate;
  };
  for (uint32_t k = 0; k < 3; ++k) put(*a, k, 128, *b);
  a->flush();
  EXPECT_TRUE(take(*b).empty());
  put(*a, 3, 50, *b);
  put(*a, 4, 50, *b);
  a->flush();
  auto got = take(*b);
  ASSERT_EQ(got.size(), 5u);
  const uint32_t seq[] = {3, 4, 0, 1, 2}, seg[] = {0, 1, 0, 1, 2};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(got[i].segment, seg[i]) << i;
    EXPECT_EQ(got[i].bytes, bytes_of(seq[i], seq[i] < 3 ? 128 : 50)) << i;
  }
}

TEST_F(MemoryNetworkGso, ATooLongDatagramIsRefusedAndTheRunGoesOn) {
  put(*a, 0, 100, *b);
  uint16_t id = 0;
  EXPECT_EQ(a->reserve(MemoryNetwork::kMaxDatagram + 1, kIpB, b->port(), true, &id), nullptr);
  EXPECT_EQ(put(*a, 1, 100, *b), 1u);
  a->flush();
  auto got = take(*b);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].segment, 1u);
  EXPECT_EQ(got[1].bytes, bytes_of(1, 100));
}

TEST_F(MemoryNetworkGso, ClosingAPortLaunchesItsOpenRun) {
  for (uint32_t k = 0; k < 3; ++k) put(*a, k, 100, *b);
  a.reset();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].seg_size, 100u);
  auto got = take(*b);
  ASSERT_EQ(got.size(), 3u);
  for (uint32_t k = 0; k < 3; ++k) EXPECT_EQ(got[k].segment, k);
}

TEST_F(MemoryNetworkGso, AnEmptyDatagramIsNotLostInARun) {
  // A segmented send's segments are seg_size bytes but the last, which is shorter: an empty one has no
  // place there (the receiver, and the kernel's UDP_SEGMENT alike, would see one datagram fewer).
  put(*a, 0, 100, *b);
  put(*a, 1, 0, *b);
  put(*a, 2, 100, *b);
  a->flush();
  auto got = take(*b);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].bytes, bytes_of(0, 100));
  EXPECT_TRUE(got[1].bytes.empty());
  EXPECT_EQ(got[2].bytes, bytes_of(2, 100));
}

// Without segmentation offload nothing changes: every datagram flies alone as soon as it is committed,
// coalescing or not, with identification 0, and arrives as segment 0.
TEST(MemoryNetworkNoGso, EveryDatagramFliesAlone) {
  for (bool explicit_options : {false, true}) {
    MemoryNetwork net = explicit_options ? MemoryNetwork(MemoryNetwork::Options{.latency_ns = 1000, .gso = false})
                                         : MemoryNetwork(1000);
    std::vector<uint32_t> seg_sizes, lens;
    net.set_policy([&](const MemoryNetwork::Offer& o) {
      seg_sizes.push_back(o.seg_size);
      lens.push_back(o.len);
      return MemoryNetwork::Fate{};
    });
    auto a = net.open(kIpA, 0), b = net.open(kIpB, 0);
    for (uint32_t k = 0; k < 6; ++k) {
      const uint32_t len = k == 5 ? 40 : 200;
      uint16_t id = 0xFFFF;
      uint8_t* p = a->reserve(len, kIpB, b->port(), k % 2 == 0, &id);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(id, 0u);
      auto d = bytes_of(k, len);
      std::memcpy(p, d.data(), len);
      a->commit();
      EXPECT_EQ(net.stats().sent, k + 1) << "it leaves at commit";
    }
    a->flush();
    ASSERT_EQ(seg_sizes.size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(seg_sizes[i], 0u);
      EXPECT_EQ(lens[i], i == 5 ? 40u : 200u);
    }
    net.advance_to(net.now_ns() + 1'000'000);
    EXPECT_EQ(net.deliver(), 6u);
    Datagram batch[PacketPort::kBatch];
    size_t n = b->receive(batch, PacketPort::kBatch);
    ASSERT_EQ(n, 6u);
    for (uint32_t k = 0; k < 6; ++k) {
      EXPECT_EQ(batch[k].segment, 0u);
      EXPECT_EQ(std::vector<uint8_t>(batch[k].data, batch[k].data + batch[k].len), bytes_of(k, k == 5 ? 40 : 200));
    }
  }
}

}  // namespace
}  // namespace softrdma::net
