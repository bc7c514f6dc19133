// A per-context shared-memory arena (DESIGN §5): every structure a peer NIC would touch (MR key table,
// RQ rings, CQ rings) is carved out of one memfd, so a later intra-host peer can map it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace softrdma::core {

class Arena {
 public:
  explicit Arena(size_t capacity);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Zeroed, 64-byte aligned block; nullptr when the arena is exhausted.
  void* allocate(size_t bytes);
  void release(void* p, size_t bytes);
  int fd() const { return fd_; }
  uint8_t* base() const { return base_; }
  size_t capacity() const { return capacity_; }

 private:
  struct FreeBlock { size_t offset, size; };
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  size_t capacity_ = 0;
  std::mutex mutex_;
  // First-fit free list; allocations are rare (object creation), so simplicity beats speed here.
  static constexpr size_t kMaxFree = 4096;
  FreeBlock free_[kMaxFree];
  size_t nfree_ = 0;
  size_t fresh_from_ = 0;  // nothing at or above this offset was ever handed out: still the memfd's zeros
};

}  // namespace softrdma::core
