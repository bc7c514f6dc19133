#include "transport/direct_share.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

namespace softrdma::transport {

namespace {

struct MapLine {
  uint64_t start, end, offset, inode;
  unsigned dev_major, dev_minor;
  char perms[5];
  std::string path;
};

// The lines of /proc/self/maps that intersect [lo, hi), in address order.
std::vector<MapLine> maps_covering(uint64_t lo, uint64_t hi) {
  std::vector<MapLine> out;
  FILE* f = fopen("/proc/self/maps", "re");
  if (!f) return out;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    MapLine m{};
    int n = 0;
    if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %4s %" SCNx64 " %x:%x %" SCNu64 " %n", &m.start, &m.end, m.perms,
               &m.offset, &m.dev_major, &m.dev_minor, &m.inode, &n) < 7)
      continue;
    if (m.end <= lo) continue;
    if (m.start >= hi) break;
    std::string rest = line + n;
    while (!rest.empty() && (rest.back() == '\n' || rest.back() == ' ')) rest.pop_back();
    m.path = rest;
    out.push_back(std::move(m));
  }
  fclose(f);
  return out;
}

// True when [lo, hi) is covered without holes by lines.
bool contiguous(const std::vector<MapLine>& lines, uint64_t lo, uint64_t hi) {
  uint64_t at = lo;
  for (const MapLine& m : lines) {
    if (m.start > at) return false;
    at = m.end;
  }
  return at >= hi;
}

bool on_own_stack(uint64_t lo, uint64_t hi) {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return true;  // unknown: be careful
  void* base = nullptr;
  size_t size = 0;
  pthread_attr_getstack(&attr, &base, &size);
  pthread_attr_destroy(&attr);
  uint64_t b = reinterpret_cast<uint64_t>(base);
  return lo < b + size && hi > b;
}

// Scans and copies of whole pages touch the bytes around an MR too: other objects, and under ASan their
// redzones. That is deliberate (the page moves as a whole), so these two are not instrumented, and the
// copy is a plain loop that the compiler must not turn into an (intercepted) memcpy call.
#if defined(__clang__)
#define SOFTRDMA_WHOLE_PAGES __attribute__((no_sanitize("address"), no_builtin))
#else
#define SOFTRDMA_WHOLE_PAGES __attribute__((no_sanitize("address"), optimize("no-tree-loop-distribute-patterns")))
#endif

SOFTRDMA_WHOLE_PAGES bool page_is_zero(const uint8_t* p, size_t n) {
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t acc = 0;
  for (size_t i = 0; i < n / 8; ++i) acc |= w[i];
  return acc == 0;
}

SOFTRDMA_WHOLE_PAGES void copy_page(uint8_t* dst, const uint8_t* src, size_t n) {
  auto* d = reinterpret_cast<uint64_t*>(dst);
  const auto* s = reinterpret_cast<const uint64_t*>(src);
  for (size_t i = 0; i < n / 8; ++i) d[i] = s[i];
}

void unmove_range(int fd, uint64_t lo, uint64_t len);

// The remaps over the application's range keep its bytes at their addresses, so they are made as raw
// system calls, unseen by the memory hooks that patch libc's mapping calls (UCX's UCM, Open MPI's
// patcher): UCM took them for the application's own, so UCX's registration cache dropped the region
// at once and registered it again -- and had it moved again -- for every rendezvous message.
void* map_fixed(uint64_t at, size_t len, int flags, int fd) {
  return reinterpret_cast<void*>(syscall(SYS_mmap, at, len, PROT_READ | PROT_WRITE, flags | MAP_FIXED, fd, 0));
}
void* move_mapping(void* from, size_t len, uint64_t to) {
  return reinterpret_cast<void*>(syscall(SYS_mremap, from, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to));
}

// Moves the private anonymous pages [lo, hi) onto a new memfd at the same address. Returns the fd or -1
// (the range is then unchanged). Writes to these pages by other threads between the copy and the
// remap are lost: the caller holds the engine lock (its progress thread is quiet) and documents that
// application threads must not write them while ibv_reg_mr runs.
int move_to_memfd(uint64_t lo, uint64_t hi, bool remote_write) {
  size_t len = hi - lo;
  int fd = memfd_create("softrdma-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(len)) != 0) {
    close(fd);
    return -1;
  }
  void* tmp = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (tmp == MAP_FAILED) {
    close(fd);
    return -1;
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto* src = reinterpret_cast<const uint8_t*>(lo);
  auto* dst = static_cast<uint8_t*>(tmp);
  // Pages that read as zero stay holes of the file: a large, mostly untouched buffer costs no memory.
  for (size_t off = 0; off < len; off += page)
    if (!page_is_zero(src + off, page)) copy_page(dst + off, src + off, page);
  void* at = map_fixed(lo, len, MAP_SHARED, fd);
  if (at == MAP_FAILED) {
    // MAP_FIXED may have dropped the old pages: put anonymous memory with the saved contents back.
    void* back = map_fixed(lo, len, MAP_PRIVATE | MAP_ANONYMOUS, -1);
    if (back != MAP_FAILED) std::memcpy(back, tmp, len);
    munmap(tmp, len);
    close(fd);
    return -1;
  }
  munmap(tmp, len);
  // Our own mappings are made: from now on the file never changes size (a peer's ftruncate would fault
  // us with SIGBUS), and unless a peer may write it, nobody maps it writable again -- whatever fd mode
  // (a memfd's inode is mode 0777: an O_RDONLY fd can be reopened O_RDWR through /proc/self/fd).
  const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | (remote_write ? 0 : F_SEAL_FUTURE_WRITE);
  if (fcntl(fd, F_ADD_SEALS, seals) != 0) {
    unmove_range(fd, lo, len);
    close(fd);
    return -1;
  }
  return fd;
}

// The reverse: [lo, lo+len) becomes private anonymous memory again, contents kept (mremap swaps the
// copy in atomically; the same caveat about concurrent writers applies).
void make_private(uint64_t lo, size_t len) {
  void* tmp = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp == MAP_FAILED) return;  // stays shared: correct, only not private across fork
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto* src = reinterpret_cast<const uint8_t*>(lo);
  auto* dst = static_cast<uint8_t*>(tmp);
  for (size_t off = 0; off < len; off += page)
    if (!page_is_zero(src + off, page)) copy_page(dst + off, src + off, page);
  if (move_mapping(tmp, len, lo) == MAP_FAILED)
    munmap(tmp, len);
}

// The parts of [lo, hi) that are still our memfd fd, mapped read-write at their own offsets (the file
// offset of an address is address - lo). An application may unmap or replace a registered buffer before
// it deregisters it -- legal, hardware only unpins the pages -- and what it mapped there since is not
// ours to copy or replace.
std::vector<std::pair<uint64_t, uint64_t>> still_ours(int fd, uint64_t lo, uint64_t hi) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  struct stat st{};
  if (fstat(fd, &st) != 0) return out;
  for (const MapLine& m : maps_covering(lo, hi)) {
    if (m.inode != st.st_ino || m.dev_major != major(st.st_dev) || m.dev_minor != minor(st.st_dev) ||
        m.perms[0] != 'r' || m.perms[1] != 'w' || m.perms[3] != 's')
      continue;
    uint64_t s = std::max(m.start, lo), e = std::min(m.end, hi);
    if (m.offset + (s - m.start) != s - lo) continue;
    if (!out.empty() && out.back().second == s)
      out.back().second = e;
    else
      out.emplace_back(s, e);
  }
  return out;
}

// make_private on what of a moved share is still mapped from its memfd.
void unmove(int fd, uint64_t lo, uint64_t len) {
  for (auto [s, e] : still_ours(fd, lo, lo + len)) make_private(s, e - s);
}
void unmove_range(int fd, uint64_t lo, uint64_t len) { unmove(fd, lo, len); }

}  // namespace

ShareTable& ShareTable::instance() {
  static ShareTable* t = [] {
    auto* table = new ShareTable;  // never destroyed: used from exit-time destructors
    // A forked child gets its own private copy of registered memory, as it would of pinned pages
    // with a hardware provider: no MAP_SHARED page stays shared between parent and child.
    pthread_atfork([] { instance().mutex_.lock(); }, [] { instance().mutex_.unlock(); },
                   [] { instance().after_fork_in_child(); });
    return table;
  }();
  return *t;
}

void ShareTable::after_fork_in_child() {
  // Single-threaded here: nobody else writes these pages while they are copied.
  for (Entry& e : entries_) {
    if (e.moved) unmove(e.fd, e.info.base, e.info.length);
    close(e.fd);
  }
  entries_.clear();
  mutex_.unlock();
}

uint64_t ShareTable::acquire(uint64_t addr, uint64_t len, bool remote_write) {
  if (len == 0) return 0;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t lo = addr & ~(page - 1);
  uint64_t hi = (addr + len + page - 1) & ~(page - 1);
  if (hi <= lo) return 0;
  std::lock_guard lock(mutex_);
  for (Entry& e : entries_) {
    uint64_t elo = e.info.base, ehi = e.info.base + e.info.length;
    if (hi <= elo || lo >= ehi) continue;
    // Inside one share: the same backing serves both MRs. Straddling one: the pages cannot get a
    // second backing without cutting the first share's peers off, so no direct access.
    if (lo >= elo && hi <= ehi) {
      // Pages sealed against writing cannot be shared writable any more: that MR is reached by
      // process_vm_writev (or packets) instead.
      if (remote_write && e.write_sealed) return 0;
      // Unless the application replaced those pages since: then the share no longer backs them.
      if (e.moved) {
        auto ours = still_ours(e.fd, e.info.base, ehi);
        bool covered = false;
        for (auto [s, t] : ours) covered |= s <= lo && hi <= t;
        if (!covered) return 0;
      }
      ++e.refs;
      if (remote_write) ++e.writable_refs;
      return e.info.id;
    }
    return 0;
  }
  if (on_own_stack(lo, hi)) return 0;
  std::vector<MapLine> lines = maps_covering(lo, hi);
  if (lines.empty() || !contiguous(lines, lo, hi)) return 0;
  bool private_anon = true, shared_file = true;
  for (const MapLine& m : lines) {
    bool anon_name = m.path.empty() || m.path == "[heap]" || m.path.rfind("[anon:", 0) == 0;
    private_anon &= m.inode == 0 && anon_name && std::strcmp(m.perms, "rw-p") == 0;
    shared_file &= m.inode != 0 && m.perms[3] == 's' && m.perms[0] == 'r' && m.inode == lines[0].inode &&
                   m.dev_major == lines[0].dev_major && m.dev_minor == lines[0].dev_minor &&
                   m.offset - m.start == lines[0].offset - lines[0].start;
  }
  Entry e{};
  if (private_anon) {
    e.fd = move_to_memfd(lo, hi, remote_write);
    e.moved = true;
    e.write_sealed = !remote_write;
    e.info.file_off = 0;
  } else if (shared_file) {
    // Exported as it is: the mapping's own file, opened through map_files (needs CAP_SYS_ADMIN or
    // CAP_CHECKPOINT_RESTORE; without it such memory is reached by packets).
    char path[96];
    snprintf(path, sizeof path, "/proc/self/map_files/%" PRIx64 "-%" PRIx64, lines[0].start, lines[0].end);
    bool w = lines[0].perms[1] == 'w';
    e.fd = open(path, (w ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    e.info.file_off = lines[0].offset + (lo - lines[0].start);
    // Not our file to seal: exported only when its own seals already make that safe. It must not shrink
    // (a peer's ftruncate would fault us); without a write seal it is never handed out for reading only
    // (open_fd), since whoever holds any fd of it may reopen it writable.
    const int seals = e.fd >= 0 ? fcntl(e.fd, F_GET_SEALS) : -1;
    if (seals < 0 || !(seals & F_SEAL_SHRINK) || (remote_write && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)))) {
      if (e.fd >= 0) close(e.fd);
      return 0;
    }
    e.write_sealed = (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0;
  } else {
    return 0;
  }
  if (e.fd < 0) return 0;
  e.info.id = next_id_++;
  e.info.base = lo;
  e.info.length = hi - lo;
  e.refs = 1;
  e.writable_refs = remote_write ? 1 : 0;
  entries_.push_back(e);
  return e.info.id;
}

void ShareTable::release(uint64_t id, bool remote_write) {
  if (!id) return;
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    if (e.info.id != id) continue;
    if (remote_write && e.writable_refs) --e.writable_refs;
    if (--e.refs == 0) {
      // Moved pages become private anonymous memory again (so nothing of ours outlives the MRs, and a
      // later fork copies them as any other memory); exported ones stay as they were.
      if (e.moved) unmove(e.fd, e.info.base, e.info.length);
      close(e.fd);
      entries_[i] = entries_.back();
      entries_.pop_back();
    }
    return;
  }
}

int ShareTable::open_fd(uint64_t id, bool writable, bool may_write, ShareInfo* info) {
  std::lock_guard lock(mutex_);
  for (Entry& e : entries_) {
    if (e.info.id != id) continue;
    if (writable && (!e.writable_refs || e.write_sealed)) return -1;
    // Any fd of a file that is not sealed against writing can be reopened writable: only for a peer
    // that may write it anyway.
    if (!writable && !e.write_sealed && !may_write) return -1;
    *info = e.info;
    // A new open file description, read-only unless write is granted: the peer's mmap enforces it.
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", e.fd);
    return open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  }
  return -1;
}

}  // namespace softrdma::transport
