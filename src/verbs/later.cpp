// Verbs of later issues (UD address handles, multicast, ECE): they exist so every program
// loads, and fail cleanly with EOPNOTSUPP until their issue lands.
#include <cerrno>

#include "verbs/soft_objects.h"

SOFTRDMA_EXPORT int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, uint8_t*, uint16_t*) {
  return EOPNOTSUPP;
}
SOFTRDMA_EXPORT int ibv_query_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
SOFTRDMA_EXPORT int ibv_set_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
