// The host-local QPN registry over per-user files (registry.h).
#include "net/registry.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <system_error>

#include "config/config.h"

namespace softrdma::net {
namespace {

// Slot tag bits. State and generation share the word with the QPN and pid so one CAS both claims a slot
// and names its owner; the generation lets lookups detect a slot recycled under them.
constexpr uint64_t kQpnMask = 0xFFFFFF;
constexpr int kStateShift = 24;
constexpr uint64_t kStateMask = 0x3;
constexpr int kGenShift = 26;
constexpr uint64_t kGenMask = 0x3F;
constexpr int kPidShift = 32;

enum State : uint64_t { kEmpty = 0, kClaiming = 1, kLive = 2 };

constexpr uint64_t kMagic = 0x474552414d445253ull;  // "SRDMAREG" in memory; stored last: header is ready
// 2: per-user files, slots carry the claim time and the owner's start time.
constexpr uint64_t kVersion = 2;
constexpr size_t kHeaderSize = 64;
constexpr uint32_t kSlotMask = Registry::kCapacity - 1;
constexpr size_t kFileSize = kHeaderSize + sizeof(Registry::Slot) * Registry::kCapacity;

static_assert(sizeof(UserFiles::Header) <= kHeaderSize);
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics must be lock-free");
static_assert(sizeof(Registry::Slot) == 32);

// A cached verdict on another user's entry is trusted this long; then /proc is asked again (the owner
// may have died and its pid gone to someone else).
constexpr uint64_t kVerdictNs = 1'000'000'000;
constexpr size_t kMaxVerdicts = 4096;
constexpr uint32_t kRecentSlots = 4096;
constexpr uint64_t kRecentNs = 1'000'000;

uint64_t monotonic_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000 + static_cast<uint64_t>(t.tv_nsec);
}

uint64_t state_of(uint64_t tag) { return (tag >> kStateShift) & kStateMask; }
uint32_t qpn_of(uint64_t tag) { return static_cast<uint32_t>(tag & kQpnMask); }
uint64_t gen_of(uint64_t tag) { return (tag >> kGenShift) & kGenMask; }
int32_t pid_of(uint64_t tag) { return static_cast<int32_t>(static_cast<uint32_t>(tag >> kPidShift)); }

uint64_t make_tag(uint32_t qpn, uint64_t state, uint64_t gen, int32_t pid) {
  return (static_cast<uint64_t>(qpn) & kQpnMask) | (state << kStateShift) | ((gen & kGenMask) << kGenShift) |
         (static_cast<uint64_t>(static_cast<uint32_t>(pid)) << kPidShift);
}

// An empty tag that keeps the generation moving, so a reader holding the old tag notices the change.
uint64_t emptied(uint64_t tag) { return make_tag(0, kEmpty, gen_of(tag) + 1, 0); }

uint64_t make_endpoint(uint32_t ip_key, uint16_t port) { return (static_cast<uint64_t>(ip_key) << 32) | port; }

bool process_dead(int32_t pid) { return pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH); }

bool reserved_qpn(uint32_t qpn) { return qpn == 0 || qpn == 1 || qpn == kQpnMask; }

// Per-thread generator, reseeded after fork: a child drawing its parent's sequence would make both try
// the same QPNs.
uint32_t random_u32() {
  thread_local std::mt19937_64 gen;
  thread_local pid_t seeded_for = 0;
  pid_t me = getpid();
  if (seeded_for != me) {
    std::seed_seq seq{[] {
                        try {
                          std::random_device rd;
                          return (static_cast<uint64_t>(rd()) << 32) | rd();
                        } catch (...) {
                          return static_cast<uint64_t>(
                              std::chrono::steady_clock::now().time_since_epoch().count());
                        }
                      }(),
                      static_cast<uint64_t>(me),
                      static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count())};
    gen.seed(seq);
    seeded_for = me;
  }
  return static_cast<uint32_t>(gen());
}

std::string shm_path_for(const std::string& name) { return name.front() == '/' ? name : "/dev/shm/" + name; }

}  // namespace

std::string Registry::default_path() {
  const std::string base = config::parse().registry;
  if (!base.empty()) return shm_path_for(base);
  return "/dev/shm/softrdma-registry-" + std::to_string(netns_inode());
}

Registry& Registry::instance() {
  // Deliberately leaked: QPNs may be released from other objects' destructors at exit.
  static Registry* r = new Registry(default_path());
  return *r;
}

Registry::Registry(const std::string& path)
    : path_(path), files_(std::make_unique<UserFiles>(path, kFileSize, kMagic, kVersion)) {
  slots_ = reinterpret_cast<Slot*>(files_->own() + kHeaderSize);
  recent_.resize(kRecentSlots);
  std::lock_guard<std::mutex> lk(files_->mu());
  files_->refresh();
}

Registry::~Registry() = default;

Registry::Stats Registry::stats() const {
  std::lock_guard<std::mutex> lk(files_->mu());
  Stats s = stats_;
  s.files_refused = files_->rejected();
  return s;
}

namespace {
uint64_t effective_claim(const Registry::Raw& r) { return std::max(r.claim_ns, (r.start + 1) * tick_ns()); }
}  // namespace

bool Registry::vouched(const UserFiles::Other& o, uint32_t index, const Raw& r) const {
  const uint64_t key = (static_cast<uint64_t>(o.ino) << 16) ^ (static_cast<uint64_t>(o.dev) << 48) ^ index;
  const uint64_t now = boottime_ns();
  auto it = verdicts_.find(key);
  if (it != verdicts_.end() && std::memcmp(&it->second.raw, &r, sizeof r) == 0 &&
      now - it->second.checked_ns < kVerdictNs)
    return it->second.valid;
  ProcessFacts f{};
  const int32_t pid = pid_of(r.tag);
  bool valid = process_facts(pid, &f) && (f.euid == o.uid || f.ruid == o.uid) && f.start_ticks == r.start &&
               r.claim_ns >= f.start_ticks * tick_ns();
  if (!valid) ++stats_.refused;
  if (verdicts_.size() >= kMaxVerdicts) verdicts_.clear();  // an attacker's file can hold 64K entries
  verdicts_[key] = Verdict{r, now, valid};
  return valid;
}

std::optional<Endpoint> Registry::lookup_others(uint32_t qpn) const {
  const uint32_t index = qpn & kSlotMask;
  const off_t off = static_cast<off_t>(kHeaderSize + sizeof(Slot) * index);
  std::optional<Endpoint> best;
  Raw best_raw{};
  uint64_t best_eff = 0;
  uint32_t best_uid = 0;
  int claims = 0;
  for (const UserFiles::Other& o : files_->others()) {
    Raw r{};
    if (!UserFiles::read_stable(o.fd, off, &r, sizeof r)) continue;
    if (state_of(r.tag) != kLive || qpn_of(r.tag) != qpn || !vouched(o, index, r)) continue;
    ++claims;
    // The earlier claim wins. vouched() made sure no claim predates its claimant's start tick; a claim
    // dated inside that tick counts from the tick's end, since the process may have started just
    // after the claim it names (a later claimant must not win by up to a tick).
    const uint64_t eff = effective_claim(r);
    bool better = !best || eff < best_eff ||
                  (eff == best_eff && (r.start < best_raw.start || (r.start == best_raw.start && o.uid < best_uid)));
    if (better) {
      best_eff = eff;
      best = Endpoint{static_cast<uint32_t>(r.endpoint >> 32), static_cast<uint16_t>(r.endpoint & 0xFFFF),
                      pid_of(r.tag)};
      best_raw = r;
      best_uid = o.uid;
    }
  }
  if (claims > 1) ++stats_.conflicts;
  return best;
}

bool Registry::taken_elsewhere(uint32_t qpn) const {
  const uint32_t index = qpn & kSlotMask;
  const off_t off = static_cast<off_t>(kHeaderSize + sizeof(Slot) * index);
  for (const UserFiles::Other& o : files_->others()) {
    Raw r{};
    // A slot that cannot be read (a truncated file, or one rewritten without pause) holds nothing that
    // a lookup could read either; counting it as taken would let its owner block every allocation.
    if (!UserFiles::read_stable(o.fd, off, &r, sizeof r)) continue;
    // Anything live-looking counts, vouched for or not: avoiding a squatted QPN costs nothing.
    if (state_of(r.tag) != kEmpty && qpn_of(r.tag) == qpn && !process_dead(pid_of(r.tag))) return true;
  }
  return false;
}

uint32_t Registry::allocate_qpn(const wire::IpAddress& ip, uint16_t port) {
  const int32_t me = static_cast<int32_t>(getpid());
  const uint64_t start = own_start_ticks();
  std::lock_guard<std::mutex> lk(files_->mu());
  files_->refresh(true);
  // Takes slot index for a new QPN with a random upper byte, if it is empty or its owner has died and
  // no other user's file holds that QPN.
  auto try_claim = [&](uint32_t index) -> uint32_t {
    Slot& s = slots_[index];
    uint64_t tag = s.tag.load(std::memory_order_acquire);
    // Our own entries are alive by definition; checking them would cost a syscall per occupied slot.
    if (state_of(tag) != kEmpty && (pid_of(tag) == me || !process_dead(pid_of(tag)))) return 0;
    uint32_t qpn;
    do {
      qpn = ((random_u32() & 0xFF) << 16) | index;
    } while (reserved_qpn(qpn));
    if (taken_elsewhere(qpn)) return 0;
    uint64_t claim = make_tag(qpn, kClaiming, gen_of(tag) + 1, me);
    if (!s.tag.compare_exchange_strong(tag, claim, std::memory_order_acq_rel)) return 0;
    s.endpoint.store(make_endpoint(ip.key(), port), std::memory_order_relaxed);
    s.claim_ns.store(boottime_ns(), std::memory_order_relaxed);
    s.start.store(start, std::memory_order_relaxed);
    uint64_t live = make_tag(qpn, kLive, gen_of(claim), me);
    s.tag.store(live, std::memory_order_release);
    // Another user may have claimed the same QPN between our check and our claim: then both see the
    // other now, and both give up this one.
    files_->refresh();
    if (taken_elsewhere(qpn)) {
      s.tag.compare_exchange_strong(live, emptied(live), std::memory_order_acq_rel);
      return 0;
    }
    return qpn;
  };
  // Random slots first: QPNs must look random, and this almost always succeeds at once.
  for (int attempt = 0; attempt < 64; ++attempt) {
    if (uint32_t qpn = try_claim(random_u32() & kSlotMask)) return qpn;
  }
  // Nearly full: sweep every slot once from a random start.
  uint32_t first = random_u32() & kSlotMask;
  for (uint32_t i = 0; i < kCapacity; ++i) {
    if (uint32_t qpn = try_claim((first + i) & kSlotMask)) return qpn;
  }
  return 0;
}

void Registry::release_qpn(uint32_t qpn) {
  if (reserved_qpn(qpn) || qpn > kQpnMask) return;
  Slot& s = slots_[qpn & kSlotMask];
  uint64_t tag = s.tag.load(std::memory_order_acquire);
  if (state_of(tag) != kLive || qpn_of(tag) != qpn || pid_of(tag) != static_cast<int32_t>(getpid())) return;
  // CAS, not store: a concurrent reclaim by another process may have freed (and reused) the slot.
  s.tag.compare_exchange_strong(tag, emptied(tag), std::memory_order_acq_rel);
}

std::optional<Endpoint> Registry::lookup(uint32_t qpn) const {
  if (qpn > kQpnMask) return std::nullopt;
  const Slot& s = slots_[qpn & kSlotMask];
  for (;;) {
    uint64_t t1 = s.tag.load(std::memory_order_acquire);
    if (state_of(t1) != kLive || qpn_of(t1) != qpn) break;
    // Our own file first, and trusted: only our uid writes it, and our allocator never claims a QPN
    // another user holds.
    uint64_t ep = s.endpoint.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    // Same tag (generation included) before and after: the endpoint belongs to that entry.
    if (s.tag.load(std::memory_order_relaxed) == t1) {
      return Endpoint{static_cast<uint32_t>(ep >> 32), static_cast<uint16_t>(ep & 0xFFFF), pid_of(t1)};
    }
  }
  std::lock_guard<std::mutex> lk(files_->mu());
  const uint64_t now = monotonic_ns();
  Recent& c = recent_[qpn & (kRecentSlots - 1)];
  if (c.qpn == qpn && now < c.until_ns) return c.found ? std::optional<Endpoint>(c.ep) : std::nullopt;
  auto ep = lookup_others(qpn);
  // A user whose file we have not met yet (the directory changed since the last scan)?
  if (!ep && files_->refresh()) {
    for (Recent& r : recent_) r.until_ns = 0;
    ep = lookup_others(qpn);
  }
  c = Recent{qpn, ep.has_value(), ep.value_or(Endpoint{}), now + kRecentNs};
  return ep;
}

size_t Registry::reclaim_dead() {
  size_t freed = 0;
  for (uint32_t i = 0; i < kCapacity; ++i) {
    uint64_t tag = slots_[i].tag.load(std::memory_order_acquire);
    if (state_of(tag) == kEmpty || !process_dead(pid_of(tag))) continue;
    if (slots_[i].tag.compare_exchange_strong(tag, emptied(tag), std::memory_order_acq_rel)) ++freed;
  }
  return freed;
}

std::vector<std::pair<uint32_t, Endpoint>> Registry::entries() const {
  std::vector<uint32_t> qpns;
  for (uint32_t i = 0; i < kCapacity; ++i) {
    uint64_t tag = slots_[i].tag.load(std::memory_order_acquire);
    if (state_of(tag) == kLive) qpns.push_back(qpn_of(tag));
  }
  {
    std::lock_guard<std::mutex> lk(files_->mu());
    files_->refresh();
    std::vector<Raw> all(kCapacity);
    for (const UserFiles::Other& o : files_->others()) {
      if (pread(o.fd, all.data(), sizeof(Raw) * kCapacity, kHeaderSize) != static_cast<ssize_t>(sizeof(Raw) * kCapacity))
        continue;
      for (const Raw& r : all)
        if (state_of(r.tag) == kLive) qpns.push_back(qpn_of(r.tag));
    }
  }
  std::sort(qpns.begin(), qpns.end());
  qpns.erase(std::unique(qpns.begin(), qpns.end()), qpns.end());
  std::vector<std::pair<uint32_t, Endpoint>> out;
  for (uint32_t q : qpns)
    if (auto ep = lookup(q)) out.emplace_back(q, *ep);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

}  // namespace softrdma::net
