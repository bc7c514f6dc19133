// A live capture for tests that replay or alter a real softrdma request: two hosts, a connected RC
// pair, and host a's 1024-byte WRITE ONLY to b taken off the network on its way.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "fabric.h"
#include "wire/opcode.h"

namespace softrdma::transport::test {

// What capture_write_only sets up: b never got `good`, the request as a sent it from `from`.
struct CapturedWrite {
  Fabric f;
  Host* ha = nullptr;
  Host* hb = nullptr;
  RcParams p;
  RcPair pair;
  std::unique_ptr<Region> src, dst;
  std::vector<uint8_t> good;
  net::MemoryNetwork::Endpoint from{};
};

// Connects hosts ip_a and ip_b, fills a's 1024-byte source with byte i = i * mul + add, posts a WRITE
// of it to b's region and captures that WRITE ONLY (dropped, so b never gets it); the policy is then
// cleared. Use under ASSERT_NO_FATAL_FAILURE.
inline void capture_write_only(CapturedWrite& c, const wire::IpAddress& ip_a, const wire::IpAddress& ip_b, int mul,
                               int add) {
  c.ha = &c.f.add_host(ip_a);
  c.hb = &c.f.add_host(ip_b);
  c.pair = connect_rc(c.f, *c.ha, *c.hb, c.p);
  ASSERT_TRUE(c.pair.a.qp && c.pair.b.qp);
  c.src = register_region(*c.ha->engine, 1, 1024, core::kLocalWrite);
  c.dst = register_region(*c.hb->engine, 1, 1024, c.p.access);
  for (int i = 0; i < 1024; ++i) c.src->data()[i] = static_cast<uint8_t>(i * mul + add);
  c.f.net.set_policy([&c, ip_a](const net::MemoryNetwork::Offer& o) {
    net::MemoryNetwork::Fate fate;
    if (c.good.empty() && o.from.ip == ip_a && view(o.data, o.len).opcode == wire::kRcWriteOnly) {
      c.good.assign(o.data, o.data + o.len);
      c.from = o.from;
      fate.drop = true;
    }
    return fate;
  });
  ASSERT_EQ(post(c.pair.a, write_wqe(1, *c.src, 0, 1024, c.dst->addr(), c.dst->mr.rkey)), 0);
  c.f.run_until([&c] { return !c.good.empty(); }, 1'000'000'000);
  ASSERT_FALSE(c.good.empty());
  c.f.net.set_policy(nullptr);
}

}  // namespace softrdma::transport::test
