// A connected QP takes packets from its peer's IPv4 address only: a peer's request, its ICRC made
// right for another source address, is dropped and counted (drop_src_addr) before the PSN check, in
// the window and with the right rkey; the same bytes from the peer's address still execute.
#include <gtest/gtest.h>

#include <cstring>

#include "fabric.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace softrdma::transport::test {
namespace {

constexpr uint32_t kIpA = 0x0100000A, kIpB = 0x0200000A, kIpAttacker = 0x0300000A;

TEST(SourceAddress, RequestFromAnotherAddressIsDroppedAndCounted) {
  Fabric f;
  Host& ha = f.add_host(kIpA);
  Host& hb = f.add_host(kIpB);
  RcParams p;
  RcPair pair = connect_rc(f, ha, hb, p);
  ASSERT_TRUE(pair.a.qp && pair.b.qp);
  auto src = register_region(*ha.engine, 1, 1024, core::kLocalWrite);
  auto dst = register_region(*hb.engine, 1, 1024, p.access);
  for (int i = 0; i < 1024; ++i) src->data()[i] = static_cast<uint8_t>(i * 13 + 5);
  // Capture a's WRITE ONLY on its way (b never gets it).
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
  const uint16_t b_port = b.udp_port();

  // The attacker's copy: the same request, its ICRC right for the attacker's own address.
  std::vector<uint8_t> forged = good;
  wire::append_icrc({kIpAttacker, kIpB, from.port, b_port}, forged.data(), forged.size() - wire::kIcrcLen);
  const core::Counters before = b.counters();
  for (int i = 0; i < 100; ++i) b.inject_datagram(forged.data(), static_cast<uint32_t>(forged.size()), kIpAttacker, from.port);
  const core::Counters after = b.counters();
  EXPECT_EQ(after.drop_src_addr - before.drop_src_addr, 100u);
  EXPECT_EQ(after.drop_icrc - before.drop_icrc, 0u) << "the ICRC was right: the source check dropped them";
  EXPECT_EQ(after.duplicates + after.out_of_sequence - before.duplicates - before.out_of_sequence, 0u);
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(dst->data()[i], 0) << "nothing was written, at byte " << i;
  EXPECT_EQ(pair.b.qp->resp.epsn, p.psn_a) << "b still expects the request";

  // From the peer's address (which is all a forger needs) the request is accepted.
  b.inject_datagram(good.data(), static_cast<uint32_t>(good.size()), kIpA, from.port);
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), 1024), 0);
  EXPECT_EQ(b.counters().drop_src_addr, after.drop_src_addr);
  destroy(pair.a);
  destroy(pair.b);
}

}  // namespace
}  // namespace softrdma::transport::test
