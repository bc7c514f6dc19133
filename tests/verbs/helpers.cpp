#include "helpers.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>

#include "two_process.h"       // my_counter: the stats page
#include "verbs/private_abi.h"  // softrdma_open_device_with, softrdma_set_option, softrdma_iwarp_attach

namespace softrdma::verbs_test {

uint8_t sgid_index() {
  const char* e = std::getenv("VT_GID_INDEX");
  return e ? static_cast<uint8_t>(std::atoi(e)) : 0;
}

ibv_gid loopback_gid() {
  ibv_gid g{};
  g.raw[10] = 0xff;
  g.raw[11] = 0xff;
  g.raw[12] = 127;
  g.raw[15] = 1;
  return g;
}

bool gid_equal(const ibv_gid& a, const ibv_gid& b) { return std::memcmp(a.raw, b.raw, 16) == 0; }

std::string gid_str(const ibv_gid& g) {
  char s[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, g.raw, s, sizeof(s));
  return s;
}

ibv_context* open_loopback_device() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return nullptr;
  ibv_context* found = nullptr;
  const ibv_gid want = loopback_gid();
  const char* name = std::getenv("VT_DEVICE");
  for (int i = 0; i < n && !found; ++i) {
    if (name && std::strcmp(name, ibv_get_device_name(list[i])) != 0) continue;
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) continue;
    ibv_gid g{};
    if (name || (ibv_query_gid(ctx, kPort, 0, &g) == 0 && gid_equal(g, want))) {
      found = ctx;
    } else {
      ibv_close_device(ctx);
    }
  }
  ibv_free_device_list(list);
  return found;
}

const char* path_name(Path p) {
  switch (p) {
    case Path::Direct: return "direct";
    case Path::Packets: return "packets";
    case Path::Iwarp: return "iwarp";
  }
  return "?";
}

ibv_context* open_loopback_device(Path path, const char* settings) {
  if (const char* name = std::getenv("VT_DEVICE")) {
    if (path != Path::Direct) return nullptr;
    return settings ? softrdma_open_device_with(name, 0, settings) : open_loopback_device();
  }
  switch (path) {
    case Path::Direct: return softrdma_open_device_with("softrdma_lo", 0, settings);
    case Path::Packets: return softrdma_open_device_with("softrdma_lo", SOFTRDMA_OPEN_PACKETS, settings);
    case Path::Iwarp: return softrdma_open_device_with("softrdma_iw_lo", SOFTRDMA_OPEN_PACKETS, settings);
  }
  return nullptr;
}

Device::Device() { open(Path::Direct); }

Device::Device(const char* settings) { open(Path::Direct, settings); }

bool Device::open(Path path, const char* settings) {
  close();
  ctx = open_loopback_device(path, settings);
  if (!ctx) return false;
  if (ibv_query_device(ctx, &attr) || ibv_query_port(ctx, kPort, &port) ||
      ibv_query_gid(ctx, kPort, sgid_index(), &gid)) {
    close();
    return false;
  }
  return true;
}

void Device::close() {
  if (ctx) ibv_close_device(ctx);
  ctx = nullptr;
}

Device::~Device() { close(); }

ScopedOption::ScopedOption(const char* n, const char* value) : name(n) {
  EXPECT_EQ(softrdma_set_option(n, value), 0) << n << "=" << value;
}

ScopedOption::~ScopedOption() { softrdma_set_option(name.c_str(), nullptr); }

Buffer::Buffer(size_t len_) : len(len_) {
  // Always map at least one page so zero-length buffers still have a valid address.
  map_len = std::max<size_t>((len + 4095) & ~size_t{4095}, 4096);
  void* p = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  data = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

Buffer::~Buffer() {
  if (mr) ibv_dereg_mr(mr);
  if (data) munmap(data, map_len);
}

bool Buffer::reg(ibv_pd* pd, int access) {
  if (!data) return false;
  mr = ibv_reg_mr(pd, data, len, access);
  return mr != nullptr;
}

void Side::reset() {
  destroy_qp();
  if (srq) ibv_destroy_srq(srq);
  srq = nullptr;
  if (scq && scq != rcq) ibv_destroy_cq(scq);
  if (rcq) ibv_destroy_cq(rcq);
  if (pd) ibv_dealloc_pd(pd);
  scq = rcq = nullptr;
  pd = nullptr;
}

void Side::destroy_qp() {
  if (qp) ibv_destroy_qp(qp);
  qp = nullptr;
  qpx = nullptr;
}

bool Side::create(Device& d, const QpConfig& cfg) {
  dev = &d;
  pd = ibv_alloc_pd(d.ctx);
  if (!pd) {
    ADD_FAILURE() << "ibv_alloc_pd: " << strerror(errno);
    return false;
  }
  rcq = ibv_create_cq(d.ctx, cfg.recv_cqe, nullptr, cfg.recv_channel, 0);
  scq = cfg.shared_cq ? rcq : ibv_create_cq(d.ctx, cfg.send_cqe, nullptr, cfg.send_channel, 0);
  if (!scq || !rcq) {
    ADD_FAILURE() << "ibv_create_cq: " << strerror(errno);
    return false;
  }
  if (cfg.srq_wr) {
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = cfg.srq_wr;
    sa.attr.max_sge = cfg.max_recv_sge;
    srq = ibv_create_srq(pd, &sa);
    if (!srq) {
      ADD_FAILURE() << "ibv_create_srq: " << strerror(errno);
      return false;
    }
  }
  ibv_qp_cap want{};
  want.max_send_wr = cfg.max_send_wr;
  want.max_recv_wr = srq ? 0 : cfg.max_recv_wr;
  want.max_send_sge = cfg.max_send_sge;
  want.max_recv_sge = srq ? 0 : cfg.max_recv_sge;
  want.max_inline_data = cfg.max_inline_data;
  if (!cfg.extended) {
    ibv_qp_init_attr ia{};
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.srq = srq;
    ia.cap = want;
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = cfg.sq_sig_all ? 1 : 0;
    qp = ibv_create_qp(pd, &ia);
    cap = ia.cap;
  } else {
    ibv_qp_init_attr_ex ia{};
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.srq = srq;
    ia.cap = want;
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = cfg.sq_sig_all ? 1 : 0;
    ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ia.pd = pd;
    ia.send_ops_flags = cfg.send_ops_flags;
    qp = ibv_create_qp_ex(d.ctx, &ia);
    cap = ia.cap;
    if (qp) {
      qpx = ibv_qp_to_qp_ex(qp);
      if (!qpx) {
        ADD_FAILURE() << "ibv_qp_to_qp_ex returned NULL for a QP created with send_ops_flags";
        return false;
      }
    }
  }
  if (!qp) {
    ADD_FAILURE() << "ibv_create_qp: " << strerror(errno);
    return false;
  }
  // The caps handed back must be at least what was asked for (ibv_create_qp(3)).
  EXPECT_GE(cap.max_send_wr, want.max_send_wr);
  EXPECT_GE(cap.max_recv_wr, want.max_recv_wr);
  EXPECT_GE(cap.max_send_sge, want.max_send_sge);
  EXPECT_GE(cap.max_recv_sge, want.max_recv_sge);
  EXPECT_GE(cap.max_inline_data, want.max_inline_data);
  psn = random_psn();
  return true;
}

std::unique_ptr<Buffer> Side::buf(size_t len, int access) {
  auto b = std::make_unique<Buffer>(len);
  if (!b->reg(pd, access)) ADD_FAILURE() << "ibv_reg_mr(" << len << "): " << strerror(errno);
  return b;
}

int modify_to_init(ibv_qp* qp, unsigned access) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = kPort;
  a.qp_access_flags = access;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int modify_to_rtr(ibv_qp* qp, uint32_t dest_qpn, uint32_t rq_psn, const ibv_gid& dgid,
                  const ConnConfig& c, const ibv_device_attr& attr) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = c.path_mtu;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = rq_psn;
  a.max_dest_rd_atomic = static_cast<uint8_t>(std::min<int>(c.max_dest_rd_atomic, attr.max_qp_rd_atom));
  a.min_rnr_timer = c.min_rnr_timer;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = dgid;
  a.ah_attr.grh.sgid_index = sgid_index();
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = kPort;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int modify_to_rts(ibv_qp* qp, uint32_t sq_psn, const ConnConfig& c, const ibv_device_attr& attr) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = c.timeout;
  a.retry_cnt = c.retry_cnt;
  a.rnr_retry = c.rnr_retry;
  a.sq_psn = sq_psn;
  a.max_rd_atomic = static_cast<uint8_t>(std::min<int>(c.max_rd_atomic, attr.max_qp_init_rd_atom));
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

int bring_up(ibv_qp* qp, uint32_t my_psn, uint32_t dest_qpn, uint32_t dest_psn, const ibv_gid& dgid,
             const ConnConfig& c, const ibv_device_attr& attr) {
  if (int rc = modify_to_init(qp, c.access)) return rc;
  if (int rc = modify_to_rtr(qp, dest_qpn, dest_psn, dgid, c, attr)) return rc;
  return modify_to_rts(qp, my_psn, c, attr);
}

uint32_t random_psn() {
  static std::mt19937 rng{std::random_device{}()};
  return rng() & 0xffffff;
}

bool poll_wc(ibv_cq* cq, ibv_wc* wc, int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0) {
      ADD_FAILURE() << "ibv_poll_cq returned " << n;
      return false;
    }
    if (n == 1) return true;
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "no completion within " << timeout_s << " s";
      return false;
    }
    sched_yield();
  }
}

std::vector<ibv_wc> poll_wcs(ibv_cq* cq, size_t n, int timeout_s) {
  std::vector<ibv_wc> out;
  ibv_wc wc{};
  while (out.size() < n && poll_wc(cq, &wc, timeout_s)) out.push_back(wc);
  return out;
}

int drain_cq(ibv_cq* cq, std::vector<ibv_wc>* out) {
  int total = 0;
  ibv_wc wc{};
  while (ibv_poll_cq(cq, 1, &wc) == 1) {
    ++total;
    if (out) out->push_back(wc);
  }
  return total;
}

ibv_qp_state qp_state(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia)) return static_cast<ibv_qp_state>(-1);
  return a.qp_state;
}

bool wait_qp_state(ibv_qp* qp, ibv_qp_state state, int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (qp_state(qp) != state) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "QP " << qp->qp_num << " never reached state " << state << " (is "
                    << qp_state(qp) << ")";
      return false;
    }
    sched_yield();
  }
  return true;
}

void expect_wc(const ibv_wc& wc, const WcExpect& e) {
  EXPECT_EQ(wc.status, e.status) << "wr_id " << wc.wr_id << ": got " << ibv_wc_status_str(wc.status)
                                 << ", want " << ibv_wc_status_str(e.status);
  EXPECT_EQ(wc.wr_id, e.wr_id);
  if (e.qp_num) {
    EXPECT_EQ(wc.qp_num, e.qp_num);
  }
  // Only wr_id, status, qp_num and vendor_err are defined for a failed completion.
  if (wc.status != IBV_WC_SUCCESS) return;
  if (e.opcode) {
    EXPECT_EQ(wc.opcode, *e.opcode) << "wr_id " << wc.wr_id;
  }
  if (e.byte_len) {
    EXPECT_EQ(wc.byte_len, *e.byte_len) << "wr_id " << wc.wr_id;
  }
  if (e.imm) {
    EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM) << "wr_id " << wc.wr_id;
    EXPECT_EQ(ntohl(wc.imm_data), *e.imm) << "wr_id " << wc.wr_id;
  }
  if (e.no_imm) {
    EXPECT_FALSE(wc.wc_flags & IBV_WC_WITH_IMM) << "wr_id " << wc.wr_id;
  }
}

SendWr::SendWr(uint64_t wr_id, ibv_wr_opcode op, std::vector<ibv_sge> s, unsigned flags)
    : sges(std::move(s)) {
  wr.wr_id = wr_id;
  wr.opcode = op;
  wr.send_flags = flags;
}

SendWr& SendWr::rdma(uint64_t raddr, uint32_t rkey) {
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  return *this;
}

SendWr& SendWr::imm(uint32_t host_imm) {
  wr.imm_data = htonl(host_imm);
  return *this;
}

SendWr& SendWr::cmp_swp(uint64_t raddr, uint32_t rkey, uint64_t compare, uint64_t swap) {
  wr.wr.atomic.remote_addr = raddr;
  wr.wr.atomic.rkey = rkey;
  wr.wr.atomic.compare_add = compare;
  wr.wr.atomic.swap = swap;
  return *this;
}

SendWr& SendWr::fetch_add(uint64_t raddr, uint32_t rkey, uint64_t add) {
  wr.wr.atomic.remote_addr = raddr;
  wr.wr.atomic.rkey = rkey;
  wr.wr.atomic.compare_add = add;
  return *this;
}

ibv_send_wr* SendWr::get() {
  wr.sg_list = sges.empty() ? nullptr : sges.data();
  wr.num_sge = static_cast<int>(sges.size());
  wr.next = nullptr;
  return &wr;
}

int post_send(ibv_qp* qp, SendWr& w) {
  ibv_send_wr* bad = nullptr;
  ibv_send_wr* wr = w.get();
  int rc = ibv_post_send(qp, wr, &bad);
  if (rc) {
    EXPECT_EQ(bad, wr) << "bad_wr must point at the rejected WR";
  }
  return rc;
}

int post_recv(ibv_qp* qp, uint64_t wr_id, std::vector<ibv_sge> sges) {
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = sges.empty() ? nullptr : sges.data();
  wr.num_sge = static_cast<int>(sges.size());
  ibv_recv_wr* bad = nullptr;
  int rc = ibv_post_recv(qp, &wr, &bad);
  if (rc) {
    EXPECT_EQ(bad, &wr) << "bad_wr must point at the rejected WR";
  }
  return rc;
}

namespace {
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
uint8_t pattern_byte(uint32_t seed, size_t pos) {
  return static_cast<uint8_t>(mix((uint64_t{seed} << 40) ^ (pos / 8)) >> (8 * (pos % 8)));
}
}  // namespace

void fill_pattern(void* p, size_t n, uint32_t seed, size_t base) {
  auto* d = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) d[i] = pattern_byte(seed, base + i);
}

size_t check_pattern(const void* p, size_t n, uint32_t seed, size_t base) {
  const auto* d = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i)
    if (d[i] != pattern_byte(seed, base + i)) return i;
  return n;
}

RcPair::~RcPair() {
  a.reset();
  b.reset();
  if (channel) ibv_destroy_comp_channel(channel);
}

ibv_comp_channel* RcPair::make_channel() {
  channel = ibv_create_comp_channel(dev.ctx);
  if (channel) fcntl(channel->fd, F_SETFL, fcntl(channel->fd, F_GETFL) | O_NONBLOCK);
  return channel;
}

void RcPair::SetUp() {
  ASSERT_TRUE(dev.open(path)) << "no loopback device for path " << path_name(path)
                              << " (GID[0] = ::ffff:127.0.0.1 on port 1, or softrdma_iw_lo)";
  direct_ops_ = my_counter(&core::Counters::direct_ops) + my_counter(&core::Counters::direct_fallbacks);
  tx_packets_ = my_counter(&core::Counters::tx_packets);
  iw_tx_fpdus_ = my_counter(&core::Counters::iw_tx_fpdus);
}

void RcPair::TearDown() {
  if (!check_path || std::getenv("VT_DEVICE") || !dev.ok()) return;  // another provider: no stats page
  // On the direct path an operation either goes direct or is handed to packets (a fallback: an
  // error the peer's responder must report, a receive the direct path does not know of).
  const uint64_t direct = my_counter(&core::Counters::direct_ops) + my_counter(&core::Counters::direct_fallbacks) -
                          direct_ops_;
  const uint64_t packets = my_counter(&core::Counters::tx_packets) - tx_packets_;
  const uint64_t fpdus = my_counter(&core::Counters::iw_tx_fpdus) - iw_tx_fpdus_;
  switch (path) {
    case Path::Direct:
      if (packets + fpdus > 0) {
        EXPECT_GT(direct, 0u) << "path direct: " << packets << " packets and " << fpdus
                              << " FPDUs sent, no direct operation or fallback (direct_unavailable "
                              << my_counter(&core::Counters::direct_unavailable) << ", direct_refused "
                              << my_counter(&core::Counters::direct_refused) << ")";
      }
      break;
    case Path::Packets:
      EXPECT_EQ(direct, 0u) << "path packets: operations went by the direct path";
      EXPECT_EQ(fpdus, 0u);
      break;
    case Path::Iwarp:
      EXPECT_EQ(direct, 0u) << "path iwarp: operations went by the direct path";
      EXPECT_EQ(packets, 0u) << "path iwarp: RoCE packets sent";
      if (iw_attached_) {
        EXPECT_GT(fpdus, 0u) << "path iwarp: no FPDU (the attach's RTR WRITE at least)";
      }
      break;
  }
}

bool tcp_pair(int fds[2]) {
  fds[0] = fds[1] = -1;
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l < 0) return false;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  bool ok = bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 && listen(l, 1) == 0 &&
            getsockname(l, reinterpret_cast<sockaddr*>(&sa), &len) == 0;
  if (ok) {
    fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ok = fds[0] >= 0 && ::connect(fds[0], reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  }
  if (ok) {
    fds[1] = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    ok = fds[1] >= 0;
  }
  ::close(l);
  return ok;
}

bool RcPair::connect() {
  const QpConfig cfg = path_qp_config();
  if (!a.create(dev, cfg) || !b.create(dev, cfg)) return false;
  return join(a.qp, a.psn, dev, b.qp, b.psn, dev);
}

QpConfig RcPair::path_qp_config() const {
  QpConfig cfg = qcfg;
  if (path == Path::Iwarp) {
    cfg.send_ops_flags &= ~uint64_t{IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                                    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD};
  }
  return cfg;
}

bool RcPair::join(ibv_qp* x, uint32_t x_psn, const Device& dx, ibv_qp* y, uint32_t y_psn, const Device& dy) {
  if (path == Path::Iwarp) return join_iwarp(x, dx, y, dy);
  int rc = bring_up(x, x_psn, y->qp_num, y_psn, dy.gid, conn, dx.attr);
  if (rc) {
    ADD_FAILURE() << "bringing up QP " << x->qp_num << ": " << strerror(rc);
    return false;
  }
  rc = bring_up(y, y_psn, x->qp_num, x_psn, dx.gid, conn, dy.attr);
  if (rc) {
    ADD_FAILURE() << "bringing up QP " << y->qp_num << ": " << strerror(rc);
    return false;
  }
  return true;
}

// As librdmacm after its MPA exchange: x initiates (a zero-length WRITE first), y awaits it. No peer
// QPN is given, so the QPs exchange FPDUs over the socket instead of taking the direct path.
bool RcPair::join_iwarp(ibv_qp* x, const Device& dx, ibv_qp* y, const Device& dy) {
  for (ibv_qp* q : {x, y})
    if (int rc = modify_to_init(q, conn.access)) {
      ADD_FAILURE() << "QP " << q->qp_num << " to INIT: " << strerror(rc);
      return false;
    }
  int fds[2];
  if (!tcp_pair(fds)) {
    ADD_FAILURE() << "loopback TCP connection: " << strerror(errno);
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    return false;
  }
  softrdma_iwarp_conn cx{}, cy{};
  cx.fd = fds[0];
  cy.fd = fds[1];
  cx.rtr = SOFTRDMA_IW_RTR_SEND_WRITE;
  cy.rtr = SOFTRDMA_IW_RTR_AWAIT_WRITE;
  // conn's READ depths, each clamped to the device as modify_to_rts/rtr do.
  cx.ord = std::min<uint32_t>(conn.max_rd_atomic, dx.attr.max_qp_init_rd_atom);
  cy.ord = std::min<uint32_t>(conn.max_rd_atomic, dy.attr.max_qp_init_rd_atom);
  cx.ird = std::min<uint32_t>(conn.max_dest_rd_atomic, dx.attr.max_qp_rd_atom);
  cy.ird = std::min<uint32_t>(conn.max_dest_rd_atomic, dy.attr.max_qp_rd_atom);
  int rc = softrdma_iwarp_attach(y, &cy);
  if (rc == 0) rc = softrdma_iwarp_attach(x, &cx);
  // The QPs keep their own dups of the sockets.
  ::close(fds[0]);
  ::close(fds[1]);
  if (rc) {
    ADD_FAILURE() << "softrdma_iwarp_attach: " << strerror(rc);
    return false;
  }
  iw_attached_ = true;
  return true;
}

}  // namespace softrdma::verbs_test
