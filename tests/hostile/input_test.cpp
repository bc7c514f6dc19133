// Hostile input: crafted datagrams from a plain UDP socket at a live RC QP. Whatever arrives, the
// engine must not crash or hang, must not touch registered memory unless the packet is a valid
// in-window request with a correct rkey, and must count each drop by its reason. Packets that a
// correct peer could have sent in window (bad rkey, bad opcode sequence) legitimately NAK and move
// the responder QP to ERR; those run on a fresh pair each.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "hostile.h"

namespace softrdma::hostile_test {
namespace {

// What parse_packet must say about a datagram, by the rules written in wire/headers.h (length, TVer,
// opcode, header length, payload-less length, pad).
bool parses(const std::vector<uint8_t>& d) {
  if (d.size() < wire::kBthLen + wire::kIcrcLen) return false;
  if ((d[1] & 0x0F) != 0) return false;
  const wire::OpcodeInfo& info = wire::opcode_info(d[0]);
  if (!info.valid) return false;
  if (d.size() < info.header_len + wire::kIcrcLen) return false;
  const unsigned pad = (d[1] >> 4) & 3;
  const size_t payload = d.size() - info.header_len - wire::kIcrcLen;
  if (!info.has_payload) return payload == 0 && pad == 0;
  return pad <= payload;
}

uint32_t be24(const uint8_t* p) { return uint32_t{p[0]} << 16 | uint32_t{p[1]} << 8 | p[2]; }

bool is_response(const wire::OpcodeInfo& info) {
  return info.kind == wire::OpKind::Ack || info.kind == wire::OpKind::AtomicAck ||
         info.kind == wire::OpKind::ReadResponse;
}

// Where the engine must count a datagram sent to b's port while b is in RTS, by the order of its checks:
// parse, ICRC, P_Key, QPN, opcode class, then the completer (responses) or the responder (requests).
// "" for a datagram whose fate the tests do not predict (an in-window request, or a response to a PSN
// b has sent).
std::string outcome(const Pair& p, const std::vector<uint8_t>& d, bool icrc_ok) {
  if (!parses(d)) return "drop_malformed";
  // A context's own port hears only softrdma peers (identification 0): the ICRC is checked in full.
  if (!icrc_ok) return "drop_icrc";
  const uint16_t pkey = static_cast<uint16_t>(d[2] << 8 | d[3]);
  if ((pkey & 0x7FFF) != 0x7FFF) return "drop_pkey";
  if (be24(&d[5]) != p.b.qp->qp_num) return "drop_unknown_qp";
  const wire::OpcodeInfo& info = wire::opcode_info(d[0]);
  if (info.qp_class != wire::QpClass::RC) return "drop_bad_opcode";
  const uint32_t psn = be24(&d[9]);
  if (is_response(info)) return wire::psn_diff(psn, p.b_next) >= 0 ? "drop_stale_response" : "";
  int32_t diff = wire::psn_diff(psn, p.a_next);
  return diff > 0 ? "out_of_sequence" : diff < 0 ? "duplicates" : "";
}

// Expected counter deltas of one hostile phase.
struct Tally {
  std::map<std::string, uint64_t> want;
  void add(const std::string& what) {
    ASSERT_FALSE(what.empty()) << "test bug: a datagram with an unpredicted fate";
    ++want[what];
  }
  // Between in-order packets the responder sends one PSN-sequence NAK, however many come out of order.
  std::map<std::string, uint64_t> done() const {
    auto w = want;
    if (w.count("out_of_sequence")) w["naks_sent_seq"] = 1;
    return w;
  }
};

// A PSN ahead of (diff in [1, 2^23-1]) or behind (diff in [-(2^23-1), -1]) `base`.
uint32_t psn_ahead(uint32_t base, uint32_t k) { return wire::psn_add(base, k); }
uint32_t psn_behind(uint32_t base, uint32_t k) { return wire::psn_add(base, wire::kPsnMask + 1 - k); }
uint32_t random_offset(std::mt19937_64& rng) { return 1 + static_cast<uint32_t>(rng() % 0x7FFFFE); }

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n, uint8_t fill_or_random = 0) {
  std::vector<uint8_t> v(n, fill_or_random);
  if (!fill_or_random)
    for (auto& x : v) x = static_cast<uint8_t>(rng());
  return v;
}

// An rkey that is none of the pair's.
uint32_t guess_rkey(Pair& p) {
  for (;;) {
    uint32_t k = static_cast<uint32_t>(p.rng());
    bool real = false;
    for (auto* b : {&p.guard_lo, &p.target, &p.guard_hi, &p.scratch_b, &p.src_b2, &p.dst_b2, &p.guard_a, &p.src_a,
                    &p.dst_a, &p.scratch_a})
      real |= (*b)->rkey() == k || (*b)->lkey() == k;
    if (!real) return k;
  }
}

// The common tail of a survivable phase: counts as predicted, memory intact, nothing completed or
// raised, and the pair still carries traffic both ways.
void finish(Pair& p, const Stats& before, const Tally& t) {
  Stats after = p.settle();
  expect_deltas(before, after, p.phase_sent(), t.done());
  p.expect_memory_intact();
  p.expect_no_async_events();
  p.sanity();
}

// A request at psn with the given RETH (or AtomicETH for atomics) and payload.
wire::Packet request(const Pair& p, uint8_t op, uint32_t psn, uint64_t va, uint32_t rkey, uint32_t dma_len) {
  wire::Packet pk = p.req(op, psn);
  pk.reth = {va, rkey, dma_len};
  pk.atomic = {va, rkey, 1, 0};
  return pk;
}

// Valid-looking request kinds: opcode, payload length, DMA length.
struct ReqShape {
  uint8_t op;
  uint32_t payload;
  uint32_t dma_len;
};
const std::vector<ReqShape>& request_shapes() {
  static const std::vector<ReqShape> v = {
      {wire::kRcWriteOnly, 64, 64},          {wire::kRcWriteFirst, kMtu, 4 * kMtu},
      {wire::kRcWriteOnlyImm, 16, 16},       {wire::kRcReadRequest, 0, 8192},
      {wire::kRcCompareSwap, 0, 8},          {wire::kRcFetchAdd, 0, 8},
      {wire::kRcAtomicWrite, 8, 8},
  };
  return v;
}

// ---------------------------------------------------------------------------------------------
// Survivable classes: each runs on one pair and ends with the pair still working.

TEST(Hostile, RandomBytes) {
  Pair p;
  ASSERT_TRUE(p.up(101));
  p.sanity();
  Tally t;
  Stats before = p.begin();
  for (int i = 0; i < 3000; ++i) {
    size_t len = i < 64 ? static_cast<size_t>(i) : p.rng() % 1500;
    auto d = random_bytes(p.rng, len);
    t.add(outcome(p, d, false));
    p.send_raw(d);
  }
  finish(p, before, t);
}

// Random bytes with a correct ICRC: they get past the ICRC check, and then P_Key / QPN / parse stop them.
TEST(Hostile, RandomBytesWithValidIcrc) {
  Pair p;
  ASSERT_TRUE(p.up(102));
  p.sanity();
  Tally t;
  Stats before = p.begin();
  for (int i = 0; i < 2000; ++i) {
    auto d = random_bytes(p.rng, 12 + p.rng() % 1100);
    if (i % 2) {
      d[1] &= 0xF0;  // TVer 0, so more of them parse
      d[2] = d[3] = 0xFF;
    }
    add_icrc(d, p.sock.port(), p.ep.port);
    t.add(outcome(p, d, true));
    p.send_raw(d);
  }
  finish(p, before, t);
}

// Random request headers that pass every check up to the QP: addressed to b, P_Key right, ICRC right,
// random RETH/AtomicETH/payload, a PSN outside the window. None may execute.
TEST(Hostile, RandomRequestsOutOfWindow) {
  Pair p;
  ASSERT_TRUE(p.up(103));
  p.sanity();
  std::vector<uint8_t> ops;
  for (int op = 0; op < 0x20; ++op) {
    const auto& info = wire::opcode_info(static_cast<uint8_t>(op));
    if (info.valid && !is_response(info)) ops.push_back(static_cast<uint8_t>(op));
  }
  Tally t;
  Stats before = p.begin();
  for (int i = 0; i < 3000; ++i) {
    uint8_t op = ops[p.rng() % ops.size()];
    const auto& info = wire::opcode_info(op);
    uint32_t k = random_offset(p.rng);
    uint32_t psn = i % 2 ? psn_ahead(p.a_next, k) : psn_behind(p.a_next, k);
    wire::Packet pk = p.req(op, psn);
    pk.bth.solicited = p.rng() & 1;
    pk.reth = {p.rng(), static_cast<uint32_t>(p.rng()), static_cast<uint32_t>(p.rng())};
    if (i % 3 == 0) pk.reth = {p.target->addr(p.rng() % kTargetLen), p.target->rkey(), static_cast<uint32_t>(p.rng() % 4096)};
    pk.atomic = {pk.reth.va, pk.reth.rkey, p.rng(), p.rng()};
    pk.imm_data_be = static_cast<uint32_t>(p.rng());
    pk.ieth_rkey = static_cast<uint32_t>(p.rng());
    uint32_t len = info.has_payload ? static_cast<uint32_t>(p.rng() % (kMtu + 1)) : 0;
    auto payload = random_bytes(p.rng, len);
    auto d = p.datagram(pk, payload.data(), len);
    t.add(outcome(p, d, true));
    p.send_raw(d);
  }
  finish(p, before, t);
}

// Every length 0..60 of well-formed packets of every valid opcode: cut short as they are (the ICRC goes
// with the cut) and cut short with a fresh ICRC over what is left.
TEST(Hostile, TruncatedHeaders) {
  Pair p;
  ASSERT_TRUE(p.up(104));
  p.sanity();
  Tally t;
  Stats before = p.begin();
  for (int op = 0; op < 256; ++op) {
    const auto& info = wire::opcode_info(static_cast<uint8_t>(op));
    if (!info.valid) continue;
    uint32_t psn = is_response(info) ? psn_ahead(p.b_next, 0x1000) : psn_ahead(p.a_next, 0x1000);
    wire::Packet pk = request(p, static_cast<uint8_t>(op), psn, p.target->addr(), p.target->rkey(), 32);
    uint8_t payload[32];
    std::memset(payload, 0xEE, sizeof payload);
    auto full = p.datagram(pk, payload, info.has_payload ? 32 : 0);
    for (size_t len = 0; len <= 60 && len < full.size(); ++len) {
      std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<long>(len));
      t.add(outcome(p, cut, false));
      p.send_raw(cut);
      if (len >= wire::kBthLen + wire::kIcrcLen) {
        std::vector<uint8_t> fixed(full.begin(), full.begin() + static_cast<long>(len - wire::kIcrcLen));
        add_icrc(fixed, p.sock.port(), p.ep.port);
        t.add(outcome(p, fixed, true));
        p.send_raw(fixed);
      }
    }
  }
  finish(p, before, t);
}

// Every opcode 0..255 with lengths around (and far beyond) its header length, and wrong pad counts;
// ICRC valid, addressed to b, PSN outside the window.
TEST(Hostile, EveryOpcodeWrongLengths) {
  Pair p;
  ASSERT_TRUE(p.up(105));
  p.sanity();
  Tally t;
  Stats before = p.begin();
  for (int op = 0; op < 256; ++op) {
    const auto& info = wire::opcode_info(static_cast<uint8_t>(op));
    const int hlen = info.valid ? info.header_len : static_cast<int>(wire::kBthLen);
    uint32_t psn = is_response(info) ? psn_ahead(p.b_next, 0x2000) : psn_ahead(p.a_next, 0x2000);
    wire::Packet pk = request(p, static_cast<uint8_t>(op), psn, p.target->addr(), p.target->rkey(), 8);
    std::vector<uint8_t> hdr(64);
    wire::write_headers(pk, hdr.data());
    for (int delta : {-12, -8, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 8, 31, static_cast<int>(kMtu) + 1,
                      static_cast<int>(kMtu) + 4}) {
      const int body = hlen + delta;
      if (body < 0) continue;
      for (uint8_t pad : {0, 1, 3}) {
        if (delta == 0 && pad == 0 && info.valid) continue;  // that is the right length
        std::vector<uint8_t> d(hdr.begin(), hdr.begin() + std::min(body, hlen));
        while (static_cast<int>(d.size()) < body) d.push_back(static_cast<uint8_t>(p.rng()));
        if (d.size() >= 2) d[1] = static_cast<uint8_t>((d[1] & 0xCF) | (pad << 4));
        add_icrc(d, p.sock.port(), p.ep.port);
        t.add(outcome(p, d, d.size() >= wire::kBthLen + wire::kIcrcLen));
        p.send_raw(d);
      }
    }
  }
  finish(p, before, t);
}

// WRITE/READ/ATOMIC with guessed (random) rkeys and random or in-MR addresses, outside the window.
TEST(Hostile, GuessedRkeysOutOfWindow) {
  Pair p;
  ASSERT_TRUE(p.up(106));
  p.sanity();
  Tally t;
  Stats before = p.begin();
  for (int i = 0; i < 2000; ++i) {
    const ReqShape& s = request_shapes()[p.rng() % request_shapes().size()];
    uint64_t va = i % 2 ? p.target->addr((p.rng() % (kTargetLen / 8)) * 8) : p.rng();
    uint32_t k = random_offset(p.rng);
    uint32_t psn = (i / 2) % 2 ? psn_ahead(p.a_next, k) : psn_behind(p.a_next, k);
    wire::Packet pk = request(p, s.op, psn, va, guess_rkey(p), s.dma_len);
    auto payload = random_bytes(p.rng, s.payload);
    auto d = p.datagram(pk, payload.data(), s.payload);
    t.add(outcome(p, d, true));
    p.send_raw(d);
  }
  finish(p, before, t);
}

// The right rkey and an address inside the target MR, but a PSN far ahead or behind (including the
// PSNs of the sanity traffic just executed: true duplicates that must not execute again). A
// compare-and-swap whose compare value matches memory would change it if it ran.
TEST(Hostile, RightRkeyWrongPsn) {
  Pair p;
  ASSERT_TRUE(p.up(107));
  p.sanity();
  const uint64_t current = p.target->u64(0);
  Tally t;
  Stats before = p.begin();
  std::vector<std::pair<bool, uint32_t>> offsets;  // (ahead?, k)
  for (uint32_t k : {1u, 2u, 3u, 31u, 32u, 33u, 1000u, 65536u, 0x7FFFFFu}) offsets.push_back({true, k});
  for (uint32_t k : {1u, 2u, 4u, 5u, 16u, 17u, 20u, 21u, 35u, 36u, 37u, 1000u, 0x7FFFFFu}) offsets.push_back({false, k});
  for (int i = 0; i < 40; ++i) offsets.push_back({i % 2 == 0, random_offset(p.rng)});
  for (auto [ahead, k] : offsets) {
    uint32_t psn = ahead ? psn_ahead(p.a_next, k) : psn_behind(p.a_next, k);
    uint8_t data[kMtu];
    std::memset(data, 0xEE, sizeof data);
    struct Shot {
      uint8_t op;
      uint64_t off;
      uint32_t payload, dma_len;
    };
    for (const Shot& s : {Shot{wire::kRcWriteOnly, 128, 64, 64}, Shot{wire::kRcWriteFirst, 0, kMtu, 3 * kMtu},
                          Shot{wire::kRcWriteMiddle, kMtu, kMtu, 0}, Shot{wire::kRcWriteLast, 2 * kMtu, kMtu, 0},
                          Shot{wire::kRcWriteOnlyImm, 512, 16, 16}, Shot{wire::kRcReadRequest, 0, 0, 4096},
                          Shot{wire::kRcSendOnly, 0, 32, 0}, Shot{wire::kRcFetchAdd, 8, 0, 8}}) {
      wire::Packet pk = request(p, s.op, psn, p.target->addr(s.off), p.target->rkey(), s.dma_len);
      auto d = p.datagram(pk, data, s.payload);
      t.add(outcome(p, d, true));
      p.send_raw(d);
    }
    wire::Packet cas = request(p, wire::kRcCompareSwap, psn, p.target->addr(0), p.target->rkey(), 8);
    cas.atomic.compare = current;
    cas.atomic.swap_add = ~current;
    auto d = p.datagram(cas);
    t.add(outcome(p, d, true));
    p.send_raw(d);
  }
  finish(p, before, t);
}

// In-window requests with the right rkey and PSN, addressed to every QPN but b's: reserved ones, a's
// (another context), neighbours of b, b's registry slot with another upper byte, random ones.
TEST(Hostile, WrongQpns) {
  Pair p;
  ASSERT_TRUE(p.up(108));
  p.sanity();
  const uint32_t bq = p.b.qpn();
  std::vector<uint32_t> qpns = {0, 1, 0xFFFFFF, p.a.qpn(), bq ^ 1, wire::psn_add(bq, 1), wire::psn_add(bq, 0xFFFFFF),
                                (bq + 0x10000) & 0xFFFFFF, (bq + 0x800000) & 0xFFFFFF};
  while (qpns.size() < 600) {
    uint32_t q = static_cast<uint32_t>(p.rng()) & 0xFFFFFF;
    if (q != bq) qpns.push_back(q);
  }
  Tally t;
  Stats before = p.begin();
  uint8_t data[64];
  std::memset(data, 0xEE, sizeof data);
  for (uint32_t q : qpns) {
    if (q == bq) continue;
    wire::Packet pk = request(p, wire::kRcWriteOnly, p.a_next, p.target->addr(256), p.target->rkey(), 64);
    pk.bth.dest_qp = q;
    auto d = p.datagram(pk, data, 64);
    t.add(outcome(p, d, true));
    p.send_raw(d);
  }
  finish(p, before, t);
}

// QPNs of destroyed QPs (gone from the registry), and a live QP that is still in INIT.
TEST(Hostile, StaleQpnsAndQpsNotReady) {
  Pair p;
  ASSERT_TRUE(p.up(109));
  p.sanity();
  std::vector<uint32_t> stale;
  for (int i = 0; i < 4; ++i) {
    Side x;
    ASSERT_TRUE(x.create(p.db, QpConfig{}));
    ASSERT_EQ(bring_up(x.qp, x.psn, p.a.qpn(), random_psn(), p.da.gid, p.conn, p.da.attr), 0);
    stale.push_back(x.qpn());
    ASSERT_TRUE(net::Registry::instance().lookup(x.qpn()).has_value());
  }  // destroyed here
  for (uint32_t q : stale) EXPECT_FALSE(net::Registry::instance().lookup(q).has_value()) << "stale QPN " << q;
  Side init;
  ASSERT_TRUE(init.create(p.db, QpConfig{}));
  ASSERT_EQ(modify_to_init(init.qp, kAllAccess), 0);
  Side reset;
  ASSERT_TRUE(reset.create(p.db, QpConfig{}));

  Tally t;
  Stats before = p.begin();
  uint8_t data[64];
  std::memset(data, 0xEE, sizeof data);
  auto shoot = [&](uint32_t q, const char* expect) {
    for (const ReqShape& s : request_shapes()) {
      for (uint32_t psn : {p.a_next, psn_ahead(p.a_next, 7), psn_behind(p.a_next, 7)}) {
        wire::Packet pk = request(p, s.op, psn, p.target->addr(0), p.target->rkey(), s.dma_len);
        pk.bth.dest_qp = q;
        p.send(pk, data, std::min<uint32_t>(s.payload, 64));
        t.add(expect);
      }
    }
  };
  for (uint32_t q : stale) shoot(q, "drop_unknown_qp");
  shoot(init.qpn(), "drop_bad_state");
  shoot(reset.qpn(), "drop_bad_state");
  Stats after = p.settle();
  expect_deltas(before, after, p.phase_sent(), t.done());
  // Drops for a known QP count in that QP's own set too.
  auto si = read_stats(init.qpn());
  ASSERT_TRUE(si.has_value());
  EXPECT_EQ(si->qp.drop_bad_state, request_shapes().size() * 3);
  EXPECT_EQ(qp_state(init.qp), IBV_QPS_INIT);
  EXPECT_EQ(qp_state(reset.qp), IBV_QPS_RESET);
  p.expect_memory_intact();
  p.expect_no_async_events();
  p.sanity();
}

// An in-window WRITE with the right rkey that differs from a valid one only where the test says:
// the positive control shows the same packet with everything right does land.
struct ControlWrite {
  static constexpr uint64_t kOff = 4096 + 128;
  static constexpr uint32_t kLen = 200;
  uint8_t data[kLen];
  ControlWrite() {
    for (uint32_t i = 0; i < kLen; ++i) data[i] = static_cast<uint8_t>(0x80 ^ i);
  }
  wire::Packet packet(const Pair& p) const {
    return request(p, wire::kRcWriteOnly, p.a_next, p.target->addr(kOff), p.target->rkey(), kLen);
  }
  // Sends it valid and checks it landed, and nothing else changed. Leaves b's expected PSN one ahead of a.
  void land(Pair& p) const {
    Stats before = p.begin();
    p.send(packet(p), data, kLen);
    Stats after = p.settle();
    expect_deltas(before, after, 1, {});
    p.expect_memory_intact(kOff, kLen);
    EXPECT_EQ(std::memcmp(p.target->data + kOff, data, kLen), 0) << "the valid in-window WRITE did not land";
  }
};

TEST(Hostile, BadIcrc) {
  Pair p;
  ASSERT_TRUE(p.up(110));
  p.sanity();
  ControlWrite cw;
  const wire::Packet pk = cw.packet(p);
  const auto good = p.datagram(pk, cw.data, cw.kLen);
  Tally t;
  Stats before = p.begin();
  int variant = 0;
  auto shoot = [&](std::vector<uint8_t> d) {
    ++variant;
    // What the receiver computes: from 127.0.0.1:<our port> to 127.0.0.1:<b's port>, IP id 0.
    wire::UdpAddr seen{wire::IpAddress::v4(0x0100007f), wire::IpAddress::v4(0x0100007f), p.sock.port(), p.ep.port};
    EXPECT_FALSE(wire::check_icrc(seen, d.data(), d.size()))
        << "variant " << variant << " has a valid ICRC";
    t.add("drop_icrc");
    p.send_raw(d);
  };
  for (size_t bit = 0; bit < 32; ++bit) {
    auto d = good;
    d.at(d.size() - 4 + bit / 8) ^= static_cast<uint8_t>(1u << (bit % 8));  // at(): no GCC -Wstringop-overflow false positive
    shoot(d);
  }
  // A flipped bit in an invariant field (BTH, RETH, payload) with the old ICRC.
  for (size_t byte : {2ul, 3ul, 7ul, 11ul, 12ul, 19ul, 24ul, 27ul, 28ul, 100ul, good.size() - 5}) {
    auto d = good;
    d[byte] ^= 0x10;
    shoot(d);
  }
  auto rebuilt = [&](uint32_t src_be, uint16_t sport, uint16_t dport, uint16_t ip_id) {
    auto body = build_body([&] { auto q = pk; q.bth.pad_count = wire::pad_for(cw.kLen); return q; }(), cw.data, cw.kLen);
    size_t n = body.size();
    body.resize(n + 4);
    wire::UdpAddr addr{wire::IpAddress::v4(src_be), wire::IpAddress::v4(0x0100007f), sport, dport, ip_id};
    wire::append_icrc(addr, body.data(), n);
    return body;
  };
  shoot(rebuilt(0x0100007f, static_cast<uint16_t>(p.sock.port() + 1), p.ep.port, 0));  // another source port
  shoot(rebuilt(0x0100007f, p.sock.port(), static_cast<uint16_t>(p.ep.port + 1), 0));  // another destination port
  shoot(rebuilt(0x0200007f, p.sock.port(), p.ep.port, 0));                             // 127.0.0.2
  // (A non-zero IP identification is not on this list: the receiver cannot see it and solves for it.)
  shoot(rebuilt(0x0100007f, p.sock.port(), 4791, 0));                                  // as if to 4791
  {
    auto d = good;
    std::fill(d.end() - 4, d.end(), 0);
    shoot(d);
    d = good;
    std::reverse(d.end() - 4, d.end());
    shoot(d);
  }
  finish(p, before, t);
  cw.land(p);
}

TEST(Hostile, BadPkey) {
  Pair p;
  ASSERT_TRUE(p.up(111));
  p.sanity();
  ControlWrite cw;
  std::vector<uint16_t> pkeys = {0x0000, 0x0001, 0x7FFE, 0x8000, 0x8001, 0x1234, 0xFFFE, 0x7F7F, 0xBFFF, 0xFF7F, 0x3FFF};
  while (pkeys.size() < 300) {
    uint16_t k = static_cast<uint16_t>(p.rng());
    if ((k & 0x7FFF) != 0x7FFF) pkeys.push_back(k);
  }
  Tally t;
  Stats before = p.begin();
  for (uint16_t k : pkeys) {
    wire::Packet pk = cw.packet(p);
    pk.bth.pkey = k;
    auto d = p.datagram(pk, cw.data, cw.kLen);
    t.add(outcome(p, d, true));
    p.send_raw(d);
  }
  EXPECT_EQ(t.want["drop_pkey"], pkeys.size());
  finish(p, before, t);
  cw.land(p);
}

// The right rkey and an in-window PSN still land only the bytes they name: the control write after
// a burst of wrong-QPN copies of it.
TEST(Hostile, WrongQpnThenControl) {
  Pair p;
  ASSERT_TRUE(p.up(112));
  p.sanity();
  ControlWrite cw;
  Tally t;
  Stats before = p.begin();
  for (int i = 0; i < 100; ++i) {
    wire::Packet pk = cw.packet(p);
    pk.bth.dest_qp = (p.b.qpn() + 1 + static_cast<uint32_t>(i)) & 0xFFFFFF;
    auto d = p.datagram(pk, cw.data, cw.kLen);
    t.add(outcome(p, d, true));
    p.send_raw(d);
  }
  finish(p, before, t);
  cw.land(p);
}

// Forged acknowledgements, NAKs and responses at b, which as a requester has everything acknowledged:
// PSNs it has used (behind its next PSN). A requester with nothing outstanding has nothing they can
// answer; none of them may complete anything, raise anything, or move b to ERR.
TEST(Hostile, ForgedResponsesToIdleRequester) {
  Pair p;
  ASSERT_TRUE(p.up(113));
  p.sanity();  // b sent 32 PSNs, all acknowledged
  Stats before = p.begin();
  uint8_t data[kMtu];
  std::memset(data, 0xEE, sizeof data);
  struct Resp {
    uint8_t op;
    uint8_t syndrome;
    uint32_t payload;
    const char* name;
  };
  const Resp resps[] = {
      {wire::kRcAck, wire::aeth_ack(), 0, "ACK"},
      {wire::kRcAck, wire::aeth_rnr_nak(1), 0, "RNR NAK"},
      {wire::kRcAck, wire::aeth_nak(wire::kNakPsnSeqErr), 0, "NAK PSN sequence error"},
      {wire::kRcAck, wire::aeth_nak(wire::kNakInvalidRequest), 0, "NAK invalid request"},
      {wire::kRcAck, wire::aeth_nak(wire::kNakRemoteAccess), 0, "NAK remote access"},
      {wire::kRcAck, wire::aeth_nak(wire::kNakRemoteOp), 0, "NAK remote operational"},
      {wire::kRcReadResponseOnly, wire::aeth_ack(), 64, "READ response only"},
      {wire::kRcReadResponseFirst, wire::aeth_ack(), kMtu, "READ response first"},
      {wire::kRcReadResponseMiddle, 0, kMtu, "READ response middle"},
      {wire::kRcReadResponseLast, wire::aeth_ack(), 64, "READ response last"},
      {wire::kRcAtomicAck, wire::aeth_ack(), 0, "ATOMIC acknowledge"},
  };
  for (const Resp& r : resps) {
    // More than retry_cnt (7) of each: a NAK that counted against the retries would exhaust them.
    for (uint32_t k : {1u, 2u, 3u, 16u, 17u, 31u, 32u, 33u, 1000u, 0x7FFFFFu}) {
      wire::Packet pk = p.req(r.op, psn_behind(p.b_next, k));
      pk.bth.ack_req = false;
      pk.aeth = {r.syndrome, static_cast<uint32_t>(p.rng()) & 0xFFFFFF};
      pk.atomic_ack_orig = p.rng();
      p.send(pk, data, r.payload);
    }
    // Settle per kind, so a failure names the packet that caused it.
    p.settle();
    EXPECT_EQ(qp_state(p.b.qp), IBV_QPS_RTS) << "after forged " << r.name << " packets";
    if (qp_state(p.b.qp) != IBV_QPS_RTS) break;
  }
  Stats after = p.settle();
  EXPECT_EQ(after.dev.rx_packets - before.dev.rx_packets, p.phase_sent());
  p.expect_memory_intact();
  p.expect_no_async_events();
  p.sanity();
}

// ---------------------------------------------------------------------------------------------
// In-window requests a correct peer could have sent wrongly: NAK, the responder QP goes to ERR with
// the matching async event, memory is untouched. One fresh pair per case.

struct FatalCase {
  const char* name;
  std::vector<ReqShape> prelude;  // valid in-window packets first (their bytes may land)
  uint8_t op;
  int64_t off;   // VA offset from the target MR's start (may be outside)
  bool abs_va;   // off is an absolute address
  uint32_t payload, dma_len;
  bool guessed_rkey;
  ibv_event_type event;
  const char* nak_counter;
};

void run_fatal(const FatalCase& c) {
  SCOPED_TRACE(c.name);
  Pair p;
  ASSERT_TRUE(p.up(200));
  p.sanity();
  Stats before = p.begin();
  uint8_t data[2 * kMtu];
  std::memset(data, 0xEE, sizeof data);
  uint32_t psn = p.a_next;
  size_t landed = 0;
  for (const ReqShape& s : c.prelude) {
    p.send(request(p, s.op, psn, p.target->addr(landed), p.target->rkey(), s.dma_len), data, s.payload);
    landed += s.payload;
    psn = wire::psn_add(psn, 1);
  }
  // A receive WQE, so a WRITE with immediate meets its rkey check rather than an RNR NAK; the error
  // flushes it.
  ASSERT_EQ(post_recv(p.b.qp, 99, {p.scratch_b->sge(0, 64)}), 0);
  uint64_t va = c.abs_va ? static_cast<uint64_t>(c.off) : p.target->addr() + static_cast<uint64_t>(c.off);
  uint32_t rkey = c.guessed_rkey ? guess_rkey(p) : p.target->rkey();
  p.send(request(p, c.op, psn, va, rkey, c.dma_len), data, c.payload);
  p.expect_b_errored(c.event);
  Stats after = p.settle();
  expect_deltas(before, after, p.phase_sent(), {{c.nak_counter, 1}});
  p.expect_memory_intact(0, landed);
  EXPECT_EQ(std::count(p.target->data, p.target->data + landed, 0xEE), static_cast<long>(landed));
  auto flushed = poll_wcs(p.b.rcq, 1);
  ASSERT_EQ(flushed.size(), 1u);
  expect_wc(flushed[0], {.wr_id = 99, .status = IBV_WC_WR_FLUSH_ERR, .qp_num = p.b.qpn()});
  p.expect_no_completions();
  auto sb = read_stats(p.b.qpn());
  ASSERT_TRUE(sb.has_value());
  EXPECT_EQ(sb->qp.*(std::find_if(outcome_counters().begin(), outcome_counters().end(),
                                  [&](const auto& oc) { return std::string(oc.first) == c.nak_counter; })
                         ->second),
            1u)
      << "the NAK counts in b's QP set";
}

constexpr auto kAccess = IBV_EVENT_QP_ACCESS_ERR;
constexpr auto kReqErr = IBV_EVENT_QP_REQ_ERR;

TEST(HostileFatal, GuessedRkeyInWindow) {
  for (const ReqShape& s : request_shapes()) {
    std::string name = std::string("guessed rkey, ") + wire::opcode_info(s.op).name;
    run_fatal({name.c_str(), {}, s.op, 64, false, s.payload, s.dma_len, true, kAccess, "naks_sent_rem_access"});
  }
}

TEST(HostileFatal, VaOutsideMrInWindow) {
  const int64_t end = static_cast<int64_t>(kTargetLen);
  const FatalCase cases[] = {
      {"WRITE straddling the start", {}, wire::kRcWriteOnly, -8, false, 16, 16, false, kAccess, "naks_sent_rem_access"},
      {"WRITE straddling the end", {}, wire::kRcWriteOnly, end - 8, false, 16, 16, false, kAccess, "naks_sent_rem_access"},
      {"WRITE one past the end", {}, wire::kRcWriteOnly, end, false, 1, 1, false, kAccess, "naks_sent_rem_access"},
      {"WRITE_FIRST longer than the MR", {}, wire::kRcWriteFirst, 0, false, kMtu, kTargetLen + kMtu, false, kAccess,
       "naks_sent_rem_access"},
      {"WRITE wrapping the address space", {}, wire::kRcWriteOnly, -4, true, 8, 8, false, kAccess, "naks_sent_rem_access"},
      {"WRITE at address 0", {}, wire::kRcWriteOnly, 0, true, 8, 8, false, kAccess, "naks_sent_rem_access"},
      {"READ one past the end", {}, wire::kRcReadRequest, end, false, 0, 1, false, kAccess, "naks_sent_rem_access"},
      {"READ of 4 GiB - 1", {}, wire::kRcReadRequest, 0, false, 0, 0xFFFFFFFFu, false, kAccess, "naks_sent_rem_access"},
      {"READ before the start", {}, wire::kRcReadRequest, -4096, false, 0, 64, false, kAccess, "naks_sent_rem_access"},
      {"CMP_SWAP at the end", {}, wire::kRcCompareSwap, end, false, 0, 8, false, kAccess, "naks_sent_rem_access"},
      {"FETCH_ADD before the start", {}, wire::kRcFetchAdd, -8, false, 0, 8, false, kAccess, "naks_sent_rem_access"},
      {"FETCH_ADD misaligned", {}, wire::kRcFetchAdd, 4, false, 0, 8, false, kReqErr, "naks_sent_inv_req"},
      {"ATOMIC_WRITE at the end", {}, wire::kRcAtomicWrite, end, false, 8, 8, false, kAccess, "naks_sent_rem_access"},
      {"ATOMIC_WRITE misaligned", {}, wire::kRcAtomicWrite, 4, false, 8, 8, false, kReqErr, "naks_sent_inv_req"},
      {"ATOMIC_WRITE of 4 bytes", {}, wire::kRcAtomicWrite, 0, false, 4, 4, false, kReqErr, "naks_sent_inv_req"},
      {"ATOMIC_WRITE whose RETH says 16", {}, wire::kRcAtomicWrite, 0, false, 8, 16, false, kReqErr,
       "naks_sent_inv_req"},
  };
  for (const auto& c : cases) run_fatal(c);
}

// The target's neighbours with the target's rkey: the key names one MR, not the memory around it.
TEST(HostileFatal, GuardMemoryWithTargetRkey) {
  Pair p;
  ASSERT_TRUE(p.up(201));
  p.sanity();
  Stats before = p.begin();
  uint8_t data[64];
  std::memset(data, 0xEE, sizeof data);
  p.send(request(p, wire::kRcWriteOnly, p.a_next, p.guard_hi->addr(0), p.target->rkey(), 64), data, 64);
  p.expect_b_errored(kAccess);
  Stats after = p.settle();
  expect_deltas(before, after, 1, {{"naks_sent_rem_access", 1}});
  p.expect_memory_intact();
}

TEST(HostileFatal, InvalidOpcodeSequences) {
  const ReqShape write_first{wire::kRcWriteFirst, kMtu, 4 * kMtu};
  const FatalCase cases[] = {
      {"WRITE_MIDDLE without FIRST", {}, wire::kRcWriteMiddle, 0, false, kMtu, 0, false, kReqErr, "naks_sent_inv_req"},
      {"WRITE_LAST without FIRST", {}, wire::kRcWriteLast, 0, false, 64, 0, false, kReqErr, "naks_sent_inv_req"},
      {"WRITE_LAST_IMM without FIRST", {}, wire::kRcWriteLastImm, 0, false, 64, 0, false, kReqErr, "naks_sent_inv_req"},
      {"SEND_MIDDLE without FIRST", {}, wire::kRcSendMiddle, 0, false, kMtu, 0, false, kReqErr, "naks_sent_inv_req"},
      {"SEND_LAST without FIRST", {}, wire::kRcSendLast, 0, false, 64, 0, false, kReqErr, "naks_sent_inv_req"},
      {"SEND_LAST_INV without FIRST", {}, wire::kRcSendLastInv, 0, false, 64, 0, false, kReqErr, "naks_sent_inv_req"},
      {"SEND_MIDDLE inside a WRITE", {write_first}, wire::kRcSendMiddle, 0, false, kMtu, 0, false, kReqErr,
       "naks_sent_inv_req"},
      {"WRITE_ONLY inside a WRITE", {write_first}, wire::kRcWriteOnly, 0, false, 64, 64, false, kReqErr,
       "naks_sent_inv_req"},
      {"READ inside a WRITE", {write_first}, wire::kRcReadRequest, 0, false, 0, 64, false, kReqErr,
       "naks_sent_inv_req"},
      {"WRITE_MIDDLE shorter than the MTU", {write_first}, wire::kRcWriteMiddle, 0, false, 100, 0, false, kReqErr,
       "naks_sent_inv_req"},
      {"WRITE_LAST ending before the RETH length", {write_first}, wire::kRcWriteLast, 0, false, kMtu, 0, false, kReqErr,
       "naks_sent_inv_req"},
      {"WRITE_ONLY payload above the MTU", {}, wire::kRcWriteOnly, 0, false, kMtu + 4, kMtu + 4, false, kReqErr,
       "naks_sent_inv_req"},
  };
  for (const auto& c : cases) run_fatal(c);
}

}  // namespace
}  // namespace softrdma::hostile_test
