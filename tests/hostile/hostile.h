// Shared fixture of the hostile-input and dying-peer tests: a live RC pair on the loopback device in
// two contexts of this process, registered memory filled with known patterns, a plain UDP socket that
// sends crafted RoCEv2 datagrams at the target QP's endpoint, and the target context's counters read
// from the shared-memory stats page (what `softrdma stat` shows).
#pragma once

#include "helpers.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/stats.h"
#include "net/registry.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace softrdma::hostile_test {

using namespace softrdma::verbs_test;
using Counter = uint64_t core::Counters::*;

// Every hostile datagram any test sent (reported at the end of the run).
uint64_t& hostile_packets_sent();

// A plain UDP socket on 127.0.0.1 (DF set, like softrdma's own sockets).
class HostileSocket {
 public:
  HostileSocket();
  ~HostileSocket();
  HostileSocket(const HostileSocket&) = delete;
  HostileSocket& operator=(const HostileSocket&) = delete;
  uint16_t port() const { return port_; }
  // Sends one datagram to 127.0.0.1:dst_port; counts it as hostile.
  void send(const std::vector<uint8_t>& d, uint16_t dst_port);

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// Headers + payload + pad, no ICRC.
std::vector<uint8_t> build_body(const wire::Packet& p, const uint8_t* payload, uint32_t len);
// Appends the ICRC for a datagram from 127.0.0.1:src_port to 127.0.0.1:dst_port.
void add_icrc(std::vector<uint8_t>& body, uint16_t src_port, uint16_t dst_port);

// The counters of the context that holds `qpn` (this process, device softrdma_lo): the device set and
// the QP's own set.
struct Stats {
  core::Counters dev{};
  core::Counters qp{};
};
std::optional<Stats> read_stats(uint32_t qpn);
uint64_t get(const core::Counters& c, Counter f);

// The counters a hostile packet can end up in; each test says exactly how many of each it expects.
const std::vector<std::pair<const char*, Counter>>& outcome_counters();

// Brings a (on da) and b (on db) up towards each other over conn (RESET to RTS, each to the other's
// QPN and PSN); false, with a gtest failure naming the side, on error.
bool connect_sides(const Side& a, const Device& da, const Side& b, const Device& db, const ConnConfig& conn);

// Sizes of the pair's memory.
inline constexpr size_t kTargetLen = 64 * 1024;
inline constexpr size_t kGuardLen = 16 * 1024;
inline constexpr size_t kScratchLen = 64 * 1024;
inline constexpr uint32_t kMtu = 1024;
inline constexpr uint32_t kSanityLen = 16 * 1024;  // WRITE and READ of each sanity round
inline constexpr uint32_t kSanitySend = 4 * 1024;

// A connected RC pair: a (requester side of the sanity traffic) and b (the target) on two contexts.
// b owns the target MR and two guard MRs filled with patterns; a owns an untouched guard of its own.
// Hostile packets go to b.
class Pair {
 public:
  Pair() = default;
  // a's and b's contexts with these settings of their own (Device(settings)).
  explicit Pair(const char* settings) : da(settings), db(settings) {}
  Device da, db;
  Side a, b;
  ConnConfig conn;
  std::unique_ptr<Buffer> guard_lo, target, guard_hi, scratch_b;  // on b
  std::unique_ptr<Buffer> guard_a, src_a, dst_a, src_b2, dst_b2;  // on a (guard_a, src_a, dst_a) / b
  std::unique_ptr<Buffer> scratch_a;                               // on a: target of b's sanity traffic
  net::Endpoint ep{};     // b's QP in the registry
  uint32_t a_next = 0;    // next PSN a sends (= b's expected PSN while the pair is in step)
  uint32_t b_next = 0;    // next PSN b sends
  HostileSocket sock;
  std::mt19937_64 rng;
  int round = 0;

  // Brings everything up; false (with a gtest failure) on error.
  bool up(uint64_t seed = 1);

  // A request packet addressed to b: pkey default, dest QPN b, AckReq set.
  wire::Packet req(uint8_t opcode, uint32_t psn) const;
  // Builds and sends (with a valid ICRC unless told otherwise).
  void send(const wire::Packet& p, const uint8_t* payload = nullptr, uint32_t len = 0);
  // Every 32 datagrams waits for b's context to have received them all (a UDP receive buffer that
  // overflows would lose datagrams, and the counts would not add up).
  void send_raw(const std::vector<uint8_t>& d);
  std::vector<uint8_t> datagram(const wire::Packet& p, const uint8_t* payload = nullptr, uint32_t len = 0);

  // Waits until b's context has received `n` more datagrams than in `before` and the outcome counters
  // have settled; returns the stats then. Fails the test after 30 s.
  Stats settle(const Stats& before, uint64_t n);
  Stats stats();
  // A hostile phase: begin() snapshots the counters; settle() waits for all datagrams sent since.
  Stats begin();
  Stats settle() { return settle(phase_before_, phase_sent_); }
  uint64_t phase_sent() const { return phase_sent_; }

 private:
  Stats phase_before_{};
  uint64_t phase_sent_ = 0;

 public:

  // Every byte of registered memory still holds its pattern (except [skip_off, skip_off+skip_len) of
  // the target, for a request that was allowed through).
  void expect_memory_intact(size_t skip_off = 0, size_t skip_len = 0);
  // No completion appeared on any CQ.
  void expect_no_completions();
  // A normal WRITE + READ + SEND a->b and WRITE + READ b->a with data checks; advances a_next/b_next.
  void sanity();
  // Expects b in ERR, the async event `ev` for b's QP on b's context, and a unaffected (RTS).
  void expect_b_errored(ibv_event_type ev);
  // Expects no async event pending on either context.
  void expect_no_async_events();
};

// Expects exactly `want` (counter name -> delta) for every outcome counter, zero for the rest; and
// rx_packets delta == sent.
void expect_deltas(const Stats& before, const Stats& after, uint64_t sent,
                   const std::map<std::string, uint64_t>& want);

}  // namespace softrdma::hostile_test
