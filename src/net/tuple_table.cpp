// The direct path's table of iWARP TCP 4-tuples (tuple_table.h).
#include "net/tuple_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <system_error>

#include "config/config.h"
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
constexpr uint64_t kVersion = 2;                     // 2: per-user files
constexpr size_t kHeaderSize = 64;
constexpr size_t kFileSize = kHeaderSize + sizeof(TupleTable::Slot) * TupleTable::kSlots;
static_assert(sizeof(TupleTable::Slot) == 32);
static_assert(sizeof(UserFiles::Header) <= kHeaderSize);

struct Raw {
  uint64_t tag, addrs, ports, pad;
};

// The uid owning the IPv4 TCP socket whose local and remote ends are t's, from this namespace's
// /proc/net/tcp (addresses there are the network-order words printed as hex, ports in host order).
std::optional<uint32_t> tcp_owner(const TcpTuple& t) {
  FILE* f = std::fopen("/proc/net/tcp", "re");
  if (!f) return std::nullopt;
  char line[512];
  std::optional<uint32_t> owner;
  (void)!std::fgets(line, sizeof line, f);  // the column titles
  while (!owner && std::fgets(line, sizeof line, f)) {
    unsigned lip = 0, lport = 0, rip = 0, rport = 0, st = 0, uid = 0;
    if (std::sscanf(line, " %*u: %8X:%4X %8X:%4X %2X %*X:%*X %*X:%*X %*X %u", &lip, &lport, &rip, &rport, &st,
                    &uid) != 6)
      continue;
    if (lip == t.local_ip_be && rip == t.remote_ip_be && lport == ntohs(t.local_port_be) &&
        rport == ntohs(t.remote_port_be))
      owner = uid;
  }
  std::fclose(f);
  return owner;
}

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

}  // namespace

std::string TupleTable::default_path() {
  const std::string base = config::parse().tuples;
  if (!base.empty()) return base[0] == '/' ? base : "/dev/shm/" + base;
  return "/dev/shm/softrdma-tuples-" + std::to_string(netns_inode());
}

TupleTable& TupleTable::instance() {
  static TupleTable* t = new TupleTable(default_path());  // leaked: used from exit-time code
  return *t;
}

TupleTable::TupleTable(const std::string& path)
    : files_(std::make_unique<UserFiles>(path, kFileSize, kMagic, kVersion)) {
  slots_ = reinterpret_cast<Slot*>(files_->own() + kHeaderSize);
}

TupleTable::~TupleTable() = default;

uint64_t TupleTable::refused() const {
  std::lock_guard<std::mutex> lk(files_->mu());
  return refused_;
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
  // Other users' files, read with pread (user_files.h): the probe window, in at most two pieces.
  std::lock_guard<std::mutex> lk(files_->mu());
  files_->refresh();
  std::optional<uint32_t> owner;
  bool owner_known = false;
  Raw window[kProbe];
  const uint32_t first = std::min(kProbe, kSlots - h);  // slots before the table wraps
  for (const UserFiles::Other& o : files_->others()) {
    if (!UserFiles::read_stable(o.fd, static_cast<off_t>(kHeaderSize + sizeof(Slot) * h), window, sizeof(Raw) * first) ||
        (first < kProbe &&
         !UserFiles::read_stable(o.fd, kHeaderSize, window + first, sizeof(Raw) * (kProbe - first))))
      continue;
    for (const Raw& r : window) {
      if (state_of(r.tag) != kLive || r.addrs != addrs_of(t) || (r.ports & ~0xFFFFFFFFull) != ports_key(t) ||
          dead(pid_of(r.tag)))
        continue;
      if (!owner_known) {
        owner = tcp_owner(t);
        owner_known = true;
      }
      if (owner && *owner == o.uid) return static_cast<uint32_t>(r.ports & 0xFFFFFFFF);
      ++refused_;  // someone else's claim on a connection that is not theirs
    }
  }
  return std::nullopt;
}

}  // namespace softrdma::net
