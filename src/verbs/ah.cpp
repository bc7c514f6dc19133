// Address handles: ibv_create_ah/ibv_destroy_ah, and the reply address of a received UD message
// (ibv_init_ah_from_wc/ibv_create_ah_from_wc) read from the GRH area RoCE v2 fills; and UD multicast
// (ibv_attach_mcast/ibv_detach_mcast) over the IP groups the multicast GIDs map to.
#include "verbs/ah.h"

#include <cerrno>
#include <cstring>

#include "core/limits.h"

using namespace softrdma;
using namespace softrdma::verbs;

int softrdma::verbs::av_destination(ibv_context* ctx, const ibv_ah_attr& a, wire::IpAddress* out, bool qp_path) {
  if ((!qp_path && a.port_num != 1) || !a.is_global || a.grh.sgid_index != 0) return EINVAL;
  const wire::IpAddress ip = wire::IpAddress::from_bytes(a.grh.dgid.raw);
  if (ip.is_v4() != to_ctx(ctx)->device->iface.ip.is_v4()) return EINVAL;
  // An address handle may name a multicast group of either family (UD), never IPv4's broadcast.
  if (!qp_path && (!ip.is_set() || (ip.is_v4() && ip.v4_be() == 0xFFFFFFFFu))) return EINVAL;
  *out = ip;
  return 0;
}

SOFTRDMA_EXPORT ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (pd && is_iwarp(pd->context)) {
    errno = EOPNOTSUPP;  // address handles are for UD, which an RNIC does not have (siw has none)
    return nullptr;
  }
  wire::IpAddress ip;
  if (!pd || !attr || av_destination(pd->context, *attr, &ip)) {
    errno = EINVAL;
    return nullptr;
  }
  auto* a = new (std::nothrow) SoftAh{};
  if (!a) {
    errno = ENOMEM;
    return nullptr;
  }
  a->attr = *attr;
  a->dest_ip = ip;
  a->ah.context = pd->context;
  a->ah.pd = pd;
  a->ah.handle = to_ctx(pd->context)->next_handle++;
  ++to_pd(pd)->users;  // the PD cannot be deallocated while the AH exists (EBUSY)
  return &a->ah;
}

SOFTRDMA_EXPORT int ibv_destroy_ah(ibv_ah* ah) {
  if (!ah) return EINVAL;
  --to_pd(ah->pd)->users;
  delete to_ah(ah);
  return 0;
}

SOFTRDMA_EXPORT int ibv_init_ah_from_wc(ibv_context* ctx, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                                        ibv_ah_attr* ah_attr) {
  // RoCE carries every message's addresses in its GRH: without one there is nothing to reply to.
  if (!ctx || !wc || !grh || !ah_attr || port_num != 1 || !(wc->wc_flags & IBV_WC_GRH)) {
    errno = EINVAL;
    return -1;
  }
  // RoCE v2 over IPv4: the IPv4 header is the last 20 bytes of the 40-byte GRH area; over IPv6 the
  // GRH area is the IPv6 header.
  const auto* area = reinterpret_cast<const uint8_t*>(grh);
  const uint8_t* ip = area + 20;
  wire::IpAddress src, dst;
  uint8_t traffic_class = 0;
  if (ip[0] >> 4 == 4) {
    uint32_t s4, d4;
    std::memcpy(&s4, ip + 12, 4);
    std::memcpy(&d4, ip + 16, 4);
    src = wire::IpAddress::v4(s4);
    dst = wire::IpAddress::v4(d4);
    traffic_class = ip[1];
  } else if (area[0] >> 4 == 6) {
    src = wire::IpAddress::from_bytes(area + 8);
    dst = wire::IpAddress::from_bytes(area + 24);
    traffic_class = static_cast<uint8_t>((area[0] << 4) | (area[1] >> 4));
  } else {
    errno = EINVAL;
    return -1;
  }
  // The message must have been addressed to our GID (or to a multicast group we joined).
  if (dst != to_ctx(ctx)->device->iface.ip && !dst.is_multicast()) {
    errno = EINVAL;
    return -1;
  }
  std::memset(ah_attr, 0, sizeof *ah_attr);
  ah_attr->dlid = wc->slid;
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  ah_attr->is_global = 1;
  std::memcpy(ah_attr->grh.dgid.raw, src.bytes.data(), 16);
  ah_attr->grh.sgid_index = 0;
  ah_attr->grh.hop_limit = 0xFF;
  ah_attr->grh.traffic_class = traffic_class;
  return 0;
}

SOFTRDMA_EXPORT ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  ibv_ah_attr attr;
  if (!pd || ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr)) return nullptr;
  return ibv_create_ah(pd, &attr);
}

namespace {
// The group a multicast GID names: an IPv4 group as ::ffff:224.0.0.0/4, or an IPv6 one (ff00::/8),
// RoCE v2's GIDs for them.
int mcast_group(const ibv_qp* qp, const ibv_gid* gid, wire::IpAddress* group) {
  if (!qp || !gid || qp->qp_type != IBV_QPT_UD) return EINVAL;  // only UD QPs join groups
  *group = wire::IpAddress::from_bytes(gid->raw);
  return group->is_multicast() ? 0 : EINVAL;
}
}  // namespace

SOFTRDMA_EXPORT int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  wire::IpAddress group;
  if (int rc = mcast_group(qp, gid, &group)) return rc;
  return engine_of(qp->context).ports().attach_mcast(to_qp(qp)->tqp, group);
}

SOFTRDMA_EXPORT int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  wire::IpAddress group;
  if (int rc = mcast_group(qp, gid, &group)) return rc;
  return engine_of(qp->context).ports().detach_mcast(to_qp(qp)->tqp, group);
}
