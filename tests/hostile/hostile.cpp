#include "hostile.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

namespace softrdma::hostile_test {

uint64_t& hostile_packets_sent() {
  static uint64_t n = 0;
  return n;
}

namespace {
// Prints the total once all tests ran (the brief asks for it in the report).
class SentReporter : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("[ hostile ] hostile datagrams sent in this run: %llu\n",
                static_cast<unsigned long long>(hostile_packets_sent()));
  }
};
[[maybe_unused]] ::testing::Environment* const kReporter = ::testing::AddGlobalTestEnvironment(new SentReporter);

constexpr uint32_t kLoopbackBe = 0x0100007f;  // 127.0.0.1 in network order (little-endian host)
}  // namespace

HostileSocket::HostileSocket() {
  fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    ADD_FAILURE() << "socket: " << strerror(errno);
    return;
  }
  int df = IP_PMTUDISC_DO;  // like softrdma's sockets: DF set, IP identification 0
  setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &df, sizeof df);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof sa;
  if (bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &sl) != 0) {
    ADD_FAILURE() << "bind: " << strerror(errno);
    return;
  }
  port_ = ntohs(sa.sin_port);
}

HostileSocket::~HostileSocket() {
  if (fd_ >= 0) close(fd_);
}

void HostileSocket::send(const std::vector<uint8_t>& d, uint16_t dst_port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(dst_port);
  ssize_t r = sendto(fd_, d.data(), d.size(), 0, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  ASSERT_EQ(r, static_cast<ssize_t>(d.size())) << "sendto: " << strerror(errno);
  ++hostile_packets_sent();
}

std::vector<uint8_t> build_body(const wire::Packet& p, const uint8_t* payload, uint32_t len) {
  std::vector<uint8_t> out(wire::kBthLen + wire::kAtomicEthLen + wire::kRethLen + 16);
  size_t n = wire::write_headers(p, out.data());
  out.resize(n);
  if (len) out.insert(out.end(), payload, payload + len);
  out.resize(out.size() + p.bth.pad_count, 0);
  return out;
}

void add_icrc(std::vector<uint8_t>& body, uint16_t src_port, uint16_t dst_port) {
  size_t n = body.size();
  body.resize(n + wire::kIcrcLen);
  if (n < wire::kBthLen) return;  // too short for an ICRC: leave zeros
  wire::UdpAddr addr{wire::IpAddress::v4(kLoopbackBe), wire::IpAddress::v4(kLoopbackBe), src_port, dst_port};
  wire::append_icrc(addr, body.data(), n);
}

std::optional<Stats> read_stats(uint32_t qpn) {
  const pid_t me = getpid();
  for (const auto& s : core::StatsPage::read_all()) {
    if (s.pid != me || s.device != "softrdma_lo") continue;
    for (const auto& q : s.qps)
      if (q.qpn == qpn) return Stats{s.device_counters, q.counters};
  }
  return std::nullopt;
}

uint64_t get(const core::Counters& c, Counter f) { return c.*f; }

const std::vector<std::pair<const char*, Counter>>& outcome_counters() {
  using C = core::Counters;
  static const std::vector<std::pair<const char*, Counter>> v = {
      {"drop_malformed", &C::drop_malformed},
      {"drop_icrc", &C::drop_icrc},
      {"drop_pkey", &C::drop_pkey},
      {"drop_unknown_qp", &C::drop_unknown_qp},
      {"drop_bad_opcode", &C::drop_bad_opcode},
      {"drop_bad_state", &C::drop_bad_state},
      {"drop_stale_response", &C::drop_stale_response},
      {"out_of_sequence", &C::out_of_sequence},
      {"duplicates", &C::duplicates},
      {"naks_sent_seq", &C::naks_sent_seq},
      {"naks_sent_inv_req", &C::naks_sent_inv_req},
      {"naks_sent_rem_access", &C::naks_sent_rem_access},
      {"naks_sent_rem_op", &C::naks_sent_rem_op},
      {"rnr_naks_sent", &C::rnr_naks_sent},
      {"naks_rcvd_seq", &C::naks_rcvd_seq},
      {"naks_rcvd_inv_req", &C::naks_rcvd_inv_req},
      {"naks_rcvd_rem_access", &C::naks_rcvd_rem_access},
      {"naks_rcvd_rem_op", &C::naks_rcvd_rem_op},
      {"rnr_naks_rcvd", &C::rnr_naks_rcvd},
      {"retry_exceeded", &C::retry_exceeded},
  };
  return v;
}

void expect_deltas(const Stats& before, const Stats& after, uint64_t sent,
                   const std::map<std::string, uint64_t>& want) {
  EXPECT_EQ(after.dev.rx_packets - before.dev.rx_packets, sent) << "datagrams received by the target context";
  for (const auto& w : want) {
    bool known = false;
    for (const auto& [name, f] : outcome_counters()) known |= w.first == name;
    EXPECT_TRUE(known) << "test asks for unknown counter " << w.first;
  }
  for (const auto& [name, f] : outcome_counters()) {
    auto it = want.find(name);
    uint64_t expect = it == want.end() ? 0 : it->second;
    EXPECT_EQ(get(after.dev, f) - get(before.dev, f), expect) << "device counter " << name;
  }
}

bool connect_sides(const Side& a, const Device& da, const Side& b, const Device& db, const ConnConfig& conn) {
  if (int rc = bring_up(a.qp, a.psn, b.qpn(), b.psn, db.gid, conn, db.attr)) {
    ADD_FAILURE() << "bring up a: " << strerror(rc);
    return false;
  }
  if (int rc = bring_up(b.qp, b.psn, a.qpn(), a.psn, da.gid, conn, da.attr)) {
    ADD_FAILURE() << "bring up b: " << strerror(rc);
    return false;
  }
  return true;
}

bool Pair::up(uint64_t seed) {
  rng.seed(seed);
  if (!da.ok() || !db.ok()) {
    ADD_FAILURE() << "cannot open the loopback device twice";
    return false;
  }
  QpConfig qc;
  if (!a.create(da, qc) || !b.create(db, qc)) return false;
  guard_lo = b.buf(kGuardLen);
  target = b.buf(kTargetLen);
  guard_hi = b.buf(kGuardLen);
  scratch_b = b.buf(kScratchLen);
  src_b2 = b.buf(kSanityLen);
  dst_b2 = b.buf(kSanityLen);
  guard_a = a.buf(kGuardLen);
  src_a = a.buf(kSanityLen + kSanitySend);
  dst_a = a.buf(kSanityLen);
  scratch_a = a.buf(kSanityLen);
  for (auto* p : {&guard_lo, &target, &guard_hi, &scratch_b, &src_b2, &dst_b2, &guard_a, &src_a, &dst_a, &scratch_a})
    if (!*p || !(*p)->mr) return false;
  fill_pattern(guard_lo->data, kGuardLen, 11);
  fill_pattern(target->data, kTargetLen, 12);
  fill_pattern(guard_hi->data, kGuardLen, 13);
  fill_pattern(guard_a->data, kGuardLen, 14);
  conn.path_mtu = IBV_MTU_1024;
  if (!connect_sides(a, da, b, db, conn)) return false;
  a_next = a.psn;
  b_next = b.psn;
  auto e = net::Registry::instance().lookup(b.qpn());
  if (!e) {
    ADD_FAILURE() << "b's QPN " << b.qpn() << " is not in the registry";
    return false;
  }
  ep = *e;
  EXPECT_EQ(ep.ip_key, kLoopbackBe);
  EXPECT_EQ(ep.pid, getpid());
  if (!read_stats(b.qpn())) {
    ADD_FAILURE() << "no stats page holds QP " << b.qpn();
    return false;
  }
  return true;
}

wire::Packet Pair::req(uint8_t opcode, uint32_t psn) const {
  wire::Packet p{};
  p.bth.opcode = opcode;
  p.bth.pkey = wire::kDefaultPkey;
  p.bth.dest_qp = b.qp->qp_num;
  p.bth.psn = psn & wire::kPsnMask;
  p.bth.ack_req = true;
  return p;
}

std::vector<uint8_t> Pair::datagram(const wire::Packet& p, const uint8_t* payload, uint32_t len) {
  wire::Packet q = p;
  q.bth.pad_count = wire::pad_for(len);
  auto d = build_body(q, payload, len);
  add_icrc(d, sock.port(), ep.port);
  return d;
}

namespace {
bool wait_for(const std::function<bool()>& pred, int timeout_s = 30) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}
}  // namespace

Stats Pair::stats() {
  auto s = read_stats(b.qpn());
  if (!s) {
    ADD_FAILURE() << "no stats page holds QP " << b.qpn();
    return {};
  }
  return *s;
}

Stats Pair::begin() {
  phase_before_ = stats();
  phase_sent_ = 0;
  return phase_before_;
}

void Pair::send_raw(const std::vector<uint8_t>& d) {
  sock.send(d, ep.port);
  if (++phase_sent_ % 32 == 0) {
    const uint64_t want = phase_before_.dev.rx_packets + phase_sent_;
    if (!wait_for([&] { return stats().dev.rx_packets >= want; }))
      ADD_FAILURE() << "the target context stopped receiving (" << phase_sent_ << " sent)";
  }
}

void Pair::send(const wire::Packet& p, const uint8_t* payload, uint32_t len) { send_raw(datagram(p, payload, len)); }

Stats Pair::settle(const Stats& before, uint64_t n) {
  Stats now{};
  bool ok = wait_for([&] {
    now = stats();
    return now.dev.rx_packets - before.dev.rx_packets >= n;
  });
  if (!ok) {
    ADD_FAILURE() << "the target context received " << now.dev.rx_packets - before.dev.rx_packets << " of " << n
                  << " datagrams within 30 s";
    return now;
  }
  // The drop counter of the last datagram follows its rx count within the same locked step; let any
  // answers (NAKs to a, READ responses) be processed too.
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    Stats again = stats();
    if (std::memcmp(&again.dev, &now.dev, sizeof now.dev) == 0) break;
    now = again;
  }
  return now;
}

void Pair::expect_memory_intact(size_t skip_off, size_t skip_len) {
  auto check = [](const char* what, const Buffer& buf, size_t off, size_t n, uint32_t seed) {
    size_t at = check_pattern(buf.data + off, n, seed, off);
    EXPECT_EQ(at, n) << what << " changed at offset " << off + at;
  };
  check("guard_lo", *guard_lo, 0, kGuardLen, 11);
  check("guard_hi", *guard_hi, 0, kGuardLen, 13);
  check("guard_a", *guard_a, 0, kGuardLen, 14);
  check("target", *target, 0, skip_off, 12);
  check("target", *target, skip_off + skip_len, kTargetLen - skip_off - skip_len, 12);
}

void Pair::expect_no_completions() {
  std::vector<ibv_wc> wcs;
  for (ibv_cq* cq : {a.scq, a.rcq, b.scq, b.rcq}) drain_cq(cq, &wcs);
  EXPECT_TRUE(wcs.empty()) << wcs.size() << " unexpected completion(s), first: wr_id " << wcs[0].wr_id << " "
                           << ibv_wc_status_str(wcs[0].status);
}

void Pair::sanity() {
  expect_no_completions();
  ++round;
  const uint32_t s1 = 1000 + static_cast<uint32_t>(round) * 2, s2 = s1 + 1;
  fill_pattern(src_a->data, kSanityLen + kSanitySend, s1);
  fill_pattern(src_b2->data, kSanityLen, s2);
  std::memset(scratch_b->data, 0, kScratchLen);
  std::memset(dst_a->data, 0, kSanityLen);
  std::memset(scratch_a->data, 0, kSanityLen);
  std::memset(dst_b2->data, 0, kSanityLen);
  constexpr size_t kRecvOff = 48 * 1024;
  ASSERT_EQ(post_recv(b.qp, 77, {scratch_b->sge(kRecvOff, kSanitySend)}), 0);
  // Operations that took the intra-host direct path (docs/direct-path.md) used no PSNs. They run one at
  // a time, so that the counter says which did (it moves before the completion is written).
  auto direct_ops = [](uint32_t qpn) {
    auto s = read_stats(qpn);
    return s ? s->qp.direct_ops : 0;
  };
  uint32_t a_psns = 0, b_psns = 0;
  auto run = [&](ibv_qp* qp, ibv_cq* cq, uint32_t qpn, SendWr& w, uint64_t wr_id, uint32_t psns, uint32_t* used) {
    const uint64_t before = direct_ops(qpn);
    ASSERT_EQ(post_send(qp, w), 0);
    auto wc = poll_wcs(cq, 1);
    ASSERT_EQ(wc.size(), 1u);
    expect_wc(wc[0], {.wr_id = wr_id, .qp_num = qpn});
    if (direct_ops(qpn) == before) *used += psns;
  };
  SendWr w1(1, IBV_WR_RDMA_WRITE, {src_a->sge(0, kSanityLen)});
  w1.rdma(scratch_b->addr(), scratch_b->rkey());
  SendWr r1(2, IBV_WR_RDMA_READ, {dst_a->sge(0, kSanityLen)});
  r1.rdma(scratch_b->addr(), scratch_b->rkey());
  SendWr s1wr(3, IBV_WR_SEND, {src_a->sge(kSanityLen, kSanitySend)});
  ASSERT_NO_FATAL_FAILURE(run(a.qp, a.scq, a.qpn(), w1, 1, kSanityLen / kMtu, &a_psns));
  ASSERT_NO_FATAL_FAILURE(run(a.qp, a.scq, a.qpn(), r1, 2, kSanityLen / kMtu, &a_psns));
  ASSERT_NO_FATAL_FAILURE(run(a.qp, a.scq, a.qpn(), s1wr, 3, kSanitySend / kMtu, &a_psns));
  SendWr w2(4, IBV_WR_RDMA_WRITE, {src_b2->sge(0, kSanityLen)});
  w2.rdma(scratch_a->addr(), scratch_a->rkey());
  SendWr r2(5, IBV_WR_RDMA_READ, {dst_b2->sge(0, kSanityLen)});
  r2.rdma(scratch_a->addr(), scratch_a->rkey());
  ASSERT_NO_FATAL_FAILURE(run(b.qp, b.scq, b.qpn(), w2, 4, kSanityLen / kMtu, &b_psns));
  ASSERT_NO_FATAL_FAILURE(run(b.qp, b.scq, b.qpn(), r2, 5, kSanityLen / kMtu, &b_psns));
  auto wr = poll_wcs(b.rcq, 1);
  ASSERT_EQ(wr.size(), 1u);
  expect_wc(wr[0], {.wr_id = 77, .opcode = IBV_WC_RECV, .byte_len = kSanitySend, .qp_num = b.qpn()});

  EXPECT_EQ(check_pattern(scratch_b->data, kSanityLen, s1), kSanityLen) << "WRITE a->b data";
  EXPECT_EQ(check_pattern(dst_a->data, kSanityLen, s1), kSanityLen) << "READ a<-b data";
  EXPECT_EQ(check_pattern(scratch_b->data + kRecvOff, kSanitySend, s1, kSanityLen), kSanitySend) << "SEND data";
  EXPECT_EQ(check_pattern(scratch_a->data, kSanityLen, s2), kSanityLen) << "WRITE b->a data";
  EXPECT_EQ(check_pattern(dst_b2->data, kSanityLen, s2), kSanityLen) << "READ b<-a data";
  a_next = wire::psn_add(a_next, a_psns);
  b_next = wire::psn_add(b_next, b_psns);
  EXPECT_EQ(qp_state(a.qp), IBV_QPS_RTS);
  EXPECT_EQ(qp_state(b.qp), IBV_QPS_RTS);
}

namespace {
// The next async event of ctx within timeout_ms, if any.
std::optional<ibv_async_event> next_event(ibv_context* ctx, int timeout_ms) {
  pollfd p{ctx->async_fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return std::nullopt;
  ibv_async_event ev{};
  if (ibv_get_async_event(ctx, &ev) != 0) return std::nullopt;
  ibv_async_event copy = ev;
  ibv_ack_async_event(&ev);
  return copy;
}
}  // namespace

void Pair::expect_b_errored(ibv_event_type want) {
  EXPECT_TRUE(wait_qp_state(b.qp, IBV_QPS_ERR));
  auto ev = next_event(db.ctx, kWaitSeconds * 1000);
  ASSERT_TRUE(ev.has_value()) << "no async event on b's context";
  EXPECT_EQ(ev->event_type, want) << ibv_event_type_str(ev->event_type);
  EXPECT_EQ(ev->element.qp, b.qp);
  EXPECT_EQ(qp_state(a.qp), IBV_QPS_RTS) << "the NAK went to a, which had nothing outstanding";
  EXPECT_FALSE(next_event(da.ctx, 0).has_value()) << "a got an async event";
}

void Pair::expect_no_async_events() {
  auto ea = next_event(da.ctx, 0);
  auto eb = next_event(db.ctx, 0);
  EXPECT_FALSE(ea.has_value()) << "a: " << ibv_event_type_str(ea->event_type);
  EXPECT_FALSE(eb.has_value()) << "b: " << ibv_event_type_str(eb->event_type);
}

}  // namespace softrdma::hostile_test
