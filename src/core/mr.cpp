#include "core/mr.h"

#include <cstring>
#include <new>

namespace softrdma::core {

namespace {
uint32_t slot_hash(uint32_t key) { return (key * 0x9E3779B1u) >> 16; }  // kCapacity == 1 << 16
}  // namespace

MrTable::MrTable(Arena& arena) : arena_(arena), rng_(std::random_device{}()) {
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
    uint32_t k = static_cast<uint32_t>(rng_());
    // 0 is what an uninitialised SGE carries; never hand it out.
    if (k != 0 && !find(k, false) && !find(k, true)) return k;
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

bool MrTable::insert(uint32_t key, bool remote, const MrRegion& region) {
  for (uint32_t i = slot_hash(key), n = 0; n < kCapacity; i = (i + 1) & (kCapacity - 1), ++n) {
    Slot& s = slots_[i];
    if (!s.used) {
      seq_->fetch_add(1, std::memory_order_seq_cst);  // odd: a peer's lookup meanwhile retries
      s.key = key;
      s.remote = remote;
      s.region = region;
      s.used = 1;
      seq_->fetch_add(1, std::memory_order_release);
      return true;
    }
  }
  return false;
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

namespace {
AccessResult resolve(const MrRegion& r, uint32_t pd, uint64_t va, uint64_t len, uint8_t** host) {
  if (r.pd != pd) return AccessResult::BadPd;
  // Written to be overflow-proof: va + len may wrap for hostile requests.
  if (va < r.iova || va - r.iova > r.length || len > r.length - (va - r.iova))
    return AccessResult::OutOfRange;
  *host = reinterpret_cast<uint8_t*>(r.addr + (va - r.iova));
  return AccessResult::Ok;
}
}  // namespace

bool MrTable::find_remote_in(const void* slots, uint32_t rkey, MrRegion* out) {
  // The table may change under us (the caller validates with seq): copy each slot before judging it.
  const auto* table = static_cast<const Slot*>(slots);
  for (uint32_t i = slot_hash(rkey), n = 0; n < kCapacity; i = (i + 1) & (kCapacity - 1), ++n) {
    Slot s;
    std::memcpy(static_cast<void*>(&s), static_cast<const void*>(&table[i]), sizeof s);
    if (s.used == 0) return false;
    if (s.key == rkey && s.remote) {
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
  return resolve(s->region, pd, va, len, host);
}

AccessResult MrTable::check_remote(uint32_t rkey, uint32_t pd, uint64_t va, uint64_t len, uint32_t need,
                                   uint8_t** host) const {
  const Slot* s = find(rkey, true);
  if (!s) return AccessResult::BadKey;
  if ((s->region.access & need) != need) return AccessResult::NoPermission;
  return resolve(s->region, pd, va, len, host);
}

}  // namespace softrdma::core
