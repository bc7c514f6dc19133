// The rsocket API (rdma/rsocket.h): not implemented. rdmacm-utils binaries import these symbols (their
// shared examples code calls rpoll/rs_* only in rsocket modes), so they must exist; each fails cleanly
// with ENOSYS, with the exact prototype so callers read the right return width.
#include <rdma/rsocket.h>

#include <cerrno>

#define SOFTRDMA_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
template <typename T>
T nosys() {
  errno = ENOSYS;
  return static_cast<T>(-1);
}
}  // namespace

SOFTRDMA_EXPORT int rsocket(int, int, int) { return nosys<int>(); }
SOFTRDMA_EXPORT int rbind(int, const struct sockaddr*, socklen_t) { return nosys<int>(); }
SOFTRDMA_EXPORT int rlisten(int, int) { return nosys<int>(); }
SOFTRDMA_EXPORT int raccept(int, struct sockaddr*, socklen_t*) { return nosys<int>(); }
SOFTRDMA_EXPORT int rconnect(int, const struct sockaddr*, socklen_t) { return nosys<int>(); }
SOFTRDMA_EXPORT int rshutdown(int, int) { return nosys<int>(); }
SOFTRDMA_EXPORT int rclose(int) { return nosys<int>(); }
SOFTRDMA_EXPORT ssize_t rrecv(int, void*, size_t, int) { return nosys<ssize_t>(); }
SOFTRDMA_EXPORT ssize_t rrecvfrom(int, void*, size_t, int, struct sockaddr*, socklen_t*) { return nosys<ssize_t>(); }
SOFTRDMA_EXPORT ssize_t rrecvmsg(int, struct msghdr*, int) { return nosys<ssize_t>(); }
SOFTRDMA_EXPORT ssize_t rsend(int, const void*, size_t, int) { return nosys<ssize_t>(); }
SOFTRDMA_EXPORT ssize_t rsendto(int, const void*, size_t, int, const struct sockaddr*, socklen_t) {
  return nosys<ssize_t>();
}
SOFTRDMA_EXPORT ssize_t rsendmsg(int, const struct msghdr*, int) { return nosys<ssize_t>(); }
SOFTRDMA_EXPORT ssize_t rread(int, void*, size_t) { return nosys<ssize_t>(); }
SOFTRDMA_EXPORT ssize_t rreadv(int, const struct iovec*, int) { return nosys<ssize_t>(); }
SOFTRDMA_EXPORT ssize_t rwrite(int, const void*, size_t) { return nosys<ssize_t>(); }
SOFTRDMA_EXPORT ssize_t rwritev(int, const struct iovec*, int) { return nosys<ssize_t>(); }
SOFTRDMA_EXPORT int rpoll(struct pollfd*, nfds_t, int) { return nosys<int>(); }
SOFTRDMA_EXPORT int rselect(int, fd_set*, fd_set*, fd_set*, struct timeval*) { return nosys<int>(); }
SOFTRDMA_EXPORT int rgetpeername(int, struct sockaddr*, socklen_t*) { return nosys<int>(); }
SOFTRDMA_EXPORT int rgetsockname(int, struct sockaddr*, socklen_t*) { return nosys<int>(); }
SOFTRDMA_EXPORT int rsetsockopt(int, int, int, const void*, socklen_t) { return nosys<int>(); }
SOFTRDMA_EXPORT int rgetsockopt(int, int, int, void*, socklen_t*) { return nosys<int>(); }
SOFTRDMA_EXPORT int rfcntl(int, int, ...) { return nosys<int>(); }
SOFTRDMA_EXPORT off_t riomap(int, void*, size_t, int, int, off_t) { return nosys<off_t>(); }
SOFTRDMA_EXPORT int riounmap(int, void*, size_t) { return nosys<int>(); }
SOFTRDMA_EXPORT size_t riowrite(int, const void*, size_t, off_t, int) { return nosys<size_t>(); }
