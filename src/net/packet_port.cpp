#include "net/packet_port.h"

#include <ctime>

namespace softrdma::net {

uint64_t SystemClock::now_ns() const {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

const SystemClock& SystemClock::instance() {
  // Never destroyed: progress threads of contexts still open at exit read it after static destructors.
  static const SystemClock* clock = new SystemClock;
  return *clock;
}

}  // namespace softrdma::net
