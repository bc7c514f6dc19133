// A queue pair as the transport sees it: attributes, the send queue of WQEs with their PSN ranges, the
// receive queue, and the transport state of each role in its own sub-struct -- requester, completer,
// responder (expected PSN, MSN, the message being received, the READ/ATOMIC replay cache) and the
// intra-host direct path -- and the path the QP has joined, with that path's own state of it (path.h).
// All of it is owned by one Engine and touched only under its lock, except
// the SQ/RQ producer sides, which applications fill under the queues' own locks.
#pragma once
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/cq.h"
#include "core/limits.h"
#include "core/qp_state.h"
#include "core/spin_lock.h"
#include "core/stats.h"
#include "transport/path.h"
#include "wire/protect.h"

namespace softrdma::transport {

using core::WcStatus;

using core::QpState;

// BindMw and LocalInv are local: executed in order, no packets. AtomicWrite (IBTA 1.5): 8 bytes written
// atomically at the responder, from the WQE's gather list or inline data.
enum class WrOp : uint8_t { Send, SendImm, SendInv, Write, WriteImm, Read, CompareSwap, FetchAdd,
                            BindMw, LocalInv, AtomicWrite };
enum WqeFlags : uint32_t {
  kSignaled = 1, kFence = 2, kSolicited = 4, kInline = 8, kIpCsum = 16,
  // Posted by the engine for a tag-matching rendezvous (tag_matching.cpp), never by an application:
  // the READ of the sender's data into the tagged buffer, and the FIN SEND after it. No SQ CQE.
  kTmRead = 32, kTmFin = 64,
};

struct Sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

// Visits the bytes [off, off + len) of a scatter/gather list piece by piece, in order. fn(p, n) gets
// the host address of each piece (null when that SGE's memory was deregistered) and returns false to
// stop the walk; the result says whether the walk ran to the end.
template <typename Fn>
bool for_each_sge_piece(const Sge* sge, uint8_t* const* host, uint32_t num_sge, uint64_t off, uint64_t len,
                        Fn&& fn) {
  for (uint32_t i = 0; i < num_sge && len; ++i) {
    if (off >= sge[i].length) {
      off -= sge[i].length;
      continue;
    }
    uint64_t n = std::min<uint64_t>(sge[i].length - off, len);
    if (!fn(host[i] ? host[i] + off : nullptr, n)) return false;
    len -= n;
    off = 0;
  }
  return true;
}

struct SendWqe {
  uint64_t wr_id;
  WrOp op;
  uint32_t flags;
  uint32_t imm_be;          // immediate data (network order) or the rkey to invalidate
  uint64_t remote_addr;
  uint32_t rkey;
  uint64_t compare_add;     // ATOMIC compare (CmpSwap) or add operand (FetchAdd)
  uint64_t swap;
  // UD: where this datagram goes (from the WR's address handle, remote_qpn and remote_qkey).
  wire::IpAddress ud_dest_ip;
  uint32_t ud_remote_qpn;
  uint32_t ud_remote_qkey;
  uint32_t xrc_srqn;        // XRC_SEND: the remote XRC SRQ the message is for (its XRCETH)
  uint32_t num_sge;
  uint64_t length;          // total bytes of the SGEs / inline data
  core::MwBind bind;        // BindMw (LocalInv: the key to invalidate is in imm_be)
  Sge sge[core::DeviceLimits::kMaxSge];
  uint8_t inline_data[core::DeviceLimits::kMaxInline];
};

struct RecvWqe {
  uint64_t wr_id;
  uint32_t num_sge;
  uint64_t length;
  Sge sge[core::DeviceLimits::kMaxSge];
};

// A WQE of the send queue together with its transport state.
struct SqEntry {
  SendWqe wqe;
  uint8_t* host[core::DeviceLimits::kMaxSge];  // SGEs resolved through the key table
  uint32_t first_psn = 0;   // PSN of the request's first packet
  uint32_t npkts = 0;       // PSNs the message uses (READ: one per response packet)
  bool started = false;
  bool acked = false;       // SEND/WRITE: ACKed; READ/ATOMIC: all response data in
  WcStatus status = WcStatus::Success;  // an error found for this WQE, reported in order
  uint64_t read_received = 0;  // READ: response bytes placed so far
  uint64_t reissued_at = ~0ull;  // READ: read_received when it was last re-issued early
};

// Ring of SendWqe/RecvWqe slots: one producer lock, a single consumer (the engine).
template <typename Slot>
struct WorkQueue {
  Slot* slots = nullptr;
  uint32_t mask = 0;
  uint32_t max_wr = 0;                    // what the application asked for (capacity bound)
  std::atomic<uint64_t> head{0};          // next slot an application fills
  std::atomic<uint64_t> tail{0};          // oldest slot not yet completed (advanced by the engine)
  core::SpinLock producer_lock;
  static uint32_t capacity_for(uint32_t depth) {
    uint32_t cap = 1;
    while (cap < depth) cap <<= 1;
    return cap;
  }
  // ring_depth: slots for more than depth WQEs (an SRQ's, taken out of order: srq.h).
  void init(Slot* storage, uint32_t depth, uint32_t ring_depth = 0) {
    slots = storage;
    mask = capacity_for(std::max(depth, ring_depth)) - 1;
    max_wr = depth;
  }
  Slot& at(uint64_t index) { return slots[index & mask]; }
  uint64_t count() const { return head.load(std::memory_order_acquire) - tail.load(std::memory_order_acquire); }
};

// Appends receive WQEs to a receive ring (a QP's RQ, an SRQ, a WQ); the caller holds its producer lock.
// Stops at the first WQE with more than max_sge SGEs (EINVAL) or that finds the ring full (ENOMEM),
// with *bad its index. The new head is published either way and returned in *new_head.
// taken_ahead: WQEs between tail and head already taken (an SRQ's, out of order), which do not count
// against max_wr; the ring itself must still have a free slot.
inline int push_recv_wqes(WorkQueue<RecvWqe>& q, const RecvWqe* wqes, int n, uint32_t max_sge, int* bad,
                          uint64_t* new_head, const std::atomic<uint64_t>* taken_ahead = nullptr) {
  int rc = 0;
  uint64_t head = q.head.load(std::memory_order_relaxed);
  // The tail first: the taker stores its count of taken WQEs before the tail it moved.
  const uint64_t tail = q.tail.load(std::memory_order_acquire);
  const uint64_t ahead = taken_ahead ? taken_ahead->load(std::memory_order_relaxed) : 0;
  for (int i = 0; i < n; ++i) {
    const RecvWqe& w = wqes[i];
    if (w.num_sge > max_sge || head - tail - std::min(ahead, head - tail) >= q.max_wr || head - tail > q.mask) {
      *bad = i;
      rc = w.num_sge > max_sge ? EINVAL : ENOMEM;
      break;
    }
    RecvWqe& slot = q.at(head);
    slot.wr_id = w.wr_id;
    slot.num_sge = w.num_sge;
    slot.length = w.length;
    std::copy_n(w.sge, w.num_sge, slot.sge);
    ++head;
  }
  q.head.store(head, std::memory_order_release);
  *new_head = head;
  return rc;
}

// The send-queue slots the application has got back. A WR occupies its SQ slot until its completion,
// or a later one of the same SQ, has been polled (ibv_post_send(3): unsignaled WRs are freed by a
// later signaled one); hardware never reuses a slot whose CQE is unread. The engine keeps one per QP
// slot, outliving the QP (its CQEs may be polled after ibv_destroy_qp); the generation changes when a
// QP takes the slot, is reset or destroyed, so a stale CQE frees nothing.
struct SqCredit {
  static constexpr uint64_t kMask = (uint64_t{1} << 48) - 1;
  std::atomic<uint64_t> word{0};  // generation << 48 | polled (low 48 bits of an SQ index)
  uint32_t gen() const { return static_cast<uint32_t>(word.load(std::memory_order_relaxed) >> 48); }
  // Every WQE before this SQ index has been given back (low 48 bits).
  uint64_t polled() const { return word.load(std::memory_order_acquire) & kMask; }
  // A CQE of generation g for the WQE whose SQ index has low 32 bits idx was polled.
  void give_back(uint32_t g, uint32_t idx) {
    uint64_t w = word.load(std::memory_order_relaxed);
    for (;;) {
      if ((w >> 48) != g) return;
      // Ahead of what is given back already? (Two threads polling one CQ may process CQEs out of order.)
      auto ahead = static_cast<int32_t>(idx + 1 - static_cast<uint32_t>(w));
      if (ahead <= 0) return;
      uint64_t next = (w & ~kMask) | (((w & kMask) + static_cast<uint64_t>(ahead)) & kMask);
      if (word.compare_exchange_weak(w, next, std::memory_order_release, std::memory_order_relaxed)) return;
    }
  }
  // New generation, nothing polled: for a new, reset or destroyed QP (its SQ indices restart at 0).
  void renew() {
    uint64_t g = ((word.load(std::memory_order_relaxed) >> 48) + 1) & 0xFFFF;
    word.store(g << 48, std::memory_order_release);
  }
};

// Bits of a modify (numerically enum ibv_qp_attr_mask).
enum ModifyMask : int {
  kModState = 1 << 0, kModCurState = 1 << 1, kModAccessFlags = 1 << 3, kModPkeyIndex = 1 << 4,
  kModPort = 1 << 5, kModQkey = 1 << 6, kModAv = 1 << 7, kModPathMtu = 1 << 8, kModTimeout = 1 << 9,
  kModRetryCnt = 1 << 10, kModRnrRetry = 1 << 11, kModRqPsn = 1 << 12, kModMaxQpRdAtomic = 1 << 13,
  kModMinRnrTimer = 1 << 15, kModSqPsn = 1 << 16, kModMaxDestRdAtomic = 1 << 17, kModCap = 1 << 19,
  kModDestQpn = 1 << 20,
};

// One READ or ATOMIC the responder executed, kept so that a duplicate is answered from here:
// READ responses are regenerated, ATOMIC results are replayed, never re-executed (IBTA 9.7.5.2.x).
struct ReplayEntry {
  bool valid = false;
  bool atomic = false;
  uint32_t psn = 0, npkts = 0;
  uint64_t atomic_orig = 0;
  bool atomic_write = false;  // an ATOMIC WRITE: answered again by a zero-length READ RESPONSE, not re-executed
};

// A response the responder still owes, in PSN order (IBTA 9.5): READ response packets streamed out,
// an ATOMIC acknowledge, or a fatal NAK; none may overtake the READ responses before it.
struct ReadResponseJob {
  enum class Kind : uint8_t { Read, AtomicAck, Nak };
  uint32_t psn;         // PSN of the next response packet
  uint32_t first_psn;
  uint32_t last_psn;
  uint8_t* src;         // next byte to send
  uint64_t remaining;
  Kind kind = Kind::Read;
  uint64_t atomic_orig = 0;  // AtomicAck: the original value
  // Answers a duplicate request: the requester has already seen later responses overtake it, so it
  // holds back nothing (ACKs, new responses) and does not count against max_dest_rd_atomic.
  bool regenerated = false;
  // Nak: the NAK code, and the status of the receive WQE the failed message had taken (if any).
  uint8_t nak_code = 0;
  WcStatus recv_status = WcStatus::Success;
};

struct Srq;  // transport/srq.h

// Transport service of a QP (numerically enum ibv_qp_type).
enum class QpType : uint8_t { Rc = 2, Uc = 3, Ud = 4, Raw = 8 };
struct Wq;  // transport/raw.h
// XRC (IBTA 9.2, 10.2.10): an XRC QP is an RC QP of one direction. The initiator (XRC_SEND) has a
// requester only and names a remote XRC SRQ in each request's XRCETH; the target (XRC_RECV) has a
// responder only, which takes receive WQEs, CQ and PD from that SRQ, if it is of the target's domain.
enum class XrcRole : uint8_t { None, Send, Recv };

struct QpConfig {
  QpType type = QpType::Rc;
  uint32_t pd = 0;
  core::CompletionQueue* send_cq = nullptr;
  core::CompletionQueue* recv_cq = nullptr;
  uint32_t max_send_wr = 0, max_recv_wr = 0, max_send_sge = 0, max_recv_sge = 0, max_inline = 0;
  bool sq_sig_all = false;
  uint32_t ud_mtu = 0;  // UD: the port's active MTU in bytes, the largest message it sends (C10-93.1.1)
  Srq* srq = nullptr;  // receive WQEs come from this shared receive queue; the QP's own RQ is unused
  XrcRole xrc = XrcRole::None;  // XRC QPs have type Rc
  uint32_t xrcd = 0;             // XRC_RECV: its XRC domain (nonzero)
  // The send queue's ring in the creator's memory (sq_ring_bytes(max_send_wr), 64-byte aligned), which
  // outlives the QP; nullptr: the engine's own. Private to the requester either way (no peer maps it).
  void* sq_ring = nullptr;
  // RAW_PACKET with receive-side scaling (raw.cpp): received frames go to the WQ of this indirection
  // table that the Toeplitz hash of rss_fields selects; the QP has no queues of its own.
  std::vector<Wq*> rss_table;
  std::vector<uint8_t> rss_key;
  uint64_t rss_fields = 0;  // enum ibv_rx_hash_fields bits
};

// The bytes of a send queue ring for max_send_wr WQEs (QpConfig::sq_ring).
inline size_t sq_ring_bytes(uint32_t max_send_wr) {
  return sizeof(SqEntry) * WorkQueue<SqEntry>::capacity_for(std::max<uint32_t>(max_send_wr, 1));
}

// Request packets in flight without an acknowledgement. Far below the 2^23 PSN half-space, and
// small enough that a burst fits the peer's socket buffer.
inline constexpr uint32_t kPsnWindow = 1024;
// The congestion window never goes below this: one acknowledgement request interval, so that every
// window holds a packet that asks for an ACK. (128, kernel rxe's fixed window, still overran a
// TCG guest at MTU 4096.)
inline constexpr uint32_t kMinCwnd = 32;

class DirectPeer;  // transport/direct.h
struct DirectInbox;

struct Qp {
  void* user = nullptr;            // the verbs object that owns this QP (for async events)
  core::Counters* stats = nullptr; // this QP's counters in the stats page (nullptr: device only)
  uint32_t qpn = 0;
  QpConfig cfg;
  std::atomic<QpState> state{QpState::Reset};

  // Attributes (set by modify_qp).
  uint32_t access_flags = 0;
  uint32_t mtu = 1024;
  uint32_t dest_qpn = 0;
  wire::IpAddress dest_ip;
  uint16_t dest_port = 0;          // UDP port packets go to (4791, or a local process's port)
  uint16_t src_port = 0;           // per-QP source port entropy (informational: sockets are shared)
  uint8_t timeout = 14, retry_cnt = 7, rnr_retry = 7, min_rnr_timer = 0;
  uint32_t max_rd_atomic = 1, max_dest_rd_atomic = 1;
  uint32_t qkey = 0;               // UD: the Q_Key received datagrams must carry

  WorkQueue<SqEntry> sq;
  SqCredit* sq_credit = nullptr;   // the engine's entry for this QP (never null once created)
  uint32_t sq_credit_slot = 0;
  WorkQueue<RecvWqe> rq;
  // Receive WQEs come from a shared receive queue instead of rq when set (ibv_qp_init_attr.srq).
  WorkQueue<RecvWqe>* shared_rq = nullptr;
  Srq* srq = nullptr;               // the SRQ shared_rq belongs to (its PD, limit and QP count)
  WorkQueue<RecvWqe>& recv_queue() { return shared_rq ? *shared_rq : rq; }
  std::vector<SqEntry> sq_storage;   // private to the requester
  size_t rq_bytes = 0;               // the RQ ring lives in the context's shared arena

  // The transport state of each role, one struct per role as its owner sees it. A default-constructed
  // one is that role's state in RESET (Engine::modify_qp assigns fresh ones), so a QP taken to RTS
  // again carries nothing of its previous connection.

  // Requester (requester.cpp, datagram.cpp): which WQE and packet go out next, with which PSN.
  struct RequesterState {
    uint64_t send_index = 0;         // next SQ entry whose packets are (re)sent
    uint64_t send_offset_pkts = 0;   // packets of sq[send_index] already sent
    uint32_t next_psn = 0;           // PSN of the next new packet
    uint32_t reads_outstanding = 0;  // READ/ATOMIC requests sent and not complete
    // PSNs that may be unacknowledged now (<= the requester's fixed window). Loss shrinks it and
    // acknowledgements grow it back, so a slow or lossy path is not flooded with whole-window
    // go-back-N resends (seen against kernel rxe under emulation: 30x amplification, RETRY_EXC).
    uint32_t cwnd = kPsnWindow;
    // A WQE failed (locally, or NAKed by the responder): nothing at or after this SQ index is sent, and
    // its error follows in order. WQEs before it are still resent until they complete or run out of retries.
    uint64_t sq_stop_at = ~0ull;
  } req;

  // Completer (completer.cpp): what is acknowledged, the retransmit timer and the retry budgets.
  struct CompleterState {
    uint32_t acked_psn = 0;          // every PSN before this one is acknowledged
    uint32_t retries_left = 7, rnr_retries_left = 7;  // refilled from retry_cnt/rnr_retry
    uint64_t timer_deadline_ns = 0;  // retransmit timer, 0 = stopped
    uint64_t rnr_resume_ns = 0;      // RNR back-off: no sending before this
    uint64_t paused_since_ns = 0;    // retry_cnt first ran out with the peer known to exist (0: not)
  } comp;

  // Responder (responder.cpp; the UC one in datagram.cpp): the expected PSN, the message being
  // received, the acknowledgement owed and the READ/ATOMIC responses still to be sent.
  struct ResponderState {
    uint32_t epsn = 0;               // expected PSN
    uint32_t msn = 0;
    bool nak_sent = false;           // a PSN-sequence NAK is outstanding: send no second one
    bool ack_owed = false;
    uint32_t ack_psn = 0;            // PSN the owed ACK acknowledges
    uint8_t last_opcode = 0xFF;      // previous in-order request packet (to validate FIRST/MIDDLE/LAST)
    bool in_message = false;         // between a FIRST and its LAST
    bool uc_dropping = false;        // UC: the message in progress lost a packet; wait for a FIRST/ONLY
    // SEND being received
    bool recv_active = false;
    uint64_t recv_offset = 0;
    uint8_t* recv_host[core::DeviceLimits::kMaxSge] = {};  // the active receive WQE's SGEs, resolved
    // The SRQ WQE of the message being received: moved off the SRQ when the message starts, because
    // the other QPs of the SRQ go on consuming it meanwhile (an RQ WQE stays at rq's tail until done).
    RecvWqe srq_wqe{};
    bool srq_wqe_held = false;       // srq_wqe is taken and not yet completed (UC keeps it past a lost message)
    bool last_wqe_reached = false;   // IBV_EVENT_QP_LAST_WQE_REACHED raised since the QP went to error
    // WRITE being received
    uint8_t* write_dst = nullptr;
    uint64_t write_remaining = 0;
    uint32_t write_total = 0;
    std::vector<ReplayEntry> replay;         // ring of max_dest_rd_atomic entries
    uint32_t replay_next = 0;
    std::vector<ReadResponseJob> read_jobs;  // READ responses still to be sent, in order
    // The responder hit a fatal error behind READ/ATOMIC responses still owed: its NAK is queued after
    // them (read_jobs), and nothing more is accepted until it is sent and the QP is in error.
    bool pending_fatal_nak = false;
    // Tag-matching SRQ (tag_matching.cpp): what the SEND being received was classified as by its TMH.
    enum class TmKind : uint8_t { None, Plain, NoTag, Expected, Unexpected, Discard };
    TmKind tm_kind = TmKind::None;
    uint64_t tm_tag = 0;
    uint32_t tm_priv = 0;
    bool tm_ack_now = false;         // a rendezvous matched: acknowledge this packet at once
  } resp;
  // Sq indices of the engine's own WQEs (kTmRead, kTmFin) whose slots no polled CQE has given back yet
  // (ascending; under sq.producer_lock): they do not count against the application's max_send_wr.
  std::vector<uint64_t> tm_sq_internal;

  // What the requester knows of its peer's receive queue (initiator side, direct.cpp): valid while the
  // peer's generation is unchanged and no SEND of ours went by packets (its responder took a WQE).
  struct DirectRecvView {
    bool valid = false;
    uint32_t generation = 0;
    uint32_t next_wqe = 0;       // the RQ WQE our next message takes
    uint32_t rq_head = 0;        // the peer's RQ producer index, when last read
    uint32_t consumed = 0;       // inbox entries the peer had consumed, when last read
    uint64_t data_tail = 0;      // payload bytes it had consumed, when last read
  };
  // The intra-host direct path (direct.h), owned by DirectEndpoint, which resets it on its own: the
  // peer's context when it serves it, the peer QP's and this QP's state descriptors there and here.
  struct DirectState {
    std::shared_ptr<DirectPeer> peer;
    uint32_t peer_desc = 0;
    uint32_t desc = ~0u;
    DirectInbox* inbox = nullptr;  // SENDs from the peer's requester (target side)
    uint32_t inbox_tail = 0;       // inbox entries consumed
    int peer_wake_fd = -1;         // the wake-up pipe of the peer QP's receive CQ channel (initiator side)
    DirectRecvView recv;
    // The peer's server said EAGAIN (its QP not yet in RTR towards us): try again at retry_ns (0: never),
    // at most once a millisecond, packets meanwhile.
    uint64_t retry_ns = 0;
    uint32_t retries = 0;
    int32_t retry_pid = 0;
    uint16_t retry_port = 0;
  } direct;

  // Wire protection (wire/protect.h, transport/protect.h), held only by a protected RC or UC QP: the
  // connection's secret, installed before RTR (WireProtection::set_wire_key); at RTR the two direction
  // keys are derived from it and both ends' address and QPN. tx_counter is the nonce of the next packet
  // sent: it only grows, retransmissions included, so no nonce repeats under the key. RESET forgets all
  // of it (a new connection, a new key).
  struct WireProtect {
    wire::Protection mode = wire::Protection::Off;
    uint8_t secret[32] = {};
    uint8_t secret_len = 0;
    std::unique_ptr<wire::PacketCipher> tx, rx;  // set in RTR and later
    uint64_t tx_counter = 0;
    wire::ReplayWindow replay;
  };
  std::unique_ptr<WireProtect> prot;

  // The path this QP has joined when it is not its type's own (path.h; Engine::path_of): raw packets
  // from its creation, the direct path from RTR, iWARP from its attach. Set and cleared under the
  // engine lock; post_send reads it to check what the path carries.
  std::atomic<Path*> path{nullptr};
  Path* on_path() const { return path.load(std::memory_order_relaxed); }
  bool packet_peer = false;  // counted in the engine's packet_qps_ (Engine::set_packet_peer)
  std::unique_ptr<PathState> path_state;  // that path's state of this QP, owned here
};

// Where a QP's receive completions go: its receive CQ, or a tag-matching SRQ's CQ (tag_matching.cpp).
core::CompletionQueue* receive_cq(const Qp& qp);

// The successful receive CQE of a message that arrived on a connected QP (RC, UC): from its peer QP,
// with the immediate data (network order) when the message carried one.
inline core::Cqe connected_receive_cqe(const Qp& qp, uint64_t wr_id, core::WcOpcode opcode, uint64_t byte_len,
                                       bool with_imm, uint32_t imm_be) {
  core::Cqe c{};
  c.wr_id = wr_id;
  c.status = WcStatus::Success;
  c.opcode = opcode;
  c.byte_len = static_cast<uint32_t>(byte_len);
  c.qp_num = qp.qpn;
  c.src_qp = qp.dest_qpn;
  if (with_imm) {
    c.wc_flags = core::kWcWithImm;
    c.imm_or_inv = imm_be;
  }
  return c;
}

// Marks c as the CQE of qp's SQ WQE at sq_index: polling it gives that slot (and older ones) back.
inline void tag_sq_cqe(const Qp& qp, core::Cqe& c, uint64_t sq_index) {
  c.sq_ref = (qp.sq_credit_slot + 1) | qp.sq_credit->gen() << 16;
  c.sq_index = static_cast<uint32_t>(sq_index);
}

}  // namespace softrdma::transport
