#include "core/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <system_error>

namespace softrdma::core {

namespace {
constexpr size_t kAlign = 64;
size_t round_up(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }
}  // namespace

Arena::Arena(size_t capacity, bool peers_write) : capacity_(round_up(capacity)) {
  fd_ = memfd_create("softrdma-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "memfd_create");
  // The file is sparse: pages cost memory only once touched.
  if (ftruncate(fd_, static_cast<off_t>(capacity_)) != 0) {
    int e = errno;
    close(fd_);
    throw std::system_error(e, std::generic_category(), "ftruncate arena");
  }
  void* p = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd_);
    throw std::system_error(e, std::generic_category(), "mmap arena");
  }
  base_ = static_cast<uint8_t*>(p);
  // A memfd's inode is mode 0777: the mode of a descriptor says nothing about what its holder can reopen
  // it as. The seals hold for every descriptor (F_SEAL_FUTURE_WRITE: Linux 5.1).
  const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | (peers_write ? 0 : F_SEAL_FUTURE_WRITE);
  // Without them (an older kernel) nothing of it may be given to peers: sealed() says so.
  sealed_ = fcntl(fd_, F_ADD_SEALS, seals) == 0;
  free_[0] = {0, capacity_};
  nfree_ = 1;
}

Arena::~Arena() {
  munmap(base_, capacity_);
  close(fd_);
}

void* Arena::allocate(size_t bytes) {
  bytes = round_up(bytes ? bytes : 1);
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < nfree_; ++i) {
    if (free_[i].size < bytes) continue;
    size_t off = free_[i].offset;
    free_[i].offset += bytes;
    free_[i].size -= bytes;
    if (free_[i].size == 0) free_[i] = free_[--nfree_];
    // Memory handed out before is cleared; fresh memfd pages are zero already, and touching them
    // would only fault in pages (megabytes per context) that may never be used.
    if (off < fresh_from_) std::memset(base_ + off, 0, std::min(bytes, fresh_from_ - off));
    fresh_from_ = std::max(fresh_from_, off + bytes);
    return base_ + off;
  }
  return nullptr;
}

void Arena::release(void* p, size_t bytes) {
  if (!p) return;
  bytes = round_up(bytes ? bytes : 1);
  size_t off = static_cast<size_t>(static_cast<uint8_t*>(p) - base_);
  std::lock_guard lock(mutex_);
  // Coalesce with neighbours so long-lived processes creating and destroying objects don't fragment.
  for (size_t i = 0; i < nfree_;) {
    if (free_[i].offset + free_[i].size == off) {
      off = free_[i].offset;
      bytes += free_[i].size;
      free_[i] = free_[--nfree_];
    } else if (off + bytes == free_[i].offset) {
      bytes += free_[i].size;
      free_[i] = free_[--nfree_];
    } else {
      ++i;
    }
  }
  if (nfree_ < kMaxFree) free_[nfree_++] = {off, bytes};
}

}  // namespace softrdma::core
