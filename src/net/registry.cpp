#include "net/registry.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <system_error>

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
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = 64;
constexpr uint32_t kSlotMask = Registry::kCapacity - 1;

struct Header {
  std::atomic<uint64_t> magic;
  uint32_t version;
  uint32_t capacity;
  uint32_t slot_size;
};
static_assert(sizeof(Header) <= kHeaderSize);
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics must be lock-free");
static_assert(sizeof(Registry::Slot) == 16);

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

uint64_t make_endpoint(uint32_t ip_be, uint16_t port) { return (static_cast<uint64_t>(ip_be) << 32) | port; }

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

// Tries to take slot s for a new QPN with a random upper byte. Succeeds on an empty slot or one whose
// owner has died.
uint32_t try_claim(Registry::Slot& s, uint32_t index, uint32_t ip_be, uint16_t port, int32_t me) {
  uint64_t tag = s.tag.load(std::memory_order_acquire);
  // Our own entries are alive by definition; checking them would cost a syscall per occupied slot.
  if (state_of(tag) != kEmpty && (pid_of(tag) == me || !process_dead(pid_of(tag)))) return 0;
  uint32_t qpn;
  do {
    qpn = ((random_u32() & 0xFF) << 16) | index;
  } while (reserved_qpn(qpn));
  uint64_t claim = make_tag(qpn, kClaiming, gen_of(tag) + 1, me);
  if (!s.tag.compare_exchange_strong(tag, claim, std::memory_order_acq_rel)) return 0;
  s.endpoint.store(make_endpoint(ip_be, port), std::memory_order_relaxed);
  s.tag.store(make_tag(qpn, kLive, gen_of(claim), me), std::memory_order_release);
  return qpn;
}

std::string shm_path_for(const std::string& name) { return name.front() == '/' ? name : "/dev/shm/" + name; }

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace

std::string Registry::default_path() {
  const char* env = std::getenv("SOFTRDMA_REGISTRY");
  if (env && *env) return shm_path_for(env);
  return "/dev/shm/softrdma-registry-" + std::to_string(netns_inode());
}

Registry& Registry::instance() {
  // Deliberately leaked: QPNs may be released from other objects' destructors at exit.
  static Registry* r = new Registry(default_path());
  return *r;
}

Registry::Registry(const std::string& path) : path_(path) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) throw_errno("softrdma registry: open " + path);
  // The lock serialises initialisation between processes opening the file at once; it is dropped as soon
  // as the header is valid, since all later access is lock-free.
  if (flock(fd, LOCK_EX) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    throw_errno("softrdma registry: flock " + path);
  }
  auto fail = [&](const std::string& what) {
    int e = errno;
    close(fd);  // nothing is mapped yet, so this drops the lock
    errno = e;
    throw_errno("softrdma registry: " + what + " " + path);
  };
  const size_t len = kHeaderSize + sizeof(Slot) * kCapacity;
  struct stat st{};
  if (fstat(fd, &st) != 0) fail("fstat");
  if (static_cast<size_t>(st.st_size) < len) {
    // umask would otherwise keep other users' processes out of a per-host registry.
    (void)fchmod(fd, 0666);
    if (ftruncate(fd, static_cast<off_t>(len)) != 0) fail("ftruncate");
  }
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) fail("mmap");
  auto* hdr = static_cast<Header*>(m);
  if (hdr->magic.load(std::memory_order_acquire) != kMagic) {
    // Fresh (zero-filled) file: every slot tag is already kEmpty.
    hdr->version = kVersion;
    hdr->capacity = kCapacity;
    hdr->slot_size = sizeof(Slot);
    hdr->magic.store(kMagic, std::memory_order_release);
  } else if (hdr->version != kVersion || hdr->capacity != kCapacity || hdr->slot_size != sizeof(Slot)) {
    munmap(m, len);
    close(fd);
    throw std::runtime_error("softrdma registry: incompatible layout in " + path);
  }
  // The mapping holds a reference to the open file, so close() alone would not drop the lock.
  flock(fd, LOCK_UN);
  close(fd);
  map_ = m;
  map_len_ = len;
  slots_ = reinterpret_cast<Slot*>(static_cast<uint8_t*>(m) + kHeaderSize);
}

Registry::~Registry() {
  if (map_) munmap(map_, map_len_);
}

uint32_t Registry::allocate_qpn(uint32_t ip_be, uint16_t port) {
  const int32_t me = static_cast<int32_t>(getpid());
  // Random slots first: QPNs must look random, and this almost always succeeds at once.
  for (int attempt = 0; attempt < 64; ++attempt) {
    uint32_t index = random_u32() & kSlotMask;
    if (uint32_t qpn = try_claim(slots_[index], index, ip_be, port, me)) return qpn;
  }
  // Nearly full: sweep every slot once from a random start.
  uint32_t start = random_u32() & kSlotMask;
  for (uint32_t i = 0; i < kCapacity; ++i) {
    uint32_t index = (start + i) & kSlotMask;
    if (uint32_t qpn = try_claim(slots_[index], index, ip_be, port, me)) return qpn;
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
    if (state_of(t1) != kLive || qpn_of(t1) != qpn) return std::nullopt;
    uint64_t ep = s.endpoint.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    // Same tag (generation included) before and after: the endpoint belongs to that entry.
    if (s.tag.load(std::memory_order_relaxed) == t1) {
      return Endpoint{static_cast<uint32_t>(ep >> 32), static_cast<uint16_t>(ep & 0xFFFF), pid_of(t1)};
    }
  }
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
  std::vector<std::pair<uint32_t, Endpoint>> out;
  for (uint32_t i = 0; i < kCapacity; ++i) {
    uint64_t tag = slots_[i].tag.load(std::memory_order_acquire);
    if (state_of(tag) != kLive) continue;
    if (auto ep = lookup(qpn_of(tag))) out.emplace_back(qpn_of(tag), *ep);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

}  // namespace softrdma::net
