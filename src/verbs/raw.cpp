// RAW_PACKET extras of the ABI: flow steering (ibv_create_flow), receive work queues (ibv_create_wq),
// indirection tables (ibv_create_rwq_ind_table) and RSS QPs (ibv_create_qp_ex with RX_HASH). The
// ibv_* structures are translated here; transport/raw.cpp does the work.
#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "core/limits.h"
#include "transport/raw.h"
#include "transport/raw_path.h"
#include "verbs/soft_objects.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

constexpr uint32_t kLogMaxIndTable = 8;  // indirection tables of up to 256 WQs
constexpr uint32_t kMaxIndTables = 64;
constexpr uint64_t kHashFields = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 | IBV_RX_HASH_SRC_IPV6 |
                                 IBV_RX_HASH_DST_IPV6 | IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP |
                                 IBV_RX_HASH_SRC_PORT_UDP | IBV_RX_HASH_DST_PORT_UDP;
static_assert(uint64_t{IBV_RX_HASH_SRC_IPV4} == uint64_t{transport::kHashSrcIpv4} &&
              uint64_t{IBV_RX_HASH_DST_PORT_UDP} == uint64_t{transport::kHashDstPortUdp});
static_assert(IBV_WQS_RDY == static_cast<int>(transport::WqState::Rdy) &&
              IBV_WQS_ERR == static_cast<int>(transport::WqState::Err));

struct SoftFlow {
  ibv_flow flow;  // first
  SoftQp* qp;
};

// ---- Flow steering ----

// Translates the specs that follow attr into m; 0, EINVAL (malformed) or EOPNOTSUPP (a spec we lack).
int translate_specs(const ibv_flow_attr& attr, transport::FlowMatch& m) {
  const auto* p = reinterpret_cast<const uint8_t*>(&attr + 1);
  // The specs follow one another, each with its own size (attr.size is not relied on: pyverbs, like
  // many callers, gives just sizeof(ibv_flow_attr)); an unreasonable size is refused.
  constexpr size_t room = 4096;
  size_t used = 0;
  for (int i = 0; i < attr.num_of_specs; ++i) {
    ibv_flow_spec spec_hdr;
    std::memcpy(&spec_hdr.hdr, p + used, sizeof spec_hdr.hdr);
    const size_t size = spec_hdr.hdr.size;
    if (size < sizeof spec_hdr.hdr || used + size > room) return EINVAL;
    const uint8_t* s = p + used;
    used += size;
    switch (spec_hdr.hdr.type) {
      case IBV_FLOW_SPEC_ETH: {
        ibv_flow_spec_eth e;
        if (size < sizeof e || m.has_eth) return EINVAL;
        std::memcpy(&e, s, sizeof e);
        m.has_eth = true;
        std::memcpy(m.eth.dst, e.val.dst_mac, 6);
        std::memcpy(m.eth.src, e.val.src_mac, 6);
        std::memcpy(m.eth_mask.dst, e.mask.dst_mac, 6);
        std::memcpy(m.eth_mask.src, e.mask.src_mac, 6);
        m.eth.ether_type = ntohs(e.val.ether_type);
        m.eth_mask.ether_type = ntohs(e.mask.ether_type);
        m.eth.vlan_tci = ntohs(e.val.vlan_tag);
        m.eth_mask.vlan_tci = ntohs(e.mask.vlan_tag);
        break;
      }
      case IBV_FLOW_SPEC_IPV4:
      case IBV_FLOW_SPEC_IPV4_EXT: {
        ibv_flow_spec_ipv4_ext v{};
        const bool ext = spec_hdr.hdr.type == IBV_FLOW_SPEC_IPV4_EXT;
        if (m.has_ipv4 || m.has_ipv6) return EINVAL;
        if (ext) {
          if (size < sizeof v) return EINVAL;
          std::memcpy(&v, s, sizeof v);
        } else {
          ibv_flow_spec_ipv4 b;
          if (size < sizeof b) return EINVAL;
          std::memcpy(&b, s, sizeof b);
          v.val.src_ip = b.val.src_ip;
          v.val.dst_ip = b.val.dst_ip;
          v.mask.src_ip = b.mask.src_ip;
          v.mask.dst_ip = b.mask.dst_ip;
        }
        m.has_ipv4 = true;
        m.ipv4 = {ntohl(v.val.src_ip), ntohl(v.val.dst_ip), v.val.proto, v.val.tos, v.val.ttl, v.val.flags};
        m.ipv4_mask = {ntohl(v.mask.src_ip), ntohl(v.mask.dst_ip), v.mask.proto, v.mask.tos, v.mask.ttl,
                       v.mask.flags};
        break;
      }
      case IBV_FLOW_SPEC_IPV6: {
        ibv_flow_spec_ipv6 v;
        if (size < sizeof v || m.has_ipv4 || m.has_ipv6) return EINVAL;
        std::memcpy(&v, s, sizeof v);
        m.has_ipv6 = true;
        std::memcpy(m.ipv6.src, v.val.src_ip, 16);
        std::memcpy(m.ipv6.dst, v.val.dst_ip, 16);
        std::memcpy(m.ipv6_mask.src, v.mask.src_ip, 16);
        std::memcpy(m.ipv6_mask.dst, v.mask.dst_ip, 16);
        m.ipv6.flow_label = ntohl(v.val.flow_label);
        m.ipv6_mask.flow_label = ntohl(v.mask.flow_label);
        m.ipv6.next_hdr = v.val.next_hdr;
        m.ipv6_mask.next_hdr = v.mask.next_hdr;
        m.ipv6.traffic_class = v.val.traffic_class;
        m.ipv6_mask.traffic_class = v.mask.traffic_class;
        m.ipv6.hop_limit = v.val.hop_limit;
        m.ipv6_mask.hop_limit = v.mask.hop_limit;
        break;
      }
      case IBV_FLOW_SPEC_TCP:
      case IBV_FLOW_SPEC_UDP: {
        ibv_flow_spec_tcp_udp v;
        if (size < sizeof v || m.l4 != transport::FlowMatch::L4::None) return EINVAL;
        std::memcpy(&v, s, sizeof v);
        m.l4 = spec_hdr.hdr.type == IBV_FLOW_SPEC_TCP ? transport::FlowMatch::L4::Tcp : transport::FlowMatch::L4::Udp;
        m.ports = {ntohs(v.val.src_port), ntohs(v.val.dst_port)};
        m.ports_mask = {ntohs(v.mask.src_port), ntohs(v.mask.dst_port)};
        break;
      }
      default: return EOPNOTSUPP;  // tunnels, ESP, MPLS, inner headers, actions
    }
  }
  return 0;
}

ibv_flow* create_flow(ibv_qp* qp, ibv_flow_attr* attr) {
  SoftQp* q = to_qp(qp);
  if (qp->qp_type != IBV_QPT_RAW_PACKET) {
    errno = EOPNOTSUPP;  // steering of Ethernet frames needs a raw packet QP
    return nullptr;
  }
  if (attr->comp_mask || attr->port != 1 || (attr->flags & ~uint32_t{IBV_FLOW_ATTR_FLAGS_DONT_TRAP | IBV_FLOW_ATTR_FLAGS_EGRESS})) {
    errno = EINVAL;
    return nullptr;
  }
  transport::FlowMatch m;
  if ((attr->flags & IBV_FLOW_ATTR_FLAGS_EGRESS) || (attr->type != IBV_FLOW_ATTR_NORMAL && attr->type != IBV_FLOW_ATTR_SNIFFER)) {
    // Default rules ("what no other rule takes") would need every rule of the host's processes.
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (attr->type == IBV_FLOW_ATTR_SNIFFER) {
    if (attr->num_of_specs) {
      errno = EINVAL;
      return nullptr;
    }
    m.match_all = true;
  } else if (int rc = translate_specs(*attr, m)) {
    errno = rc;
    return nullptr;
  }
  net::FrameRule rule;
  if (!transport::flow_rule(m, &rule)) {
    errno = EINVAL;
    return nullptr;
  }
  auto* f = new (std::nothrow) SoftFlow{};
  if (!f) {
    errno = ENOMEM;
    return nullptr;
  }
  uint32_t handle = 0;
  if (int rc = engine_of(qp->context).raw().attach_flow(*q->tqp, rule, &handle)) {
    delete f;
    errno = rc;
    return nullptr;
  }
  f->flow.context = qp->context;
  f->flow.handle = handle;
  f->qp = q;
  return &f->flow;
}

int destroy_flow(ibv_flow* flow) {
  auto* f = reinterpret_cast<SoftFlow*>(flow);
  int rc = engine_of(flow->context).raw().detach_flow(*f->qp->tqp, flow->handle);
  delete f;
  return rc;
}

// ---- Work queues ----

SoftWq* to_wq(ibv_wq* w) { return reinterpret_cast<SoftWq*>(w); }

int post_wq_recv(ibv_wq* wq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  SoftWq* w = to_wq(wq);
  transport::Engine& eng = engine_of(wq->context);
  for (ibv_recv_wr* cur = wr; cur; cur = cur->next) {
    transport::RecvWqe r;
    r.wr_id = cur->wr_id;
    if (cur->num_sge < 0 || static_cast<uint32_t>(cur->num_sge) > w->twq->max_sge) {
      *bad = cur;
      return EINVAL;
    }
    r.num_sge = static_cast<uint32_t>(cur->num_sge);
    r.length = 0;
    for (int i = 0; i < cur->num_sge; ++i) {
      r.sge[i] = {cur->sg_list[i].addr, cur->sg_list[i].length, cur->sg_list[i].lkey};
      r.length += cur->sg_list[i].length;
    }
    int b = 0;
    if (int rc = eng.raw().post_wq_recv(*w->twq, &r, 1, &b)) {
      *bad = cur;
      return rc;
    }
  }
  return 0;
}

ibv_wq* create_wq(ibv_context* ctx, ibv_wq_init_attr* a) {
  if (a->wq_type != IBV_WQT_RQ || (a->comp_mask & ~uint32_t{IBV_WQ_INIT_ATTR_FLAGS}) ||
      ((a->comp_mask & IBV_WQ_INIT_ATTR_FLAGS) && a->create_flags)) {
    errno = EOPNOTSUPP;  // no scatter-FCS, CVLAN stripping, delay drop or end padding
    return nullptr;
  }
  if (!a->pd || !a->cq || a->pd->context != ctx || a->cq->context != ctx) {
    errno = EINVAL;
    return nullptr;
  }
  auto* w = new (std::nothrow) SoftWq{};
  if (!w) {
    errno = ENOMEM;
    return nullptr;
  }
  w->twq = engine_of(ctx).raw().create_wq(a->pd->handle, to_cq(a->cq)->queue.get(), a->max_wr, a->max_sge);
  if (!w->twq) {
    delete w;
    return nullptr;
  }
  w->twq->user = w;
  a->max_wr = std::max<uint32_t>(a->max_wr, 1);
  a->max_sge = w->twq->max_sge;
  ++to_pd(a->pd)->users;
  ++to_cq(a->cq)->qp_refs;
  ibv_wq& b = w->wq;
  b.context = ctx;
  b.pd = a->pd;
  b.cq = a->cq;
  b.wq_num = w->twq->wqn;
  b.handle = w->twq->wqn;
  b.state = IBV_WQS_RESET;
  b.wq_type = IBV_WQT_RQ;
  b.post_recv = post_wq_recv;
  return &b;
}

int modify_wq(ibv_wq* wq, ibv_wq_attr* a) {
  SoftWq* w = to_wq(wq);
  const uint32_t known = IBV_WQ_ATTR_STATE | IBV_WQ_ATTR_CURR_STATE | IBV_WQ_ATTR_FLAGS;
  if (a->attr_mask & ~known) return EINVAL;
  if ((a->attr_mask & IBV_WQ_ATTR_FLAGS) && a->flags_mask) return EOPNOTSUPP;
  const auto cur = static_cast<ibv_wq_state>(w->twq->state.load());
  if ((a->attr_mask & IBV_WQ_ATTR_CURR_STATE) && a->curr_wq_state != cur) return EINVAL;
  if (!(a->attr_mask & IBV_WQ_ATTR_STATE)) return 0;
  const ibv_wq_state next = a->wq_state;
  // RESET -> RDY -> ERR, and back to RESET from anywhere; ERR is left only through RESET.
  const bool ok = next == IBV_WQS_RESET || next == IBV_WQS_ERR || (next == IBV_WQS_RDY && cur != IBV_WQS_ERR);
  if (!ok) return EINVAL;
  if (int rc = engine_of(wq->context).raw().modify_wq(*w->twq, static_cast<transport::WqState>(next))) return rc;
  wq->state = next;
  return 0;
}

int destroy_wq(ibv_wq* wq) {
  SoftWq* w = to_wq(wq);
  if (w->ind_refs.load()) return EBUSY;
  engine_of(wq->context).raw().destroy_wq(w->twq);
  --to_pd(wq->pd)->users;
  --to_cq(wq->cq)->qp_refs;
  delete w;
  return 0;
}

// ---- Indirection tables ----

std::atomic<uint32_t> g_ind_tables{0};

ibv_rwq_ind_table* create_rwq_ind_table(ibv_context* ctx, ibv_rwq_ind_table_init_attr* a) {
  if (a->comp_mask) {
    errno = EINVAL;
    return nullptr;
  }
  if (a->log_ind_tbl_size > kLogMaxIndTable || !a->ind_tbl) {
    errno = EINVAL;
    return nullptr;
  }
  const size_t n = size_t{1} << a->log_ind_tbl_size;
  for (size_t i = 0; i < n; ++i)
    if (!a->ind_tbl[i] || a->ind_tbl[i]->context != ctx || a->ind_tbl[i]->wq_type != IBV_WQT_RQ) {
      errno = EINVAL;
      return nullptr;
    }
  if (!take_slot(g_ind_tables, kMaxIndTables)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* t = new (std::nothrow) SoftRwqIndTable{};
  if (!t) {
    --g_ind_tables;
    errno = ENOMEM;
    return nullptr;
  }
  for (size_t i = 0; i < n; ++i) {
    SoftWq* w = to_wq(a->ind_tbl[i]);
    ++w->ind_refs;
    t->wqs.push_back(w);
  }
  static std::atomic<int> next_num{1};
  t->table.context = ctx;
  t->table.ind_tbl_num = t->table.ind_tbl_handle = next_num++;
  return &t->table;
}

int destroy_rwq_ind_table(ibv_rwq_ind_table* table) {
  auto* t = reinterpret_cast<SoftRwqIndTable*>(table);
  if (t->qp_refs.load()) return EBUSY;
  for (SoftWq* w : t->wqs) --w->ind_refs;
  delete t;
  --g_ind_tables;
  return 0;
}

}  // namespace

namespace softrdma::verbs {

ibv_qp* create_rss_qp(ibv_context* ctx, ibv_qp_init_attr_ex* a) {
  const uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_IND_TABLE |
                         IBV_QP_INIT_ATTR_RX_HASH;
  const uint32_t both = IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH;
  if ((a->comp_mask & ~known) || ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags) ||
      a->qp_type != IBV_QPT_RAW_PACKET) {
    errno = EOPNOTSUPP;  // RSS spreads raw packet QPs' frames only
    return nullptr;
  }
  const ibv_rx_hash_conf& h = a->rx_hash_conf;
  if ((a->comp_mask & both) != both || !(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd || !a->rwq_ind_tbl ||
      a->rwq_ind_tbl->context != ctx || a->pd->context != ctx || !h.rx_hash_key || h.rx_hash_key_len < 4) {
    errno = EINVAL;
    return nullptr;
  }
  if (h.rx_hash_function != IBV_RX_HASH_FUNC_TOEPLITZ || (h.rx_hash_fields_mask & ~kHashFields)) {
    errno = EOPNOTSUPP;  // Toeplitz over outer IP addresses and TCP/UDP ports only
    return nullptr;
  }
  RssSetup rss;
  rss.table = reinterpret_cast<SoftRwqIndTable*>(a->rwq_ind_tbl);
  rss.key.assign(h.rx_hash_key, h.rx_hash_key + h.rx_hash_key_len);
  rss.fields = h.rx_hash_fields_mask;
  ibv_qp_init_attr ia{};
  ia.qp_context = a->qp_context;
  ia.qp_type = IBV_QPT_RAW_PACKET;
  ibv_qp* qp = create_qp_with(ctx, a->pd, ia, &rss);
  if (qp) {
    a->cap = ibv_qp_cap{};
    to_qp(qp)->qpx.comp_mask = 0;
  }
  return qp;
}

void fill_raw_caps(ibv_device_attr_ex& a) {
  using L = core::DeviceLimits;
  a.rss_caps.supported_qpts = 1u << IBV_QPT_RAW_PACKET;
  a.rss_caps.max_rwq_indirection_tables = kMaxIndTables;
  a.rss_caps.max_rwq_indirection_table_size = 1u << kLogMaxIndTable;
  a.rss_caps.rx_hash_fields_mask = kHashFields;
  a.rss_caps.rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ;
  a.max_wq_type_rq = L::kMaxQp;
  // IBV_SEND_IP_CSUM on raw packet QPs: the IPv4 header and TCP/UDP checksums, in software.
  a.raw_packet_caps = IBV_RAW_PACKET_CAP_IP_CSUM;
  // (IBV_DEVICE_RAW_IP_CSUM is among the classic flags, device.cpp.)
}

void install_raw_ops(verbs_context& v) {
  v.ibv_create_flow = create_flow;
  v.ibv_destroy_flow = destroy_flow;
  v.create_wq = create_wq;
  v.modify_wq = modify_wq;
  v.destroy_wq = destroy_wq;
  v.create_rwq_ind_table = create_rwq_ind_table;
  v.destroy_rwq_ind_table = destroy_rwq_ind_table;
}

}  // namespace softrdma::verbs
