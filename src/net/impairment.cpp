#include "net/impairment.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace softrdma::net {

uint64_t ImpairmentRng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t ImpairmentRng::mix(uint64_t a, uint64_t b) {
  ImpairmentRng r(a ^ (b * 0xD6E8FEB86659FD93ull));
  r.next();
  return r.next();
}

namespace {

// Error messages are appended piece by piece: GCC 12 at -O3 reports -Wrestrict false positives inside
// std::string's operator+ (GCC PR 105329).
std::string concat(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (std::string_view p : parts) s.append(p);
  return s;
}

bool parse_double(std::string_view s, double& out) {
  std::string tmp(s);
  char* end = nullptr;
  out = std::strtod(tmp.c_str(), &end);
  return !tmp.empty() && end == tmp.c_str() + tmp.size();
}

bool parse_u64(std::string_view s, uint64_t& out) {
  std::string tmp(s);
  if (tmp.empty() || tmp[0] == '-') return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(tmp.c_str(), &end, 0);
  return errno == 0 && end == tmp.c_str() + tmp.size();
}

// Sets one field of one direction; false when the key is unknown or the value is invalid.
bool set_rate(ImpairmentRates& r, std::string_view key, std::string_view value, std::string* error) {
  double* prob = nullptr;
  uint32_t* count = nullptr;
  if (key == "drop") prob = &r.drop;
  else if (key == "dup") prob = &r.dup;
  else if (key == "reorder") prob = &r.reorder;
  else if (key == "corrupt") prob = &r.corrupt;
  else if (key == "burst") prob = &r.burst;
  else if (key == "hold") prob = &r.hold;
  else if (key == "reorder_depth") count = &r.reorder_depth;
  else if (key == "burst_len") count = &r.burst_len;
  else if (key == "burst_at") count = &r.burst_at;
  else {
    *error = concat({"unknown key '", key, "'"});
    return false;
  }
  if (prob) {
    double v;
    if (!parse_double(value, v) || !(v >= 0.0 && v <= 1.0)) {
      *error = concat({"'", key, "' needs a probability in [0,1], got '", value, "'"});
      return false;
    }
    *prob = v;
  } else {
    uint64_t v;
    if (!parse_u64(value, v) || v > 1000000) {
      *error = concat({"'", key, "' needs a count (0..1000000), got '", value, "'"});
      return false;
    }
    *count = static_cast<uint32_t>(v);
  }
  return true;
}

}  // namespace

std::optional<ImpairmentConfig> parse_impairment(std::string_view spec, std::string* error) {
  ImpairmentConfig cfg;
  std::string scratch;
  if (!error) error = &scratch;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string_view::npos) comma = spec.size();
    std::string_view item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      *error = concat({"'", item, "' is not key=value"});
      return std::nullopt;
    }
    std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "seed") {
      if (!parse_u64(value, cfg.seed)) {
        *error = concat({"seed needs an unsigned integer, got '", value, "'"});
        return std::nullopt;
      }
    } else if (key.starts_with("tx_")) {
      if (!set_rate(cfg.tx, key.substr(3), value, error)) return std::nullopt;
    } else if (key.starts_with("rx_")) {
      if (!set_rate(cfg.rx, key.substr(3), value, error)) return std::nullopt;
    } else {
      if (!set_rate(cfg.tx, key, value, error) || !set_rate(cfg.rx, key, value, error)) return std::nullopt;
    }
  }
  if (cfg.rx.hold > 0) {
    // "Until the next send" has no meaning for what arrives.
    *error = "hold applies to sends only: write tx_hold";
    return std::nullopt;
  }
  for (ImpairmentRates* r : {&cfg.tx, &cfg.rx}) {
    if (r->reorder > 0 && r->reorder_depth == 0) {
      *error = "reorder needs reorder_depth >= 1";
      return std::nullopt;
    }
  }
  return cfg;
}

std::optional<ImpairmentConfig> impairment_from(std::string_view spec) {
  if (spec.empty()) return std::nullopt;
  std::string error;
  auto cfg = parse_impairment(spec, &error);
  if (!cfg) {
    std::fprintf(stderr, "softrdma: ignoring SOFTRDMA_IMPAIR: %s\n", error.c_str());
    return std::nullopt;
  }
  if (!cfg->active()) return std::nullopt;
  return cfg;
}

void DirectionImpairment::corrupt(uint8_t* data, uint32_t len) {
  if (len == 0) return;
  const uint32_t flips = 1 + rng_.below(3);
  for (uint32_t i = 0; i < flips; ++i) {
    uint32_t bit = rng_.below(len * 8);
    data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  ++stats_.corrupted;
}

void DirectionImpairment::age_held(size_t skip_newest, const Emit& emit) {
  // Held datagrams count the ones offered after them (whatever became of those); release those whose
  // count is reached, oldest first, after the datagram that overtook them.
  const size_t n = held_.size() - skip_newest;
  size_t i = 0;
  for (auto it = held_.begin(); i < n; ++i) {
    if (--it->datagrams_left == 0) {
      Held h = std::move(*it);
      it = held_.erase(it);
      emit(h.bytes.data(), static_cast<uint32_t>(h.bytes.size()), h.meta);
    } else {
      ++it;
    }
  }
}

void DirectionImpairment::offer(uint8_t* data, uint32_t len, const Meta& meta, const Emit& emit) {
  // One draw per datagram, whether or not it may be held, keeps the hold stream aligned between runs.
  const double u_hold = hold_rng_.uniform();
  if (hold_) {
    // This send releases the held datagram, right after itself, whatever becomes of it.
    Held h = std::move(*hold_);
    hold_.reset();
    offer_one(data, len, meta, false, emit);
    emit(h.bytes.data(), static_cast<uint32_t>(h.bytes.size()), h.meta);
    return;
  }
  offer_one(data, len, meta, u_hold < rates_.hold, emit);
}

void DirectionImpairment::offer_one(uint8_t* data, uint32_t len, const Meta& meta, bool may_hold,
                                    const Emit& emit) {
  ++stats_.seen;
  // The same number of PRNG draws for every datagram keeps decisions aligned between runs that differ
  // only in rates of other kinds.
  const double u_burst = rng_.uniform(), u_drop = rng_.uniform(), u_corrupt = rng_.uniform();
  const double u_reorder = rng_.uniform(), u_dup = rng_.uniform();
  const uint64_t r = rng_.next();
  if (burst_left_ == 0 && rates_.burst_len > 0 &&
      (u_burst < rates_.burst || (rates_.burst_at && stats_.seen == rates_.burst_at))) {
    burst_left_ = rates_.burst_len;
    ++stats_.bursts;
  }
  if (burst_left_ > 0) {
    --burst_left_;
    ++stats_.dropped;
    ++stats_.burst_dropped;
    age_held(0, emit);
    return;
  }
  if (u_drop < rates_.drop) {
    ++stats_.dropped;
    age_held(0, emit);
    return;
  }
  if (u_corrupt < rates_.corrupt) corrupt(data, len);
  if (may_hold) {
    ++stats_.held;
    hold_ = Held{std::vector<uint8_t>(data, data + len), meta, 0};
    age_held(0, emit);
    return;
  }
  if (u_reorder < rates_.reorder) {
    ++stats_.reordered;
    held_.push_back(Held{std::vector<uint8_t>(data, data + len), meta,
                         1 + static_cast<uint32_t>(r % rates_.reorder_depth)});
    age_held(1, emit);
    return;
  }
  emit(data, len, meta);
  if (u_dup < rates_.dup) {
    ++stats_.duplicated;
    emit(data, len, meta);
  }
  age_held(0, emit);
}

size_t DirectionImpairment::tick(const Emit& emit) {
  size_t n = 0;
  for (auto it = held_.begin(); it != held_.end();) {
    if (++it->ticks >= kMaxTicksHeld) {
      Held h = std::move(*it);
      it = held_.erase(it);
      emit(h.bytes.data(), static_cast<uint32_t>(h.bytes.size()), h.meta);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

size_t DirectionImpairment::release_all(const Emit& emit) {
  size_t n = held();
  while (!held_.empty()) {
    Held h = std::move(held_.front());
    held_.pop_front();
    emit(h.bytes.data(), static_cast<uint32_t>(h.bytes.size()), h.meta);
  }
  if (hold_) {
    Held h = std::move(*hold_);
    hold_.reset();
    emit(h.bytes.data(), static_cast<uint32_t>(h.bytes.size()), h.meta);
  }
  return n;
}

PortImpairment::PortImpairment(const ImpairmentConfig& cfg, uint64_t port_index)
    : tx(cfg.tx, ImpairmentRng::mix(cfg.seed, port_index * 2), tx_stats),
      rx(cfg.rx, ImpairmentRng::mix(cfg.seed, port_index * 2 + 1), rx_stats) {}

}  // namespace softrdma::net
