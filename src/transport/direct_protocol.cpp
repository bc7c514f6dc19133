// The direct path's socket protocol (direct_protocol.h): naming the server's socket, and passing one
// request or reply with its fds.
#include "transport/direct_protocol.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>

namespace softrdma::transport::direct {

void socket_name(sockaddr_un& sa, socklen_t& len, uint32_t ip_key, uint16_t port) {
  sa = {};
  sa.sun_family = AF_UNIX;
  // Abstract (leading NUL): no file to clean up, and per network namespace like the registry.
  int n = snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "softrdma-direct-%08x-%u", ip_key, port);
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

bool send_reply(int fd, const Reply& r, int pass_fd, int pass_fd2) {
  iovec iov{const_cast<Reply*>(&r), sizeof r};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(2 * sizeof(int))];
  if (pass_fd >= 0) {
    const int fds[2] = {pass_fd, pass_fd2};
    const size_t n = pass_fd2 >= 0 ? 2 : 1;
    mh.msg_control = ctl;
    mh.msg_controllen = CMSG_SPACE(n * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, n * sizeof(int));
  }
  return sendmsg(fd, &mh, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof r);
}

bool call(int sock, const Request& req, Reply* rep, int* fd, int* fd2) {
  if (fd) *fd = -1;
  if (fd2) *fd2 = -1;
  if (send(sock, &req, sizeof req, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof req)) return false;
  iovec iov{rep, sizeof *rep};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(2 * sizeof(int))];
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof ctl;
  ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  int got[2] = {-1, -1};
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t k = std::min<size_t>(2, (c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      std::memcpy(got, CMSG_DATA(c), k * sizeof(int));
    }
  const bool ok = n == static_cast<ssize_t>(sizeof *rep);
  int* outs[2] = {ok ? fd : nullptr, ok ? fd2 : nullptr};
  for (int i = 0; i < 2; ++i) {
    if (outs[i]) *outs[i] = got[i];
    else if (got[i] >= 0) close(got[i]);
  }
  return ok;
}

}  // namespace softrdma::transport::direct
