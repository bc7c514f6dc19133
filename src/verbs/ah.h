// Address handles (UD): the destination of a datagram, resolved once when the AH is created.
#pragma once
#include "verbs/soft_objects.h"

namespace softrdma::verbs {

struct SoftAh {
  ibv_ah ah;  // first: applications hold &ah
  ibv_ah_attr attr;
  uint32_t dest_ip_be;  // from the RoCE v2 GID ::ffff:a.b.c.d
};
inline SoftAh* to_ah(ibv_ah* a) { return reinterpret_cast<SoftAh*>(a); }

}  // namespace softrdma::verbs
