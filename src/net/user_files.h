// Per-user shared-memory files, the storage under the QPN registry (registry.h) and the iWARP tuple
// table (tuple_table.h). A host-wide file that every user may write lets any local user rewrite who
// owns what, so each user writes only a file of its own,
//   <base>-u<euid>        (or <base>-u<euid>.<k>, k < kMaxSuffix, when that name is taken by someone else)
// created 0644: its owner maps it read-write, everyone else reads it with pread (never mmap: its owner
// could truncate it under a reader's mapping and kill the reader with SIGBUS). A reader accepts a file
// only if it is a regular file (opened O_NOFOLLOW) owned by the uid its name says, writable by nobody
// else (no group/other write bit), of the expected size and initialised with the expected header.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace softrdma::net {

class UserFiles {
 public:
  static constexpr int kMaxSuffix = 16;

  // The start of every file: magic (stored last, when the file is ready), version, length.
  struct Header {
    uint64_t magic;
    uint64_t version;
    uint64_t length;
  };

  struct Other {
    uint32_t uid;
    int fd;
    dev_t dev;
    ino_t ino;
  };

  // Opens (creating and initialising if needed) this user's file for base; throws std::system_error, or
  // std::runtime_error when the file holds another layout or no name is usable.
  UserFiles(std::string base, size_t length, uint64_t magic, uint64_t version);
  ~UserFiles();
  UserFiles(const UserFiles&) = delete;
  UserFiles& operator=(const UserFiles&) = delete;

  uint8_t* own() const { return map_; }  // read-write mapping of this user's file (header included)
  uint32_t own_uid() const { return uid_; }
  const std::string& own_path() const { return own_path_; }

  // Guards others() and refresh(); lookups from several threads share one UserFiles.
  std::mutex& mu() const { return mu_; }
  // Re-reads the directory if it may have changed since the last scan (its mtime, size or inode moved,
  // or the last scan raced a change); returns whether the set of other files changed. Caller holds mu().
  // strict (allocation): a racy window rescans every time; otherwise at most every 10 ms.
  bool refresh(bool strict = false);
  const std::vector<Other>& others() const { return others_; }
  // Files seen and refused (wrong owner, symlink, writable by others, wrong size or header), all scans.
  uint64_t rejected() const { return rejected_; }

  // Reads n bytes at off twice and returns true only if both reads agree: the owner may be writing the
  // same bytes, and a pread copies them in no defined order.
  static bool read_stable(int fd, off_t off, void* buf, size_t n);

  // The uid this file name belongs to, if it is <base_name>-u<uid>[.<k>]; -1 otherwise.
  static int64_t uid_of_name(const std::string& base_name, const char* name);

 private:
  void scan();

  std::string base_, dir_, base_name_, own_path_;
  size_t length_;
  uint64_t magic_, version_;
  uint32_t uid_;
  uint8_t* map_ = nullptr;
  dev_t own_dev_ = 0;
  ino_t own_ino_ = 0;

  mutable std::mutex mu_;
  std::vector<Other> others_;
  bool scanned_ = false, racy_ = false, recent_change_ = false, pending_ = false;
  uint64_t last_scan_ns_ = 0;
  struct timespec dir_mtime_{};
  off_t dir_size_ = 0;
  ino_t dir_ino_ = 0;
  uint64_t rejected_ = 0;
};

// Facts about a process that the kernel vouches for (/proc); false when it is gone or unreadable.
struct ProcessFacts {
  uint32_t ruid, euid;
  uint64_t start_ticks;  // /proc/PID/stat field 22: clock ticks since boot
};
bool process_facts(int32_t pid, ProcessFacts* out);
// This process's start time in clock ticks since boot (cached).
uint64_t own_start_ticks();
// CLOCK_BOOTTIME in nanoseconds.
uint64_t boottime_ns();
// Nanoseconds per clock tick of /proc/PID/stat.
uint64_t tick_ns();

}  // namespace softrdma::net
