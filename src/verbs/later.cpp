// Verbs of later issues (UD address handles, multicast, ECE, import): they exist so every program
// loads, and fail cleanly with EOPNOTSUPP until their issue lands.
#include <cerrno>

#include "verbs/soft_objects.h"

SOFTRDMA_EXPORT int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, uint8_t*, uint16_t*) {
  return EOPNOTSUPP;
}
SOFTRDMA_EXPORT int ibv_query_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
SOFTRDMA_EXPORT int ibv_set_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
SOFTRDMA_EXPORT ibv_context* ibv_import_device(int) {
  errno = EOPNOTSUPP;
  return nullptr;
}
SOFTRDMA_EXPORT ibv_pd* ibv_import_pd(ibv_context*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
SOFTRDMA_EXPORT ibv_mr* ibv_import_mr(ibv_pd*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
SOFTRDMA_EXPORT void ibv_unimport_pd(ibv_pd*) {}
SOFTRDMA_EXPORT void ibv_unimport_mr(ibv_mr*) {}
