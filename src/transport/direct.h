// The intra-host direct path (DESIGN §5, docs/direct-path.md): for an RC QP whose peer QP belongs to
// another context on this host, the requester executes RDMA WRITE, READ and ATOMIC itself, on the
// peer's memory mapped into this process, with the checks the peer's responder would make. A SEND (and
// the receive half of WRITE_WITH_IMM) goes into an inbox in the peer's arena, but only once the
// initiator has seen a receive WQE there that will take it; the peer's engine places it into that WQE
// and writes the CQE when its application polls, or when woken because the CQ is armed.
//
// Each context (Engine) has one DirectEndpoint. As a target it publishes, in its shared arena, a
// DirectShared block: a seqlock over its key table, the state of each of its QPs. Peers map the arena
// read-only; what they write lives in a second memfd, the writable area: one slot per connected
// initiator process that says when that process is inside a copy, the inboxes, and the CQ arm words. A server thread answers
// initiators on an abstract Unix socket: it passes the arena's fd and the fds of registered memory
// (SCM_RIGHTS; read-only unless an MR on it grants remote write). As an initiator it keeps one
// DirectPeer per target context.
//
// Local trust (docs/security.md): the server answers only a client whose SO_PEERCRED passes
// SOFTRDMA_DIRECT_PEERS (default: our uid, or root) and that names a QP connection we take part in:
// (our QPN, its QPN) with our RC QP in RTR/RTS/SQD towards its QPN, and the registry's owner of its QPN
// being the client's pid. Share fds only for an rkey that grants the access asked, in the PD of such a
// QP; wake-up pipes only for such QPs. Everything else is refused (EPERM, EAGAIN while our QP is not yet
// in RTR towards it) and counted (direct_refused).
#pragma once
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "config/config.h"
#include "core/arena.h"
#include "core/limits.h"
#include "core/mr.h"
#include "core/stats.h"
#include "transport/qp.h"

namespace softrdma::transport {

struct DirectQpDesc {
  // Changed only by ibv_modify_qp and friends: stays in the initiator's cache.
  alignas(64) std::atomic<uint32_t> qpn;  // 0: free
  std::atomic<uint32_t> state;            // QpState
  std::atomic<uint32_t> access;           // the QP's remote access flags
  std::atomic<uint32_t> pd;
  // Two-sided operations: the QP's inbox (arena offset; 0: none, SENDs go by packets), its receive
  // queue ring, the arm state of its receive CQ, and a generation that moves at each reset (an
  // initiator then forgets what it knew of the receive queue).
  std::atomic<uint32_t> generation;
  std::atomic<uint32_t> rq_mask;
  std::atomic<uint64_t> inbox_off;
  std::atomic<uint64_t> rq_ring_off;
  std::atomic<uint64_t> recv_cq_arm_off;
  // Moved by each ibv_post_recv and each message received; an initiator reads them only when what it
  // knows runs out. The receive queue's consumer index (low 32 bits) and the inbox entries consumed
  // (high 32) share one word: a consistent pair says which RQ WQE the next message takes.
  alignas(64) std::atomic<uint64_t> rq_head;
  std::atomic<uint64_t> tails;
};

// A SEND, SEND_WITH_IMM or the immediate of a WRITE_WITH_IMM, waiting for the target's engine: one
// cache line, small payloads inside it.
struct DirectInboxEntry {
  static constexpr uint32_t kInlineBytes = 40;
  std::atomic<uint32_t> stamp;  // low 32 bits of (its index + 1), written last: the entry is there
  uint32_t op;                  // DirectInbox::kSend...
  uint32_t length;              // payload bytes (SEND) or bytes the WRITE placed (WRITE_WITH_IMM)
  uint32_t imm_be;
  uint32_t solicited;
  uint32_t pad;
  uint8_t inline_data[kInlineBytes];
};
static_assert(sizeof(DirectInboxEntry) == 64);

// One per connected RC QP (target side), in the arena. One producer: the peer QP's requester (under
// its engine lock); one consumer: this QP's engine. Larger payloads follow each other in a byte ring.
struct DirectInbox {
  static constexpr uint32_t kEntries = 256;
  static constexpr uint32_t kDataBytes = 256 * 1024;
  static constexpr uint32_t kMaxMessage = 64 * 1024;  // larger SENDs go by packets
  enum : uint32_t { kSend = 1, kSendImm = 2, kWriteImm = 3 };
  alignas(64) uint64_t head;     // entries published (initiator's)
  uint64_t data_head;            // next payload byte in data (initiator's)
  alignas(64) std::atomic<uint64_t> data_tail;  // payload bytes consumed (target)
  alignas(64) DirectInboxEntry entries[kEntries];
  alignas(64) uint8_t data[kDataBytes];
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
  uint64_t peers_off;         // offset of DirectPeerSlot[kPeers] in the writable area
  // inbox_off and recv_cq_arm_off of each descriptor are offsets in the writable area too.
  alignas(64) DirectQpDesc qps[kQps];
};

class DirectPeer;

class DirectEndpoint {
 public:
  // The context's arena and key table (in it), and its address in the registry (names our socket).
  // Throws std::system_error when the socket or the arena block cannot be had.
  // doorbell_fd: the engine's eventfd; the server thread writes it when an initiator rings (kRing) for a
  // SEND it left for an armed CQ (initiators never get it).
  // counters: the context's device counters (the server thread adds direct_refused there, atomically).
  DirectEndpoint(core::Arena& arena, const core::MrTable& keys, uint32_t ip_be, uint16_t port, int doorbell_fd,
                 core::Counters* counters);
  ~DirectEndpoint();
  DirectEndpoint(const DirectEndpoint&) = delete;
  DirectEndpoint& operator=(const DirectEndpoint&) = delete;

  // --- as a target (all under the engine lock) ---
  void qp_created(Qp& qp);
  void qp_changed(Qp& qp);
  // Its remote access flags changed, not its state: published; a right taken away binds every copy
  // that starts after this returns.
  void qp_access_changed(Qp& qp);
  void qp_destroyed(Qp& qp);  // then the engine places what is left in the inbox, and releases it:
  void release_inbox(Qp& qp);
  // The QP's inbox, once it is connected (RC without SRQ): where initiators put SENDs.
  DirectInbox* inbox(const Qp& qp) const { return qp.direct.inbox; }
  // Mirrors of the receive queue's indices for initiators: after ibv_post_recv, and after the RQ's
  // consumer index or the inbox's consumed count moved.
  void publish_rq_head(const Qp& qp, uint64_t head) {
    if (qp.direct.desc != ~0u) shared_->qps[qp.direct.desc].rq_head.store(head, std::memory_order_release);
  }
  void publish_tails(const Qp& qp) {
    if (qp.direct.desc == ~0u) return;
    uint64_t t = static_cast<uint32_t>(qp.rq.tail.load(std::memory_order_relaxed)) |
                 static_cast<uint64_t>(qp.direct.inbox_tail) << 32;
    shared_->qps[qp.direct.desc].tails.store(t, std::memory_order_release);
  }
  // After a key was removed from the table: returns once no initiator can still be copying with it.
  void wait_copies();
  // The area peers may write (inboxes, busy slots, CQ arm words): CQs take their arm word from it.
  std::shared_ptr<core::Arena> writable_area() const { return rw_; }
  static constexpr size_t kWritableBytes = size_t{1} << 30;  // sparse, like the arena

  // --- as an initiator (under the engine lock) ---
  // Connects qp to its peer (dest_qpn at dest_ip_be owned by the process pid at port), or drops the
  // connection when the peer is not another context on this host that serves the direct path.
  void attach(Qp& qp, int32_t pid, uint16_t port);
  void detach(Qp& qp);

  enum class Result { Done, Fallback };
  // Executes a WQE of qp on its peer: WRITE, READ or ATOMIC on the peer's memory, SEND(_IMM) and
  // WRITE_WITH_IMM also into its inbox; e.host: the WQE's local SGEs, already resolved. Fallback:
  // anything the peer's responder would refuse or answer with RNR, or that this path cannot do; the
  // packet path then gives exactly the wire's answer.
  Result execute(Qp& qp, SqEntry& e, uint64_t now);

  // One request on the endpoint's socket (the reply may carry an fd).
  struct Request {
    uint32_t type;
    uint32_t writable;
    uint64_t arg;
  };

  // Who may talk to our server at all (SOFTRDMA_DIRECT_PEERS, read per context).
  using PeerPolicy = config::DirectPeers;
  static PeerPolicy peer_policy();

 private:
  // One client of the server thread: its credentials and the QP connections it proved.
  struct Client {
    int fd;
    int32_t slot;  // its busy slot; -1 until a kHello was admitted
    int32_t pid;
    uid_t uid;
    // Our QPs connected to it: descriptor, QPN and its QPN (a descriptor reused by another QP is not).
    struct Conn {
      uint32_t desc, qpn, peer_qpn;
    };
    std::vector<Conn> descs;
  };
  static constexpr size_t kMaxClients = 4096;
  static constexpr size_t kMaxIdlePerUid = 64;  // connections of one user not (yet) admitted
  // What the server thread may rely on for a QP (not the arena: peers can write that): kept under gate_mu_.
  struct Gate {
    uint32_t qpn = 0;  // 0: none
    uint32_t dest_qpn = 0;
    uint32_t state = 0;  // QpState
    uint32_t pd = 0;
    uint32_t access = 0;
    int32_t peer_pid = 0;  // the local process its peer QP belonged to at RTR (0: none here)
  };
  void serve();
  void handle_client(Client& c, const Request& req);
  bool credentials_pass(int fd, int32_t* pid);
  // 0 and the descriptor when our QP target_qpn is connected to initiator_qpn, owned by c; else an errno.
  int admit(Client& c, uint32_t target_qpn, uint32_t initiator_qpn, uint32_t* desc);
  bool connected_desc(const Client& c, uint32_t target_qpn, uint32_t* desc);
  // Under gate_mu_: the descriptor still holds that connection, live.
  bool still_connected(const Client::Conn& k) const;
  void refused() { __atomic_fetch_add(&counters_->direct_refused, 1, __ATOMIC_RELAXED); }
  void publish_gate(const Qp& qp);
  // The initiator's half of attach (a connection, the peer QP's descriptor); EAGAIN: try again later.
  int connect_peer(Qp& qp);

  core::Arena& arena_;
  std::shared_ptr<core::Arena> rw_;
  int ro_fd_ = -1;  // the arena's memfd reopened read-only: what peers get
  DirectPeerSlot* slots_ = nullptr;  // in rw_: one per connected initiator process
  // The pid of the client each slot was given to (0: free): set and cleared by the server thread, read
  // by wait_copies. Never the slot's own pid word, which peers can write.
  std::atomic<int32_t> slot_pid_[DirectShared::kPeers];
  const core::MrTable& keys_;
  core::Counters* counters_;
  PeerPolicy policy_;
  int doorbell_fd_;
  DirectShared* shared_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  std::thread server_;
  std::vector<Client> clients_;  // server thread only
  std::mutex gate_mu_;
  Gate gate_[DirectShared::kQps];
  std::unordered_map<uint64_t, std::shared_ptr<DirectPeer>> peers_;  // by (port << 32 | ip)
  std::vector<uint32_t> free_descs_;
  // Per QP descriptor: a dup of its receive CQ channel's wake-up pipe (-1: none), handed to a connected
  // initiator (kWake). The mutex keeps the server thread from passing one that is being closed.
  std::mutex wake_mu_;
  int wake_fds_[DirectShared::kQps];
};

}  // namespace softrdma::transport
