// PSN arithmetic in 24-bit sequence space, AETH syndromes and the IBTA timer encodings.
#pragma once

#include <cstdint>

namespace softrdma::wire {

inline constexpr uint32_t kPsnMask = 0xFFFFFF;

// (psn + n) mod 2^24.
constexpr uint32_t psn_add(uint32_t psn, uint32_t n) { return (psn + n) & kPsnMask; }

// Signed distance a - b in 24-bit sequence space, in -2^23 .. 2^23-1: positive when a is after b.
constexpr int32_t psn_diff(uint32_t a, uint32_t b) {
  // Move the 24-bit difference into the top of a 32-bit word and shift back to sign-extend it.
  return static_cast<int32_t>(((a - b) & kPsnMask) << 8) >> 8;
}

// The packets, so the PSNs, a message of len bytes takes at the path MTU: a zero-length message is one.
constexpr uint32_t packets_for(uint64_t len, uint32_t mtu) {
  return len == 0 ? 1 : static_cast<uint32_t>((len + mtu - 1) / mtu);
}

// AETH syndrome (IBTA 9.7.5.1): bit 7 reserved, bits 6..5 the type, bits 4..0 a value:
// ACK 000xxxxx (credit count, 0x1F = no credit info), RNR NAK 001ttttt (RNR timer code),
// NAK 011ccccc (NAK code below). Anything else is reserved.
enum class AethType : uint8_t { Ack, RnrNak, Nak, Reserved };
AethType aeth_type(uint8_t syndrome);

inline constexpr uint8_t kNakPsnSeqErr = 0;
inline constexpr uint8_t kNakInvalidRequest = 1;
inline constexpr uint8_t kNakRemoteAccess = 2;
inline constexpr uint8_t kNakRemoteOp = 3;
inline constexpr uint8_t kNakInvalidRdRequest = 4;
inline constexpr uint8_t kAethCreditsInvalid = 0x1F;

constexpr uint8_t aeth_ack(uint8_t credits = kAethCreditsInvalid) { return credits & 0x1F; }
constexpr uint8_t aeth_rnr_nak(uint8_t timer_code) { return static_cast<uint8_t>(0x20 | (timer_code & 0x1F)); }
constexpr uint8_t aeth_nak(uint8_t code) { return static_cast<uint8_t>(0x60 | (code & 0x1F)); }
// The 5-bit value of a syndrome: credits, RNR timer code or NAK code.
constexpr uint8_t aeth_value(uint8_t syndrome) { return syndrome & 0x1F; }

// RNR timer code -> microseconds, IBTA table 45 (0 = 655.36 ms, 1 = 0.01 ms ... 31 = 491.52 ms).
// Only the low 5 bits of code are used (the field is 5 bits wide).
uint32_t rnr_timer_us(uint8_t code);

// Local ACK timeout code -> microseconds: 4.096 us * 2^code, rounded up so a timer never fires early;
// 0 means infinite (returns 0). Codes above 31 are treated as 31 (the field is 5 bits wide).
uint64_t ack_timeout_us(uint8_t code);

}  // namespace softrdma::wire
