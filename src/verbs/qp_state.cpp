// ibv_modify_qp validation (qp_state.h): the IBTA transition table per QP type and the value checks.
#include "verbs/qp_state.h"

#include <cerrno>
#include <cstdint>
#include <optional>

namespace softrdma::verbs {
namespace {

// Attribute sets for one transition and one QP type.
struct TransitionMasks {
    int required;
    int optional;
};

// XRC QPs are RC of one direction: the initiator (XRC_SEND) has RC's requester attributes, the target
// (XRC_RECV) its responder ones (IBTA 11.2.5 with the XRC columns; as Linux's qp_state_table).
enum class Service { kRc, kUc, kUd, kXrcSend, kXrcRecv, kRaw };
bool reliable(Service s) { return s == Service::kRc || s == Service::kXrcSend || s == Service::kXrcRecv; }

std::optional<Service> service_of(ibv_qp_type qp_type) {
    switch (qp_type) {
        case IBV_QPT_RC: return Service::kRc;
        case IBV_QPT_UC: return Service::kUc;
        case IBV_QPT_UD: return Service::kUd;
        case IBV_QPT_XRC_SEND: return Service::kXrcSend;
        case IBV_QPT_XRC_RECV: return Service::kXrcRecv;
        case IBV_QPT_RAW_PACKET: return Service::kRaw;
        default: return std::nullopt;  // DRIVER: not offered by softrdma
    }
}

// Casts keep the comparisons signed: the enums' underlying types are unsigned.
bool is_state(ibv_qp_state s) {
    const int v = static_cast<int>(s);
    return v >= IBV_QPS_RESET && v <= IBV_QPS_ERR;
}

// Attributes that bind a QP to its port and protection (RESET->INIT; optional again in INIT->INIT).
int port_binding(Service svc) {
    int m = IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    // Datagram QPs authorise by Q_Key; connected ones by the remote access rights.
    return m | (svc == Service::kUd ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
}

// Attributes that may be changed while sending (RTR->RTS, RTS->RTS, SQD->RTS).
int send_side_tunables(Service svc) {
    switch (svc) {
        case Service::kRaw: return 0;
        case Service::kUd: return IBV_QP_CUR_STATE | IBV_QP_QKEY;
        case Service::kUc:
        case Service::kXrcSend:
            return IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
        case Service::kRc:
        case Service::kXrcRecv:
            return IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
                   IBV_QP_MIN_RNR_TIMER;
    }
    return 0;
}

// The IBTA transition table (vol.1 §11.2.5, QP state transition properties), restricted to
// RC/UC/UD. nullopt means the transition cannot be requested through Modify QP.
std::optional<TransitionMasks> transition(Service svc, ibv_qp_state from, ibv_qp_state to) {
    // SQE exists only for unreliable services: an RC send error takes the QP straight to ERR.
    if (reliable(svc) && (from == IBV_QPS_SQE || to == IBV_QPS_SQE)) return std::nullopt;
    // Reset and Error are reachable from every state, with nothing else to say.
    if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) return TransitionMasks{0, 0};
    if (svc == Service::kRaw) {
        // A raw packet QP has a port and nothing else: no peer, no PSNs, no keys (frames carry their
        // own addresses). It has no SQD or SQE states.
        if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) return TransitionMasks{IBV_QP_PORT, 0};
        if (from == IBV_QPS_INIT && to == IBV_QPS_INIT) return TransitionMasks{0, IBV_QP_PORT};
        if ((from == IBV_QPS_INIT && to == IBV_QPS_RTR) || (from == IBV_QPS_RTR && to == IBV_QPS_RTS) ||
            (from == IBV_QPS_RTS && to == IBV_QPS_RTS))
            return TransitionMasks{0, 0};
        return std::nullopt;
    }

    switch (from) {
        case IBV_QPS_RESET:
            if (to == IBV_QPS_INIT) return TransitionMasks{port_binding(svc), 0};
            break;
        case IBV_QPS_INIT:
            if (to == IBV_QPS_INIT) return TransitionMasks{0, port_binding(svc)};
            if (to == IBV_QPS_RTR) {
                if (svc == Service::kUd) return TransitionMasks{0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY};
                // Connected services learn the remote end and the expected PSN here.
                int required = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
                // Only RC has a responder that executes RDMA READ/atomics and sends RNR NAKs.
                if (svc == Service::kRc || svc == Service::kXrcRecv)
                    required |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
                return TransitionMasks{required,
                                       IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX};
            }
            break;
        case IBV_QPS_RTR:
            if (to == IBV_QPS_RTS) {
                int required = IBV_QP_SQ_PSN;
                // RC's requester needs its ACK timer, retry budgets and READ/atomic depth.
                if (svc == Service::kRc || svc == Service::kXrcSend) {
                    required |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_MAX_QP_RD_ATOMIC;
                }
                if (svc == Service::kXrcRecv) required |= IBV_QP_TIMEOUT;
                return TransitionMasks{required, send_side_tunables(svc)};
            }
            break;
        case IBV_QPS_RTS:
            if (to == IBV_QPS_RTS) return TransitionMasks{0, send_side_tunables(svc)};
            if (to == IBV_QPS_SQD) return TransitionMasks{0, IBV_QP_EN_SQD_ASYNC_NOTIFY};
            break;
        case IBV_QPS_SQD:
            if (to == IBV_QPS_RTS) return TransitionMasks{0, send_side_tunables(svc)};
            if (to == IBV_QPS_SQD) {
                // With the send queue drained, path and requester parameters may be re-programmed.
                switch (svc) {
                    case Service::kRaw: break;  // (handled above: no SQD)
                    case Service::kUd: return TransitionMasks{0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY};
                    case Service::kUc:
                        return TransitionMasks{0, IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
                                                      IBV_QP_PKEY_INDEX | IBV_QP_PATH_MIG_STATE};
                    case Service::kRc:
                    case Service::kXrcSend:
                    case Service::kXrcRecv:
                        return TransitionMasks{
                            0, IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC |
                                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ALT_PATH |
                                   IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_MIN_RNR_TIMER |
                                   IBV_QP_PATH_MIG_STATE};
                }
            }
            break;
        case IBV_QPS_SQE:
            // Recovering from a send-queue error: the consumer restarts sending.
            if (to == IBV_QPS_RTS) {
                int optional = IBV_QP_CUR_STATE;
                optional |= (svc == Service::kUd) ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
                return TransitionMasks{0, optional};
            }
            break;
        default:
            break;
    }
    return std::nullopt;
}

// IBV_QP_CUR_STATE lets the consumer state what it believes the QP's state is; it is meaningful
// only in the states the CI can leave or enter on its own (RTR/RTS/SQD/SQE).
bool cur_state_acceptable(ibv_qp_state actual, ibv_qp_state claimed) {
    switch (claimed) {
        case IBV_QPS_RTR:
        case IBV_QPS_RTS:
        case IBV_QPS_SQD:
        case IBV_QPS_SQE: break;
        default: return false;
    }
    if (claimed == actual) return true;
    // A send error may have moved the QP RTS->SQE before the consumer reaped that completion.
    return claimed == IBV_QPS_RTS && actual == IBV_QPS_SQE;
}

constexpr uint32_t kMax24Bit = (1u << 24) - 1;  // PSNs and QPNs are 24-bit BTH fields
constexpr uint8_t kOnlyPort = 1;

}  // namespace

int validate_modify_qp(ibv_qp_type qp_type, ibv_qp_state cur_state, int attr_mask,
                       ibv_qp_state new_state, ibv_qp_state attr_cur_state) {
    const auto svc = service_of(qp_type);
    if (!svc || !is_state(cur_state)) return EINVAL;

    if ((attr_mask & IBV_QP_CUR_STATE) && !cur_state_acceptable(cur_state, attr_cur_state)) {
        return EINVAL;
    }

    // Without IBV_QP_STATE the QP stays where it is: treat it as the same-state transition.
    const ibv_qp_state target = (attr_mask & IBV_QP_STATE) ? new_state : cur_state;
    if (!is_state(target)) return EINVAL;

    const auto masks = transition(*svc, cur_state, target);
    if (!masks) return EINVAL;
    if ((attr_mask & masks->required) != masks->required) return EINVAL;
    if (attr_mask & ~(masks->required | masks->optional | IBV_QP_STATE)) return EINVAL;
    return 0;
}

int validate_modify_qp_values(ibv_qp_type qp_type, ibv_qp_state cur_state, const ibv_qp_attr& attr,
                              int attr_mask, const RdAtomicLimits& limits) {
    const auto svc = service_of(qp_type);
    if (!svc || !is_state(cur_state)) return EINVAL;
    const bool connected = *svc != Service::kUd;

    if ((attr_mask & IBV_QP_STATE) && !is_state(attr.qp_state)) return EINVAL;
    if ((attr_mask & IBV_QP_CUR_STATE) && !is_state(attr.cur_qp_state)) return EINVAL;
    if (attr_mask & IBV_QP_PATH_MTU) {
        const int mtu = static_cast<int>(attr.path_mtu);
        if (mtu < IBV_MTU_256 || mtu > IBV_MTU_4096) return EINVAL;
    }
    // Local ACK Timeout is a 5-bit exponent (4.096us * 2^timeout; 0 = infinite).
    if ((attr_mask & IBV_QP_TIMEOUT) && attr.timeout > 31) return EINVAL;
    // Retry counters are 3-bit; rnr_retry 7 means "retry forever".
    if ((attr_mask & IBV_QP_RETRY_CNT) && attr.retry_cnt > 7) return EINVAL;
    if ((attr_mask & IBV_QP_RNR_RETRY) && attr.rnr_retry > 7) return EINVAL;
    // Minimum RNR NAK timer is a 5-bit code carried in the AETH.
    if ((attr_mask & IBV_QP_MIN_RNR_TIMER) && attr.min_rnr_timer > 31) return EINVAL;
    if ((attr_mask & IBV_QP_PATH_MIG_STATE) &&
        static_cast<unsigned>(attr.path_mig_state) > IBV_MIG_ARMED) {
        return EINVAL;
    }
    if ((attr_mask & IBV_QP_PORT) && attr.port_num != kOnlyPort) return EINVAL;
    // One P_Key table entry (the default P_Key): index 0 is the only index there is.
    if ((attr_mask & IBV_QP_PKEY_INDEX) && attr.pkey_index != 0) return EINVAL;
    if ((attr_mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > limits.max_qp_init_rd_atom) {
        return EINVAL;
    }
    if ((attr_mask & IBV_QP_MAX_DEST_RD_ATOMIC) &&
        attr.max_dest_rd_atomic > limits.max_qp_rd_atom) {
        return EINVAL;
    }
    if ((attr_mask & IBV_QP_SQ_PSN) && attr.sq_psn > kMax24Bit) return EINVAL;
    if ((attr_mask & IBV_QP_RQ_PSN) && attr.rq_psn > kMax24Bit) return EINVAL;
    if ((attr_mask & IBV_QP_DEST_QPN) && attr.dest_qp_num > kMax24Bit) return EINVAL;
    if (attr_mask & IBV_QP_AV) {
        if (attr.ah_attr.port_num != kOnlyPort) return EINVAL;
        // On Ethernet the destination is named by its GID: without a GRH there is no IP address.
        if (connected && !attr.ah_attr.is_global) return EINVAL;
    }
    // Automatic path migration is an InfiniBand-only feature; RoCE has a single path.
    if (attr_mask & IBV_QP_ALT_PATH) return EINVAL;
    return 0;
}

const char* qp_state_name(ibv_qp_state state) {
    switch (state) {
        case IBV_QPS_RESET: return "RESET";
        case IBV_QPS_INIT: return "INIT";
        case IBV_QPS_RTR: return "RTR";
        case IBV_QPS_RTS: return "RTS";
        case IBV_QPS_SQD: return "SQD";
        case IBV_QPS_SQE: return "SQE";
        case IBV_QPS_ERR: return "ERR";
        default: return "UNKNOWN";
    }
}

}  // namespace softrdma::verbs
