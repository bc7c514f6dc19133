// The iWARP data path of RC QPs over TCP (docs/iwarp.md): requester, responder and completer roles
// speaking MPA/DDP/RDMAP (wire/iwarp.h) on the QP's socket.
#include <cerrno>
#include <unistd.h>

#include "transport/engine.h"

namespace softrdma::transport {

int Engine::iwarp_attach(Qp* qp, const IwarpAttach& a) {
  (void)qp;
  if (a.fd >= 0) ::close(a.fd);
  return EOPNOTSUPP;  // the data path is being built (issue 16)
}

}  // namespace softrdma::transport
