#include "core/mr.h"

#include <sys/mman.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <random>

namespace softrdma::core {

namespace {
uint32_t slot_hash(uint32_t key) { return (key * 0x9E3779B1u) >> 16; }  // kCapacity == 1 << 16

// Keys are capabilities (an rkey is all a peer needs to reach a region), so each comes from the
// kernel's CSPRNG: the keys a peer was given say nothing about the others. A seeded mt19937 did not
// do that (32 bits of seed to search, a linear state to solve), and its state, like any user-space
// pool, would be copied by fork. No pool: a registration can afford the system call.
uint32_t random_key_bits() {
  uint32_t v = 0;
  for (;;) {
    ssize_t n = getrandom(&v, sizeof v, 0);
    if (n == static_cast<ssize_t>(sizeof v)) return v;
    if (n < 0 && errno != EINTR) return static_cast<uint32_t>(std::random_device{}());  // no getrandom(2)
  }
}
}  // namespace

size_t MrTable::slots_bytes() { return sizeof(Slot) * kCapacity; }

MrTable::MrTable(Arena& arena) : arena_(arena) {
  slots_ = static_cast<Slot*>(arena_.allocate(sizeof(Slot) * kCapacity));
  if (!slots_) throw std::bad_alloc();
  seq_ = new (arena_.allocate(sizeof(std::atomic<uint64_t>))) std::atomic<uint64_t>(0);
}

MrTable::~MrTable() {
  arena_.release(seq_, sizeof(std::atomic<uint64_t>));
  arena_.release(slots_, sizeof(Slot) * kCapacity);
}

uint32_t MrTable::fresh_key() {
  for (;;) {
    uint32_t k = random_key_bits();
    // 0 is what an uninitialised SGE carries; never hand it out. The upper 24 bits of a window's
    // keys are reserved for it: its key tag changes with every bind.
    if (k != 0 && !find(k, false) && !find(k, true) && !windows_.count(k >> 8)) return k;
  }
}

const MrTable::Slot* MrTable::find(uint32_t key, bool remote) const {
  for (uint32_t i = slot_hash(key), n = 0; n < kCapacity; i = (i + 1) & (kCapacity - 1), ++n) {
    const Slot& s = slots_[i];
    if (s.used == 0) return nullptr;
    if (s.key == key && s.remote == remote) return &s;
  }
  return nullptr;
}

MrTable::Slot* MrTable::insert(uint32_t key, bool remote, const MrRegion& region, uint8_t window, uint32_t qpn) {
  for (uint32_t i = slot_hash(key), n = 0; n < kCapacity; i = (i + 1) & (kCapacity - 1), ++n) {
    Slot& s = slots_[i];
    if (!s.used) {
      seq_->fetch_add(1, std::memory_order_seq_cst);  // odd: a peer's lookup meanwhile retries
      s.key = key;
      s.remote = remote;
      s.window = window;
      s.qpn = qpn;
      s.region = region;
      s.used = 1;
      seq_->fetch_add(1, std::memory_order_release);
      return &s;
    }
  }
  return nullptr;
}

void MrTable::erase(uint32_t key, bool remote) {
  const Slot* found = find(key, remote);
  if (!found) return;
  constexpr uint32_t mask = kCapacity - 1;
  uint32_t hole = static_cast<uint32_t>(found - slots_);
  seq_->fetch_add(1, std::memory_order_seq_cst);
  // Backward-shift deletion: later members of the probe chain move into the hole, so lookups can
  // keep stopping at the first empty slot. (Tombstones would make a miss -- any packet with a
  // guessed rkey -- scan the whole table once registrations have churned.)
  for (uint32_t j = (hole + 1) & mask; slots_[j].used; j = (j + 1) & mask) {
    uint32_t home = slot_hash(slots_[j].key);
    // The entry at j may fill the hole only if its home slot is not cyclically within (hole, j].
    bool home_after_hole = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (home_after_hole) continue;
    slots_[hole] = slots_[j];
    hole = j;
  }
  slots_[hole].used = 0;
  seq_->fetch_add(1, std::memory_order_release);
}

bool MrTable::add(MrRegion& region) {
  if (count_ >= kMaxMr) return false;
  region.lkey = fresh_key();
  region.rkey = fresh_key();
  if (!insert(region.lkey, false, region)) return false;
  if (!insert(region.rkey, true, region)) {
    erase(region.lkey, false);
    return false;
  }
  ++count_;
  return true;
}

void MrTable::remove(const MrRegion& region) {
  erase(region.lkey, false);
  erase(region.rkey, true);
  --count_;
}

void MrTable::update(const MrRegion& updated) {
  Slot* l = find(updated.lkey, false);
  Slot* r = find(updated.rkey, true);
  if (!l || !r || l->window || r->window) return;
  // Odd while both copies change: a peer's lookup meanwhile retries, and every cached lookup (the
  // direct path keeps one per peer, under the seq it was read at) is stale afterwards.
  seq_->fetch_add(1, std::memory_order_seq_cst);
  l->region = updated;
  r->region = updated;
  seq_->fetch_add(1, std::memory_order_release);
}

namespace {
// Whether the kernel knows MADV_POPULATE_READ/WRITE (Linux 5.14): asked once, of a page of our own.
bool have_populate() {
  static const bool known = [] {
    void* p = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    const bool ok = madvise(p, 4096, MADV_POPULATE_READ) == 0;
    munmap(p, 4096);
    return ok;
  }();
  return known;
}
}  // namespace

bool fault_in(uint64_t addr, uint64_t len, bool write) {
  if (len == 0) return true;
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (addr + len < addr || addr + len > ~uint64_t{0} - page) return false;  // no user address there
  const uint64_t start = addr & ~(page - 1);
  const uint64_t end = (addr + len + page - 1) & ~(page - 1);
  // The kernel populates the page tables as a CPU access would, but answers an error (ENOMEM: not
  // mapped; EINVAL: no such access, as a write to a read-only mapping; EFAULT: SIGBUS) instead of
  // raising a signal.
  if (have_populate())
    return madvise(reinterpret_cast<void*>(start), end - start, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0;
  // An older kernel: the kernel's own copies check each page instead, one byte of it read (and, for a
  // write, written back unchanged), refused with EFAULT where a CPU access would fault.
  constexpr unsigned long kBatch = 64;
  uint8_t bytes[kBatch];
  iovec local[kBatch], remote[kBatch];
  unsigned long n = 0;
  for (uint64_t p = start; p < end; p += page) {
    local[n] = {&bytes[n], 1};
    remote[n] = {reinterpret_cast<void*>(p < addr ? addr : p), 1};
    if (++n == kBatch || p + page >= end) {
      const auto want = static_cast<ssize_t>(n);
      if (process_vm_readv(getpid(), local, n, remote, n, 0) != want) return false;
      if (write && process_vm_writev(getpid(), local, n, remote, n, 0) != want) return false;
      n = 0;
    }
  }
  return true;
}

AccessResult MrTable::check_range(const MrRegion& r, uint32_t pd, uint64_t va, uint64_t len) {
  if (r.pd != pd) return AccessResult::BadPd;
  // Written to be overflow-proof: va + len may wrap for hostile requests.
  if (va < r.iova || va - r.iova > r.length || len > r.length - (va - r.iova))
    return AccessResult::OutOfRange;
  return AccessResult::Ok;
}

AccessResult MrTable::check_remote_region(const MrRegion& r, uint32_t pd, uint64_t va, uint64_t len,
                                          uint32_t need) {
  if ((r.access & need) != need) return AccessResult::NoPermission;
  return check_range(r, pd, va, len);
}

namespace {
// The host address of a checked range; an on-demand region's pages are faulted in now, before the copy
// touches them.
AccessResult host_of(const MrRegion& r, uint64_t va, uint64_t len, bool write, uint8_t** host) {
  *host = reinterpret_cast<uint8_t*>(r.addr + (va - r.iova));
  if ((r.access & kOnDemand) && !fault_in(r.addr + (va - r.iova), len, write)) return AccessResult::NotMapped;
  return AccessResult::Ok;
}
}  // namespace

bool MrTable::lookup_local(uint32_t lkey, MrRegion* out) const {
  const Slot* s = find(lkey, false);
  if (!s) return false;
  *out = s->region;
  return true;
}

bool MrTable::find_in(const void* slots, uint32_t key, bool remote, MrRegion* out) {
  // The table may change under us (the caller validates with seq): copy each slot before judging it.
  const auto* table = static_cast<const Slot*>(slots);
  for (uint32_t i = slot_hash(key), n = 0; n < kCapacity; i = (i + 1) & (kCapacity - 1), ++n) {
    Slot s;
    std::memcpy(static_cast<void*>(&s), static_cast<const void*>(&table[i]), sizeof s);
    if (s.used == 0) return false;
    if (s.key == key && (s.remote != 0) == remote) {
      // The byte after remote is a window's type (0 for a region's key): windows stay with the responder.
      if (reinterpret_cast<const uint8_t*>(&s)[offsetof(Slot, remote) + 1] != 0) return false;
      *out = s.region;
      return true;
    }
  }
  return false;
}

AccessResult MrTable::check_local(uint32_t lkey, uint32_t pd, uint64_t va, uint64_t len, bool write,
                                  uint8_t** host) const {
  const Slot* s = find(lkey, false);
  if (!s) return AccessResult::BadKey;
  if (write && !(s->region.access & kLocalWrite)) return AccessResult::NoPermission;
  if (AccessResult a = check_range(s->region, pd, va, len); a != AccessResult::Ok) return a;
  return host_of(s->region, va, len, write, host);
}

AccessResult MrTable::check_remote(uint32_t rkey, uint32_t pd, uint64_t va, uint64_t len, uint32_t need,
                                   uint8_t** host, uint32_t qpn) const {
  const Slot* s = find(rkey, true);
  if (!s) return AccessResult::BadKey;
  // A type 2 window is associated with one QP (IBTA 10.6.7.2.2: type 2B checks QP and PD).
  if (s->window == static_cast<uint8_t>(MwType::Type2) && s->qpn != qpn) return AccessResult::BadKey;
  if (AccessResult a = check_remote_region(s->region, pd, va, len, need); a != AccessResult::Ok) return a;
  return host_of(s->region, va, len, (need & (kRemoteWrite | kRemoteAtomic)) != 0, host);
}

bool MrTable::alloc_window(MwType type, uint32_t pd, uint32_t* handle, uint32_t* rkey) {
  if (windows_.size() >= kMaxMw) return false;
  for (;;) {
    uint32_t k = random_key_bits();
    uint32_t h = k >> 8;
    if (h == 0 || windows_.count(h)) continue;
    // No region key may carry this prefix: every tag of it must stay free for the window.
    bool taken = false;
    for (uint32_t tag = 0; tag < 256 && !taken; ++tag)
      taken = find((h << 8) | tag, false) || find((h << 8) | tag, true);
    if (taken) continue;
    Window w{};
    w.type = type;
    w.pd = pd;
    w.rkey = k;
    windows_.emplace(h, w);
    *handle = h;
    *rkey = k;
    return true;
  }
}

void MrTable::unbind(Window& w) {
  if (!w.bound) return;
  erase(w.rkey, true);
  w.bound = false;
  w.mr_lkey = 0;
  w.qpn = 0;
}

void MrTable::dealloc_window(uint32_t handle) {
  auto it = windows_.find(handle);
  if (it == windows_.end()) return;
  unbind(it->second);
  windows_.erase(it);
}

bool MrTable::bind_window(const MwBind& b, uint32_t qp_pd, uint32_t qpn, uint32_t* rkey) {
  auto it = windows_.find(b.handle);
  if (it == windows_.end()) return false;
  Window& w = it->second;
  uint32_t rights = b.access & (kRemoteWrite | kRemoteRead | kRemoteAtomic);
  // A window grants remote rights only. LOCAL_WRITE is accepted and means nothing for it (hardware
  // takes it too, and rdma-core's tests pass it); MW_BIND or an unknown bit cannot be granted.
  if (b.access & ~(rights | kZeroBased | kLocalWrite)) return false;
  if (w.type == MwType::Type2) {
    if (w.bound) return false;                  // o10-37.2.30: only a free type 2 window is bound
    if (qp_pd != w.pd) return false;            // C10-72
    if (b.length == 0) return false;            // o10-37.2.40: no zero-length type 2 bind
  } else if (b.access & kZeroBased) {
    return false;                               // o10-36.2.2: type 1 windows are VA based
  }
  // IBTA does not require the key tag to change with each bind (ibv_inc_rkey(3) is the consumer's
  // way to pick a new one); the same tag again is accepted.
  uint32_t new_key = (w.rkey & ~0xFFu) | (b.rkey & 0xFF);
  MrRegion range{};
  if (b.length) {
    const Slot* mr = find(b.mr_lkey, false);
    if (!mr) return false;
    const MrRegion& r = mr->region;
    if (r.pd != w.pd) return false;
    if (!(r.access & kMwBind)) return false;    // C10-73
    // C10-74: a window that lets peers write needs a region the HCA may write.
    if ((rights & (kRemoteWrite | kRemoteAtomic)) && !(r.access & kLocalWrite)) return false;
    // C10-75: the window lies inside the region (overflow-proof: addr + length may wrap).
    if (b.addr < r.iova || b.addr - r.iova > r.length || b.length > r.length - (b.addr - r.iova)) return false;
    range.addr = r.addr + (b.addr - r.iova);
    range.iova = (b.access & kZeroBased) ? 0 : b.addr;
    range.length = b.length;
    range.access = rights | (r.access & kOnDemand);  // a window on ODP memory faults pages in too
    range.pd = w.pd;
    range.rkey = new_key;
  }
  unbind(w);
  w.rkey = new_key;
  *rkey = new_key;
  if (b.length == 0) return true;               // a type 1 window unbound: its old key is dead
  uint32_t owner = w.type == MwType::Type2 ? qpn : 0;
  if (!insert(new_key, true, range, static_cast<uint8_t>(w.type), owner)) return false;
  w.bound = true;
  w.mr_lkey = b.mr_lkey;
  w.qpn = owner;
  return true;
}

bool MrTable::invalidate(uint32_t rkey, uint32_t pd, uint32_t qpn, bool remote) {
  // Region keys (no fast-registered regions here) and type 1 windows cannot be invalidated.
  auto it = windows_.find(rkey >> 8);
  if (it == windows_.end()) return false;
  Window& w = it->second;
  if (w.type != MwType::Type2 || !w.bound || w.rkey != rkey || w.pd != pd) return false;
  // Send with Invalidate must arrive on the QP the window is bound through (type 2B).
  if (remote && w.qpn != qpn) return false;
  unbind(w);
  return true;
}

bool MrTable::has_bound_windows(uint32_t mr_lkey) const {
  for (const auto& [h, w] : windows_)
    if (w.bound && w.mr_lkey == mr_lkey) return true;
  return false;
}

void MrTable::unbind_windows_of_qp(uint32_t qpn) {
  for (auto& [h, w] : windows_)
    if (w.bound && w.type == MwType::Type2 && w.qpn == qpn) unbind(w);
}

}  // namespace softrdma::core
