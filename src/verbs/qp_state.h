// QP state machine: which ibv_modify_qp calls are legal (IBTA vol.1 §10.3, §11.2.5 "QP state
// transition properties") and which attribute values softrdma's single RoCEv2 port accepts.
// Pure functions over rdma-core's enum and mask values; no QP object is touched here. The verbs layer's
// own: core and transport know QP states as core::QpState (core/qp_state.h), translated here.
#pragma once

#include <infiniband/verbs.h>

#include "core/qp_state.h"

namespace softrdma::verbs {

// enum ibv_qp_state <-> core::QpState. Both follow IBTA's order; IBV_QPS_UNKNOWN has no core state.
static_assert(IBV_QPS_RESET == 0 && IBV_QPS_INIT == 1 && IBV_QPS_RTR == 2 && IBV_QPS_RTS == 3 &&
              IBV_QPS_SQD == 4 && IBV_QPS_SQE == 5 && IBV_QPS_ERR == 6);
static_assert(static_cast<int>(core::QpState::Err) == 6);
inline core::QpState to_core(ibv_qp_state s) { return static_cast<core::QpState>(s); }  // s validated
inline ibv_qp_state to_ibv(core::QpState s) { return static_cast<ibv_qp_state>(s); }

// Validates the shape of an ibv_modify_qp call. cur_state is the QP's current state. If attr_mask
// has IBV_QP_CUR_STATE, attr_cur_state must equal cur_state (or be RTS while the QP has already,
// asynchronously, entered SQE), and must be RTR, RTS, SQD or SQE. With IBV_QP_STATE the transition
// cur_state -> new_state must be legal for qp_type, every REQUIRED attribute must be in attr_mask
// and no attribute outside REQUIRED|OPTIONAL may be present. Without IBV_QP_STATE new_state is
// ignored and the call modifies attributes within the current state, which is only allowed where
// the same-state transition exists (RESET, INIT, RTS, SQD, ERR) and only with its optional set.
// Supports RC, UC and UD; any other qp_type is rejected. Returns 0 if valid, EINVAL otherwise.
int validate_modify_qp(ibv_qp_type qp_type, ibv_qp_state cur_state, int attr_mask,
                       ibv_qp_state new_state, ibv_qp_state attr_cur_state);

// Device limits the value checks compare against (the ibv_device_attr fields of the same names;
// named apart from core::DeviceLimits of core/limits.h, whose kMaxQpRdAtom fills both):
// max_qp_rd_atom bounds max_dest_rd_atomic (responder resources), max_qp_init_rd_atom bounds
// max_rd_atomic (initiator depth).
struct RdAtomicLimits {
    int max_qp_rd_atom;
    int max_qp_init_rd_atom;
};

// Value checks, for the attributes present in attr_mask, that don't depend on the transition table:
// path_mtu in 1..5, timeout <= 31, retry_cnt <= 7, rnr_retry <= 7, min_rnr_timer <= 31,
// path_mig_state a known value, port_num == 1, pkey_index == 0 (single P_Key), max_rd_atomic and
// max_dest_rd_atomic within limits, sq_psn/rq_psn/dest_qp_num < 2^24, ah_attr.port_num == 1 and,
// for RC/UC, ah_attr.is_global set (RoCE always carries a GRH). IBV_QP_ALT_PATH is rejected:
// RoCE has no automatic path migration. Returns 0 if valid, EINVAL otherwise.
int validate_modify_qp_values(ibv_qp_type qp_type, ibv_qp_state cur_state, const ibv_qp_attr& attr,
                              int attr_mask, const RdAtomicLimits& limits);

// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"; "UNKNOWN" for anything else.
const char* qp_state_name(ibv_qp_state);

}  // namespace softrdma::verbs
