// softrdma_qp_set_wire_key (private_abi.h): an application or librdmacm installs the secret a RoCEv2
// QP protects its packets with (transport/protect.cpp).
#include <cerrno>

#include "verbs/private_abi.h"
#include "verbs/soft_objects.h"

using namespace softrdma;
using namespace softrdma::verbs;

SOFTRDMA_EXPORT int softrdma_qp_set_wire_key(ibv_qp* qp, uint32_t mode, const void* secret, size_t len) {
  if (!qp || mode > SOFTRDMA_WIRE_ENCRYPT) return EINVAL;
  // iWARP QPs run over TCP: no RoCEv2 packets to protect.
  if (is_iwarp(qp->context)) return EINVAL;
  SoftQp* q = to_qp(qp);
  if (q->opened_of) return EINVAL;  // an XRC target handle
  return engine_of(qp->context)
      .protection()
      .set_wire_key(q->tqp, static_cast<wire::Protection>(mode), static_cast<const uint8_t*>(secret), len);
}

SOFTRDMA_EXPORT int softrdma_qpn_peer_gone(ibv_context* ctx, uint32_t qpn) {
  if (!ctx || is_iwarp(ctx)) return 0;  // iWARP: its TCP connection tells
  return engine_of(ctx).peer_gone(qpn) ? 1 : 0;
}

SOFTRDMA_EXPORT void softrdma_count_wire_reject(ibv_context* ctx) {
  if (ctx) engine_of(ctx).protection().count_wire_reject();
}

SOFTRDMA_EXPORT void softrdma_count_cm_disconnect(ibv_context* ctx, int why) {
  if (ctx)
    engine_of(ctx).count_device(why == SOFTRDMA_CM_PEER_GONE ? &core::Counters::cm_peer_gone
                                                             : &core::Counters::cm_dreq_rcvd);
}
