#include "wire/psn.h"

namespace softrdma::wire {

AethType aeth_type(uint8_t syndrome) {
  switch (syndrome >> 5) {
    case 0: return AethType::Ack;
    case 1: return AethType::RnrNak;
    case 3: return AethType::Nak;
    default: return AethType::Reserved;  // 010 and anything with the reserved bit 7 set
  }
}

uint32_t rnr_timer_us(uint8_t code) {
  static constexpr uint32_t kTable[32] = {
      655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,    320,
      480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240,  15360,
      20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
  };
  return kTable[code & 0x1F];
}

uint64_t ack_timeout_us(uint8_t code) {
  if (code == 0) return 0;
  if (code > 31) code = 31;
  const uint64_t ns = uint64_t{4096} << code;  // 4.096 us = 4096 ns
  return (ns + 999) / 1000;
}

}  // namespace softrdma::wire
