// libefa.so.1 stand-in: the EFA direct-verbs entry points perftest links against. They are only
// reached for EFA devices (-c SRD); a softrdma device is never one, so each fails cleanly.

#include <infiniband/efadv.h>

#include <cerrno>
#include <cstdint>

#pragma GCC visibility push(default)
extern "C" {

struct ibv_qp *efadv_create_qp_ex(struct ibv_context *, struct ibv_qp_init_attr_ex *,
                                  struct efadv_qp_init_attr *, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}

int efadv_query_device(struct ibv_context *, struct efadv_device_attr *, uint32_t) {
  return EOPNOTSUPP;
}

}  // extern "C"
#pragma GCC visibility pop
