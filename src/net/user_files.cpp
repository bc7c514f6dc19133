// Per-user shared-memory files (user_files.h).
#include "net/user_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace softrdma::net {
namespace {

[[noreturn]] void throw_errno(int e, const std::string& what) {
  throw std::system_error(e, std::generic_category(), what);
}

int64_t ns_between(const timespec& a, const timespec& b) {
  return (static_cast<int64_t>(b.tv_sec) - a.tv_sec) * 1000000000 + (b.tv_nsec - a.tv_nsec);
}

// A directory change within this long before a scan may share its mtime with a later change (tmpfs
// stamps with a coarse clock), so the next refresh scans again.
constexpr int64_t kRacyNs = 50'000'000;
// Files that look half-initialised make refresh() scan again, but at most this often (anyone can
// leave such a file behind); so do lookups in a racy window.
constexpr int64_t kPendingRescanNs = 10'000'000;

uint64_t realtime_ns() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000 + static_cast<uint64_t>(t.tv_nsec);
}

// Every live UserFiles, so fork() can take their locks: a child forked while another thread held one
// would otherwise find it locked forever (the registry was lock-free before; fork must stay safe).
std::mutex g_all_mu;
std::vector<UserFiles*>& all_files() {
  static auto* v = new std::vector<UserFiles*>;  // leaked: used from exit-time code
  return *v;
}
void before_fork() {
  g_all_mu.lock();
  for (UserFiles* f : all_files()) f->mu().lock();
}
void after_fork() {
  for (UserFiles* f : all_files()) f->mu().unlock();
  g_all_mu.unlock();
}
void track(UserFiles* f) {
  static const bool registered = [] { return pthread_atfork(before_fork, after_fork, after_fork) == 0; }();
  (void)registered;
  std::lock_guard<std::mutex> lk(g_all_mu);
  all_files().push_back(f);
}
void untrack(UserFiles* f) {
  std::lock_guard<std::mutex> lk(g_all_mu);
  auto& v = all_files();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == f) {
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
}

}  // namespace

int64_t UserFiles::uid_of_name(const std::string& base_name, const char* name) {
  const size_t n = base_name.size();
  if (std::strncmp(name, base_name.c_str(), n) != 0 || name[n] != '-' || name[n + 1] != 'u') return -1;
  const char* p = name + n + 2;
  if (*p < '0' || *p > '9') return -1;
  char* end = nullptr;
  errno = 0;
  unsigned long uid = std::strtoul(p, &end, 10);
  if (errno || uid > 0xFFFFFFFEul) return -1;
  if (*end == '.') {
    const char* k = end + 1;
    if (*k < '0' || *k > '9') return -1;
    unsigned long s = std::strtoul(k, &end, 10);
    if (s == 0 || s >= static_cast<unsigned long>(kMaxSuffix)) return -1;
  }
  return *end == '\0' ? static_cast<int64_t>(uid) : -1;
}

UserFiles::UserFiles(std::string base, size_t length, uint64_t magic, uint64_t version)
    : base_(std::move(base)), length_(length), magic_(magic), version_(version), uid_(geteuid()) {
  size_t slash = base_.rfind('/');
  dir_ = slash == std::string::npos ? "." : (slash == 0 ? "/" : base_.substr(0, slash));
  base_name_ = slash == std::string::npos ? base_ : base_.substr(slash + 1);
  for (int k = 0; k < kMaxSuffix; ++k) {
    // Appended piece by piece: operator+ on std::string draws GCC 12 -Wrestrict false positives at -O3.
    std::string path = base_;
    path.append("-u").append(std::to_string(uid_));
    if (k) path.append(".").append(std::to_string(k));
    // O_NOFOLLOW: a symlink planted under our name must not redirect our writes; O_NONBLOCK: nor may a
    // FIFO planted there block us.
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) {
      if (errno == EACCES || errno == ELOOP || errno == EPERM || errno == EISDIR || errno == ENXIO ||
          errno == ETXTBSY) {
        ++rejected_;  // someone else's file (or link) under our name: try the next name
        continue;
      }
      throw_errno(errno, "softrdma: open " + path);
    }
    auto fail = [&](const std::string& what) {
      int e = errno;
      close(fd);
      throw_errno(e, "softrdma: " + what + " " + path);
    };
    struct stat st{};
    if (fstat(fd, &st) != 0) fail("fstat");
    if (!S_ISREG(st.st_mode) || st.st_uid != uid_) {
      close(fd);
      ++rejected_;
      continue;
    }
    // Exactly 0644 whatever the umask: others must read it, and only we may write it.
    if (fchmod(fd, 0644) != 0) fail("fchmod");
    // Serialises initialisation between our own processes; all later access is lock-free.
    if (flock(fd, LOCK_EX) != 0) fail("flock");
    if (static_cast<size_t>(st.st_size) != length_ && ftruncate(fd, static_cast<off_t>(length_)) != 0)
      fail("ftruncate");
    void* m = mmap(nullptr, length_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) fail("mmap");
    auto* h = static_cast<Header*>(m);
    auto* magic_word = reinterpret_cast<std::atomic<uint64_t>*>(&h->magic);
    if (magic_word->load(std::memory_order_acquire) != magic_) {
      // Fresh, or left half-written by one of our own processes: start from zero.
      std::memset(m, 0, length_);
      h->version = version_;
      h->length = length_;
      magic_word->store(magic_, std::memory_order_release);
    } else if (h->version != version_ || h->length != length_) {
      munmap(m, length_);
      close(fd);
      throw std::runtime_error("softrdma: incompatible layout in " + path);
    }
    flock(fd, LOCK_UN);
    close(fd);
    map_ = static_cast<uint8_t*>(m);
    own_path_ = path;
    own_dev_ = st.st_dev;
    own_ino_ = st.st_ino;
    track(this);
    return;
  }
  throw std::runtime_error("softrdma: every name for uid " + std::to_string(uid_) + " under " + base_ +
                           " is taken by another user's file");
}

UserFiles::~UserFiles() {
  untrack(this);
  for (const Other& o : others_) close(o.fd);
  if (map_) munmap(map_, length_);
}

bool UserFiles::read_stable(int fd, off_t off, void* buf, size_t n) {
  uint8_t small[256];
  std::vector<uint8_t> big(n > sizeof small ? n : 0);
  uint8_t* again = n > sizeof small ? big.data() : small;
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (pread(fd, buf, n, off) != static_cast<ssize_t>(n)) return false;
    if (pread(fd, again, n, off) != static_cast<ssize_t>(n)) return false;
    if (std::memcmp(buf, again, n) == 0) return true;
  }
  return false;
}

bool UserFiles::refresh(bool strict) {
  struct stat st{};
  if (stat(dir_.c_str(), &st) != 0) return false;
  const bool moved = !scanned_ || st.st_mtim.tv_sec != dir_mtime_.tv_sec ||
                     st.st_mtim.tv_nsec != dir_mtime_.tv_nsec || st.st_size != dir_size_ || st.st_ino != dir_ino_;
  const uint64_t now = realtime_ns();
  if (!moved && !racy_) return false;
  // Unmoved but racy: allocation (strict) looks again every time, lookups at most every few ms.
  if (!moved && !strict && now - last_scan_ns_ < static_cast<uint64_t>(kPendingRescanNs)) return false;
  if (!moved && !recent_change_ && now - last_scan_ns_ < static_cast<uint64_t>(kPendingRescanNs)) return false;
  timespec now_ts{static_cast<time_t>(now / 1000000000), static_cast<long>(now % 1000000000)};
  recent_change_ = ns_between(st.st_mtim, now_ts) < kRacyNs;
  dir_mtime_ = st.st_mtim;
  dir_size_ = st.st_size;
  dir_ino_ = st.st_ino;
  scanned_ = true;
  last_scan_ns_ = now;
  std::vector<Other> before = others_;
  pending_ = false;
  scan();
  racy_ = recent_change_ || pending_;
  if (before.size() != others_.size()) return true;
  for (size_t i = 0; i < before.size(); ++i)
    if (before[i].ino != others_[i].ino || before[i].dev != others_[i].dev) return true;
  return false;
}

void UserFiles::scan() {
  std::vector<Other> found;
  DIR* d = opendir(dir_.c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    int64_t uid = uid_of_name(base_name_, e->d_name);
    if (uid < 0) continue;
    std::string path = dir_ + "/" + e->d_name;
    int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      ++rejected_;
      continue;
    }
    struct stat st{};
    if (fstat(fd, &st) != 0) {
      close(fd);
      continue;
    }
    bool twice = false;  // one file under two names (hard links): read it once
    for (const Other& f : found) twice = twice || (f.dev == st.st_dev && f.ino == st.st_ino);
    if (twice || (st.st_dev == own_dev_ && st.st_ino == own_ino_)) {
      close(fd);
      continue;
    }
    // Checked again for files we already hold: an owner may have widened its file's mode since.
    const bool sound = S_ISREG(st.st_mode) && st.st_uid == static_cast<uid_t>(uid) && (st.st_mode & 022) == 0 &&
                       static_cast<size_t>(st.st_size) == length_;
    if (!sound) {
      close(fd);
      ++rejected_;
      continue;
    }
    bool known = false;
    for (const Other& o : others_) {
      if (o.dev == st.st_dev && o.ino == st.st_ino) {
        found.push_back(o);  // keep the fd we already hold
        known = true;
        break;
      }
    }
    if (known) {
      close(fd);
      continue;
    }
    Header h{};
    bool ok = pread(fd, &h, sizeof h, 0) == sizeof h;
    if (ok && h.magic == 0) pending_ = true;  // possibly being initialised right now: look again later
    if (!ok || h.magic != magic_ || h.version != version_ || h.length != length_) {
      close(fd);
      ++rejected_;
      continue;
    }
    found.push_back(Other{static_cast<uint32_t>(uid), fd, st.st_dev, st.st_ino});
  }
  closedir(d);
  for (const Other& o : others_) {
    bool kept = false;
    for (const Other& f : found) kept = kept || (f.fd == o.fd);
    if (!kept) close(o.fd);
  }
  others_ = std::move(found);
}

bool process_facts(int32_t pid, ProcessFacts* out) {
  if (pid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/status", pid);
  FILE* f = std::fopen(path, "re");
  if (!f) return false;
  char line[256];
  bool have_uid = false;
  while (std::fgets(line, sizeof line, f)) {
    unsigned r = 0, e = 0;
    if (std::sscanf(line, "Uid: %u %u", &r, &e) == 2) {
      out->ruid = r;
      out->euid = e;
      have_uid = true;
      break;
    }
  }
  std::fclose(f);
  if (!have_uid) return false;
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  char* p = std::strrchr(buf, ')');
  if (!p) return false;
  ++p;
  for (int field = 3; field < 22; ++field) {
    while (*p == ' ') ++p;
    while (*p && *p != ' ') ++p;
    if (!*p) return false;
  }
  out->start_ticks = std::strtoull(p, nullptr, 10);
  return true;
}

uint64_t own_start_ticks() {
  // Cached per pid: a forked child has a start time of its own.
  static std::atomic<uint64_t> cached{0};
  static std::atomic<int32_t> cached_pid{0};
  int32_t me = static_cast<int32_t>(getpid());
  if (cached_pid.load(std::memory_order_acquire) == me) return cached.load(std::memory_order_relaxed);
  ProcessFacts f{};
  uint64_t t = process_facts(me, &f) ? f.start_ticks : 0;
  cached.store(t, std::memory_order_relaxed);
  cached_pid.store(me, std::memory_order_release);
  return t;
}

uint64_t boottime_ns() {
  timespec t{};
  clock_gettime(CLOCK_BOOTTIME, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000 + static_cast<uint64_t>(t.tv_nsec);
}

uint64_t tick_ns() {
  static const uint64_t ns = [] {
    long hz = sysconf(_SC_CLK_TCK);
    return static_cast<uint64_t>(1000000000 / (hz > 0 ? hz : 100));
  }();
  return ns;
}

}  // namespace softrdma::net
