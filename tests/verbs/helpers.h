// Shared fixture for the verbs test programs. Everything here uses the public <infiniband/verbs.h>
// API, so the tests would run unchanged on a RoCE NIC, except the choice of softrdma's path (Path:
// its device and direct path through the private ABI, verbs/private_abi.h), which $VT_DEVICE skips.
#pragma once

#include <infiniband/verbs.h>

#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace softrdma::verbs_test {

// Bound on every wait: a test fails instead of hanging when a completion never comes.
inline constexpr int kWaitSeconds = 20;

// The loopback device: GID index 0 on port 1 is ::ffff:127.0.0.1.
inline constexpr uint8_t kPort = 1;
// Source GID index used in every address vector: 0, or $VT_GID_INDEX (with $VT_DEVICE naming
// the device) to cross-check these tests on another verbs provider such as kernel rxe.
uint8_t sgid_index();
ibv_gid loopback_gid();
bool gid_equal(const ibv_gid& a, const ibv_gid& b);
std::string gid_str(const ibv_gid& g);

// Opens the device whose port 1 GID 0 is ::ffff:127.0.0.1 (or $VT_DEVICE); nullptr if none.
ibv_context* open_loopback_device();

// The wire an RC test runs over, between two QPs of one context on the loopback:
//  Direct   softrdma_lo, the intra-host direct path (the default; docs/direct-path.md)
//  Packets  softrdma_lo opened without the direct path: RoCEv2 packets, as between hosts
//  Iwarp    softrdma_iw_lo, the QPs attached over a loopback TCP connection (FPDUs; docs/iwarp.md)
enum class Path { Direct, Packets, Iwarp };
const char* path_name(Path p);
inline void PrintTo(Path p, std::ostream* os) { *os << path_name(p); }  // gtest's parameter printer
// Opens the loopback device for `path`; nullptr if none. With $VT_DEVICE (another provider) only
// Direct applies: that device, as open_loopback_device. `settings` are the context's own, over the
// process's ("SOFTRDMA_DIRECT=0;SOFTRDMA_SPIN_US=0": softrdma_open_device_with, verbs/private_abi.h);
// with $VT_DEVICE they apply to that device, which must then be one of softrdma's.
ibv_context* open_loopback_device(Path path, const char* settings = nullptr);

// Owns an opened device context (closed on destruction).
struct Device {
  ibv_context* ctx = nullptr;
  ibv_device_attr attr{};
  ibv_port_attr port{};
  ibv_gid gid{};
  Device();  // the loopback device, Path::Direct
  explicit Device(const char* settings);  // the same with settings of its own (open_loopback_device)
  struct Later {};
  explicit Device(Later) {}  // opened by open()
  ~Device();
  // Opens the loopback device for `path` (closing any context held); false if there is none.
  bool open(Path path, const char* settings = nullptr);
  void close();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  bool ok() const { return ctx != nullptr; }
};

// Sets a variable of the process's libibverbs for a scope (softrdma_set_option, verbs/private_abi.h:
// what the device list, contexts opened meanwhile and the iWARP attach read), without the
// environment; value "" is the default. On leaving, the environment's value again: one per name at a
// time. A setting of one context is better given to it (Device(settings)).
struct ScopedOption {
  std::string name;
  ScopedOption(const char* name, const char* value);
  ~ScopedOption();
  ScopedOption(const ScopedOption&) = delete;
  ScopedOption& operator=(const ScopedOption&) = delete;
};

// Page-aligned anonymous memory, optionally registered.
struct Buffer {
  uint8_t* data = nullptr;
  size_t len = 0;
  size_t map_len = 0;
  ibv_mr* mr = nullptr;
  Buffer() = default;
  Buffer(size_t len_);  // unregistered
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  bool reg(ibv_pd* pd, int access);
  uint64_t addr(size_t off = 0) const { return reinterpret_cast<uint64_t>(data + off); }
  uint32_t lkey() const { return mr->lkey; }
  uint32_t rkey() const { return mr->rkey; }
  ibv_sge sge(size_t off, uint32_t length) const { return ibv_sge{addr(off), length, mr->lkey}; }
  uint64_t& u64(size_t off) { return *reinterpret_cast<uint64_t*>(data + off); }
};

inline constexpr int kAllAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

struct QpConfig {
  uint32_t max_send_wr = 128;
  uint32_t max_recv_wr = 128;
  uint32_t max_send_sge = 4;
  uint32_t max_recv_sge = 4;
  uint32_t max_inline_data = 64;
  int send_cqe = 256;
  int recv_cqe = 256;
  bool sq_sig_all = false;
  bool extended = false;  // create with ibv_create_qp_ex and send_ops_flags
  uint64_t send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                            IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                            IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                            IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
  ibv_comp_channel* recv_channel = nullptr;  // completion channel of the receive CQ
  ibv_comp_channel* send_channel = nullptr;
  bool shared_cq = false;  // one CQ for send and receive (recv_cqe, recv_channel), as qperf has
  uint32_t srq_wr = 0;     // nonzero: the QP receives through an SRQ of this many WQEs (Side::srq)
};

struct ConnConfig {
  ibv_mtu path_mtu = IBV_MTU_1024;
  unsigned access = kAllAccess;
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 12;
  uint8_t max_rd_atomic = 16;       // clamped to the device's max_qp_init_rd_atom
  uint8_t max_dest_rd_atomic = 16;  // clamped to the device's max_qp_rd_atom
};

// One end of an RC connection: its own PD, CQs and QP (all on the shared device).
struct Side {
  Device* dev = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_qp_ex* qpx = nullptr;
  ibv_srq* srq = nullptr;  // QpConfig::srq_wr: receives are posted here (max_recv_sge SGEs each)
  ibv_qp_cap cap{};  // what create returned
  uint32_t psn = 0;
  Side() = default;
  ~Side() { reset(); }
  void reset();  // destroys QP, SRQ, CQs and PD
  Side(const Side&) = delete;
  Side& operator=(const Side&) = delete;
  // Creates PD, CQs and QP (RESET state). Returns false (with a gtest failure) on error.
  bool create(Device& d, const QpConfig& cfg);
  void destroy_qp();
  std::unique_ptr<Buffer> buf(size_t len, int access = kAllAccess);
  uint32_t qpn() const { return qp->qp_num; }
};

// The three transitions, each with exactly the attributes the brief and the spec require.
int modify_to_init(ibv_qp* qp, unsigned access);
int modify_to_rtr(ibv_qp* qp, uint32_t dest_qpn, uint32_t rq_psn, const ibv_gid& dgid,
                  const ConnConfig& c, const ibv_device_attr& attr);
int modify_to_rts(ibv_qp* qp, uint32_t sq_psn, const ConnConfig& c, const ibv_device_attr& attr);
// RESET -> INIT -> RTR -> RTS towards (dest_qpn, rq_psn). Returns 0 or the failing errno.
int bring_up(ibv_qp* qp, uint32_t my_psn, uint32_t dest_qpn, uint32_t dest_psn,
             const ibv_gid& dgid, const ConnConfig& c, const ibv_device_attr& attr);

uint32_t random_psn();

// Polls until one completion is there or kWaitSeconds pass (then false + gtest failure).
bool poll_wc(ibv_cq* cq, ibv_wc* wc, int timeout_s = kWaitSeconds);
// Polls exactly n completions (fewer on timeout, with a gtest failure).
std::vector<ibv_wc> poll_wcs(ibv_cq* cq, size_t n, int timeout_s = kWaitSeconds);
// Number of completions available right now (drains them).
int drain_cq(ibv_cq* cq, std::vector<ibv_wc>* out = nullptr);
// Waits for the QP to report `state` via ibv_query_qp (bounded).
bool wait_qp_state(ibv_qp* qp, ibv_qp_state state, int timeout_s = kWaitSeconds);
ibv_qp_state qp_state(ibv_qp* qp);

// Expected fields of a completion; unset optionals are not checked.
struct WcExpect {
  uint64_t wr_id;
  ibv_wc_status status = IBV_WC_SUCCESS;
  std::optional<ibv_wc_opcode> opcode;
  std::optional<uint32_t> byte_len;
  std::optional<uint32_t> imm;  // host order; also requires IBV_WC_WITH_IMM
  bool no_imm = false;          // requires IBV_WC_WITH_IMM clear
  uint32_t qp_num = 0;
};
void expect_wc(const ibv_wc& wc, const WcExpect& e);

// Work request builders for ibv_post_send.
struct SendWr {
  ibv_send_wr wr{};
  std::vector<ibv_sge> sges;
  SendWr(uint64_t wr_id, ibv_wr_opcode op, std::vector<ibv_sge> s, unsigned flags = IBV_SEND_SIGNALED);
  SendWr& rdma(uint64_t raddr, uint32_t rkey);
  SendWr& imm(uint32_t host_imm);
  SendWr& cmp_swp(uint64_t raddr, uint32_t rkey, uint64_t compare, uint64_t swap);
  SendWr& fetch_add(uint64_t raddr, uint32_t rkey, uint64_t add);
  ibv_send_wr* get();
};
int post_send(ibv_qp* qp, SendWr& w);
int post_recv(ibv_qp* qp, uint64_t wr_id, std::vector<ibv_sge> sges);

// Deterministic byte pattern, position-dependent so misplaced data is caught.
void fill_pattern(void* p, size_t n, uint32_t seed, size_t base = 0);
// Returns n when p[0..n) matches the pattern, otherwise the first mismatching offset.
size_t check_pattern(const void* p, size_t n, uint32_t seed, size_t base = 0);

// A connected loopback TCP pair: fds[0] connected to fds[1]; false (both -1 or closed) on error.
bool tcp_pair(int fds[2]);

// A connected RC pair a <-> b on the loopback device, over `path` (Path::Direct unless a subclass
// sets it before SetUp: OverPaths below).
class RcPair : public ::testing::Test {
 protected:
  Path path = Path::Direct;
  // TearDown checks that the traffic took `path` (OverPaths, or a fixture that names its path). Off
  // for the plain default, which follows SOFTRDMA_DIRECT (tools/test.sh reruns those with it 0).
  bool check_path = false;
  Device dev{Device::Later{}};  // opened by SetUp, for `path`
  Side a, b;
  ConnConfig conn;
  QpConfig qcfg;
  ibv_comp_channel* channel = nullptr;  // destroyed after both sides' CQs

  ~RcPair() override;
  void SetUp() override;
  // With check_path, checks that the traffic since SetUp took `path` (the device counters), so a
  // parameter that silently changes nothing fails.
  void TearDown() override;
  // A non-blocking completion channel owned by the fixture.
  ibv_comp_channel* make_channel();
  // Creates both QPs with qcfg and connects them with conn; false (with a gtest failure) on error.
  // On Path::Iwarp: each QP to INIT, then attached to one end of a loopback TCP connection (the
  // IB path attributes, PSNs and retry counts of conn do not exist there; its READ depths do).
  bool connect();
  // Connects two RC QPs in RESET over `path` with conn, for a fixture with QPs or contexts of its own
  // (connect() uses it for a and b): x of device dx with its PSN x_psn, y of dy. RoCE: bring_up each
  // towards the other. Path::Iwarp: each to INIT, then attached to one end of a loopback TCP
  // connection, x initiating (as librdmacm's active side). False (with a gtest failure) on error.
  bool join(ibv_qp* x, uint32_t x_psn, const Device& dx, ibv_qp* y, uint32_t y_psn, const Device& dy);
  // qcfg as QPs of `path` take it: on iWARP without the ibv_wr_* operations that an iWARP QP refuses
  // at creation (immediate data, atomics).
  QpConfig path_qp_config() const;
  bool atomics_supported() const { return dev.attr.atomic_cap != IBV_ATOMIC_NONE; }

 private:
  bool join_iwarp(ibv_qp* x, const Device& dx, ibv_qp* y, const Device& dy);
  uint64_t direct_ops_ = 0, tx_packets_ = 0, iw_tx_fpdus_ = 0;  // at SetUp
  bool iw_attached_ = false;
};

// An RcPair-derived fixture run over the paths its instantiation lists (TEST_P with
// VT_INSTANTIATE_PATHS), as UCX's UCT_INSTANTIATE_TEST_CASE runs one body over every transport.
template <class Fixture = RcPair>
class OverPaths : public Fixture, public ::testing::WithParamInterface<Path> {
 protected:
  OverPaths() {
    this->path = this->GetParam();
    this->check_path = true;
  }
};

// Test names end in /direct, /packets or /iwarp.
struct PathParamName {
  std::string operator()(const ::testing::TestParamInfo<Path>& info) const { return path_name(info.param); }
};

// Instantiates the TEST_Ps of `suite` (an OverPaths fixture) over the paths listed, e.g.
// VT_INSTANTIATE_PATHS(Opcodes, Path::Direct, Path::Packets, Path::Iwarp).
#define VT_INSTANTIATE_PATHS(suite, ...) \
  INSTANTIATE_TEST_SUITE_P(Paths, suite, ::testing::Values(__VA_ARGS__), ::softrdma::verbs_test::PathParamName())
// Every path, and the RoCE ones (the operation or status does not exist on iWARP).
#define VT_ALL_PATHS Path::Direct, Path::Packets, Path::Iwarp
#define VT_ROCE_PATHS Path::Direct, Path::Packets

// Registers `len` bytes on a side and fails the test (returning) when that does not work.
#define VT_BUF(var, side, ...)        \
  auto var = (side).buf(__VA_ARGS__); \
  ASSERT_TRUE(var && var->mr) << "ibv_reg_mr failed"

}  // namespace softrdma::verbs_test
