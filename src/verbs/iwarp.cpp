// softrdma_iwarp_attach (private_abi.h): librdmacm's iWARP path hands a QP its TCP connection.
#include <cerrno>

#include "verbs/private_abi.h"
#include "verbs/soft_objects.h"


SOFTRDMA_EXPORT int softrdma_iwarp_attach(ibv_qp* qp, const softrdma_iwarp_conn* conn) {
  if (!qp || !conn || conn->fd < 0) return EINVAL;
  return EOPNOTSUPP;  // iWARP devices are being built (issue 16)
}
