// Memory hooks: UCX (UCM) and Open MPI patch libc's mapping calls (mmap, mremap, munmap) to learn when
// the application's memory changes under their registration caches, and drop a range remapped.
// The direct path's share moves a registered buffer onto a memfd in place and back (direct-path.md),
// keeping its bytes at their addresses: a hook that saw that as the application's own remap dropped
// the region at once, and registered it again -- and had it moved again -- for every rendezvous
// message (Open MPI over UCX: 1 MiB messages at a tenth of their speed with SOFTRDMA_DIRECT=1).
//
// This program's own mmap, mmap64, mremap and munmap come before libc's for every library (as a hook
// that patches relocations does) and count the calls that touch a watched range.
#include "helpers.h"

#include <dlfcn.h>
#include <linux/mman.h>  // the flags only: <sys/mman.h> declares the functions defined here

#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

std::atomic<uintptr_t> watch_lo{0}, watch_hi{0};
std::atomic<int> seen{0};

void note(const void* addr, size_t len) {
  const auto lo = reinterpret_cast<uintptr_t>(addr);
  if (lo < watch_hi.load() && lo + len > watch_lo.load()) seen.fetch_add(1);
}

template <typename F>
F next_of(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" {

void* mmap(void* addr, size_t len, int prot, int flags, int fd, long off) {
  static const auto real = next_of<void* (*)(void*, size_t, int, int, int, long)>("mmap");
  if (flags & MAP_FIXED) note(addr, len);
  return real(addr, len, prot, flags, fd, off);
}

void* mmap64(void* addr, size_t len, int prot, int flags, int fd, long off) {
  static const auto real = next_of<void* (*)(void*, size_t, int, int, int, long)>("mmap64");
  if (flags & MAP_FIXED) note(addr, len);
  return real(addr, len, prot, flags, fd, off);
}

void* mremap(void* old, size_t old_len, size_t new_len, int flags, ...) {
  static const auto real = next_of<void* (*)(void*, size_t, size_t, int, ...)>("mremap");
  void* to = nullptr;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    to = va_arg(ap, void*);
    va_end(ap);
    note(to, new_len);
  }
  note(old, old_len);
  return (flags & MREMAP_FIXED) ? real(old, old_len, new_len, flags, to) : real(old, old_len, new_len, flags);
}

int munmap(void* addr, size_t len) {
  static const auto real = next_of<int (*)(void*, size_t)>("munmap");
  note(addr, len);
  return real(addr, len);
}

}  // extern "C"

namespace softrdma::verbs_test {
namespace {

// The name of what is mapped at p (/proc/self/maps), "" for anonymous memory.
std::string mapped_at(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::string name;
  FILE* f = fopen("/proc/self/maps", "re");
  if (!f) return name;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    uintptr_t lo = 0, hi = 0;
    int n = 0;
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %*s %*s %*s %n", &lo, &hi, &n) < 2 || a < lo || a >= hi) continue;
    name = line + n;
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    break;
  }
  fclose(f);
  return name;
}

TEST(MemoryHooks, TheDirectPathsShareRemapsNothingAHookSees) {
  if (std::getenv("VT_DEVICE")) GTEST_SKIP() << "softrdma's private ABI";
  Device dev("SOFTRDMA_DIRECT=1");
  ASSERT_TRUE(dev.ok());
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  constexpr size_t kLen = 1 << 20;
  Buffer buf(kLen);
  ASSERT_NE(buf.data, nullptr);
  fill_pattern(buf.data, kLen, 27);
  watch_lo = reinterpret_cast<uintptr_t>(buf.data);
  watch_hi = watch_lo + kLen;
  seen = 0;
  ibv_mr* mr = ibv_reg_mr(pd, buf.data, kLen, kAllAccess);
  ASSERT_NE(mr, nullptr);
  // Otherwise there is nothing to see: the test would pass whatever the share does.
  EXPECT_NE(mapped_at(buf.data).find("softrdma-mr"), std::string::npos)
      << "not moved onto a share: " << mapped_at(buf.data);
  EXPECT_EQ(check_pattern(buf.data, kLen, 27), kLen);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(mapped_at(buf.data), "") << "private anonymous memory again after the last deregistration";
  watch_lo = watch_hi = 0;
  EXPECT_EQ(seen.load(), 0) << "calls to mmap/mremap/munmap over the registered buffer";
  EXPECT_EQ(check_pattern(buf.data, kLen, 27), kLen);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

}  // namespace
}  // namespace softrdma::verbs_test
