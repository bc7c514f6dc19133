// Tag matching SRQs (ibv_create_srq_ex(3) "Tag matching", ibv_post_srq_ops(3), ibv_wc_read_tm_info in
// ibv_create_cq_ex(3)), as a ConnectX does it in hardware. The SRQ keeps a matching list of tagged
// buffers (list operations ADD/DEL/SYNC) beside its ordinary receive WQEs. A SEND on an RC QP attached
// to it starts with a TMH (tm_types.h):
//   NO_TAG: the whole message to an ordinary WQE, IBV_WC_TM_NO_TAG;
//   EAGER:  matched against the list in posting order (TMH.tag & mask); a match takes the payload after
//           the TMH into the tagged buffer (IBV_WC_TM_RECV, TM_MATCH | TM_DATA_VALID); no match, or
//           matching paused, takes the whole message to an ordinary WQE as unexpected (IBV_WC_TM_RECV
//           without flags), after which matching stays paused until software reports, with
//           IBV_OPS_TM_SYNC, that it handled every unexpected message (phase synchronisation);
//   RNDV:   the TMH is followed by an RVH (va, rkey, len). A match completes TM_MATCH at once; the
//           engine then READs the sender's data into the tagged buffer through this QP's own requester
//           and, once it is in, completes TM_DATA_VALID and SENDs a FIN (a TMH with opcode FIN, the
//           message's tag and app_ctx) back to the sender, which takes one of its receive WQEs.
// Everything here runs under the engine lock. Messages to QPs on SRQs always go by packets (the direct
// path gives such QPs no inbox), so the responder is the only place messages are matched.
#include <algorithm>
#include <cstring>

#include "transport/engine.h"
#include "transport/srq.h"
#include "wire/bytes.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace softrdma::transport {

namespace {
using TmKind = Qp::ResponderState::TmKind;

// The first matching entry of the list in posting order; nullptr when none matches.
tm::Tag* find_match(tm::State& st, uint64_t tag) {
  tm::Tag* best = nullptr;
  for (tm::Tag& t : st.tags)
    if (t.used && !t.busy && ((t.tag ^ tag) & t.mask) == 0 && (!best || t.seq < best->seq)) best = &t;
  return best;
}

// Whether sq index a is at or after b, for b the low 48 bits of an index (SqCredit::polled()).
bool at_or_after(uint64_t a, uint64_t b) { return ((a - b) & SqCredit::kMask) < (SqCredit::kMask >> 1); }
}  // namespace

core::CompletionQueue* receive_cq(const Qp& qp) {
  return qp.srq && qp.srq->tm ? qp.srq->tm->cq : qp.cfg.recv_cq;
}

int SrqTable::enable_tag_matching(Srq* srq, uint32_t max_num_tags, core::CompletionQueue* cq) {
  if (max_num_tags == 0 || max_num_tags > tm::kMaxNumTags || !cq) return EINVAL;
  auto st = std::make_unique<tm::State>();
  st->cq = cq;
  st->max_num_tags = max_num_tags;
  st->tags.resize(max_num_tags);
  std::lock_guard lock(engine_lock());
  if (srq->qp_refs || srq->tm) return EINVAL;
  srq->tm = std::move(st);
  return 0;
}

int SrqTable::post_op(Srq* srq, tm::Op& op) {
  std::lock_guard lock(engine_lock());
  if (!srq->tm) return EINVAL;  // not a tag-matching SRQ
  tm::State& st = *srq->tm;
  if (op.flags & ~uint32_t{tm::kOpSignaled | tm::kOpSync}) return EINVAL;
  core::Cqe c{};
  c.wr_id = op.wr_id;
  c.status = WcStatus::Success;
  switch (op.opcode) {
    case tm::kAdd: {
      if (op.num_sge > tm::kMaxSge) return EINVAL;
      auto free_slot = std::find_if(st.tags.begin(), st.tags.end(), [](const tm::Tag& t) { return !t.used; });
      if (free_slot == st.tags.end()) return ENOMEM;  // max_num_tags tagged buffers are posted
      tm::Tag& t = *free_slot;
      t.used = true;
      t.busy = false;
      t.seq = st.next_seq++;
      t.tag = op.tag;
      t.mask = op.mask;
      t.recv_wr_id = op.recv_wr_id;
      t.num_sge = op.num_sge;
      t.length = op.length;
      std::copy_n(op.sge, op.num_sge, t.sge);
      op.handle = static_cast<uint32_t>(free_slot - st.tags.begin());
      c.opcode = core::WcOpcode::TmAdd;
      break;
    }
    case tm::kDel:
      if (op.handle >= st.tags.size()) return EINVAL;  // never a handle of this SRQ
      c.opcode = core::WcOpcode::TmDel;
      if (!st.tags[op.handle].used || st.tags[op.handle].busy) {
        // Consumed by a message meanwhile (ibv_post_srq_ops(3)): the operation completes in error.
        c.status = WcStatus::TmErr;
      } else {
        st.tags[op.handle].used = false;
      }
      break;
    case tm::kSync:
      c.opcode = core::WcOpcode::TmSync;
      break;
    default:
      return EINVAL;
  }
  if (op.flags & tm::kOpSync) st.sw_unexpected = op.unexpected_cnt;
  if (!st.in_sync()) c.wc_flags |= core::kWcTmSyncReq;
  // Errors complete whether signaled or not, as send-queue WQEs do.
  if ((op.flags & tm::kOpSignaled) || c.status != WcStatus::Success) post_cqe(st.cq, c, false);
  return 0;
}

uint64_t SrqTable::tm_app_sq_used(Qp& qp, uint64_t head) {
  const uint64_t polled = qp.sq_credit->polled();
  std::vector<uint64_t>& v = qp.tm_sq_internal;
  size_t given_back = 0;
  while (given_back < v.size() && !at_or_after(v[given_back], polled)) ++given_back;
  v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(given_back));
  return ((head - polled) & SqCredit::kMask) - v.size();
}

Verdict Responder::tm_classify(Qp& qp, const wire::OpcodeInfo& info, const wire::Packet& pkt) {
  tm::State& st = *qp.srq->tm;
  qp.resp.tm_kind = TmKind::Plain;
  qp.resp.tm_tag = 0;
  qp.resp.tm_priv = 0;
  const uint8_t* p = pkt.payload;
  const uint8_t op = pkt.payload_len >= tm::kTmhBytes ? p[0] : 0xFF;
  if (op == tm::kNoTag) {
    qp.resp.tm_kind = TmKind::NoTag;
    return check_receive(qp, info);
  }
  if ((op != tm::kEager && op != tm::kRndv) ||
      (op == tm::kRndv && pkt.payload_len < tm::kTmhBytes + tm::kRvhBytes)) {
    // No TMH this SRQ acts on: an ordinary receive. A FIN (the answer to a rendezvous this side sent)
    // is one by design; a message too short for its header, or an unknown opcode, is counted.
    if (op != tm::kFin) count(&qp, &core::Counters::tm_no_header);
    return check_receive(qp, info);
  }
  const uint32_t priv = wire::be::get32(p + 4);
  const uint64_t tag = wire::be::get64(p + 8);
  tm::Tag* t = st.in_sync() ? find_match(st, tag) : nullptr;
  if (!t) {
    Verdict v = check_receive(qp, info);
    if (v.ok()) {
      qp.resp.tm_kind = TmKind::Unexpected;
      ++st.hw_unexpected;
      count(&qp, &core::Counters::tm_unexpected);
    }
    return v;
  }
  if (op == tm::kRndv) return tm_rendezvous(qp, *t, pkt, tag, priv);
  // Expected: the tagged buffer takes what follows the TMH; the entry is consumed.
  RecvWqe& w = qp.resp.srq_wqe;
  w.wr_id = t->recv_wr_id;
  w.num_sge = t->num_sge;
  w.length = t->length;
  std::copy_n(t->sge, t->num_sge, w.sge);
  t->used = false;
  qp.resp.srq_wqe_held = true;
  qp.resp.recv_active = true;
  qp.resp.recv_offset = 0;
  qp.resp.tm_kind = TmKind::Expected;
  qp.resp.tm_tag = tag;
  qp.resp.tm_priv = priv;
  count(&qp, &core::Counters::tm_expected);
  if (placement().resolve_active_recv(qp) != WcStatus::Success) return {Verdict::RemoteOp, WcStatus::LocProtErr};
  return {};
}

Verdict Responder::tm_rendezvous(Qp& qp, tm::Tag& t, const wire::Packet& pkt, uint64_t tag, uint32_t priv) {
  tm::State& st = *qp.srq->tm;
  const uint8_t* rvh = pkt.payload + tm::kTmhBytes;
  const uint64_t va = wire::be::get64(rvh);
  const uint32_t rkey = wire::be::get32(rvh + 8);
  const uint32_t len = wire::be::get32(rvh + 12);
  {
    // The READ and the FIN go into this QP's SQ beside the application's WQEs (create_qp gave it
    // tm::kSqSlots more slots): without room, the sender is told to come back (RNR).
    std::lock_guard producer(qp.sq.producer_lock);
    const uint64_t head = qp.sq.head.load(std::memory_order_relaxed);
    const uint64_t tail = qp.sq.tail.load(std::memory_order_relaxed);
    size_t in_ring = 0;
    for (uint64_t i : qp.tm_sq_internal) in_ring += i >= tail;
    if (in_ring + 2 > tm::kSqSlots || qp.tm_sq_internal.size() + 2 > 4 * tm::kSqSlots ||
        head - tail + 2 > uint64_t{qp.sq.mask} + 1)
      return {Verdict::Rnr};
    const uint32_t handle = static_cast<uint32_t>(&t - st.tags.data());
    SqEntry& r = qp.sq.at(head);
    r.wqe = SendWqe{};
    r.wqe.wr_id = t.recv_wr_id;
    r.wqe.op = WrOp::Read;
    r.wqe.flags = kTmRead;
    r.wqe.imm_be = handle;  // the entry the data is for
    r.wqe.remote_addr = va;
    r.wqe.rkey = rkey;
    r.wqe.num_sge = t.num_sge;
    r.wqe.length = len;
    std::copy_n(t.sge, t.num_sge, r.wqe.sge);
    SqEntry& f = qp.sq.at(head + 1);
    f.wqe = SendWqe{};
    f.wqe.op = WrOp::Send;
    f.wqe.flags = kTmFin | kFence | kInline;  // after the READ has completed
    f.wqe.length = tm::kTmhBytes;
    f.wqe.inline_data[0] = tm::kFin;
    wire::be::put32(f.wqe.inline_data + 4, priv);
    wire::be::put64(f.wqe.inline_data + 8, tag);
    for (SqEntry* e : {&r, &f}) {
      e->started = false;
      e->acked = false;
      e->status = WcStatus::Success;
      e->read_received = 0;
      e->reissued_at = ~0ull;
    }
    // A READ longer than the tagged buffer is not issued: it completes in error at once (below).
    const bool fits = len <= t.length;
    if (fits) {
      qp.tm_sq_internal.push_back(head);
      qp.tm_sq_internal.push_back(head + 1);
      qp.sq.head.store(head + 2, std::memory_order_release);
    } else {
      f.wqe.flags &= ~uint32_t{kFence};
      qp.sq.at(head) = f;
      qp.tm_sq_internal.push_back(head);
      qp.sq.head.store(head + 1, std::memory_order_release);
    }
    t.busy = true;
    core::Cqe c = connected_receive_cqe(qp, t.recv_wr_id, core::WcOpcode::TmRecv, 0, false, 0);
    c.wc_flags = core::kWcTmMatch;
    c.tm_tag = tag;
    c.tm_priv = priv;
    post_cqe(st.cq, c, pkt.bth.solicited);
    if (!fits) {
      core::Cqe e = connected_receive_cqe(qp, t.recv_wr_id, core::WcOpcode::TmRecv, 0, false, 0);
      e.status = WcStatus::LocLenErr;
      t.used = t.busy = false;
      post_cqe(st.cq, e, false);
    }
  }
  count(&qp, &core::Counters::tm_rendezvous);
  qp.resp.tm_kind = TmKind::Discard;  // the header is consumed; nothing of the message is placed
  qp.resp.tm_ack_now = true;
  return {};
}

void SrqTable::tm_drop_sq(Qp& qp) {
  if (!qp.srq || !qp.srq->tm) return;
  // Rendezvous READs that will never complete (the QP is reset or destroyed): their entries are free.
  std::vector<tm::Tag>& tags = qp.srq->tm->tags;
  for (uint64_t i = qp.sq.tail.load(); i != qp.sq.head.load(std::memory_order_acquire); ++i) {
    const SendWqe& w = qp.sq.at(i).wqe;
    if ((w.flags & kTmRead) && w.imm_be < tags.size()) tags[w.imm_be].used = tags[w.imm_be].busy = false;
  }
}

bool SrqTable::tm_sq_done(Qp& qp, const SqEntry& e, uint64_t index, WcStatus status) {
  if (!(e.wqe.flags & (kTmRead | kTmFin))) return false;
  if ((e.wqe.flags & kTmRead) && qp.srq && qp.srq->tm) {
    tm::State& st = *qp.srq->tm;
    core::Cqe c = connected_receive_cqe(qp, e.wqe.wr_id, core::WcOpcode::TmRecv, 0, false, 0);
    c.status = status;
    if (status == WcStatus::Success) {
      c.byte_len = static_cast<uint32_t>(e.wqe.length);
      c.wc_flags = core::kWcTmDataValid;
    }
    if (e.wqe.imm_be < st.tags.size()) st.tags[e.wqe.imm_be].used = st.tags[e.wqe.imm_be].busy = false;
    post_cqe(st.cq, c, false);
  }
  // No CQE gives this slot back: when every slot before it has been, it is given back now.
  if (qp.sq_credit->polled() == (index & SqCredit::kMask))
    qp.sq_credit->give_back(qp.sq_credit->gen(), static_cast<uint32_t>(index));
  return true;
}

}  // namespace softrdma::transport
