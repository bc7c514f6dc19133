// The direct path's table of iWARP TCP 4-tuples (tuple_table.h).
#include "net/tuple_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <system_error>

#include "net/interfaces.h"

namespace softrdma::net {
namespace {

// Tag: state (2 bits) | generation (30 bits) | pid (32 bits). The generation moves on every change,
// so a reader that sees the same tag before and after reading the key read one entry's key.
constexpr uint64_t kEmpty = 0, kClaiming = 1, kLive = 2;
constexpr uint64_t kGenMask = 0x3FFFFFFF;
uint64_t state_of(uint64_t t) { return t & 3; }
uint64_t gen_of(uint64_t t) { return (t >> 2) & kGenMask; }
int32_t pid_of(uint64_t t) { return static_cast<int32_t>(static_cast<uint32_t>(t >> 32)); }
uint64_t make_tag(uint64_t state, uint64_t gen, int32_t pid) {
  return state | ((gen & kGenMask) << 2) | (uint64_t(static_cast<uint32_t>(pid)) << 32);
}

constexpr uint64_t kMagic = 0x53454c5055544453ull;  // "SDTUPLES"
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = 64;
struct Header {
  std::atomic<uint64_t> magic;
  uint32_t version, slots;
};
static_assert(sizeof(TupleTable::Slot) == 32);

bool dead(int32_t pid) { return pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH); }

uint64_t addrs_of(const TcpTuple& t) { return (uint64_t(t.local_ip_be) << 32) | t.remote_ip_be; }
uint64_t ports_key(const TcpTuple& t) { return (uint64_t(t.local_port_be) << 48) | (uint64_t(t.remote_port_be) << 32); }

// splitmix64's finaliser over both words: every bit of the tuple moves the home slot.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
uint32_t home(const TcpTuple& t) {
  return static_cast<uint32_t>(mix(addrs_of(t) ^ mix(ports_key(t)))) & (TupleTable::kSlots - 1);
}

[[noreturn]] void throw_errno(const std::string& what) { throw std::system_error(errno, std::generic_category(), what); }

}  // namespace

std::string TupleTable::default_path() {
  const char* env = std::getenv("SOFTRDMA_TUPLES");
  if (env && *env) return env[0] == '/' ? std::string(env) : "/dev/shm/" + std::string(env);
  return "/dev/shm/softrdma-tuples-" + std::to_string(netns_inode());
}

TupleTable& TupleTable::instance() {
  static TupleTable* t = new TupleTable(default_path());  // leaked: used from exit-time code
  return *t;
}

TupleTable::TupleTable(const std::string& path) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) throw_errno("softrdma tuples: open " + path);
  flock(fd, LOCK_EX);  // serialises the header's initialisation only
  const size_t len = kHeaderSize + sizeof(Slot) * kSlots;
  struct stat st{};
  if (fstat(fd, &st) != 0 ||
      (static_cast<size_t>(st.st_size) < len && ((void)fchmod(fd, 0666), ftruncate(fd, static_cast<off_t>(len)) != 0))) {
    int e = errno;
    close(fd);
    errno = e;
    throw_errno("softrdma tuples: size " + path);
  }
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    int e = errno;
    close(fd);
    errno = e;
    throw_errno("softrdma tuples: mmap " + path);
  }
  auto* h = static_cast<Header*>(m);
  if (h->magic.load(std::memory_order_acquire) != kMagic) {
    h->version = kVersion;
    h->slots = kSlots;
    h->magic.store(kMagic, std::memory_order_release);
  } else if (h->version != kVersion || h->slots != kSlots) {
    munmap(m, len);
    close(fd);
    throw std::runtime_error("softrdma tuples: incompatible layout in " + path);
  }
  flock(fd, LOCK_UN);
  close(fd);
  map_ = m;
  map_len_ = len;
  slots_ = reinterpret_cast<Slot*>(static_cast<uint8_t*>(m) + kHeaderSize);
}

TupleTable::~TupleTable() {
  if (map_) munmap(map_, map_len_);
}

bool TupleTable::publish(const TcpTuple& t, uint32_t qpn) {
  const int32_t me = static_cast<int32_t>(getpid());
  const uint32_t h = home(t);
  for (uint32_t i = 0; i < kProbe; ++i) {
    Slot& s = slots_[(h + i) & (kSlots - 1)];
    uint64_t tag = s.tag.load(std::memory_order_acquire);
    if (state_of(tag) != kEmpty && !dead(pid_of(tag))) continue;
    uint64_t claim = make_tag(kClaiming, gen_of(tag) + 1, me);
    if (!s.tag.compare_exchange_strong(tag, claim, std::memory_order_acq_rel)) continue;
    s.addrs.store(addrs_of(t), std::memory_order_relaxed);
    s.ports.store(ports_key(t) | qpn, std::memory_order_relaxed);
    s.tag.store(make_tag(kLive, gen_of(claim), me), std::memory_order_release);
    return true;
  }
  return false;
}

void TupleTable::remove(const TcpTuple& t) {
  const int32_t me = static_cast<int32_t>(getpid());
  const uint32_t h = home(t);
  for (uint32_t i = 0; i < kProbe; ++i) {
    Slot& s = slots_[(h + i) & (kSlots - 1)];
    uint64_t tag = s.tag.load(std::memory_order_acquire);
    if (state_of(tag) != kLive || pid_of(tag) != me) continue;
    if (s.addrs.load(std::memory_order_relaxed) != addrs_of(t) ||
        (s.ports.load(std::memory_order_relaxed) & ~0xFFFFFFFFull) != ports_key(t))
      continue;
    s.tag.compare_exchange_strong(tag, make_tag(kEmpty, gen_of(tag) + 1, 0), std::memory_order_acq_rel);
  }
}

std::optional<uint32_t> TupleTable::lookup(const TcpTuple& t) const {
  const uint32_t h = home(t);
  for (uint32_t i = 0; i < kProbe; ++i) {
    const Slot& s = slots_[(h + i) & (kSlots - 1)];
    uint64_t t1 = s.tag.load(std::memory_order_acquire);
    if (state_of(t1) != kLive) continue;
    uint64_t a = s.addrs.load(std::memory_order_relaxed);
    uint64_t p = s.ports.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.tag.load(std::memory_order_relaxed) != t1) continue;  // changed under us
    if (a != addrs_of(t) || (p & ~0xFFFFFFFFull) != ports_key(t) || dead(pid_of(t1))) continue;
    return static_cast<uint32_t>(p & 0xFFFFFFFF);
  }
  return std::nullopt;
}

}  // namespace softrdma::net
