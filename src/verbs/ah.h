// Address handles (UD): the destination of a datagram, resolved once when the AH is created.
#pragma once
#include "verbs/soft_objects.h"

namespace softrdma::verbs {

struct SoftAh {
  ibv_ah ah;  // first: applications hold &ah
  ibv_ah_attr attr;
  wire::IpAddress dest_ip;  // the RoCE v2 destination GID's address
};
inline SoftAh* to_ah(ibv_ah* a) { return reinterpret_cast<SoftAh*>(a); }

// The address a RoCE v2 address vector names on this context's device: it needs a GRH, our only
// source GID (index 0), and a unicast destination GID of the device's own family (::ffff:a.b.c.d on
// an IPv4 device, an IPv6 address on an IPv6 one: each device's port has one socket). 0 or EINVAL.
// A connected QP's path (qp_path) is checked for the GRH and the family only, as before any traffic.
int av_destination(ibv_context* ctx, const ibv_ah_attr& a, wire::IpAddress* out, bool qp_path = false);

}  // namespace softrdma::verbs
