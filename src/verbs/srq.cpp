// Shared receive queues: ibv_create_srq(_ex), ibv_modify_srq, ibv_query_srq, ibv_destroy_srq and the
// ibv_post_srq_recv entry of the context's ops table. Translation only; the SRQ lives in the engine.
#include <cerrno>
#include <cstring>

#include "core/limits.h"
#include "transport/srq.h"
#include "verbs/parent_domain.h"
#include "verbs/soft_objects.h"

using namespace softrdma;
using namespace softrdma::verbs;

static_assert(+transport::kSrqModMaxWr == +IBV_SRQ_MAX_WR && +transport::kSrqModLimit == +IBV_SRQ_LIMIT);

namespace {

ibv_srq* create(ibv_pd* pd, void* srq_context, ibv_srq_attr& attr, SoftXrcd* xrcd = nullptr,
               SoftCq* cq = nullptr) {
  using L = core::DeviceLimits;
  // srq_limit is not used at creation (ibv_create_srq(3)): the SRQ starts disarmed.
  if (attr.max_wr > L::kMaxSrqWr || attr.max_sge > L::kMaxSrqSge) {
    errno = EINVAL;
    return nullptr;
  }
  // In a parent domain with allocators, the SRQ object lives in the application's memory (its ring
  // stays in the context's arena).
  auto* s = pd_new<SoftSrq>(pd, kResourceSrq);
  if (!s) {
    errno = ENOMEM;
    return nullptr;
  }
  s->tsrq = engine_of(pd->context)
                .srq_table().create(pd->handle, attr.max_wr, attr.max_sge, xrcd ? xrcd->id : 0, cq ? cq->queue.get() : nullptr);
  if (!s->tsrq) {
    int e = errno;
    pd_delete(pd, s, kResourceSrq);
    errno = e;
    return nullptr;
  }
  s->tsrq->user = &s->srq;
  uint32_t limit = 0;
  engine_of(pd->context).srq_table().query(s->tsrq, attr.max_wr, attr.max_sge, limit);
  ++to_pd(pd)->users;
  if (xrcd) {
    s->xrcd = xrcd;
    s->cq = cq;
    ++xrcd->users;
    ++cq->qp_refs;  // its completions go there: the CQ stays while the SRQ does
  }
  ibv_srq& b = s->srq;
  b.context = pd->context;
  b.srq_context = srq_context;
  b.pd = pd;
  b.handle = to_ctx(pd->context)->next_handle.fetch_add(1);
  pthread_mutex_init(&b.mutex, nullptr);
  pthread_cond_init(&b.cond, nullptr);
  return &b;
}

}  // namespace

namespace softrdma::verbs {

ibv_srq* create_srq_ex(ibv_context* ctx, ibv_srq_init_attr_ex* a) {
  if ((a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && a->srq_type == IBV_SRQT_TM) return create_tm_srq(ctx, a);
  // The inline ibv_create_srq_ex sends a basic SRQ with a PD to ibv_create_srq; what reaches here
  // asks for more: an XRC SRQ (IBV_SRQT_XRC, with an XRCD and a CQ); tag matching went to tm.cpp.
  const bool xrc = (a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && a->srq_type == IBV_SRQT_XRC;
  if ((a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && a->srq_type != IBV_SRQT_BASIC && !xrc) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  const uint32_t known = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
                         (xrc ? IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ : 0u);
  if (a->comp_mask & ~known) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !a->pd || a->pd->context != ctx) {
    errno = EINVAL;
    return nullptr;
  }
  if (!xrc) return create(a->pd, a->srq_context, a->attr);
  // An XRC SRQ needs its domain and the CQ its receive completions go to (ibv_create_srq_ex(3)).
  if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !(a->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !a->xrcd ||
      !a->cq || a->xrcd->context != ctx || a->cq->context != ctx) {
    errno = EINVAL;
    return nullptr;
  }
  return create(a->pd, a->srq_context, a->attr, to_xrcd(a->xrcd), to_cq(a->cq));
}

int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  transport::Srq* s = to_srq(srq)->tsrq;
  transport::Engine& eng = engine_of(srq->context);
  for (ibv_recv_wr* cur = wr; cur; cur = cur->next) {
    transport::RecvWqe w;
    if (cur->num_sge < 0 || static_cast<uint32_t>(cur->num_sge) > core::DeviceLimits::kMaxSrqSge) {
      *bad = cur;
      return EINVAL;
    }
    w.wr_id = cur->wr_id;
    w.num_sge = static_cast<uint32_t>(cur->num_sge);
    w.length = 0;
    for (int i = 0; i < cur->num_sge; ++i) {
      w.sge[i] = {cur->sg_list[i].addr, cur->sg_list[i].length, cur->sg_list[i].lkey};
      w.length += cur->sg_list[i].length;
    }
    int b = 0;
    if (int rc = eng.srq_table().post_recv(s, &w, 1, &b)) {
      *bad = cur;
      return rc;
    }
  }
  return 0;
}

}  // namespace softrdma::verbs

SOFTRDMA_EXPORT ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  return create(pd, attr->srq_context, attr->attr);
}

SOFTRDMA_EXPORT int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  return engine_of(srq->context).srq_table().modify(to_srq(srq)->tsrq, mask, attr->max_wr, attr->srq_limit);
}

SOFTRDMA_EXPORT int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  engine_of(srq->context).srq_table().query(to_srq(srq)->tsrq, attr->max_wr, attr->max_sge, attr->srq_limit);
  return 0;
}

SOFTRDMA_EXPORT int ibv_destroy_srq(ibv_srq* srq) {
  if (int rc = engine_of(srq->context).srq_table().destroy(to_srq(srq)->tsrq)) return rc;
  SoftSrq* s = to_srq(srq);
  if (s->xrcd) --s->xrcd->users;
  if (s->cq) --s->cq->qp_refs;
  pthread_cond_destroy(&srq->cond);
  pthread_mutex_destroy(&srq->mutex);
  ibv_pd* pd = srq->pd;
  pd_delete(pd, to_srq(srq), kResourceSrq);
  --to_pd(pd)->users;  // last: a parent domain's free() may run only while it exists
  return 0;
}
