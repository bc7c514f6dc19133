#include "verbs/qp_state.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>
#include <vector>

namespace softrdma::verbs {
namespace {

constexpr ibv_qp_state kAllStates[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS,
                                       IBV_QPS_SQD,   IBV_QPS_SQE,  IBV_QPS_ERR};

// Every attribute bit that ibv_modify_qp knows about (excluding IBV_QP_STATE itself).
constexpr int kAttrBits[] = {
    IBV_QP_CUR_STATE,     IBV_QP_EN_SQD_ASYNC_NOTIFY, IBV_QP_ACCESS_FLAGS, IBV_QP_PKEY_INDEX,
    IBV_QP_PORT,          IBV_QP_QKEY,                IBV_QP_AV,           IBV_QP_PATH_MTU,
    IBV_QP_TIMEOUT,       IBV_QP_RETRY_CNT,           IBV_QP_RNR_RETRY,    IBV_QP_RQ_PSN,
    IBV_QP_MAX_QP_RD_ATOMIC, IBV_QP_ALT_PATH,         IBV_QP_MIN_RNR_TIMER, IBV_QP_SQ_PSN,
    IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_PATH_MIG_STATE, IBV_QP_CAP,          IBV_QP_DEST_QPN,
    IBV_QP_RATE_LIMIT};

// Expected table, written out from IBTA vol.1 §11.2.5 as the spec states it per transition.
struct Row {
    ibv_qp_state from;
    ibv_qp_state to;
    int required;
    int optional;
};

constexpr int kRcRtsTunables = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH |
                               IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER;

std::vector<Row> rc_rows() {
    return {
        {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
        {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
        {IBV_QPS_INIT, IBV_QPS_RTR,
         IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
             IBV_QP_MIN_RNR_TIMER,
         IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
        {IBV_QPS_RTR, IBV_QPS_RTS,
         IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
             IBV_QP_MAX_QP_RD_ATOMIC,
         kRcRtsTunables},
        {IBV_QPS_RTS, IBV_QPS_RTS, 0, kRcRtsTunables},
        {IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
        {IBV_QPS_SQD, IBV_QPS_RTS, 0, kRcRtsTunables},
        {IBV_QPS_SQD, IBV_QPS_SQD, 0,
         IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
             IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ALT_PATH |
             IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_MIN_RNR_TIMER |
             IBV_QP_PATH_MIG_STATE},
    };
}

// Transitions to RESET/ERR: legal from every state of an RC QP except SQE, which RC never enters.
std::vector<Row> rc_reset_and_error_rows() {
    std::vector<Row> rows;
    for (ibv_qp_state from : kAllStates) {
        if (from == IBV_QPS_SQE) continue;
        rows.push_back({from, IBV_QPS_RESET, 0, 0});
        rows.push_back({from, IBV_QPS_ERR, 0, 0});
    }
    return rows;
}

int modify(ibv_qp_type type, ibv_qp_state from, ibv_qp_state to, int mask) {
    return validate_modify_qp(type, from, IBV_QP_STATE | mask, to, from);
}

std::string label(const Row& r) {
    return std::string(qp_state_name(r.from)) + "->" + qp_state_name(r.to);
}

void check_row(ibv_qp_type type, const Row& r) {
    SCOPED_TRACE(label(r));
    EXPECT_EQ(0, modify(type, r.from, r.to, r.required));
    EXPECT_EQ(0, modify(type, r.from, r.to, r.required | r.optional));
    for (int bit : kAttrBits) {
        SCOPED_TRACE(bit);
        if (r.required & bit) {
            // Each required attribute missing on its own must fail, even with every optional one.
            EXPECT_EQ(EINVAL, modify(type, r.from, r.to, (r.required | r.optional) & ~bit));
        } else if (r.optional & bit) {
            EXPECT_EQ(0, modify(type, r.from, r.to, r.required | bit));
        } else {
            EXPECT_EQ(EINVAL, modify(type, r.from, r.to, r.required | bit));
        }
    }
}

TEST(QpStateTest, EveryLegalRcTransitionWithExactMasks) {
    for (const Row& r : rc_rows()) check_row(IBV_QPT_RC, r);
    for (const Row& r : rc_reset_and_error_rows()) check_row(IBV_QPT_RC, r);
}

TEST(QpStateTest, EveryOtherRcTransitionIsIllegal) {
    std::vector<Row> legal = rc_rows();
    for (const Row& r : rc_reset_and_error_rows()) legal.push_back(r);
    for (ibv_qp_state from : kAllStates) {
        for (ibv_qp_state to : kAllStates) {
            bool is_legal = false;
            for (const Row& r : legal) is_legal |= (r.from == from && r.to == to);
            if (is_legal) continue;
            SCOPED_TRACE(std::string(qp_state_name(from)) + "->" + qp_state_name(to));
            EXPECT_EQ(EINVAL, modify(IBV_QPT_RC, from, to, 0));
            // No combination of attributes can make it legal.
            int all = 0;
            for (int bit : kAttrBits) all |= bit;
            EXPECT_EQ(EINVAL, modify(IBV_QPT_RC, from, to, all & ~IBV_QP_CUR_STATE));
        }
    }
}

TEST(QpStateTest, NamedIllegalTransitions) {
    const int rtr_req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    const int rts_req = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                        IBV_QP_MAX_QP_RD_ATOMIC;
    EXPECT_EQ(EINVAL, modify(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_RTR, rtr_req));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTS, rts_req));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_INIT, 0));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTR, 0));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_RC, IBV_QPS_ERR, IBV_QPS_INIT, 0));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_SQD, 0));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UD, IBV_QPS_RTS, IBV_QPS_SQE, 0));  // only the CI enters SQE
    EXPECT_EQ(EINVAL, modify(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_UNKNOWN, 0));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_RC, IBV_QPS_UNKNOWN, IBV_QPS_RESET, 0));
}

TEST(QpStateTest, TypicalConnectionSetupSequences) {
    // The exact masks ibv_rc_pingpong and perftest use.
    EXPECT_EQ(0, modify(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT,
                        IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    EXPECT_EQ(0, modify(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR,
                        IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
    EXPECT_EQ(0, modify(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS,
                        IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                            IBV_QP_MAX_QP_RD_ATOMIC));
    EXPECT_EQ(0, modify(IBV_QPT_UC, IBV_QPS_RESET, IBV_QPS_INIT,
                        IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    EXPECT_EQ(0, modify(IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR,
                        IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN));
    EXPECT_EQ(0, modify(IBV_QPT_UC, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN));
    EXPECT_EQ(0, modify(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT,
                        IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
    EXPECT_EQ(0, modify(IBV_QPT_UD, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN));
}

TEST(QpStateTest, UcHasNoResponderResourcesOrRetries) {
    const int uc_rtr = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR,
                             uc_rtr | IBV_QP_MAX_DEST_RD_ATOMIC));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR, uc_rtr | IBV_QP_MIN_RNR_TIMER));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR, uc_rtr & ~IBV_QP_AV));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UC, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN | IBV_QP_TIMEOUT));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UC, IBV_QPS_RTR, IBV_QPS_RTS, 0));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UC, IBV_QPS_RESET, IBV_QPS_INIT,
                             IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
}

TEST(QpStateTest, UdRtrNeedsNoAddress) {
    EXPECT_EQ(0, modify(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, 0));
    EXPECT_EQ(0, modify(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_QKEY | IBV_QP_PKEY_INDEX));
    // A datagram QP has no fixed destination: connected-mode attributes are rejected.
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_AV));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_DEST_QPN));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_PATH_MTU));
    // UD authorises by Q_Key, not access flags.
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT,
                             IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT));
}

TEST(QpStateTest, SqeRecoveryOnlyForUnreliableServices) {
    EXPECT_EQ(0, modify(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_RTS, 0));
    EXPECT_EQ(0, modify(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_QKEY));
    EXPECT_EQ(0, modify(IBV_QPT_UC, IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_ACCESS_FLAGS));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_UC, IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_QKEY));
    EXPECT_EQ(0, modify(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_ERR, 0));
    EXPECT_EQ(0, modify(IBV_QPT_UC, IBV_QPS_SQE, IBV_QPS_RESET, 0));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_RC, IBV_QPS_SQE, IBV_QPS_RTS, 0));
}

TEST(QpStateTest, CurrentStateAttribute) {
    const int m = IBV_QP_STATE | IBV_QP_CUR_STATE;
    // Matching claim on a transition that lists it as optional.
    EXPECT_EQ(0, validate_modify_qp(IBV_QPT_RC, IBV_QPS_RTS, m, IBV_QPS_RTS, IBV_QPS_RTS));
    EXPECT_EQ(0, validate_modify_qp(IBV_QPT_UD, IBV_QPS_SQE, m, IBV_QPS_RTS, IBV_QPS_SQE));
    // The consumer may not yet know that a send error moved its QP from RTS to SQE.
    EXPECT_EQ(0, validate_modify_qp(IBV_QPT_UD, IBV_QPS_SQE, m, IBV_QPS_RTS, IBV_QPS_RTS));
    // Wrong claims.
    EXPECT_EQ(EINVAL, validate_modify_qp(IBV_QPT_RC, IBV_QPS_RTS, m, IBV_QPS_RTS, IBV_QPS_SQD));
    EXPECT_EQ(EINVAL, validate_modify_qp(IBV_QPT_UD, IBV_QPS_RTS, m, IBV_QPS_RTS, IBV_QPS_SQE));
    // A claim outside RTR/RTS/SQD/SQE is never accepted, even if it matches.
    EXPECT_EQ(EINVAL, validate_modify_qp(IBV_QPT_RC, IBV_QPS_INIT, m | IBV_QP_PKEY_INDEX,
                                         IBV_QPS_INIT, IBV_QPS_INIT));
    // Transitions that don't list it reject it.
    EXPECT_EQ(EINVAL, validate_modify_qp(IBV_QPT_RC, IBV_QPS_RTS, m, IBV_QPS_SQD, IBV_QPS_RTS));
    EXPECT_EQ(EINVAL, validate_modify_qp(IBV_QPT_RC, IBV_QPS_RTS, m, IBV_QPS_ERR, IBV_QPS_RTS));
    // Without the bit, attr_cur_state is ignored.
    EXPECT_EQ(0, validate_modify_qp(IBV_QPT_RC, IBV_QPS_RTS, IBV_QP_STATE, IBV_QPS_ERR,
                                    IBV_QPS_RESET));
}

TEST(QpStateTest, AttributeOnlyModifyStaysInState) {
    // new_state is ignored without IBV_QP_STATE.
    EXPECT_EQ(0, validate_modify_qp(IBV_QPT_RC, IBV_QPS_RTS, IBV_QP_MIN_RNR_TIMER, IBV_QPS_RESET,
                                    IBV_QPS_RESET));
    EXPECT_EQ(0, validate_modify_qp(IBV_QPT_RC, IBV_QPS_SQD, IBV_QP_TIMEOUT | IBV_QP_AV,
                                    IBV_QPS_RTS, IBV_QPS_RESET));
    EXPECT_EQ(0, validate_modify_qp(IBV_QPT_UD, IBV_QPS_INIT, IBV_QP_QKEY, IBV_QPS_RESET,
                                    IBV_QPS_RESET));
    // RTS->RTS doesn't allow requester parameters; SQD->SQD does.
    EXPECT_EQ(EINVAL, validate_modify_qp(IBV_QPT_RC, IBV_QPS_RTS, IBV_QP_TIMEOUT, IBV_QPS_RTS,
                                         IBV_QPS_RESET));
    // RTR has no same-state transition.
    EXPECT_EQ(EINVAL, validate_modify_qp(IBV_QPT_RC, IBV_QPS_RTR, IBV_QP_MIN_RNR_TIMER,
                                         IBV_QPS_RTR, IBV_QPS_RESET));
    // RESET and ERR accept an empty modify but no attributes.
    EXPECT_EQ(0, validate_modify_qp(IBV_QPT_RC, IBV_QPS_RESET, 0, IBV_QPS_RESET, IBV_QPS_RESET));
    EXPECT_EQ(EINVAL, validate_modify_qp(IBV_QPT_RC, IBV_QPS_RESET, IBV_QP_PORT, IBV_QPS_RESET,
                                         IBV_QPS_RESET));
    EXPECT_EQ(EINVAL, validate_modify_qp(IBV_QPT_RC, IBV_QPS_ERR, IBV_QP_ACCESS_FLAGS, IBV_QPS_ERR,
                                         IBV_QPS_RESET));
}

TEST(QpStateTest, UnsupportedQpTypes) {
    for (ibv_qp_type t : {IBV_QPT_DRIVER}) {
        SCOPED_TRACE(static_cast<int>(t));
        EXPECT_EQ(EINVAL, modify(t, IBV_QPS_RESET, IBV_QPS_INIT,
                                 IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
        EXPECT_EQ(EINVAL, modify(t, IBV_QPS_RTS, IBV_QPS_ERR, 0));
        ibv_qp_attr attr{};
        EXPECT_EQ(EINVAL, validate_modify_qp_values(t, IBV_QPS_RESET, attr, 0, {16, 16}));
    }
}

// XRC (IBTA 11.2.5, the XRC columns): the initiator needs RC's requester attributes, the target its
// responder ones plus the ACK timeout at RTS; neither knows SQE.
TEST(QpStateTest, XrcTransitions) {
    const int init = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    const int rtr = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    const int resp = IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    const int req = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
    for (ibv_qp_type t : {IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV}) {
        SCOPED_TRACE(static_cast<int>(t));
        EXPECT_EQ(0, modify(t, IBV_QPS_RESET, IBV_QPS_INIT, init));
        EXPECT_EQ(EINVAL, modify(t, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT));
        EXPECT_EQ(EINVAL, modify(t, IBV_QPS_RTS, IBV_QPS_SQE, 0));
        EXPECT_EQ(0, modify(t, IBV_QPS_RTS, IBV_QPS_ERR, 0));
    }
    EXPECT_EQ(0, modify(IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_RTR, rtr));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_RTR, rtr | resp));
    EXPECT_EQ(0, modify(IBV_QPT_XRC_SEND, IBV_QPS_RTR, IBV_QPS_RTS, req));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_XRC_SEND, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_TIMEOUT | IBV_QP_SQ_PSN));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_XRC_RECV, IBV_QPS_INIT, IBV_QPS_RTR, rtr));
    EXPECT_EQ(0, modify(IBV_QPT_XRC_RECV, IBV_QPS_INIT, IBV_QPS_RTR, rtr | resp));
    EXPECT_EQ(0, modify(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_TIMEOUT | IBV_QP_SQ_PSN));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN));
    EXPECT_EQ(EINVAL, modify(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, req));
}

// A raw packet QP is bound to its port and has nothing else to set: no keys, peer, PSNs or timers.
TEST(QpStateTest, RawPacketHasOnlyThePort) {
    const ibv_qp_type t = IBV_QPT_RAW_PACKET;
    EXPECT_EQ(0, modify(t, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PORT));
    EXPECT_EQ(EINVAL, modify(t, IBV_QPS_RESET, IBV_QPS_INIT, 0));
    EXPECT_EQ(EINVAL, modify(t, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PORT | IBV_QP_PKEY_INDEX));
    EXPECT_EQ(EINVAL, modify(t, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PORT | IBV_QP_QKEY));
    EXPECT_EQ(0, modify(t, IBV_QPS_INIT, IBV_QPS_INIT, IBV_QP_PORT));
    EXPECT_EQ(0, modify(t, IBV_QPS_INIT, IBV_QPS_RTR, 0));
    EXPECT_EQ(EINVAL, modify(t, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_DEST_QPN));
    EXPECT_EQ(0, modify(t, IBV_QPS_RTR, IBV_QPS_RTS, 0));
    EXPECT_EQ(EINVAL, modify(t, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN));
    EXPECT_EQ(0, modify(t, IBV_QPS_RTS, IBV_QPS_RTS, 0));
    EXPECT_EQ(EINVAL, modify(t, IBV_QPS_RTS, IBV_QPS_SQD, 0));
    EXPECT_EQ(EINVAL, modify(t, IBV_QPS_RESET, IBV_QPS_RTS, 0));
    EXPECT_EQ(0, modify(t, IBV_QPS_RTS, IBV_QPS_ERR, 0));
    EXPECT_EQ(0, modify(t, IBV_QPS_ERR, IBV_QPS_RESET, 0));
}

TEST(QpStateTest, StateNames) {
    EXPECT_STREQ("RESET", qp_state_name(IBV_QPS_RESET));
    EXPECT_STREQ("INIT", qp_state_name(IBV_QPS_INIT));
    EXPECT_STREQ("RTR", qp_state_name(IBV_QPS_RTR));
    EXPECT_STREQ("RTS", qp_state_name(IBV_QPS_RTS));
    EXPECT_STREQ("SQD", qp_state_name(IBV_QPS_SQD));
    EXPECT_STREQ("SQE", qp_state_name(IBV_QPS_SQE));
    EXPECT_STREQ("ERR", qp_state_name(IBV_QPS_ERR));
    EXPECT_STREQ("UNKNOWN", qp_state_name(IBV_QPS_UNKNOWN));
}

// ---- value checks ----

class QpValuesTest : public ::testing::Test {
protected:
    // A fully valid attribute set: what ibv_rc_pingpong would pass, with a GRH for RoCE.
    void SetUp() override {
        attr.qp_state = IBV_QPS_RTR;
        attr.path_mtu = IBV_MTU_1024;
        attr.dest_qp_num = 0xabcdef;
        attr.rq_psn = 0xffffff;
        attr.sq_psn = 0;
        attr.max_dest_rd_atomic = 16;
        attr.max_rd_atomic = 8;
        attr.min_rnr_timer = 31;
        attr.timeout = 31;
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.port_num = 1;
        attr.pkey_index = 0;
        attr.path_mig_state = IBV_MIG_ARMED;
        attr.ah_attr.is_global = 1;
        attr.ah_attr.port_num = 1;
    }
    int check(int mask, ibv_qp_type type = IBV_QPT_RC) {
        return validate_modify_qp_values(type, IBV_QPS_INIT, attr, mask, limits);
    }
    ibv_qp_attr attr{};
    RdAtomicLimits limits{16, 8};
};

TEST_F(QpValuesTest, ValidAttributesPass) {
    const int all = IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                    IBV_QP_SQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MAX_QP_RD_ATOMIC |
                    IBV_QP_MIN_RNR_TIMER | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                    IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_PATH_MIG_STATE | IBV_QP_AV;
    EXPECT_EQ(0, check(all));
    EXPECT_EQ(0, check(all, IBV_QPT_UC));
    EXPECT_EQ(0, check(0));
}

TEST_F(QpValuesTest, PathMtu) {
    attr.path_mtu = IBV_MTU_4096;
    EXPECT_EQ(0, check(IBV_QP_PATH_MTU));
    attr.path_mtu = IBV_MTU_256;
    EXPECT_EQ(0, check(IBV_QP_PATH_MTU));
    attr.path_mtu = static_cast<ibv_mtu>(0);
    EXPECT_EQ(EINVAL, check(IBV_QP_PATH_MTU));
    EXPECT_EQ(0, check(0));  // only attributes in the mask are checked
    attr.path_mtu = static_cast<ibv_mtu>(6);
    EXPECT_EQ(EINVAL, check(IBV_QP_PATH_MTU));
}

TEST_F(QpValuesTest, TimersAndRetryCounters) {
    attr.timeout = 32;
    EXPECT_EQ(EINVAL, check(IBV_QP_TIMEOUT));
    EXPECT_EQ(0, check(IBV_QP_RETRY_CNT));
    attr.retry_cnt = 8;
    EXPECT_EQ(EINVAL, check(IBV_QP_RETRY_CNT));
    attr.rnr_retry = 8;
    EXPECT_EQ(EINVAL, check(IBV_QP_RNR_RETRY));
    attr.min_rnr_timer = 32;
    EXPECT_EQ(EINVAL, check(IBV_QP_MIN_RNR_TIMER));
    attr.rnr_retry = 0;
    attr.timeout = 0;  // infinite: legal
    EXPECT_EQ(0, check(IBV_QP_RNR_RETRY | IBV_QP_TIMEOUT));
}

TEST_F(QpValuesTest, PortAndPkey) {
    attr.port_num = 2;
    EXPECT_EQ(EINVAL, check(IBV_QP_PORT));
    attr.port_num = 0;
    EXPECT_EQ(EINVAL, check(IBV_QP_PORT));
    attr.port_num = 1;
    attr.pkey_index = 1;
    EXPECT_EQ(EINVAL, check(IBV_QP_PKEY_INDEX));
    EXPECT_EQ(EINVAL, check(IBV_QP_PKEY_INDEX, IBV_QPT_UD));
}

TEST_F(QpValuesTest, ReadAtomicDepthsAgainstDeviceLimits) {
    attr.max_dest_rd_atomic = 17;  // responder resources bounded by max_qp_rd_atom
    EXPECT_EQ(EINVAL, check(IBV_QP_MAX_DEST_RD_ATOMIC));
    attr.max_dest_rd_atomic = 16;
    EXPECT_EQ(0, check(IBV_QP_MAX_DEST_RD_ATOMIC));
    attr.max_rd_atomic = 9;  // initiator depth bounded by max_qp_init_rd_atom
    EXPECT_EQ(EINVAL, check(IBV_QP_MAX_QP_RD_ATOMIC));
    attr.max_rd_atomic = 0;
    EXPECT_EQ(0, check(IBV_QP_MAX_QP_RD_ATOMIC));
}

TEST_F(QpValuesTest, PsnsAndQpnAre24Bit) {
    attr.sq_psn = 1u << 24;
    EXPECT_EQ(EINVAL, check(IBV_QP_SQ_PSN));
    attr.rq_psn = 1u << 24;
    EXPECT_EQ(EINVAL, check(IBV_QP_RQ_PSN));
    attr.dest_qp_num = 1u << 24;
    EXPECT_EQ(EINVAL, check(IBV_QP_DEST_QPN));
    attr.dest_qp_num = 0xffffffff;
    EXPECT_EQ(EINVAL, check(IBV_QP_DEST_QPN));
}

TEST_F(QpValuesTest, AddressVectorNeedsGrhAndPortOne) {
    attr.ah_attr.is_global = 0;
    EXPECT_EQ(EINVAL, check(IBV_QP_STATE | IBV_QP_AV));
    EXPECT_EQ(EINVAL, check(IBV_QP_STATE | IBV_QP_AV, IBV_QPT_UC));
    attr.ah_attr.is_global = 1;
    attr.ah_attr.port_num = 2;
    EXPECT_EQ(EINVAL, check(IBV_QP_STATE | IBV_QP_AV));
    attr.ah_attr.port_num = 1;
    EXPECT_EQ(0, check(IBV_QP_STATE | IBV_QP_AV));
}

TEST_F(QpValuesTest, NoAlternatePathOnRoce) {
    EXPECT_EQ(EINVAL, check(IBV_QP_ALT_PATH));
}

TEST_F(QpValuesTest, EnumFieldsOutOfRange) {
    attr.path_mig_state = static_cast<ibv_mig_state>(3);
    EXPECT_EQ(EINVAL, check(IBV_QP_PATH_MIG_STATE));
    attr.qp_state = IBV_QPS_UNKNOWN;
    EXPECT_EQ(EINVAL, check(IBV_QP_STATE));
    attr.cur_qp_state = IBV_QPS_UNKNOWN;
    EXPECT_EQ(EINVAL, check(IBV_QP_CUR_STATE));
}

}  // namespace
}  // namespace softrdma::verbs
