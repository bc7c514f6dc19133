// Device memory (ibv_alloc_dm(3)): allocation against max_dm_size, ibv_memcpy_to/from_dm bounds,
// zero-based MRs on it (ibv_reg_dm_mr) used by local SGEs and by remote WRITE, READ and atomics,
// and the lifetime rules (ibv_free_dm refused while an MR is on the memory). Only the public verbs
// API: these run unchanged on a device that reports device memory, and skip on one that does not.
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "two_process.h"  // my_counter: which path the operations took

namespace softrdma::verbs_test {
namespace {

constexpr unsigned kDmAccess = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

struct DmDeleter {
  void operator()(ibv_dm* d) const { EXPECT_EQ(ibv_free_dm(d), 0); }
};
using DmPtr = std::unique_ptr<ibv_dm, DmDeleter>;
struct MrDeleter {
  void operator()(ibv_mr* m) const { EXPECT_EQ(ibv_dereg_mr(m), 0); }
};
using MrPtr = std::unique_ptr<ibv_mr, MrDeleter>;

bool direct_expected() {
  const char* s = getenv("SOFTRDMA_DIRECT");
  bool on = s ? std::strcmp(s, "0") != 0 : getenv("SOFTRDMA_IMPAIR") == nullptr;
  return on && getenv("VT_DEVICE") == nullptr;
}

uint64_t max_dm_size(ibv_context* ctx) {
  ibv_device_attr_ex ex{};
  if (ibv_query_device_ex(ctx, nullptr, &ex)) return 0;
  return ex.max_dm_size;
}

ibv_dm* alloc(ibv_context* ctx, size_t len, uint32_t log_align = 0, uint32_t comp_mask = 0) {
  ibv_alloc_dm_attr a{};
  a.length = len;
  a.log_align_req = log_align;
  a.comp_mask = comp_mask;
  return ibv_alloc_dm(ctx, &a);
}

class DeviceMemory : public RcPair {
 protected:
  uint64_t max_size = 0;
  void SetUp() override {
    RcPair::SetUp();
    max_size = max_dm_size(dev.ctx);
    if (!max_size) GTEST_SKIP() << "the device has no device memory";
  }
  ibv_wc_status run(SendWr& w) {
    if (post_send(a.qp, w) != 0) return IBV_WC_GENERAL_ERR;
    ibv_wc wc{};
    if (!poll_wc(a.scq, &wc)) return IBV_WC_GENERAL_ERR;
    EXPECT_EQ(wc.wr_id, w.wr.wr_id);
    return wc.status;
  }
};

TEST_F(DeviceMemory, AllocRefusesBadAttributes) {
  errno = 0;
  EXPECT_EQ(alloc(dev.ctx, 256, 0, 1), nullptr) << "unknown comp_mask bit";
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(alloc(dev.ctx, 0), nullptr) << "zero length";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(alloc(dev.ctx, max_size + 1), nullptr) << "above max_dm_size";
  // Alignment requests the device can meet are honoured.
  DmPtr d(alloc(dev.ctx, 256, 6));
  ASSERT_NE(d, nullptr) << strerror(errno);
  EXPECT_EQ(d->context, dev.ctx);
}

TEST_F(DeviceMemory, TotalIsBoundedByMaxDmSize) {
  DmPtr all(alloc(dev.ctx, max_size));
  ASSERT_NE(all, nullptr) << "the whole budget at once: " << strerror(errno);
  ibv_dm* more = alloc(dev.ctx, 64);
  EXPECT_EQ(more, nullptr) << "past the budget";
  if (more) ibv_free_dm(more);
  all.reset();
  DmPtr again(alloc(dev.ctx, max_size / 2));
  EXPECT_NE(again, nullptr) << "freed memory is available again: " << strerror(errno);
}

TEST_F(DeviceMemory, CopiesRoundTripAndRefuseOutOfBounds) {
  constexpr size_t kLen = 1024;
  DmPtr d(alloc(dev.ctx, kLen));
  ASSERT_NE(d, nullptr);
  std::vector<uint8_t> in(kLen), out(kLen, 0);
  fill_pattern(in.data(), kLen, 11);
  ASSERT_EQ(ibv_memcpy_to_dm(d.get(), 0, in.data(), kLen), 0);
  ASSERT_EQ(ibv_memcpy_from_dm(out.data(), d.get(), 0, kLen), 0);
  EXPECT_EQ(check_pattern(out.data(), kLen, 11), kLen);
  // A partial copy at an offset touches only its bytes.
  std::vector<uint8_t> part(64, 0xEE);
  ASSERT_EQ(ibv_memcpy_to_dm(d.get(), 128, part.data(), part.size()), 0);
  ASSERT_EQ(ibv_memcpy_from_dm(out.data(), d.get(), 0, kLen), 0);
  EXPECT_EQ(check_pattern(out.data(), 128, 11), 128u);
  EXPECT_EQ(out[128], 0xEE);
  EXPECT_EQ(out[191], 0xEE);
  EXPECT_EQ(check_pattern(out.data() + 192, kLen - 192, 11, 192), kLen - 192);

  EXPECT_EQ(ibv_memcpy_to_dm(d.get(), kLen - 4, in.data(), 8), EINVAL) << "runs past the end";
  EXPECT_EQ(ibv_memcpy_from_dm(out.data(), d.get(), kLen + 4, 4), EINVAL) << "starts past the end";
  EXPECT_EQ(ibv_memcpy_from_dm(out.data(), d.get(), ~uint64_t{3}, 8), EINVAL) << "offset wraps";
  EXPECT_EQ(ibv_memcpy_to_dm(d.get(), 3, in.data(), 4), EINVAL) << "unaligned offset";
  EXPECT_EQ(ibv_memcpy_to_dm(d.get(), 4, in.data(), 3), EINVAL) << "unaligned length";
}

TEST_F(DeviceMemory, RegistrationRules) {
  ASSERT_TRUE(connect());
  constexpr size_t kLen = 4096;
  DmPtr d(alloc(dev.ctx, kLen));
  ASSERT_NE(d, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(b.pd, d.get(), 0, kLen, IBV_ACCESS_LOCAL_WRITE), nullptr) << "not zero based";
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(b.pd, d.get(), 0, kLen + 4, kDmAccess), nullptr) << "longer than the DM";
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(b.pd, d.get(), kLen, 4, kDmAccess), nullptr) << "starts at the end";
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_reg_dm_mr(b.pd, d.get(), 0, kLen, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_REMOTE_WRITE), nullptr)
      << "REMOTE_WRITE without LOCAL_WRITE";
  EXPECT_EQ(errno, EINVAL);

  ibv_mr* mr = ibv_reg_dm_mr(b.pd, d.get(), 1024, 2048, kDmAccess);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  EXPECT_EQ(mr->addr, nullptr) << "zero based";
  EXPECT_EQ(mr->length, 2048u);
  EXPECT_EQ(mr->pd, b.pd);
  EXPECT_EQ(ibv_free_dm(d.get()), EBUSY) << "an MR is on it";
  EXPECT_EQ(ibv_dealloc_pd(b.pd), EBUSY) << "the MR is in the PD";
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  MrPtr empty(ibv_reg_dm_mr(b.pd, d.get(), 0, 0, kDmAccess));
  EXPECT_NE(empty, nullptr) << "a zero-length DM MR: " << strerror(errno);
}

// b's DM MR covers DM bytes [kOff, kOff + kLen); every remote address is an offset into the MR.
TEST_F(DeviceMemory, RemoteWriteReadAndAtomicsOnDmMr) {
  ASSERT_TRUE(connect());
  constexpr size_t kOff = 512, kLen = 8192;
  DmPtr d(alloc(dev.ctx, kOff + kLen));
  ASSERT_NE(d, nullptr);
  MrPtr dmr(ibv_reg_dm_mr(b.pd, d.get(), kOff, kLen, kDmAccess));
  ASSERT_NE(dmr, nullptr) << strerror(errno);
  VT_BUF(src, a, kLen);
  VT_BUF(dst, a, kLen);
  fill_pattern(src->data, kLen, 21);
  const uint64_t ops_before = my_counter(&core::Counters::direct_ops);

  // WRITE 5000 bytes at MR offset 100 (several packets at MTU 1024).
  SendWr w(1, IBV_WR_RDMA_WRITE, {src->sge(0, 5000)});
  w.rdma(100, dmr->rkey);
  ASSERT_EQ(run(w), IBV_WC_SUCCESS);
  std::vector<uint8_t> seen(kOff + kLen);
  ASSERT_EQ(ibv_memcpy_from_dm(seen.data(), d.get(), 0, seen.size()), 0);
  EXPECT_EQ(check_pattern(seen.data() + kOff + 100, 5000, 21), 5000u) << "lands at the DM offset";
  for (size_t i = 0; i < kOff + 100; ++i) ASSERT_EQ(seen[i], 0) << "byte " << i << " before the write";

  // READ it back.
  SendWr r(2, IBV_WR_RDMA_READ, {dst->sge(0, 5000)});
  r.rdma(100, dmr->rkey);
  ASSERT_EQ(run(r), IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(dst->data, 5000, 21), 5000u);

  // Atomics on the 8-byte word at MR offset 6000.
  if (atomics_supported()) {
    uint64_t v = 40;
    ASSERT_EQ(ibv_memcpy_to_dm(d.get(), kOff + 6000, &v, 8), 0);
    SendWr fa(3, IBV_WR_ATOMIC_FETCH_AND_ADD, {dst->sge(0, 8)});
    fa.fetch_add(6000, dmr->rkey, 2);
    ASSERT_EQ(run(fa), IBV_WC_SUCCESS);
    EXPECT_EQ(dst->u64(0), 40u);
    SendWr cs(4, IBV_WR_ATOMIC_CMP_AND_SWP, {dst->sge(8, 8)});
    cs.cmp_swp(6000, dmr->rkey, 42, 7);
    ASSERT_EQ(run(cs), IBV_WC_SUCCESS);
    EXPECT_EQ(dst->u64(8), 42u);
    ASSERT_EQ(ibv_memcpy_from_dm(&v, d.get(), kOff + 6000, 8), 0);
    EXPECT_EQ(v, 7u);
  }
  // Device memory is as reachable as host memory by an intra-host peer.
  if (direct_expected()) {
    EXPECT_EQ(my_counter(&core::Counters::direct_ops) - ops_before, atomics_supported() ? 4u : 2u);
  }

  // Past the MR's end: a remote access error (the DM bytes beyond it are not the MR's).
  SendWr past(5, IBV_WR_RDMA_WRITE, {src->sge(0, 64)});
  past.rdma(kLen - 32, dmr->rkey);
  EXPECT_EQ(run(past), IBV_WC_REM_ACCESS_ERR);
}

TEST_F(DeviceMemory, DmMrAsLocalSges) {
  ASSERT_TRUE(connect());
  constexpr size_t kLen = 4096;
  DmPtr da(alloc(dev.ctx, kLen));
  DmPtr db(alloc(dev.ctx, kLen));
  ASSERT_TRUE(da && db);
  MrPtr ma(ibv_reg_dm_mr(a.pd, da.get(), 0, kLen, kDmAccess));
  MrPtr mb(ibv_reg_dm_mr(b.pd, db.get(), 0, kLen, kDmAccess));
  ASSERT_TRUE(ma && mb) << strerror(errno);
  std::vector<uint8_t> in(kLen), out(kLen);
  fill_pattern(in.data(), kLen, 31);
  ASSERT_EQ(ibv_memcpy_to_dm(da.get(), 0, in.data(), kLen), 0);

  // SEND from a's DM (SGE address = offset 256) into b's DM at offset 1024.
  ASSERT_EQ(post_recv(b.qp, 9, {ibv_sge{1024, 2048, mb->lkey}}), 0);
  SendWr s(8, IBV_WR_SEND, {ibv_sge{256, 2048, ma->lkey}});
  ASSERT_EQ(run(s), IBV_WC_SUCCESS);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b.rcq, &wc));
  expect_wc(wc, {.wr_id = 9, .opcode = IBV_WC_RECV, .byte_len = 2048});
  ASSERT_EQ(ibv_memcpy_from_dm(out.data(), db.get(), 1024, 2048), 0);
  EXPECT_EQ(check_pattern(out.data(), 2048, 31, 256), 2048u);

  // An SGE past the DM MR's end is a local protection error.
  SendWr bad(10, IBV_WR_SEND, {ibv_sge{kLen - 16, 32, ma->lkey}});
  EXPECT_EQ(run(bad), IBV_WC_LOC_PROT_ERR);
}

}  // namespace
}  // namespace softrdma::verbs_test
