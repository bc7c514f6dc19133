// Memory regions and the key table (IBTA 10.6): which (key, range, access) a local SGE or a remote
// request may touch. The table lives in the context's shared arena; every mutation and every lookup
// happens under the owning engine's lock, so lookups on the packet path take no lock of their own.
#pragma once
#include <cstddef>
#include <atomic>
#include <cstdint>
#include <unordered_map>
#include <utility>

#include "core/arena.h"

namespace softrdma::core {

// Access bits, numerically identical to enum ibv_access_flags (the verbs layer passes them through).
enum Access : uint32_t {
  kLocalWrite = 1, kRemoteWrite = 2, kRemoteRead = 4, kRemoteAtomic = 8, kMwBind = 16, kZeroBased = 32,
  kOnDemand = 64,  // on-demand paging: pages are neither pinned nor required to be mapped (see fault_in)
};

// On-demand paging: makes the pages of [addr, addr+len) present, writable too when write is set, as
// an ODP HCA faults them in on access. False when some page is not mapped, or not readable/writable
// as asked: the access then fails with the status the spec names instead of faulting the process.
bool fault_in(uint64_t addr, uint64_t len, bool write);

struct MrRegion {
  uint64_t addr;     // host virtual address of the first byte
  uint64_t iova;     // the address peers use (ibv_reg_mr_iova2); equals addr for ibv_reg_mr
  uint64_t length;
  uint32_t access;
  uint32_t pd;       // protection domain handle
  uint32_t lkey, rkey;
  uint64_t share_id;  // intra-host direct path: the share holding these pages (0: none)
};

enum class AccessResult : uint8_t { Ok, BadKey, BadPd, OutOfRange, NoPermission, NotMapped };

// Memory windows (IBTA 10.6.7): type 1 is bound by the Bind MW verb and usable by any QP of its PD;
// type 2 (2B) is bound by a bind WQE and usable only through the QP that bound it.
enum class MwType : uint8_t { Type1 = 1, Type2 = 2 };

// What a bind WQE asks for (ibv_mw_bind_info plus the key the window gets).
struct MwBind {
  uint32_t handle;   // the window (ibv_mw.handle)
  uint32_t rkey;     // its low 8 bits become the window's key tag
  uint32_t mr_lkey;  // the region bound to; ignored for a zero-length (type 1: unbinding) bind
  uint64_t addr, length;
  uint32_t access;   // kRemote* | kZeroBased
};

class MrTable {
 public:
  static constexpr uint32_t kCapacity = 1u << 16;   // key slots (two per MR: lkey and rkey)
  static constexpr uint32_t kMaxMr = kCapacity / 4;  // keeps the open-addressing load under 50 %
  explicit MrTable(Arena& arena);
  ~MrTable();

  // Registers a region with fresh random keys; false when the table is full.
  bool add(MrRegion& region);
  void remove(const MrRegion& region);
  // ibv_rereg_mr: the region with these keys gets updated's range, PD and access (its keys stay).
  void update(const MrRegion& updated);
  size_t count() const { return count_; }

  // For the intra-host direct path (transport/direct.h): the slots, and a sequence number that is odd
  // while they change, so that another process can look keys up in its mapping of the arena.
  const void* slots() const { return slots_; }
  const std::atomic<uint64_t>* seq() const { return seq_; }
  // Bytes of the slots (an initiator checks that another process's table lies inside its arena).
  static size_t slots_bytes();
  // Looks a region's rkey (remote) or lkey up in a table image (possibly another process's, read under
  // its seq) and copies the region out. Windows are not found: their checks stay with the responder.
  static bool find_in(const void* slots, uint32_t key, bool remote, MrRegion* out);
  // The region registered under a local key (not a window's); false when there is none.
  bool lookup_local(uint32_t lkey, MrRegion* out) const;

  // Resolves [va, va+len) under a local key to a host pointer, checking PD, bounds and (for
  // destinations the HCA writes) LOCAL_WRITE.
  AccessResult check_local(uint32_t lkey, uint32_t pd, uint64_t va, uint64_t len, bool write,
                           uint8_t** host) const;
  // Same for a remote key, with the remote permission bits a request needs. The key may be a bound
  // window's; qpn is the QP the request arrived on (a type 2 window is usable only through its own).
  AccessResult check_remote(uint32_t rkey, uint32_t pd, uint64_t va, uint64_t len, uint32_t need,
                            uint8_t** host, uint32_t qpn = 0) const;
  // What a remote request needs of the region its key names, once found: every bit of need, then PD and
  // bounds (check_range). One decision for the responder (check_remote, on this table) and the direct
  // path's initiator (on a region it found in the target's table image with find_in).
  static AccessResult check_remote_region(const MrRegion& r, uint32_t pd, uint64_t va, uint64_t len, uint32_t need);
  // [va, va+len) lies inside the region, which is in PD pd: Ok, BadPd or OutOfRange.
  static AccessResult check_range(const MrRegion& r, uint32_t pd, uint64_t va, uint64_t len);

  // Memory windows. alloc_window: false when max_mw are allocated; the window starts unbound.
  static constexpr uint32_t kMaxMw = kCapacity / 8;  // bound windows take one key slot each
  bool alloc_window(MwType type, uint32_t pd, uint32_t* handle, uint32_t* rkey);
  // Invalidates the window if bound (ibv_dealloc_mw(3)).
  void dealloc_window(uint32_t handle);
  // Executes a bind WQE posted on QP qpn of PD qp_pd (IBTA 10.6.7.2/3, C10-72..75); false for a
  // Memory Window Bind Error. *rkey receives the window's new key.
  bool bind_window(const MwBind& bind, uint32_t qp_pd, uint32_t qpn, uint32_t* rkey);
  // Local Invalidate (remote = false) or Send with Invalidate (remote = true) of rkey, arriving on
  // QP qpn of PD pd: only a bound type 2 window can be invalidated; false otherwise.
  bool invalidate(uint32_t rkey, uint32_t pd, uint32_t qpn, bool remote);
  // Windows bound to the region with this lkey (its deregistration is refused while any are).
  bool has_bound_windows(uint32_t mr_lkey) const;
  // A destroyed QP's type 2 windows become unbound: its QPN may be handed out again.
  void unbind_windows_of_qp(uint32_t qpn);
  size_t window_count() const { return windows_.size(); }

 private:
  struct Slot {
    uint32_t key;
    uint8_t used;    // 0 empty, 1 live (deletion shifts entries back: there are no tombstones)
    uint8_t remote;  // 1: this slot is the rkey of its region
    uint8_t window;  // 0: a region's key; else the MwType of a bound window (region = its range)
    uint8_t pad;
    uint32_t qpn;    // type 2 window: the QP it is bound through
    MrRegion region;
  };
  // A window's state; while bound its key also has a remote slot.
  struct Window {
    MwType type;
    bool bound = false;
    uint32_t pd;
    uint32_t rkey;     // (handle << 8) | tag
    uint32_t mr_lkey;  // while bound
    uint32_t qpn;      // type 2, while bound
  };
  const Slot* find(uint32_t key, bool remote) const;
  Slot* find(uint32_t key, bool remote) { return const_cast<Slot*>(std::as_const(*this).find(key, remote)); }
  Slot* insert(uint32_t key, bool remote, const MrRegion& region, uint8_t window = 0, uint32_t qpn = 0);
  void erase(uint32_t key, bool remote);
  uint32_t fresh_key();
  void unbind(Window& w);

  Arena& arena_;
  Slot* slots_;
  std::atomic<uint64_t>* seq_;  // in the arena, next to the slots
  size_t count_ = 0;
  std::unordered_map<uint32_t, Window> windows_;  // by handle: the upper 24 bits of its keys
};

}  // namespace softrdma::core
