// Host-local registry (DESIGN §4): host-unique 24-bit QPNs, and for each QPN the owning process and
// the UDP endpoint that reaches it.
//
// It lives in a shared-memory file, one per network namespace:
//   /dev/shm/softrdma-registry-<inode of /proc/self/ns/net>
// The environment variable SOFTRDMA_REGISTRY overrides it (an absolute path, or a bare name taken under
// /dev/shm), e.g. to isolate tests.
//
// Layout: a header and 1<<16 slots, each two 64-bit atomics. A QPN can only live in slot (QPN & 0xFFFF),
// so uniqueness needs no locks: allocation claims a slot with compare-and-swap, lookups are one slot read.
// Liveness of owners is judged with kill(pid, 0), so all users must share a PID namespace.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "net/interfaces.h"  // netns_inode()

namespace softrdma::net {

struct Endpoint {
  uint32_t ip_be;
  uint16_t port;  // host-order UDP port
  int32_t pid;
};

class Registry {
 public:
  static constexpr uint32_t kCapacity = 1u << 16;

  // This network namespace's registry, opened on first use and never closed (so it stays usable from
  // exit-time destructors). Throws std::system_error if the file cannot be opened or mapped.
  static Registry& instance();
  // Path instance() uses: $SOFTRDMA_REGISTRY or /dev/shm/softrdma-registry-<netns inode>.
  static std::string default_path();

  // Opens (creating it if needed) the registry at an explicit path. Throws std::system_error, or
  // std::runtime_error when the file holds an incompatible layout.
  explicit Registry(const std::string& path);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // A random QPN (never 0, 1 or 0xFFFFFF) now owned by this process, reachable at (ip_be, port).
  // Reuses entries of dead processes. Returns 0 if the registry is full.
  uint32_t allocate_qpn(uint32_t ip_be, uint16_t port);
  // Frees qpn if this process (current pid) owns it; otherwise does nothing (a forked child cannot free
  // its parent's QPNs).
  void release_qpn(uint32_t qpn);
  std::optional<Endpoint> lookup(uint32_t qpn) const;
  // Frees every entry whose owner no longer exists; returns how many.
  size_t reclaim_dead();
  // All live entries, ordered by QPN.
  std::vector<std::pair<uint32_t, Endpoint>> entries() const;

  const std::string& path() const { return path_; }

  struct Slot {
    std::atomic<uint64_t> tag;       // QPN | state | generation | owner pid, see registry.cpp
    std::atomic<uint64_t> endpoint;  // ip_be << 32 | port
  };

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_len_ = 0;
  Slot* slots_ = nullptr;
};

}  // namespace softrdma::net
