// splitmix64, the PRNG of the fault tests and the verifier: small, and the same everywhere, so a seed
// replays the same choices and bytes (the engine's net::ImpairmentRng is the same generator).
#pragma once

#include <cstdint>

namespace softrdma::fault_test {

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint64_t below(uint64_t n) { return next() % n; }
};

}  // namespace softrdma::fault_test
