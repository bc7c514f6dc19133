// Shared-memory counter pages (stats.h): one owner-only file per context under /dev/shm.
#include "core/stats.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace softrdma::core {

namespace {
constexpr const char* kDir = "/dev/shm";
constexpr const char* kPrefix = "softrdma-stats-";
std::atomic<uint32_t> g_serial{0};
}  // namespace

const std::vector<const char*>& counter_names() {
  static const std::vector<const char*> names = {
#define SOFTRDMA_NAME(name) #name,
      SOFTRDMA_COUNTERS(SOFTRDMA_NAME)
#undef SOFTRDMA_NAME
  };
  return names;
}

namespace {
mode_t stats_mode(std::optional<uint32_t> m) {
  // Owner only unless widened: counters reveal QPNs, peers and traffic volumes.
  if (!m) return 0600;
  // No write bits for anyone else, nothing beyond rwx: a page others could write would lie to readers.
  return static_cast<mode_t>((*m & 0644) | 0600);
}
}  // namespace

StatsPage::StatsPage(const std::string& device, std::optional<uint32_t> mode) {
  path_ = std::string(kDir) + "/" + kPrefix + std::to_string(getpid()) + "-" + std::to_string(g_serial++);
  // O_EXCL | O_NOFOLLOW: a file or symlink planted under our name must not be written through. A
  // leftover of our own (an earlier process with this pid) is removed first; anyone else's stays, and
  // then counting stays private.
  int fd = open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    struct stat st{};
    if (lstat(path_.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) {
      unlink(path_.c_str());
      fd = open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    }
  }
  if (fd >= 0 && fchmod(fd, stats_mode(mode)) != 0) {
    close(fd);
    unlink(path_.c_str());
    fd = -1;
  }
  void* m = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, sizeof(Page)) == 0)
    m = mmap(nullptr, sizeof(Page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fd >= 0) close(fd);
  if (m == MAP_FAILED) {
    // Counting must work even where /dev/shm does not: keep them private then.
    if (fd >= 0) unlink(path_.c_str());
    path_.clear();
    m = mmap(nullptr, sizeof(Page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  } else {
    shared_ = true;
  }
  page_ = static_cast<Page*>(m);
  page_->version = kVersion;
  page_->pid = getpid();
  std::strncpy(page_->device_name, device.c_str(), sizeof page_->device_name - 1);
  __atomic_store_n(&page_->magic, kMagic, __ATOMIC_RELEASE);
}

StatsPage::~StatsPage() {
  if (shared_) unlink(path_.c_str());
  munmap(page_, sizeof(Page));
}

Counters* StatsPage::attach_qp(uint32_t qpn) {
  for (QpStatsSlot& s : page_->qps) {
    if (s.qpn) continue;
    std::memset(&s.counters, 0, sizeof s.counters);
    s.dest_qpn = 0;
    __atomic_store_n(&s.qpn, qpn, __ATOMIC_RELEASE);
    return &s.counters;
  }
  return nullptr;
}

void StatsPage::set_dest(uint32_t qpn, uint32_t dest_qpn) {
  for (QpStatsSlot& s : page_->qps)
    if (s.qpn == qpn) s.dest_qpn = dest_qpn;
}

void StatsPage::detach_qp(uint32_t qpn) {
  for (QpStatsSlot& s : page_->qps)
    if (s.qpn == qpn) __atomic_store_n(&s.qpn, 0u, __ATOMIC_RELEASE);
}

size_t StatsPage::page_size() { return sizeof(Page); }

std::vector<StatsPage::Snapshot> StatsPage::read_all() {
  std::vector<Snapshot> out;
  DIR* d = opendir(kDir);
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, kPrefix, std::strlen(kPrefix)) != 0) continue;
    std::string path = std::string(kDir) + "/" + e->d_name;
    pid_t pid = static_cast<pid_t>(std::atol(e->d_name + std::strlen(kPrefix)));
    if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH)) {
      unlink(path.c_str());  // left behind by a process that died: reclaim it
      continue;
    }
    // Another user's page is unreadable (0600) unless its owner widened SOFTRDMA_STATS_MODE; root reads
    // them all.
    int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    // Any local user can leave a file here, and older builds wrote smaller pages. Copied with pread,
    // not mapped: a mapping of a file its owner truncates raises SIGBUS in the reader.
    struct stat st{};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) != sizeof(Page)) {
      close(fd);
      continue;
    }
    auto copy = std::make_unique<Page>();
    const ssize_t n = pread(fd, copy.get(), sizeof(Page), 0);
    close(fd);
    if (n != static_cast<ssize_t>(sizeof(Page))) continue;
    const Page* p = copy.get();
    if (p->magic == kMagic && p->version == kVersion) {
      Snapshot s;
      s.pid = p->pid;
      s.device.assign(p->device_name, strnlen(p->device_name, sizeof p->device_name));
      s.device_counters = p->device;
      for (const QpStatsSlot& q : p->qps)
        if (q.qpn) s.qps.push_back(q);
      out.push_back(std::move(s));
    }
  }
  closedir(d);
  return out;
}

}  // namespace softrdma::core
