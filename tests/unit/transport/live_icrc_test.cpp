// A million bit-flipped copies of a softrdma peer's request, shot at a live QP, on the context's own
// port and on UDP 4791: none is accepted (issue 12, defect 1), and the intact one still is.
#include <gtest/gtest.h>

#include <cstring>

#include "fabric.h"
#include "live_capture.h"
#include "net/impairment.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace softrdma::transport::test {
namespace {

const wire::IpAddress kIpA = wire::IpAddress::v4(0x0100000A), kIpB = wire::IpAddress::v4(0x0200000A);

TEST(LiveIcrc, NoFlippedPacketOfASoftrdmaPeerIsAccepted) {
  // Capture a's WRITE ONLY on its way (b never gets it), with where it came from.
  CapturedWrite c;
  ASSERT_NO_FATAL_FAILURE(capture_write_only(c, kIpA, kIpB, 31, 7));
  Engine& b = *c.hb->engine;
  ASSERT_LT(c.from.port, net::UdpPort::kContextPortEnd) << "a softrdma context's source port";

  // The same request as it would arrive at UDP 4791 (from another host): its ICRC covers that port.
  std::vector<uint8_t> to_4791 = c.good;
  wire::append_icrc({kIpA, kIpB, c.from.port, wire::kRoceUdpPort}, to_4791.data(), to_4791.size() - wire::kIcrcLen);

  net::ImpairmentRng rng(2026);
  const core::Counters before = b.counters();
  uint64_t shot = 0;
  for (const auto* pkt : {&c.good, &to_4791}) {
    const uint16_t local = pkt == &c.good ? 0 : wire::kRoceUdpPort;
    for (int i = 0; i < 500000; ++i) {
      std::vector<uint8_t> d = *pkt;
      bool changed = false;
      for (uint32_t k = 0, n = 1 + rng.below(2); k < n; ++k) {
        uint32_t bit = rng.below(static_cast<uint32_t>(d.size() * 8));
        d[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        changed |= bit / 8 != 4;  // byte 4 (FECN, BECN, resv6) is outside the ICRC by design
      }
      if (!changed || d == *pkt) continue;
      b.inject_datagram(d.data(), static_cast<uint32_t>(d.size()), kIpA, c.from.port, local);
      ++shot;
    }
  }
  const core::Counters after = b.counters();
  const uint64_t dropped = (after.drop_icrc - before.drop_icrc) + (after.drop_malformed - before.drop_malformed) +
                           (after.drop_icrc_ip_id - before.drop_icrc_ip_id);
  EXPECT_GT(shot, 990000u);
  EXPECT_EQ(dropped, shot) << "every flipped packet is dropped before the transport sees it";
  EXPECT_EQ(after.icrc_solved_ip_id, before.icrc_solved_ip_id) << "no identification was solved for a softrdma peer";
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(c.dst->data()[i], 0) << "nothing was written, at byte " << i;
  EXPECT_EQ(c.pair.b.qp->resp.epsn, c.p.psn_a) << "b still expects the request";

  // The intact request is accepted.
  b.inject_datagram(c.good.data(), static_cast<uint32_t>(c.good.size()), kIpA, c.from.port);
  EXPECT_EQ(std::memcmp(c.dst->data(), c.src->data(), 1024), 0);
  destroy(c.pair.a);
  destroy(c.pair.b);
}

}  // namespace
}  // namespace softrdma::transport::test
