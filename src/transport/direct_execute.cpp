// The data path of the direct path (docs/direct-path.md, "Data path" and "Two-sided operations"): an
// initiator executes a WQE of an RC QP on its peer's memory mapped here -- WRITE, READ and ATOMIC with
// the checks the peer's responder would make (MrTable::check_remote_region), inside a copy window the
// target waits out when it revokes (DirectTarget::wait_copies); SEND(_IMM) and the immediate of a
// WRITE_WITH_IMM into the peer QP's inbox, once a receive WQE there (of its RQ, or claimed from its SRQ)
// will take it -- and wakes the peer
// when its receive CQ is armed. Anything else falls back to the packet path, which answers as the wire.
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/cq.h"
#include "core/place.h"
#include "transport/direct_peer.h"
#include "transport/direct_protocol.h"
#include "transport/work_request.h"

namespace softrdma::transport {

namespace {

// The data movement of a checked WRITE, READ or ATOMIC; dst: the target bytes, mapped here.
void copy_one_sided(const SendWqe& w, uint8_t* const* host, uint8_t* dst, uint64_t len) {
  switch (w.op) {
    case WrOp::Write:
    case WrOp::WriteImm:
      // As the responder places a WRITE: each byte once, the last ones last (core/place.h).
      if (w.flags & kInline) {
        core::place_in_order(dst, w.inline_data, len);
      } else {
        for_each_sge_piece(w.sge, host, w.num_sge, 0, len, [&](uint8_t* p, uint64_t n) {
          core::place_in_order(dst, p, n);
          dst += n;
          return true;
        });
      }
      break;
    case WrOp::AtomicWrite: {
      // One aligned 8-byte store: no reader of the target sees a torn value (IBTA 1.5 ATOMIC WRITE).
      uint64_t value = 0;
      if (w.flags & kInline) {
        std::memcpy(&value, w.inline_data, 8);
      } else {
        auto* out = reinterpret_cast<uint8_t*>(&value);
        for_each_sge_piece(w.sge, host, w.num_sge, 0, 8, [&](uint8_t* p, uint64_t n) {
          std::memcpy(out, p, n);
          out += n;
          return true;
        });
      }
      __atomic_store_n(reinterpret_cast<uint64_t*>(dst), value, __ATOMIC_SEQ_CST);
      break;
    }
    case WrOp::Read: {
      const uint8_t* src = dst;
      for_each_sge_piece(w.sge, host, w.num_sge, 0, len, [&](uint8_t* p, uint64_t n) {
        std::memcpy(p, src, n);
        src += n;
        return true;
      });
      break;
    }
    default: {
      auto* word = reinterpret_cast<uint64_t*>(dst);
      uint64_t orig;
      if (w.op == WrOp::CompareSwap) {
        orig = w.compare_add;
        __atomic_compare_exchange_n(word, &orig, w.swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      } else {
        orig = __atomic_fetch_add(word, w.compare_add, __ATOMIC_SEQ_CST);
      }
      // The original value lands in the local buffer in host order, as the packet path leaves it.
      const auto* src = reinterpret_cast<const uint8_t*>(&orig);
      for_each_sge_piece(w.sge, host, w.num_sge, 0, 8, [&](uint8_t* p, uint64_t n) {
        std::memcpy(p, src, n);
        src += n;
        return true;
      });
    }
  }
}

// Whether receive WQE wqe (in the target's arena) takes a message of len bytes without error, as the
// target's engine checks when it places it: SGE count, length, and each SGE's key in the target's table
// (in PD pd, with local write, not on demand). Read under the key table's seq (which the caller checks
// again).
bool receive_fits(DirectPeer& p, const RecvWqe* wqe, uint64_t len, uint32_t pd) {
  const uint32_t num_sge = wqe->num_sge;
  if (num_sge > core::DeviceLimits::kMaxSge || len > wqe->length) return false;
  const uint64_t seq = p.key_seq->load(std::memory_order_acquire);
  for (uint32_t i = 0; i < num_sge; ++i) {
    const Sge g = wqe->sge[i];
    core::MrRegion& r = p.cached_local;
    if (!(seq == p.cached_local_seq && g.lkey == r.lkey) && !core::MrTable::find_in(p.key_table, g.lkey, false, &r))
      return false;
    p.cached_local_seq = seq;
    // An on-demand region's pages can be checked only by the target as it places the message, too late
    // for the status the initiator must see: such receives take the packet path, whose responder NAKs.
    if (!(r.access & core::kLocalWrite) || (r.access & core::kOnDemand) ||
        core::MrTable::check_range(r, pd, g.addr, g.length) != core::AccessResult::Ok)
      return false;
  }
  return true;
}

// WQE index of a receive ring at arena offset ring (mask + 1 slots) in the target's arena, or nullptr
// when the ring does not lie inside it.
const RecvWqe* ring_wqe(const DirectPeer& p, uint64_t ring, uint32_t mask, uint64_t index) {
  const uint64_t slots = uint64_t{mask} + 1;
  if (!ring || ring > p.arena_size || slots > (p.arena_size - ring) / sizeof(RecvWqe)) return nullptr;
  return reinterpret_cast<const RecvWqe*>(p.arena + ring + (index & mask) * sizeof(RecvWqe));
}

// Room for the next message of a QP (of len payload bytes): its inbox, and on an SRQ the WQE it
// claims (claim moves from index to index + 1 once everything else is done: commit_claim).
struct Room {
  DirectInbox* inbox = nullptr;
  std::atomic<uint64_t>* claim = nullptr;
  uint64_t index = 0;
};

// The SRQ WQE the next message would take: the one at the claim word, if posted and it takes the message
// (not claimed yet). Everything read is the target's and is bounds-checked; a ring replaced meanwhile
// (its seqlock moved) is not trusted.
bool srq_room(DirectPeer& p, uint64_t srq_off, uint64_t len, Room* room) {
  if (srq_off > p.arena_size || sizeof(DirectSrqDesc) > p.arena_size - srq_off || srq_off % 64) return false;
  const auto& sd = *reinterpret_cast<const DirectSrqDesc*>(p.arena + srq_off);
  const uint32_t seq = sd.ring_seq.load(std::memory_order_acquire);
  const uint64_t claim_off = sd.claim_off.load(std::memory_order_relaxed);
  if ((seq & 1) || claim_off > p.rw_size - sizeof(std::atomic<uint64_t>) || claim_off % 8) return false;
  auto* claim = reinterpret_cast<std::atomic<uint64_t>*>(p.rw + claim_off);
  const uint64_t c = claim->load(std::memory_order_acquire);
  if (c >= sd.head.load(std::memory_order_acquire)) return false;  // RNR: the wire's answer
  const RecvWqe* wqe = ring_wqe(p, sd.ring_off.load(std::memory_order_relaxed),
                                sd.ring_mask.load(std::memory_order_relaxed), c);
  if (!wqe || !receive_fits(p, wqe, len, sd.pd.load(std::memory_order_relaxed))) return false;
  std::atomic_thread_fence(std::memory_order_acquire);
  if (sd.ring_seq.load(std::memory_order_relaxed) != seq) return false;
  room->claim = claim;
  room->index = c;
  return true;
}

// The target QP's inbox when its next message (of len payload bytes) will find room there and a receive
// WQE that takes it without error -- exactly what the target's engine checks when it places it; false
// otherwise (no inbox, RNR, too long, a bad receive SGE: the packet path answers). v: what this QP knows
// of the target's receive queue, refreshed only when it runs out, so that a message costs one line of
// the target's that moved (the WQE's). Everything read here is the target's and is bounds-checked.
// Called inside the copy window, under the key table's seq (which the caller checks again).
bool receive_room(DirectPeer& p, const DirectQpDesc& d, Qp::DirectRecvView& v, uint64_t len, Room* room) {
  const uint64_t off = d.inbox_off.load(std::memory_order_acquire);
  if (!off || off > p.rw_size || sizeof(DirectInbox) > p.rw_size - off || off % 64) return false;
  auto* in = reinterpret_cast<DirectInbox*>(p.rw + off);
  const uint32_t gen = d.generation.load(std::memory_order_acquire);
  const auto head = static_cast<uint32_t>(in->head);
  if (!v.valid || v.generation != gen) {
    const uint64_t tails = d.tails.load(std::memory_order_acquire);
    v.consumed = static_cast<uint32_t>(tails >> 32);
    // The WQEs before ours are spoken for by the messages still in the inbox.
    v.next_wqe = static_cast<uint32_t>(tails) + (head - v.consumed);
    v.rq_head = static_cast<uint32_t>(d.rq_head.load(std::memory_order_acquire));
    v.data_tail = in->data_tail.load(std::memory_order_acquire);
    v.generation = gen;
    v.valid = true;
  }
  if (head - v.consumed >= DirectInbox::kEntries) {
    v.consumed = static_cast<uint32_t>(d.tails.load(std::memory_order_acquire) >> 32);
    if (head - v.consumed >= DirectInbox::kEntries) return false;
  }
  if (len > DirectInboxEntry::kInlineBytes && len > DirectInbox::kDataBytes - (in->data_head - v.data_tail)) {
    v.data_tail = in->data_tail.load(std::memory_order_acquire);
    if (len > DirectInbox::kDataBytes - (in->data_head - v.data_tail)) return false;
  }
  room->inbox = in;
  if (const uint64_t srq_off = d.srq_off.load(std::memory_order_relaxed)) return srq_room(p, srq_off, len, room);
  if (static_cast<int32_t>(v.rq_head - v.next_wqe) <= 0) {
    v.rq_head = static_cast<uint32_t>(d.rq_head.load(std::memory_order_acquire));
    if (static_cast<int32_t>(v.rq_head - v.next_wqe) <= 0) return false;  // RNR: the wire's answer
  }
  const uint64_t ring = d.rq_ring_off.load(std::memory_order_relaxed);
  const uint32_t mask = d.rq_mask.load(std::memory_order_relaxed);
  const RecvWqe* wqe = ring_wqe(p, ring, mask, v.next_wqe);
  if (!wqe || !receive_fits(p, wqe, len, d.pd.load(std::memory_order_relaxed))) return false;
  // The line of the WQE after it, for the next message: by then it is likely posted and still.
  __builtin_prefetch(p.arena + ring + ((v.next_wqe + 1) & mask) * sizeof(RecvWqe));
  return true;
}

// Appends the message to the inbox (receive_room said it fits) and publishes it; srq_index: the SRQ
// WQE it claimed, if any.
void post_to_inbox(DirectInbox& in, const SqEntry& e, uint64_t payload, uint64_t srq_index) {
  const SendWqe& w = e.wqe;
  const uint64_t h = in.head;
  DirectInboxEntry& en = in.entries[h % DirectInbox::kEntries];
  auto gather = [&](auto&& put) {
    if (w.flags & kInline)
      put(w.inline_data, payload);
    else
      for_each_sge_piece(w.sge, e.host, w.num_sge, 0, payload, [&](const uint8_t* p, uint64_t n) {
        put(p, n);
        return true;
      });
  };
  if (payload <= DirectInboxEntry::kInlineBytes) {
    uint8_t* dst = en.inline_data;
    gather([&](const uint8_t* src, uint64_t n) {
      std::memcpy(dst, src, n);
      dst += n;
    });
  } else {
    uint64_t dh = in.data_head;
    gather([&](const uint8_t* src, uint64_t n) {
      while (n) {
        const uint64_t at = dh % DirectInbox::kDataBytes;
        const uint64_t k = std::min<uint64_t>(n, DirectInbox::kDataBytes - at);
        std::memcpy(in.data + at, src, k);
        dh += k;
        src += k;
        n -= k;
      }
    });
    in.data_head = dh;
  }
  en.op = w.op == WrOp::Send ? DirectInbox::kSend : w.op == WrOp::SendImm ? DirectInbox::kSendImm
                                                                          : DirectInbox::kWriteImm;
  en.length = static_cast<uint32_t>(w.length);
  en.imm_be = w.imm_be;
  en.solicited = (w.flags & kSolicited) ? 1 : 0;
  en.srq_index = static_cast<uint32_t>(srq_index);
  en.stamp.store(static_cast<uint32_t>(h + 1), std::memory_order_release);
  in.head = h + 1;
}

}  // namespace

int claim_event(std::atomic<int>& arm, const std::atomic<uint64_t>& tails, uint32_t sent, bool solicited) {
  using Cq = core::CompletionQueue;
  int cur = arm.load(std::memory_order_relaxed);
  if (cur == Cq::kUnarmed || cur == Cq::kClaimed) return Cq::kUnarmed;
  if (cur == Cq::kArmedSolicited && !solicited) return Cq::kUnarmed;  // raises no event
  if (!arm.compare_exchange_strong(cur, Cq::kClaimed)) return Cq::kUnarmed;  // raised already
  // The target publishes the count, fences, then reads the arm as its CQE raises the event
  // (CompletionQueue::push): either it saw our claim, or we see the message placed.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (static_cast<int32_t>(static_cast<uint32_t>(tails.load(std::memory_order_relaxed) >> 32) - sent) < 0) return cur;
  // Placed before the arm we took (whose load above may be long before the exchange, of an arm
  // raised and made again since): give it back, unless a CQE raised it meanwhile without a byte.
  int claimed = Cq::kClaimed;
  return arm.compare_exchange_strong(claimed, cur) ? Cq::kUnarmed : cur;
}

namespace {

// The target places a message when its application polls; one blocked in ibv_get_cq_event has armed
// the CQ first, and then it is woken. Publish, then read the arm state: the target arms, then looks at
// its inboxes (Engine::arm_cq), so one of the two sides sees the other.
// With the channel's wake-up pipe, the initiator takes the arm (claim_event: the event is its to wake)
// and writes the event's byte there, so the thread waiting on the channel places the message itself:
// one wake-up, not the progress thread's and then the application's. The CQE then raises the event
// without a byte of its own, so each event still has exactly one. Only a message that raises the event
// claims it (a solicited-only arm waits for a solicited one); without a pipe, the doorbell wakes the
// target's engine. sent: the inbox's head after the message.
void wake_if_armed(const DirectPeer& p, const DirectQpDesc& d, int wake_fd, bool solicited, uint32_t sent) {
  const uint64_t arm_off = d.recv_cq_arm_off.load(std::memory_order_relaxed);
  if (!arm_off || arm_off > p.rw_size - sizeof(std::atomic<int>) || arm_off % alignof(std::atomic<int>))
    return;  // no completion channel
  std::atomic_thread_fence(std::memory_order_seq_cst);
  auto* arm = reinterpret_cast<std::atomic<int>*>(p.rw + arm_off);
  if (wake_fd >= 0) {
    const int cur = claim_event(*arm, d.tails, sent, solicited);
    if (cur == core::CompletionQueue::kUnarmed) return;
    const char b = 1;
    if (write(wake_fd, &b, 1) == 1) return;
    // A full pipe (64 Ki wake-ups unread): give the arm back and wake the engine instead.
    int claimed = core::CompletionQueue::kClaimed;
    arm->compare_exchange_strong(claimed, cur);
  } else {
    const int cur = arm->load(std::memory_order_relaxed);
    if (cur == core::CompletionQueue::kUnarmed || cur == core::CompletionQueue::kClaimed) return;
  }
  // The target's server rings its engine (kRing: no reply). Never blocks: a full socket buffer means
  // rings are still unread there.
  const direct::Request ring{direct::kRing, 0, 0};
  [[maybe_unused]] ssize_t n = send(p.sock, &ring, sizeof ring, MSG_DONTWAIT | MSG_NOSIGNAL);
}

// A WRITE or READ of len bytes at the target's address target, by process_vm_writev/readv; false (and
// nothing to undo: the packet path repeats the whole operation) when the kernel refuses or falls short.
bool copy_across(DirectPeer& p, const SendWqe& w, uint8_t* const* host, uint64_t target, uint64_t len) {
  iovec local[core::DeviceLimits::kMaxSge];
  unsigned long n = 0;
  if (w.flags & kInline) {
    local[n++] = {const_cast<uint8_t*>(w.inline_data), len};
  } else {
    for_each_sge_piece(w.sge, host, w.num_sge, 0, len, [&](uint8_t* ptr, uint64_t k) {
      local[n++] = {ptr, k};
      return true;
    });
  }
  iovec remote{reinterpret_cast<void*>(target), len};
  ssize_t got = w.op == WrOp::Read ? process_vm_readv(p.pid, local, n, &remote, 1, 0)
                                   : process_vm_writev(p.pid, local, n, &remote, 1, 0);
  if (got < 0 && (errno == EPERM || errno == ENOSYS)) p.vm_denied = true;
  return got == static_cast<ssize_t>(len);
}

// What a WQE asks of the target, from its work request's row.
struct Shape {
  bool send;        // SEND or SEND_WITH_IMM: its payload goes into the inbox
  bool two_sided;   // takes a receive WQE through the inbox (WRITE_WITH_IMM too)
  bool one_sided;   // WRITE, READ, ATOMIC: the target's memory only
  bool remote_mem;  // touches the target's memory
  bool atomic;      // ATOMIC or ATOMIC WRITE: 8 aligned bytes
  bool writable;    // needs a writable mapping of the target's memory
  uint32_t need;    // the remote access right it needs
  uint64_t len;     // bytes of the target's memory it touches, or of the SEND's payload
};

Shape shape_of(const SendWqe& w, QpType type) {
  const WorkRequest wr = work_request(w.op, type);
  Shape s{};
  // SEND, SEND with immediate and WRITE with immediate take a receive WQE through the inbox (a SEND
  // with invalidate is left to the wire); WRITE, READ and ATOMIC touch the target's memory only.
  s.send = wr.consumes_receive && !wr.remote_access && w.op != WrOp::SendInv;
  s.two_sided = s.send || (wr.consumes_receive && wr.remote_access);
  s.one_sided = !wr.consumes_receive && !wr.local;
  // A zero-length WRITE or READ is left to the wire (no key is checked there).
  s.remote_mem = s.one_sided || (s.two_sided && wr.remote_access && w.length);
  // ATOMIC WRITE needs the atomicity of an aligned store in a shared mapping, as the ATOMICs do.
  s.atomic = wr.atomic || wr.atomic_write;
  s.need = wr.remote_access;
  s.writable = !wr.read;
  s.len = s.atomic ? 8 : w.length;
  return s;
}

// The region w's rkey names in the target's key table image (read under seq), checked as the target's
// responder would: the QP's flags, then MrTable::check_remote_region. An unchanged table since the last
// lookup of this rkey means the same region (seq is never odd when cached).
bool remote_region(DirectPeer& peer, const DirectQpDesc& d, const SendWqe& w, const Shape& s, uint64_t seq,
                   core::MrRegion* r) {
  const bool cached = seq == peer.cached_seq && w.rkey == peer.cached_rkey;
  if (cached) *r = peer.cached_region;
  return (d.access.load(std::memory_order_relaxed) & s.need) &&
         (cached || core::MrTable::find_in(peer.key_table, w.rkey, true, r)) && (r->share_id != 0 || !s.atomic) &&
         core::MrTable::check_remote_region(*r, d.pd.load(std::memory_order_relaxed), w.remote_addr, s.len,
                                            s.need) == core::AccessResult::Ok;
}

// Again: the share was not mapped yet (now it is); Contended: another taker claimed the SRQ WQE first.
enum class Step { Done, Fallback, Again, Contended };

// Inside the copy window: the copy of a checked WRITE, READ or ATOMIC to or from the target's memory
// in region r. Again: the share is not mapped here yet.
Step copy_remote(DirectPeer& peer, const SqEntry& e, const Shape& s, const core::MrRegion& r) {
  const SendWqe& w = e.wqe;
  const uint64_t target = r.addr + (w.remote_addr - r.iova);
  if (r.share_id == 0)
    // Memory the target could not share (stack, private file mapping, hugetlbfs): copied by the
    // kernel between the address spaces, still inside the copy window.
    return !peer.vm_denied && copy_across(peer, w, e.host, target, s.len) ? Step::Done : Step::Fallback;
  const DirectPeer::Mapping* m = peer.mapped(r.share_id, s.writable);
  if (!m) return Step::Again;
  if (target < m->base || target - m->base > m->length || s.len > m->length - (target - m->base))
    return Step::Fallback;
  copy_one_sided(w, e.host, m->local + (target - m->base), s.len);
  return Step::Done;
}

// One try: our busy slot set (the copy window), the target QP live and the access checked under an
// unchanged key table, room in the inbox for a two-sided operation; then the copy, the message, and
// the wake-up. Again (first try only): the share was not mapped, and now is.
Step attempt(DirectPeer& peer, Qp& qp, SqEntry& e, const Shape& s, bool first) {
  const SendWqe& w = e.wqe;
  DirectPeerSlot& slot = peer.slots[peer.slot];
  const DirectQpDesc& d = peer.shared->qps[qp.direct.peer_desc];
  slot.busy.store(1, std::memory_order_seq_cst);
  auto leave = [&] { slot.busy.store(0, std::memory_order_release); };
  const uint64_t seq = peer.key_seq->load(std::memory_order_seq_cst);
  const auto st = static_cast<QpState>(d.state.load(std::memory_order_acquire));
  bool ok = !(seq & 1) && d.qpn.load(std::memory_order_acquire) == qp.dest_qpn &&
            (st == QpState::Rtr || st == QpState::Rts || st == QpState::Sqd);
  core::MrRegion r{};
  if (ok && s.remote_mem) ok = remote_region(peer, d, w, s, seq, &r);
  Room room;
  if (ok && s.two_sided) ok = receive_room(peer, d, qp.direct.recv, s.send ? s.len : 0, &room);
  if (!ok || peer.key_seq->load(std::memory_order_seq_cst) != seq) {
    leave();
    return Step::Fallback;
  }
  if (s.remote_mem) {
    // Read under an unchanged even seq: a consistent copy, worth keeping.
    peer.cached_seq = seq;
    peer.cached_rkey = w.rkey;
    peer.cached_region = r;
    if (const Step c = copy_remote(peer, e, s, r); c != Step::Done) {
      leave();
      // First use of this range: ask the target for it (its server thread answers), outside the copy
      // window, and check everything again.
      return c == Step::Again && first && peer.mapping(r.share_id, w.rkey, s.writable) ? Step::Again
                                                                                     : Step::Fallback;
    }
  }
  // On an SRQ the WQE checked is ours only if nobody claimed it since: the last step before the message
  // (a WRITE_WITH_IMM's data, already copied, is simply copied again).
  if (room.claim) {
    uint64_t expected = room.index;
    if (!room.claim->compare_exchange_strong(expected, room.index + 1, std::memory_order_acq_rel)) {
      leave();
      return Step::Contended;
    }
  }
  uint32_t sent = 0;
  if (room.inbox) {
    post_to_inbox(*room.inbox, e, s.send ? s.len : 0, room.index);
    sent = static_cast<uint32_t>(room.inbox->head);
    ++qp.direct.recv.next_wqe;
  }
  leave();
  if (room.inbox) wake_if_armed(peer, d, qp.direct.peer_wake_fd, (w.flags & kSolicited) != 0, sent);
  return Step::Done;
}

}  // namespace

DirectResult DirectInitiator::execute(Qp& qp, SqEntry& e, uint64_t now) {
  const SendWqe& w = e.wqe;
  const Shape s = shape_of(w, qp.cfg.type);
  DirectPeer* peer = reconnect_if_due(qp, now);
  if (!peer || peer->dead || (!s.two_sided && !s.one_sided) || (!s.two_sided && w.length == 0))
    return DirectResult::Fallback;
  if (s.send && w.length > DirectInbox::kMaxMessage) return DirectResult::Fallback;
  // A poster's thread passes no time (now 0): the coarse clock is enough here and much cheaper. Signed,
  // as the coarse clock lags the precise one the progress thread passes by up to a tick.
  if (!now) now = coarse_now_ns();
  if (!peer_alive(*peer, now)) return DirectResult::Fallback;
  if (s.atomic && w.remote_addr % 8 != 0) return DirectResult::Fallback;
  // A few tries: one after mapping a share, and some while other takers claim the SRQ WQE first.
  bool first = true;
  for (int i = 0; i < 8; ++i) {
    const Step step = attempt(*peer, qp, e, s, first);
    if (step == Step::Again) first = false;
    if (step != Step::Again && step != Step::Contended)
      return step == Step::Done ? DirectResult::Done : DirectResult::Fallback;
  }
  return DirectResult::Fallback;
}

}  // namespace softrdma::transport
