// Tests with a second process on the same host: the target is forked before this process opens a
// device (a child must not inherit an open verbs context) and the two talk over a socketpair.
#pragma once

#include "helpers.h"

#include <sys/types.h>

#include <cstring>

#include "my_counter.h"

namespace softrdma::verbs_test {

// Reads exactly n bytes; false on EOF, an error, or nothing to read for timeout_s seconds.
bool read_full(int fd, void* p, size_t n, int timeout_s = kWaitSeconds);
// Writes exactly n bytes; false on an error.
bool write_full(int fd, const void* p, size_t n);

// Forks a child that runs target_main on its end of a new socketpair and _exits with the result.
// Returns the child's pid with our end in *sock, or -1 (no child, no socket).
pid_t fork_target(int (*target_main)(int sock), int* sock);

// Waits up to wait_s seconds for child pid to exit, its status in *st; if it has not by then, kills
// and reaps it and returns false.
bool reap_within(pid_t pid, int wait_s, int* st);


// A fixture whose target process is forked in SetUp and reached through `sock`. The target answers
// the QP set-up below (serve_connect) and finishes on a byte 'x' with exit status 0; anything else
// (its failed step) fails the test.
class ForkedTarget : public ::testing::Test {
 protected:
  // reply_s: the longest wait for anything from the target (its exit included).
  explicit ForkedTarget(int (*target_main)(int sock), int reply_s = kWaitSeconds)
      : target_main_(target_main), reply_s_(reply_s) {}

  void SetUp() override;
  // A subclass releases its own verbs objects first, then calls this.
  void TearDown() override;
  // Sends `bye` to the target, closes the socket and expects the target to exit with status 0.
  void stop_target(const void* bye, size_t len);

  // Our half of the set-up: reads the target's QP facts into `peer` (an Info with qpn, psn and gid[16]),
  // sends `me` with our GID, brings s.qp from INIT to RTS and waits for the target's 'r'.
  template <class Info>
  void connect_target(Info me, Info& peer, Side& s, const Device& dev, const ConnConfig& conn) {
    std::memcpy(me.gid, dev.gid.raw, 16);
    ASSERT_TRUE(read_full(sock, &peer, sizeof peer, reply_s_)) << "target sent no QP info";
    ASSERT_TRUE(write_full(sock, &me, sizeof me));
    ibv_gid pg{};
    std::memcpy(pg.raw, peer.gid, 16);
    ASSERT_EQ(modify_to_rtr(s.qp, peer.qpn, peer.psn, pg, conn, dev.attr), 0);
    ASSERT_EQ(modify_to_rts(s.qp, s.psn, conn, dev.attr), 0);
    char ready = 0;
    ASSERT_TRUE(read_full(sock, &ready, 1, reply_s_));
    ASSERT_EQ(ready, 'r');
  }

  pid_t pid = -1;
  int sock = -1;

 private:
  int (*target_main_)(int sock);
  const int reply_s_;
};

// The target's half of connect_target: sends `me` with its GID, reads the test's facts into `peer`,
// brings s.qp from INIT to RTS (default ConnConfig) and says 'r'. Returns 0, `step` if the exchange
// failed, or step + 1 if connecting did (the target's exit status).
template <class Info>
int serve_connect(int sock, const Device& dev, Side& s, Info me, Info& peer, int step, int timeout_s = kWaitSeconds) {
  std::memcpy(me.gid, dev.gid.raw, 16);
  if (!write_full(sock, &me, sizeof me) || !read_full(sock, &peer, sizeof peer, timeout_s)) return step;
  ibv_gid pg{};
  std::memcpy(pg.raw, peer.gid, 16);
  ConnConfig conn;
  if (modify_to_rtr(s.qp, peer.qpn, peer.psn, pg, conn, dev.attr) || modify_to_rts(s.qp, s.psn, conn, dev.attr))
    return step + 1;
  const char ready = 'r';  // our QP is in RTS: requests from now on find it ready
  if (!write_full(sock, &ready, 1)) return step + 1;
  return 0;
}

}  // namespace softrdma::verbs_test
