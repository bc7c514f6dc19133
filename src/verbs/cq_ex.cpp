// The extended CQ (ibv_create_cq_ex): ibv_start_poll/ibv_next_poll/ibv_end_poll and the ibv_wc_read_*
// accessors over the same ring ibv_poll_cq reads, completion timestamps, and ibv_query_rt_values_ex.
#include <time.h>

#include <cerrno>
#include <climits>

#include "verbs/parent_domain.h"
#include "verbs/soft_objects.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace {

// What a CQE can carry. There is no VLAN stripping or flow steering, so CVLAN and FLOW_TAG are refused
// at creation rather than answered with made-up values. TM_INFO: tag-matching SRQs (tag_matching.cpp).
constexpr uint64_t kSupportedWcFlags = uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                                       IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK | IBV_WC_EX_WITH_TM_INFO;

SoftCq* of(ibv_cq_ex* x) { return reinterpret_cast<SoftCq*>(x); }
const core::Cqe& cur(ibv_cq_ex* x) { return of(x)->current; }

// Takes the next CQE off the ring into `current` (the same consumer path as ibv_poll_cq, so both may be
// used on one CQ); false when there is none.
bool fetch(ibv_cq_ex* x) {
  SoftCq* cq = of(x);
  if (engine_of(x->context).poll_cq(cq->queue.get(), &cq->current, 1) != 1) return false;
  x->wr_id = cq->current.wr_id;
  x->status = static_cast<ibv_wc_status>(cq->current.status);
  return true;
}

int start_poll(ibv_cq_ex* x, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask) return EINVAL;
  SoftCq* cq = of(x);
  if (cq->poll_ex_locked) cq->poll_ex_mutex.lock();
  if (fetch(x)) return 0;
  // ENOENT ends the poll: the caller does not call ibv_end_poll (ibv_create_cq_ex(3)).
  if (cq->poll_ex_locked) cq->poll_ex_mutex.unlock();
  return ENOENT;
}

int next_poll(ibv_cq_ex* x) { return fetch(x) ? 0 : ENOENT; }

void end_poll(ibv_cq_ex* x) {
  SoftCq* cq = of(x);
  if (cq->poll_ex_locked) cq->poll_ex_mutex.unlock();
}

// CLOCK_REALTIME minus the device clock (CLOCK_MONOTONIC), now: converts a completion timestamp to
// wall-clock time as a NIC's clock-info page does.
int64_t wallclock_offset_ns() {
  timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  uint64_t mono = core::CompletionQueue::clock_ns();
  int64_t real = static_cast<int64_t>(rt.tv_sec) * 1000000000ll + rt.tv_nsec;
  return real - static_cast<int64_t>(mono);
}

void install(ibv_cq_ex& c) {
  c.start_poll = start_poll;
  c.next_poll = next_poll;
  c.end_poll = end_poll;
  c.read_opcode = [](ibv_cq_ex* x) { return static_cast<ibv_wc_opcode>(cur(x).opcode); };
  c.read_vendor_err = [](ibv_cq_ex* x) { return cur(x).vendor_err; };
  c.read_byte_len = [](ibv_cq_ex* x) { return cur(x).byte_len; };
  c.read_imm_data = [](ibv_cq_ex* x) -> __be32 { return cur(x).imm_or_inv; };
  c.read_qp_num = [](ibv_cq_ex* x) { return cur(x).qp_num; };
  c.read_src_qp = [](ibv_cq_ex* x) { return cur(x).src_qp; };
  c.read_wc_flags = [](ibv_cq_ex* x) -> unsigned int { return cur(x).wc_flags; };
  // RoCE has no LIDs: what ibv_poll_cq reports there is 0; the SL field carries the L3 header type.
  c.read_slid = [](ibv_cq_ex*) -> uint32_t { return 0; };
  c.read_sl = [](ibv_cq_ex* x) { return cur(x).sl; };
  c.read_dlid_path_bits = [](ibv_cq_ex*) -> uint8_t { return 0; };
  // Device clock ticks: hca_core_clock is 1 GHz, so a tick is a nanosecond of CLOCK_MONOTONIC.
  c.read_completion_ts = [](ibv_cq_ex* x) { return cur(x).timestamp_ns; };
  c.read_completion_wallclock_ns = [](ibv_cq_ex* x) {
    return static_cast<uint64_t>(static_cast<int64_t>(cur(x).timestamp_ns) + wallclock_offset_ns());
  };
  // Refused at creation; present so a stray call reads zeros instead of jumping through NULL.
  c.read_cvlan = [](ibv_cq_ex*) -> uint16_t { return 0; };
  c.read_flow_tag = [](ibv_cq_ex*) -> uint32_t { return 0; };
  // The TMH's tag and app_ctx of a completion with IBV_WC_TM_MATCH; zeros for any other.
  c.read_tm_info = [](ibv_cq_ex* x, ibv_wc_tm_info* tm) {
    *tm = ibv_wc_tm_info{};
    if (cur(x).wc_flags & IBV_WC_TM_MATCH) {
      tm->tag = cur(x).tm_tag;
      tm->priv = cur(x).tm_priv;
    }
  };
}

}  // namespace

namespace softrdma::verbs {

ibv_cq_ex* create_cq_ex(ibv_context* ctx, ibv_cq_init_attr_ex* a) {
  if (a->comp_mask & ~uint32_t{IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD}) {
    errno = EINVAL;
    return nullptr;
  }
  // IBV_CQ_INIT_ATTR_MASK_PD names a parent domain of this context (a plain PD is no parent domain).
  ibv_pd* parent = nullptr;
  if (a->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
    if (!a->parent_domain || !is_parent_domain(a->parent_domain) || a->parent_domain->context != ctx) {
      errno = EINVAL;
      return nullptr;
    }
    parent = a->parent_domain;
  }
  uint32_t flags = (a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? a->flags : 0;
  if (flags & ~uint32_t{IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN}) {
    errno = EINVAL;
    return nullptr;
  }
  // Overrun always puts the CQ in error (IBTA 11.4.2.1); there is no mode that ignores it.
  if (flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (a->wc_flags & ~kSupportedWcFlags) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (a->cqe > INT_MAX || a->comp_vector > INT_MAX) {
    errno = EINVAL;
    return nullptr;
  }
  SoftCq* cq = create_cq(ctx, static_cast<int>(a->cqe), a->cq_context, a->channel, static_cast<int>(a->comp_vector),
                         parent);
  if (!cq) return nullptr;
  if (a->wc_flags & (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK))
    cq->queue->enable_timestamps();
  cq->poll_ex_locked = !(flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED);
  install(cq->cq);
  return &cq->cq;
}

int query_rt_values(ibv_context*, ibv_values_ex* values) {
  if (values->comp_mask & ~uint32_t{IBV_VALUES_MASK_RAW_CLOCK}) return EINVAL;
  if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
    // The raw device clock in the same ticks as ibv_wc_read_completion_ts, whole in tv_nsec as NIC
    // providers report it (tv_sec * 1e9 + tv_nsec is the tick count either way).
    values->raw_clock.tv_sec = 0;
    values->raw_clock.tv_nsec = static_cast<long>(core::CompletionQueue::clock_ns());
  }
  return 0;
}

}  // namespace softrdma::verbs
