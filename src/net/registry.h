// Host-local registry (docs/architecture.md, "Devices and addressing"): host-unique 24-bit QPNs, and for each QPN the owning process and
// the UDP endpoint that reaches it.
//
// It lives in shared-memory files, one per user and network namespace (net/user_files.h):
//   /dev/shm/softrdma-registry-<inode of /proc/self/ns/net>-u<euid>
// Each user writes only its own file (mode 0644) and reads everyone's, so no local user can rewrite or
// erase another's entries. The environment variable SOFTRDMA_REGISTRY overrides the base name (an
// absolute path, or a bare name taken under /dev/shm), e.g. to isolate tests.
//
// Layout of a file: a header and 1<<16 slots of four 64-bit atomics. A QPN can only live in slot
// (QPN & 0xFFFF) of some user's file. Allocation claims a slot of the own file with compare-and-swap
// after checking that no other user's file holds that QPN, and checks again afterwards (two users
// racing for one QPN both back off). A lookup reads that slot of the own file, then of the others'.
// Another user's entry counts only if the kernel vouches for it: its pid is alive, runs as that user
// and started when the entry says (/proc/PID/status, /proc/PID/stat). When two users' files claim one
// QPN, the earlier claim (CLOCK_BOOTTIME, counted from no earlier than the end of the claimant's
// verified start tick) wins, so a process started after a QPN was claimed cannot take it over; a
// lookup trusts its own user's file first. Liveness of owners is judged with
// kill(pid, 0) and /proc, so all users must share a PID namespace (and a /proc of it).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "net/interfaces.h"  // netns_inode()
#include "net/user_files.h"
#include "wire/ip_address.h"

namespace softrdma::net {

struct Endpoint {
  uint32_t ip_key;  // the context's address, as wire::IpAddress::key() names it
  uint16_t port;  // host-order UDP port
  int32_t pid;
};

class Registry {
 public:
  static constexpr uint32_t kCapacity = 1u << 16;

  // This network namespace's registry, opened on first use and never closed (so it stays usable from
  // exit-time destructors). Throws std::system_error if the file cannot be opened or mapped.
  static Registry& instance();
  // Base path instance() uses: $SOFTRDMA_REGISTRY or /dev/shm/softrdma-registry-<netns inode>; the
  // files are <base>-u<uid>.
  static std::string default_path();

  // Opens (creating this user's file if needed) the registry at an explicit base path. Throws
  // std::system_error, or std::runtime_error when the file holds an incompatible layout.
  explicit Registry(const std::string& path);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // A random QPN (never 0, 1 or 0xFFFFFF) now owned by this process, reachable at (ip, port).
  // Reuses entries of dead processes. Returns 0 if the registry is full.
  uint32_t allocate_qpn(const wire::IpAddress& ip, uint16_t port);
  // Frees qpn if this process (current pid) owns it; otherwise does nothing (a forked child cannot free
  // its parent's QPNs).
  void release_qpn(uint32_t qpn);
  std::optional<Endpoint> lookup(uint32_t qpn) const;
  // Frees every entry of this user's file whose owner no longer exists; returns how many. (Other
  // users' dead entries are theirs to free; lookups and allocation already ignore them.)
  size_t reclaim_dead();
  // All entries lookup() would return, ordered by QPN.
  std::vector<std::pair<uint32_t, Endpoint>> entries() const;

  const std::string& path() const { return path_; }                // the base path
  const std::string& own_path() const { return files_->own_path(); }  // this user's file

  // What lookups met from other users' files, since this object was opened.
  struct Stats {
    uint64_t conflicts = 0;      // a QPN claimed in two users' files (one of them lying or racing)
    uint64_t refused = 0;        // entries the kernel does not vouch for (pid gone, other uid, restarted)
    uint64_t files_refused = 0;  // files under the registry's name refused (owner, mode, size, links)
  };
  Stats stats() const;

  struct Slot {
    std::atomic<uint64_t> tag;       // QPN | state | generation | owner pid, see registry.cpp
    std::atomic<uint64_t> endpoint;  // ip key << 32 | port
    std::atomic<uint64_t> claim_ns;  // CLOCK_BOOTTIME when claimed
    std::atomic<uint64_t> start;     // the owner's start time, clock ticks since boot (/proc/PID/stat)
  };

  struct Raw {  // a slot as read from another user's file
    uint64_t tag, endpoint, claim_ns, start;
  };

 private:
  struct Verdict {
    Raw raw;
    uint64_t checked_ns;
    bool valid;
  };
  // Callers hold files_->mu().
  std::optional<Endpoint> lookup_others(uint32_t qpn) const;
  bool taken_elsewhere(uint32_t qpn) const;
  bool vouched(const UserFiles::Other& o, uint32_t index, const Raw& r) const;

  std::string path_;
  std::unique_ptr<UserFiles> files_;
  Slot* slots_ = nullptr;
  mutable std::unordered_map<uint64_t, Verdict> verdicts_;  // bounded cache, see vouched()
  // What other users' files said about a QPN, for a millisecond: a UD requester looks its destination
  // up on every send, and a miss (a QPN of another host) would otherwise read every user's file.
  struct Recent {
    uint32_t qpn = 0xFFFFFFFF;
    bool found = false;
    Endpoint ep{};
    uint64_t until_ns = 0;
  };
  mutable std::vector<Recent> recent_;
  mutable Stats stats_;
};

}  // namespace softrdma::net
