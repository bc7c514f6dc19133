// core::place_in_order: an exact copy at every length and alignment, and the NIC-like contract behind
// it -- a buffer's owner that saw the last byte of a peer's placement arrive may write the buffer at
// once, and nothing of that placement lands after it: the tail's bytes are stored once each, in
// ascending order, after the rest.
#include "core/place.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace softrdma::core {
namespace {

TEST(PlaceInOrder, CopiesExactlyTheRangeAtEveryLengthAndAlignment) {
  std::vector<uint8_t> src(512 + 64), dst(512 + 64 + 32);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  for (uint64_t len = 0; len <= 300; ++len) {
    for (uint64_t s_off = 0; s_off < 16; s_off += 3) {
      for (uint64_t d_off = 0; d_off < 16; ++d_off) {
        std::memset(dst.data(), 0xEE, dst.size());
        place_in_order(dst.data() + 16 + d_off, src.data() + s_off, len);
        ASSERT_EQ(0, std::memcmp(dst.data() + 16 + d_off, src.data() + s_off, len)) << len << " " << d_off;
        for (uint64_t i = 0; i < 16 + d_off; ++i) ASSERT_EQ(0xEE, dst[i]) << "before the range, len " << len;
        for (uint64_t i = 16 + d_off + len; i < dst.size(); ++i) ASSERT_EQ(0xEE, dst[i]) << "after, len " << len;
      }
    }
  }
}

#if defined(__x86_64__)
// Every store instruction into one page, in order: the page is read-only, a write faults, the handler
// records the address, opens the page and single-steps the store (the trap flag), and the trap closes
// the page again. Deterministic, where two threads racing a copy would catch a double store only by luck.
namespace store_trace {
uint8_t* page = nullptr;
uintptr_t addrs[8192];
int count = 0;

void on_fault(int, siginfo_t* si, void* ctx) {
  const auto a = reinterpret_cast<uintptr_t>(si->si_addr);
  const auto base = reinterpret_cast<uintptr_t>(page);
  if (a < base || a >= base + 4096 || count == 8192) {
    signal(SIGSEGV, SIG_DFL);  // not ours: fault again, for real
    return;
  }
  addrs[count++] = a;
  mprotect(page, 4096, PROT_READ | PROT_WRITE);
  static_cast<ucontext_t*>(ctx)->uc_mcontext.gregs[REG_EFL] |= 0x100;
}

void on_trap(int, siginfo_t*, void* ctx) {
  static_cast<ucontext_t*>(ctx)->uc_mcontext.gregs[REG_EFL] &= ~0x100LL;
  mprotect(page, 4096, PROT_READ);
}

// The start address of every store instruction copy makes into the page, in order.
template <typename Copy>
std::vector<uintptr_t> stores_of(Copy copy) {
  struct sigaction sa{}, old_segv{}, old_trap{};
  sa.sa_flags = SA_SIGINFO;
  sa.sa_sigaction = on_fault;
  sigaction(SIGSEGV, &sa, &old_segv);
  sa.sa_sigaction = on_trap;
  sigaction(SIGTRAP, &sa, &old_trap);
  count = 0;
  mprotect(page, 4096, PROT_READ);
  copy();
  mprotect(page, 4096, PROT_READ | PROT_WRITE);
  sigaction(SIGSEGV, &old_segv, nullptr);
  sigaction(SIGTRAP, &old_trap, nullptr);
  return {addrs, addrs + count};
}
}  // namespace store_trace

TEST(PlaceInOrder, StoresTheTailOnceEachInAscendingOrderAfterTheRest) {
  void* m = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, m);
  store_trace::page = static_cast<uint8_t*>(m);
  std::vector<uint8_t> src(4096);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 5);
  for (uint64_t len : {1, 7, 8, 63, 64, 65, 100, 127, 128, 129, 200, 1000, 3000}) {
    for (uint64_t off : {0, 8, 16, 33}) {
      uint8_t* dst = store_trace::page + off;
      volatile uint64_t n = len;
      const std::vector<uintptr_t> st = store_trace::stores_of([&] { place_in_order(dst, src.data(), n); });
      ASSERT_EQ(0, std::memcmp(dst, src.data(), len)) << len << " at +" << off;
      // The tail: the last stores, strictly ascending (so no byte twice), the last one ending the range.
      const uint64_t tail = std::min<uint64_t>(len, kOrderedTail);
      const uintptr_t tail_lo = reinterpret_cast<uintptr_t>(dst) + len - tail;
      size_t first_tail = st.size();
      while (first_tail > 0 && st[first_tail - 1] >= tail_lo) --first_tail;
      ASSERT_LT(first_tail, st.size()) << len << " at +" << off;
      for (size_t i = first_tail + 1; i < st.size(); ++i)
        ASSERT_GT(st[i], st[i - 1]) << "tail store " << i << " of " << st.size() << ", len " << len << " at +" << off;
      EXPECT_EQ(tail_lo, st[first_tail]) << len << " at +" << off;
      EXPECT_GE(st.back() + 16, reinterpret_cast<uintptr_t>(dst) + len) << len << " at +" << off;  // no store is wider
      // Nothing of the bulk after the tail began.
      for (size_t i = 0; i < first_tail; ++i) ASSERT_LT(st[i], tail_lo) << len << " at +" << off;
    }
  }
  munmap(m, 4096);
}
#endif

}  // namespace
}  // namespace softrdma::core
