// Address handles: ibv_create_ah/ibv_destroy_ah, and the reply address of a received UD message
// (ibv_init_ah_from_wc/ibv_create_ah_from_wc) read from the GRH area RoCE v2 fills; and UD multicast
// (ibv_attach_mcast/ibv_detach_mcast) over the IPv4 groups the multicast GIDs map to.
#include "verbs/ah.h"

#include <cerrno>
#include <cstring>

#include "core/limits.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};

// The IPv4 address an address vector names: softrdma's port speaks RoCE v2 over IPv4 only, so the
// AV needs a GRH, our only source GID (index 0), and an IPv4-mapped destination GID.
int av_destination(const ibv_ah_attr& a, uint32_t* ip_be) {
  if (a.port_num != 1 || !a.is_global || a.grh.sgid_index != 0) return EINVAL;
  if (std::memcmp(a.grh.dgid.raw, kMappedPrefix, sizeof kMappedPrefix) != 0) return EINVAL;
  std::memcpy(ip_be, a.grh.dgid.raw + 12, 4);
  if (*ip_be == 0 || *ip_be == 0xFFFFFFFFu) return EINVAL;
  return 0;
}

void mapped_gid(ibv_gid& g, const uint8_t* ip4) {
  std::memset(g.raw, 0, sizeof g.raw);
  g.raw[10] = 0xFF;
  g.raw[11] = 0xFF;
  std::memcpy(g.raw + 12, ip4, 4);
}

}  // namespace

SOFTRDMA_EXPORT ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (pd && is_iwarp(pd->context)) {
    errno = EOPNOTSUPP;  // address handles are for UD, which an RNIC does not have (siw has none)
    return nullptr;
  }
  uint32_t ip = 0;
  if (!pd || !attr || av_destination(*attr, &ip)) {
    errno = EINVAL;
    return nullptr;
  }
  auto* a = new (std::nothrow) SoftAh{};
  if (!a) {
    errno = ENOMEM;
    return nullptr;
  }
  a->attr = *attr;
  a->dest_ip_be = ip;
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
  // RoCE v2 over IPv4: the IPv4 header is the last 20 bytes of the 40-byte GRH area.
  const uint8_t* ip = reinterpret_cast<const uint8_t*>(grh) + 20;
  if (ip[0] >> 4 != 4) {
    errno = EINVAL;
    return -1;
  }
  const uint8_t* src = ip + 12;
  const uint8_t* dst = ip + 16;
  // The message must have been addressed to our GID (or to a multicast group we joined).
  uint32_t dst_be, ours = to_ctx(ctx)->device->iface.ip_be;
  std::memcpy(&dst_be, dst, 4);
  if (dst_be != ours && (dst[0] & 0xF0) != 0xE0) {
    errno = EINVAL;
    return -1;
  }
  std::memset(ah_attr, 0, sizeof *ah_attr);
  ah_attr->dlid = wc->slid;
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  ah_attr->is_global = 1;
  mapped_gid(ah_attr->grh.dgid, src);
  ah_attr->grh.sgid_index = 0;
  ah_attr->grh.hop_limit = 0xFF;
  ah_attr->grh.traffic_class = ip[1];
  return 0;
}

SOFTRDMA_EXPORT ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  ibv_ah_attr attr;
  if (!pd || ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr)) return nullptr;
  return ibv_create_ah(pd, &attr);
}

namespace {
// The IPv4 group a multicast GID names: ::ffff:224.0.0.0/4 (RoCE v2 over IPv4).
int mcast_group(const ibv_qp* qp, const ibv_gid* gid, uint32_t* ip_be) {
  if (!qp || !gid || qp->qp_type != IBV_QPT_UD) return EINVAL;  // only UD QPs join groups
  if (std::memcmp(gid->raw, kMappedPrefix, sizeof kMappedPrefix) != 0 || (gid->raw[12] & 0xF0) != 0xE0)
    return EINVAL;
  std::memcpy(ip_be, gid->raw + 12, 4);
  return 0;
}
}  // namespace

SOFTRDMA_EXPORT int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  uint32_t ip = 0;
  if (int rc = mcast_group(qp, gid, &ip)) return rc;
  return engine_of(qp->context).ports().attach_mcast(to_qp(qp)->tqp, ip);
}

SOFTRDMA_EXPORT int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  uint32_t ip = 0;
  if (int rc = mcast_group(qp, gid, &ip)) return rc;
  return engine_of(qp->context).ports().detach_mcast(to_qp(qp)->tqp, ip);
}
