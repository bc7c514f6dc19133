// The memory a target context shares with its direct-path initiators (docs/direct-path.md): the
// DirectShared block in its arena (mapped read-only by peers), and what lives in its writable area
// (peers map it read-write): the busy slots, the inboxes and their entries. Both sides read this layout;
// everything a peer could have written is checked by whoever reads it back.
#pragma once
#include <atomic>
#include <cstdint>

#include "core/limits.h"

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
  // A QP on an SRQ: the arena offset of the SRQ's DirectSrqDesc (0: the QP's own receive queue).
  std::atomic<uint64_t> srq_off;
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
  uint32_t srq_index;           // a QP on an SRQ: the low 32 bits of the SRQ WQE the initiator claimed
  uint8_t inline_data[kInlineBytes];
};
static_assert(sizeof(DirectInboxEntry) == 64);

// One per connected RC QP (target side), in the arena. One producer: the peer QP's requester (under
// its engine lock); one consumer: this QP's engine. Larger payloads follow each other in a byte ring.
struct DirectInbox {
  static constexpr uint32_t kEntries = 1024;
  static constexpr uint32_t kDataBytes = 256 * 1024;
  static constexpr uint32_t kMaxMessage = 64 * 1024;  // larger SENDs go by packets
  enum : uint32_t { kSend = 1, kSendImm = 2, kWriteImm = 3 };
  alignas(64) uint64_t head;     // entries published (initiator's)
  uint64_t data_head;            // next payload byte in data (initiator's)
  alignas(64) std::atomic<uint64_t> data_tail;  // payload bytes consumed (target)
  alignas(64) DirectInboxEntry entries[kEntries];
  alignas(64) uint8_t data[kDataBytes];
};

// An SRQ that direct-path QPs are attached to (target side), in the arena: what initiators need to take
// one of its WQEs for a message they leave in an inbox. Every taker -- the target's responder for
// packets and each initiator -- claims the next WQE by moving the claim word (in the writable area) from
// i to i + 1 while i < head; an initiator first checks WQE i as the responder would, then names i in its
// inbox entry, and the target takes exactly that WQE. So WQEs leave the SRQ out of order, and the target
// checks each index against its own head and its own record of what was taken, never trusting the
// claim word, which any connected peer may write.
struct DirectSrqDesc {
  alignas(64) std::atomic<uint64_t> head;  // WQEs posted (a mirror of the SRQ's producer index)
  std::atomic<uint64_t> ring_off;          // arena offset of its ring of RecvWqe
  std::atomic<uint64_t> claim_off;         // writable-area offset of its claim word
  std::atomic<uint32_t> ring_mask;
  std::atomic<uint32_t> pd;                // receive buffers are checked against the SRQ's PD
  std::atomic<uint32_t> ring_seq;          // odd while ibv_modify_srq replaces the ring
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

}  // namespace softrdma::transport
