// rc_verifier: a two-process check that RC is exact under packet faults (issue 12). The initiator runs
// rounds of WRITE, READ (of what that WRITE wrote), FETCH_ADD and SEND against a target over one RC QP
// pair and checks every result against a shadow of the target's memory; both sides derive every choice
// from one seed, so the target can check its own memory and the SENDs it received as well.
// docs/reliability.md ("The exactness verifier") describes it; tests/faults/verify.sh runs it.
//
//   rc_verifier --listen PORT [--ip ADDR | --dev NAME]                        the target
//   rc_verifier --connect HOST --port PORT --seed S [--rounds R] [--max-write BYTES]
//               [--ip ADDR | --dev NAME] [--hang-s SECONDS]                   the initiator
//
// Exit status: 0 all exact; 1 data mismatch; 2 a completion that is not a success; 3 a hang; 4 an atomic
// off; 5 a SEND lost, repeated or damaged; 6 set-up failed; 7 the other process went away.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>
#include "splitmix.h"

namespace {

constexpr size_t kMrSize = 16u << 20;
constexpr size_t kReadBuf = 4u << 20;
constexpr size_t kMaxMsg = 8u << 10;  // a SEND, header included
constexpr size_t kAtomicMr = 64;
constexpr int kRecvs = 32;
constexpr uint8_t kPort = 1;
constexpr uint64_t kMsgMagic = 0x5346545652464d53ull;
constexpr uint32_t kSetupMagic = 0x52435631;  // "RCV1"

enum Exit { kOk = 0, kData = 1, kStatus = 2, kHang = 3, kAtomic = 4, kSendBad = 5, kSetup = 6, kGone = 7 };

using softrdma::fault_test::Rng;

uint64_t key(uint64_t seed, uint64_t a, uint64_t b = 0) {
  Rng r{seed ^ (a * 0xD6E8FEB86659FD93ull) ^ (b * 0xA0761D6478BD642Full)};
  r.next();
  return r.next();
}

enum : uint64_t { kKeyInit = 1, kKeyAtomic, kKeyPsnI, kKeyPsnT, kKeyPlan, kKeyWrite, kKeySend };

// Deterministic bytes for (seed, what, round).
void fill(uint8_t* p, size_t n, uint64_t k) {
  Rng r{k};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = r.next();
    std::memcpy(p + i, &v, 8);
  }
  if (i < n) {
    uint64_t v = r.next();
    std::memcpy(p + i, &v, n - i);
  }
}

struct Options {
  uint64_t seed = 1;
  uint32_t rounds = 200;
  uint64_t max_write = 4u << 20;
};

// Everything one round does, from the seed alone.
struct Plan {
  uint64_t write_len, src_off, dst_off, read_off, read_len, add;
  uint32_t send_len;  // payload bytes after the header
};

struct MsgHeader {
  uint64_t magic;
  uint64_t seq;
  uint32_t len;
  uint32_t pad;
  uint64_t sum;
};
constexpr uint32_t kMaxPayload = kMaxMsg - sizeof(MsgHeader);

Plan plan(const Options& o, uint32_t round) {
  Rng r{key(o.seed, kKeyPlan, round)};
  Plan p{};
  // Log-distributed: every power of two from 1 B to max_write about equally likely.
  const double bits = std::log2(static_cast<double>(o.max_write));
  p.write_len = std::clamp<uint64_t>(static_cast<uint64_t>(std::exp2(r.uniform() * (bits + 1))), 1, o.max_write);
  p.src_off = r.below(kMrSize - p.write_len + 1);
  p.dst_off = r.below(kMrSize - p.write_len + 1);
  p.read_len = 1 + r.below(p.write_len);
  p.read_off = p.dst_off + r.below(p.write_len - p.read_len + 1);
  p.add = r.next() | 1;
  p.send_len = static_cast<uint32_t>(r.below(kMaxPayload + 1));
  return p;
}

uint64_t checksum(const uint8_t* p, size_t n, uint64_t seq) {
  uint64_t h = 0xcbf29ce484222325ull ^ seq;  // FNV-1a
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// The message of a round: header and payload, all from the seed.
size_t build_message(const Options& o, uint32_t round, uint8_t* buf) {
  const Plan p = plan(o, round);
  MsgHeader h{kMsgMagic, round, p.send_len, 0, 0};
  fill(buf + sizeof h, p.send_len, key(o.seed, kKeySend, round));
  h.sum = checksum(buf + sizeof h, p.send_len, round);
  std::memcpy(buf, &h, sizeof h);
  return sizeof h + p.send_len;
}

// The target's memory after `rounds` rounds.
void replay_target(const Options& o, uint32_t rounds, uint8_t* mem, uint64_t* atomic) {
  fill(mem, kMrSize, key(o.seed, kKeyInit));
  uint64_t a = key(o.seed, kKeyAtomic);
  for (uint32_t r = 0; r < rounds; ++r) {
    const Plan p = plan(o, r);
    fill(mem + p.dst_off, p.write_len, key(o.seed, kKeyWrite, r));
    a += p.add;
  }
  *atomic = a;
}

// Which of the first `rounds` WRITEs last put the byte at target offset `off` there, and in which packet.
std::string provenance(const Options& o, uint32_t rounds, uint64_t off) {
  for (uint32_t r = rounds; r-- > 0;) {
    const Plan p = plan(o, r);
    if (off >= p.dst_off && off < p.dst_off + p.write_len) {
      char line[160];
      std::snprintf(line, sizeof line,
                    "<- round %u WRITE of %" PRIu64 " B at %" PRIu64 ", its byte %" PRIu64 " = packet %" PRIu64
                    " of %" PRIu64 " (MTU 1024)",
                    r, p.write_len, p.dst_off, off - p.dst_off, (off - p.dst_off) / 1024, (p.write_len + 1023) / 1024);
      return line;
    }
  }
  return "<- initial contents (no WRITE)";
}

std::string g_role = "rc_verifier";
std::string g_repro;

[[gnu::format(printf, 1, 2)]] void say(const char* fmt, ...) {
  std::fprintf(stderr, "%s: ", g_role.c_str());
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
}

// Where two buffers differ, in a form that tells a flipped bit from misplaced or stale data: the count,
// then the first differing bytes with what `where` says about each (remote offsets are base + i).
std::string describe_diff(const uint8_t* want, const uint8_t* got, size_t n, uint64_t base,
                          const std::function<std::string(uint64_t)>& where = {}) {
  size_t first = n, last = 0, count = 0, bits = 0;
  std::vector<size_t> shown;
  for (size_t i = 0; i < n; ++i) {
    if (want[i] != got[i]) {
      if (first == n) first = i;
      last = i;
      ++count;
      bits += static_cast<size_t>(std::popcount(static_cast<unsigned>(want[i] ^ got[i])));
      if (shown.size() < 8) shown.push_back(i);
    }
  }
  if (count == 0) return "no difference";
  char line[256];
  std::snprintf(line, sizeof line, "%zu byte(s) differ (%zu bit(s) flipped), offsets %" PRIu64 "..%" PRIu64, count,
                bits, base + first, base + last);
  std::string s = line;
  for (size_t i : shown) {
    std::snprintf(line, sizeof line, "\n    offset %" PRIu64 ": want %02x got %02x (xor %02x)", base + i, want[i],
                  got[i], want[i] ^ got[i]);
    s += line;
    if (where) s.append(" ").append(where(base + i));  // append: no GCC 12 -O3 -Wrestrict false positive
  }
  if (count > shown.size()) s += "\n    ...";
  return s;
}

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes within timeout_ms (negative: no limit).
bool read_all(int fd, void* p, size_t n, int timeout_ms) {
  char* c = static_cast<char*>(p);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (n) {
    int wait = -1;
    if (timeout_ms >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      wait = static_cast<int>(left.count());
    }
    pollfd pf{fd, POLLIN, 0};
    int pr = ::poll(&pf, 1, wait);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return false;
    ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// What the two sides exchange over TCP.
struct Setup {
  uint32_t magic;
  uint32_t rounds;
  uint64_t seed;
  uint64_t max_write;
};
struct QpInfo {
  uint32_t qpn, psn;
  uint8_t gid[16];
  uint64_t mr_addr, atomic_addr;
  uint32_t mr_rkey, atomic_rkey;
};
struct Done {
  uint32_t rounds;  // rounds whose completions the initiator has seen
  uint32_t failed;  // 1: the initiator found a fault; the target still reports what it sees
};
struct Result {
  int32_t code;
  char text[1020];
};

// The verbs objects of one side.
struct Rc {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* ch = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_device_attr attr{};
  ibv_gid gid{};
};

ibv_context* open_device(const char* name, const char* ip) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return nullptr;
  ibv_gid want{};
  want.raw[10] = want.raw[11] = 0xff;
  if (inet_pton(AF_INET, ip, want.raw + 12) != 1) {
    say("bad address %s", ip);
    ibv_free_device_list(list);
    return nullptr;
  }
  ibv_context* found = nullptr;
  for (int i = 0; i < n && !found; ++i) {
    if (name && std::strcmp(name, ibv_get_device_name(list[i])) != 0) continue;
    ibv_context* c = ibv_open_device(list[i]);
    if (!c) continue;
    ibv_gid g{};
    if (name || (ibv_query_gid(c, kPort, 0, &g) == 0 && std::memcmp(g.raw, want.raw, 16) == 0)) {
      found = c;
    } else {
      ibv_close_device(c);
    }
  }
  ibv_free_device_list(list);
  return found;
}

// Releases everything, so the library's closing reports (SOFTRDMA_COUNTERS, the impairment tallies) print.
void close_rc(Rc& rc, std::initializer_list<ibv_mr*> mrs) {
  if (rc.qp) ibv_destroy_qp(rc.qp);
  for (ibv_mr* m : mrs)
    if (m) ibv_dereg_mr(m);
  if (rc.cq) ibv_destroy_cq(rc.cq);
  if (rc.ch) ibv_destroy_comp_channel(rc.ch);
  if (rc.pd) ibv_dealloc_pd(rc.pd);
  if (rc.ctx) ibv_close_device(rc.ctx);
  rc = {};
}

bool make_rc(Rc& rc, const char* dev, const char* ip, int send_wr, int recv_wr) {
  rc.ctx = open_device(dev, ip);
  if (!rc.ctx) {
    say("no RDMA device %s%s", dev ? dev : "bound to ", dev ? "" : ip);
    return false;
  }
  if (ibv_query_device(rc.ctx, &rc.attr) || ibv_query_gid(rc.ctx, kPort, 0, &rc.gid)) return false;
  if (rc.attr.max_qp_rd_atom < 16 || rc.attr.max_qp_init_rd_atom < 16) {
    say("the device allows %d/%d outstanding READ/ATOMIC, 16 needed", rc.attr.max_qp_rd_atom,
        rc.attr.max_qp_init_rd_atom);
    return false;
  }
  rc.pd = ibv_alloc_pd(rc.ctx);
  rc.ch = ibv_create_comp_channel(rc.ctx);
  if (!rc.pd || !rc.ch) return false;
  rc.cq = ibv_create_cq(rc.ctx, 256, nullptr, rc.ch, 0);
  if (!rc.cq) return false;
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = rc.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = static_cast<uint32_t>(send_wr);
  ia.cap.max_recv_wr = static_cast<uint32_t>(recv_wr);
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  rc.qp = ibv_create_qp(rc.pd, &ia);
  if (!rc.qp) return false;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = kPort;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                      IBV_ACCESS_REMOTE_ATOMIC;
  return ibv_modify_qp(rc.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0;
}

// RTR and RTS with the workload's parameters.
bool connect_rc(Rc& rc, uint32_t my_psn, const QpInfo& peer) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = kPort;
  if (ibv_modify_qp(rc.qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return false;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 12;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = my_psn;
  a.max_rd_atomic = 16;
  return ibv_modify_qp(rc.qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC) == 0;
}

// Polls up to `want` completions into wc, sleeping on the completion channel (two cores shared with
// the transport's threads: no busy polling). Returns how many arrived before timeout_ms.
int wait_cq(Rc& rc, ibv_wc* wc, int want, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int got = 0;
  for (;;) {
    int n = ibv_poll_cq(rc.cq, want - got, wc + got);
    if (n < 0) return -1;
    got += n;
    if (got == want) return got;
    if (ibv_req_notify_cq(rc.cq, 0)) return -1;
    n = ibv_poll_cq(rc.cq, want - got, wc + got);  // one may have come before the arm
    if (n < 0) return -1;
    got += n;
    if (got == want) return got;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return got;
    pollfd pf{rc.ch->fd, POLLIN, 0};
    if (::poll(&pf, 1, static_cast<int>(std::min<int64_t>(left.count(), 100))) > 0) {
      ibv_cq* cq;
      void* ctx;
      if (ibv_get_cq_event(rc.ch, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
    }
  }
}

const char* op_name(int kind) {
  static const char* names[] = {"WRITE", "READ", "FETCH_ADD", "SEND"};
  return kind >= 0 && kind < 4 ? names[kind] : "?";
}

// ---------------------------------------------------------------------------------------------- initiator

struct Initiator {
  Options o;
  Rc rc;
  int sock = -1;
  int hang_ms = 60000;
  QpInfo peer{};
  uint8_t* local = nullptr;   // WRITE sources
  uint8_t* readbuf = nullptr;
  uint8_t* shadow = nullptr;  // what the target's MR must hold
  uint8_t* sendbuf = nullptr;
  uint64_t* atomic_res = nullptr;
  ibv_mr *local_mr = nullptr, *read_mr = nullptr, *send_mr = nullptr, *atomic_mr = nullptr;
  uint64_t expect_atomic = 0;

  // Prints what went wrong, what the target sees of its own memory and SENDs, and how to run this again.
  int fail(int code, uint32_t round, const std::string& what) {
    say("FAIL seed %" PRIu64 " round %u: %s", o.seed, round, what.c_str());
    Result res{};
    Done d{rounds_done, 1};
    if (sock >= 0 && write_all(sock, &d, sizeof d) && read_all(sock, &res, sizeof res, 20000))
      say("the target's own view after %u rounds: %s", rounds_done, res.text);
    say("reproduce: %s", g_repro.c_str());
    return code;
  }

  bool post(ibv_send_wr& wr) {
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(rc.qp, &wr, &bad) == 0;
  }

  bool post_read(uint64_t remote_off, uint64_t len, uint64_t wr_id) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(readbuf), static_cast<uint32_t>(len), read_mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = peer.mr_addr + remote_off;
    wr.wr.rdma.rkey = peer.mr_rkey;
    return post(wr);
  }

  // One READ of the target's memory into readbuf, waited for. Empty on success, else why not.
  std::string read_sync(uint64_t remote_off, uint64_t len) {
    if (!post_read(remote_off, len, ~0ull)) return "ibv_post_send(READ) failed";
    ibv_wc wc{};
    int n = wait_cq(rc, &wc, 1, hang_ms);
    if (n != 1) return "no completion for a READ within " + std::to_string(hang_ms / 1000) + " s";
    if (wc.status != IBV_WC_SUCCESS) return std::string("READ completed with ") + ibv_wc_status_str(wc.status);
    return {};
  }

  uint32_t rounds_done = 0;  // for provenance()

  // A READ disagrees with the shadow: read the range again to tell a damaged READ response (the
  // memory is right) from damaged memory (a WRITE placed wrong bytes).
  int data_mismatch(uint32_t round, const char* what, uint64_t off, uint64_t len) {
    std::string msg = std::string(what) + " of remote [" + std::to_string(off) + ", +" + std::to_string(len) +
                      ") differs from the shadow: " +
                      describe_diff(shadow + off, readbuf, len, off, [this](uint64_t x) { return provenance(o, rounds_done, x); });
    for (uint64_t i = 0; i < len; ++i) {
      if (readbuf[i] != shadow[off + i]) {
        msg += "\n  the first damaged byte is in response packet " + std::to_string(i / 1024) + " of " +
               std::to_string((len + 1023) / 1024) + " of this READ";
        break;
      }
    }
    std::vector<uint8_t> first(readbuf, readbuf + len);
    std::string again = read_sync(off, len);
    if (!again.empty()) {
      msg += "\n  reading it again failed: " + again;
    } else if (std::memcmp(readbuf, shadow + off, len) == 0) {
      msg += "\n  read again it matches: the READ response was damaged in flight, the memory is right";
    } else if (std::memcmp(readbuf, first.data(), len) == 0) {
      msg += "\n  read again it is the same: the target's memory is wrong (a WRITE placed damaged data)";
    } else {
      msg += "\n  read again it differs from both: " +
             describe_diff(shadow + off, readbuf, len, off, [this](uint64_t x) { return provenance(o, rounds_done, x); });
    }
    return fail(kData, round, msg);
  }

  int round(uint32_t r) {
    const Plan p = plan(o, r);
    rounds_done = r + 1;
    fill(local + p.src_off, p.write_len, key(o.seed, kKeyWrite, r));
    std::memcpy(shadow + p.dst_off, local + p.src_off, p.write_len);
    const uint64_t base = static_cast<uint64_t>(r) * 4;

    ibv_sge wsge{reinterpret_cast<uintptr_t>(local + p.src_off), static_cast<uint32_t>(p.write_len),
                 local_mr->lkey};
    ibv_send_wr w{};
    w.wr_id = base + 0;
    w.sg_list = &wsge;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma.remote_addr = peer.mr_addr + p.dst_off;
    w.wr.rdma.rkey = peer.mr_rkey;
    if (!post(w)) return fail(kStatus, r, "ibv_post_send(WRITE) failed");
    std::memset(readbuf, 0, p.read_len);  // stale bytes must not pass for a READ's
    if (!post_read(p.read_off, p.read_len, base + 1)) return fail(kStatus, r, "ibv_post_send(READ) failed");
    *atomic_res = 0;
    ibv_sge asge{reinterpret_cast<uintptr_t>(atomic_res), 8, atomic_mr->lkey};
    ibv_send_wr a{};
    a.wr_id = base + 2;
    a.sg_list = &asge;
    a.num_sge = 1;
    a.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    a.send_flags = IBV_SEND_SIGNALED;
    a.wr.atomic.remote_addr = peer.atomic_addr;
    a.wr.atomic.rkey = peer.atomic_rkey;
    a.wr.atomic.compare_add = p.add;
    if (!post(a)) return fail(kStatus, r, "ibv_post_send(FETCH_ADD) failed");
    const size_t msg_len = build_message(o, r, sendbuf);
    ibv_sge ssge{reinterpret_cast<uintptr_t>(sendbuf), static_cast<uint32_t>(msg_len), send_mr->lkey};
    ibv_send_wr s{};
    s.wr_id = base + 3;
    s.sg_list = &ssge;
    s.num_sge = 1;
    s.opcode = IBV_WR_SEND;
    s.send_flags = IBV_SEND_SIGNALED;
    if (!post(s)) return fail(kStatus, r, "ibv_post_send(SEND) failed");

    ibv_wc wc[4];
    const int n = wait_cq(rc, wc, 4, hang_ms);
    static const ibv_wc_opcode want_op[4] = {IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD, IBV_WC_SEND};
    for (int i = 0; i < std::max(n, 0); ++i) {
      char line[256];
      if (wc[i].wr_id != base + static_cast<uint64_t>(i)) {
        std::snprintf(line, sizeof line, "completion %d is wr_id %" PRIu64 ", expected %" PRIu64 " (%s)", i,
                      wc[i].wr_id, base + static_cast<uint64_t>(i), op_name(i));
        return fail(kStatus, r, line);
      }
      if (wc[i].status != IBV_WC_SUCCESS) {
        std::snprintf(line, sizeof line, "%s (%" PRIu64 " B at remote offset %" PRIu64 ") completed with %s (vendor_err %u)",
                      op_name(i), i == 0 ? p.write_len : i == 1 ? p.read_len : i == 2 ? 8 : msg_len,
                      i == 0 ? p.dst_off : i == 1 ? p.read_off : 0, ibv_wc_status_str(wc[i].status), wc[i].vendor_err);
        return fail(kStatus, r, line);
      }
      if (wc[i].opcode != want_op[i]) {
        std::snprintf(line, sizeof line, "%s completed with opcode %d", op_name(i), wc[i].opcode);
        return fail(kStatus, r, line);
      }
    }
    if (n != 4) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "HANG: %d of 4 completions after %d s; missing from %s on (WRITE %" PRIu64 " B, READ %" PRIu64
                    " B, SEND %zu B)",
                    std::max(n, 0), hang_ms / 1000, op_name(std::max(n, 0)), p.write_len, p.read_len, msg_len);
      return fail(kHang, r, line);
    }
    if (*atomic_res != expect_atomic) {
      char line[256];
      std::snprintf(line, sizeof line, "FETCH_ADD returned %#" PRIx64 ", expected %#" PRIx64 " (difference %#" PRIx64 ")",
                    *atomic_res, expect_atomic, *atomic_res - expect_atomic);
      return fail(kAtomic, r, line);
    }
    expect_atomic += p.add;
    if (std::memcmp(readbuf, shadow + p.read_off, p.read_len) != 0)
      return data_mismatch(r, "the READ after the WRITE", p.read_off, p.read_len);
    return kOk;
  }

  // The whole target MR and the atomic word, read back.
  int final_check() {
    for (uint64_t off = 0; off < kMrSize; off += kReadBuf) {
      std::string e = read_sync(off, kReadBuf);
      if (!e.empty()) return fail(e.find("no completion") == 0 ? kHang : kStatus, o.rounds, "final read: " + e);
      if (std::memcmp(readbuf, shadow + off, kReadBuf) != 0)
        return data_mismatch(o.rounds, "the final read-back", off, kReadBuf);
    }
    // The atomic word through a READ (the atomic MR allows it) and a FETCH_ADD of 0.
    *atomic_res = 0;
    ibv_sge asge{reinterpret_cast<uintptr_t>(atomic_res), 8, atomic_mr->lkey};
    ibv_send_wr a{};
    a.wr_id = ~1ull;
    a.sg_list = &asge;
    a.num_sge = 1;
    a.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    a.send_flags = IBV_SEND_SIGNALED;
    a.wr.atomic.remote_addr = peer.atomic_addr;
    a.wr.atomic.rkey = peer.atomic_rkey;
    a.wr.atomic.compare_add = 0;
    if (!post(a)) return fail(kStatus, o.rounds, "ibv_post_send(final FETCH_ADD) failed");
    ibv_wc wc{};
    if (wait_cq(rc, &wc, 1, hang_ms) != 1) return fail(kHang, o.rounds, "HANG: no completion for the final FETCH_ADD");
    if (wc.status != IBV_WC_SUCCESS)
      return fail(kStatus, o.rounds, std::string("final FETCH_ADD completed with ") + ibv_wc_status_str(wc.status));
    if (*atomic_res != expect_atomic) {
      char line[160];
      std::snprintf(line, sizeof line, "final atomic value %#" PRIx64 ", expected %#" PRIx64, *atomic_res, expect_atomic);
      return fail(kAtomic, o.rounds, line);
    }
    return kOk;
  }

  int run(const char* host, const char* port, const char* dev, const char* ip) {
    addrinfo hints{}, *ai = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai) return fail(kSetup, 0, "cannot resolve the target");
    sock = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    // The target may still be starting: retry for a while.
    bool connected = false;
    for (int i = 0; i < 100 && !connected; ++i) {
      connected = ::connect(sock, ai->ai_addr, ai->ai_addrlen) == 0;
      if (!connected) {
        ::close(sock);
        sock = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ::usleep(100000);
      }
    }
    freeaddrinfo(ai);
    if (!connected) return fail(kSetup, 0, std::string("cannot connect to ") + host + ":" + port);
    int one = 1;
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

    if (!make_rc(rc, dev, ip, 16, 1)) return fail(kSetup, 0, "verbs set-up failed");
    local = static_cast<uint8_t*>(std::aligned_alloc(4096, kMrSize));
    readbuf = static_cast<uint8_t*>(std::aligned_alloc(4096, kReadBuf));
    shadow = static_cast<uint8_t*>(std::aligned_alloc(4096, kMrSize));
    sendbuf = static_cast<uint8_t*>(std::aligned_alloc(4096, kMaxMsg));
    atomic_res = static_cast<uint64_t*>(std::aligned_alloc(64, 64));
    if (!local || !readbuf || !shadow || !sendbuf || !atomic_res) return fail(kSetup, 0, "out of memory");
    fill(local, kMrSize, key(o.seed, kKeyInit) ^ 1);
    uint64_t ignored;
    replay_target(o, 0, shadow, &ignored);
    expect_atomic = key(o.seed, kKeyAtomic);
    // An int, not the enumerator: ibv_reg_mr's macro masks it with another enum (clang -Werror).
    const int lw = IBV_ACCESS_LOCAL_WRITE;
    local_mr = ibv_reg_mr(rc.pd, local, kMrSize, lw);
    read_mr = ibv_reg_mr(rc.pd, readbuf, kReadBuf, lw);
    send_mr = ibv_reg_mr(rc.pd, sendbuf, kMaxMsg, lw);
    atomic_mr = ibv_reg_mr(rc.pd, atomic_res, 64, lw);
    if (!local_mr || !read_mr || !send_mr || !atomic_mr) return fail(kSetup, 0, "ibv_reg_mr failed");

    // Most runs cross the PSN wrap.
    const uint32_t psn = (0xffffffu - static_cast<uint32_t>(key(o.seed, kKeyPsnI) % 20000)) & 0xffffff;
    Setup su{kSetupMagic, o.rounds, o.seed, o.max_write};
    QpInfo me{rc.qp->qp_num, psn, {}, 0, 0, 0, 0};
    std::memcpy(me.gid, rc.gid.raw, 16);
    if (!write_all(sock, &su, sizeof su) || !write_all(sock, &me, sizeof me) ||
        !read_all(sock, &peer, sizeof peer, 30000))
      return fail(kSetup, 0, "the QP exchange with the target failed");
    if (!connect_rc(rc, psn, peer)) return fail(kSetup, 0, "ibv_modify_qp to RTR/RTS failed");
    char ready = 0;
    if (!read_all(sock, &ready, 1, 30000) || ready != 'r') return fail(kSetup, 0, "the target never got ready");

    say("seed %" PRIu64 ", %u rounds, writes up to %" PRIu64 " B, start PSN %#x", o.seed, o.rounds, o.max_write, psn);
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    for (uint32_t r = 0; r < o.rounds; ++r) {
      if (int e = round(r)) return e;
      bytes += plan(o, r).write_len;
    }
    if (int e = final_check()) return e;
    Done d{o.rounds, 0};
    Result res{};
    if (!write_all(sock, &d, sizeof d) || !read_all(sock, &res, sizeof res, hang_ms)) {
      say("FAIL seed %" PRIu64 ": no verdict from the target", o.seed);
      return kGone;
    }
    if (res.code != 0) {
      say("FAIL seed %" PRIu64 ": the target reports: %s", o.seed, res.text);
      say("reproduce: %s", g_repro.c_str());
      return res.code;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    close_rc(rc, {local_mr, read_mr, send_mr, atomic_mr});
    say("PASS seed %" PRIu64 ": %u rounds exact (%.1f MB written) in %.1f s; target: %s", o.seed, o.rounds,
        static_cast<double>(bytes) / 1e6, s, res.text);
    return kOk;
  }
};

// ---------------------------------------------------------------------------------------------- target

struct Target {
  Options o;
  Rc rc;
  int sock = -1;
  int hang_ms = 60000;
  uint8_t* mem = nullptr;
  uint64_t* atomic = nullptr;
  uint8_t* recvbuf = nullptr;
  ibv_mr *mem_mr = nullptr, *atomic_mr = nullptr, *recv_mr = nullptr;
  uint32_t next_seq = 0;

  int fail(int code, const std::string& what) {
    say("FAIL seed %" PRIu64 ": %s", o.seed, what.c_str());
    Result res{};
    res.code = code;
    std::snprintf(res.text, sizeof res.text, "%s", what.c_str());
    if (sock >= 0) (void)write_all(sock, &res, sizeof res);
    return code;
  }

  bool post_recv(int i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(recvbuf + static_cast<size_t>(i) * kMaxMsg), kMaxMsg, recv_mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = static_cast<uint64_t>(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(rc.qp, &wr, &bad) == 0;
  }

  // Checks one received message against the one the seed says comes next. Empty when it is right.
  std::string check_message(const ibv_wc& wc) {
    char line[512];
    if (wc.status != IBV_WC_SUCCESS) {
      std::snprintf(line, sizeof line, "receive %u completed with %s", next_seq, ibv_wc_status_str(wc.status));
      return line;
    }
    if (next_seq >= o.rounds) return "a SEND beyond the last round arrived";
    const uint8_t* m = recvbuf + wc.wr_id * kMaxMsg;
    MsgHeader h;
    std::memcpy(&h, m, sizeof h);
    std::vector<uint8_t> want(kMaxMsg);
    const size_t want_len = build_message(o, next_seq, want.data());
    const uint64_t sum = h.len <= kMaxPayload ? checksum(m + sizeof h, h.len, h.seq) : 0;
    if (wc.byte_len < sizeof h || h.magic != kMsgMagic || h.seq != next_seq || h.len != wc.byte_len - sizeof h ||
        h.sum != sum || wc.byte_len != want_len || std::memcmp(m, want.data(), want_len) != 0) {
      std::snprintf(line, sizeof line,
                    "round %u: SEND received wrong: %u B (want %zu), magic %s, seq %" PRIu64 " (want %u), "
                    "length field %u, checksum %s",
                    next_seq, wc.byte_len, want_len, h.magic == kMsgMagic ? "ok" : "bad", h.seq, next_seq, h.len,
                    h.sum == sum ? "ok" : "bad");
      std::string s = line;
      if (wc.byte_len == want_len) s += "; " + describe_diff(want.data(), m, want_len, 0) + " (message offsets)";
      return s;
    }
    ++next_seq;
    return {};
  }

  int run(const char* port, const char* dev, const char* ip) {
    int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(std::atoi(port)));
    if (::bind(ls, reinterpret_cast<sockaddr*>(&sa), sizeof sa) || ::listen(ls, 1))
      return fail(kSetup, std::string("cannot listen on TCP port ") + port + ": " + std::strerror(errno));
    sock = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
    ::close(ls);
    if (sock < 0) return fail(kSetup, "accept failed");
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Setup su{};
    QpInfo peer{};
    if (!read_all(sock, &su, sizeof su, 30000) || su.magic != kSetupMagic || !read_all(sock, &peer, sizeof peer, 30000))
      return fail(kSetup, "no set-up from the initiator");
    o.seed = su.seed;
    o.rounds = su.rounds;
    o.max_write = su.max_write;

    if (!make_rc(rc, dev, ip, 1, kRecvs)) return fail(kSetup, "verbs set-up failed");
    mem = static_cast<uint8_t*>(std::aligned_alloc(4096, kMrSize));
    atomic = static_cast<uint64_t*>(std::aligned_alloc(64, kAtomicMr));
    recvbuf = static_cast<uint8_t*>(std::aligned_alloc(4096, kRecvs * kMaxMsg));
    if (!mem || !atomic || !recvbuf) return fail(kSetup, "out of memory");
    uint64_t a0;
    replay_target(o, 0, mem, &a0);
    std::memset(atomic, 0, kAtomicMr);
    *atomic = a0;
    const int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    mem_mr = ibv_reg_mr(rc.pd, mem, kMrSize, rw);
    atomic_mr = ibv_reg_mr(rc.pd, atomic, kAtomicMr, rw | IBV_ACCESS_REMOTE_ATOMIC);
    const int lw = IBV_ACCESS_LOCAL_WRITE;  // an int: see the initiator
    recv_mr = ibv_reg_mr(rc.pd, recvbuf, kRecvs * kMaxMsg, lw);
    if (!mem_mr || !atomic_mr || !recv_mr) return fail(kSetup, "ibv_reg_mr failed");
    for (int i = 0; i < kRecvs; ++i)
      if (!post_recv(i)) return fail(kSetup, "ibv_post_recv failed");
    const uint32_t psn = static_cast<uint32_t>(key(o.seed, kKeyPsnT)) & 0xffffff;
    QpInfo me{rc.qp->qp_num, psn, {}, reinterpret_cast<uintptr_t>(mem), reinterpret_cast<uintptr_t>(atomic),
              mem_mr->rkey, atomic_mr->rkey};
    std::memcpy(me.gid, rc.gid.raw, 16);
    if (!connect_rc(rc, psn, peer)) return fail(kSetup, "ibv_modify_qp to RTR/RTS failed");
    if (!write_all(sock, &me, sizeof me) || !write_all(sock, "r", 1)) return fail(kGone, "the initiator went away");
    say("seed %" PRIu64 ", %u rounds, start PSN %#x", o.seed, o.rounds, psn);

    // Receive and check SENDs until the initiator says it is done.
    auto last_progress = std::chrono::steady_clock::now();
    Done d{};
    bool done = false;
    std::chrono::steady_clock::time_point done_at{};
    auto idle_since_done = [&] { return std::chrono::steady_clock::now() - done_at; };
    for (;;) {
      ibv_wc wc[16];
      int n = ibv_poll_cq(rc.cq, 16, wc);
      if (n < 0) return fail(kStatus, "ibv_poll_cq failed");
      for (int i = 0; i < n; ++i) {
        std::string e = check_message(wc[i]);
        if (!e.empty()) return fail(wc[i].status != IBV_WC_SUCCESS ? kStatus : kSendBad, e);
        if (!post_recv(static_cast<int>(wc[i].wr_id))) return fail(kStatus, "ibv_post_recv failed");
      }
      if (n > 0) last_progress = std::chrono::steady_clock::now();
      if (done && (next_seq >= d.rounds || (d.failed && idle_since_done() > std::chrono::seconds(2)))) break;
      if (n == 16) continue;
      if (ibv_req_notify_cq(rc.cq, 0)) return fail(kStatus, "ibv_req_notify_cq failed");
      if (ibv_poll_cq(rc.cq, 0, wc) < 0) return fail(kStatus, "ibv_poll_cq failed");
      const auto idle = std::chrono::steady_clock::now() - last_progress;
      if (idle > std::chrono::milliseconds(hang_ms)) {
        return fail(done ? kSendBad : kHang,
                    "HANG: no SEND for " + std::to_string(hang_ms / 1000) + " s; received " + std::to_string(next_seq) +
                        " of " + std::to_string(done ? d.rounds : o.rounds) +
                        (done ? " (the initiator saw every SEND complete)" : ""));
      }
      pollfd pf[2] = {{rc.ch->fd, POLLIN, 0}, {sock, POLLIN, 0}};
      // Short sleeps: a completion can have arrived between the poll above and the arm.
      if (::poll(pf, done ? 1 : 2, 50) > 0) {
        if (pf[0].revents & POLLIN) {
          ibv_cq* cq;
          void* ctx;
          if (ibv_get_cq_event(rc.ch, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
        }
        if (!done && (pf[1].revents & (POLLIN | POLLHUP | POLLERR))) {
          if (!read_all(sock, &d, sizeof d, 5000)) {
            say("FAIL seed %" PRIu64 ": the initiator went away after %u SENDs", o.seed, next_seq);
            return kGone;
          }
          done = true;
          done_at = last_progress = std::chrono::steady_clock::now();
          hang_ms = std::min(hang_ms, 10000);  // every SEND has completed at the initiator: nothing more is coming
        }
      }
    }
    if (d.rounds > o.rounds) return fail(kSetup, "the initiator claims more rounds than it announced");
    if (!d.failed && d.rounds != o.rounds) return fail(kSendBad, "the initiator stopped early");
    if (next_seq < d.rounds)
      return fail(kSendBad, std::to_string(next_seq) + " SENDs received of " + std::to_string(d.rounds) +
                                " the initiator saw complete");

    // The memory and atomic word the seed says `d.rounds` rounds leave.
    std::vector<uint8_t> want(kMrSize);
    uint64_t want_atomic;
    replay_target(o, d.rounds, want.data(), &want_atomic);
    if (std::memcmp(mem, want.data(), kMrSize) != 0)
      return fail(kData, "the target's memory differs from the replayed shadow: " +
                             describe_diff(want.data(), mem, kMrSize, 0,
                                           [&](uint64_t x) { return provenance(o, d.rounds, x); }));
    if (*atomic != want_atomic) {
      char line[160];
      std::snprintf(line, sizeof line, "atomic word %#" PRIx64 ", expected %#" PRIx64, *atomic, want_atomic);
      return fail(kAtomic, line);
    }
    for (size_t i = 8; i < kAtomicMr; ++i)
      if (reinterpret_cast<uint8_t*>(atomic)[i] != 0) return fail(kAtomic, "bytes beside the atomic word changed");
    Result res{};
    std::snprintf(res.text, sizeof res.text, "%u SENDs in order and intact, memory and atomic word exact", next_seq);
    (void)write_all(sock, &res, sizeof res);
    if (d.failed) {
      say("the initiator failed after %u rounds; here: %s", d.rounds, res.text);
      return kOk;
    }
    close_rc(rc, {mem_mr, atomic_mr, recv_mr});
    say("PASS seed %" PRIu64 ": %s", o.seed, res.text);
    return kOk;
  }
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: rc_verifier --listen PORT [--ip ADDR | --dev NAME] [--hang-s S]\n"
               "       rc_verifier --connect HOST --port PORT --seed S [--rounds R] [--max-write BYTES]\n"
               "                   [--ip ADDR | --dev NAME] [--hang-s S]\n");
  std::exit(kSetup);
}

}  // namespace

int main(int argc, char** argv) {
  const char *listen_port = nullptr, *host = nullptr, *port = nullptr, *dev = nullptr, *ip = "127.0.0.1";
  Options o;
  int hang_s = 60;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage();
    const char* v = argv[++i];
    if (a == "--listen") listen_port = v;
    else if (a == "--connect") host = v;
    else if (a == "--port") port = v;
    else if (a == "--seed") o.seed = std::strtoull(v, nullptr, 0);
    else if (a == "--rounds") o.rounds = static_cast<uint32_t>(std::strtoul(v, nullptr, 0));
    else if (a == "--max-write") o.max_write = std::strtoull(v, nullptr, 0);
    else if (a == "--dev") dev = v;
    else if (a == "--ip") ip = v;
    else if (a == "--hang-s") hang_s = std::atoi(v);
    else usage();
  }
  if (!listen_port == !host || (host && !port) || o.max_write < 1 || o.max_write > kReadBuf || hang_s < 1) usage();
  // The line that reproduces this side, with the faults it ran under.
  const char* impair = std::getenv("SOFTRDMA_IMPAIR");
  const char* direct = std::getenv("SOFTRDMA_DIRECT");
  g_repro = std::string("SOFTRDMA_IMPAIR='") + (impair ? impair : "") + "' SOFTRDMA_DIRECT=" + (direct ? direct : "") +
            " softrdma run";
  for (int i = 0; i < argc; ++i) g_repro += std::string(" ") + argv[i];
  g_repro += "   (with the target: same environment, rc_verifier --listen PORT)";
  if (listen_port) {
    g_role = "rc_verifier target";
    Target t;
    t.hang_ms = hang_s * 1000;
    return t.run(listen_port, dev, ip);
  }
  g_role = "rc_verifier initiator";
  Initiator in;
  in.o = o;
  in.hang_ms = hang_s * 1000;
  return in.run(host, port, dev, ip);
}
