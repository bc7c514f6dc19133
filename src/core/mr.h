// Memory regions and the key table (IBTA 10.6): which (key, range, access) a local SGE or a remote
// request may touch. The table lives in the context's shared arena; every mutation and every lookup
// happens under the owning engine's lock, so lookups on the packet path take no lock of their own.
#pragma once
#include <cstddef>
#include <atomic>
#include <cstdint>
#include <random>

#include "core/arena.h"

namespace softrdma::core {

// Access bits, numerically identical to enum ibv_access_flags (the verbs layer passes them through).
enum Access : uint32_t {
  kLocalWrite = 1, kRemoteWrite = 2, kRemoteRead = 4, kRemoteAtomic = 8, kMwBind = 16,
};

struct MrRegion {
  uint64_t addr;     // host virtual address of the first byte
  uint64_t iova;     // the address peers use (ibv_reg_mr_iova2); equals addr for ibv_reg_mr
  uint64_t length;
  uint32_t access;
  uint32_t pd;       // protection domain handle
  uint32_t lkey, rkey;
  uint64_t share_id;  // intra-host direct path: the share holding these pages (0: none)
};

enum class AccessResult : uint8_t { Ok, BadKey, BadPd, OutOfRange, NoPermission };

class MrTable {
 public:
  static constexpr uint32_t kCapacity = 1u << 16;   // key slots (two per MR: lkey and rkey)
  static constexpr uint32_t kMaxMr = kCapacity / 4;  // keeps the open-addressing load under 50 %
  explicit MrTable(Arena& arena);
  ~MrTable();

  // Registers a region with fresh random keys; false when the table is full.
  bool add(MrRegion& region);
  void remove(const MrRegion& region);
  size_t count() const { return count_; }

  // For the intra-host direct path (transport/direct.h): the slots, and a sequence number that is odd
  // while they change, so that another process can look keys up in its mapping of the arena.
  const void* slots() const { return slots_; }
  const std::atomic<uint64_t>* seq() const { return seq_; }
  // Looks a region's rkey up in a table image (possibly another process's, read under its seq) and
  // copies the region out. Windows are not found: their checks stay with the responder.
  static bool find_remote_in(const void* slots, uint32_t rkey, MrRegion* out);

  // Resolves [va, va+len) under a local key to a host pointer, checking PD, bounds and (for
  // destinations the HCA writes) LOCAL_WRITE.
  AccessResult check_local(uint32_t lkey, uint32_t pd, uint64_t va, uint64_t len, bool write,
                           uint8_t** host) const;
  // Same for a remote key, with the remote permission bits a request needs.
  AccessResult check_remote(uint32_t rkey, uint32_t pd, uint64_t va, uint64_t len, uint32_t need,
                            uint8_t** host) const;

 private:
  struct Slot {
    uint32_t key;
    uint8_t used;    // 0 empty, 1 live (deletion shifts entries back: there are no tombstones)
    uint8_t remote;  // 1: this slot is the rkey of its region
    uint16_t pad;
    MrRegion region;
  };
  const Slot* find(uint32_t key, bool remote) const;
  bool insert(uint32_t key, bool remote, const MrRegion& region);
  void erase(uint32_t key, bool remote);
  uint32_t fresh_key();

  Arena& arena_;
  Slot* slots_;
  std::atomic<uint64_t>* seq_;  // in the arena, next to the slots
  size_t count_ = 0;
  std::mt19937 rng_;
};

}  // namespace softrdma::core
