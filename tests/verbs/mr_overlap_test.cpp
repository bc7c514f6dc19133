// Deregistration as MR caches do it (libfabric's, UCX's rcache): an MR over pages that another,
// larger MR also covers is deregistered while that other MR is in use; and memory is unmapped, or
// replaced by another mapping, before its MR is deregistered (from a munmap hook).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "helpers.h"

namespace softrdma::verbs_test {
namespace {

constexpr size_t kBig = 16u << 20;  // long enough over packets to be caught mid-transfer
constexpr int kLocalWriteOnly = IBV_ACCESS_LOCAL_WRITE;

// By packets and iWARP, not the direct path: on the intra-host direct path a whole READ or SEND
// completes inside ibv_post_send, so nothing is in flight when the other MR goes.
using MrOverlap = OverPaths<>;

// Waits until the first page of p holds the pattern: the transfer has started, and is not done.
bool wait_first_page(const uint8_t* p, uint32_t seed) {
  for (int i = 0; i < kWaitSeconds * 1000; ++i) {
    if (check_pattern(p, 4096, seed) == 4096) return true;
    usleep(1000);
  }
  return false;
}

TEST_P(MrOverlap, DeregisteringAnotherMrOfTheSamePagesKeepsAnInFlightRead) {
  ASSERT_TRUE(connect());
  VT_BUF(remote, b, kBig);
  VT_BUF(local, a, kBig);  // the MR the READ uses
  ibv_mr* small = ibv_reg_mr(a.pd, local->data, 1u << 20, kLocalWriteOnly);
  ASSERT_TRUE(small);
  fill_pattern(remote->data, kBig, 71);
  std::memset(local->data, 0, kBig);
  SendWr r(1, IBV_WR_RDMA_READ, {local->sge(0, kBig)});
  r.rdma(remote->addr(), remote->rkey());
  ASSERT_EQ(post_send(a.qp, r), 0);
  ASSERT_TRUE(wait_first_page(local->data, 71));
  ASSERT_EQ(ibv_dereg_mr(small), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  expect_wc(wc, {.wr_id = 1, .opcode = IBV_WC_RDMA_READ, .byte_len = uint32_t(kBig), .qp_num = a.qpn()});
  EXPECT_EQ(check_pattern(local->data, kBig, 71), kBig);
}

TEST_P(MrOverlap, DeregisteringAnotherMrOfTheSamePagesKeepsAnInFlightReceive) {
  ASSERT_TRUE(connect());
  VT_BUF(src, b, kBig);
  VT_BUF(dst, a, kBig);  // the MR the receive WQE uses
  ibv_mr* small = ibv_reg_mr(a.pd, dst->data, 1u << 20, kLocalWriteOnly);
  ASSERT_TRUE(small);
  fill_pattern(src->data, kBig, 72);
  std::memset(dst->data, 0, kBig);
  ASSERT_EQ(post_recv(a.qp, 2, {dst->sge(0, kBig)}), 0);
  SendWr s(3, IBV_WR_SEND, {src->sge(0, kBig)});
  ASSERT_EQ(post_send(b.qp, s), 0);
  ASSERT_TRUE(wait_first_page(dst->data, 72));
  ASSERT_EQ(ibv_dereg_mr(small), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.rcq, &wc));
  expect_wc(wc, {.wr_id = 2, .opcode = IBV_WC_RECV, .byte_len = uint32_t(kBig), .qp_num = a.qpn()});
  EXPECT_EQ(check_pattern(dst->data, kBig, 72), kBig);
  ASSERT_TRUE(poll_wc(b.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// With the direct path, registration moves anonymous pages onto a memfd of ours and deregistration
// moves them back: that must leave alone what the application mapped there since. Over every path,
// since how a context registers depends on it.
using MrUnmapped = OverPaths<>;

TEST_P(MrUnmapped, MemoryUnmappedBeforeDeregistration) {
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_TRUE(pd);
  constexpr size_t kLen = 64 * 1024;
  void* p = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 0x5a, kLen);
  ibv_mr* mr = ibv_reg_mr(pd, p, kLen, kLocalWriteOnly);
  ASSERT_TRUE(mr);
  ASSERT_EQ(munmap(p, kLen), 0);
  // Held inaccessible, so that no other mapping reuses the hole: reading it faults.
  ASSERT_EQ(mmap(p, kLen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0), p);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);  // and no fault
  munmap(p, kLen);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

TEST_P(MrUnmapped, MemoryRemappedBeforeDeregistrationStaysTheApplications) {
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_TRUE(pd);
  constexpr size_t kLen = 64 * 1024;
  void* p = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 0x5a, kLen);
  ibv_mr* mr = ibv_reg_mr(pd, p, kLen, kLocalWriteOnly);
  ASSERT_TRUE(mr);
  // The application's own shared file now lives at the same address.
  int fd = memfd_create("mr-overlap-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kLen), 0);
  ASSERT_EQ(mmap(p, kLen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0), p);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  // Still the file: a store through the mapping is what the file holds.
  static_cast<uint8_t*>(p)[100] = 0x33;
  uint8_t got = 0;
  ASSERT_EQ(pread(fd, &got, 1, 100), 1);
  EXPECT_EQ(got, 0x33) << "deregistration replaced the application's mapping";
  munmap(p, kLen);
  close(fd);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

VT_INSTANTIATE_PATHS(MrOverlap, Path::Packets, Path::Iwarp);
VT_INSTANTIATE_PATHS(MrUnmapped, VT_ALL_PATHS);

}  // namespace
}  // namespace softrdma::verbs_test
