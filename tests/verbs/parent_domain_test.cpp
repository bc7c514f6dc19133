// Thread domains and parent domains (ibv_alloc_td(3), ibv_alloc_parent_domain(3)): a parent domain is
// usable wherever its PD is, with that PD's protection; with allocators, the provider takes the memory
// of the objects created in it from alloc() and gives it back through free().
#include "helpers.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace softrdma::verbs_test {
namespace {

// What the allocator callbacks saw, through pd_context.
struct AllocLog {
  enum class Mode { Real, UseDefault, Fail } mode = Mode::Real;
  ibv_pd* expect_pd = nullptr;
  struct Block {
    void* p;
    size_t size, alignment;
    uint64_t type;
  };
  std::vector<Block> live;
  int allocs = 0, frees = 0, bad_args = 0;
};

void* log_alloc(ibv_pd* pd, void* ctx, size_t size, size_t alignment, uint64_t type) {
  auto* log = static_cast<AllocLog*>(ctx);
  ++log->allocs;
  if (pd != log->expect_pd || size == 0 || alignment == 0 || (alignment & (alignment - 1))) ++log->bad_args;
  if (log->mode == AllocLog::Mode::UseDefault) return IBV_ALLOCATOR_USE_DEFAULT;
  if (log->mode == AllocLog::Mode::Fail) return nullptr;
  void* p = nullptr;
  if (posix_memalign(&p, alignment < sizeof(void*) ? sizeof(void*) : alignment, size)) return nullptr;
  std::memset(p, 0, size);  // the callback's duty (ibv_alloc_parent_domain(3))
  log->live.push_back({p, size, alignment, type});
  return p;
}

void log_free(ibv_pd* pd, void* ctx, void* p, uint64_t type) {
  auto* log = static_cast<AllocLog*>(ctx);
  ++log->frees;
  if (pd != log->expect_pd) ++log->bad_args;
  for (size_t i = 0; i < log->live.size(); ++i) {
    if (log->live[i].p != p) continue;
    if (log->live[i].type != type) ++log->bad_args;
    log->live.erase(log->live.begin() + static_cast<long>(i));
    std::free(p);
    return;
  }
  ++log->bad_args;  // freed what it never gave
}

class ParentDomain : public ::testing::Test {
 protected:
  Device dev;
  ibv_pd* pd = nullptr;
  void SetUp() override {
    ASSERT_TRUE(dev.ok()) << "no loopback device";
    pd = ibv_alloc_pd(dev.ctx);
    ASSERT_NE(pd, nullptr);
  }
  void TearDown() override {
    if (pd) {
      EXPECT_EQ(ibv_dealloc_pd(pd), 0);
    }
  }
  ibv_pd* make_parent(AllocLog* log, ibv_td* td = nullptr) {
    ibv_parent_domain_init_attr a{};
    a.pd = pd;
    a.td = td;
    if (log) {
      a.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
      a.alloc = log_alloc;
      a.free = log_free;
      a.pd_context = log;
    }
    ibv_pd* p = ibv_alloc_parent_domain(dev.ctx, &a);
    if (log) log->expect_pd = p;
    return p;
  }
  ibv_cq_ex* make_cq_ex(ibv_pd* parent, int cqe = 64) {
    ibv_cq_init_attr_ex ca{};
    ca.cqe = static_cast<uint32_t>(cqe);
    ca.wc_flags = IBV_WC_STANDARD_FLAGS;
    ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
    ca.parent_domain = parent;
    return ibv_create_cq_ex(dev.ctx, &ca);
  }
  ibv_qp* make_qp(ibv_pd* in, ibv_cq* cq, ibv_srq* srq = nullptr, ibv_qp_type type = IBV_QPT_RC) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.srq = srq;
    ia.cap = {16, srq ? 0u : 16u, 1, 1, 0};
    ia.qp_type = type;
    return ibv_create_qp(in, &ia);
  }
};

TEST_F(ParentDomain, ThreadDomainIsHeldByItsParentDomain) {
  ibv_td_init_attr bad{1};
  errno = 0;
  EXPECT_EQ(ibv_alloc_td(dev.ctx, &bad), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_td_init_attr ta{};
  ibv_td* td = ibv_alloc_td(dev.ctx, &ta);
  ASSERT_NE(td, nullptr);
  EXPECT_EQ(td->context, dev.ctx);
  ibv_pd* parent = make_parent(nullptr, td);
  ASSERT_NE(parent, nullptr);
  EXPECT_EQ(ibv_dealloc_td(td), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);  // the parent domain holds its PD too
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
  EXPECT_EQ(ibv_dealloc_td(td), 0);
}

TEST_F(ParentDomain, BadAttributesAreRefused) {
  ibv_parent_domain_init_attr a{};
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(dev.ctx, &a), nullptr);  // no PD
  EXPECT_EQ(errno, EINVAL);
  a.pd = pd;
  a.comp_mask = 1u << 7;
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(dev.ctx, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;  // without the callbacks
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(dev.ctx, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a.comp_mask = 0;
  ibv_pd* parent = ibv_alloc_parent_domain(dev.ctx, &a);
  ASSERT_NE(parent, nullptr);
  a.pd = parent;  // a parent domain extends a PD, not another parent domain
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(dev.ctx, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // ibv_create_cq_ex's IBV_CQ_INIT_ATTR_MASK_PD wants a parent domain, not a plain PD.
  errno = 0;
  EXPECT_EQ(make_cq_ex(pd), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(make_cq_ex(nullptr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
}

// QPs, SRQs and CQs made in a parent domain with allocators take memory from alloc() (how much and for
// what is the provider's: softrdma places the objects themselves and a QP's send queue there), and
// every block goes back through free(), with its resource type, by the time they are destroyed.
TEST_F(ParentDomain, AllocatorsAreCalledAndEverythingIsFreed) {
  AllocLog log;
  ibv_pd* parent = make_parent(&log);
  ASSERT_NE(parent, nullptr);
  ibv_cq_ex* cqx = make_cq_ex(parent);
  ASSERT_NE(cqx, nullptr);
  ibv_cq* cq = ibv_cq_ex_to_cq(cqx);
  const int after_cq = log.allocs;
  EXPECT_GE(after_cq, 1);
  ibv_srq_init_attr sa{};
  sa.attr = {32, 1, 0};
  ibv_srq* srq = ibv_create_srq(parent, &sa);
  ASSERT_NE(srq, nullptr);
  const int after_srq = log.allocs;
  EXPECT_GT(after_srq, after_cq);
  ibv_qp* qp = make_qp(parent, cq, srq);
  ASSERT_NE(qp, nullptr);
  EXPECT_GT(log.allocs, after_srq);
  EXPECT_EQ(qp->pd, parent);
  EXPECT_EQ(srq->pd, parent);
  EXPECT_EQ(log.bad_args, 0);
  EXPECT_EQ(log.live.size(), size_t(log.allocs));
  for (const AllocLog::Block& b : log.live) EXPECT_EQ(reinterpret_cast<uintptr_t>(b.p) % b.alignment, 0u);
  // In use: neither the parent domain nor its PD can go.
  EXPECT_EQ(ibv_dealloc_pd(parent), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_dealloc_pd(parent), EBUSY);  // the CQ still names it
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(log.frees, log.allocs);
  EXPECT_TRUE(log.live.empty());
  EXPECT_EQ(log.bad_args, 0);
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
}

TEST_F(ParentDomain, UseDefaultMeansTheProvidersOwnMemory) {
  AllocLog log;
  log.mode = AllocLog::Mode::UseDefault;
  ibv_pd* parent = make_parent(&log);
  ASSERT_NE(parent, nullptr);
  ibv_cq_ex* cqx = make_cq_ex(parent);
  ASSERT_NE(cqx, nullptr);
  ibv_qp* qp = make_qp(parent, ibv_cq_ex_to_cq(cqx), nullptr, IBV_QPT_UD);
  ASSERT_NE(qp, nullptr);
  EXPECT_GE(log.allocs, 2);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), 0);
  EXPECT_EQ(log.frees, 0);  // free() is for what alloc() gave, and it gave nothing
  EXPECT_EQ(log.bad_args, 0);
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
}

TEST_F(ParentDomain, FailingAllocatorFailsTheCreation) {
  AllocLog log;
  log.mode = AllocLog::Mode::Fail;
  ibv_pd* parent = make_parent(&log);
  ASSERT_NE(parent, nullptr);
  errno = 0;
  EXPECT_EQ(make_cq_ex(parent), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);  // a CQ outside the parent domain
  ASSERT_NE(cq, nullptr);
  errno = 0;
  EXPECT_EQ(make_qp(parent, cq), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  ibv_srq_init_attr sa{};
  sa.attr = {32, 1, 0};
  errno = 0;
  EXPECT_EQ(ibv_create_srq(parent, &sa), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_GE(log.allocs, 3);
  EXPECT_EQ(log.frees, 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);  // nothing was left holding it
}

// RC traffic between QPs of two parent domains over one PD: memory registered in the PD serves the
// QPs of its parent domains (and back), memory of another PD does not.
TEST_F(ParentDomain, TrafficHasThePdsProtection) {
  AllocLog log_a, log_b;
  ibv_pd* pa = make_parent(&log_a);
  ibv_pd* pb = make_parent(&log_b);
  ASSERT_TRUE(pa && pb);
  ibv_cq_ex* cqa = make_cq_ex(pa);
  ibv_cq_ex* cqb = make_cq_ex(pb);
  ASSERT_TRUE(cqa && cqb);
  ibv_qp* qa = make_qp(pa, ibv_cq_ex_to_cq(cqa));
  ibv_qp* qb = make_qp(pb, ibv_cq_ex_to_cq(cqb));
  ASSERT_TRUE(qa && qb);
  ConnConfig conn;
  const uint32_t psn_a = random_psn(), psn_b = random_psn();
  ASSERT_EQ(bring_up(qa, psn_a, qb->qp_num, psn_b, dev.gid, conn, dev.attr), 0);
  ASSERT_EQ(bring_up(qb, psn_b, qa->qp_num, psn_a, dev.gid, conn, dev.attr), 0);

  Buffer src(4096), dst(4096), other(4096);
  ASSERT_TRUE(src.reg(pa, kAllAccess));  // in a parent domain
  ASSERT_TRUE(dst.reg(pd, kAllAccess));  // in the PD itself
  ibv_pd* pd2 = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd2, nullptr);
  ASSERT_TRUE(other.reg(pd2, kAllAccess));
  fill_pattern(src.data, 4096, 91);

  // A WRITE and a SEND from a's parent domain into the PD's memory, received by b's QP.
  ASSERT_EQ(post_recv(qb, 1, {dst.sge(2048, 2048)}), 0);
  SendWr w(2, IBV_WR_RDMA_WRITE, {src.sge(0, 2048)});
  w.rdma(dst.addr(0), dst.rkey());
  ASSERT_EQ(post_send(qa, w), 0);
  SendWr s(3, IBV_WR_SEND, {src.sge(2048, 2048)});
  ASSERT_EQ(post_send(qa, s), 0);
  auto wcs = poll_wcs(ibv_cq_ex_to_cq(cqa), 2);
  ASSERT_EQ(wcs.size(), 2u);
  expect_wc(wcs[0], {.wr_id = 2, .opcode = IBV_WC_RDMA_WRITE, .qp_num = qa->qp_num});
  expect_wc(wcs[1], {.wr_id = 3, .opcode = IBV_WC_SEND, .qp_num = qa->qp_num});
  auto rwcs = poll_wcs(ibv_cq_ex_to_cq(cqb), 1);
  ASSERT_EQ(rwcs.size(), 1u);
  expect_wc(rwcs[0], {.wr_id = 1, .opcode = IBV_WC_RECV, .byte_len = 2048, .qp_num = qb->qp_num});
  EXPECT_EQ(check_pattern(dst.data, 4096, 91), 4096u);

  // Memory of another PD: the responder refuses its R_Key.
  SendWr bad(4, IBV_WR_RDMA_WRITE, {src.sge(0, 64)});
  bad.rdma(other.addr(0), other.rkey());
  ASSERT_EQ(post_send(qa, bad), 0);
  wcs = poll_wcs(ibv_cq_ex_to_cq(cqa), 1);
  ASSERT_EQ(wcs.size(), 1u);
  expect_wc(wcs[0], {.wr_id = 4, .status = IBV_WC_REM_ACCESS_ERR, .qp_num = qa->qp_num});

  EXPECT_EQ(ibv_destroy_qp(qa), 0);
  EXPECT_EQ(ibv_destroy_qp(qb), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cqa)), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cqb)), 0);
  EXPECT_EQ(ibv_dereg_mr(src.mr), 0);
  src.mr = nullptr;
  EXPECT_EQ(ibv_dereg_mr(dst.mr), 0);
  dst.mr = nullptr;
  EXPECT_EQ(ibv_dereg_mr(other.mr), 0);
  other.mr = nullptr;
  EXPECT_EQ(ibv_dealloc_pd(pd2), 0);
  EXPECT_EQ(ibv_dealloc_pd(pa), 0);
  EXPECT_EQ(ibv_dealloc_pd(pb), 0);
  EXPECT_TRUE(log_a.live.empty());
  EXPECT_TRUE(log_b.live.empty());
  EXPECT_EQ(log_a.bad_args + log_b.bad_args, 0);
}

}  // namespace
}  // namespace softrdma::verbs_test
