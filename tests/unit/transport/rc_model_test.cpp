// Seeded randomized RC test against a reference model (issue 12). Each seed draws a connection (path
// MTU, start PSNs near the 24-bit wrap, max_rd_atomic), a workload of mixed WRITE, WRITE_IMM, READ,
// CMP_SWAP, FETCH_ADD, SEND and SEND_IMM with overlapping targets, now and then one deliberately bad
// request (wrong rkey, out of range, missing access), and a fault schedule (drop, duplicate, delay,
// bit flips, hold until the sender's next send). Two engines run it in virtual time; the model then
// checks every completion and every byte:
//   - completions in posting order; before the first error all succeed, the bad request gets
//     REM_ACCESS_ERR (or, when its NAK was lost, an earlier WQE RETRY_EXC_ERR), all after it flush;
//   - the responder's memory is a shadow with every request before the bad one applied exactly once;
//   - READ and ATOMIC results, and every received message, are what the model computed.
// RcModel.Seeds runs them on a network without segmentation offload; RcModel.SeedsGso runs the same
// seeds with it (MemoryNetwork::Options::gso: packets to a context's port leave as segmented flights,
// and each fault then strikes a whole flight, a bit flip one segment of it); RcModel.SeedsIpv6 runs the
// first 500 of them between IPv6 addresses (RoCEv2 over UDP/IPv6: the IPv6 ICRC pseudo-header).
// RC_MODEL_SEEDS=N (default 2000; RC_MODEL_GSO_SEEDS and RC_MODEL_IPV6_SEEDS, if set, for SeedsGso and
// SeedsIpv6 alone) and RC_MODEL_FIRST=S
// choose the seeds; RC_MODEL_BIG=1 draws sizes up to 4 MiB. RC_MODEL_TRACE=1 prints every datagram
// (every segment of a flight) and its fate. A failing seed prints its one-line reproduction.
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>

#include "fabric.h"
#include "net/impairment.h"
#include "wire/headers.h"

namespace softrdma::transport::test {
namespace {

const wire::IpAddress kIpA = wire::IpAddress::v4(0x0100000A), kIpB = wire::IpAddress::v4(0x0200000A);
wire::IpAddress ipv6(const char* text) {
  wire::IpAddress a;
  if (!wire::parse(text, &a)) std::abort();
  return a;
}
const wire::IpAddress kIp6A = ipv6("fd00:5eed::a"), kIp6B = ipv6("fd00:5eed::b");
constexpr uint32_t kAll = core::kLocalWrite | core::kRemoteWrite | core::kRemoteRead | core::kRemoteAtomic;

uint64_t env_u64(const char* name, uint64_t dflt) {
  const char* s = getenv(name);
  return s && *s ? strtoull(s, nullptr, 0) : dflt;
}

struct Op {
  WrOp op;
  uint64_t len = 0;
  uint64_t roff = 0;     // target offset in the remote region (or word index for atomics)
  uint64_t loff = 0;     // source offset in src (WRITE/SEND), or result offset in sink (READ/ATOMIC)
  uint64_t cmp = 0, swap = 0;
  uint32_t imm = 0;
  bool fence = false;
  enum class Bad : uint8_t { None, Rkey, Range, Access } bad = Bad::None;
  bool consumes_receive() const {
    return op == WrOp::Send || op == WrOp::SendImm || op == WrOp::WriteImm;
  }
};

class Seed {
 public:
  Seed(uint64_t seed, bool big, bool gso, bool v6)
      : seed_(seed), rng_(net::ImpairmentRng::mix(seed, 0x5EED)), big_(big), gso_(gso), v6_(v6) {}
  // Returns "" or what went wrong.
  std::string run();

 private:
  uint64_t draw_len(uint64_t max) {
    // Log-distributed: zero-length and single-packet messages as often as large ones.
    uint32_t bits = rng_.below(static_cast<uint32_t>(64 - __builtin_clzll(max)) + 1);
    uint64_t len = bits ? (uint64_t{1} << (bits - 1)) + rng_.below(1u << std::min(bits - 1, 31u)) : 0;
    return std::min(len, max);
  }
  uint64_t seed_;
  net::ImpairmentRng rng_;
  bool big_;
  bool gso_;
  bool v6_;
  bool trace_ = getenv("RC_MODEL_TRACE") != nullptr;
};

std::string Seed::run() {
  std::ostringstream why;
  static const uint32_t kMtus[] = {256, 512, 1024, 2048, 4096};
  RcParams p;
  p.mtu = kMtus[rng_.below(5)];
  p.psn_a = rng_.below(2) ? 0xFFFFFF - rng_.below(48) : rng_.below(1u << 24);
  p.psn_b = rng_.below(2) ? 0xFFFFFF - rng_.below(48) : rng_.below(1u << 24);
  p.max_rd_atomic = 1 + rng_.below(16);
  p.timeout = 8;  // 1 ms: virtual time, so only the count of expiries matters
  p.min_rnr_timer = 1;
  p.max_wr = 128;
  const uint64_t kRemote = big_ ? (8u << 20) : (1u << 20);
  const uint64_t kMaxLen = big_ ? (4u << 20) : (64u << 10);
  const uint64_t kMaxSend = 16u << 10;

  Fabric f(net::MemoryNetwork::Options{.latency_ns = 1000 + rng_.below(20000), .gso = gso_});
  const wire::IpAddress ip_a = v6_ ? kIp6A : kIpA;
  Host& ha = f.add_host(ip_a);
  Host& hb = f.add_host(v6_ ? kIp6B : kIpB);
  // Faults: each kind in half the seeds, at up to 5% (RETRY_EXC needs 8 losses in a row then).
  net::ImpairmentRng frng(net::ImpairmentRng::mix(seed_, 0xFA17));
  auto rate = [&](double max) { return frng.below(2) ? frng.uniform() * max : 0.0; };
  uint64_t corrupted = 0;  // packets delivered with a flipped bit (a flip strikes one segment of a flight)
  const double p_drop = rate(0.05), p_dup = rate(0.05), p_hold = rate(0.05), p_delay = rate(0.05), p_flip = rate(0.01);
  f.net.set_policy([&](const net::MemoryNetwork::Offer& o) {
    net::MemoryNetwork::Fate fate;
    fate.drop = frng.uniform() < p_drop;
    fate.duplicate = frng.uniform() < p_dup;
    fate.hold = frng.uniform() < p_hold;
    if (frng.uniform() < p_delay) fate.delay_ns = frng.below(200000);
    if (frng.uniform() < p_flip) fate.flip_bit = frng.below(o.len * 8);
    if (fate.flip_bit != ~0u && !fate.drop) corrupted += fate.duplicate ? 2 : 1;  // one packet per copy
    if (trace_)
      for (const Segment& s : segments(o)) {
        const bool flipped = fate.flip_bit != ~0u && fate.flip_bit / 8 >= s.offset && fate.flip_bit / 8 < s.offset + s.len;
        std::printf("%12llu %s %s%s%s%s%s%s\n", static_cast<unsigned long long>(f.now()),
                    o.from.ip == ip_a ? "a>" : "b>", describe(view(s.data, s.len)).c_str(),
                    o.seg_size ? (" [" + std::to_string(s.offset / o.seg_size) + "]").c_str() : "",
                    fate.drop ? " DROP" : "", fate.duplicate ? " DUP" : "", fate.hold ? " HOLD" : "",
                    flipped ? " FLIP" : "");
      }
    return fate;
  });
  RcPair pair = connect_rc(f, ha, hb, p);
  if (!pair.a.qp || !pair.b.qp) return "QP creation failed";
  struct Cleanup {
    RcPair& p;
    ~Cleanup() {
      destroy(p.a);
      destroy(p.b);
    }
  } cleanup{pair};

  // The workload.
  const int n = 4 + static_cast<int>(rng_.below(28));
  std::vector<Op> ops(n);
  uint64_t sink_used = 0, src_len = kMaxLen;
  int bad_at = rng_.below(10) == 0 ? static_cast<int>(rng_.below(n)) : -1;
  for (int i = 0; i < n; ++i) {
    Op& o = ops[i];
    uint32_t r = rng_.below(100);
    o.op = r < 28 ? WrOp::Write : r < 34 ? WrOp::WriteImm : r < 54 ? WrOp::Read : r < 62 ? WrOp::CompareSwap
           : r < 72 ? WrOp::FetchAdd : r < 92 ? WrOp::Send : WrOp::SendImm;
    if (i == bad_at && (o.op == WrOp::Send || o.op == WrOp::SendImm)) o.op = WrOp::Write;
    o.imm = static_cast<uint32_t>(rng_.next());
    if (o.op == WrOp::CompareSwap || o.op == WrOp::FetchAdd) {
      o.len = 8;
      o.roff = rng_.below(8);  // few words: atomics on the same word, in order
      o.cmp = rng_.below(2) ? 0 : rng_.next();  // CmpSwap: sometimes equal to the word (see below)
      o.swap = rng_.next();
      o.loff = sink_used;
      sink_used += 8;
    } else {
      o.len = draw_len(o.consumes_receive() && o.op != WrOp::WriteImm ? kMaxSend : kMaxLen);
      if (o.op == WrOp::Send || o.op == WrOp::SendImm) {
        o.loff = rng_.below(static_cast<uint32_t>(src_len - o.len + 1));
      } else {
        o.roff = rng_.below(static_cast<uint32_t>(kRemote - o.len + 1));
        if (o.op == WrOp::Read) {
          o.loff = sink_used;
          sink_used += std::max<uint64_t>(o.len, 1);  // a bad one of length 0 is given a byte (below)
        } else {
          o.loff = rng_.below(static_cast<uint32_t>(src_len - o.len + 1));
        }
      }
    }
    if (i == bad_at) o.bad = static_cast<Op::Bad>(1 + rng_.below(3));
    o.fence = rng_.below(8) == 0;
  }

  // Memory: a's source (random bytes) and result sink; b's target, atomic words, receive buffers, and
  // a region without remote access (the target of a missing-access request).
  auto src = register_region(*ha.engine, 1, src_len, core::kLocalWrite);
  auto sink = register_region(*ha.engine, 1, std::max<uint64_t>(sink_used, 8), core::kLocalWrite);
  auto remote = register_region(*hb.engine, 1, kRemote, kAll);
  auto words = register_region(*hb.engine, 1, 64, kAll);
  int receives = 0;
  for (const Op& o : ops) receives += o.consumes_receive();
  auto rbuf = register_region(*hb.engine, 1, std::max<uint64_t>(receives * kMaxSend, 8), core::kLocalWrite);
  auto closed = register_region(*hb.engine, 1, 4096, core::kLocalWrite);
  if (!src || !sink || !remote || !words || !rbuf || !closed) return "registration failed";
  for (uint64_t i = 0; i < src_len; i += 8) {
    uint64_t v = rng_.next();
    std::memcpy(src->data() + i, &v, std::min<uint64_t>(8, src_len - i));
  }
  for (uint64_t i = 0; i < kRemote; i += 8) {
    uint64_t v = rng_.next();
    std::memcpy(remote->data() + i, &v, 8);
  }
  for (int i = 0; i < 8; ++i) {
    uint64_t v = rng_.below(4);
    std::memcpy(words->data() + 8 * i, &v, 8);
  }
  // Compare values that match now and then: small words, small compares.
  for (Op& o : ops)
    if (o.op == WrOp::CompareSwap && !o.cmp) o.cmp = rng_.below(4);
  std::vector<uint8_t> shadow(remote->bytes);
  std::vector<uint8_t> shadow_words(words->bytes);

  for (int i = 0; i < receives; ++i)
    if (post(pair.b, recv_wqe(1000 + i, *rbuf, i * kMaxSend, static_cast<uint32_t>(kMaxSend))) != 0)
      return "post_recv failed";
  for (int i = 0; i < n; ++i) {
    const Op& o = ops[i];
    SendWqe w;
    uint64_t raddr = remote->addr(o.roff);
    uint32_t rkey = remote->mr.rkey;
    switch (o.op) {
      case WrOp::Read:
        w = read_wqe(i, *sink, o.loff, static_cast<uint32_t>(o.len), raddr, rkey);
        break;
      case WrOp::CompareSwap:
      case WrOp::FetchAdd:
        raddr = words->addr(8 * o.roff);
        rkey = words->mr.rkey;
        w = atomic_wqe(i, o.op, *sink, o.loff, raddr, rkey, o.cmp, o.swap);
        break;
      case WrOp::Send:
      case WrOp::SendImm:
        w = send_wqe(i, *src, o.loff, static_cast<uint32_t>(o.len), o.op);
        break;
      default:
        w = write_wqe(i, *src, o.loff, static_cast<uint32_t>(o.len), raddr, rkey);
        w.op = o.op;
    }
    w.imm_be = o.imm;
    if (o.fence) w.flags |= kFence;
    if (o.bad == Op::Bad::Rkey) w.rkey ^= 0x00C0FFEE;
    if (o.bad == Op::Bad::Range) w.remote_addr = (o.op == WrOp::CompareSwap || o.op == WrOp::FetchAdd)
                                                     ? words->addr(64)
                                                     : remote->addr(kRemote - o.len + 1 + rng_.below(64));
    if (o.bad == Op::Bad::Access) {
      w.remote_addr = closed->addr(0);
      w.rkey = closed->mr.rkey;
      if (w.length > 4096) w.sge[0].length = static_cast<uint32_t>(w.length = 4096);
    }
    // A zero-length RDMA request is not checked against its key (IBTA 9.7.4.1.x): bad ones carry a byte.
    if (o.bad != Op::Bad::None && o.len == 0) w.sge[0].length = static_cast<uint32_t>(w.length = 1);
    if (post(pair.a, w) != 0) return "post_send failed";
  }

  // Run it.
  std::vector<core::Cqe> scqes, rcqes;
  bool finished = f.run_until(
      [&] {
        for (auto& c : poll_all(pair.a, *pair.a.scq)) scqes.push_back(c);
        for (auto& c : poll_all(pair.b, *pair.b.rcq)) rcqes.push_back(c);
        // Every receive completes: consumed, or flushed once the bad request put b in error.
        return scqes.size() >= static_cast<size_t>(n) && rcqes.size() >= static_cast<size_t>(receives);
      },
      600'000'000'000ull);
  if (!finished) {
    why << "did not finish in 600 s of virtual time: " << scqes.size() << "/" << n << " send and " << rcqes.size()
        << "/" << receives << " receive completions";
    return why.str();
  }
  if (scqes.size() != static_cast<size_t>(n)) return "extra send completions";

  // Statuses: successes, then one error (the bad request, or RETRY_EXC at or before it), then flushes.
  int first_err = -1;
  for (int i = 0; i < n; ++i) {
    const core::Cqe& c = scqes[i];
    if (c.wr_id != static_cast<uint64_t>(i)) {
      why << "completion " << i << " is for wr_id " << c.wr_id;
      return why.str();
    }
    if (first_err < 0 && c.status != WcStatus::Success) first_err = i;
    WcStatus want = first_err < 0 || i < first_err ? WcStatus::Success
                    : i > first_err               ? WcStatus::WrFlushErr
                    : i == bad_at                 ? c.status  // checked below
                                                  : WcStatus::RetryExcErr;
    if (c.status != want) {
      why << "wr " << i << " (op " << int(ops[i].op) << ", bad " << int(ops[i].bad) << ") status " << int(c.status)
          << ", want " << int(want) << " (first error at " << first_err << ", bad request at " << bad_at << ")";
      return why.str();
    }
  }
  if (bad_at < 0 && first_err >= 0) {
    why << "wr " << first_err << " failed with status " << int(scqes[first_err].status) << " and no request was bad";
    return why.str();
  }
  if (bad_at >= 0) {
    if (first_err < 0 || first_err > bad_at) return "the bad request did not fail";
    WcStatus s = scqes[first_err].status;
    if (first_err == bad_at && s != WcStatus::RemAccessErr && s != WcStatus::RetryExcErr) {
      why << "the bad request completed with status " << int(s) << ", want REM_ACCESS_ERR";
      return why.str();
    }
  }
  const int applied = bad_at < 0 ? n : bad_at;  // requests the responder executed
  const int verified = first_err < 0 ? n : first_err;  // requests whose completion said success

  // The model: apply the requests before the bad one, in order, to the shadow.
  int recv_index = 0;
  for (int i = 0; i < applied; ++i) {
    const Op& o = ops[i];
    switch (o.op) {
      case WrOp::Write:
      case WrOp::WriteImm:
        if (o.len) std::memcpy(shadow.data() + o.roff, src->data() + o.loff, o.len);
        break;
      case WrOp::Read: {
        if (i >= verified || !o.len) break;
        // A later WRITE may be executed before this READ's responses have all been read out of memory
        // (IBTA 9.5: only a fence orders it after the READ's completion): bytes such a WRITE targets
        // may hold either value.
        std::vector<bool> either(o.len, false);
        for (int j = i + 1; j < applied && !ops[j].fence; ++j) {
          const Op& w = ops[j];
          if (w.op != WrOp::Write && w.op != WrOp::WriteImm) continue;
          for (uint64_t b = std::max(w.roff, o.roff); b < std::min(w.roff + w.len, o.roff + o.len); ++b)
            either[b - o.roff] = true;
        }
        for (uint64_t b = 0; b < o.len; ++b) {
          if (either[b] || sink->data()[o.loff + b] == shadow[o.roff + b]) continue;
          why << "READ wr " << i << " (" << o.len << " B at " << o.roff << ") byte " << b
              << " differs from the model";
          return why.str();
        }
        break;
      }
      case WrOp::CompareSwap:
      case WrOp::FetchAdd: {
        uint64_t orig, got;
        std::memcpy(&orig, shadow_words.data() + 8 * o.roff, 8);
        uint64_t next = o.op == WrOp::FetchAdd ? orig + o.cmp : (orig == o.cmp ? o.swap : orig);
        std::memcpy(shadow_words.data() + 8 * o.roff, &next, 8);
        std::memcpy(&got, sink->data() + o.loff, 8);
        if (i < verified && got != orig) {
          why << "ATOMIC wr " << i << " returned " << got << ", the model " << orig;
          return why.str();
        }
        break;
      }
      default:
        break;
    }
    if (o.consumes_receive()) {
      const core::Cqe& c = rcqes[recv_index];
      const bool imm = o.op != WrOp::Send;
      if (c.status != WcStatus::Success || c.wr_id != 1000u + recv_index || c.byte_len != o.len ||
          (imm && ((c.wc_flags & core::kWcWithImm) == 0 || c.imm_or_inv != o.imm)) ||
          c.opcode != (o.op == WrOp::WriteImm ? core::WcOpcode::RecvRdmaWithImm : core::WcOpcode::Recv)) {
        why << "receive " << recv_index << " for wr " << i << ": status " << int(c.status) << " wr_id " << c.wr_id
            << " byte_len " << c.byte_len << " (want " << o.len << ")";
        return why.str();
      }
      if (o.op != WrOp::WriteImm && o.len &&
          std::memcmp(rbuf->data() + recv_index * kMaxSend, src->data() + o.loff, o.len) != 0) {
        why << "SEND wr " << i << " delivered other bytes";
        return why.str();
      }
      ++recv_index;
    }
  }
  for (size_t i = recv_index; i < rcqes.size(); ++i)
    if (rcqes[i].status != WcStatus::WrFlushErr) {
      why << "receive " << i << " after the bad request: status " << int(rcqes[i].status) << ", want WR_FLUSH_ERR";
      return why.str();
    }
  if (rcqes.size() != static_cast<size_t>(receives)) return "receive completions missing";
  if (remote->bytes != shadow) {
    size_t at = 0;
    while (remote->bytes[at] == shadow[at]) ++at;
    why << "the responder's memory differs from the model at offset " << at;
    return why.str();
  }
  if (words->bytes != shadow_words) return "the atomic words differ from the model (not exactly once)";
  for (int i = 0; i < 4096; ++i)
    if (closed->data()[i] != 0) return "the region without remote access was written";
  // Every packet that arrived as sent checked out with its own identification: segment k of a flight with
  // k (faults move whole flights, never a segment within one), and only corrupted packets were dropped.
  const core::Counters ca = ha.engine->counters(), cb = hb.engine->counters();
  if (ca.icrc_moved_segment + cb.icrc_moved_segment) {
    why << ca.icrc_moved_segment + cb.icrc_moved_segment
        << " packets checked out only with another segment's identification (icrc_moved_segment)";
    return why.str();
  }
  const uint64_t bad = ca.drop_icrc + cb.drop_icrc + ca.drop_malformed + cb.drop_malformed;
  if (bad > corrupted) {
    why << bad << " packets dropped as corrupted (drop_icrc, drop_malformed), " << corrupted << " were";
    return why.str();
  }
  return "";
}

void run_seeds(bool gso, uint64_t default_count, bool v6 = false) {
  // Each seed allocates and frees a few MiB: keep them on the heap instead of fresh (page-faulting)
  // mappings, which would cost more than the seed itself.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  const uint64_t first = env_u64("RC_MODEL_FIRST", 1);
  const char* own = v6 ? "RC_MODEL_IPV6_SEEDS" : gso ? "RC_MODEL_GSO_SEEDS" : "RC_MODEL_SEEDS";
  const uint64_t count = getenv(own) ? env_u64(own, default_count)
                         : v6        ? std::min(env_u64("RC_MODEL_SEEDS", default_count), default_count)
                                     : env_u64("RC_MODEL_SEEDS", default_count);
  const bool big = env_u64("RC_MODEL_BIG", 0) != 0;
  const char* test = v6 ? "RcModel.SeedsIpv6" : gso ? "RcModel.SeedsGso" : "RcModel.Seeds";
  uint64_t failed = 0;
  for (uint64_t s = first; s < first + count; ++s) {
    std::string err = Seed(s, big, gso, v6).run();
    if (err.empty()) continue;
    ++failed;
    ADD_FAILURE() << "seed " << s << (gso ? " (gso)" : "") << (v6 ? " (ipv6)" : "") << ": " << err
                  << "\n  reproduce: RC_MODEL_FIRST=" << s << " " << own << "=1" << (big ? " RC_MODEL_BIG=1" : "")
                  << " build/tests/unit_transport --gtest_filter=" << test;
    if (failed >= 5) break;
  }
  std::printf("rc model%s: %llu seeds from %llu, %llu failed\n", v6 ? " (ipv6)" : gso ? " (gso)" : "",
              static_cast<unsigned long long>(count), static_cast<unsigned long long>(first),
              static_cast<unsigned long long>(failed));
}

TEST(RcModel, Seeds) { run_seeds(false, 2000); }

// The same seeds (same connections, workloads and fault rates) over segmented flights.
TEST(RcModel, SeedsGso) { run_seeds(true, 2000); }

// Between IPv6 addresses, segmented (the ICRC of every segment over the IPv6 pseudo-header).
TEST(RcModel, SeedsIpv6) { run_seeds(true, 500, true); }

}  // namespace
}  // namespace softrdma::transport::test
