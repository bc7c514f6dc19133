// iWARP verbs devices (SOFTRDMA_TRANSPORT=iwarp|both; docs/iwarp.md): the device list, the
// attributes an RNIC reports (as siw), the verbs an iWARP QP refuses, and softrdma_iwarp_attach --
// validation, and a QP pair over a loopback TCP connection moved to RTS by it, byte-verified SEND,
// WRITE and READ on the intra-host direct path (and on the engine's TCP path where it exists).
// Contexts are opened by name (softrdma_open_device); the process's settings, which the device list
// and the attach read, are given by softrdma_set_option (ScopedOption), not the environment.
#include "two_process.h"
#include "verbs/private_abi.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace softrdma::verbs_test {
namespace {

std::vector<std::string> device_names() {
  std::vector<std::string> out;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  for (int i = 0; list && i < n; ++i) out.emplace_back(ibv_get_device_name(list[i]));
  if (list) ibv_free_device_list(list);
  return out;
}

// One end: PD, CQs and an RC QP in INIT on an iWARP context.
struct End {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  bool create(ibv_context* c) {
    ctx = c;
    pd = ibv_alloc_pd(ctx);
    cq = pd ? ibv_create_cq(ctx, 256, nullptr, nullptr, 0) : nullptr;
    if (!cq) return false;
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 64;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 4;
    qp = ibv_create_qp(pd, &ia);
    return qp != nullptr;
  }
  // RESET -> INIT as the iWARP CM does it: state and access flags only.
  int init(unsigned access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.qp_access_flags = access;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS);
  }
  void destroy_qp() {
    if (qp) ibv_destroy_qp(qp);
    qp = nullptr;
  }
  ~End() {
    destroy_qp();
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
  }
};

softrdma_iwarp_conn conn_of(int fd, uint32_t peer_qpn, uint32_t rtr) {
  softrdma_iwarp_conn c{};
  c.fd = fd;
  c.rtr = rtr;
  c.ird = c.ord = 16;
  c.peer_qpn = peer_qpn;
  return c;
}

// The device whatever SOFTRDMA_TRANSPORT selects, with the process's settings (as ibv_open_device).
class IwarpVerbs : public ::testing::Test {
 protected:
  ibv_context* ctx = nullptr;
  void SetUp() override {
    ctx = softrdma_open_device("softrdma_iw_lo", 0);
    ASSERT_NE(ctx, nullptr) << "no softrdma_iw_lo device";
  }
  void TearDown() override {
    if (ctx) ibv_close_device(ctx);
  }
};

TEST(IwarpDevices, SelectedBySoftrdmaTransport) {
  std::vector<std::string> roce, iw, both;
  {
    ScopedOption e("SOFTRDMA_TRANSPORT", "");  // the default, whatever the environment says
    roce = device_names();
  }
  {
    ScopedOption e("SOFTRDMA_TRANSPORT", "iwarp");
    iw = device_names();
  }
  {
    ScopedOption e("SOFTRDMA_TRANSPORT", "both");
    both = device_names();
  }
  ASSERT_FALSE(roce.empty());
  // One iWARP device per RoCE device, in the same order: softrdma_iw_<ifname> for an IPv4 address,
  // softrdma_iw6_<ifname> for an IPv6 one (softrdma6_<ifname>).
  ASSERT_EQ(iw.size(), roce.size()) << "one iWARP device per RoCE device";
  EXPECT_EQ(roce.back(), "softrdma_lo");
  EXPECT_EQ(iw.back(), "softrdma_iw_lo") << "loopback last";
  for (size_t i = 0; i < roce.size(); ++i) {
    EXPECT_EQ(roce[i].rfind("softrdma_iw", 0), std::string::npos) << roce[i];
    const bool v6 = roce[i].rfind("softrdma6_", 0) == 0;
    const std::string itf = roce[i].substr(std::strlen(v6 ? "softrdma6_" : "softrdma_"));
    EXPECT_EQ(iw[i], (v6 ? "softrdma_iw6_" : "softrdma_iw_") + itf) << "same interfaces, same order";
  }
  std::vector<std::string> expect = roce;
  expect.insert(expect.end(), iw.begin(), iw.end());
  EXPECT_EQ(both, expect) << "both: RoCE devices first, then iWARP";

  // Node and transport types, and uverbsN numbered in list order.
  ScopedOption e("SOFTRDMA_TRANSPORT", "both");
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  for (int i = 0; i < n; ++i) {
    const bool is_iw = i >= static_cast<int>(roce.size());
    EXPECT_EQ(list[i]->node_type, is_iw ? IBV_NODE_RNIC : IBV_NODE_CA) << list[i]->name;
    EXPECT_EQ(list[i]->transport_type, is_iw ? IBV_TRANSPORT_IWARP : IBV_TRANSPORT_IB) << list[i]->name;
    EXPECT_EQ(std::string(list[i]->dev_name), "uverbs" + std::to_string(i));
    EXPECT_EQ(ibv_get_device_index(list[i]), i);
    const bool lo = i == n - 1 || i == static_cast<int>(roce.size()) - 1;
    const std::string nm = list[i]->name;
    const bool v6 = nm.rfind("softrdma6_", 0) == 0 || nm.rfind("softrdma_iw6_", 0) == 0;
    uint8_t ip[16] = {};
    ASSERT_EQ(softrdma_device_ip(list[i], ip), 0) << nm;
    const bool mapped = std::all_of(ip, ip + 10, [](uint8_t b) { return b == 0; }) && ip[10] == 0xFF && ip[11] == 0xFF;
    EXPECT_EQ(mapped, !v6) << nm << ": an IPv4 device's address comes IPv4-mapped";
    const uint32_t v4 = softrdma_device_ipv4(list[i]);
    if (lo) {
      EXPECT_EQ(v4, htonl(INADDR_LOOPBACK)) << nm;
    } else if (v6) {
      EXPECT_EQ(v4, 0u) << nm << ": an IPv6 device has no IPv4 address";
    } else {
      EXPECT_NE(v4, 0u) << nm;
    }
    if (!v6) {
      EXPECT_EQ(std::memcmp(ip + 12, &v4, 4), 0) << nm;
    }
  }
  ibv_free_device_list(list);
}

TEST_F(IwarpVerbs, DeviceAttributesAsSiw) {
  ibv_device_attr a{};
  ASSERT_EQ(ibv_query_device(ctx, &a), 0);
  EXPECT_EQ(a.atomic_cap, IBV_ATOMIC_NONE);
  EXPECT_EQ(a.device_cap_flags, static_cast<unsigned>(IBV_DEVICE_MEM_MGT_EXTENSIONS));
  EXPECT_EQ(a.max_sge_rd, 1);
  EXPECT_EQ(a.max_qp_rd_atom, 128);
  EXPECT_EQ(a.max_qp_init_rd_atom, 128);
  EXPECT_EQ(a.max_mw, 0);
  EXPECT_EQ(a.max_mcast_grp, 0);
  EXPECT_EQ(a.phys_port_cnt, 1);
  // The GUID is the EUI-64 of the (zero) loopback MAC, as siw's addrconf_addr_eui48.
  EXPECT_EQ(be64toh(a.node_guid), 0x020000fffe000000ull);
  EXPECT_EQ(a.sys_image_guid, a.node_guid);
  EXPECT_EQ(ibv_get_device_guid(ctx->device), a.node_guid);

  ibv_device_attr_ex x{};
  ASSERT_EQ(ibv_query_device_ex(ctx, nullptr, &x), 0);
  EXPECT_EQ(x.device_cap_flags_ex, uint64_t{IBV_DEVICE_MEM_MGT_EXTENSIONS}) << "no ATOMIC WRITE";
  EXPECT_EQ(x.odp_caps.general_caps, 0u);
  EXPECT_EQ(x.raw_packet_caps, 0u);
  EXPECT_EQ(x.max_dm_size, 0u);
  EXPECT_EQ(x.tm_caps.max_num_tags, 0u);

  ibv_port_attr p{};
  ASSERT_EQ(ibv_query_port(ctx, 1, &p), 0);
  EXPECT_EQ(p.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_EQ(p.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(p.active_mtu, IBV_MTU_4096) << "lo's 65536-byte MTU";
  EXPECT_EQ(p.gid_tbl_len, 1);
  EXPECT_EQ(p.pkey_tbl_len, 1);
  EXPECT_EQ(p.port_cap_flags, static_cast<uint32_t>(IBV_PORT_CM_SUP | IBV_PORT_DEVICE_MGMT_SUP));
  EXPECT_EQ(p.lid, 0);

  ibv_gid g{};
  g.raw[0] = 0xAA;
  ASSERT_EQ(ibv_query_gid(ctx, 1, 0, &g), 0);
  EXPECT_TRUE(gid_equal(g, ibv_gid{})) << "loopback has no MAC: GID 0 is zero, not " << gid_str(g);
  EXPECT_NE(ibv_query_gid(ctx, 1, 1, &g), 0) << "one GID only";
  ibv_gid_entry e{};
  ASSERT_EQ(ibv_query_gid_ex(ctx, 1, 0, &e, 0), 0);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_IB) << "an iWARP GID is not a RoCE GID";
  EXPECT_EQ(ibv_query_gid_ex(ctx, 1, 1, &e, 0), EINVAL);
  __be16 pkey = 0;
  EXPECT_EQ(ibv_query_pkey(ctx, 1, 0, &pkey), 0);
  EXPECT_EQ(pkey, htons(0xFFFF));
  EXPECT_EQ(softrdma_device_ipv4(ctx->device), htonl(INADDR_LOOPBACK));
}

TEST_F(IwarpVerbs, OnlyRcQpsAndNoMwXrcOrRawObjects) {
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  for (ibv_qp_type t : {IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_RAW_PACKET}) {
    ia.qp_type = t;
    errno = 0;
    EXPECT_EQ(ibv_create_qp(pd, &ia), nullptr) << "type " << t;
    EXPECT_EQ(errno, EOPNOTSUPP) << "type " << t;
  }
  ibv_qp_init_attr_ex ix{};
  ix.qp_type = IBV_QPT_XRC_SEND;
  ix.send_cq = cq;
  ix.pd = pd;
  ix.comp_mask = IBV_QP_INIT_ATTR_PD;
  ix.cap.max_send_wr = 4;
  ix.cap.max_send_sge = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx, &ix), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // RC, but asking for atomics or immediate data through send_ops_flags.
  ix.qp_type = IBV_QPT_RC;
  ix.recv_cq = cq;
  ix.cap.max_recv_wr = 4;
  ix.cap.max_recv_sge = 1;
  ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  for (uint64_t op : {uint64_t{IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD}, uint64_t{IBV_QP_EX_WITH_SEND_WITH_IMM},
                      uint64_t{IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM}, uint64_t{IBV_QP_EX_WITH_ATOMIC_WRITE}}) {
    ix.send_ops_flags = IBV_QP_EX_WITH_SEND | op;
    errno = 0;
    EXPECT_EQ(ibv_create_qp_ex(ctx, &ix), nullptr) << std::hex << op;
    EXPECT_EQ(errno, EOPNOTSUPP) << std::hex << op;
  }
  ix.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE |
                      IBV_QP_EX_WITH_RDMA_READ;
  ibv_qp* qpx = ibv_create_qp_ex(ctx, &ix);
  ASSERT_NE(qpx, nullptr) << std::strerror(errno);
  EXPECT_EQ(ibv_destroy_qp(qpx), 0);
  ia.qp_type = IBV_QPT_RC;
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  ASSERT_NE(qp, nullptr);
  // A basic SRQ is an RNIC's; XRC domains, memory windows, device memory and flows are not.
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd, &sa);
  EXPECT_NE(srq, nullptr);
  if (srq) {
    EXPECT_EQ(ibv_destroy_srq(srq), 0);
  }
  ibv_srq_init_attr_ex sx{};
  sx.attr.max_wr = 4;
  sx.attr.max_sge = 1;
  sx.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ;
  sx.srq_type = IBV_SRQT_TM;
  sx.pd = pd;
  sx.cq = cq;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(ctx, &sx), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP) << "no tag-matching SRQ";
  errno = 0;
  EXPECT_EQ(ibv_alloc_mw(pd, IBV_MW_TYPE_1), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ibv_xrcd_init_attr xa{};
  xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  xa.fd = -1;
  xa.oflags = O_CREAT;
  errno = 0;
  EXPECT_EQ(ibv_open_xrcd(ctx, &xa), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ibv_alloc_dm_attr da{};
  da.length = 64;
  errno = 0;
  EXPECT_EQ(ibv_alloc_dm(ctx, &da), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ibv_ah_attr ah{};
  ah.is_global = 1;
  ah.port_num = 1;
  ah.grh.dgid.raw[10] = ah.grh.dgid.raw[11] = 0xFF;
  ah.grh.dgid.raw[12] = 127;
  ah.grh.dgid.raw[15] = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_ah(pd, &ah), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP) << "no UD, no address handles";
  Buffer odp(4096);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd, odp.data, odp.len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP) << "no on-demand paging";
  ibv_mr* mr = ibv_reg_mr(pd, odp.data, odp.len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// RTR and RTS come from the connection only; INIT takes what the iWARP CM gives, ERR and RESET work.
TEST_F(IwarpVerbs, ModifyQpToRtrOrRtsByHandIsRefused) {
  End e;
  ASSERT_TRUE(e.create(ctx));
  ASSERT_EQ(e.init(), 0) << "RESET -> INIT with state and access flags only";
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(e.qp, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(q.qp_access_flags,
            static_cast<unsigned>(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));

  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = e.qp->qp_num;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xFF;
  a.ah_attr.grh.dgid.raw[12] = 127;
  a.ah_attr.grh.dgid.raw[15] = 1;
  EXPECT_EQ(ibv_modify_qp(e.qp, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            EINVAL);
  a = {};
  a.qp_state = IBV_QPS_RTS;
  EXPECT_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE), EINVAL);
  a.qp_state = IBV_QPS_INIT;
  a.dest_qp_num = 5;
  EXPECT_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN), EINVAL) << "no IB path attributes";
  ASSERT_EQ(ibv_query_qp(e.qp, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_INIT) << "nothing changed";
  a = {};
  a.qp_state = IBV_QPS_ERR;
  EXPECT_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE), 0);
  ASSERT_EQ(ibv_query_qp(e.qp, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_ERR);
  a.qp_state = IBV_QPS_RESET;
  EXPECT_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE), 0);
  EXPECT_EQ(e.init(), 0) << "and INIT again";
}

TEST_F(IwarpVerbs, AttachValidation) {
  End e;
  ASSERT_TRUE(e.create(ctx));
  int fds[2];
  ASSERT_TRUE(tcp_pair(fds));
  softrdma_iwarp_conn c = conn_of(fds[0], 0, SOFTRDMA_IW_RTR_SEND_WRITE);
  EXPECT_EQ(softrdma_iwarp_attach(e.qp, &c), EINVAL) << "a QP in RESET";
  ASSERT_EQ(e.init(), 0);
  EXPECT_EQ(softrdma_iwarp_attach(nullptr, &c), EINVAL);
  EXPECT_EQ(softrdma_iwarp_attach(e.qp, nullptr), EINVAL);
  softrdma_iwarp_conn bad = c;
  bad.fd = -1;
  EXPECT_EQ(softrdma_iwarp_attach(e.qp, &bad), EINVAL);
  bad = c;
  bad.rtr = 99;
  EXPECT_EQ(softrdma_iwarp_attach(e.qp, &bad), EINVAL);
  bad = c;
  bad.flags = 1u << 7;
  EXPECT_EQ(softrdma_iwarp_attach(e.qp, &bad), EINVAL);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  bad.flags = 0;
  bad.fd = p[0];
  EXPECT_EQ(softrdma_iwarp_attach(e.qp, &bad), EINVAL) << "not a socket";
  close(p[0]);
  close(p[1]);
  int u = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  bad.fd = u;
  EXPECT_EQ(softrdma_iwarp_attach(e.qp, &bad), EINVAL) << "not a stream";
  close(u);
  int t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bad.fd = t;
  EXPECT_EQ(softrdma_iwarp_attach(e.qp, &bad), ENOTCONN) << "not connected";
  close(t);
  bad = c;
  bad.peer_qpn = 1u << 24;
  EXPECT_EQ(softrdma_iwarp_attach(e.qp, &bad), EINVAL) << "a QPN has 24 bits";
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(e.qp, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_INIT) << "a refused attach leaves the QP as it was";

  // A QP of a RoCE device is not attached.
  {
    ibv_context* roce = softrdma_open_device("softrdma_lo", 0);
    ASSERT_NE(roce, nullptr);
    {
      End r;
      ASSERT_TRUE(r.create(roce));
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.port_num = 1;
      a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
      ASSERT_EQ(ibv_modify_qp(r.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
      EXPECT_EQ(softrdma_iwarp_attach(r.qp, &c), EINVAL);
    }
    ibv_close_device(roce);
  }
  close(fds[0]);
  close(fds[1]);
}

// Two contexts of this process, each QP attached over one end of a loopback TCP connection.
class IwarpVerbsPair : public IwarpVerbs {
 protected:
  ibv_context* ctx2 = nullptr;
  std::unique_ptr<End> a, b;
  int fds[2] = {-1, -1};
  void SetUp() override {
    IwarpVerbs::SetUp();
    if (HasFatalFailure()) return;
    ctx2 = softrdma_open_device("softrdma_iw_lo", 0);
    ASSERT_NE(ctx2, nullptr);
    a = std::make_unique<End>();
    b = std::make_unique<End>();
    ASSERT_TRUE(a->create(ctx));
    ASSERT_TRUE(b->create(ctx2));
    ASSERT_EQ(a->init(), 0);
    ASSERT_EQ(b->init(), 0);
    ASSERT_TRUE(tcp_pair(fds));
  }
  void TearDown() override {
    a.reset();  // QPs, CQs and PDs before their contexts
    b.reset();
    for (int& f : fds)
      if (f >= 0) close(f);
    if (ctx2) ibv_close_device(ctx2);
    IwarpVerbs::TearDown();
  }
  // Attaches both; the direct path when peer QPNs are given. 0 or the first errno.
  int attach(bool direct) {
    softrdma_iwarp_conn ca = conn_of(fds[0], direct ? b->qp->qp_num : 0, SOFTRDMA_IW_RTR_SEND_WRITE);
    softrdma_iwarp_conn cb = conn_of(fds[1], direct ? a->qp->qp_num : 0, SOFTRDMA_IW_RTR_AWAIT_WRITE);
    if (int rc = softrdma_iwarp_attach(b->qp, &cb)) return rc;
    return softrdma_iwarp_attach(a->qp, &ca);
  }
  void traffic();
};

// SEND/RECV, WRITE and READ from a to b, every byte verified, every completion checked.
void IwarpVerbsPair::traffic() {
  constexpr size_t kLen = 256 * 1024;
  Buffer sa(kLen), ra(kLen), sb(kLen), rb(kLen);
  const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ASSERT_TRUE(sa.reg(a->pd, acc) && ra.reg(a->pd, acc) && sb.reg(b->pd, acc) && rb.reg(b->pd, acc));
  // SEND 4000 bytes into a receive of two SGEs.
  fill_pattern(sa.data, 4000, 1);
  ASSERT_EQ(post_recv(b->qp, 11, {rb.sge(0, 1000), rb.sge(8192, 3000)}), 0);
  SendWr s(1, IBV_WR_SEND, {sa.sge(0, 4000)});
  ASSERT_EQ(post_send(a->qp, s), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a->cq, &wc));
  expect_wc(wc, {.wr_id = 1, .opcode = IBV_WC_SEND, .qp_num = a->qp->qp_num});
  ASSERT_TRUE(poll_wc(b->cq, &wc));
  expect_wc(wc, {.wr_id = 11, .opcode = IBV_WC_RECV, .byte_len = 4000, .no_imm = true, .qp_num = b->qp->qp_num});
  EXPECT_EQ(check_pattern(rb.data, 1000, 1), 1000u);
  EXPECT_EQ(check_pattern(rb.data + 8192, 3000, 1, 1000), 3000u);
  // WRITE 200 KiB + 5 from two SGEs at an odd offset.
  const size_t wlen = 200 * 1024 + 5;
  fill_pattern(sa.data, wlen, 2);
  SendWr w(2, IBV_WR_RDMA_WRITE, {sa.sge(0, 100), sa.sge(100, static_cast<uint32_t>(wlen - 100))});
  w.rdma(rb.addr(3), rb.rkey());
  ASSERT_EQ(post_send(a->qp, w), 0);
  ASSERT_TRUE(poll_wc(a->cq, &wc));
  expect_wc(wc, {.wr_id = 2, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a->qp->qp_num});
  // An iWARP WRITE completes once its data is handed to the stream, not once placed: a SEND behind it
  // (same stream, in order) is received only after the WRITE's data is in place.
  ASSERT_EQ(post_recv(b->qp, 13, {rb.sge(kLen - 8, 8)}), 0);
  SendWr after(5, IBV_WR_SEND, {sa.sge(0, 8)});
  ASSERT_EQ(post_send(a->qp, after), 0);
  ASSERT_TRUE(poll_wc(a->cq, &wc));
  expect_wc(wc, {.wr_id = 5, .opcode = IBV_WC_SEND, .qp_num = a->qp->qp_num});
  ASSERT_TRUE(poll_wc(b->cq, &wc));
  expect_wc(wc, {.wr_id = 13, .opcode = IBV_WC_RECV, .byte_len = 8, .qp_num = b->qp->qp_num});
  EXPECT_EQ(check_pattern(rb.data + 3, wlen, 2), wlen);
  // READ 250 KiB of b's memory into one SGE.
  const size_t rlen = 250 * 1024;
  fill_pattern(sb.data, rlen, 3);
  SendWr r(3, IBV_WR_RDMA_READ, {ra.sge(1, static_cast<uint32_t>(rlen))});
  r.rdma(sb.addr(), sb.rkey());
  ASSERT_EQ(post_send(a->qp, r), 0);
  ASSERT_TRUE(poll_wc(a->cq, &wc));
  expect_wc(wc, {.wr_id = 3, .opcode = IBV_WC_RDMA_READ, .byte_len = static_cast<uint32_t>(rlen),
                 .qp_num = a->qp->qp_num});
  EXPECT_EQ(check_pattern(ra.data + 1, rlen, 3), rlen);
  // And a SEND the other way.
  fill_pattern(sb.data, 64, 4);
  ASSERT_EQ(post_recv(a->qp, 12, {ra.sge(0, 64)}), 0);
  SendWr back(4, IBV_WR_SEND, {sb.sge(0, 64)});
  ASSERT_EQ(post_send(b->qp, back), 0);
  ASSERT_TRUE(poll_wc(b->cq, &wc));
  expect_wc(wc, {.wr_id = 4, .opcode = IBV_WC_SEND, .qp_num = b->qp->qp_num});
  ASSERT_TRUE(poll_wc(a->cq, &wc));
  expect_wc(wc, {.wr_id = 12, .opcode = IBV_WC_RECV, .byte_len = 64, .qp_num = a->qp->qp_num});
  EXPECT_EQ(check_pattern(ra.data, 64, 4), 64u);
}

TEST_F(IwarpVerbsPair, DirectPathSendWriteRead) {
  const char* direct_env = getenv("SOFTRDMA_DIRECT");
  if (direct_env && std::string(direct_env) == "0")
    GTEST_SKIP() << "SOFTRDMA_DIRECT=0: the direct path is off (TcpPathSendWriteRead covers the TCP path)";
  const uint64_t ops_before = my_counter(&core::Counters::direct_ops);
  const uint64_t fpdus_before = my_counter(&core::Counters::iw_tx_fpdus);
  ASSERT_EQ(attach(true), 0);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(a->qp, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(a->qp->state, IBV_QPS_RTS);
  EXPECT_EQ(q.dest_qp_num, b->qp->qp_num);
  EXPECT_EQ(q.max_rd_atomic, 16) << "ORD";
  EXPECT_EQ(q.max_dest_rd_atomic, 16) << "IRD";
  EXPECT_EQ(q.sq_psn, 0u);
  // A second attach of a connected QP is refused.
  softrdma_iwarp_conn again = conn_of(fds[0], b->qp->qp_num, SOFTRDMA_IW_RTR_SEND_WRITE);
  EXPECT_EQ(softrdma_iwarp_attach(a->qp, &again), EINVAL);

  ASSERT_NO_FATAL_FAILURE(traffic());
  EXPECT_GE(my_counter(&core::Counters::direct_ops) - ops_before, 3u) << "WRITE, READ and SENDs went direct";
  EXPECT_EQ(my_counter(&core::Counters::iw_tx_fpdus), fpdus_before) << "no FPDU";
  int pending = -1;
  ASSERT_EQ(ioctl(fds[1], FIONREAD, &pending), 0);
  EXPECT_EQ(pending, 0) << "the TCP socket carries nothing on the direct path";

  // The QP keeps its own dup of the socket: closing ours does not end the connection; destroying
  // the QP does (the peer reads EOF).
  close(fds[0]);
  fds[0] = -1;
  char byte;
  EXPECT_EQ(recv(fds[1], &byte, 1, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
  a->destroy_qp();
  pollfd pf{fds[1], POLLIN, 0};
  ASSERT_EQ(poll(&pf, 1, kWaitSeconds * 1000), 1);
  EXPECT_EQ(recv(fds[1], &byte, 1, MSG_DONTWAIT), 0) << "EOF once the QP is gone";
}

// SOFTRDMA_DIRECT=0 (or no local peer): the engine's iWARP data path over TCP (iw-transport).
TEST_F(IwarpVerbsPair, TcpPathSendWriteRead) {
  ScopedOption nodirect("SOFTRDMA_DIRECT", "0");  // the process's: the attach reads it, as librdmacm does
  const uint64_t ops_before = my_counter(&core::Counters::direct_ops);
  const uint64_t fpdus_before = my_counter(&core::Counters::iw_tx_fpdus);
  int rc = attach(true);
  if (rc == EOPNOTSUPP) GTEST_SKIP() << "Engine::iwarp_attach is not implemented in this build";
  ASSERT_EQ(rc, 0) << std::strerror(rc);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(a->qp, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(q.max_rd_atomic, 16) << "ORD";
  EXPECT_EQ(q.max_dest_rd_atomic, 16) << "IRD";
  ASSERT_NO_FATAL_FAILURE(traffic());
  EXPECT_EQ(my_counter(&core::Counters::direct_ops), ops_before) << "SOFTRDMA_DIRECT=0: nothing direct";
  EXPECT_GE(my_counter(&core::Counters::iw_tx_fpdus) - fpdus_before, 5u) << "the five messages went as FPDUs";
  // The engine owns its dup of the socket: closing ours leaves the connection; destroying the QP ends it.
  close(fds[0]);
  fds[0] = -1;
  a->destroy_qp();
  pollfd pf{fds[1], POLLIN, 0};
  ASSERT_EQ(poll(&pf, 1, kWaitSeconds * 1000), 1);
  char byte;
  ssize_t n;
  while ((n = recv(fds[1], &byte, 1, MSG_DONTWAIT)) > 0) {
  }
  EXPECT_EQ(n, 0) << "EOF once the QP is gone";
}

// Contexts opened under SOFTRDMA_IMPAIR (SOFTRDMA_DIRECT unset) have no direct path, and the iWARP
// attach agrees: given the peer's QPN (as librdmacm passes it when its tuple table finds the peer), the
// QPs still exchange FPDUs on their TCP stream. Issue 26: the attach read SOFTRDMA_DIRECT alone and put
// the QPs on the direct path the engine had off.
class IwarpVerbsPairImpaired : public IwarpVerbsPair {
 protected:
  // The process's, set before SetUp opens the contexts, and read again by the attach. Faults on the
  // UDP ports only: the TCP stream is untouched.
  ScopedOption impair{"SOFTRDMA_IMPAIR", "seed=26,tx_drop=0.01"};
  ScopedOption direct{"SOFTRDMA_DIRECT", ""};  // the default, whatever the environment says
};

TEST_F(IwarpVerbsPairImpaired, PeerQpnGivenStillTakesTheTcpStream) {
  const uint64_t ops_before = my_counter(&core::Counters::direct_ops);
  const uint64_t fpdus_before = my_counter(&core::Counters::iw_tx_fpdus);
  int rc = attach(true);
  if (rc == EOPNOTSUPP) GTEST_SKIP() << "Engine::iwarp_attach is not implemented in this build";
  ASSERT_EQ(rc, 0) << std::strerror(rc);
  ASSERT_NO_FATAL_FAILURE(traffic());
  EXPECT_EQ(my_counter(&core::Counters::direct_ops), ops_before) << "SOFTRDMA_IMPAIR: nothing direct";
  EXPECT_GE(my_counter(&core::Counters::iw_tx_fpdus) - fpdus_before, 5u) << "the five messages went as FPDUs";
}

// What an iWARP QP cannot post: immediate data, atomics, memory-window WRs, a READ into two SGEs.
TEST_F(IwarpVerbsPair, PostSendRefusesWhatRdmapLacks) {
  ASSERT_EQ(attach(true), 0);
  End& e = *a;
  Buffer mem(4096);
  ASSERT_TRUE(mem.reg(e.pd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
  struct Case {
    ibv_wr_opcode op;
    int sges;
  };
  for (Case k : {Case{IBV_WR_SEND_WITH_IMM, 1}, Case{IBV_WR_RDMA_WRITE_WITH_IMM, 1},
                 Case{IBV_WR_ATOMIC_CMP_AND_SWP, 1}, Case{IBV_WR_ATOMIC_FETCH_AND_ADD, 1},
                 Case{IBV_WR_ATOMIC_WRITE, 1}, Case{IBV_WR_LOCAL_INV, 0}, Case{IBV_WR_BIND_MW, 0},
                 Case{IBV_WR_RDMA_READ, 2}}) {
    std::vector<ibv_sge> s;
    for (int i = 0; i < k.sges; ++i) s.push_back(mem.sge(static_cast<size_t>(i) * 64, 8));
    SendWr w(7, k.op, s);
    w.rdma(mem.addr(1024), mem.rkey()).imm(1);
    if (k.op == IBV_WR_ATOMIC_CMP_AND_SWP || k.op == IBV_WR_ATOMIC_FETCH_AND_ADD)
      w.cmp_swp(mem.addr(1024), mem.rkey(), 0, 1);
    EXPECT_EQ(post_send(e.qp, w), EINVAL) << "opcode " << k.op;  // post_send checks bad_wr
  }
  // In a chain, the WRs before the refused one are posted and bad_wr names it.
  Buffer rb(4096);
  ASSERT_TRUE(rb.reg(b->pd, IBV_ACCESS_LOCAL_WRITE));
  ASSERT_EQ(post_recv(b->qp, 9, {rb.sge(0, 64)}), 0);
  SendWr ok(1, IBV_WR_SEND, {mem.sge(0, 8)}), imm(2, IBV_WR_SEND_WITH_IMM, {mem.sge(0, 8)});
  ibv_send_wr* first = ok.get();
  first->next = imm.get();
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(e.qp, first, &bad), EINVAL);
  EXPECT_EQ(bad, &imm.wr);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(e.cq, &wc)) << "the SEND before it was posted";
  EXPECT_EQ(wc.wr_id, 1u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(poll_wc(b->cq, &wc));
  expect_wc(wc, {.wr_id = 9, .opcode = IBV_WC_RECV, .byte_len = 8, .qp_num = b->qp->qp_num});
  // The same through the ibv_wr_* API: the batch fails at ibv_wr_complete.
  ibv_qp_ex* x = ibv_qp_to_qp_ex(e.qp);
  ibv_wr_start(x);
  x->wr_id = 3;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send_imm(x, htonl(5));
  ibv_wr_set_sge(x, mem.lkey(), mem.addr(), 8);
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);
  ibv_wr_start(x);
  ibv_wr_atomic_fetch_add(x, mem.rkey(), mem.addr(1024), 1);
  ibv_wr_set_sge(x, mem.lkey(), mem.addr(), 8);
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);
}

// RESET releases a direct-path QP's connection (the peer reads EOF); INIT then attaches it again.
TEST_F(IwarpVerbsPair, ResetReleasesTheConnection) {
  const char* direct_env = getenv("SOFTRDMA_DIRECT");
  if (direct_env && std::string(direct_env) == "0")
    GTEST_SKIP() << "SOFTRDMA_DIRECT=0: the direct path is off (TcpPathSendWriteRead covers the TCP path)";
  ASSERT_EQ(attach(true), 0);
  close(fds[0]);
  fds[0] = -1;
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(a->qp, &r, IBV_QP_STATE), 0);
  pollfd pf{fds[1], POLLIN, 0};
  ASSERT_EQ(poll(&pf, 1, kWaitSeconds * 1000), 1);
  char byte;
  EXPECT_EQ(recv(fds[1], &byte, 1, MSG_DONTWAIT), 0) << "EOF once the QP is reset";
  close(fds[1]);
  fds[1] = -1;
  r.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(b->qp, &r, IBV_QP_STATE), 0);
  ASSERT_EQ(a->init(), 0);
  ASSERT_EQ(b->init(), 0);
  ASSERT_TRUE(tcp_pair(fds));
  ASSERT_EQ(attach(true), 0) << "attached again";
  ASSERT_NO_FATAL_FAILURE(traffic());
}

}  // namespace
}  // namespace softrdma::verbs_test
