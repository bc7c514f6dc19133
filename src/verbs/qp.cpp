// Queue pairs: creation, the modify/query state machine (validated per IBTA, executed by the engine),
// and the data-path entries: classic ibv_post_send/ibv_post_recv and the ibv_qp_ex ibv_wr_* API.
#include <arpa/inet.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/limits.h"
#include "transport/raw_path.h"
#include "transport/work_request.h"
#include "verbs/ah.h"
#include "verbs/parent_domain.h"
#include "verbs/qp_state.h"
#include "verbs/soft_objects.h"

using namespace softrdma;
using namespace softrdma::verbs;
using transport::SendWqe;
using transport::WrOp;

static_assert(+transport::kModDestQpn == +IBV_QP_DEST_QPN && +transport::kModMaxDestRdAtomic == +IBV_QP_MAX_DEST_RD_ATOMIC &&
              +transport::kModAv == +IBV_QP_AV && +transport::kModSqPsn == +IBV_QP_SQ_PSN);

namespace {

void qpx_install(SoftQp* q);

ibv_qp* create(ibv_context* ctx, ibv_pd* pd, const ibv_qp_init_attr& ia, SoftXrcd* xrcd = nullptr,
               const RssSetup* rss = nullptr) {
  const bool xrc_send = ia.qp_type == IBV_QPT_XRC_SEND, xrc_recv = ia.qp_type == IBV_QPT_XRC_RECV;
  if (is_iwarp(ctx) && (ia.qp_type != IBV_QPT_RC || rss)) {
    errno = EOPNOTSUPP;  // an RNIC has RC QPs only (siw_create_qp: "only RC QP's supported")
    return nullptr;
  }
  if (ia.qp_type != IBV_QPT_RC && ia.qp_type != IBV_QPT_UC && ia.qp_type != IBV_QPT_UD &&
      ia.qp_type != IBV_QPT_RAW_PACKET && !xrc_send && !xrc_recv) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (ia.qp_type == IBV_QPT_RAW_PACKET && ia.srq) {
    errno = EOPNOTSUPP;  // raw packet QPs receive into their own RQ (or an RSS QP's WQs)
    return nullptr;
  }
  // XRC (ibv_create_qp_ex(3)): an XRC_SEND QP has a PD and a send CQ, no receive side; an XRC_RECV QP
  // has an XRC domain and nothing else: its receives land in the XRC SRQs of the domain. An RSS QP
  // only receives, into the WQs of its indirection table: it has no CQs or queues of its own.
  ibv_cq* send_cq = xrc_recv || rss ? nullptr : ia.send_cq;
  ibv_cq* recv_cq = xrc_send || xrc_recv || rss ? nullptr : ia.recv_cq;
  if (xrc_recv ? (!xrcd || xrcd->xrcd.context != ctx)
               : (!pd || pd->context != ctx ||
                  (!rss && (!send_cq || send_cq->context != ctx ||
                            (!xrc_send && (!recv_cq || recv_cq->context != ctx)))))) {
    errno = EINVAL;
    return nullptr;
  }
  if ((ia.srq && ia.srq->context != ctx) || ((xrc_send || xrc_recv) && ia.srq)) {
    errno = EINVAL;
    return nullptr;
  }
  using L = core::DeviceLimits;
  // With an SRQ the receive capabilities are ignored (ibv_create_qp(3)): the QP has no RQ of its own.
  ibv_qp_cap cap = ia.cap;
  if (ia.srq || xrc_send || xrc_recv) cap.max_recv_wr = cap.max_recv_sge = 0;
  if (xrc_recv) cap.max_send_wr = cap.max_send_sge = cap.max_inline_data = 0;
  if (rss) cap = ibv_qp_cap{};
  if (cap.max_send_wr > L::kMaxQpWr || cap.max_recv_wr > L::kMaxQpWr || cap.max_send_sge > L::kMaxSge ||
      cap.max_recv_sge > L::kMaxSge || cap.max_inline_data > L::kMaxInline) {
    errno = EINVAL;
    return nullptr;
  }
  // In a parent domain with allocators, the QP object lives in the application's memory.
  auto* q = pd_new<SoftQp>(pd, kResourceQp);
  if (!q) {
    errno = ENOMEM;
    return nullptr;
  }
  transport::QpConfig cfg;
  cfg.pd = xrc_recv ? 0 : pd->handle;
  cfg.send_cq = send_cq ? to_cq(send_cq)->queue.get() : nullptr;
  cfg.recv_cq = recv_cq ? to_cq(recv_cq)->queue.get() : nullptr;
  if (rss) {
    for (SoftWq* w : rss->table->wqs) cfg.rss_table.push_back(w->twq);
    cfg.rss_key = rss->key;
    cfg.rss_fields = rss->fields;
  }
  cfg.max_send_wr = cap.max_send_wr;
  cfg.max_recv_wr = cap.max_recv_wr;
  cfg.max_send_sge = std::max<uint32_t>(cap.max_send_sge, 1);
  cfg.max_recv_sge = std::max<uint32_t>(cap.max_recv_sge, 1);
  cfg.max_inline = L::kMaxInline;
  cfg.sq_sig_all = ia.sq_sig_all != 0;
  cfg.type = xrc_send || xrc_recv ? transport::QpType::Rc : static_cast<transport::QpType>(ia.qp_type);
  cfg.xrc = xrc_send ? transport::XrcRole::Send : xrc_recv ? transport::XrcRole::Recv : transport::XrcRole::None;
  if (xrc_recv) cfg.xrcd = xrcd->id;
  if (ia.qp_type == IBV_QPT_UD) {
    // A UD message is at most one packet of the port's active MTU (the QP has no path MTU).
    ibv_port_attr pa{};
    query_port_ex(ctx, 1, &pa, sizeof pa);
    cfg.ud_mtu = core::mtu_bytes(pa.active_mtu);
  }
  if (ia.srq) cfg.srq = to_srq(ia.srq)->tsrq;
  // A parent domain's allocator also gives the send queue's ring (the RQ ring stays in the arena,
  // where intra-host peers read it).
  if (is_parent_domain(pd)) {
    cfg.sq_ring = pd_allocate(pd, transport::sq_ring_bytes(cfg.max_send_wr), 64, kResourceSendQueue);
    if (!cfg.sq_ring) {
      pd_delete(pd, q, kResourceQp);
      errno = ENOMEM;
      return nullptr;
    }
  }
  q->tqp = engine_of(ctx).create_qp(cfg);
  if (!q->tqp) {
    int e = errno;
    if (cfg.sq_ring) pd_release(pd, cfg.sq_ring, kResourceSendQueue);
    pd_delete(pd, q, kResourceQp);
    errno = e;
    return nullptr;
  }
  q->tqp->user = q;
  q->init = ia;
  if (rss) {
    q->init.send_cq = q->init.recv_cq = nullptr;
    q->ind_table = rss->table;
    ++rss->table->qp_refs;
  }
  q->init.cap.max_send_sge = cfg.max_send_sge;
  q->init.cap.max_recv_wr = cap.max_recv_wr;
  q->init.cap.max_recv_sge = ia.srq || xrc_send || xrc_recv ? 0 : cfg.max_recv_sge;
  q->init.cap.max_inline_data = xrc_recv ? 0 : cfg.max_inline;
  if (rss) q->init.cap = ibv_qp_cap{};
  q->init.send_cq = send_cq;
  q->init.recv_cq = recv_cq;
  if (xrc_recv) {
    q->xrcd = xrcd;
    ++xrcd->users;
    pd = nullptr;
  } else {
    ++to_pd(pd)->users;
  }
  if (send_cq) ++to_cq(send_cq)->qp_refs;
  if (recv_cq) ++to_cq(recv_cq)->qp_refs;
  ibv_qp& b = q->qpx.qp_base;
  b.context = ctx;
  b.qp_context = ia.qp_context;
  b.pd = pd;
  b.send_cq = send_cq;
  b.recv_cq = recv_cq;
  b.srq = ia.srq;
  b.handle = q->tqp->qpn;
  b.qp_num = q->tqp->qpn;
  b.state = IBV_QPS_RESET;
  b.qp_type = ia.qp_type;
  pthread_mutex_init(&b.mutex, nullptr);
  pthread_cond_init(&b.cond, nullptr);
  q->attr.qp_state = IBV_QPS_RESET;
  q->attr.cap = q->init.cap;
  qpx_install(q);
  if (xrc_recv) register_xrc_target(q);
  return &b;
}

// Translates one ibv_send_wr; 0 or EINVAL.
int translate(const ibv_send_wr& wr, const transport::QpConfig& cfg, SendWqe& w) {
  w.wr_id = wr.wr_id;
  w.flags = 0;
  if (wr.send_flags & IBV_SEND_SIGNALED) w.flags |= transport::kSignaled;
  if (wr.send_flags & IBV_SEND_FENCE) w.flags |= transport::kFence;
  if (wr.send_flags & IBV_SEND_SOLICITED) w.flags |= transport::kSolicited;
  // Checksum offload: raw packet frames only (IBV_DEVICE_RAW_IP_CSUM).
  if ((wr.send_flags & IBV_SEND_IP_CSUM) && cfg.type == transport::QpType::Raw) w.flags |= transport::kIpCsum;
  w.imm_be = wr.imm_data;
  switch (wr.opcode) {
    case IBV_WR_SEND: w.op = WrOp::Send; break;
    case IBV_WR_SEND_WITH_IMM: w.op = WrOp::SendImm; break;
    case IBV_WR_SEND_WITH_INV: w.op = WrOp::SendInv; w.imm_be = wr.invalidate_rkey; break;
    case IBV_WR_RDMA_WRITE: w.op = WrOp::Write; break;
    case IBV_WR_RDMA_WRITE_WITH_IMM: w.op = WrOp::WriteImm; break;
    case IBV_WR_RDMA_READ: w.op = WrOp::Read; break;
    case IBV_WR_ATOMIC_CMP_AND_SWP: w.op = WrOp::CompareSwap; break;
    case IBV_WR_ATOMIC_FETCH_AND_ADD: w.op = WrOp::FetchAdd; break;
    // The 8 bytes come from the gather list (or inline data); wr.rdma names the target.
    case IBV_WR_ATOMIC_WRITE: w.op = WrOp::AtomicWrite; break;
    case IBV_WR_BIND_MW:
    case IBV_WR_LOCAL_INV:
      // Local operations on memory windows: no data, no packets (RC and UC, ibv_bind_mw(3)).
      if (!transport::work_request(wr.opcode == IBV_WR_BIND_MW ? WrOp::BindMw : WrOp::LocalInv, cfg.type).allowed)
        return EINVAL;
      if (wr.opcode == IBV_WR_BIND_MW) return fill_mw_bind(w, wr.bind_mw.mw, wr.bind_mw.rkey, wr.bind_mw.bind_info);
      w.op = WrOp::LocalInv;
      w.imm_be = wr.invalidate_rkey;
      w.num_sge = 0;
      w.length = 0;
      return 0;
    default: return EINVAL;
  }
  // What the service carries (IBTA table 38): UD sends datagrams only, UC has no READ or ATOMIC.
  const transport::WorkRequest kind = transport::work_request(w.op, cfg.type);
  if (!kind.allowed) return EINVAL;
  if (cfg.type == transport::QpType::Ud) {
    if (!wr.wr.ud.ah) return EINVAL;
    w.ud_dest_ip = to_ah(wr.wr.ud.ah)->dest_ip;
    w.ud_remote_qpn = wr.wr.ud.remote_qpn;
    w.ud_remote_qkey = wr.wr.ud.remote_qkey;
  }
  if (cfg.xrc == transport::XrcRole::Send) w.xrc_srqn = wr.qp_type.xrc.remote_srqn;
  if (kind.atomic) {
    w.remote_addr = wr.wr.atomic.remote_addr;
    w.rkey = wr.wr.atomic.rkey;
    w.compare_add = wr.wr.atomic.compare_add;
    w.swap = wr.wr.atomic.swap;
  } else {
    w.remote_addr = wr.wr.rdma.remote_addr;
    w.rkey = wr.wr.rdma.rkey;
  }
  if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > cfg.max_send_sge) return EINVAL;
  uint64_t len = 0;
  for (int i = 0; i < wr.num_sge; ++i) len += wr.sg_list[i].length;
  w.length = len;
  bool is_inline = (wr.send_flags & IBV_SEND_INLINE) && kind.inline_data;
  if (is_inline) {
    // Inline data is copied now: the buffers need no key and may be reused at once (ibv_post_send(3)).
    if (len > cfg.max_inline) return EINVAL;
    w.flags |= transport::kInline;
    uint64_t off = 0;
    for (int i = 0; i < wr.num_sge; ++i) {
      std::memcpy(w.inline_data + off, reinterpret_cast<const void*>(wr.sg_list[i].addr), wr.sg_list[i].length);
      off += wr.sg_list[i].length;
    }
    w.num_sge = 0;
  } else {
    w.num_sge = static_cast<uint32_t>(wr.num_sge);
    for (int i = 0; i < wr.num_sge; ++i)
      w.sge[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
  }
  return 0;
}

}  // namespace

namespace softrdma::verbs {

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  SoftQp* q = to_qp(qp);
  if (q->tqp->cfg.xrc == transport::XrcRole::Recv || q->ind_table) {  // an XRC target or an RSS QP has no send queue
    *bad = wr;
    return EINVAL;
  }
  transport::Engine& eng = engine_of(qp->context);
  const bool iwarp = is_iwarp(qp->context);
  constexpr int kBatch = 8;
  SendWqe batch[kBatch];
  ibv_send_wr* first_in_batch = wr;
  int n = 0;
  for (ibv_send_wr* cur = wr; cur; cur = cur->next) {
    if (n == 0) first_in_batch = cur;
    // iWARP: memory-window WRs are refused before translation reads their bind_mw.
    int rc = iwarp && (cur->opcode == IBV_WR_BIND_MW || cur->opcode == IBV_WR_LOCAL_INV)
                 ? EINVAL
                 : translate(*cur, q->tqp->cfg, batch[n]);
    if (!rc && iwarp) rc = iwarp_check_send(batch[n]);
    if (rc) {
      // Queue what came before the bad one, then report it.
      int b = 0;
      int rc2 = n ? eng.post_send(q->tqp, batch, n, &b) : 0;
      ibv_send_wr* fail = cur;
      if (rc2) {
        fail = first_in_batch;
        for (int i = 0; i < b; ++i) fail = fail->next;
        rc = rc2;
      }
      *bad = fail;
      return rc;
    }
    if (++n == kBatch || !cur->next) {
      int b = 0;
      int rc2 = eng.post_send(q->tqp, batch, n, &b);
      if (rc2) {
        ibv_send_wr* fail = first_in_batch;
        for (int i = 0; i < b; ++i) fail = fail->next;
        *bad = fail;
        return rc2;
      }
      n = 0;
    }
  }
  return 0;
}

int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  SoftQp* q = to_qp(qp);
  if (q->tqp->cfg.xrc != transport::XrcRole::None || q->ind_table) {  // no receive queue: XRC QPs (their SRQs), RSS QPs (their WQs)
    *bad = wr;
    return EINVAL;
  }
  transport::Engine& eng = engine_of(qp->context);
  for (ibv_recv_wr* cur = wr; cur; cur = cur->next) {
    transport::RecvWqe w;
    w.wr_id = cur->wr_id;
    if (cur->num_sge < 0 || static_cast<uint32_t>(cur->num_sge) > q->tqp->cfg.max_recv_sge) {
      *bad = cur;
      return EINVAL;
    }
    w.num_sge = static_cast<uint32_t>(cur->num_sge);
    w.length = 0;
    for (int i = 0; i < cur->num_sge; ++i) {
      w.sge[i] = {cur->sg_list[i].addr, cur->sg_list[i].length, cur->sg_list[i].lkey};
      w.length += cur->sg_list[i].length;
    }
    int b = 0;
    int rc = eng.post_recv(q->tqp, &w, 1, &b);
    if (rc) {
      *bad = cur;
      return rc;
    }
  }
  return 0;
}

ibv_qp* create_qp_with(ibv_context* ctx, ibv_pd* pd, const ibv_qp_init_attr& ia, const RssSetup* rss) {
  return create(ctx, pd, ia, nullptr, rss);
}

ibv_qp* create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* a) {
  if (a->comp_mask & (IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH)) return create_rss_qp(ctx, a);
  uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS |
                   IBV_QP_INIT_ATTR_XRCD;
  // An XRC_RECV QP comes with an XRC domain and no PD; every other QP with a PD.
  const bool needs_xrcd = a->qp_type == IBV_QPT_XRC_RECV;
  if ((a->comp_mask & IBV_QP_INIT_ATTR_XRCD) && !needs_xrcd) {
    errno = EINVAL;
    return nullptr;
  }
  if (needs_xrcd && (!(a->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !a->xrcd)) {
    errno = EINVAL;
    return nullptr;
  }
  if ((a->comp_mask & ~known) || (!needs_xrcd && !(a->comp_mask & IBV_QP_INIT_ATTR_PD)) ||
      ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  uint64_t ops = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
                 IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_BIND_MW |
                 IBV_QP_EX_WITH_LOCAL_INV;
  // ATOMIC WRITE is an RC operation only (no UC, UD or XRC opcode carries it).
  if (a->qp_type == IBV_QPT_RC) ops |= IBV_QP_EX_WITH_ATOMIC_WRITE;
  // An iWARP QP has SEND, SEND with invalidate, RDMA WRITE and READ (RDMAP), nothing else.
  if (is_iwarp(ctx))
    ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ;
  if ((a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (a->send_ops_flags & ~ops)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  ibv_qp_init_attr ia{};
  ia.qp_context = a->qp_context;
  ia.send_cq = a->send_cq;
  ia.recv_cq = a->recv_cq;
  ia.srq = a->srq;
  ia.cap = a->cap;
  ia.qp_type = a->qp_type;
  ia.sq_sig_all = a->sq_sig_all;
  ibv_qp* qp = create(ctx, needs_xrcd ? nullptr : a->pd, ia, needs_xrcd ? to_xrcd(a->xrcd) : nullptr);
  if (qp) {
    a->cap = to_qp(qp)->init.cap;
    to_qp(qp)->qpx.comp_mask = 0;
  }
  return qp;
}

}  // namespace softrdma::verbs

SOFTRDMA_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  ibv_qp* qp = create(pd->context, pd, *attr);
  if (qp) attr->cap = to_qp(qp)->init.cap;
  return qp;
}

SOFTRDMA_EXPORT ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) { return &to_qp(qp)->qpx; }

SOFTRDMA_EXPORT int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  return softrdma::verbs::modify_qp(qp, attr, mask, false);
}

int softrdma::verbs::modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask, bool attach) {
  SoftQp* q = to_qp(qp);
  ibv_qp_state cur = to_ibv(q->tqp->state.load());
  ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
  if (is_iwarp(qp->context) && !attach) {
    // iWARP: RTR and RTS come from the connection (softrdma_iwarp_attach), never by hand; RESET to
    // INIT takes only what the iWARP CM gives (state and access flags; P_Key index and port optional).
    if (int rc = iwarp_check_modify(cur, next, mask)) return rc;
    if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
      ibv_qp_attr a = *attr;
      int m = mask | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
      if (!(mask & IBV_QP_PKEY_INDEX)) a.pkey_index = 0;
      if (!(mask & IBV_QP_PORT)) a.port_num = 1;
      if (!(mask & IBV_QP_ACCESS_FLAGS)) a.qp_access_flags = 0;
      return modify_qp(qp, &a, m, true);
    }
  }
  if (validate_modify_qp(qp->qp_type, cur, mask, next, attr->cur_qp_state)) return EINVAL;
  RdAtomicLimits lim{static_cast<int>(core::DeviceLimits::kMaxQpRdAtom),
                           static_cast<int>(core::DeviceLimits::kMaxQpRdAtom)};
  if (validate_modify_qp_values(qp->qp_type, cur, *attr, mask, lim)) return EINVAL;
  transport::QpModify m;
  m.mask = mask;
  m.state = to_core(next);
  if (mask & IBV_QP_PATH_MTU) {
    ibv_port_attr pa{};
    query_port_ex(qp->context, 1, &pa, sizeof pa);
    if (attr->path_mtu > pa.active_mtu) return EINVAL;
    m.mtu_bytes = core::mtu_bytes(attr->path_mtu);
  }
  if (mask & IBV_QP_AV) {
    // RoCE v2: a destination GID of the device's family; our only source GID is index 0.
    if (int rc = av_destination(qp->context, attr->ah_attr, &m.dest_ip, true)) return rc;
  }
  m.access_flags = attr->qp_access_flags;
  m.dest_qpn = attr->dest_qp_num;
  m.rq_psn = attr->rq_psn;
  m.sq_psn = attr->sq_psn;
  m.timeout = attr->timeout;
  m.retry_cnt = attr->retry_cnt;
  m.rnr_retry = attr->rnr_retry;
  m.min_rnr_timer = attr->min_rnr_timer;
  m.max_rd_atomic = attr->max_rd_atomic;
  m.max_dest_rd_atomic = attr->max_dest_rd_atomic;
  m.qkey = attr->qkey;
  if (int rc = engine_of(qp->context).modify_qp(q->tqp, m)) return rc;

  // Remember what was set, so ibv_query_qp returns it.
  ibv_qp_attr& s = q->attr;
  if (mask & IBV_QP_STATE) s.qp_state = next;
  if (mask & IBV_QP_ACCESS_FLAGS) s.qp_access_flags = attr->qp_access_flags;
  if (mask & IBV_QP_PKEY_INDEX) s.pkey_index = attr->pkey_index;
  if (mask & IBV_QP_PORT) s.port_num = attr->port_num;
  if (mask & IBV_QP_AV) s.ah_attr = attr->ah_attr;
  if (mask & IBV_QP_PATH_MTU) s.path_mtu = attr->path_mtu;
  if (mask & IBV_QP_TIMEOUT) s.timeout = attr->timeout;
  if (mask & IBV_QP_RETRY_CNT) s.retry_cnt = attr->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) s.rnr_retry = attr->rnr_retry;
  if (mask & IBV_QP_RQ_PSN) s.rq_psn = attr->rq_psn;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) s.max_rd_atomic = attr->max_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) s.min_rnr_timer = attr->min_rnr_timer;
  if (mask & IBV_QP_SQ_PSN) s.sq_psn = attr->sq_psn;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) s.max_dest_rd_atomic = attr->max_dest_rd_atomic;
  if (mask & IBV_QP_DEST_QPN) s.dest_qp_num = attr->dest_qp_num;
  if (mask & IBV_QP_QKEY) s.qkey = attr->qkey;
  if (mask & IBV_QP_STATE) qp->state = next;
  // A reset iWARP QP has left its connection: its direct-path socket goes (the peer sees the close)
  // and it may be attached again.
  if (next == IBV_QPS_RESET && q->iw_fd >= 0) {
    close(q->iw_fd);
    q->iw_fd = -1;
  }
  return 0;
}

SOFTRDMA_EXPORT int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init) {
  (void)mask;  // everything is returned, as rdma-core providers do
  SoftQp* q = to_qp(qp);
  *attr = q->attr;
  attr->qp_state = attr->cur_qp_state = to_ibv(q->tqp->state.load());
  attr->cap = q->init.cap;
  attr->path_mig_state = IBV_MIG_MIGRATED;
  if (init) *init = q->init;
  return 0;
}

SOFTRDMA_EXPORT int ibv_destroy_qp(ibv_qp* qp) {
  SoftQp* q = to_qp(qp);
  if (q->tqp && transport::raw_has_flows(*q->tqp)) return EBUSY;  // its flows first (ibv_destroy_flow)
  if (q->xrcd) {
    // An XRC target's handle (ibv_open_qp(3)): the QP goes with its last handle.
    SoftQp* owner = nullptr;
    const bool last = release_xrc_handle(q, &owner);
    --q->xrcd->users;
    if (q != owner) {
      pthread_cond_destroy(&qp->cond);
      pthread_mutex_destroy(&qp->mutex);
      delete q;
    }
    if (!last) return 0;
    q = owner;
    qp = &owner->qpx.qp_base;
    ++q->xrcd->users;  // released once more below
  }
  void* sq_ring = q->tqp->cfg.sq_ring;
  engine_of(qp->context).destroy_qp(q->tqp);
  if (q->iw_fd >= 0) close(q->iw_fd);  // the direct-path attach's TCP socket (iwarp.cpp)
  if (q->xrcd) --q->xrcd->users;
  if (qp->send_cq) --to_cq(qp->send_cq)->qp_refs;
  if (qp->recv_cq) --to_cq(qp->recv_cq)->qp_refs;
  if (q->ind_table) --q->ind_table->qp_refs;
  pthread_cond_destroy(&qp->cond);
  pthread_mutex_destroy(&qp->mutex);
  ibv_pd* pd = qp->pd;  // none for an XRC target
  if (sq_ring) pd_release(pd, sq_ring, kResourceSendQueue);
  pd_delete(pd, q, kResourceQp);
  if (pd) --to_pd(pd)->users;  // last: a parent domain's free() may run only while it exists
  return 0;
}

// The ibv_wr_* API: WQEs are staged between ibv_wr_start and ibv_wr_complete, then posted at once.
namespace {

SoftQp* of(ibv_qp_ex* x) { return reinterpret_cast<SoftQp*>(x); }

SendWqe* stage(ibv_qp_ex* x, WrOp op) {
  SoftQp* q = of(x);
  SendWqe& w = q->staged.emplace_back();
  w.wr_id = x->wr_id;
  w.op = op;
  w.flags = 0;
  if (x->wr_flags & IBV_SEND_SIGNALED) w.flags |= transport::kSignaled;
  if (x->wr_flags & IBV_SEND_FENCE) w.flags |= transport::kFence;
  if (x->wr_flags & IBV_SEND_SOLICITED) w.flags |= transport::kSolicited;
  w.num_sge = 0;
  w.length = 0;
  return &w;
}

SendWqe* current(ibv_qp_ex* x) {
  SoftQp* q = of(x);
  if (q->staged.empty()) {
    q->staged_error = EINVAL;
    return nullptr;
  }
  return &q->staged.back();
}

// Inline data is for SEND and RDMA WRITE only (ibv_wr_post(3)).
SendWqe* current_inline(ibv_qp_ex* x) {
  SendWqe* w = current(x);
  if (w && !transport::work_request(w->op, of(x)->tqp->cfg.type).inline_data) {
    of(x)->staged_error = EINVAL;
    return nullptr;
  }
  return w;
}

void qpx_install(SoftQp* q) {
  ibv_qp_ex& x = q->qpx;
  // ibv_wr_start .. ibv_wr_complete/abort is a per-QP critical section (ibv_wr_post(3) CONCURRENCY).
  x.wr_start = [](ibv_qp_ex* x) {
    of(x)->wr_mutex.lock();
    of(x)->staged.clear();
    of(x)->staged_error = 0;
  };
  // A WR found bad by a builder or setter, or by the engine, fails the whole batch: nothing is posted.
  x.wr_complete = [](ibv_qp_ex* x) -> int {
    SoftQp* q = of(x);
    int rc = q->staged_error;
    if (!rc && is_iwarp(x->qp_base.context))
      for (const SendWqe& w : q->staged)
        if ((rc = iwarp_check_send(w)) != 0) break;
    if (!rc && !q->staged.empty()) {
      int bad = 0;
      rc = engine_of(x->qp_base.context)
               .post_send(q->tqp, q->staged.data(), static_cast<int>(q->staged.size()), &bad, true);
    }
    q->staged.clear();
    q->wr_mutex.unlock();
    return rc;
  };
  x.wr_abort = [](ibv_qp_ex* x) {
    of(x)->staged.clear();
    of(x)->wr_mutex.unlock();
  };
  x.wr_send = [](ibv_qp_ex* x) { stage(x, WrOp::Send); };
  x.wr_send_imm = [](ibv_qp_ex* x, __be32 imm) { stage(x, WrOp::SendImm)->imm_be = imm; };
  x.wr_send_inv = [](ibv_qp_ex* x, uint32_t rkey) { stage(x, WrOp::SendInv)->imm_be = rkey; };
  x.wr_rdma_write = [](ibv_qp_ex* x, uint32_t rkey, uint64_t addr) {
    SendWqe* w = stage(x, WrOp::Write);
    w->rkey = rkey;
    w->remote_addr = addr;
  };
  x.wr_rdma_write_imm = [](ibv_qp_ex* x, uint32_t rkey, uint64_t addr, __be32 imm) {
    SendWqe* w = stage(x, WrOp::WriteImm);
    w->rkey = rkey;
    w->remote_addr = addr;
    w->imm_be = imm;
  };
  x.wr_rdma_read = [](ibv_qp_ex* x, uint32_t rkey, uint64_t addr) {
    SendWqe* w = stage(x, WrOp::Read);
    w->rkey = rkey;
    w->remote_addr = addr;
  };
  x.wr_atomic_cmp_swp = [](ibv_qp_ex* x, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
    SendWqe* w = stage(x, WrOp::CompareSwap);
    w->rkey = rkey;
    w->remote_addr = addr;
    w->compare_add = compare;
    w->swap = swap;
  };
  x.wr_atomic_fetch_add = [](ibv_qp_ex* x, uint32_t rkey, uint64_t addr, uint64_t add) {
    SendWqe* w = stage(x, WrOp::FetchAdd);
    w->rkey = rkey;
    w->remote_addr = addr;
    w->compare_add = add;
  };
  x.wr_set_sge = [](ibv_qp_ex* x, uint32_t lkey, uint64_t addr, uint32_t length) {
    if (SendWqe* w = current(x)) {
      w->num_sge = 1;
      w->sge[0] = {addr, length, lkey};
      w->length = length;
    }
  };
  x.wr_set_sge_list = [](ibv_qp_ex* x, size_t n, const ibv_sge* list) {
    SendWqe* w = current(x);
    if (!w) return;
    if (n > of(x)->tqp->cfg.max_send_sge) {
      of(x)->staged_error = EINVAL;
      return;
    }
    w->num_sge = static_cast<uint32_t>(n);
    w->length = 0;
    for (size_t i = 0; i < n; ++i) {
      w->sge[i] = {list[i].addr, list[i].length, list[i].lkey};
      w->length += list[i].length;
    }
  };
  x.wr_set_inline_data = [](ibv_qp_ex* x, void* addr, size_t length) {
    SendWqe* w = current_inline(x);
    if (!w) return;
    if (length > of(x)->tqp->cfg.max_inline) {
      of(x)->staged_error = EINVAL;
      return;
    }
    std::memcpy(w->inline_data, addr, length);
    w->length = length;
    w->num_sge = 0;
    w->flags |= transport::kInline;
  };
  x.wr_set_inline_data_list = [](ibv_qp_ex* x, size_t n, const ibv_data_buf* bufs) {
    SendWqe* w = current_inline(x);
    if (!w) return;
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) total += bufs[i].length;
    if (total > of(x)->tqp->cfg.max_inline) {
      of(x)->staged_error = EINVAL;
      return;
    }
    size_t off = 0;
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(w->inline_data + off, bufs[i].addr, bufs[i].length);
      off += bufs[i].length;
    }
    w->length = total;
    w->num_sge = 0;
    w->flags |= transport::kInline;
  };
  // Not for RC (or not yet): any use fails the batch at ibv_wr_complete.
  x.wr_bind_mw = [](ibv_qp_ex* x, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
    SendWqe* w = stage(x, WrOp::BindMw);
    if (!info || fill_mw_bind(*w, mw, rkey, *info)) of(x)->staged_error = EINVAL;
  };
  x.wr_local_inv = [](ibv_qp_ex* x, uint32_t rkey) { stage(x, WrOp::LocalInv)->imm_be = rkey; };
  x.wr_send_tso = [](ibv_qp_ex* x, void*, uint16_t, uint16_t) { of(x)->staged_error = EOPNOTSUPP; };
  x.wr_set_ud_addr = [](ibv_qp_ex* x, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
    SendWqe* w = current(x);
    if (!w) return;
    if (!ah || of(x)->tqp->cfg.type != transport::QpType::Ud) {
      of(x)->staged_error = EINVAL;
      return;
    }
    w->ud_dest_ip = to_ah(ah)->dest_ip;
    w->ud_remote_qpn = remote_qpn;
    w->ud_remote_qkey = remote_qkey;
  };
  x.wr_set_xrc_srqn = [](ibv_qp_ex* x, uint32_t srqn) {
    SendWqe* w = current(x);
    if (!w) return;
    if (of(x)->tqp->cfg.xrc != transport::XrcRole::Send) {
      of(x)->staged_error = EINVAL;
      return;
    }
    w->xrc_srqn = srqn;
  };
  // The 8 bytes are copied now, as inline data: atomic_wr may be reused once this returns.
  x.wr_atomic_write = [](ibv_qp_ex* x, uint32_t rkey, uint64_t addr, const void* atomic_wr) {
    SendWqe* w = stage(x, WrOp::AtomicWrite);
    w->rkey = rkey;
    w->remote_addr = addr;
    if (!atomic_wr) {
      of(x)->staged_error = EINVAL;
      return;
    }
    std::memcpy(w->inline_data, atomic_wr, 8);
    w->length = 8;
    w->flags |= transport::kInline;
  };
}

}  // namespace
