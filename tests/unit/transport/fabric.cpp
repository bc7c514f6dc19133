#include "fabric.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "wire/headers.h"
#include "wire/opcode.h"

namespace softrdma::transport::test {

Fabric::~Fabric() {
  // Engines close their ports before the network goes.
  hosts.clear();
}

Host& Fabric::add_host(const wire::IpAddress& ip) {
  auto h = std::make_unique<Host>();
  h->ip = ip;
  net::Interface iface{"mem" + std::to_string(hosts.size()), ip, ip.is_v4() ? 0x00FFFFFFu : 0u,
                       static_cast<uint8_t>(ip.is_v4() ? 24 : 64), 0, 9000, false, {}};
  EngineOptions o;
  o.open_port = [this](const wire::IpAddress& a, uint16_t port) { return net.open(a, port); };
  o.clock = &net;
  o.progress_thread = false;
  o.link_monitor = false;
  o.direct = false;
  h->engine = std::make_unique<Engine>(iface, std::move(o));
  hosts.push_back(std::move(h));
  return *hosts.back();
}

bool Fabric::round() {
  bool did = net.deliver() > 0;
  for (auto& h : hosts) did |= h->engine->step();
  return did;
}

bool Fabric::run_until(const std::function<bool()>& done, uint64_t limit_ns) {
  const uint64_t end = net.now_ns() + limit_ns;
  while (!done()) {
    if (net.now_ns() > end) return false;
    if (round()) {
      net.advance_to(net.now_ns() + kStepNs);
      continue;
    }
    // Idle: jump to whatever happens next.
    uint64_t next = net.next_arrival();
    for (auto& h : hosts)
      if (uint64_t d = h->engine->next_deadline(); d && (!next || d < next)) next = d;
    if (!next) return done();
    net.advance_to(std::max(next, net.now_ns() + 1));
  }
  return true;
}

bool Fabric::settle(uint64_t limit_ns) {
  return run_until(
      [&] {
        if (net.in_flight()) return false;
        for (auto& h : hosts)
          if (h->engine->next_deadline()) return false;
        return true;
      },
      limit_ns);
}

std::unique_ptr<Region> register_region(Engine& e, uint32_t pd, size_t len, uint32_t access) {
  auto r = std::make_unique<Region>();
  r->bytes.assign(std::max<size_t>(len, 1), 0);
  r->mr.addr = r->mr.iova = reinterpret_cast<uint64_t>(r->bytes.data());
  r->mr.length = len;
  r->mr.access = access;
  r->mr.pd = pd;
  if (!e.register_mr(r->mr)) {
    ADD_FAILURE() << "register_mr";
    return nullptr;
  }
  return r;
}

namespace {
void make_end(End& e, Host& h, uint32_t pd, const RcParams& p) {
  e.host = &h;
  e.pd = pd;
  e.scq = h.engine->create_cq(4 * p.max_wr, nullptr);
  e.rcq = h.engine->create_cq(4 * p.max_wr, nullptr);
  QpConfig c;
  c.type = QpType::Rc;
  c.pd = pd;
  c.send_cq = e.scq.get();
  c.recv_cq = e.rcq.get();
  c.max_send_wr = c.max_recv_wr = p.max_wr;
  c.max_send_sge = c.max_recv_sge = 4;
  c.max_inline = 64;
  e.qp = h.engine->create_qp(c);
  ASSERT_NE(e.qp, nullptr);
}

void bring_up(End& e, const End& peer, uint32_t my_psn, uint32_t peer_psn, const RcParams& p) {
  QpModify m;
  m.mask = kModState | kModAccessFlags;
  m.state = QpState::Init;
  m.access_flags = p.access;
  e.engine().modify_qp(e.qp, m);
  if (p.before_rtr) p.before_rtr(e);
  m = {};
  m.mask = kModState | kModPathMtu | kModDestQpn | kModAv | kModRqPsn | kModMaxDestRdAtomic | kModMinRnrTimer;
  m.state = QpState::Rtr;
  m.mtu_bytes = p.mtu;
  m.dest_qpn = peer.qp->qpn;
  m.dest_ip = peer.host->ip;
  m.rq_psn = peer_psn;
  m.max_dest_rd_atomic = p.max_rd_atomic;
  m.min_rnr_timer = p.min_rnr_timer;
  e.engine().modify_qp(e.qp, m);
  m = {};
  m.mask = kModState | kModSqPsn | kModTimeout | kModRetryCnt | kModRnrRetry | kModMaxQpRdAtomic;
  m.state = QpState::Rts;
  m.sq_psn = my_psn;
  m.timeout = p.timeout;
  m.retry_cnt = p.retry_cnt;
  m.rnr_retry = p.rnr_retry;
  m.max_rd_atomic = p.max_rd_atomic;
  e.engine().modify_qp(e.qp, m);
}
}  // namespace

RcPair connect_rc(Fabric&, Host& ha, Host& hb, const RcParams& p) {
  RcPair r;
  make_end(r.a, ha, 1, p);
  make_end(r.b, hb, 1, p);
  if (!r.a.qp || !r.b.qp) return r;
  bring_up(r.a, r.b, p.psn_a, p.psn_b, p);
  bring_up(r.b, r.a, p.psn_b, p.psn_a, p);
  return r;
}

void reconnect_rc(RcPair& r, const RcParams& p) {
  for (End* e : {&r.a, &r.b}) {
    QpModify m;
    m.mask = kModState;
    m.state = QpState::Reset;
    e->engine().modify_qp(e->qp, m);
  }
  bring_up(r.a, r.b, p.psn_a, p.psn_b, p);
  bring_up(r.b, r.a, p.psn_b, p.psn_a, p);
}

void destroy(End& e) {
  if (!e.qp) return;
  e.engine().destroy_qp(e.qp);
  e.qp = nullptr;
  e.engine().destroy_cq(e.scq.get());
  e.engine().destroy_cq(e.rcq.get());
  e.scq.reset();
  e.rcq.reset();
}

namespace {
SendWqe base(uint64_t wr_id, WrOp op) {
  SendWqe w{};
  w.wr_id = wr_id;
  w.op = op;
  w.flags = kSignaled;
  return w;
}
void one_sge(SendWqe& w, const Region& r, uint64_t off, uint32_t len) {
  w.num_sge = 1;
  w.sge[0] = {r.addr(off), len, r.mr.lkey};
  w.length = len;
}
}  // namespace

SendWqe write_wqe(uint64_t wr_id, const Region& src, uint64_t off, uint32_t len, uint64_t raddr, uint32_t rkey) {
  SendWqe w = base(wr_id, WrOp::Write);
  one_sge(w, src, off, len);
  w.remote_addr = raddr;
  w.rkey = rkey;
  return w;
}

SendWqe read_wqe(uint64_t wr_id, const Region& dst, uint64_t off, uint32_t len, uint64_t raddr, uint32_t rkey) {
  SendWqe w = write_wqe(wr_id, dst, off, len, raddr, rkey);
  w.op = WrOp::Read;
  return w;
}

SendWqe atomic_wqe(uint64_t wr_id, WrOp op, const Region& dst, uint64_t off, uint64_t raddr, uint32_t rkey,
                   uint64_t compare_add, uint64_t swap) {
  SendWqe w = base(wr_id, op);
  one_sge(w, dst, off, 8);
  w.remote_addr = raddr;
  w.rkey = rkey;
  w.compare_add = compare_add;
  w.swap = swap;
  return w;
}

SendWqe send_wqe(uint64_t wr_id, const Region& src, uint64_t off, uint32_t len, WrOp op) {
  SendWqe w = base(wr_id, op);
  one_sge(w, src, off, len);
  return w;
}

RecvWqe recv_wqe(uint64_t wr_id, const Region& dst, uint64_t off, uint32_t len) {
  RecvWqe w{};
  w.wr_id = wr_id;
  w.num_sge = 1;
  w.sge[0] = {dst.addr(off), len, dst.mr.lkey};
  w.length = len;
  return w;
}

int post(End& e, const SendWqe& w) {
  int bad = -1;
  return e.engine().post_send(e.qp, &w, 1, &bad);
}

int post(End& e, const RecvWqe& w) {
  int bad = -1;
  return e.engine().post_recv(e.qp, &w, 1, &bad);
}

std::vector<core::Cqe> poll_all(End& e, core::CompletionQueue& cq) {
  std::vector<core::Cqe> out;
  core::Cqe c[16];
  for (int n; (n = e.engine().poll_cq(&cq, c, 16)) > 0;) out.insert(out.end(), c, c + n);
  return out;
}

PacketView view(const uint8_t* data, uint32_t len) {
  PacketView v;
  wire::Packet p;
  if (wire::parse_packet(data, len, p) != wire::ParseError::Ok) return v;
  v.opcode = p.bth.opcode;
  v.psn = p.bth.psn;
  v.dest_qp = p.bth.dest_qp;
  v.ack_req = p.bth.ack_req;
  if (wire::opcode_info(p.bth.opcode).headers & wire::kHdrAeth) v.syndrome = p.aeth.syndrome;
  return v;
}

std::vector<Segment> segments(const net::MemoryNetwork::Offer& o) {
  std::vector<Segment> out;
  const uint32_t step = o.seg_size ? o.seg_size : o.len;
  for (uint32_t off = 0; off < o.len || (off == 0 && o.len == 0); off += step) {
    out.push_back({o.data + off, std::min(step, o.len - off), off});
    if (step == 0) break;
  }
  return out;
}

std::string describe(const PacketView& v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s psn %06x%s", wire::opcode_info(v.opcode).name, v.psn, v.ack_req ? " A" : "");
  std::string s = buf;
  if (wire::opcode_info(v.opcode).headers & wire::kHdrAeth) {
    std::snprintf(buf, sizeof buf, " aeth %02x", v.syndrome);
    s += buf;
  }
  return s;
}

}  // namespace softrdma::transport::test
