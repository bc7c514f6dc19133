#include "wire/psn.h"

#include <gtest/gtest.h>

namespace softrdma::wire {
namespace {

TEST(Psn, AddWrapsAt24Bits) {
  static_assert(psn_add(0xFFFFFF, 1) == 0);
  static_assert(psn_add(0xFFFFF0, 0x20) == 0x10);
  EXPECT_EQ(psn_add(5, 0), 5u);
  EXPECT_EQ(psn_add(0, kPsnMask), kPsnMask);
  EXPECT_EQ(psn_add(1, kPsnMask), 0u);
  EXPECT_EQ(psn_add(0x123456, 0x1000000), 0x123456u);  // a full lap
}

TEST(Psn, DiffIsSignedAcrossTheWrap) {
  static_assert(psn_diff(0, 0xFFFFFF) == 1);
  static_assert(psn_diff(0xFFFFFF, 0) == -1);
  EXPECT_EQ(psn_diff(0x10, 0xFFFFF0), 0x20);
  EXPECT_EQ(psn_diff(0xFFFFF0, 0x10), -0x20);
  EXPECT_EQ(psn_diff(7, 7), 0);
  EXPECT_EQ(psn_diff(0x7FFFFF, 0), 0x7FFFFF);    // largest "after"
  EXPECT_EQ(psn_diff(0x800000, 0), -0x800000);   // half way round reads as "before"
  EXPECT_EQ(psn_diff(0, 0x800001), 0x7FFFFF);
}

TEST(Psn, DiffInvertsAdd) {
  uint32_t x = 0x9E3779B9;
  for (int i = 0; i < 10000; ++i) {
    x = x * 1664525u + 1013904223u;
    const uint32_t a = x & kPsnMask;
    const int32_t d = static_cast<int32_t>((x >> 8) & kPsnMask) - 0x800000;  // -2^23 .. 2^23-1
    const uint32_t b = psn_add(a, static_cast<uint32_t>(d));
    ASSERT_EQ(psn_diff(b, a), d) << a << " " << d;
    ASSERT_EQ(psn_diff(a, b), d == -0x800000 ? d : -d);
  }
}

TEST(Aeth, Encodings) {
  static_assert(aeth_ack() == 0x1F);
  static_assert(aeth_ack(0) == 0x00);
  static_assert(aeth_rnr_nak(14) == 0x2E);
  static_assert(aeth_nak(kNakPsnSeqErr) == 0x60);
  EXPECT_EQ(aeth_nak(kNakInvalidRequest), 0x61);
  EXPECT_EQ(aeth_nak(kNakRemoteAccess), 0x62);
  EXPECT_EQ(aeth_nak(kNakRemoteOp), 0x63);
  EXPECT_EQ(aeth_nak(kNakInvalidRdRequest), 0x64);
  EXPECT_EQ(aeth_value(aeth_rnr_nak(31)), 31);
}

TEST(Aeth, TypeOfEverySyndrome) {
  for (unsigned s = 0; s < 256; ++s) {
    const AethType t = aeth_type(static_cast<uint8_t>(s));
    if (s < 0x20)
      EXPECT_EQ(t, AethType::Ack) << s;
    else if (s < 0x40)
      EXPECT_EQ(t, AethType::RnrNak) << s;
    else if (s >= 0x60 && s < 0x80)
      EXPECT_EQ(t, AethType::Nak) << s;
    else
      EXPECT_EQ(t, AethType::Reserved) << s;
  }
  EXPECT_EQ(aeth_type(aeth_ack()), AethType::Ack);
  EXPECT_EQ(aeth_type(aeth_rnr_nak(0)), AethType::RnrNak);
  EXPECT_EQ(aeth_type(aeth_nak(kNakRemoteAccess)), AethType::Nak);
}

TEST(Timers, RnrTable45) {
  EXPECT_EQ(rnr_timer_us(0), 655360u);
  EXPECT_EQ(rnr_timer_us(1), 10u);
  EXPECT_EQ(rnr_timer_us(4), 40u);
  EXPECT_EQ(rnr_timer_us(5), 60u);
  EXPECT_EQ(rnr_timer_us(12), 640u);
  EXPECT_EQ(rnr_timer_us(14), 1280u);
  EXPECT_EQ(rnr_timer_us(18), 5120u);
  EXPECT_EQ(rnr_timer_us(24), 40960u);
  EXPECT_EQ(rnr_timer_us(30), 327680u);
  EXPECT_EQ(rnr_timer_us(31), 491520u);
  for (uint8_t c = 2; c < 32; ++c) EXPECT_GT(rnr_timer_us(c), rnr_timer_us(c - 1)) << int{c};
  EXPECT_EQ(rnr_timer_us(32 + 14), rnr_timer_us(14));  // 5-bit field
}

TEST(Timers, AckTimeout) {
  EXPECT_EQ(ack_timeout_us(0), 0u);                // infinite
  EXPECT_EQ(ack_timeout_us(1), 9u);                // 8.192 us, rounded up
  EXPECT_EQ(ack_timeout_us(8), 1049u);             // 1048.576 us
  EXPECT_EQ(ack_timeout_us(14), 67109u);           // 67.108864 ms
  EXPECT_EQ(ack_timeout_us(31), 8796093023ull);    // ~2.4 h
  EXPECT_EQ(ack_timeout_us(200), ack_timeout_us(31));
  for (uint8_t c = 2; c < 32; ++c) EXPECT_GT(ack_timeout_us(c), ack_timeout_us(c - 1));
}

}  // namespace
}  // namespace softrdma::wire
