// Registered memory made shareable with other processes of this host, for the intra-host direct path
// (docs/direct-path.md). One table per process: a "share" is a page-aligned range of this
// address space backed by a file that a peer can map, with the file offset where the range starts.
//
// - Private anonymous memory (heap, mmap, THP) is moved in place, at the same address, onto a new
//   memfd: contents copied, the memfd mapped MAP_SHARED|MAP_FIXED over the range. Undone when
//   the last MR on them goes, and in a forked child (which gets private copies, as of pinned pages).
// - Memory already backed by a shared file (a /dev/shm file, a memfd, MAP_SHARED|MAP_ANONYMOUS) is
//   exported as it is, through /proc/self/map_files.
// - Anything else (the stack, private file mappings, hugetlbfs, read-only memory, a range that only
//   partly overlaps an existing share) is not shared: its MRs are reached by packets.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace softrdma::transport {

struct ShareInfo {
  uint64_t id = 0;        // never reused within a process; 0 = none
  uint64_t base = 0;      // first byte of the range in the owner's address space (page-aligned)
  uint64_t length = 0;    // bytes (whole pages)
  uint64_t file_off = 0;  // offset of base in the file
};

class ShareTable {
 public:
  static ShareTable& instance();

  // Makes the pages of [addr, addr+len) shareable; returns the share id, 0 when they cannot be.
  // remote_write: the MR grants REMOTE_WRITE or REMOTE_ATOMIC (peers may get a writable mapping).
  // The caller must keep its own threads from writing those pages meanwhile (see the .cpp).
  uint64_t acquire(uint64_t addr, uint64_t len, bool remote_write);
  void release(uint64_t id, bool remote_write);
  // A new fd of share id (read-only unless writable is asked and granted) and its geometry; -1 when
  // the share is gone or write is asked and no live MR on it grants it. Every share's file is sealed
  // against changes of size; one that no MR granted remote write when it was made is sealed against
  // writing too (F_SEAL_FUTURE_WRITE), and only such a share is handed out read-only to a peer that may
  // not write it (may_write false): any fd of an unsealed file can be reopened writable.
  int open_fd(uint64_t id, bool writable, bool may_write, ShareInfo* info);

 private:
  void after_fork_in_child();
  struct Entry {
    ShareInfo info;
    bool moved;  // moved onto our memfd (else exported as it was)
    bool write_sealed;  // nobody can map its file writable any more (F_SEAL_FUTURE_WRITE or F_SEAL_WRITE)
    int fd;
    uint32_t refs;
    uint32_t writable_refs;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
  uint64_t next_id_ = 1;
};

}  // namespace softrdma::transport
