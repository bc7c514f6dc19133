// The intra-host direct path (DESIGN §5, docs/direct-path.md): for an RC QP whose peer QP belongs to
// another context on this host, the requester executes RDMA WRITE, READ and ATOMIC itself, on the
// peer's memory mapped into this process, with the checks the peer's responder would make.
//
// Each context (Engine) has one DirectEndpoint. As a target it publishes, in its shared arena, a
// DirectShared block: a seqlock over its key table, the state of each of its QPs, and one slot per
// connected initiator process that says when that process is inside a copy. A server thread answers
// initiators on an abstract Unix socket: it passes the arena's fd and the fds of registered memory
// (SCM_RIGHTS; read-only unless an MR on it grants remote write). As an initiator it keeps one
// DirectPeer per target context.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/arena.h"
#include "core/limits.h"
#include "core/mr.h"
#include "transport/qp.h"

namespace softrdma::transport {

// On by default; off when SOFTRDMA_DIRECT=0, and by default when SOFTRDMA_IMPAIR asks for packet faults
// (those tests are about the packet path). Read when a context is created.
bool direct_enabled();

struct DirectQpDesc {
  std::atomic<uint32_t> qpn;     // 0: free
  std::atomic<uint32_t> state;   // QpState
  std::atomic<uint32_t> access;  // the QP's remote access flags
  std::atomic<uint32_t> pd;
};

struct DirectPeerSlot {
  std::atomic<int32_t> pid;    // 0: free
  std::atomic<uint32_t> busy;  // 1 while that initiator may be copying to or from our memory
};

struct DirectShared {
  static constexpr uint32_t kMagic = 0x44495231;  // "DIR1"
  static constexpr uint32_t kPeers = 256;
  static constexpr uint32_t kQps = core::DeviceLimits::kMaxQp;
  uint32_t magic;
  uint32_t layout;            // sizeof(MrRegion) etc.: both sides must agree
  uint64_t key_table_off;     // arena offsets of the key table and of its sequence number
  uint64_t key_seq_off;
  alignas(64) DirectPeerSlot peers[kPeers];
  DirectQpDesc qps[kQps];
};

class DirectPeer;

class DirectEndpoint {
 public:
  // The context's arena and key table (in it), and its address in the registry (names our socket).
  // Throws std::system_error when the socket or the arena block cannot be had.
  DirectEndpoint(core::Arena& arena, const core::MrTable& keys, uint32_t ip_be, uint16_t port);
  ~DirectEndpoint();
  DirectEndpoint(const DirectEndpoint&) = delete;
  DirectEndpoint& operator=(const DirectEndpoint&) = delete;

  // --- as a target (all under the engine lock) ---
  void qp_created(Qp& qp);
  void qp_changed(const Qp& qp);
  void qp_destroyed(Qp& qp);
  // After a key was removed from the table: returns once no initiator can still be copying with it.
  void wait_copies();

  // --- as an initiator (under the engine lock) ---
  // Connects qp to its peer (dest_qpn at dest_ip_be owned by the process pid at port), or drops the
  // connection when the peer is not another context on this host that serves the direct path.
  void attach(Qp& qp, int32_t pid, uint16_t port);
  void detach(Qp& qp);

  enum class Result { Done, Fallback };
  // Executes a one-sided WQE (WRITE, READ, ATOMIC) of qp on its peer's memory; host: the WQE's local
  // SGEs, already resolved. Fallback: anything the peer's responder would refuse or that this path
  // cannot do; the packet path then gives exactly the wire's answer.
  Result execute(Qp& qp, SqEntry& e, uint64_t now);

  // One request on the endpoint's socket (the reply may carry an fd).
  struct Request {
    uint32_t type;
    uint32_t writable;
    uint64_t arg;
  };

 private:
  void serve();
  void handle_client(int k, const Request& req);

  core::Arena& arena_;
  DirectShared* shared_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  std::thread server_;
  std::vector<int> clients_;  // server thread only
  std::vector<int32_t> client_slot_;
  std::unordered_map<uint64_t, std::shared_ptr<DirectPeer>> peers_;  // by (port << 32 | ip)
  std::vector<uint32_t> free_descs_;
};

}  // namespace softrdma::transport
