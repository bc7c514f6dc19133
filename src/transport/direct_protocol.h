// The direct path's socket protocol (docs/direct-path.md, "Exchange"; docs/security.md, "Local
// isolation"): the requests an initiator sends to a target's server thread over the abstract Unix socket
// named by the target's address, the reply, and the helpers both ends pass them with (fds by SCM_RIGHTS).
#pragma once
#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>

#include "core/mr.h"
#include "transport/direct_layout.h"

namespace softrdma::transport::direct {

// kHello and kQpDesc carry (target QPN << 32 | initiator QPN), kWake the target QPN, kMap an rkey.
// kRing (no reply): wake the target's engine, for a SEND left on an armed CQ; its server thread rings
// the engine's own doorbell (a peer never holds that eventfd: it could clear O_NONBLOCK on it, which is
// the engine's open file description too, and make the engine's reads block). kDoorbell is refused.
enum : uint32_t { kHello = 1, kQpDesc = 2, kMap = 3, kDoorbell = 4, kWake = 5, kRing = 6 };

// One request on the socket (the reply may carry an fd).
struct Request {
  uint32_t type;
  uint32_t writable;
  uint64_t arg;
};

struct Reply {
  int32_t status;  // 0 or an errno
  uint32_t index;
  uint64_t a, b, c, d;
};

// Both sides must agree on the layout of what they share (direct_layout.h, the key table's slots).
constexpr uint32_t kLayout = sizeof(core::MrRegion) << 16 | (sizeof(DirectShared) + sizeof(DirectInbox)) % 0xFFFF;

// The server's abstract socket name for the context at (address key, port): wire::IpAddress::key().
void socket_name(sockaddr_un& sa, socklen_t& len, uint32_t ip_key, uint16_t port);
// Sends a reply with up to two fds (-1: none).
bool send_reply(int fd, const Reply& r, int pass_fd, int pass_fd2 = -1);
// One request, one reply (and up to two fds; -1 when none came). Blocking, bounded by a receive timeout.
bool call(int sock, const Request& req, Reply* rep, int* fd, int* fd2 = nullptr);

}  // namespace softrdma::transport::direct
