// A connected QP takes packets from its peer's IPv4 address only: a peer's request, its ICRC made
// right for another source address, is dropped and counted (drop_src_addr) before the PSN check, in
// the window and with the right rkey; the same bytes from the peer's address still execute.
#include <gtest/gtest.h>

#include <cstring>

#include "fabric.h"
#include "live_capture.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace softrdma::transport::test {
namespace {

const wire::IpAddress kIpA = wire::IpAddress::v4(0x0100000A), kIpB = wire::IpAddress::v4(0x0200000A), kIpAttacker = wire::IpAddress::v4(0x0300000A);

TEST(SourceAddress, RequestFromAnotherAddressIsDroppedAndCounted) {
  // Capture a's WRITE ONLY on its way (b never gets it).
  CapturedWrite c;
  ASSERT_NO_FATAL_FAILURE(capture_write_only(c, kIpA, kIpB, 13, 5));
  Engine& b = *c.hb->engine;
  const uint16_t b_port = b.udp_port();

  // The attacker's copy: the same request, its ICRC right for the attacker's own address.
  std::vector<uint8_t> forged = c.good;
  wire::append_icrc({kIpAttacker, kIpB, c.from.port, b_port}, forged.data(), forged.size() - wire::kIcrcLen);
  const core::Counters before = b.counters();
  for (int i = 0; i < 100; ++i) b.inject_datagram(forged.data(), static_cast<uint32_t>(forged.size()), kIpAttacker, c.from.port);
  const core::Counters after = b.counters();
  EXPECT_EQ(after.drop_src_addr - before.drop_src_addr, 100u);
  EXPECT_EQ(after.drop_icrc - before.drop_icrc, 0u) << "the ICRC was right: the source check dropped them";
  EXPECT_EQ(after.duplicates + after.out_of_sequence - before.duplicates - before.out_of_sequence, 0u);
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(c.dst->data()[i], 0) << "nothing was written, at byte " << i;
  EXPECT_EQ(c.pair.b.qp->resp.epsn, c.p.psn_a) << "b still expects the request";

  // From the peer's address (which is all a forger needs) the request is accepted.
  b.inject_datagram(c.good.data(), static_cast<uint32_t>(c.good.size()), kIpA, c.from.port);
  EXPECT_EQ(std::memcmp(c.dst->data(), c.src->data(), 1024), 0);
  EXPECT_EQ(b.counters().drop_src_addr, after.drop_src_addr);
  destroy(c.pair.a);
  destroy(c.pair.b);
}

}  // namespace
}  // namespace softrdma::transport::test
