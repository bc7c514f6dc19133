// Wire protection on RC connections (wire/protect.h, transport/protect.cpp), two engines over the
// in-memory network in virtual time: protected traffic under loss, reordering and duplication
// delivers every byte; tampered, forged and replayed packets (with valid ICRCs, as an attacker on the
// path would send, or with the zeros a protected packet has in the ICRC's place: the tag is the check)
// are all dropped and counted, and the connection keeps working after them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "fabric.h"
#include "net/impairment.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/protect.h"

namespace softrdma::transport::test {
namespace {

const wire::IpAddress kIpA = wire::IpAddress::v4(0x0100000A), kIpB = wire::IpAddress::v4(0x0200000A);
constexpr uint32_t kAll = core::kLocalWrite | core::kRemoteWrite | core::kRemoteRead | core::kRemoteAtomic;
constexpr uint8_t kSecret[32] = {0x5e, 0xc2, 0x37, 0x01, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0xaa, 0xbb,
                                 0xcc, 0xdd, 0xee, 0xff, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23};
constexpr char kMarker[] = "PLAINTEXT-MARKER";  // fills the data: seen on the wire only in Auth mode

struct Captured {
  net::MemoryNetwork::Endpoint from, to;
  std::vector<uint8_t> bytes;
};

class Protected : public ::testing::TestWithParam<wire::Protection> {
 protected:
  void SetUp() override {
    ha_ = &f_.add_host(kIpA);
    hb_ = &f_.add_host(kIpB);
    p_.mtu = 1024;
    p_.timeout = 8;
    p_.before_rtr = [protection = GetParam()](End& e) {
      ASSERT_EQ(0, e.engine().protection().set_wire_key(e.qp, protection, kSecret, 16));
    };
  }
  void TearDown() override {
    destroy(pair_.a);
    destroy(pair_.b);
  }
  core::Counters counters(Host& h) { return h.engine->counters(); }
  // Runs until n send CQEs on a (and recvs receive CQEs on b) arrived; returns them.
  std::vector<core::Cqe> complete(size_t n, size_t recvs = 0, std::vector<core::Cqe>* rcqes = nullptr) {
    std::vector<core::Cqe> got, rgot;
    EXPECT_TRUE(f_.run_until([&] {
      for (auto& c : poll_all(pair_.a, *pair_.a.scq)) got.push_back(c);
      for (auto& c : poll_all(pair_.b, *pair_.b.rcq)) rgot.push_back(c);
      return got.size() >= n && rgot.size() >= recvs;
    }));
    if (rcqes) *rcqes = rgot;
    return got;
  }

  Fabric f_;
  Host* ha_ = nullptr;
  Host* hb_ = nullptr;
  RcParams p_;
  RcPair pair_;
};

TEST_P(Protected, EveryByteUnderLossReorderAndDuplication) {
  net::ImpairmentRng rng(net::ImpairmentRng::mix(17, 0xAEAD));
  uint64_t dup_to_b = 0, dup_to_a = 0, marker_seen = 0;
  f_.net.set_policy([&](const net::MemoryNetwork::Offer& o) {
    net::MemoryNetwork::Fate fate;
    fate.drop = rng.uniform() < 0.04;
    fate.duplicate = !fate.drop && rng.uniform() < 0.05;
    fate.hold = rng.uniform() < 0.05;
    if (fate.duplicate) ++(o.to.ip == kIpB ? dup_to_b : dup_to_a);
    if (std::search(o.data, o.data + o.len, kMarker, kMarker + 16) != o.data + o.len) ++marker_seen;
    return fate;
  });
  pair_ = connect_rc(f_, *ha_, *hb_, p_);
  ASSERT_TRUE(pair_.a.qp && pair_.b.qp);
  constexpr uint32_t kLen = 256 << 10;
  auto src = register_region(pair_.a.engine(), pair_.a.pd, kLen, kAll);
  auto back = register_region(pair_.a.engine(), pair_.a.pd, kLen, kAll);
  auto dst = register_region(pair_.b.engine(), pair_.b.pd, kLen, kAll);
  auto rbuf = register_region(pair_.b.engine(), pair_.b.pd, 8192, kAll);
  for (uint32_t i = 0; i < kLen; ++i)
    src->data()[i] = i % 64 < 16 ? static_cast<uint8_t>(kMarker[i % 16]) : static_cast<uint8_t>(i * 131 + (i >> 9));
  // A WRITE of all of it, a SEND into a posted receive, then a READ of what was written back.
  ASSERT_EQ(0, post(pair_.b, recv_wqe(50, *rbuf, 0, 8192)));
  ASSERT_EQ(0, post(pair_.a, write_wqe(1, *src, 0, kLen, dst->addr(), dst->mr.rkey)));
  ASSERT_EQ(0, post(pair_.a, send_wqe(2, *src, 1000, 5000)));
  ASSERT_EQ(0, post(pair_.a, read_wqe(3, *back, 0, kLen, dst->addr(), dst->mr.rkey)));
  std::vector<core::Cqe> rc;
  std::vector<core::Cqe> sc = complete(3, 1, &rc);
  ASSERT_EQ(sc.size(), 3u);
  for (const auto& c : sc) EXPECT_EQ(c.status, WcStatus::Success) << c.wr_id;
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::Success);
  EXPECT_EQ(rc[0].byte_len, 5000u);
  EXPECT_EQ(0, std::memcmp(dst->data(), src->data(), kLen));
  EXPECT_EQ(0, std::memcmp(back->data(), src->data(), kLen));
  EXPECT_EQ(0, std::memcmp(rbuf->data(), src->data() + 1000, 5000));
  f_.settle();
  const core::Counters a = counters(*ha_), b = counters(*hb_);
  EXPECT_EQ(a.auth_fail + b.auth_fail, 0u);
  EXPECT_GT(a.auth_ok, 0u);
  EXPECT_GT(b.auth_ok, 0u);
  EXPECT_GT(a.retransmits + b.retransmits, 0u) << "the faults made the requester resend";
  // A network duplicate is a replay of a genuine packet: each one is refused by the counter window.
  EXPECT_EQ(b.auth_replay, dup_to_b);
  EXPECT_EQ(a.auth_replay, dup_to_a);
  EXPECT_GT(dup_to_a + dup_to_b, 0u);
  if (GetParam() == wire::Protection::Encrypt) {
    EXPECT_EQ(marker_seen, 0u) << "the payload never crosses the wire in clear";
  } else {
    EXPECT_GT(marker_seen, 0u);
  }
}

// The ICRC of a datagram as sent from `from` to `to` by a softrdma context (identification 0, DF).
void fix_icrc(const Captured& c, std::vector<uint8_t>& d) {
  wire::UdpAddr addr{c.from.ip, c.to.ip, c.from.port, c.to.port};
  wire::append_icrc(addr, d.data(), d.size() - wire::kIcrcLen);
}

TEST_P(Protected, TamperedForgedAndReplayedPacketsAreRefused) {
  std::vector<Captured> cap;
  f_.net.set_policy([&](const net::MemoryNetwork::Offer& o) {
    if (o.to.ip == kIpB) cap.push_back({o.from, o.to, std::vector<uint8_t>(o.data, o.data + o.len)});
    return net::MemoryNetwork::Fate{};
  });
  pair_ = connect_rc(f_, *ha_, *hb_, p_);
  ASSERT_TRUE(pair_.a.qp && pair_.b.qp);
  auto src = register_region(pair_.a.engine(), pair_.a.pd, 16384, kAll);
  auto dst = register_region(pair_.b.engine(), pair_.b.pd, 16384, kAll);
  auto rbuf = register_region(pair_.b.engine(), pair_.b.pd, 4096, kAll);
  for (int i = 0; i < 16384; ++i) src->data()[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_EQ(0, post(pair_.b, recv_wqe(60, *rbuf, 0, 4096)));
  ASSERT_EQ(0, post(pair_.a, write_wqe(1, *src, 0, 8192, dst->addr(), dst->mr.rkey)));
  ASSERT_EQ(0, post(pair_.a, send_wqe(2, *src, 0, 100)));
  ASSERT_EQ(complete(2, 1).size(), 2u);
  f_.settle();
  ASSERT_GE(cap.size(), 9u);  // 8 WRITE packets and the SEND
  f_.net.set_policy({});
  // Format 2 (wire/protect.h): TVer 1, and zeros where the ICRC was.
  for (const Captured& c : cap) {
    EXPECT_EQ(c.bytes[1] & 0xF, wire::kProtectTver);
    EXPECT_EQ(0, std::memcmp(c.bytes.data() + c.bytes.size() - 4, "\0\0\0\0", 4));
  }
  std::vector<uint8_t> dst_before(dst->data(), dst->data() + 16384);
  std::vector<uint8_t> rbuf_before(rbuf->data(), rbuf->data() + 4096);
  const core::Counters b0 = counters(*hb_);
  Engine& eb = pair_.b.engine();
  auto inject = [&](const Captured& c, const std::vector<uint8_t>& d) {
    eb.inject_datagram(d.data(), static_cast<uint32_t>(d.size()), c.from.ip, c.from.port, c.to.port);
    f_.round();
  };
  // Replays: every captured packet again, unchanged (their PSNs are duplicates the responder would
  // answer; a SEND replayed would otherwise find the next receive WQE).
  ASSERT_EQ(0, post(pair_.b, recv_wqe(61, *rbuf, 0, 4096)));
  for (const Captured& c : cap) inject(c, c.bytes);
  uint64_t tampered = 0, moved = 0;
  // Tampering: one byte of each packet changed (headers with TVer, payload, counter, tag), with the ICRC
  // made valid for one half and left as the zeros of the protected form for the other.
  for (size_t k = 0; k < cap.size(); ++k) {
    const Captured& c = cap[k];
    for (size_t pos : {size_t{0}, size_t{1}, size_t{7}, size_t{11}, size_t{12}, c.bytes.size() / 2,
                       c.bytes.size() - 28, c.bytes.size() - 20, c.bytes.size() - 5}) {
      if (pos == 4) continue;
      std::vector<uint8_t> d = c.bytes;
      d[pos] ^= static_cast<uint8_t>(pos == 1 ? 1 : 1 + k);  // byte 1: TVer 1 -> 0
      if (k % 2) fix_icrc(c, d);
      inject(c, d);
      ++(pos == 7 ? moved : tampered);  // byte 7: the destination QPN, now one this host does not have
    }
  }
  // Forgeries at the right QPN and the PSN the responder expects next: a WRITE ONLY and a SEND ONLY,
  // with a made-up trailer, and the same without any trailer (a plain RoCEv2 packet).
  uint64_t forged = 0;
  const uint32_t epsn = p_.psn_a + 9;
  for (bool with_trailer : {true, false}) {
    for (uint8_t op : {wire::kRcWriteOnly, wire::kRcSendOnly}) {
      wire::Packet pk{};
      pk.bth.opcode = op;
      pk.bth.pkey = wire::kDefaultPkey;
      pk.bth.dest_qp = pair_.b.qp->qpn;
      pk.bth.psn = epsn;
      pk.reth = {dst->addr(), dst->mr.rkey, 64};
      const uint32_t hdr = wire::opcode_info(op).header_len;
      std::vector<uint8_t> d(hdr + 64 + (with_trailer ? wire::kProtectTrailerLen : 0) + wire::kIcrcLen, 0xEE);
      wire::write_headers(pk, d.data());
      if (with_trailer) {
        wire::ProtectTrailer t{};
        t.counter = 1000 + forged;
        wire::write_trailer(t, d.data() + hdr + 64);
      }
      fix_icrc(cap[0], d);
      inject(cap[0], d);
      ++forged;
    }
  }
  f_.settle();
  const core::Counters b1 = counters(*hb_);
  EXPECT_EQ(b1.auth_replay - b0.auth_replay, cap.size());
  EXPECT_EQ(b1.auth_fail - b0.auth_fail, tampered + forged);
  EXPECT_EQ(b1.drop_malformed - b0.drop_malformed, moved) << "TVer 1 for no QP that could check it";
  EXPECT_EQ(b1.auth_ok, b0.auth_ok) << "nothing injected was accepted";
  EXPECT_EQ(0, std::memcmp(dst->data(), dst_before.data(), 16384));
  EXPECT_EQ(0, std::memcmp(rbuf->data(), rbuf_before.data(), 4096));
  EXPECT_TRUE(poll_all(pair_.b, *pair_.b.rcq).empty()) << "no receive completed from injected packets";
  // The connection still works: a WRITE and a SEND go through, byte for byte.
  ASSERT_EQ(0, post(pair_.a, write_wqe(3, *src, 8192, 8192, dst->addr(8192), dst->mr.rkey)));
  ASSERT_EQ(0, post(pair_.a, send_wqe(4, *src, 200, 300)));
  std::vector<core::Cqe> rc;
  std::vector<core::Cqe> sc = complete(2, 1, &rc);
  ASSERT_EQ(sc.size(), 2u);
  for (const auto& c : sc) EXPECT_EQ(c.status, WcStatus::Success);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].wr_id, 61u);
  EXPECT_EQ(rc[0].byte_len, 300u);
  EXPECT_EQ(0, std::memcmp(dst->data() + 8192, src->data() + 8192, 8192));
  EXPECT_EQ(0, std::memcmp(rbuf->data(), src->data() + 200, 300));
}

INSTANTIATE_TEST_SUITE_P(Modes, Protected, ::testing::Values(wire::Protection::Auth, wire::Protection::Encrypt),
                         [](const auto& info) { return std::string(wire::protection_name(info.param)); });

// One end protected, the other not: nothing gets through either way, every packet is counted (at a
// protected responder as auth_fail; at a plain one as malformed, TVer 1 not being RoCEv2's), and the
// requester runs out of retries instead of delivering garbage.
class ProtectedMismatch : public ::testing::TestWithParam<bool> {};

TEST_P(ProtectedMismatch, OneSideProtectedDeliversNothing) {
  const bool responder_protected = GetParam();
  Fabric f;
  Host& ha = f.add_host(kIpA);
  Host& hb = f.add_host(kIpB);
  RcParams p;
  p.timeout = 8;
  p.retry_cnt = 2;
  p.before_rtr = [&](End& e) {
    if ((e.host == &hb) == responder_protected) {
      ASSERT_EQ(0, e.engine().protection().set_wire_key(e.qp, wire::Protection::Auth, kSecret, 32));
    }
  };
  RcPair r = connect_rc(f, ha, hb, p);
  auto src = register_region(r.a.engine(), r.a.pd, 4096, kAll);
  auto dst = register_region(r.b.engine(), r.b.pd, 4096, kAll);
  std::memset(src->data(), 0x5A, 4096);
  ASSERT_EQ(0, post(r.a, write_wqe(1, *src, 0, 4096, dst->addr(), dst->mr.rkey)));
  std::vector<core::Cqe> got;
  ASSERT_TRUE(f.run_until([&] {
    for (auto& c : poll_all(r.a, *r.a.scq)) got.push_back(c);
    return !got.empty();
  }));
  EXPECT_EQ(got[0].status, WcStatus::RetryExcErr);
  if (responder_protected) {
    EXPECT_GT(hb.engine->counters().auth_fail, 0u);
  } else {
    EXPECT_GT(hb.engine->counters().drop_malformed, 0u);
    EXPECT_EQ(hb.engine->counters().drop_icrc, 0u) << "refused by its TVer before any ICRC";
  }
  EXPECT_EQ(hb.engine->counters().auth_ok, 0u);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(dst->data()[i], 0) << i;
  destroy(r.a);
  destroy(r.b);
}

INSTANTIATE_TEST_SUITE_P(Side, ProtectedMismatch, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Responder" : "Requester"; });

// A protected packet arriving at UDP 4791 of an address where another context holds that port (another
// process, between hosts: the first packets of a connection go there) carries no ICRC for the holder
// to check: the holder hands it to the QP's owner, whose tag check takes it. Here the holder is an
// engine on b's address created first; a's first WRITE packets are captured on their way to b's own
// port and shot at the holder's 4791 instead.
TEST(ProtectedForwarded, TheHolderOf4791HandsThemToTheOwner) {
  for (wire::Protection mode : {wire::Protection::Auth, wire::Protection::Encrypt}) {
    SCOPED_TRACE(wire::protection_name(mode));
    Fabric f;
    Host& holder = f.add_host(kIpB);  // takes 4791 for the address
    Host& ha = f.add_host(kIpA);
    Host& hb = f.add_host(kIpB);
    RcParams p;
    p.before_rtr = [mode](End& e) { ASSERT_EQ(0, e.engine().protection().set_wire_key(e.qp, mode, kSecret, 16)); };
    RcPair r = connect_rc(f, ha, hb, p);
    ASSERT_TRUE(r.a.qp && r.b.qp);
    auto src = register_region(r.a.engine(), r.a.pd, 8192, kAll);
    auto dst = register_region(r.b.engine(), r.b.pd, 8192, kAll);
    for (int i = 0; i < 8192; ++i) src->data()[i] = static_cast<uint8_t>(i * 13 + 5);
    std::vector<Captured> cap;
    f.net.set_policy([&](const net::MemoryNetwork::Offer& o) {
      net::MemoryNetwork::Fate fate;
      if (o.to.ip == kIpB && cap.size() < 8) {
        cap.push_back({o.from, o.to, std::vector<uint8_t>(o.data, o.data + o.len)});
        fate.drop = true;
      }
      return fate;
    });
    ASSERT_EQ(0, post(r.a, write_wqe(1, *src, 0, 8192, dst->addr(), dst->mr.rkey)));
    ASSERT_TRUE(f.run_until([&] { return cap.size() == 8; }, 1'000'000));
    f.net.set_policy({});
    const core::Counters h0 = holder.engine->counters();
    for (const Captured& c : cap) {
      EXPECT_EQ(c.bytes[1] & 0xF, wire::kProtectTver);
      holder.engine->inject_datagram(c.bytes.data(), static_cast<uint32_t>(c.bytes.size()), c.from.ip,
                                     c.from.port, wire::kRoceUdpPort);
    }
    std::vector<core::Cqe> got;
    ASSERT_TRUE(f.run_until([&] {
      for (auto& c : poll_all(r.a, *r.a.scq)) got.push_back(c);
      return !got.empty();
    }));
    EXPECT_EQ(got[0].status, WcStatus::Success);
    const core::Counters h1 = holder.engine->counters();
    EXPECT_EQ(h1.forwarded - h0.forwarded, 8u);
    EXPECT_EQ(h1.drop_icrc, h0.drop_icrc);
    EXPECT_EQ(h1.drop_malformed, h0.drop_malformed);
    EXPECT_EQ(h1.drop_unknown_qp, h0.drop_unknown_qp);
    EXPECT_GE(hb.engine->counters().auth_ok, 8u);
    EXPECT_EQ(hb.engine->counters().auth_fail, 0u);
    EXPECT_EQ(ha.engine->counters().retransmits, 0u) << "delivered through the holder, not by a retry";
    EXPECT_EQ(0, std::memcmp(dst->data(), src->data(), 8192));
    // The same packets again through the holder: forwarded, and refused by the owner as replays.
    const uint64_t replays0 = hb.engine->counters().auth_replay;
    for (const Captured& c : cap)
      holder.engine->inject_datagram(c.bytes.data(), static_cast<uint32_t>(c.bytes.size()), c.from.ip,
                                     c.from.port, wire::kRoceUdpPort);
    f.settle();
    EXPECT_EQ(hb.engine->counters().auth_replay - replays0, 8u);
    destroy(r.a);
    destroy(r.b);
  }
}

TEST(ProtectedKey, RefusedWhereItCannotApply) {
  Fabric f;
  Host& ha = f.add_host(kIpA);
  Host& hb = f.add_host(kIpB);
  RcParams p;
  RcPair r = connect_rc(f, ha, hb, p);
  Engine& e = r.a.engine();
  EXPECT_EQ(EINVAL, e.protection().set_wire_key(r.a.qp, wire::Protection::Auth, kSecret, 16)) << "in RTS";
  QpModify m;
  m.mask = kModState;
  m.state = QpState::Reset;
  ASSERT_EQ(0, e.modify_qp(r.a.qp, m));
  EXPECT_EQ(EINVAL, e.protection().set_wire_key(r.a.qp, wire::Protection::Auth, kSecret, 20)) << "length";
  EXPECT_EQ(EINVAL, e.protection().set_wire_key(r.a.qp, wire::Protection::Auth, nullptr, 16));
  EXPECT_EQ(EINVAL, e.protection().set_wire_key(r.a.qp, static_cast<wire::Protection>(7), kSecret, 16));
  EXPECT_EQ(0, e.protection().set_wire_key(r.a.qp, wire::Protection::Encrypt, kSecret, 32));
  EXPECT_EQ(0, e.protection().set_wire_key(r.a.qp, wire::Protection::Off, nullptr, 0));
  destroy(r.a);
  destroy(r.b);
}

}  // namespace
}  // namespace softrdma::transport::test
