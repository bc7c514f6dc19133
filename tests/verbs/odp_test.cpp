// On-demand paging (IBV_ACCESS_ON_DEMAND): regions whose pages are neither pinned nor required to be
// mapped at registration, explicit (a range) and implicit (ibv_reg_mr(pd, NULL, SIZE_MAX): the whole
// address space), and ibv_advise_mr. Accesses fault pages in; an access to memory that is not mapped,
// or not writable for a write, completes in error (IBTA 10.6: an access violation) and never faults
// the process. Only the public verbs API is used.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "two_process.h"

namespace softrdma::verbs_test {
namespace {

constexpr int kOdp = IBV_ACCESS_ON_DEMAND;
constexpr size_t kPage = 4096;

// Resident pages of [p, p+len) (mincore), or -1 on error.
long resident_pages(const void* p, size_t len) {
  unsigned char vec[256];
  size_t n = (len + kPage - 1) / kPage;
  if (n > sizeof vec || mincore(const_cast<void*>(p), len, vec) != 0) return -1;
  long r = 0;
  for (size_t i = 0; i < n; ++i) r += vec[i] & 1;
  return r;
}

// An address range with nothing mapped: reserved, then unmapped again.
uint64_t unmapped_hole(size_t len) {
  void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 0;
  munmap(p, len);
  return reinterpret_cast<uint64_t>(p);
}

bool odp_caps(ibv_context* ctx, ibv_device_attr_ex* ax) {
  *ax = {};
  return ibv_query_device_ex(ctx, nullptr, ax) == 0 && (ax->odp_caps.general_caps & IBV_ODP_SUPPORT);
}

// An implicit ODP region of the PD (the whole address space); nullptr + a gtest failure on error.
ibv_mr* implicit_mr(ibv_pd* pd, int access) {
  ibv_mr* mr = ibv_reg_mr(pd, nullptr, SIZE_MAX, access | kOdp);
  EXPECT_NE(mr, nullptr) << "implicit ODP registration: " << strerror(errno);
  return mr;
}

TEST(OdpCaps, QueryDeviceExReportsThem) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_device_attr_ex ax{};
  ASSERT_TRUE(odp_caps(dev.ctx, &ax)) << "no IBV_ODP_SUPPORT";
  EXPECT_TRUE(ax.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT);
  const uint32_t rc = ax.odp_caps.per_transport_caps.rc_odp_caps;
  for (uint32_t bit : {IBV_ODP_SUPPORT_SEND, IBV_ODP_SUPPORT_RECV, IBV_ODP_SUPPORT_WRITE, IBV_ODP_SUPPORT_READ,
                       IBV_ODP_SUPPORT_ATOMIC, IBV_ODP_SUPPORT_SRQ_RECV})
    EXPECT_TRUE(rc & bit) << "rc bit " << bit;
  EXPECT_TRUE(ax.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND);
  EXPECT_TRUE(ax.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_RECV);
  EXPECT_TRUE(ax.odp_caps.per_transport_caps.uc_odp_caps & IBV_ODP_SUPPORT_WRITE);
}

class OdpBase : public RcPair {
 protected:
  bool extended = false;  // QPs from ibv_create_qp_ex, for the ibv_wr_* API
  void SetUp() override {
    RcPair::SetUp();
    ibv_device_attr_ex ax{};
    if (!odp_caps(dev.ctx, &ax)) GTEST_SKIP() << "the device has no on-demand paging";
    qcfg.extended = extended;
    ASSERT_TRUE(connect());
  }
  // Untouched anonymous memory registered on side s with ODP.
  std::unique_ptr<Buffer> odp_buf(Side& s, size_t len, int access = kAllAccess) {
    auto b = std::make_unique<Buffer>(len);
    EXPECT_TRUE(b->data);
    if (b->data) {
      EXPECT_TRUE(b->reg(s.pd, access | kOdp)) << strerror(errno);
    }
    return b;
  }
  // Posts one signaled WR on a and returns its completion.
  ibv_wc run(SendWr w) {
    ibv_wc wc{};
    EXPECT_EQ(post_send(a.qp, w), 0);
    EXPECT_TRUE(poll_wc(a.scq, &wc));
    return wc;
  }
};
// RC over the direct path and packets; iWARP has no on-demand paging (ibv_reg_mr with
// IBV_ACCESS_ON_DEMAND fails with EOPNOTSUPP there, as on siw).
using Odp = OverPaths<OdpBase>;

TEST_P(Odp, RegistrationNeitherFaultsNorPins) {
  auto m = odp_buf(b, 16 * kPage);
  ASSERT_TRUE(m->mr);
  EXPECT_EQ(resident_pages(m->data, 16 * kPage), 0) << "ODP registration faulted pages in";
  // Memory not mapped at all may be registered too; an ordinary region may not.
  const uint64_t hole = unmapped_hole(4 * kPage);
  ASSERT_NE(hole, 0u);
  ibv_mr* mr = ibv_reg_mr(b.pd, reinterpret_cast<void*>(hole), 4 * kPage, kAllAccess | kOdp);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_reg_mr(b.pd, reinterpret_cast<void*>(hole), 4 * kPage, kAllAccess), nullptr);
  // Mapped afterwards, it is written through the region registered before.
  void* p = mmap(reinterpret_cast<void*>(hole), 4 * kPage, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != reinterpret_cast<void*>(hole)) {
    ibv_dereg_mr(mr);
    if (p != MAP_FAILED) munmap(p, 4 * kPage);
    GTEST_SKIP() << "could not map the hole again";
  }
  VT_BUF(src, a, 4 * kPage);
  fill_pattern(src->data, 4 * kPage, 5);
  ibv_wc wc = run(SendWr(1, IBV_WR_RDMA_WRITE, {src->sge(0, 4 * kPage)}).rdma(hole, mr->rkey));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(check_pattern(p, 4 * kPage, 5), 4 * kPage);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  munmap(p, 4 * kPage);
}

TEST_P(Odp, ExplicitSendRecv) {
  constexpr uint32_t kLen = 5000;  // several packets at MTU 1024
  auto src = odp_buf(a, 8192);
  auto dst = odp_buf(b, 8192);
  ASSERT_TRUE(src->mr && dst->mr);
  for (uint32_t i = 0; i < 3; ++i) {
    fill_pattern(src->data + i, kLen, 20 + i);
    ASSERT_EQ(post_recv(b.qp, 100 + i, {dst->sge(i, kLen + 10)}), 0);
    ibv_wc wc = run(SendWr(i, IBV_WR_SEND, {src->sge(i, kLen)}));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    ibv_wc rwc{};
    ASSERT_TRUE(poll_wc(b.rcq, &rwc));
    expect_wc(rwc, {.wr_id = 100 + i, .opcode = IBV_WC_RECV, .byte_len = kLen});
    EXPECT_EQ(check_pattern(dst->data + i, kLen, 20 + i), kLen);
  }
}

TEST_P(Odp, ExplicitWriteAndRead) {
  constexpr uint32_t kLen = 3 * 4096 + 100;
  auto local = odp_buf(a, 4 * kLen);
  auto remote = odp_buf(b, 4 * kLen);
  ASSERT_TRUE(local->mr && remote->mr);
  fill_pattern(local->data, kLen, 31);
  ibv_wc wc = run(SendWr(1, IBV_WR_RDMA_WRITE, {local->sge(0, kLen)}).rdma(remote->addr(7), remote->rkey()));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(check_pattern(remote->data + 7, kLen, 31), kLen);
  fill_pattern(remote->data + 2 * kLen, kLen, 32);
  wc = run(SendWr(2, IBV_WR_RDMA_READ, {local->sge(kLen, kLen)}).rdma(remote->addr(2 * kLen), remote->rkey()));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(check_pattern(local->data + kLen, kLen, 32), kLen);
}

TEST_P(Odp, ExplicitAtomics) {
  if (!atomics_supported()) GTEST_SKIP() << "no atomics";
  auto local = odp_buf(a, kPage);
  auto remote = odp_buf(b, kPage);
  ASSERT_TRUE(local->mr && remote->mr);
  // Untouched target page: the atomic faults it in and finds zero.
  ibv_wc wc = run(SendWr(1, IBV_WR_ATOMIC_FETCH_AND_ADD, {local->sge(0, 8)}).fetch_add(remote->addr(64), remote->rkey(), 5));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(local->u64(0), 0u);
  EXPECT_EQ(remote->u64(64), 5u);
  wc = run(SendWr(2, IBV_WR_ATOMIC_CMP_AND_SWP, {local->sge(8, 8)}).cmp_swp(remote->addr(64), remote->rkey(), 5, 77));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(local->u64(8), 5u);
  EXPECT_EQ(remote->u64(64), 77u);
}

TEST_P(Odp, ImplicitReachesMemoryMappedAfterRegistration) {
  ibv_mr* src_mr = implicit_mr(a.pd, kAllAccess);
  ibv_mr* dst_mr = implicit_mr(b.pd, kAllAccess);
  ASSERT_TRUE(src_mr && dst_mr);
  EXPECT_EQ(dst_mr->addr, nullptr);
  EXPECT_EQ(dst_mr->length, SIZE_MAX);
  // Both buffers come into existence after the registrations.
  Buffer src(2 * kPage), dst(4 * kPage);
  ASSERT_TRUE(src.data && dst.data);
  fill_pattern(src.data, 2 * kPage, 41);
  ibv_wc wc = run(SendWr(1, IBV_WR_RDMA_WRITE, {ibv_sge{src.addr(), 2 * kPage, src_mr->lkey}})
                      .rdma(dst.addr(100), dst_mr->rkey));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(check_pattern(dst.data + 100, 2 * kPage, 41), 2 * kPage);
  // SEND from and into implicit regions.
  ASSERT_EQ(post_recv(b.qp, 9, {ibv_sge{dst.addr(3 * kPage), 1000, dst_mr->lkey}}), 0);
  wc = run(SendWr(2, IBV_WR_SEND, {ibv_sge{src.addr(5), 1000, src_mr->lkey}}));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  ibv_wc rwc{};
  ASSERT_TRUE(poll_wc(b.rcq, &rwc));
  expect_wc(rwc, {.wr_id = 9, .opcode = IBV_WC_RECV, .byte_len = 1000});
  EXPECT_EQ(check_pattern(dst.data + 3 * kPage, 1000, 41, 5), 1000u);
  EXPECT_EQ(ibv_dereg_mr(src_mr), 0);
  EXPECT_EQ(ibv_dereg_mr(dst_mr), 0);
}

TEST_P(Odp, ImplicitWriteToUnmappedAddressIsRemoteAccessError) {
  ibv_mr* dst_mr = implicit_mr(b.pd, kAllAccess);
  ASSERT_NE(dst_mr, nullptr);
  VT_BUF(src, a, kPage);
  const uint64_t hole = unmapped_hole(4 * kPage);
  ASSERT_NE(hole, 0u);
  ibv_wc wc = run(SendWr(1, IBV_WR_RDMA_WRITE, {src->sge(0, 64)}).rdma(hole + 8, dst_mr->rkey));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(ibv_dereg_mr(dst_mr), 0);
}

TEST_P(Odp, ImplicitWriteToReadOnlyMemoryIsRemoteAccessError) {
  ibv_mr* dst_mr = implicit_mr(b.pd, kAllAccess);
  ASSERT_NE(dst_mr, nullptr);
  VT_BUF(src, a, kPage);
  void* ro = mmap(nullptr, kPage, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  // Reading it is fine...
  ibv_wc wc = run(SendWr(1, IBV_WR_RDMA_READ, {src->sge(0, 64)}).rdma(reinterpret_cast<uint64_t>(ro), dst_mr->rkey));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  // ...writing it is not.
  wc = run(SendWr(2, IBV_WR_RDMA_WRITE, {src->sge(0, 64)}).rdma(reinterpret_cast<uint64_t>(ro), dst_mr->rkey));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  munmap(ro, kPage);
  EXPECT_EQ(ibv_dereg_mr(dst_mr), 0);
}

TEST_P(Odp, ImplicitAtomicOnUnmappedAddressIsRemoteAccessError) {
  if (!atomics_supported()) GTEST_SKIP() << "no atomics";
  ibv_mr* dst_mr = implicit_mr(b.pd, kAllAccess);
  ASSERT_NE(dst_mr, nullptr);
  VT_BUF(res, a, kPage);
  const uint64_t hole = unmapped_hole(kPage);
  ASSERT_NE(hole, 0u);
  ibv_wc wc = run(SendWr(1, IBV_WR_ATOMIC_FETCH_AND_ADD, {res->sge(0, 8)}).fetch_add(hole, dst_mr->rkey, 1));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(ibv_dereg_mr(dst_mr), 0);
}

TEST_P(Odp, ImplicitSendFromUnmappedAddressIsLocalProtectionError) {
  ibv_mr* src_mr = implicit_mr(a.pd, kAllAccess);
  ASSERT_NE(src_mr, nullptr);
  const uint64_t hole = unmapped_hole(kPage);
  ASSERT_NE(hole, 0u);
  ibv_wc wc = run(SendWr(1, IBV_WR_SEND, {ibv_sge{hole, 100, src_mr->lkey}}));
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(ibv_dereg_mr(src_mr), 0);
}

TEST_P(Odp, ExplicitRegionStillChecksBoundsAndRights) {
  auto remote = odp_buf(b, kPage, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_TRUE(remote->mr);
  VT_BUF(src, a, kPage);
  ibv_wc wc = run(SendWr(1, IBV_WR_RDMA_WRITE, {src->sge(0, 64)}).rdma(remote->addr(), remote->rkey()));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << "no REMOTE_WRITE: " << ibv_wc_status_str(wc.status);
}

class OdpQpEx : public Odp {
 protected:
  OdpQpEx() { extended = true; }
};

TEST_P(OdpQpEx, WrApiOnImplicitAndExplicitRegions) {
  ibv_mr* imr = implicit_mr(b.pd, kAllAccess);
  ASSERT_NE(imr, nullptr);
  auto src = odp_buf(a, 2 * kPage);
  ASSERT_TRUE(src->mr);
  Buffer dst(2 * kPage);
  ASSERT_TRUE(dst.data);
  fill_pattern(src->data, 2 * kPage, 81);
  ibv_wr_start(a.qpx);
  a.qpx->wr_id = 1;
  a.qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(a.qpx, imr->rkey, dst.addr(0));
  ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(0), kPage);
  a.qpx->wr_id = 2;
  ibv_wr_rdma_read(a.qpx, imr->rkey, dst.addr(0));
  ibv_wr_set_sge(a.qpx, src->lkey(), src->addr(kPage), kPage);
  ASSERT_EQ(ibv_wr_complete(a.qpx), 0);
  std::vector<ibv_wc> wcs = poll_wcs(a.scq, 2);
  ASSERT_EQ(wcs.size(), 2u);
  for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(check_pattern(dst.data, kPage, 81), kPage);
  EXPECT_EQ(check_pattern(src->data + kPage, kPage, 81), kPage) << "read back what was written";
  EXPECT_EQ(ibv_dereg_mr(imr), 0);
}

VT_INSTANTIATE_PATHS(Odp, VT_ROCE_PATHS);
VT_INSTANTIATE_PATHS(OdpQpEx, VT_ROCE_PATHS);

// ibv_advise_mr(3).
class OdpAdvise : public ::testing::Test {
 protected:
  Device dev;
  ibv_pd* pd = nullptr;
  ibv_pd* other_pd = nullptr;
  void SetUp() override {
    ASSERT_TRUE(dev.ok());
    ibv_device_attr_ex ax{};
    if (!odp_caps(dev.ctx, &ax)) GTEST_SKIP() << "the device has no on-demand paging";
    pd = ibv_alloc_pd(dev.ctx);
    other_pd = ibv_alloc_pd(dev.ctx);
    ASSERT_TRUE(pd && other_pd);
  }
  void TearDown() override {
    if (other_pd) ibv_dealloc_pd(other_pd);
    if (pd) ibv_dealloc_pd(pd);
  }
  int advise(ibv_advise_mr_advice advice, uint32_t flags, std::vector<ibv_sge> sges) {
    return ibv_advise_mr(pd, advice, flags, sges.data(), static_cast<uint32_t>(sges.size()));
  }
};

TEST_F(OdpAdvise, PrefetchFaultsPagesIn) {
  {
    Buffer m(16 * kPage);
    ASSERT_TRUE(m.reg(pd, kAllAccess | kOdp));
    ASSERT_EQ(resident_pages(m.data, 16 * kPage), 0);
    EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, {m.sge(0, 4 * kPage)}), 0);
    EXPECT_EQ(resident_pages(m.data, 4 * kPage), 4);
    EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH, 0, {m.sge(8 * kPage, 10), m.sge(10 * kPage, 1)}), 0);
    EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, IBV_ADVISE_MR_FLAG_FLUSH, {m.sge(12 * kPage, kPage)}), 0);
    EXPECT_EQ(resident_pages(m.data + 12 * kPage, 4 * kPage), 0) << "NO_FAULT faulted";
  }
  // An implicit region: any mapped range.
  ibv_mr* imr = ibv_reg_mr(pd, nullptr, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE | kOdp);
  ASSERT_NE(imr, nullptr) << strerror(errno);
  Buffer later(2 * kPage);
  ibv_sge g{later.addr(), 2 * kPage, imr->lkey};
  EXPECT_EQ(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &g, 1), 0);
  EXPECT_EQ(resident_pages(later.data, 2 * kPage), 2);
  // Not mapped: EFAULT.
  g.addr = unmapped_hole(kPage);
  g.length = kPage;
  EXPECT_EQ(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &g, 1), EFAULT);
  EXPECT_EQ(ibv_dereg_mr(imr), 0);
}

TEST_F(OdpAdvise, Errors) {
  Buffer m(4 * kPage), ro(kPage), pinned(kPage);
  ASSERT_TRUE(m.reg(pd, kAllAccess | kOdp));
  ASSERT_TRUE(ro.reg(pd, IBV_ACCESS_REMOTE_READ | kOdp));
  ASSERT_TRUE(pinned.reg(pd, kAllAccess));
  const auto P = IBV_ADVISE_MR_ADVICE_PREFETCH;
  const auto F = IBV_ADVISE_MR_FLAG_FLUSH;
  EXPECT_EQ(advise(P, 0x80, {m.sge(0, 8)}), EINVAL) << "unknown flag";
  EXPECT_EQ(advise(static_cast<ibv_advise_mr_advice>(77), F, {m.sge(0, 8)}), EOPNOTSUPP) << "unknown advice";
  EXPECT_EQ(ibv_advise_mr(pd, P, F, nullptr, 0), EINVAL) << "no SGE";
  EXPECT_EQ(advise(P, F, {ibv_sge{m.addr(), 8, m.lkey() ^ 0x5a5a5a00}}), EFAULT) << "no such lkey";
  EXPECT_EQ(advise(P, F, {m.sge(3 * kPage, kPage + 1)}), EFAULT) << "past the region's end";
  EXPECT_EQ(advise(P, F, {ibv_sge{m.addr() - 1, 8, m.lkey()}}), EFAULT) << "before the region";
  EXPECT_EQ(advise(P, F, {m.sge(0, 8), ibv_sge{m.addr(), 8, m.lkey() ^ 0x5a5a5a00}}), EFAULT) << "second SGE";
  EXPECT_EQ(advise(IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, F, {ro.sge(0, 8)}), EPERM) << "not LOCAL_WRITE";
  EXPECT_EQ(advise(P, F, {ro.sge(0, 8)}), 0) << "reading is allowed";
  EXPECT_EQ(ibv_advise_mr(other_pd, P, F, std::vector<ibv_sge>{m.sge(0, 8)}.data(), 1), EPERM) << "another PD";
  EXPECT_EQ(advise(P, F, {pinned.sge(0, 8)}), ENOENT) << "not an ODP region";
}

// Two processes: an access to a hole of the target's implicit region fails at the requester with
// REM_ACCESS_ERR, and the target process carries on.
struct PeerInfo {
  uint32_t qpn, psn;
  uint32_t rkey;
  uint64_t good, hole;
  uint8_t gid[16];
};

int odp_target(int sock) {
  Device dev;
  if (!dev.ok()) return 10;
  Side s;
  if (!s.create(dev, QpConfig{})) return 11;
  ibv_mr* mr = ibv_reg_mr(s.pd, nullptr, SIZE_MAX, kAllAccess | kOdp);
  if (!mr) return 12;
  if (modify_to_init(s.qp, kAllAccess)) return 13;
  // Two mapped pages, then a hole of eight.
  auto* good = static_cast<uint8_t*>(mmap(nullptr, 10 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (good == MAP_FAILED || munmap(good + 2 * kPage, 8 * kPage)) return 12;
  const uint64_t hole = reinterpret_cast<uint64_t>(good + 2 * kPage);
  const PeerInfo me{s.qpn(), s.psn, mr->rkey, reinterpret_cast<uint64_t>(good), hole, {}};
  PeerInfo peer{};
  if (int rc = serve_connect(sock, dev, s, me, peer, 14)) return rc;
  for (;;) {
    char cmd = 0;
    if (!read_full(sock, &cmd, 1)) return 16;
    if (cmd == 'x') break;
    if (cmd == 'c') {  // the contents of the good buffer
      if (!write_full(sock, good, 2 * kPage)) return 17;
    } else if (cmd == 'h') {  // a receive into the hole
      if (post_recv(s.qp, 77, {ibv_sge{me.hole + kPage, 256, mr->lkey}})) return 20;
      if (!write_full(sock, &cmd, 1)) return 21;
    } else if (cmd == 'w') {  // the status of that receive's completion
      ibv_wc wc{};
      const int32_t st = poll_wc(s.rcq, &wc) && wc.wr_id == 77 ? wc.status : -1;
      if (!write_full(sock, &st, sizeof st)) return 22;
    } else {
      return 19;
    }
  }
  munmap(good, 2 * kPage);
  s.destroy_qp();
  return ibv_dereg_mr(mr) ? 18 : 0;
}

class OdpTwoProcess : public ForkedTarget {
 protected:
  OdpTwoProcess() : ForkedTarget(odp_target) {}
  std::unique_ptr<Device> dev;
  Side s;
  PeerInfo peer{};
  void TearDown() override {
    s.reset();
    dev.reset();
    ForkedTarget::TearDown();
  }
  void connect() {
    dev = std::make_unique<Device>();
    ASSERT_TRUE(dev->ok());
    ASSERT_TRUE(s.create(*dev, QpConfig{}));
    ASSERT_EQ(modify_to_init(s.qp, kAllAccess), 0);
    ConnConfig conn;
    conn.retry_cnt = 1;  // should the target die, the requester gives up quickly
    ASSERT_NO_FATAL_FAILURE(connect_target(PeerInfo{s.qpn(), s.psn, 0, 0, 0, {}}, peer, s, *dev, conn));
    ASSERT_NE(peer.hole, 0u);
  }
};

TEST_F(OdpTwoProcess, SendIntoHoleIsRemoteOperationalError) {
  ASSERT_NO_FATAL_FAILURE(connect());
  auto src = s.buf(kPage);
  ASSERT_TRUE(src->mr);
  char c = 'h';
  ASSERT_TRUE(write_full(sock, &c, 1));
  ASSERT_TRUE(read_full(sock, &c, 1));
  ASSERT_EQ(c, 'h');
  SendWr w(1, IBV_WR_SEND, {src->sge(0, 100)});
  ASSERT_EQ(post_send(s.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(s.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_OP_ERR) << ibv_wc_status_str(wc.status);
  c = 'w';
  ASSERT_TRUE(write_full(sock, &c, 1));
  int32_t st = 0;
  ASSERT_TRUE(read_full(sock, &st, sizeof st));
  EXPECT_EQ(st, IBV_WC_LOC_PROT_ERR) << "the target's receive";
}

TEST_F(OdpTwoProcess, HoleInImplicitRegionIsRemoteAccessError) {
  ASSERT_NO_FATAL_FAILURE(connect());
  auto src = s.buf(2 * kPage);
  ASSERT_TRUE(src->mr);
  fill_pattern(src->data, 2 * kPage, 61);
  SendWr ok(1, IBV_WR_RDMA_WRITE, {src->sge(0, 2 * kPage)});
  ok.rdma(peer.good, peer.rkey);
  ASSERT_EQ(post_send(s.qp, ok), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(s.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  const char c = 'c';
  ASSERT_TRUE(write_full(sock, &c, 1));
  std::vector<uint8_t> got(2 * kPage);
  ASSERT_TRUE(read_full(sock, got.data(), got.size()));
  EXPECT_EQ(check_pattern(got.data(), got.size(), 61), got.size());

  // A write that starts in the second mapped page and runs into the hole.
  SendWr bad(2, IBV_WR_RDMA_WRITE, {src->sge(0, 2 * kPage)});
  bad.rdma(peer.good + kPage, peer.rkey);
  ASSERT_EQ(post_send(s.qp, bad), 0);
  ASSERT_TRUE(poll_wc(s.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  // The target is alive and answers; the page before the request's range is untouched.
  ASSERT_TRUE(write_full(sock, &c, 1));
  ASSERT_TRUE(read_full(sock, got.data(), got.size())) << "the target died";
  EXPECT_EQ(check_pattern(got.data(), kPage, 61), kPage);
  // TearDown says 'x': the target deregisters and exits 0.
}

TEST_F(OdpTwoProcess, ReadFromHoleIsRemoteAccessError) {
  ASSERT_NO_FATAL_FAILURE(connect());
  auto dst = s.buf(kPage);
  ASSERT_TRUE(dst->mr);
  SendWr rd(1, IBV_WR_RDMA_READ, {dst->sge(0, 512)});
  rd.rdma(peer.hole + 100, peer.rkey);
  ASSERT_EQ(post_send(s.qp, rd), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(s.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
}

// UD with an ODP send buffer and an ODP receive buffer (GRH area included).
TEST(OdpUd, SendRecv) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_device_attr_ex ax{};
  if (!odp_caps(dev.ctx, &ax)) GTEST_SKIP() << "the device has no on-demand paging";
  constexpr uint32_t kQkey = 0x1234, kGrh = 40, kLen = 700;
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* qp[2] = {};
  for (auto& q : qp) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_UD;
    ia.cap = {4, 4, 1, 1, 0};
    q = ibv_create_qp(pd, &ia);
    ASSERT_NE(q, nullptr);
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = kPort;
    at.qkey = kQkey;
    ASSERT_EQ(ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
    at = {};
    at.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(ibv_modify_qp(q, &at, IBV_QP_STATE), 0);
    at = {};
    at.qp_state = IBV_QPS_RTS;
    ASSERT_EQ(ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  }
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.grh.dgid = dev.gid;
  ah_attr.grh.sgid_index = sgid_index();
  ah_attr.grh.hop_limit = 64;
  ah_attr.port_num = kPort;
  ibv_ah* ah = ibv_create_ah(pd, &ah_attr);
  ASSERT_NE(ah, nullptr);
  {
    Buffer src(kPage), dst(kPage);
    ASSERT_TRUE(src.reg(pd, IBV_ACCESS_LOCAL_WRITE | kOdp));
    ASSERT_TRUE(dst.reg(pd, IBV_ACCESS_LOCAL_WRITE | kOdp));
    fill_pattern(src.data, kLen, 71);
    ASSERT_EQ(post_recv(qp[1], 5, {dst.sge(0, kGrh + kLen)}), 0);
    ibv_sge g = src.sge(0, kLen);
    ibv_send_wr wr{};
    wr.wr_id = 6;
    wr.sg_list = &g;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = qp[1]->qp_num;
    wr.wr.ud.remote_qkey = kQkey;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(qp[0], &wr, &bad), 0);
    std::vector<ibv_wc> wcs = poll_wcs(cq, 2);
    ASSERT_EQ(wcs.size(), 2u);
    for (const ibv_wc& wc : wcs) {
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
      if (wc.wr_id == 5) {
        EXPECT_EQ(wc.byte_len, kGrh + kLen);
      }
    }
    EXPECT_EQ(check_pattern(dst.data + kGrh, kLen, 71), kLen);
  }
  ibv_destroy_ah(ah);
  for (auto* q : qp) ibv_destroy_qp(q);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
}

}  // namespace
}  // namespace softrdma::verbs_test
