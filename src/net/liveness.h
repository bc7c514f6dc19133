// Evidence from a peer's kernel that a softrdma context's process still exists, or is gone
// (docs/reliability.md, "Pauses and deaths"). Each context listens on TCP at the number of its UDP
// port (udp_port.h). A requester whose peer stopped answering packets asks through a TCP connection
// to that listener, which the peer host's kernel serves without the process running: the handshake
// and the acknowledgement of each query say "host and process exist"; a refused connection or an end
// of stream says "the process is gone" (its kernel closes its sockets when it dies); silence says
// nothing. A query names the peer QP; the peer's engine, when it runs, answers whether that QP exists
// and receives from the asker's address (a process that runs but lost the QP is not paused).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "wire/ip_address.h"

namespace softrdma::net {

class Liveness {
 public:
  enum class Verdict {
    Unknown,  // no answer from the peer's host (yet): no evidence either way
    Paused,   // the host answers for the process, and its engine has not answered a query since
              // the stall began: the process exists but does not run
    Running,  // the process runs: its engine answered every query, the last sent between
              // asked_from_ns and asked_until_ns, and has the QP (silence on the QP is its own)
    NoQp,     // the process runs and says it has no such QP receiving from us
    Dead,     // the process is gone: refused, reset or ended
  };

  // A nonblocking TCP listener bound to (ip, port): its fd, or -1 when the number is taken. scope_id:
  // the interface of an IPv6 address (net::scope_of), which link-local peers are reached through.
  static int listen_on(const wire::IpAddress& ip, uint16_t port, uint32_t scope_id);

  // Takes the listener (-1: none; this context then only asks, and is never found alive). Queries
  // leave from local_ip, the address the peer's QPs know this context by.
  Liveness(int listen_fd, const wire::IpAddress& local_ip, uint32_t scope_id);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Readable (for epoll) when a connection or a query waits for serve().
  int fd() const { return epoll_fd_; }
  // Accepts waiting connections and answers their queries: receives(qpn, asker_ip) says whether
  // that QP exists and takes packets from that address.
  void serve(const std::function<bool(uint32_t qpn, const wire::IpAddress& asker_ip)>& receives);

  // What the context at (ip, port) says of its QP qpn now (asked_from_ns .. asked_until_ns: when
  // the last query must have been sent for its answer to tell that the process ran). The
  // first call starts a connection (Unknown until it is answered). The peer's kernel must not have
  // left a query unacknowledged for more than max_age_ns (else Unknown; not asked of a peer on this
  // host, which cannot have gone away). Each call sends a
  // query for qpn (one per 10 ms and QP at most, and only once the last is acknowledged), which the
  // engine answers when it runs. Dead and a failed connection forget the connection, so a later
  // call asks afresh (a new process may take the port).
  Verdict check(const wire::IpAddress& ip, uint16_t port, uint32_t qpn, uint64_t now_ns, uint64_t max_age_ns,
                uint64_t asked_from_ns, uint64_t asked_until_ns);

 private:
  struct Answer {
    uint32_t qpn;
    bool denied;
    uint32_t pending;                     // queries sent and not answered yet
    uint64_t asked_ns, answered_through;  // the last query sent; the last one sent when none was pending
  };
  struct Probe {
    wire::IpAddress ip;
    uint16_t port;
    int fd;
    bool connected;
    bool local;  // an address of this host (interfaces.h)
    uint64_t started_ns, sent_ns;  // the connection started; the last query sent
    uint8_t rx[4];
    uint32_t rx_len;
    std::vector<Answer> answers;
  };
  struct Asker {
    int fd;
    wire::IpAddress ip;
    uint8_t rx[4];
    uint32_t rx_len;
  };
  void forget(size_t i);
  void drop_asker(size_t i);

  int listen_fd_;
  wire::IpAddress local_ip_;
  uint32_t scope_id_;
  int epoll_fd_;
  std::vector<Asker> askers_;
  std::vector<Probe> probes_;
};

}  // namespace softrdma::net
