// The completion event an intra-host initiator raises for a message it left in a target's inbox
// (claim_event, transport/direct_peer.h), against a real CompletionQueue: every wake-up byte written
// into the channel's pipe -- the CQ's own or the initiator's -- has exactly one event behind it. A byte
// without one wakes a thread blocked in ibv_get_cq_event that then sleeps on with no event to come, and
// an application that reposts receives only from its CQEs stops receiving (issue 28: the target of
// rc_verifier after a SIGSTOP, answering RNR NAKs forever).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/arena.h"
#include "core/cq.h"
#include "transport/direct_peer.h"

namespace softrdma::transport {
namespace {

using Cq = core::CompletionQueue;

// A target's receive CQ with a completion channel, counting the channel's events and the pipe's bytes
// as the verbs layer's channel writes them (an event claimed by an initiator writes none).
struct Target {
  core::Arena arena{1 << 20};
  std::shared_ptr<core::Arena> rw = std::make_shared<core::Arena>(1 << 20, true);
  Cq cq{arena, 16, rw};
  std::atomic<uint64_t> tails{0};  // DirectQpDesc::tails: messages placed in the high half
  int events = 0, bytes = 0;

  Target() {
    cq.set_notify([this](Cq&, bool woken) {
      ++events;
      if (!woken) ++bytes;
    }, [](Cq&) {});
  }
  std::atomic<int>& arm() { return *const_cast<std::atomic<int>*>(cq.arm_word()); }
  // Places the message at inbox index placed - 1: its count is published, then its CQE written.
  void place(uint32_t placed) {
    tails.store(uint64_t{placed} << 32 | placed, std::memory_order_release);
    core::Cqe c{};
    ASSERT_TRUE(cq.push(c, false));
  }
  // The initiator's wake-up for the message it left with the inbox's head then at sent.
  void wake(uint32_t sent, bool solicited = false) {
    if (claim_event(arm(), tails, sent, solicited) != Cq::kUnarmed) ++bytes;
  }
  int poll() {
    core::Cqe out[16];
    return cq.poll(out, 16);
  }
};

TEST(DirectEventClaim, MessageLeftBeforeTheArmIsWokenOnceWithTheInitiatorsByte) {
  Target t;
  t.cq.arm(false);
  t.wake(1);
  EXPECT_EQ(t.arm().load(), Cq::kClaimed);
  EXPECT_EQ(t.bytes, 1);
  EXPECT_EQ(t.events, 0);
  t.place(1);  // its CQE raises the event without a byte of its own
  EXPECT_EQ(t.events, 1);
  EXPECT_EQ(t.bytes, 1);
  EXPECT_EQ(t.arm().load(), Cq::kUnarmed);
}

// The target placed the message and its CQE raised the event of the arm then; the application polled
// it and armed again, and only now does the initiator (descheduled since it published the message) look
// at the arm word. That arm waits for a later CQE: the initiator must leave it alone.
TEST(DirectEventClaim, ArmMadeAfterTheMessageWasPlacedIsNotTaken) {
  Target t;
  t.cq.arm(false);
  t.place(1);
  EXPECT_EQ(t.events, 1);
  EXPECT_EQ(t.bytes, 1);
  EXPECT_EQ(t.poll(), 1);
  t.cq.arm(false);
  t.wake(1);
  EXPECT_EQ(t.bytes, 1) << "a wake-up byte with no event behind it";
  EXPECT_EQ(t.arm().load(), Cq::kArmedAll);
  t.place(2);  // the next message raises the event of that arm, with its own byte
  EXPECT_EQ(t.events, 2);
  EXPECT_EQ(t.bytes, 2);
}

// The same when the message was placed while nobody was armed (the application was busy polling).
TEST(DirectEventClaim, MessagePlacedUnarmedLeavesALaterArmAlone) {
  Target t;
  t.place(1);
  EXPECT_EQ(t.events, 0);
  t.cq.arm(true);  // solicited only: the initiator's message is solicited
  t.wake(1, /*solicited=*/true);
  EXPECT_EQ(t.bytes, 0);
  EXPECT_EQ(t.arm().load(), Cq::kArmedSolicited);
}

TEST(DirectEventClaim, OnlyAnArmTheMessageRaisesIsTaken) {
  Target t;
  t.wake(1);  // unarmed
  t.cq.arm(true);
  t.wake(1);  // solicited only, the message is not
  EXPECT_EQ(t.arm().load(), Cq::kArmedSolicited);
  t.wake(1, /*solicited=*/true);
  EXPECT_EQ(t.arm().load(), Cq::kClaimed);
  t.wake(2);  // claimed already: its byte is written
  EXPECT_EQ(t.bytes, 1);
  t.place(1);
  t.place(2);
  EXPECT_EQ(t.events, 1);
  EXPECT_EQ(t.bytes, 1);
}

// The inbox's counts wrap at 32 bits: the comparison is modular.
TEST(DirectEventClaim, CountsCompareAcrossTheWrap) {
  Target t;
  t.tails.store(uint64_t{0xFFFFFFFFu} << 32);
  t.cq.arm(false);
  t.wake(0);  // the message at index 0xFFFFFFFF, not placed yet
  EXPECT_EQ(t.arm().load(), Cq::kClaimed);
  t.place(0);
  EXPECT_EQ(t.events, 1);
  t.cq.arm(false);
  t.wake(0);  // placed: not taken
  EXPECT_EQ(t.arm().load(), Cq::kArmedAll);
  EXPECT_EQ(t.bytes, 1);
}

}  // namespace
}  // namespace softrdma::transport
