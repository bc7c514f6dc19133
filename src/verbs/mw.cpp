// Memory windows (ibv_alloc_mw(3), ibv_bind_mw(3)): the context ops behind libibverbs' inline
// ibv_alloc_mw/ibv_dealloc_mw/ibv_bind_mw, and the translation of a bind WR. The windows themselves
// live in the engine's key table (core::MrTable); binds execute in send-queue order (requester.cpp).
#include <cerrno>
#include <new>

#include "verbs/soft_objects.h"

using namespace softrdma;

static_assert(+core::kZeroBased == +IBV_ACCESS_ZERO_BASED && +core::kMwBind == +IBV_ACCESS_MW_BIND);
static_assert(static_cast<int>(core::WcOpcode::BindMw) == IBV_WC_BIND_MW &&
              static_cast<int>(core::WcOpcode::LocalInv) == IBV_WC_LOCAL_INV);
static_assert(static_cast<int>(core::WcStatus::MwBindErr) == IBV_WC_MW_BIND_ERR);

namespace softrdma::verbs {

ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
    errno = EINVAL;
    return nullptr;
  }
  auto* mw = new (std::nothrow) ibv_mw{};
  if (!mw) {
    errno = ENOMEM;
    return nullptr;
  }
  uint32_t handle = 0, rkey = 0;
  if (!engine_of(pd->context).alloc_mw(type == IBV_MW_TYPE_1 ? core::MwType::Type1 : core::MwType::Type2,
                                       pd->handle, &handle, &rkey)) {
    delete mw;
    errno = ENOMEM;  // max_mw reached
    return nullptr;
  }
  ++to_pd(pd)->users;
  mw->context = pd->context;
  mw->pd = pd;
  mw->rkey = rkey;
  mw->handle = handle;
  mw->type = type;
  return mw;
}

int dealloc_mw(ibv_mw* mw) {
  engine_of(mw->context).dealloc_mw(mw->handle);
  --to_pd(mw->pd)->users;
  delete mw;
  return 0;
}

int fill_mw_bind(transport::SendWqe& w, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info& info) {
  if (!mw) return EINVAL;
  w.op = transport::WrOp::BindMw;
  w.num_sge = 0;
  w.length = 0;
  w.bind.handle = mw->handle;
  w.bind.rkey = rkey;
  // Without an MR only a zero-length bind (unbinding a type 1 window) makes sense; the engine
  // rejects anything else with a Memory Window Bind Error.
  w.bind.mr_lkey = info.mr ? info.mr->lkey : 0;
  w.bind.addr = info.addr;
  w.bind.length = info.mr ? info.length : 0;
  w.bind.access = info.mw_access_flags;
  if (!info.mr && info.length) w.bind.handle = 0;  // no such window: the bind fails in order
  return 0;
}

// Type 1 (ibv_bind_mw has checked the type and the PDs): a bind WR on the QP's send queue whose
// new key (the next tag) is returned in mw->rkey at once, as ibv_bind_mw(3) says.
int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind) {
  ibv_send_wr wr{};
  wr.wr_id = bind->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = bind->send_flags;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = bind->bind_info;
  ibv_send_wr* bad = nullptr;
  int rc = post_send(qp, &wr, &bad);
  if (rc == 0) mw->rkey = wr.bind_mw.rkey;
  return rc;
}

}  // namespace softrdma::verbs
