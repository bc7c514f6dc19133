// QP states (IBTA vol. 1 §10.3.1), in core's own terms: the transport runs them, the verbs layer
// translates enum ibv_qp_state to and from them and validates ibv_modify_qp calls (verbs/qp_state.h).
#pragma once

#include <cstdint>

namespace softrdma::core {

// In IBTA's order, which libibverbs' enum ibv_qp_state also follows (verbs/qp_state.h checks that).
enum class QpState : uint8_t { Reset = 0, Init, Rtr, Rts, Sqd, Sqe, Err };

}  // namespace softrdma::core
