// The kernel's socket(2), called directly: softrdma's own sockets must never reach a socket() that a
// preloaded library interposes (librspreload turns every TCP socket into an rsocket, which would
// run softrdma's rdma_cm inside itself).
#pragma once
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace softrdma::net {

inline int os_socket(int domain, int type, int protocol) {
  return static_cast<int>(syscall(SYS_socket, domain, type, protocol));
}

}  // namespace softrdma::net
