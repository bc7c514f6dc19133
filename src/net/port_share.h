// One bound UDP socket shared by the processes of one user on a host: UDP 4791, through which kernel
// rxe and NICs reach every softrdma process of the host (docs/reliability.md, "The 4791 holder").
// Each process that holds the socket offers a duplicate of it on an abstract unix socket named after
// the address and port; a process that cannot bind the port takes one from any offer that answers,
// so it holds the very same socket (one receive queue) and can read it while the holder is stopped.
// The kernel keeps the socket, and the port, while any process holds it: a holder that dies leaves no
// gap. Which process reads is decided by the reader lock: an abstract name only one socket can bind,
// released by the kernel when its process dies (a forked child lets go of its copies at once).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "wire/ip_address.h"

namespace softrdma::net {

class PortShare {
 public:
  // Offers fd (a UDP socket bound to ip:port) to this user's other processes; fd stays the
  // caller's. listener() is -1 when the offer could not be made (sharing is then off, nothing else).
  PortShare(int fd, const wire::IpAddress& ip, uint16_t port);
  ~PortShare();
  PortShare(const PortShare&) = delete;
  PortShare& operator=(const PortShare&) = delete;

  // Readable (for epoll) when a process waits for the socket.
  int listener() const { return listener_; }
  // Hands a duplicate of the socket to each waiting process of this user, and closes the rest.
  void serve();

  // Takes the reader lock of (ip, port): true when this process now reads the socket for good
  // (the lock's holder died or never was). Kept until release_reader() or the process's end.
  bool lock_reader();
  void release_reader();
  bool reader() const { return reader_lock_ >= 0; }
  // In a forked child (pthread_atfork): closes this process's copies of the reader lock and the offer.
  void let_go_in_child();

  // Taking the socket from an offer, without blocking: step() connects to the offers listed for
  // (ip, port) on its first call, and collects an answer on the later ones. Returns the socket
  // (now the caller's, checked to be a UDP socket bound to ip:port and offered by this user) or -1.
  class Taker {
   public:
    // owner_uid: whose offers to look for (another's answer nothing; a test asks that they do not).
    Taker(const wire::IpAddress& ip, uint16_t port, uid_t owner_uid = geteuid()) : ip_(ip), port_(port), owner_(owner_uid) {}
    ~Taker();
    Taker(const Taker&) = delete;
    Taker& operator=(const Taker&) = delete;
    int step();
    // Calls so far, and whether an offer may still answer (a caller gives up after a few steps and
    // starts afresh later: offers come and go).
    unsigned steps() const { return steps_; }
    bool waiting() const { return !pending_.empty(); }

   private:
    wire::IpAddress ip_;
    uint16_t port_;
    uid_t owner_;
    unsigned steps_ = 0;
    std::vector<int> pending_;  // connections to offers, waiting for their answer
  };

  // The abstract names (without the leading NUL): offers are <prefix><pid>.<n>; the reader lock is
  // <prefix>reader.
  static std::string prefix(const wire::IpAddress& ip, uint16_t port, uid_t uid = geteuid());

 private:
  int fd_;
  int listener_ = -1;
  int reader_lock_ = -1;
  wire::IpAddress ip_;
  uint16_t port_;
};

}  // namespace softrdma::net
