// Deterministic packet impairment for tests (issues 3 and 12): drop, duplicate, reorder, hold, corrupt and
// burst-drop datagrams on their way into or out of a UdpPort. Configured by the environment variable
// SOFTRDMA_IMPAIR; off (and free: one null-pointer test in UdpPort) when it is unset.
//
//   SOFTRDMA_IMPAIR="seed=42,tx_drop=0.05,tx_dup=0.05,tx_reorder=0.05,reorder_depth=8,tx_corrupt=0.01,
//                    tx_hold=0.05,rx_drop=0.02,burst=0,burst_len=0"
//
// Keys: seed; for each direction tx_/rx_ followed by drop, dup, reorder, corrupt, burst (probabilities in
// [0,1]), reorder_depth, burst_len, burst_at (counts; burst_at=N drops burst_len datagrams from the N-th on, a
// fault at a known place). A key without a direction prefix sets both directions.
//
// tx_hold (send side only; rx_hold and a bare hold are errors): a datagram is held back until the port's
// next send, however much later and to whatever destination that send goes, and leaves right after it
// (after both copies if that send is duplicated; also when that send is dropped). At most one datagram is
// held at a time, and the send that releases one is never held itself. Unlike tx_reorder, flushes do not
// age it: it stays held while the port sends nothing. That is safe for RC (the requester's retransmit timer
// keeps sending while anything is unacknowledged, and each resend or re-acknowledge releases the held
// datagram) and is the point: it is how an LD_PRELOAD shim that holds one datagram per thread behaves. For
// UD/UC a held datagram is late until the next send, or lost if none comes; the port's destructor sends it.
// Decisions come from a PRNG seeded with `seed` mixed with the port's creation index in the process and
// the direction, so the same seed and the same sequence of datagrams/flushes replays the same faults.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "wire/ip_address.h"

namespace softrdma::net {

struct ImpairmentRates {
  double drop = 0, dup = 0, reorder = 0, corrupt = 0, burst = 0;
  double hold = 0;             // tx only: held until the next send (see the top of this file)
  uint32_t reorder_depth = 8;  // a held datagram is released after at most this many later ones
  uint32_t burst_len = 0;      // datagrams dropped in a row once a burst starts
  uint32_t burst_at = 0;       // if not 0: a burst also starts at this datagram (1-based), once
  bool active() const {
    return drop > 0 || dup > 0 || reorder > 0 || corrupt > 0 || hold > 0 ||
           ((burst > 0 || burst_at > 0) && burst_len > 0);
  }
};

struct ImpairmentConfig {
  uint64_t seed = 0;
  ImpairmentRates tx, rx;
  bool active() const { return tx.active() || rx.active(); }
};

// Parses the SOFTRDMA_IMPAIR syntax. On error returns nullopt and describes the problem in *error.
std::optional<ImpairmentConfig> parse_impairment(std::string_view spec, std::string* error);
// The impairment a port gets from SOFTRDMA_IMPAIR's value (config::Settings::impair). Empty or
// all-zero: nullopt. A parse error prints one line to stderr and is otherwise ignored (nullopt).
std::optional<ImpairmentConfig> impairment_from(std::string_view spec);

// What one direction of one port did to its datagrams.
struct ImpairmentStats {
  uint64_t seen = 0;        // datagrams offered
  uint64_t dropped = 0;     // includes burst_dropped
  uint64_t burst_dropped = 0;
  uint64_t bursts = 0;
  uint64_t duplicated = 0;
  uint64_t reordered = 0;   // held back and released later
  uint64_t held = 0;        // held until the next send (hold)
  uint64_t corrupted = 0;
};

// The PRNG (splitmix64): small, fast, and the same everywhere.
class ImpairmentRng {
 public:
  explicit ImpairmentRng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(next() % n); }
  static uint64_t mix(uint64_t a, uint64_t b);  // seed derivation

 private:
  uint64_t state_;
};

// One direction of impairment. Datagrams go in with offer(); what survives comes out, possibly later,
// duplicated, corrupted or out of order, through the emit callback. tick() marks a batch boundary (a
// UdpPort flush, or a receive that found nothing new): held datagrams age, and none survives more than
// kMaxTicksHeld ticks, so nothing is held forever when traffic stops -- except the hold datagram, which only
// a later offer() (or release_all) lets go.
class DirectionImpairment {
 public:
  struct Meta {
    wire::IpAddress ip;
    uint16_t port = 0;
    wire::IpAddress local_ip;
    bool coalesce = false;  // transmit: the datagram may join a segmented send (packet_port.h)
    uint32_t segment = 0;   // receive: its index in the buffer it arrived in (Datagram::segment)
  };
  using Emit = std::function<void(const uint8_t* data, uint32_t len, const Meta& meta)>;
  static constexpr uint32_t kMaxTicksHeld = 2;

  DirectionImpairment(const ImpairmentRates& rates, uint64_t seed, ImpairmentStats& stats)
      : rates_(rates), rng_(seed), hold_rng_(ImpairmentRng::mix(seed, kHoldStream)), stats_(stats) {}

  // data may be modified in place (corruption) -- it is the caller's copy.
  void offer(uint8_t* data, uint32_t len, const Meta& meta, const Emit& emit);
  // Ages held datagrams; emits those whose time is up. Returns the number emitted.
  size_t tick(const Emit& emit);
  // Emits every held datagram (shutdown).
  size_t release_all(const Emit& emit);
  size_t held() const { return held_.size() + (hold_ ? 1 : 0); }
  bool holding() const { return hold_.has_value(); }  // a datagram waits for the next send

 private:
  struct Held {
    std::vector<uint8_t> bytes;
    Meta meta;
    uint32_t datagrams_left;  // released when this many later datagrams went out
    uint32_t ticks = 0;
  };
  void corrupt(uint8_t* data, uint32_t len);
  void age_held(size_t skip_newest, const Emit& emit);
  void offer_one(uint8_t* data, uint32_t len, const Meta& meta, bool may_hold, const Emit& emit);

  // The hold decisions have a PRNG of their own, so that adding hold leaves every other decision of a seed
  // as it was.
  static constexpr uint64_t kHoldStream = 0x686f6c64;  // "hold"
  ImpairmentRates rates_;
  ImpairmentRng rng_;
  ImpairmentRng hold_rng_;
  ImpairmentStats& stats_;
  uint32_t burst_left_ = 0;
  std::deque<Held> held_;
  std::optional<Held> hold_;  // the datagram held until the next send
};

// Both directions of one UdpPort, plus the receive-side staging that keeps delivered datagrams valid
// until the next receive.
struct PortImpairment {
  PortImpairment(const ImpairmentConfig& cfg, uint64_t port_index);
  ImpairmentStats tx_stats, rx_stats;
  DirectionImpairment tx, rx;
  struct Ready {
    std::vector<uint8_t> bytes;
    DirectionImpairment::Meta meta;
  };
  std::deque<Ready> rx_ready;        // emitted by rx, not yet handed to the caller
  std::vector<Ready> rx_delivered;   // handed out by the last receive(); storage must stay valid
  std::vector<Ready> spare;          // recycled buffers
  std::vector<uint8_t> tx_scratch;   // the copy of a datagram being impaired on send
};

}  // namespace softrdma::net
