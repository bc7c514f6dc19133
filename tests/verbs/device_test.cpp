// Device, port, GID, MR key and CQ queries and limits; CQ overflow.
#include "helpers.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

namespace softrdma::verbs_test {
namespace {

// An int, not the enum: ibv_reg_mr's macro masks it with another enum type, which C++20 compilers
// warn about for two enum operands.
constexpr int kLocalWriteOnly = IBV_ACCESS_LOCAL_WRITE;

using DeviceQuery = RcPair;

TEST_F(DeviceQuery, DeviceListAndName) {
  int n = -1;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_TRUE(list);
  EXPECT_GE(n, 1);
  EXPECT_EQ(list[n], nullptr) << "the list is NULL-terminated";
  for (int i = 0; i < n; ++i) {
    const char* name = ibv_get_device_name(list[i]);
    ASSERT_TRUE(name);
    EXPECT_GT(std::strlen(name), 0u);
  }
  ibv_free_device_list(list);
  EXPECT_TRUE(ibv_get_device_name(dev.ctx->device));
}

TEST_F(DeviceQuery, DeviceLimitsSane) {
  const ibv_device_attr& d = dev.attr;
  EXPECT_GE(d.phys_port_cnt, 1);
  EXPECT_GE(d.max_qp, 2);
  EXPECT_GE(d.max_qp_wr, 128);
  EXPECT_GE(d.max_sge, 4);
  EXPECT_GE(d.max_cq, 2);
  EXPECT_GE(d.max_cqe, 256);
  EXPECT_GE(d.max_mr, 1);
  EXPECT_GE(d.max_pd, 1);
  EXPECT_GE(d.max_mr_size, uint64_t{1} << 30);
  EXPECT_GE(d.max_qp_rd_atom, 1);
  EXPECT_GE(d.max_qp_init_rd_atom, 1);
  EXPECT_NE(d.page_size_cap, 0u);
  EXPECT_GE(d.max_pkeys, 1);
  // ibv_query_device_ex agrees with ibv_query_device.
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(dev.ctx, nullptr, &ex), 0);
  EXPECT_EQ(ex.orig_attr.max_qp_wr, d.max_qp_wr);
  EXPECT_EQ(ex.orig_attr.max_sge, d.max_sge);
  EXPECT_EQ(ex.orig_attr.max_cqe, d.max_cqe);
  EXPECT_EQ(ex.orig_attr.max_mr_size, d.max_mr_size);
}

// max_pd, max_cq and max_mr are limits of one context (as on hardware with a small device): the
// device reports them, lets exactly that many be created, and refuses one more with an error.
TEST_F(DeviceQuery, PdCqAndMrCountsEnforcedAtTheReportedLimit) {
  ibv_context* ctx = ibv_open_device(dev.ctx->device);
  ASSERT_TRUE(ctx);
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(ctx, &attr), 0);
  if (attr.max_pd > 100000 || attr.max_cq > 100000 || attr.max_mr > 100000)
    GTEST_SKIP() << "limits too large to exhaust in a test";
  std::vector<ibv_pd*> pds;
  for (int i = 0; i < attr.max_pd; ++i) {
    ibv_pd* pd = ibv_alloc_pd(ctx);
    ASSERT_TRUE(pd) << "PD " << i << " of max_pd " << attr.max_pd;
    pds.push_back(pd);
  }
  EXPECT_EQ(ibv_alloc_pd(ctx), nullptr) << "one PD beyond max_pd";
  std::vector<ibv_cq*> cqs;
  for (int i = 0; i < attr.max_cq; ++i) {
    ibv_cq* cq = ibv_create_cq(ctx, 1, nullptr, nullptr, 0);
    ASSERT_TRUE(cq) << "CQ " << i << " of max_cq " << attr.max_cq;
    cqs.push_back(cq);
  }
  EXPECT_EQ(ibv_create_cq(ctx, 1, nullptr, nullptr, 0), nullptr) << "one CQ beyond max_cq";
  std::vector<char> page(4096);
  std::vector<ibv_mr*> mrs;
  for (int i = 0; i < attr.max_mr; ++i) {
    ibv_mr* mr = ibv_reg_mr(pds[0], page.data(), page.size(), kLocalWriteOnly);
    ASSERT_TRUE(mr) << "MR " << i << " of max_mr " << attr.max_mr;
    mrs.push_back(mr);
  }
  EXPECT_EQ(ibv_reg_mr(pds[0], page.data(), page.size(), kLocalWriteOnly), nullptr)
      << "one MR beyond max_mr";
  // Freeing one makes room for one.
  ASSERT_EQ(ibv_dereg_mr(mrs.back()), 0);
  mrs.pop_back();
  ibv_mr* again = ibv_reg_mr(pds[0], page.data(), page.size(), kLocalWriteOnly);
  EXPECT_TRUE(again);
  if (again) mrs.push_back(again);
  EXPECT_EQ(ibv_dealloc_pd(pds[0]), EBUSY) << "a PD with MRs in it cannot be deallocated";
  for (ibv_mr* mr : mrs) EXPECT_EQ(ibv_dereg_mr(mr), 0);
  for (ibv_cq* cq : cqs) EXPECT_EQ(ibv_destroy_cq(cq), 0);
  for (ibv_pd* pd : pds) EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

TEST_F(DeviceQuery, PortActiveEthernet) {
  const ibv_port_attr& p = dev.port;
  EXPECT_EQ(p.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(p.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_GE(p.gid_tbl_len, 1);
  EXPECT_GE(p.pkey_tbl_len, 1u);
  EXPECT_GE(p.active_mtu, IBV_MTU_256);
  EXPECT_LE(p.active_mtu, IBV_MTU_4096);
  EXPECT_GE(p.max_mtu, p.active_mtu);
  // The large-message tests need 65 MiB (RoCE NICs report 1 GiB or 2 GiB).
  EXPECT_GE(p.max_msg_sz, 65u << 20);
  ibv_port_attr none{};
  EXPECT_NE(ibv_query_port(dev.ctx, dev.attr.phys_port_cnt + 1, &none), 0) << "port past phys_port_cnt";
  uint16_t pkey = 0;
  ASSERT_EQ(ibv_query_pkey(dev.ctx, kPort, 0, &pkey), 0);
  EXPECT_EQ(ntohs(pkey), 0xffff) << "default P_Key";
}

TEST_F(DeviceQuery, GidZeroIsLoopbackRoceV2) {
  EXPECT_TRUE(gid_equal(dev.gid, loopback_gid())) << gid_str(dev.gid);
  ibv_gid_entry e{};
  ASSERT_EQ(ibv_query_gid_ex(dev.ctx, kPort, 0, &e, 0), 0);
  EXPECT_TRUE(gid_equal(e.gid, loopback_gid())) << gid_str(e.gid);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(e.port_num, kPort);
  EXPECT_EQ(e.gid_index, 0u);
  ibv_gid past{};
  EXPECT_NE(ibv_query_gid(dev.ctx, kPort, dev.port.gid_tbl_len, &past), 0) << "index past gid_tbl_len";
}

TEST_F(DeviceQuery, CqAboveMaxCqeFails) {
  ibv_cq* cq = ibv_create_cq(dev.ctx, dev.attr.max_cqe + 1, nullptr, nullptr, 0);
  EXPECT_EQ(cq, nullptr);
  if (cq) ibv_destroy_cq(cq);
  cq = ibv_create_cq(dev.ctx, 1, nullptr, nullptr, 0);
  ASSERT_TRUE(cq);
  EXPECT_GE(cq->cqe, 1);
  ibv_destroy_cq(cq);
}

TEST_F(DeviceQuery, MrLimitsAndAccessRules) {
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_TRUE(pd);
  Buffer b(4096);
  if (dev.attr.max_mr_size < UINT64_MAX) {
    ibv_mr* mr = ibv_reg_mr(pd, b.data, dev.attr.max_mr_size + 1, kLocalWriteOnly);
    EXPECT_EQ(mr, nullptr) << "MR beyond max_mr_size";
    if (mr) ibv_dereg_mr(mr);
  }
  // Remote write/atomic access requires local write (ibv_reg_mr(3)).
  for (int acc : {int(IBV_ACCESS_REMOTE_WRITE), int(IBV_ACCESS_REMOTE_ATOMIC)}) {
    errno = 0;
    ibv_mr* mr = ibv_reg_mr(pd, b.data, 4096, acc);
    EXPECT_EQ(mr, nullptr) << "access " << acc << " without LOCAL_WRITE";
    EXPECT_EQ(errno, EINVAL);
    if (mr) ibv_dereg_mr(mr);
  }
  ibv_mr* mr = ibv_reg_mr(pd, b.data, 4096, kAllAccess);
  ASSERT_TRUE(mr);
  EXPECT_EQ(mr->addr, b.data);
  EXPECT_EQ(mr->length, 4096u);
  EXPECT_EQ(mr->pd, pd);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// Keys are distinct; and (a softrdma property, not a verbs guarantee) not a plain counter.
TEST_F(DeviceQuery, MrKeysDistinctAndNotSequential) {
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_TRUE(pd);
  Buffer b(64 * 1024);
  std::vector<ibv_mr*> mrs;
  std::set<uint32_t> lkeys, rkeys;
  for (int i = 0; i < 16; ++i) {
    // Also the same range twice: still distinct keys.
    ibv_mr* mr = ibv_reg_mr(pd, b.data + (i % 8) * 4096, 4096, kAllAccess);
    ASSERT_TRUE(mr) << i;
    mrs.push_back(mr);
    lkeys.insert(mr->lkey);
    rkeys.insert(mr->rkey);
  }
  EXPECT_EQ(lkeys.size(), 16u);
  EXPECT_EQ(rkeys.size(), 16u);
  std::set<int64_t> steps;
  for (size_t i = 1; i < mrs.size(); ++i) steps.insert(int64_t(mrs[i]->rkey) - int64_t(mrs[i - 1]->rkey));
  EXPECT_GT(steps.size(), 1u) << "rkeys advance by a constant step: guessable";
  for (ibv_mr* mr : mrs) EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// More completions than the CQ holds: IBV_EVENT_CQ_ERR and the QP goes to ERR.
TEST_F(DeviceQuery, CqOverflowRaisesCqErr) {
  qcfg.send_cqe = 4;
  qcfg.max_send_wr = 64;
  ASSERT_TRUE(connect());
  const int cqe = a.scq->cqe;
  ASSERT_GE(cqe, 4);
  if (static_cast<uint32_t>(cqe + 4) > a.cap.max_send_wr) GTEST_SKIP() << "CQ rounded up to " << cqe;
  VT_BUF(src, a, 64);
  VT_BUF(dst, b, 64);
  for (int i = 0; i < cqe + 4; ++i) {
    SendWr w(i, IBV_WR_RDMA_WRITE, {src->sge(0, 8)});
    w.rdma(dst->addr(), dst->rkey());
    ASSERT_EQ(post_send(a.qp, w), 0) << i;
  }
  bool got_cq_err = false;
  pollfd p{dev.ctx->async_fd, POLLIN, 0};
  while (!got_cq_err) {
    ASSERT_EQ(poll(&p, 1, kWaitSeconds * 1000), 1) << "no async event within " << kWaitSeconds << " s";
    ibv_async_event ev{};
    ASSERT_EQ(ibv_get_async_event(dev.ctx, &ev), 0);
    if (ev.event_type == IBV_EVENT_CQ_ERR) {
      EXPECT_EQ(ev.element.cq, a.scq);
      got_cq_err = true;
    }
    ibv_ack_async_event(&ev);
  }
  EXPECT_TRUE(wait_qp_state(a.qp, IBV_QPS_ERR));
}

}  // namespace
}  // namespace softrdma::verbs_test
