// RAW_PACKET QPs on the raw-packet path (raw_path.h): each send WQE is one whole Ethernet frame,
// handed to the QP's AF_PACKET port as it is; each received frame that one of the QP's flows matches fills one receive WQE (byte_len = the
// frame's length). An RSS QP has no queues of its own: the Toeplitz hash of the frame's addresses and
// ports picks a WQ of its indirection table, whose RQ and CQ take the frame.
#include <sys/epoll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/engine.h"
#include "transport/raw_path.h"
#include "transport/srq.h"
#include "transport/work_request.h"
#include "wire/ethernet.h"

namespace softrdma::transport {

namespace {
constexpr int kRawBurst = 64;                 // frames one QP sends, or receives, per progress pass
constexpr uint32_t kEthHeader = 14;
constexpr uint32_t kVlanTag = 4;

using Base = net::FrameTerm::Base;

void add_bytes(net::FrameRule& r, Base base, uint16_t off, const uint8_t* val, const uint8_t* mask, size_t n) {
  // In 4-byte (then 2- and 1-byte) pieces, skipping pieces whose mask is all zero.
  size_t i = 0;
  while (i < n) {
    uint8_t w = n - i >= 4 ? 4 : n - i >= 2 ? 2 : 1;
    uint32_t v = 0, m = 0;
    for (uint8_t k = 0; k < w; ++k) {
      v = v << 8 | val[i + k];
      m = m << 8 | mask[i + k];
    }
    if (m) r.terms.push_back({base, static_cast<uint16_t>(off + i), w, m, v & m});
    i += w;
  }
}

void add_field(net::FrameRule& r, Base base, uint16_t off, uint8_t width, uint32_t val, uint32_t mask) {
  if (mask) r.terms.push_back({base, off, width, mask, val & mask});
}
}  // namespace

bool flow_rule(const FlowMatch& m, net::FrameRule* out) {
  net::FrameRule r;
  if (m.match_all) {
    *out = r;
    return true;
  }
  if (m.has_ipv4 && m.has_ipv6) return false;
  if (m.l4 != FlowMatch::L4::None && !m.has_ipv4 && !m.has_ipv6) return false;
  if (m.has_eth) {
    add_bytes(r, Base::L2, 0, m.eth.dst, m.eth_mask.dst, 6);
    add_bytes(r, Base::L2, 6, m.eth.src, m.eth_mask.src, 6);
    add_field(r, Base::L2, 12, 2, m.eth.ether_type, m.eth_mask.ether_type);
    add_field(r, Base::Vlan, 0, 2, m.eth.vlan_tci, m.eth_mask.vlan_tci);
  }
  uint8_t l4_proto = m.l4 == FlowMatch::L4::Tcp ? 6 : 17;
  if (m.has_ipv4) {
    r.l3 = net::FrameRule::L3::Ipv4;
    add_field(r, Base::L2, 12, 2, 0x0800, 0xFFFF);
    add_field(r, Base::L3, 1, 1, m.ipv4.tos, m.ipv4_mask.tos);
    add_field(r, Base::L3, 6, 1, uint32_t{m.ipv4.flags} << 5, (uint32_t{m.ipv4_mask.flags} & 7) << 5);
    add_field(r, Base::L3, 8, 1, m.ipv4.ttl, m.ipv4_mask.ttl);
    add_field(r, Base::L3, 9, 1, m.ipv4.proto, m.ipv4_mask.proto);
    add_field(r, Base::L3, 12, 4, m.ipv4.src, m.ipv4_mask.src);
    add_field(r, Base::L3, 16, 4, m.ipv4.dst, m.ipv4_mask.dst);
    if (m.l4 != FlowMatch::L4::None) add_field(r, Base::L3, 9, 1, l4_proto, 0xFF);
  }
  if (m.has_ipv6) {
    r.l3 = net::FrameRule::L3::Ipv6;
    add_field(r, Base::L2, 12, 2, 0x86DD, 0xFFFF);
    // version 4 | traffic class 8 | flow label 20
    add_field(r, Base::L3, 0, 4, uint32_t{m.ipv6.traffic_class} << 20 | (m.ipv6.flow_label & 0xFFFFF),
              uint32_t{m.ipv6_mask.traffic_class} << 20 | (m.ipv6_mask.flow_label & 0xFFFFF));
    add_field(r, Base::L3, 6, 1, m.ipv6.next_hdr, m.ipv6_mask.next_hdr);
    add_field(r, Base::L3, 7, 1, m.ipv6.hop_limit, m.ipv6_mask.hop_limit);
    add_bytes(r, Base::L3, 8, m.ipv6.src, m.ipv6_mask.src, 16);
    add_bytes(r, Base::L3, 24, m.ipv6.dst, m.ipv6_mask.dst, 16);
    if (m.l4 != FlowMatch::L4::None) add_field(r, Base::L3, 6, 1, l4_proto, 0xFF);
  }
  if (m.l4 != FlowMatch::L4::None) {
    add_field(r, Base::L4, 0, 2, m.ports.src, m.ports_mask.src);
    add_field(r, Base::L4, 2, 2, m.ports.dst, m.ports_mask.dst);
  }
  *out = std::move(r);
  return true;
}

uint32_t toeplitz(const uint8_t* key, size_t key_len, const uint8_t* input, size_t len) {
  // For every set bit of the input, XOR in the 32 key bits starting at that bit's position.
  uint32_t hash = 0;
  if (key_len < 4) return 0;
  uint32_t window = uint32_t{key[0]} << 24 | uint32_t{key[1]} << 16 | uint32_t{key[2]} << 8 | key[3];
  size_t next_key_byte = 4;
  for (size_t i = 0; i < len; ++i) {
    const uint8_t next = next_key_byte < key_len ? key[next_key_byte] : 0;
    ++next_key_byte;
    for (int b = 7; b >= 0; --b) {
      if (input[i] & (1u << b)) hash ^= window;
      window = window << 1 | ((next >> b) & 1);
    }
  }
  return hash;
}

uint32_t rss_hash(const std::vector<uint8_t>& key, uint64_t fields, const net::FrameView& f) {
  uint8_t input[36];
  size_t n = 0;
  if (f.len < kEthHeader) return 0;
  const uint16_t type = static_cast<uint16_t>(f.data[12] << 8 | f.data[13]);
  const uint8_t* l3 = f.data + kEthHeader;
  const uint32_t l3_len = f.len - kEthHeader;
  uint8_t proto = 0;
  uint32_t l4_off = 0;
  if (type == 0x0800 && l3_len >= 20) {
    if (fields & kHashSrcIpv4) std::memcpy(input + n, l3 + 12, 4), n += 4;
    if (fields & kHashDstIpv4) std::memcpy(input + n, l3 + 16, 4), n += 4;
    proto = l3[9];
    l4_off = 4u * (l3[0] & 0x0F);
  } else if (type == 0x86DD && l3_len >= 40) {
    if (fields & kHashSrcIpv6) std::memcpy(input + n, l3 + 8, 16), n += 16;
    if (fields & kHashDstIpv6) std::memcpy(input + n, l3 + 24, 16), n += 16;
    proto = l3[6];
    l4_off = 40;
  }
  if (l4_off && l3_len >= l4_off + 4) {
    const uint64_t src = proto == 6 ? uint64_t{kHashSrcPortTcp} : proto == 17 ? uint64_t{kHashSrcPortUdp} : 0;
    const uint64_t dst = proto == 6 ? uint64_t{kHashDstPortTcp} : proto == 17 ? uint64_t{kHashDstPortUdp} : 0;
    if (fields & src) std::memcpy(input + n, l3 + l4_off, 2), n += 2;
    if (fields & dst) std::memcpy(input + n, l3 + l4_off + 2, 2), n += 2;
  }
  return toeplitz(key.data(), key.size(), input, n);
}

bool raw_has_flows(const Qp& qp) {
  const auto* s = dynamic_cast<const RawState*>(qp.path_state.get());
  return s && !s->flows.empty();
}

int RawPath::join(Qp& qp) {
  auto st = std::make_unique<RawState>();
  try {
    st->port = std::make_unique<net::RawPort>(iface().ifindex, iface().loopback);
  } catch (const std::system_error& e) {
    return e.code().value() ? e.code().value() : EPERM;
  }
  watch(st->port->fd(), EPOLLIN);
  qp.path_state = std::move(st);
  qp.path.store(this, std::memory_order_relaxed);
  return 0;
}

void RawPath::release(Qp& qp) {
  RawState& s = state(qp);
  unwatch(s.port->fd());
  if (!s.flows.empty()) --rx_qps_;
  qp.path.store(nullptr, std::memory_order_relaxed);
  qp.path_state.reset();
}

bool RawPath::carries(const Qp&, const SendWqe& w) const { return work_request(w.op, QpType::Raw).allowed; }

int RawPath::attach_flow(Qp& qp, const net::FrameRule& rule, uint32_t* handle) {
  std::lock_guard lock(engine_lock());
  if (qp.on_path() != this) return EOPNOTSUPP;
  RawState& raw = state(qp);
  std::vector<net::FrameRule> rules;
  for (const auto& [h, r] : raw.flows) rules.push_back(r);
  rules.push_back(rule);
  if (int rc = raw.port->set_rules(rules)) return rc;
  if (raw.flows.empty()) ++rx_qps_;
  *handle = raw.next_flow++;
  raw.flows.emplace_back(*handle, rule);
  return 0;
}

int RawPath::detach_flow(Qp& qp, uint32_t handle) {
  std::lock_guard lock(engine_lock());
  if (qp.on_path() != this) return EINVAL;
  RawState& raw = state(qp);
  auto it = std::find_if(raw.flows.begin(), raw.flows.end(), [&](const auto& f) { return f.first == handle; });
  if (it == raw.flows.end()) return EINVAL;
  raw.flows.erase(it);
  std::vector<net::FrameRule> rules;
  for (const auto& [h, r] : raw.flows) rules.push_back(r);
  if (raw.flows.empty()) --rx_qps_;
  // Frames already queued under the old rules are refused by the software match.
  return raw.port->set_rules(rules);
}

Wq* RawPath::create_wq(uint32_t pd, core::CompletionQueue* cq, uint32_t max_wr, uint32_t max_sge) {
  using L = core::DeviceLimits;
  if (!cq || max_wr > L::kMaxQpWr || max_sge > L::kMaxSge) {
    errno = EINVAL;
    return nullptr;
  }
  auto wq = std::make_unique<Wq>();
  wq->pd = pd;
  wq->cq = cq;
  wq->max_sge = std::max<uint32_t>(max_sge, 1);
  if (!placement().alloc_recv_ring(wq->rq, max_wr, &wq->rq_bytes)) return nullptr;
  std::lock_guard lock(engine_lock());
  wq->wqn = next_wqn_++ & 0xFFFFFF;
  wqs_.push_back(wq.get());
  return wq.release();
}

void RawPath::flush_wq(Wq& wq) {
  for (uint64_t i = wq.rq.tail.load(); i != wq.rq.head.load(std::memory_order_acquire); ++i) {
    const core::Cqe c = wqe_cqe(wq.wqn, wq.rq.at(i).wr_id, WcStatus::WrFlushErr, core::WcOpcode::Recv);
    wq.rq.tail.store(i + 1, std::memory_order_release);
    post_cqe(wq.cq, c, false);
  }
}

int RawPath::modify_wq(Wq& wq, WqState state) {
  std::lock_guard lock(engine_lock());
  switch (state) {
    case WqState::Reset:
      // Back to empty: what was posted is dropped without completions (as a QP's reset does).
      if (wq.state.load() != WqState::Reset) {
        wq.rq.head.store(0);
        wq.rq.tail.store(0);
      }
      break;
    case WqState::Err: flush_wq(wq); break;
    case WqState::Rdy: break;
  }
  wq.state.store(state, std::memory_order_release);
  return 0;
}

void RawPath::destroy_wq(Wq* wq) {
  {
    std::lock_guard lock(engine_lock());
    wqs_.erase(std::remove(wqs_.begin(), wqs_.end(), wq), wqs_.end());
    release_recv_ring(wq->rq.slots, wq->rq_bytes);
  }
  delete wq;
}

int RawPath::post_wq_recv(Wq& wq, const RecvWqe* wqes, int n, int* bad) {
  // WQEs may be posted in RESET already (they wait for RDY); in ERR they are flushed.
  const WqState st = wq.state.load(std::memory_order_acquire);
  int rc = 0;
  {
    std::lock_guard lock(wq.rq.producer_lock);
    uint64_t head;
    rc = push_recv_wqes(wq.rq, wqes, n, wq.max_sge, bad, &head);
  }
  if (st == WqState::Err) {
    // A WQ in error completes what is posted to it with a flush error.
    std::lock_guard lock(engine_lock());
    flush_wq(wq);
  }
  return rc;
}

bool RawPath::transmit(Qp& qp, uint64_t) {
  RawState& raw = state(qp);
  bool did = false;
  int budget = kRawBurst;
  const uint64_t head = std::min(qp.sq.head.load(std::memory_order_acquire), qp.req.sq_stop_at);
  while (budget-- > 0 && qp.req.send_index < head) {
    SqEntry& e = qp.sq.at(qp.req.send_index);
    did = true;
    if (!e.started) {
      e.started = true;
      e.npkts = 1;
      // A frame holds at least its Ethernet header and at most the link MTU of payload, plus a tag.
      if (e.wqe.length < kEthHeader || e.wqe.length > uint64_t{iface().mtu} + kEthHeader + kVlanTag) {
        e.status = WcStatus::LocLenErr;
      } else if (!requester().prepare_wqe(qp, e)) {
        // prepare_wqe set the status (LOC_PROT_ERR for a bad lkey or range).
      }
    }
    if (e.status == WcStatus::Success) {
      const uint32_t len = static_cast<uint32_t>(e.wqe.length);
      const uint8_t* frame = nullptr;
      if (e.wqe.flags & kInline) {
        frame = e.wqe.inline_data;
      } else if (e.wqe.num_sge == 1) {
        frame = e.host[0];
      } else {
        raw_buf_.resize(std::max<size_t>(raw_buf_.size(), len));
        uint8_t* dst = raw_buf_.data();
        bool whole = for_each_sge_piece(e.wqe.sge, e.host, e.wqe.num_sge, 0, len, [&](uint8_t* p, uint64_t n) {
          if (!p) return false;
          std::memcpy(dst, p, n);
          dst += n;
          return true;
        });
        frame = whole ? raw_buf_.data() : nullptr;
      }
      if (frame && (e.wqe.flags & kIpCsum)) {
        // The device fills in the IPv4 and TCP/UDP checksums (IPv6: TCP/UDP): on a copy, never in the
        // caller's buffer.
        if (frame != raw_buf_.data()) {
          raw_buf_.resize(std::max<size_t>(raw_buf_.size(), len));
          std::memcpy(raw_buf_.data(), frame, len);
          frame = raw_buf_.data();
        }
        wire::fill_ip_checksums(raw_buf_.data(), len);
      }
      if (!frame) {
        e.status = WcStatus::LocProtErr;  // its memory was deregistered meanwhile
      } else {
        const int rc = raw.port->send(frame, len);
        if (rc == EAGAIN || rc == ENOBUFS) return did;  // the socket is full: this WQE again next pass
        if (rc) {
          count(&qp, &core::Counters::raw_send_errors);
          e.status = WcStatus::LocQpOpErr;
        } else {
          count(&qp, &core::Counters::tx_packets);
          count(&qp, &core::Counters::tx_bytes, len);
        }
      }
    }
    e.acked = true;
    if (e.status != WcStatus::Success) qp.req.sq_stop_at = qp.req.send_index + 1;
    ++qp.req.send_index;
    completer().complete_in_order(qp);
    if (e.status != WcStatus::Success) return true;
  }
  return did;
}

bool RawPath::raw_place(WorkQueue<RecvWqe>& rq, uint32_t pd, core::CompletionQueue* cq, uint32_t qp_num,
                        const net::FrameView& f, Qp* counted, WcStatus* status) {
  const uint64_t tail = rq.tail.load(std::memory_order_relaxed);
  if (tail == rq.head.load(std::memory_order_acquire)) {
    count(counted, &core::Counters::raw_drop_no_recv);
    return false;
  }
  const RecvWqe& w = rq.at(tail);
  core::Cqe c = wqe_cqe(qp_num, w.wr_id, WcStatus::Success, core::WcOpcode::Recv);
  const uint32_t len = net::RawPort::wire_length(f);
  uint8_t* host[core::DeviceLimits::kMaxSge] = {};
  c.status = placement().resolve_recv_sges(w, pd, len, host);
  if (c.status == WcStatus::Success) {
    const uint8_t* src = f.data;
    if (f.has_vlan) {
      raw_buf_.resize(std::max<size_t>(raw_buf_.size(), len));
      net::RawPort::wire_frame(f, raw_buf_.data(), len);
      src = raw_buf_.data();
    }
    scatter_recv(w, host, 0, src, len);  // every SGE was resolved just above: all of it is placed
    c.byte_len = len;
    count(counted, &core::Counters::rx_packets);
    count(counted, &core::Counters::rx_bytes, len);
  }
  rq.tail.store(tail + 1, std::memory_order_release);
  post_cqe(cq, c, false);
  *status = c.status;
  return true;
}

void RawPath::raw_deliver(Qp& qp, const net::FrameView& f) {
  WcStatus st = WcStatus::Success;
  if (!qp.cfg.rss_table.empty()) {
    // RSS: the QP's own state does not matter, the chosen WQ's does.
    const uint32_t hash = rss_hash(qp.cfg.rss_key, qp.cfg.rss_fields, f);
    Wq& wq = *qp.cfg.rss_table[hash & (qp.cfg.rss_table.size() - 1)];
    if (wq.state.load(std::memory_order_acquire) != WqState::Rdy) {
      count(&qp, &core::Counters::raw_drop_bad_state);
      return;
    }
    if (raw_place(wq.rq, wq.pd, wq.cq, wq.wqn, f, &qp, &st) && st != WcStatus::Success) {
      // A local error on the receive side leaves the WQ in error (as it leaves a QP, IBTA 10.7.2).
      wq.state.store(WqState::Err, std::memory_order_release);
      flush_wq(wq);
    }
    return;
  }
  const QpState s = qp.state.load(std::memory_order_acquire);
  if (s != QpState::Rtr && s != QpState::Rts) {
    count(&qp, &core::Counters::raw_drop_bad_state);
    return;
  }
  if (raw_place(qp.rq, qp.cfg.pd, qp.cfg.recv_cq, qp.qpn, f, &qp, &st) && st != WcStatus::Success)
    move_to_error(qp);
}

bool RawPath::receive(Qp& qp) {
  RawState& raw = state(qp);
  if (raw.flows.empty()) return false;
  bool did = false;
  for (int i = 0; i < kRawBurst; ++i) {
    uint64_t filtered = 0;
    const net::FrameView* f = raw.port->receive(&filtered);
    if (filtered) count(&qp, &core::Counters::raw_drop_filtered, filtered);
    if (!f) return did;
    did = true;
    raw_deliver(qp, *f);
  }
  return did;
}

}  // namespace softrdma::transport
