// Host-local table of iWARP connections for the intra-host direct path (docs/iwarp.md, "Direct
// path"): each end of a TCP connection that rdma_cm runs publishes its 4-tuple with its QPN before it
// sends its MPA frame; the other end, after receiving that frame, looks the reverse tuple up and, when
// it finds a live softrdma process there, connects the two QPs through the direct path.
//
// Same conventions as the QPN registry (registry.h): shared-memory files per user and network namespace,
//   /dev/shm/softrdma-tuples-<inode of /proc/self/ns/net>-u<euid>   ($SOFTRDMA_TUPLES overrides the
// base, as $SOFTRDMA_REGISTRY does; net/user_files.h), each written only by its user, fixed slots
// claimed by compare-and-swap, owners' liveness by kill(pid, 0). A lookup trusts its own user's file;
// another user's entry for a tuple counts only if the kernel lists a TCP socket with that 4-tuple
// owned by that user (/proc/net/tcp), so nobody can pair someone else's connection with a QPN of theirs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "net/user_files.h"

namespace softrdma::net {

// One direction of a TCP connection, addresses and ports in network order.
struct TcpTuple {
  uint32_t local_ip_be = 0, remote_ip_be = 0;
  uint16_t local_port_be = 0, remote_port_be = 0;
  TcpTuple reversed() const { return {remote_ip_be, local_ip_be, remote_port_be, local_port_be}; }
  bool operator==(const TcpTuple&) const = default;
};

class TupleTable {
 public:
  static constexpr uint32_t kSlots = 1u << 12;
  static constexpr uint32_t kProbe = 64;  // slots looked at from a tuple's home slot

  static TupleTable& instance();  // this namespace's table, opened on first use, never closed
  static std::string default_path();
  explicit TupleTable(const std::string& path);  // throws std::system_error / std::runtime_error
  ~TupleTable();
  TupleTable(const TupleTable&) = delete;
  TupleTable& operator=(const TupleTable&) = delete;

  // Publishes t -> qpn for this process; false when the probe window is full of live entries.
  bool publish(const TcpTuple& t, uint32_t qpn);
  void remove(const TcpTuple& t);  // this process's entry for t, if any
  // The QPN a live process published for t.
  std::optional<uint32_t> lookup(const TcpTuple& t) const;
  const std::string& own_path() const { return files_->own_path(); }
  // Other users' entries for a looked-up tuple refused: no TCP socket of theirs has that 4-tuple.
  uint64_t refused() const;

  struct Slot {
    std::atomic<uint64_t> tag;    // state | generation | pid, see tuple_table.cpp
    std::atomic<uint64_t> addrs;  // local ip << 32 | remote ip
    std::atomic<uint64_t> ports;  // local port << 48 | remote port << 32 | qpn
    uint64_t pad;
  };

 private:
  std::unique_ptr<UserFiles> files_;
  Slot* slots_ = nullptr;
  mutable uint64_t refused_ = 0;  // under files_->mu()
};

}  // namespace softrdma::net
