// A million bit-flipped copies of a softrdma peer's request, shot at a live QP, on the context's own
// port and on UDP 4791: none is accepted (issue 12, defect 1), and the intact one still is.
#include <gtest/gtest.h>

#include <cstring>

#include "fabric.h"
#include "net/impairment.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace softrdma::transport::test {
namespace {

constexpr uint32_t kIpA = 0x0100000A, kIpB = 0x0200000A;

TEST(LiveIcrc, NoFlippedPacketOfASoftrdmaPeerIsAccepted) {
  Fabric f;
  Host& ha = f.add_host(kIpA);
  Host& hb = f.add_host(kIpB);
  RcParams p;
  RcPair pair = connect_rc(f, ha, hb, p);
  ASSERT_TRUE(pair.a.qp && pair.b.qp);
  auto src = register_region(*ha.engine, 1, 1024, core::kLocalWrite);
  auto dst = register_region(*hb.engine, 1, 1024, p.access);
  for (int i = 0; i < 1024; ++i) src->data()[i] = static_cast<uint8_t>(i * 31 + 7);
  // Capture a's WRITE ONLY on its way (b never gets it), with where it came from.
  std::vector<uint8_t> good;
  net::MemoryNetwork::Endpoint from{};
  f.net.set_policy([&](const net::MemoryNetwork::Offer& o) {
    net::MemoryNetwork::Fate fate;
    if (good.empty() && o.from.ip_be == kIpA && view(o.data, o.len).opcode == wire::kRcWriteOnly) {
      good.assign(o.data, o.data + o.len);
      from = o.from;
      fate.drop = true;
    }
    return fate;
  });
  ASSERT_EQ(post(pair.a, write_wqe(1, *src, 0, 1024, dst->addr(), dst->mr.rkey)), 0);
  f.run_until([&] { return !good.empty(); }, 1'000'000'000);
  ASSERT_FALSE(good.empty());
  f.net.set_policy(nullptr);
  Engine& b = *hb.engine;
  ASSERT_LT(from.port, net::UdpPort::kContextPortEnd) << "a softrdma context's source port";

  // The same request as it would arrive at UDP 4791 (from another host): its ICRC covers that port.
  std::vector<uint8_t> to_4791 = good;
  wire::append_icrc({kIpA, kIpB, from.port, wire::kRoceUdpPort}, to_4791.data(), to_4791.size() - wire::kIcrcLen);

  net::ImpairmentRng rng(2026);
  const core::Counters before = b.counters();
  uint64_t shot = 0;
  for (const auto* pkt : {&good, &to_4791}) {
    const uint16_t local = pkt == &good ? 0 : wire::kRoceUdpPort;
    for (int i = 0; i < 500000; ++i) {
      std::vector<uint8_t> d = *pkt;
      bool changed = false;
      for (uint32_t k = 0, n = 1 + rng.below(2); k < n; ++k) {
        uint32_t bit = rng.below(static_cast<uint32_t>(d.size() * 8));
        d[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        changed |= bit / 8 != 4;  // byte 4 (FECN, BECN, resv6) is outside the ICRC by design
      }
      if (!changed || d == *pkt) continue;
      b.inject_datagram(d.data(), static_cast<uint32_t>(d.size()), kIpA, from.port, local);
      ++shot;
    }
  }
  const core::Counters after = b.counters();
  const uint64_t dropped = (after.drop_icrc - before.drop_icrc) + (after.drop_malformed - before.drop_malformed) +
                           (after.drop_icrc_ip_id - before.drop_icrc_ip_id);
  EXPECT_GT(shot, 990000u);
  EXPECT_EQ(dropped, shot) << "every flipped packet is dropped before the transport sees it";
  EXPECT_EQ(after.icrc_solved_ip_id, before.icrc_solved_ip_id) << "no identification was solved for a softrdma peer";
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(dst->data()[i], 0) << "nothing was written, at byte " << i;
  EXPECT_EQ(pair.b.qp->resp.epsn, p.psn_a) << "b still expects the request";

  // The intact request is accepted.
  b.inject_datagram(good.data(), static_cast<uint32_t>(good.size()), kIpA, from.port);
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), 1024), 0);
  destroy(pair.a);
  destroy(pair.b);
}

}  // namespace
}  // namespace softrdma::transport::test
