// A per-context shared-memory arena (docs/direct-path.md): every structure a peer NIC would touch (MR key table,
// RQ rings, CQ rings) is carved out of one memfd, so a later intra-host peer can map it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace softrdma::core {

class Arena {
 public:
  // What processes given fd() may do: peers_write false, only read. The memfd is sealed after our own
  // writable mapping is made: it never changes size (a peer's ftruncate cannot fault us with SIGBUS),
  // and, unless peers_write, no new writable mapping or write() is possible through any fd of it (a
  // descriptor reopened O_RDWR through /proc included). sealed(): the seals are there (an older kernel
  // may refuse them; then fd() must not be given to anybody).
  explicit Arena(size_t capacity, bool peers_write = false);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Zeroed, 64-byte aligned block; nullptr when the arena is exhausted.
  void* allocate(size_t bytes);
  void release(void* p, size_t bytes);
  int fd() const { return fd_; }
  uint8_t* base() const { return base_; }
  size_t capacity() const { return capacity_; }
  bool sealed() const { return sealed_; }

 private:
  struct FreeBlock { size_t offset, size; };
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  size_t capacity_ = 0;
  bool sealed_ = false;
  std::mutex mutex_;
  // First-fit free list; allocations are rare (object creation), so simplicity beats speed here.
  static constexpr size_t kMaxFree = 4096;
  FreeBlock free_[kMaxFree];
  size_t nfree_ = 0;
  size_t fresh_from_ = 0;  // nothing at or above this offset was ever handed out: still the memfd's zeros
};

}  // namespace softrdma::core
