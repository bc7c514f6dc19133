// Pure helpers of the libibverbs ABI: enum-to-string, link-rate conversions and the fork-support
// entry points. They need no device, so they live apart from the real verbs. The strings are the
// ones rdma-core v44 prints, because programs (and people grepping logs) compare against them.

#include <infiniband/verbs.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <iterator>

namespace softrdma::verbs {
namespace {

const char *const kUnknown = "unknown";

// Indexed by the enum value; nullptr marks a value rdma-core has no string for.
constexpr const char *kNodeTypeStr[] = {
    nullptr,                       // 0 is not a node type
    "InfiniBand channel adapter",  // IBV_NODE_CA
    "InfiniBand switch",           // IBV_NODE_SWITCH
    "InfiniBand router",           // IBV_NODE_ROUTER
    "iWARP NIC",                   // IBV_NODE_RNIC
    "usNIC",                       // IBV_NODE_USNIC
    "usNIC UDP",                   // IBV_NODE_USNIC_UDP
    "unspecified",                 // IBV_NODE_UNSPECIFIED
};

constexpr const char *kPortStateStr[] = {
    "no state change (NOP)",  // IBV_PORT_NOP
    "down",                   // IBV_PORT_DOWN
    "init",                   // IBV_PORT_INIT
    "armed",                  // IBV_PORT_ARMED
    "active",                 // IBV_PORT_ACTIVE
    "active defer",           // IBV_PORT_ACTIVE_DEFER
};

constexpr const char *kEventTypeStr[] = {
    "CQ error",                                 // IBV_EVENT_CQ_ERR
    "local work queue catastrophic error",      // IBV_EVENT_QP_FATAL
    "invalid request local work queue error",   // IBV_EVENT_QP_REQ_ERR
    "local access violation work queue error",  // IBV_EVENT_QP_ACCESS_ERR
    "communication established",                // IBV_EVENT_COMM_EST
    "send queue drained",                       // IBV_EVENT_SQ_DRAINED
    "path migrated",                            // IBV_EVENT_PATH_MIG
    "path migration request error",             // IBV_EVENT_PATH_MIG_ERR
    "local catastrophic error",                 // IBV_EVENT_DEVICE_FATAL
    "port active",                              // IBV_EVENT_PORT_ACTIVE
    "port error",                               // IBV_EVENT_PORT_ERR
    "LID change",                               // IBV_EVENT_LID_CHANGE
    "P_Key change",                             // IBV_EVENT_PKEY_CHANGE
    "SM change",                                // IBV_EVENT_SM_CHANGE
    "SRQ catastrophic error",                   // IBV_EVENT_SRQ_ERR
    "SRQ limit reached",                        // IBV_EVENT_SRQ_LIMIT_REACHED
    "last WQE reached",                         // IBV_EVENT_QP_LAST_WQE_REACHED
    "client reregistration",                    // IBV_EVENT_CLIENT_REREGISTER
    "GID table change",                         // IBV_EVENT_GID_CHANGE
    "WQ fatal",                                 // IBV_EVENT_WQ_FATAL
};

constexpr const char *kWcStatusStr[] = {
    "success",                            // IBV_WC_SUCCESS
    "local length error",                 // IBV_WC_LOC_LEN_ERR
    "local QP operation error",           // IBV_WC_LOC_QP_OP_ERR
    "local EE context operation error",   // IBV_WC_LOC_EEC_OP_ERR
    "local protection error",             // IBV_WC_LOC_PROT_ERR
    "Work Request Flushed Error",         // IBV_WC_WR_FLUSH_ERR
    "memory management operation error",  // IBV_WC_MW_BIND_ERR
    "bad response error",                 // IBV_WC_BAD_RESP_ERR
    "local access error",                 // IBV_WC_LOC_ACCESS_ERR
    "remote invalid request error",       // IBV_WC_REM_INV_REQ_ERR
    "remote access error",                // IBV_WC_REM_ACCESS_ERR
    "remote operation error",             // IBV_WC_REM_OP_ERR
    "transport retry counter exceeded",   // IBV_WC_RETRY_EXC_ERR
    "RNR retry counter exceeded",         // IBV_WC_RNR_RETRY_EXC_ERR
    "local RDD violation error",          // IBV_WC_LOC_RDD_VIOL_ERR
    "remote invalid RD request",          // IBV_WC_REM_INV_RD_REQ_ERR
    "aborted error",                      // IBV_WC_REM_ABORT_ERR
    "invalid EE context number",          // IBV_WC_INV_EECN_ERR
    "invalid EE context state",           // IBV_WC_INV_EEC_STATE_ERR
    "fatal error",                        // IBV_WC_FATAL_ERR
    "response timeout error",             // IBV_WC_RESP_TIMEOUT_ERR
    "general error",                      // IBV_WC_GENERAL_ERR
    "TM error",                           // IBV_WC_TM_ERR
    "TM software rendezvous",             // IBV_WC_TM_RNDV_INCOMPLETE
};

static_assert(std::size(kNodeTypeStr) == IBV_NODE_UNSPECIFIED + 1);
static_assert(std::size(kPortStateStr) == IBV_PORT_ACTIVE_DEFER + 1);
static_assert(std::size(kEventTypeStr) == IBV_EVENT_WQ_FATAL + 1);
static_assert(std::size(kWcStatusStr) == IBV_WC_TM_RNDV_INCOMPLETE + 1);

// Callers pass any int (a corrupt CQE, a newer enum value), so look up by plain int range.
template <std::size_t N>
const char *lookup(const char *const (&table)[N], int value) noexcept {
  if (value < 0 || static_cast<std::size_t>(value) >= N || table[value] == nullptr) return kUnknown;
  return table[value];
}

// One row per ibv_rate: multiple of 2.5 Gb/s (-1 where the rate is no such multiple: the
// 64b/66b-encoded FDR/EDR/HDR speeds) and the effective Mb/s rdma-core reports.
struct RateRow {
  ibv_rate rate;
  int mult;
  int mbps;
};

constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},       {IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},       {IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},      {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},      {IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},    {IBV_RATE_14_GBPS, -1, 14062},
    {IBV_RATE_56_GBPS, -1, 56250},      {IBV_RATE_112_GBPS, -1, 112500},
    {IBV_RATE_168_GBPS, -1, 168750},    {IBV_RATE_25_GBPS, -1, 25781},
    {IBV_RATE_100_GBPS, -1, 103125},    {IBV_RATE_200_GBPS, -1, 206250},
    {IBV_RATE_300_GBPS, -1, 309375},    {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},      {IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500},   {IBV_RATE_800_GBPS, 320, 850000},
    {IBV_RATE_1200_GBPS, 480, 1275000},
};

const RateRow *find_rate(int rate) noexcept {
  for (const RateRow &row : kRates)
    if (static_cast<int>(row.rate) == rate) return &row;
  return nullptr;
}

// madvise over the whole pages covering [base, base+size), as the kernel only takes page ranges.
int madvise_pages(void *base, std::size_t size, int advice) noexcept {
  if (size == 0) return 0;
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<std::uintptr_t>(base) & ~(page - 1);
  const auto end = (reinterpret_cast<std::uintptr_t>(base) + size + page - 1) & ~(page - 1);
  if (madvise(reinterpret_cast<void *>(start), end - start, advice) != 0) return errno;
  return 0;
}

}  // namespace
}  // namespace softrdma::verbs

using namespace softrdma::verbs;

// Not in Debian's public headers (rdma-core declares them in driver.h).
extern "C" {
int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);
}

// Exported through libibverbs.map; default visibility keeps them exportable if the target is
// ever built with -fvisibility=hidden.
#pragma GCC visibility push(default)
extern "C" {

const char *ibv_node_type_str(enum ibv_node_type node_type) {
  return lookup(kNodeTypeStr, static_cast<int>(node_type));
}

const char *ibv_port_state_str(enum ibv_port_state port_state) {
  return lookup(kPortStateStr, static_cast<int>(port_state));
}

const char *ibv_event_type_str(enum ibv_event_type event) {
  return lookup(kEventTypeStr, static_cast<int>(event));
}

const char *ibv_wc_status_str(enum ibv_wc_status status) {
  return lookup(kWcStatusStr, static_cast<int>(status));
}

int ibv_rate_to_mult(enum ibv_rate rate) {
  const RateRow *row = find_rate(static_cast<int>(rate));
  return row ? row->mult : -1;
}

enum ibv_rate mult_to_ibv_rate(int mult) {
  for (const RateRow &row : kRates)
    if (row.mult == mult && mult > 0) return row.rate;
  return IBV_RATE_MAX;
}

int ibv_rate_to_mbps(enum ibv_rate rate) {
  const RateRow *row = find_rate(static_cast<int>(rate));
  return row ? row->mbps : -1;
}

enum ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const RateRow &row : kRates)
    if (row.mbps == mbps) return row.rate;
  return IBV_RATE_MAX;
}

// softrdma pins no pages (no DMA engine holds physical addresses), so a forked child cannot
// corrupt an RDMA transfer: fork support needs no set-up and is reported as unneeded.
int ibv_fork_init(void) { return 0; }

enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

int ibv_dontfork_range(void *base, size_t size) { return madvise_pages(base, size, MADV_DONTFORK); }

int ibv_dofork_range(void *base, size_t size) { return madvise_pages(base, size, MADV_DOFORK); }

}  // extern "C"
#pragma GCC visibility pop
