// Tag-matching SRQs: ibv_create_srq_ex with IBV_SRQT_TM, ibv_post_srq_ops and the device's tm_caps.
// Translation only; the matching list and the responder's part live in transport/tag_matching.cpp.
#include <infiniband/tm_types.h>

#include <cerrno>
#include <cstring>

#include "transport/srq.h"
#include "verbs/soft_objects.h"

using namespace softrdma;
using namespace softrdma::verbs;
namespace stm = softrdma::transport::tm;

static_assert(static_cast<int>(core::WcStatus::TmErr) == IBV_WC_TM_ERR &&
              static_cast<int>(core::WcStatus::TmRndvIncomplete) == IBV_WC_TM_RNDV_INCOMPLETE);
static_assert(static_cast<int>(core::WcOpcode::TmAdd) == IBV_WC_TM_ADD &&
              static_cast<int>(core::WcOpcode::TmDel) == IBV_WC_TM_DEL &&
              static_cast<int>(core::WcOpcode::TmSync) == IBV_WC_TM_SYNC &&
              static_cast<int>(core::WcOpcode::TmRecv) == IBV_WC_TM_RECV &&
              static_cast<int>(core::WcOpcode::TmNoTag) == IBV_WC_TM_NO_TAG);
static_assert(+core::kWcTmSyncReq == +IBV_WC_TM_SYNC_REQ && +core::kWcTmMatch == +IBV_WC_TM_MATCH &&
              +core::kWcTmDataValid == +IBV_WC_TM_DATA_VALID);
static_assert(+stm::kAdd == +IBV_WR_TAG_ADD && +stm::kDel == +IBV_WR_TAG_DEL && +stm::kSync == +IBV_WR_TAG_SYNC);
static_assert(+stm::kOpSignaled == +IBV_OPS_SIGNALED && +stm::kOpSync == +IBV_OPS_TM_SYNC);
static_assert(+stm::kNoTag == +IBV_TMH_NO_TAG && +stm::kRndv == +IBV_TMH_RNDV && +stm::kFin == +IBV_TMH_FIN &&
              +stm::kEager == +IBV_TMH_EAGER);
static_assert(stm::kTmhBytes == sizeof(ibv_tmh) && stm::kRvhBytes == sizeof(ibv_rvh));

namespace softrdma::verbs {

ibv_tm_caps tm_caps() {
  ibv_tm_caps c{};
  c.max_rndv_hdr_size = stm::kMaxRndvHdrSize;
  c.max_num_tags = stm::kMaxNumTags;
  c.flags = IBV_TM_CAP_RC;
  c.max_ops = stm::kMaxOps;
  c.max_sge = stm::kMaxSge;
  return c;
}

ibv_srq* create_tm_srq(ibv_context* ctx, ibv_srq_init_attr_ex* a) {
  constexpr uint32_t kNeeded = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
  if (a->comp_mask & ~kNeeded) {
    errno = EOPNOTSUPP;  // an XRC domain, or bits this verbs.h does not know
    return nullptr;
  }
  // Its completions need a CQ, its buffers a PD, and the list its sizes (ibv_create_srq_ex(3)).
  if ((a->comp_mask & kNeeded) != kNeeded || !a->pd || a->pd->context != ctx || !a->cq || a->cq->context != ctx ||
      a->tm_cap.max_num_tags == 0 || a->tm_cap.max_num_tags > stm::kMaxNumTags || a->tm_cap.max_ops == 0 ||
      a->tm_cap.max_ops > stm::kMaxOps) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_srq_init_attr init{};
  init.srq_context = a->srq_context;
  init.attr = a->attr;
  ibv_srq* srq = ibv_create_srq(a->pd, &init);
  if (!srq) return nullptr;
  SoftCq* cq = to_cq(a->cq);
  if (int rc = engine_of(ctx).srq_table().enable_tag_matching(to_srq(srq)->tsrq, a->tm_cap.max_num_tags, cq->queue.get())) {
    ibv_destroy_srq(srq);
    errno = rc;
    return nullptr;
  }
  ++cq->qp_refs;  // the CQ outlives the SRQ (ibv_destroy_cq: EBUSY meanwhile)
  to_srq(srq)->cq = cq;
  a->attr = init.attr;
  return srq;
}

int post_srq_ops(ibv_srq* srq, ibv_ops_wr* wr, ibv_ops_wr** bad) {
  transport::Engine& eng = engine_of(srq->context);
  for (ibv_ops_wr* cur = wr; cur; cur = cur->next) {
    stm::Op op;
    // The opcode as the application stored it: any value, so not loaded as the enum (no valid range).
    uint32_t opcode;
    static_assert(sizeof cur->opcode == sizeof opcode);
    std::memcpy(&opcode, &cur->opcode, sizeof opcode);
    op.opcode = static_cast<stm::OpCode>(opcode);
    op.flags = static_cast<uint32_t>(cur->flags);
    op.wr_id = cur->wr_id;
    op.unexpected_cnt = cur->tm.unexpected_cnt;
    op.handle = cur->tm.handle;
    if (opcode == IBV_WR_TAG_ADD) {
      const int n = cur->tm.add.num_sge;
      if (n < 0 || static_cast<uint32_t>(n) > stm::kMaxSge || (n && !cur->tm.add.sg_list)) {
        *bad = cur;
        return EINVAL;
      }
      op.tag = cur->tm.add.tag;
      op.mask = cur->tm.add.mask;
      op.recv_wr_id = cur->tm.add.recv_wr_id;
      op.num_sge = static_cast<uint32_t>(n);
      for (int i = 0; i < n; ++i) {
        const ibv_sge& s = cur->tm.add.sg_list[i];
        op.sge[i] = {s.addr, s.length, s.lkey};
        op.length += s.length;
      }
    }
    if (int rc = eng.srq_table().post_op(to_srq(srq)->tsrq, op)) {
      *bad = cur;
      return rc;
    }
    if (opcode == IBV_WR_TAG_ADD) cur->tm.handle = op.handle;
  }
  return 0;
}

}  // namespace softrdma::verbs
