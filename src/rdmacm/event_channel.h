// Event channels as rsockets number themselves by them (rsocket.cpp): an rsocket's number is its
// channel's fd, which must come after the fd a caller made for it (librspreload, below).
#pragma once
#include <rdma/rdma_cma.h>

namespace softrdma::rdmacm {

// Moves a channel that has no events yet to an fd numbered at least min_fd: the same eventfd (its
// flags kept), the old number closed. Returns the new fd, or -1 with errno.
int renumber_event_channel(rdma_event_channel* ch, int min_fd);

}  // namespace softrdma::rdmacm
