// The rdma_cm API (librdmacm.so.1's exported rdma_* calls) over softrdma's libibverbs: translation
// between rdma_cm ids/events and the CM protocol module (src/cm), plus what the API does with verbs
// objects (devices, PDs, CQs, QP state changes with the negotiated parameters). docs/rdmacm.md.
#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <rdma/rdma_verbs.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cm/cm.h"
#include "cm/protect.h"
#include "config/config.h"
#include "verbs/private_abi.h"
#include "rdmacm/event_channel.h"
#include "rdmacm/ids.h"

namespace softrdma::rdmacm {
namespace {

using cm::St;

// The loopback of either family is softrdma_lo's 127.0.0.1 to the transport: ::1 names it in GIDs.
wire::IpAddress transport_ip(const wire::IpAddress& ip) {
  return !ip.is_v4() && ip.is_loopback() ? wire::IpAddress::v4(htonl(INADDR_LOOPBACK)) : ip;
}
// A route's RoCE v2 GID for an address (IPv4 as ::ffff:a.b.c.d).
void set_gid(ibv_gid& g, const wire::IpAddress& ip) { std::memcpy(g.raw, transport_ip(ip).bytes.data(), 16); }
wire::IpAddress gid_ip(const uint8_t* raw) { return wire::IpAddress::from_bytes(raw); }

sockaddr_in* sin_of(sockaddr* a) { return reinterpret_cast<sockaddr_in*>(a); }

// The address an rdma_cm address stands for: an IPv4 one, and of IPv6 the IPv4-mapped (::ffff:a.b.c.d,
// as that IPv4 address), the wildcard (::, unset) and any other. False for another family or a
// link-local address (its scope would have to travel with every GID). Ports sit at the same offset in
// both families (sin_port, sin6_port).
bool ip_of(const sockaddr* a, wire::IpAddress& ip) {
  if (!wire::from_sockaddr(a, &ip)) return false;
  return !ip.is_link_local();
}

// Writes ip:port into an rdma_cm address slot in the family the id uses (an IPv4 address IPv4-mapped,
// or :: for a wildcard, when AF_INET6).
void set_addr(sockaddr* slot, sa_family_t family, const wire::IpAddress& ip, uint16_t port_be) {
  if (family == AF_INET6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(slot);
    std::memset(s6, 0, sizeof *s6);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = port_be;
    if (ip.is_set()) std::memcpy(s6->sin6_addr.s6_addr, ip.bytes.data(), 16);
    return;
  }
  auto* s4 = sin_of(slot);
  std::memset(s4, 0, sizeof *s4);
  s4->sin_family = AF_INET;
  s4->sin_addr.s_addr = ip.v4_be();
  s4->sin_port = port_be;
}

// The kernel's default for RDMA_OPTION_ID_AFONLY on an AF_INET6 id: net.ipv6.bindv6only.
bool default_v6_only() {
  FILE* f = std::fopen("/proc/sys/net/ipv6/bindv6only", "re");
  int v = 0;
  if (f) {
    if (std::fscanf(f, "%d", &v) != 1) v = 0;
    std::fclose(f);
  }
  return v != 0;
}

// UD port spaces connect with SIDR (IBTA 12.11) instead of REQ/REP/RTU.
bool is_ud(const Id* id) { return id->conn.ud; }

// The address vector to reach a peer GID from port 1, GID index 0 (what a UD event hands out).
void fill_ah_attr(ibv_ah_attr& ah, const ibv_gid& dgid) {
  std::memset(&ah, 0, sizeof ah);
  ah.is_global = 1;
  ah.port_num = 1;
  ah.grh.dgid = dgid;
  ah.grh.sgid_index = 0;
  ah.grh.hop_limit = 64;
}

Id* id_of(cm::Connection& c) { return static_cast<Id*>(c.owner); }

// The id's route after the protocol bound or resolved its addresses.
void set_src(Id* id) {
  set_addr(&id->pub.route.addr.src_addr, id->family, id->conn.local_ip, htons(id->conn.local_port));
}

// What the ABI layer keeps beside the protocol (under cm::Manager::mu).
struct Abi final : cm::Consumer {
  std::vector<Device*> devices;
  std::condition_variable acked;  // an event was acked (rdma_destroy_id, rdma_migrate_id wait)

  Device* device_for(const wire::IpAddress& ip);
  const cm::Device* device_for_ip(const wire::IpAddress& ip) override { return device_for(ip); }
  cm::Connection* make_passive(cm::Connection& listener) override;
  void discard(cm::Connection& c) override { delete id_of(c); }
  void event(cm::Connection& c, const cm::Event& e) override;
  bool has_qp(const cm::Connection& c) override { return static_cast<const Id*>(c.owner)->pub.qp != nullptr; }
  int ready_qp(cm::Connection& c) override;
  uint32_t qp_num(const cm::Connection& c) override {
    const ibv_qp* qp = static_cast<const Id*>(c.owner)->pub.qp;
    return qp ? qp->qp_num : 0;
  }
  int attach_iwarp(cm::Connection& c, const cm::IwarpConn& ic) override;
  bool peer_gone(const cm::Connection& c) override {
    // By number in the id's device: a QP the application destroyed (or made elsewhere) is not found.
    const Id* id = static_cast<const Id*>(c.owner);
    return id->conn_qpn && id->pub.verbs && softrdma_qpn_peer_gone(id->pub.verbs, id->conn_qpn) == 1;
  }
  void wire_rejected(cm::Connection& c) override {
    if (Device* d = device_for(c.local_ip)) softrdma_count_wire_reject(d->ctx);
  }
  void peer_ended(cm::Connection& c, bool gone) override {
    if (Device* d = device_for(c.local_ip))
      softrdma_count_cm_disconnect(d->ctx, gone ? SOFTRDMA_CM_PEER_GONE : SOFTRDMA_CM_DREQ_RCVD);
  }
  void before_exit() override { softrdma_flush_held_acks(); }
  bool default_iwarp() override {
    device_for(wire::IpAddress{});
    return !devices.empty() && devices.front()->iwarp;
  }
};


Abi& abi() {
  static Abi* a = new Abi;  // leaked, as the manager: ids may be used from exit-time code
  return *a;
}

cm::Manager& M() {
  static cm::Manager& m = []() -> cm::Manager& {
    cm::Manager& mgr = cm::Manager::get();
    std::lock_guard lock(mgr.mu);
    mgr.set_consumer(&abi());
    return mgr;
  }();
  return m;
}

Device* Abi::device_for(const wire::IpAddress& ip) {
  if (devices.empty()) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    for (int i = 0; list && i < n; ++i) {
      ibv_context* ctx = ibv_open_device(list[i]);
      if (!ctx) continue;
      auto* d = new Device;
      d->ctx = ctx;
      d->iwarp = ctx->device->transport_type == IBV_TRANSPORT_IWARP;
      ibv_gid g;
      if (ctx->device->transport_type == IBV_TRANSPORT_IWARP) {
        // An iWARP device's GID is its MAC, not its address: libibverbs tells (private ABI).
        uint8_t raw[16];
        if (softrdma_device_ip(list[i], raw) == 0) d->ip = wire::IpAddress::from_bytes(raw);
      } else if (ibv_query_gid(ctx, 1, 0, &g) == 0) {
        d->ip = gid_ip(g.raw);
      }
      ibv_device_attr da;
      if (ibv_query_device(ctx, &da) == 0) {
        d->guid_be = da.node_guid;
        d->max_rd_atom = static_cast<uint8_t>(std::min(da.max_qp_rd_atom, 255));
        d->max_ird = static_cast<uint16_t>(std::clamp(da.max_qp_rd_atom, 0, 0x3fff));
        d->max_ord = static_cast<uint16_t>(std::clamp(da.max_qp_init_rd_atom, 0, 0x3fff));
      }
      ibv_port_attr pa;
      if (ibv_query_port(ctx, 1, &pa) == 0) d->mtu = static_cast<uint8_t>(pa.active_mtu);
      devices.push_back(d);
    }
    if (list) ibv_free_device_list(list);
  }
  // Unset (a wildcard): every device is open now, and none is the one.
  if (!ip.is_set()) return nullptr;
  for (Device* d : devices)
    if (d->ip == ip) return d;
  // Any 127/8 address, and ::1, is the loopback device's.
  if (ip.is_loopback())
    for (Device* d : devices)
      if (d->ip.is_v4() && d->ip.is_loopback()) return d;
  return nullptr;
}

// An id bound to a device gets its context and, as librdmacm does, the device's default PD
// (rdma_cm_id.pd), made when the first id attaches: applications (pyverbs' CMID among them) create
// CQs, QPs and MRs on id->pd without allocating one.
void attach_device(Id* id) {
  Device* d = id->dev();
  if (!d) return;
  id->pub.verbs = d->ctx;
  if (!d->pd) d->pd = ibv_alloc_pd(d->ctx);
  if (!id->pub.pd) id->pub.pd = d->pd;
}

void post(Id* id, rdma_cm_event_type type, int status, const uint8_t* pdata = nullptr, uint8_t plen = 0,
          Id* listen = nullptr, Event** out = nullptr) {
  auto* chan = reinterpret_cast<Channel*>(id->pub.channel);
  if (!chan) return;
  auto* e = new Event;
  e->ev.id = &id->pub;
  e->ev.listen_id = listen ? &listen->pub : nullptr;
  e->ev.event = type;
  e->ev.status = status;
  if (pdata && plen) {
    std::memcpy(e->pdata, pdata, plen);
    e->ev.param.conn.private_data = e->pdata;
    e->ev.param.conn.private_data_len = plen;
  }
  chan->queue.push_back(e);
  if (out) *out = e;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(chan->write_fd, &one, sizeof one);
}

cm::Connection* Abi::make_passive(cm::Connection& listener) {
  Id* L = id_of(listener);
  auto* c = new Id;
  c->conn.owner = c;
  c->pub.channel = L->pub.channel;
  c->pub.context = L->pub.context;
  c->pub.ps = L->pub.ps;
  c->pub.qp_type = listener.ud ? IBV_QPT_UD : L->pub.qp_type;
  c->pub.port_num = 1;
  c->sync = L->sync;
  return &c->conn;
}

void Abi::event(cm::Connection& c, const cm::Event& ce) {
  Id* id = id_of(c);
  Event* e = nullptr;
  rdma_cm_event_type type = RDMA_CM_EVENT_ESTABLISHED;
  switch (ce.kind) {
    case cm::EventKind::ConnectRequest: {
      // The new id's addresses: ours as the REQ named them, the peer's from its rdma_cm IP header.
      attach_device(id);
      auto& r = id->pub.route;
      set_src(id);
      // An IPv6 connection's addresses are AF_INET6 whatever family the listener was bound with.
      if (!c.peer_ip.is_v4()) id->family = AF_INET6;
      set_src(id);
      set_addr(&r.addr.dst_addr, id->family, c.peer_ip, htons(c.peer_port));
      set_gid(r.addr.addr.ibaddr.sgid, c.local_ip);
      set_gid(r.addr.addr.ibaddr.dgid, c.peer_ip);
      r.addr.addr.ibaddr.pkey = 0xFFFF;
      type = RDMA_CM_EVENT_CONNECT_REQUEST;
      break;
    }
    case cm::EventKind::ConnectResponse: type = RDMA_CM_EVENT_CONNECT_RESPONSE; break;
    case cm::EventKind::ConnectError: type = RDMA_CM_EVENT_CONNECT_ERROR; break;
    case cm::EventKind::Unreachable: type = RDMA_CM_EVENT_UNREACHABLE; break;
    case cm::EventKind::Rejected: type = RDMA_CM_EVENT_REJECTED; break;
    case cm::EventKind::Established: type = RDMA_CM_EVENT_ESTABLISHED; break;
    case cm::EventKind::Disconnected: type = RDMA_CM_EVENT_DISCONNECTED; break;
  }
  post(id, type, ce.status, ce.private_data, ce.private_data_len, ce.listener ? id_of(*ce.listener) : nullptr, &e);
  if (!e) return;
  const ibv_gid& dgid = id->pub.route.addr.addr.ibaddr.dgid;
  if (type == RDMA_CM_EVENT_CONNECT_REQUEST && c.ud) {
    fill_ah_attr(e->ev.param.ud.ah_attr, dgid);  // the way back to the requester
  } else if (type == RDMA_CM_EVENT_ESTABLISHED && c.ud) {
    auto& u = e->ev.param.ud;
    fill_ah_attr(u.ah_attr, dgid);
    u.qp_num = ce.qp_num;
    u.qkey = ce.qkey;
  } else if (!c.ud) {  // the peer's parameters (all zero where the MAD carries none)
    auto& p = e->ev.param.conn;
    p.responder_resources = ce.responder_resources;
    p.initiator_depth = ce.initiator_depth;
    p.flow_control = ce.flow_control;
    p.retry_count = ce.retry_count;
    p.rnr_retry_count = ce.rnr_retry_count;
    p.srq = ce.srq;
    p.qp_num = ce.qp_num;
  }
}

// Called in the application's threads only (rdma_disconnect, rdma_get_cm_event): the application may
// have destroyed the QP by now without telling us, as it may with rdma-core's librdmacm, which also
// moves the QP to ERR when it hands out the event rather than when the MAD arrives.
void to_error(Id* id) {
  if (!id->pub.qp) return;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(id->pub.qp, &a, IBV_QP_STATE);
}

// RTR then RTS with the negotiated parameters (what rdma_init_qp_attr reports).
void fill_qp_attr(Id* id, ibv_qp_state state, ibv_qp_attr& a, int& mask) {
  const cm::Connection& c = id->conn;
  std::memset(&a, 0, sizeof a);
  a.qp_state = state;
  mask = IBV_QP_STATE;
  bool ud = id->pub.qp_type == IBV_QPT_UD || id->pub.ps == RDMA_PS_UDP || id->pub.ps == RDMA_PS_IPOIB;
  if (state == IBV_QPS_INIT) {
    a.pkey_index = 0;
    a.port_num = 1;
    mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if (ud) {
      a.qkey = RDMA_UDP_QKEY;
      mask |= IBV_QP_QKEY;
    } else {
      a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                          IBV_ACCESS_REMOTE_ATOMIC;
      mask |= IBV_QP_ACCESS_FLAGS;
    }
  } else if (state == IBV_QPS_RTR && !ud) {
    a.path_mtu = static_cast<ibv_mtu>(c.mtu);
    a.dest_qp_num = c.remote_qpn;
    a.rq_psn = c.remote_psn;
    a.max_dest_rd_atomic = std::max<uint8_t>(c.resp_res, 1);
    a.min_rnr_timer = 0;  // 655.36 ms, as the kernel's CM sets it: an RNR NAK waits long, not fails soon
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = id->pub.route.addr.addr.ibaddr.dgid;
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = 64;
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
            IBV_QP_MIN_RNR_TIMER;
  } else if (state == IBV_QPS_RTS) {
    a.sq_psn = c.my_psn;
    mask |= IBV_QP_SQ_PSN;
    if (!ud) {
      a.timeout = c.ack_timeout_opt != 0xFF ? c.ack_timeout_opt : c.ack_timeout;
      a.retry_cnt = c.retry_count;
      a.rnr_retry = c.rnr_retry;
      a.max_rd_atomic = std::max<uint8_t>(c.init_depth, 1);
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
  }
}

// The QP takes over the TCP connection (softrdma_iwarp_attach dup()s the socket).
int Abi::attach_iwarp(cm::Connection& c, const cm::IwarpConn& ic) {
  Id* id = id_of(c);
  if (!id->pub.qp) return 0;
  if (id->pub.qp->context->device->transport_type != IBV_TRANSPORT_IWARP) return EINVAL;
  softrdma_iwarp_conn conn{};
  conn.fd = ic.fd;
  conn.flags = (ic.crc ? SOFTRDMA_IW_CRC : 0) | (ic.markers_rx ? SOFTRDMA_IW_MARKERS_RX : 0) |
               (ic.markers_tx ? SOFTRDMA_IW_MARKERS_TX : 0) | (ic.await_grace ? SOFTRDMA_IW_AWAIT_GRACE : 0) |
               (ic.rtr_hold ? SOFTRDMA_IW_RTR_HOLD : 0);
  conn.rtr = static_cast<uint32_t>(ic.rtr);
  conn.ird = ic.ird;
  conn.ord = ic.ord;
  conn.peer_qpn = ic.peer_qpn;
  return softrdma_iwarp_attach(id->pub.qp, &conn);
}

int Abi::ready_qp(cm::Connection& c) {
  Id* id = id_of(c);
  if (!id->pub.qp) return 0;
  // Wire protection agreed in the REQ/REP (cm/protect.h): the QP gets the secret while still in INIT.
  if (c.wire_mode) {
    const int rc = softrdma_qp_set_wire_key(id->pub.qp, c.wire_mode, c.wire_secret, cm::kWireSecretLen);
    OPENSSL_cleanse(c.wire_secret, sizeof c.wire_secret);
    if (rc) return rc;
  }
  ibv_qp_attr a;
  int mask;
  for (ibv_qp_state s : {IBV_QPS_RTR, IBV_QPS_RTS}) {
    fill_qp_attr(id, s, a, mask);
    if (int rc = ibv_modify_qp(id->pub.qp, &a, mask)) return rc;
  }
  return 0;
}

// Sync ids (created without a channel): an operation waits for its own event.
int wait_for(Id* id, rdma_cm_event_type want) {
  rdma_cm_event* ev;
  if (rdma_get_cm_event(id->pub.channel, &ev)) return -1;
  int status = ev->status;
  rdma_cm_event_type got = ev->event;
  rdma_ack_cm_event(ev);
  if (got == want) return 0;
  errno = got == RDMA_CM_EVENT_REJECTED ? ECONNREFUSED
          : status < 0                  ? -status
                                        : EIO;
  return -1;
}

int fail(int e) {
  errno = e;
  return -1;
}

Id* to_id(rdma_cm_id* p) { return reinterpret_cast<Id*>(p); }

Channel* new_channel() {
  // A semaphore eventfd: one count per queued event, pollable, and O_NONBLOCK set by the application is
  // honoured. Unlike a pipe, closing it does not wake a thread blocked in read with EOF (rping's CM thread
  // stays blocked through rdma_destroy_event_channel, as on the kernel's fd).
  int fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (fd < 0) return nullptr;
  auto* c = new Channel;
  c->pub.fd = fd;
  c->write_fd = fd;
  return c;
}

}  // namespace

int renumber_event_channel(rdma_event_channel* ch, int min_fd) {
  auto* c = reinterpret_cast<Channel*>(ch);
  const int fd = fcntl(c->pub.fd, F_DUPFD_CLOEXEC, min_fd);
  if (fd < 0) return -1;
  close(c->pub.fd);
  c->pub.fd = c->write_fd = fd;
  return fd;
}

namespace {

void destroy_cqs(Id* id) {
  if (!id->own_cqs) return;
  if (id->pub.send_cq) ibv_destroy_cq(id->pub.send_cq);
  if (id->pub.recv_cq && id->pub.recv_cq != id->pub.send_cq) ibv_destroy_cq(id->pub.recv_cq);
  if (id->pub.send_cq_channel) ibv_destroy_comp_channel(id->pub.send_cq_channel);
  if (id->pub.recv_cq_channel) ibv_destroy_comp_channel(id->pub.recv_cq_channel);
  id->pub.send_cq = id->pub.recv_cq = nullptr;
  id->pub.send_cq_channel = id->pub.recv_cq_channel = nullptr;
  id->own_cqs = false;
}

}  // namespace
}  // namespace softrdma::rdmacm

using namespace softrdma;
using namespace softrdma::rdmacm;

SOFTRDMA_EXPORT rdma_event_channel* rdma_create_event_channel() {
  Channel* c = new_channel();
  return c ? &c->pub : nullptr;
}

namespace {
// Frees a channel. One the application created lingers, empty and open, behind the last 64 destroyed:
// a CM thread that acked its last event just before the main thread destroyed the channel (rping's
// cm_thread, racing main's exit) then blocks in its next rdma_get_cm_event, as a thread already
// blocked in read does on the kernel's fd, instead of reading a closed fd (EBADF, rping exits 255).
void release_channel(Channel* c, bool linger) {
  // Never destroyed: what lingers stays reachable until the process ends (no leak at exit).
  static auto* const lingering = new std::deque<Channel*>;  // under M().mu
  Channel* done = c;
  {
    std::lock_guard lock(M().mu);
    for (Event* e : c->queue) delete e;
    c->queue.clear();
    if (linger) {
      lingering->push_back(c);
      done = nullptr;
      if (lingering->size() > 64) {
        done = lingering->front();
        lingering->pop_front();
      }
    }
  }
  if (!done) return;
  close(done->pub.fd);
  delete done;
}
}  // namespace

SOFTRDMA_EXPORT void rdma_destroy_event_channel(rdma_event_channel* ch) {
  if (ch) release_channel(reinterpret_cast<Channel*>(ch), true);
}

SOFTRDMA_EXPORT int rdma_create_id(rdma_event_channel* ch, rdma_cm_id** out, void* context, rdma_port_space ps) {
  if (!out) return fail(EINVAL);
  // A caller may pass any int: read its bits as one, as loading an enum outside its range is undefined.
  int space;
  static_assert(sizeof space == sizeof ps);
  std::memcpy(&space, &ps, sizeof space);
  if (space != RDMA_PS_TCP && space != RDMA_PS_UDP && space != RDMA_PS_IB && space != RDMA_PS_IPOIB)
    return fail(EINVAL);
  auto* id = new Id;
  id->conn.owner = id;
  if (!ch) {
    Channel* c = new_channel();
    if (!c) {
      delete id;
      return -1;
    }
    ch = &c->pub;
    id->sync = id->owns_channel = true;
  }
  id->pub.channel = ch;
  id->pub.context = context;
  id->pub.ps = ps;
  id->pub.qp_type = ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
  id->pub.port_num = 1;
  id->conn.ud = ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB;
  id->conn.port_space = static_cast<uint16_t>(ps);
  std::lock_guard lock(M().mu);
  M().add(&id->conn);
  *out = &id->pub;
  return 0;
}

SOFTRDMA_EXPORT int rdma_destroy_id(rdma_cm_id* pid) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  auto& m = M();
  std::unique_lock lock(m.mu);
  auto* c = reinterpret_cast<Channel*>(id->pub.channel);
  // Events not yet read are dropped (their pipe bytes are skipped by rdma_get_cm_event); events read but
  // not acked are waited for, as rdma-core does.
  if (c)
    std::erase_if(c->queue, [&](Event* e) {
      bool mine = e->ev.id == pid;
      if (mine) delete e;
      return mine;
    });
  // Delivered events are waited for until acked, as rdma-core does -- but for 2 s at most: a count
  // that never drains (seen about once in 50 loopback rping teardowns under ASan, with the CM thread
  // blocked in rdma_get_cm_event and nothing unacked in the application) must not hang the process.
  // The id then stays allocated, so that a late rdma_ack_cm_event touches live memory.
  const auto ack_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (id->events_out > 0 && abi().acked.wait_until(lock, ack_deadline) != std::cv_status::timeout) {
  }
  const bool unacked = id->events_out > 0;
  m.destroy(id->conn, lock);
  lock.unlock();
  if (id->owns_channel) release_channel(reinterpret_cast<Channel*>(id->pub.channel), false);
  free(id->pub.route.path_rec);
  id->pub.route.path_rec = nullptr;
  if (unacked) {
    static auto* const kept = new std::vector<Id*>;  // never destroyed: reachable to the end
    std::lock_guard relock(m.mu);
    kept->push_back(id);
    return 0;
  }
  delete id;
  return 0;
}

SOFTRDMA_EXPORT int rdma_get_cm_event(rdma_event_channel* ch, rdma_cm_event** event) {
  if (!ch || !event) return fail(EINVAL);
  auto* c = reinterpret_cast<Channel*>(ch);
  for (;;) {
    uint64_t b;
    ssize_t n = read(c->pub.fd, &b, sizeof b);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (n == 0) return fail(ENODATA);
    std::lock_guard lock(M().mu);
    if (c->queue.empty()) continue;  // the event's id was destroyed
    Event* e = c->queue.front();
    c->queue.pop_front();
    Id* id = to_id(e->ev.id);
    id->events_out++;
    switch (e->ev.event) {
      // A connection that failed to form: its QP flushes. DISCONNECTED leaves the QP alone, as with
      // rdma-core (the application may be destroying it in another thread; rdma_disconnect flushes).
      case RDMA_CM_EVENT_REJECTED:
      case RDMA_CM_EVENT_UNREACHABLE:
      case RDMA_CM_EVENT_CONNECT_ERROR:
        to_error(id);
        break;
      case RDMA_CM_EVENT_MULTICAST_JOIN:
        // As rdma-core: the id's QP joins the group when the application learns of the join.
        if (id->pub.qp && ibv_attach_mcast(id->pub.qp, &e->mgid, 0) != 0) {
          e->ev.event = RDMA_CM_EVENT_MULTICAST_ERROR;
          e->ev.status = -EINVAL;
        }
        break;
      default:
        break;
    }
    *event = &e->ev;
    return 0;
  }
}

SOFTRDMA_EXPORT int rdma_ack_cm_event(rdma_cm_event* ev) {
  if (!ev) return fail(EINVAL);
  auto* e = reinterpret_cast<Event*>(ev);
  {
    std::lock_guard lock(M().mu);
    to_id(ev->id)->events_out--;
  }
  abi().acked.notify_all();
  delete e;
  return 0;
}

SOFTRDMA_EXPORT int rdma_bind_addr(rdma_cm_id* pid, sockaddr* addr) {
  if (!pid || !addr) return fail(EINVAL);
  wire::IpAddress ip;
  if (!ip_of(addr, ip)) return fail(EAFNOSUPPORT);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  if (id->conn.sock >= 0 || id->conn.sock6 >= 0) return fail(EINVAL);
  id->family = addr->sa_family;
  // A specific address attaches the device that holds it, as the kernel's rdma_bind_addr does; any
  // 127/8 address is the loopback device's (softrdma_lo holds the host's loopback). One departure
  // (docs/rdmacm.md): a synchronous id bound to loopback with port 0 -- libfabric's verbs provider
  // probing its default source, "localhost" -- attaches none, or libfabric would keep only
  // softrdma_lo's domains and, never offering FI_EP_MSG on a loopback interface, offer none.
  const bool probe = ip.is_loopback() && sin_of(addr)->sin_port == 0 && id->sync;
  if (ip.is_set() && !probe) {
    id->conn.dev = abi().device_for(ip);
    if (!id->conn.dev) return fail(EADDRNOTAVAIL);
    attach_device(id);
    set_gid(id->pub.route.addr.addr.ibaddr.sgid, id->conn.dev->ip);
  }
  // The port is a TCP port on iWARP (docs/iwarp.md); unbound to a device, the first device decides.
  id->conn.iwarp = id->conn.dev ? id->conn.dev->iwarp : abi().default_iwarp();
  if (id->family == AF_INET6 && !ip.is_set() && !ip.is_v4()) {
    // "::" takes the port in IPv6's port space and, unless AFONLY, is IPv4's wildcard as well.
    const bool v6_only = id->afonly >= 0 ? id->afonly != 0 : default_v6_only();
    if (int e = M().bind_port_v6(id->conn, v6_only, sin_of(addr)->sin_port)) return fail(e);
  } else if (int e = M().bind_port(id->conn, ip, sin_of(addr)->sin_port)) {
    return fail(e);
  }
  set_src(id);
  return 0;
}

SOFTRDMA_EXPORT int rdma_resolve_addr(rdma_cm_id* pid, sockaddr* src, sockaddr* dst, int /*timeout_ms*/) {
  if (!pid || !dst) return fail(EINVAL);
  wire::IpAddress dst_ip, src_ip;
  if (!ip_of(dst, dst_ip) || (src && !ip_of(src, src_ip))) return fail(EAFNOSUPPORT);
  Id* id = to_id(pid);
  auto& m = M();
  {
    std::lock_guard lock(m.mu);
    if (id->conn.sock < 0 && id->conn.sock6 < 0) id->family = dst->sa_family;  // the source follows
    int rc = m.resolve_addr(id->conn, src_ip, src ? sin_of(src)->sin_port : 0, dst_ip);
    if (rc < 0) return fail(-rc);
    if (rc > 0) {
      post(id, RDMA_CM_EVENT_ADDR_ERROR, -rc);
    } else {
      attach_device(id);
      set_src(id);
      std::memcpy(&id->pub.route.addr.dst_addr, dst, dst->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
      set_gid(id->pub.route.addr.addr.ibaddr.sgid, id->conn.local_ip);
      set_gid(id->pub.route.addr.addr.ibaddr.dgid, dst_ip);
      id->pub.route.addr.addr.ibaddr.pkey = 0xFFFF;
      post(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
    }
  }
  return id->sync ? wait_for(id, RDMA_CM_EVENT_ADDR_RESOLVED) : 0;
}

SOFTRDMA_EXPORT int rdma_resolve_route(rdma_cm_id* pid, int /*timeout_ms*/) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  {
    std::lock_guard lock(M().mu);
    if (int e = M().resolve_route(id->conn)) return fail(e);
    // RoCE has no subnet administrator: the path record is the two GIDs and the port's MTU.
    auto& r = id->pub.route;
    if (!r.path_rec) r.path_rec = static_cast<ibv_sa_path_rec*>(calloc(1, sizeof(ibv_sa_path_rec)));
    ibv_sa_path_rec& p = *r.path_rec;
    p.dgid = r.addr.addr.ibaddr.dgid;
    p.sgid = r.addr.addr.ibaddr.sgid;
    p.pkey = htobe16(0xFFFF);
    p.mtu_selector = 2;
    p.mtu = id->conn.mtu;
    p.rate_selector = 2;
    p.rate = 16;  // 40 Gb/s, nominal
    p.packet_life_time_selector = 2;
    p.packet_life_time = 16;
    p.hop_limit = 64;
    p.reversible = 1;
    p.numb_path = 1;
    r.num_paths = 1;
    post(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
  }
  return id->sync ? wait_for(id, RDMA_CM_EVENT_ROUTE_RESOLVED) : 0;
}

SOFTRDMA_EXPORT int rdma_create_qp_ex(rdma_cm_id* pid, ibv_qp_init_attr_ex* attr) {
  if (!pid || !attr) return fail(EINVAL);
  Id* id = to_id(pid);
  if (!id->pub.verbs) return fail(EINVAL);
  if (id->pub.qp) return fail(EINVAL);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
    std::lock_guard lock(M().mu);
    if (!id->pub.pd && id->dev() && !id->dev()->pd) id->dev()->pd = ibv_alloc_pd(id->pub.verbs);
    attr->pd = id->pub.pd ? id->pub.pd : (id->dev() ? id->dev()->pd : nullptr);
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
  }
  if (!attr->pd) return fail(ENOMEM);
  if (!attr->send_cq || !attr->recv_cq) {
    // As rdma-core: CQs with completion channels of their own, kept on the id for rdma_verbs.h helpers.
    id->pub.recv_cq_channel = ibv_create_comp_channel(id->pub.verbs);
    id->pub.send_cq_channel = ibv_create_comp_channel(id->pub.verbs);
    id->pub.recv_cq = ibv_create_cq(id->pub.verbs, std::max<int>(attr->cap.max_recv_wr, 1), pid,
                                    id->pub.recv_cq_channel, 0);
    id->pub.send_cq = ibv_create_cq(id->pub.verbs, std::max<int>(attr->cap.max_send_wr, 1), pid,
                                    id->pub.send_cq_channel, 0);
    id->own_cqs = true;
    if (!id->pub.recv_cq || !id->pub.send_cq) {
      destroy_cqs(id);
      return fail(ENOMEM);
    }
    if (!attr->send_cq) attr->send_cq = id->pub.send_cq;
    if (!attr->recv_cq) attr->recv_cq = id->pub.recv_cq;
  }
  if (!attr->srq && id->pub.srq) attr->srq = id->pub.srq;
  ibv_qp* qp = ibv_create_qp_ex(id->pub.verbs, attr);
  if (!qp) {
    int e = errno;
    destroy_cqs(id);
    return fail(e);
  }
  id->pub.qp_type = attr->qp_type;
  ibv_qp_attr a;
  int mask;
  fill_qp_attr(id, IBV_QPS_INIT, a, mask);
  int rc = ibv_modify_qp(qp, &a, mask);
  if (!rc && attr->qp_type == IBV_QPT_UD) {
    // UD QPs are ready at once (no connection): RTR then RTS.
    for (ibv_qp_state s : {IBV_QPS_RTR, IBV_QPS_RTS}) {
      fill_qp_attr(id, s, a, mask);
      if ((rc = ibv_modify_qp(qp, &a, mask))) break;
    }
  }
  if (rc) {
    ibv_destroy_qp(qp);
    destroy_cqs(id);
    return fail(rc);
  }
  id->pub.qp = qp;
  return 0;
}

SOFTRDMA_EXPORT int rdma_create_qp(rdma_cm_id* pid, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!pid || !qp_init_attr) return fail(EINVAL);
  ibv_qp_init_attr_ex ex{};
  std::memcpy(&ex, qp_init_attr, sizeof *qp_init_attr);
  ex.comp_mask = pd ? IBV_QP_INIT_ATTR_PD : 0;
  ex.pd = pd;
  if (pd && pid->verbs && pd->context != pid->verbs) return fail(EINVAL);
  int rc = rdma_create_qp_ex(pid, &ex);
  if (rc) return rc;
  qp_init_attr->cap = ex.cap;
  qp_init_attr->send_cq = ex.send_cq;
  qp_init_attr->recv_cq = ex.recv_cq;
  return 0;
}

SOFTRDMA_EXPORT void rdma_destroy_qp(rdma_cm_id* pid) {
  if (!pid || !pid->qp) return;
  ibv_destroy_qp(pid->qp);
  pid->qp = nullptr;
  destroy_cqs(to_id(pid));
}

SOFTRDMA_EXPORT int rdma_connect(rdma_cm_id* pid, rdma_conn_param* param) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  {
    std::lock_guard lock(M().mu);
    rdma_conn_param dflt{};
    const rdma_conn_param& p = param ? *param : dflt;
    cm::ConnectParams cp;
    cp.private_data = p.private_data;
    cp.private_data_len = p.private_data_len;
    cp.responder_resources = p.responder_resources;
    cp.initiator_depth = p.initiator_depth;
    cp.retry_count = p.retry_count;
    cp.rnr_retry_count = p.rnr_retry_count;
    cp.flow_control = p.flow_control;
    cp.srq = p.srq || (id->pub.qp && id->pub.qp->srq);
    cp.qpn = id->pub.qp ? id->pub.qp->qp_num : p.qp_num;
    id->conn_qpn = id->pub.qp ? cp.qpn : 0;
    cp.uc = id->pub.qp && id->pub.qp->qp_type == IBV_QPT_UC;
    static_assert(RDMA_MAX_RESP_RES == cm::kMaxRdAtomic && RDMA_MAX_INIT_DEPTH == cm::kMaxRdAtomic);
    if (int e = M().connect(id->conn, ntohs(sin_of(&id->pub.route.addr.dst_addr)->sin_port), cp)) return fail(e);
  }
  return id->sync ? wait_for(id, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

SOFTRDMA_EXPORT int rdma_listen(rdma_cm_id* pid, int /*backlog*/) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  const bool bound = id->conn.sock >= 0;
  if (!bound) id->conn.iwarp = id->conn.dev ? id->conn.dev->iwarp : abi().default_iwarp();
  if (int e = M().listen(id->conn)) return fail(e);
  if (!bound) set_src(id);
  return 0;
}

SOFTRDMA_EXPORT int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** out) {
  if (!listen || !out) return fail(EINVAL);
  Id* L = to_id(listen);
  if (!L->sync) return fail(EINVAL);
  rdma_cm_event* ev;
  for (;;) {
    if (rdma_get_cm_event(listen->channel, &ev)) return -1;
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) break;
    rdma_ack_cm_event(ev);
  }
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  // The new id gets a channel of its own (sync), as rdma-core does.
  rdma_migrate_id(child, nullptr);
  if (L->has_ep_attr) {
    ibv_qp_init_attr a = L->ep_attr;
    if (rdma_create_qp(child, L->ep_pd, &a)) {
      int e = errno;
      rdma_reject(child, nullptr, 0);
      rdma_destroy_id(child);
      return fail(e);
    }
  }
  *out = child;
  return 0;
}

SOFTRDMA_EXPORT int rdma_accept(rdma_cm_id* pid, rdma_conn_param* param) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  {
    std::lock_guard lock(M().mu);
    rdma_conn_param dflt{};
    dflt.responder_resources = RDMA_MAX_RESP_RES;
    dflt.initiator_depth = RDMA_MAX_INIT_DEPTH;
    const rdma_conn_param& p = param ? *param : dflt;
    cm::AcceptParams ap;
    ap.private_data = p.private_data;
    ap.private_data_len = p.private_data_len;
    ap.responder_resources = p.responder_resources;
    ap.initiator_depth = p.initiator_depth;
    ap.qpn = id->pub.qp ? id->pub.qp->qp_num : p.qp_num;
    id->conn_qpn = id->pub.qp ? ap.qpn : 0;
    ap.flow_control = p.flow_control;
    ap.srq = p.srq || (id->pub.qp && id->pub.qp->srq);
    ap.rnr_retry_count = p.rnr_retry_count;
    if (int e = M().accept(id->conn, ap)) return fail(e);
    // SIDR: no ESTABLISHED, as with the kernel's CM.
    if (is_ud(id)) return 0;
  }
  return id->sync ? wait_for(id, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

SOFTRDMA_EXPORT int rdma_reject(rdma_cm_id* pid, const void* private_data, uint8_t len) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  if (int e = M().reject(id->conn, private_data, len)) return fail(e);
  return 0;
}

SOFTRDMA_EXPORT int rdma_reject_ece(rdma_cm_id* pid, const void* private_data, uint8_t len) {
  return rdma_reject(pid, private_data, len);
}

SOFTRDMA_EXPORT int rdma_establish(rdma_cm_id* pid) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  if (int e = M().establish(id->conn)) return fail(e);
  return 0;
}

SOFTRDMA_EXPORT int rdma_disconnect(rdma_cm_id* pid) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  to_error(id);
  M().disconnect(id->conn);
  return 0;
}

SOFTRDMA_EXPORT int rdma_init_qp_attr(rdma_cm_id* pid, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (!pid || !qp_attr || !qp_attr_mask) return fail(EINVAL);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  ibv_qp_state s = qp_attr->qp_state;
  if (s != IBV_QPS_INIT && s != IBV_QPS_RTR && s != IBV_QPS_RTS) return fail(EINVAL);
  if (s != IBV_QPS_INIT && !id->conn.remote_qpn && id->pub.qp_type != IBV_QPT_UD) return fail(EINVAL);
  fill_qp_attr(id, s, *qp_attr, *qp_attr_mask);
  return 0;
}

SOFTRDMA_EXPORT int rdma_notify(rdma_cm_id*, ibv_event_type) { return 0; }

SOFTRDMA_EXPORT int rdma_migrate_id(rdma_cm_id* pid, rdma_event_channel* ch) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  bool sync = false;
  if (!ch) {
    Channel* c = new_channel();
    if (!c) return -1;
    ch = &c->pub;
    sync = true;
  }
  std::unique_lock lock(M().mu);
  abi().acked.wait(lock, [&] { return id->events_out <= 0; });
  auto* old = reinterpret_cast<Channel*>(id->pub.channel);
  auto* nc = reinterpret_cast<Channel*>(ch);
  // Queued events follow the id.
  if (old && old != nc) {
    for (auto it = old->queue.begin(); it != old->queue.end();) {
      if ((*it)->ev.id == pid) {
        nc->queue.push_back(*it);
        uint64_t one = 1;
        [[maybe_unused]] ssize_t n = write(nc->write_fd, &one, sizeof one);
        it = old->queue.erase(it);
      } else {
        ++it;
      }
    }
  }
  bool destroy_old = id->owns_channel;
  id->pub.channel = ch;
  id->sync = id->owns_channel = sync;
  lock.unlock();
  if (destroy_old && old && old != nc) release_channel(old, false);
  return 0;
}

SOFTRDMA_EXPORT int rdma_set_option(rdma_cm_id* pid, int level, int optname, void* optval, size_t optlen) {
  if (!pid || !optval) return fail(EINVAL);
  Id* id = to_id(pid);
  if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_ACK_TIMEOUT && optlen == sizeof(uint8_t)) {
    std::lock_guard lock(M().mu);
    id->conn.ack_timeout_opt = std::min<uint8_t>(*static_cast<uint8_t*>(optval), 31);
    return 0;
  }
  if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_AFONLY && optlen == sizeof(int)) {
    std::lock_guard lock(M().mu);
    if (id->conn.sock >= 0 || id->conn.sock6 >= 0) return fail(EINVAL);  // before the bind, as the kernel
    id->afonly = *static_cast<int*>(optval) != 0;
    return 0;
  }
  if (level == RDMA_OPTION_ID || level == RDMA_OPTION_IB) return 0;  // TOS, REUSEADDR, path: accepted
  return fail(ENOSYS);
}

SOFTRDMA_EXPORT __be16 rdma_get_src_port(rdma_cm_id* pid) {
  return pid ? sin_of(&pid->route.addr.src_addr)->sin_port : 0;
}
SOFTRDMA_EXPORT __be16 rdma_get_dst_port(rdma_cm_id* pid) {
  return pid ? sin_of(&pid->route.addr.dst_addr)->sin_port : 0;
}

SOFTRDMA_EXPORT ibv_context** rdma_get_devices(int* num) {
  std::lock_guard lock(M().mu);
  abi().device_for(wire::IpAddress{});  // opens them all
  auto& d = abi().devices;
  auto** list = static_cast<ibv_context**>(calloc(d.size() + 1, sizeof(ibv_context*)));
  if (!list) return nullptr;
  for (size_t i = 0; i < d.size(); ++i) list[i] = d[i]->ctx;
  if (num) *num = static_cast<int>(d.size());
  return list;
}
SOFTRDMA_EXPORT void rdma_free_devices(ibv_context** list) { free(list); }

// RoCE multicast needs no subnet administrator: joining is local (the QP's engine joins the IP group
// when the QP is attached, src/verbs/ah.cpp), and the event hands out the group's address vector. A
// group of either family (an IPv4-mapped one is IPv4's), the family of the id's device.
SOFTRDMA_EXPORT int rdma_join_multicast(rdma_cm_id* pid, sockaddr* addr, void* context) {
  if (!pid || !addr) return fail(EINVAL);
  wire::IpAddress group;
  if (!wire::from_sockaddr(addr, &group)) return fail(EAFNOSUPPORT);
  if (!group.is_multicast()) return fail(EINVAL);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  if (!id->dev() || !is_ud(id) || id->dev()->ip.is_v4() != group.is_v4()) return fail(EINVAL);
  if (std::find(id->mcast_groups.begin(), id->mcast_groups.end(), group) != id->mcast_groups.end())
    return fail(EADDRINUSE);
  id->mcast_groups.push_back(group);
  Event* e = nullptr;
  post(id, RDMA_CM_EVENT_MULTICAST_JOIN, 0, nullptr, 0, nullptr, &e);
  if (e) {
    set_gid(e->mgid, group);
    auto& u = e->ev.param.ud;
    u.private_data = context;  // as rdma-core: the join's context
    fill_ah_attr(u.ah_attr, e->mgid);
    u.qp_num = 0xFFFFFF;
    u.qkey = RDMA_UDP_QKEY;
  }
  return 0;
}
SOFTRDMA_EXPORT int rdma_join_multicast_ex(rdma_cm_id* pid, rdma_cm_join_mc_attr_ex* attr, void* context) {
  if (!attr || !(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS)) return fail(EINVAL);
  return rdma_join_multicast(pid, attr->addr, context);
}
SOFTRDMA_EXPORT int rdma_leave_multicast(rdma_cm_id* pid, sockaddr* addr) {
  if (!pid || !addr) return fail(EINVAL);
  wire::IpAddress group;
  if (!wire::from_sockaddr(addr, &group)) return fail(EAFNOSUPPORT);
  Id* id = to_id(pid);
  {
    std::lock_guard lock(M().mu);
    auto it = std::find(id->mcast_groups.begin(), id->mcast_groups.end(), group);
    if (it == id->mcast_groups.end()) return fail(EADDRNOTAVAIL);
    id->mcast_groups.erase(it);
  }
  if (pid->qp) {
    ibv_gid g;
    set_gid(g, group);
    ibv_detach_mcast(pid->qp, &g, 0);  // fails harmlessly when the join event was never read
  }
  return 0;
}
SOFTRDMA_EXPORT int rdma_set_local_ece(rdma_cm_id*, ibv_ece*) { return fail(EOPNOTSUPP); }
SOFTRDMA_EXPORT int rdma_get_remote_ece(rdma_cm_id*, ibv_ece*) { return fail(EOPNOTSUPP); }

SOFTRDMA_EXPORT int rdma_create_srq_ex(rdma_cm_id* pid, ibv_srq_init_attr_ex* attr) {
  if (!pid || !attr) return fail(EINVAL);
  ibv_srq_init_attr a{};
  a.srq_context = attr->srq_context;
  a.attr = attr->attr;
  return rdma_create_srq(pid, (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) ? attr->pd : nullptr, &a);
}
SOFTRDMA_EXPORT int rdma_create_srq(rdma_cm_id* pid, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!pid || !attr || !pid->verbs) return fail(EINVAL);
  Id* id = to_id(pid);
  if (!pd) {
    std::lock_guard lock(M().mu);
    if (id->dev() && !id->dev()->pd) id->dev()->pd = ibv_alloc_pd(pid->verbs);
    pd = pid->pd ? pid->pd : id->dev() ? id->dev()->pd : nullptr;
  }
  if (!pd) return fail(ENOMEM);
  ibv_srq* srq = ibv_create_srq(pd, attr);
  if (!srq) return -1;
  pid->srq = srq;
  return 0;
}
SOFTRDMA_EXPORT void rdma_destroy_srq(rdma_cm_id* pid) {
  if (!pid || !pid->srq) return;
  ibv_destroy_srq(pid->srq);
  pid->srq = nullptr;
}

namespace {
// The length of an rdma_cm socket address of family f (0: a family rdma_getaddrinfo does not give).
socklen_t addr_len(int f) { return f == AF_INET ? sizeof(sockaddr_in) : f == AF_INET6 ? sizeof(sockaddr_in6) : 0; }

// A malloc'd copy of an address of family AF_INET or AF_INET6 (NULL when absent; false when it is of
// another family or short).
bool copy_addr(const sockaddr* a, socklen_t len, sockaddr** out) {
  *out = nullptr;
  if (!a || !len) return true;
  const socklen_t want = addr_len(a->sa_family);
  if (!want || len < want) return false;
  *out = static_cast<sockaddr*>(malloc(want));
  if (*out) std::memcpy(*out, a, want);
  return true;
}
}  // namespace

// Without node and service the addresses come from hints.ai_src_addr / ai_dst_addr (rdma_getaddrinfo(3)),
// as libfabric's verbs provider asks for a connecting endpoint. A node or service is resolved in the
// hints' family: AF_INET unless AF_INET6 is asked for (then IPv4 names come back IPv4-mapped, and a
// passive service alone is "::"); with no family asked, a node with no IPv4 address (an IPv6 one, or a
// name of IPv6 addresses only) resolves in AF_INET6.
SOFTRDMA_EXPORT int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                                     rdma_addrinfo** res) {
  const bool hinted = hints && ((hints->ai_src_addr && hints->ai_src_len) || (hints->ai_dst_addr && hints->ai_dst_len));
  if (!res || (!node && !service && !hinted)) return fail(EINVAL);
  int family = hints && hints->ai_family ? hints->ai_family : AF_INET;
  if (!addr_len(family)) return EAI_FAMILY;
  const bool any_family = !hints || !hints->ai_family;
  const bool passive = hints && (hints->ai_flags & RAI_PASSIVE);
  sockaddr* named = nullptr;  // what node/service resolve to
  if (node || service) {
    addrinfo h{};
    h.ai_family = family;
    h.ai_socktype = SOCK_STREAM;
    if (passive) h.ai_flags |= AI_PASSIVE;
    if (family == AF_INET6) h.ai_flags |= AI_V4MAPPED;
    if (hints && (hints->ai_flags & RAI_NUMERICHOST)) h.ai_flags |= AI_NUMERICHOST;
    addrinfo* ai = nullptr;
    int rc = getaddrinfo(node, service, &h, &ai);
    if (rc && node && any_family && (rc == EAI_ADDRFAMILY || rc == EAI_NONAME || rc == EAI_NODATA)) {
      family = h.ai_family = AF_INET6;
      rc = getaddrinfo(node, service, &h, &ai);
    }
    if (rc) return rc;
    const bool ok = copy_addr(ai->ai_addr, ai->ai_addrlen, &named);
    freeaddrinfo(ai);
    if (!ok) return EAI_FAMILY;
    if (!named) return EAI_MEMORY;
  }
  sockaddr *src = nullptr, *dst = nullptr;
  if (!copy_addr(hints ? hints->ai_src_addr : nullptr, hints ? hints->ai_src_len : 0, &src) ||
      !copy_addr(hints ? hints->ai_dst_addr : nullptr, hints ? hints->ai_dst_len : 0, &dst)) {
    free(named);
    free(src);
    free(dst);
    return EAI_FAMILY;
  }
  if (named) {
    // The named address replaces the hinted one on its side: the source when passive, else the destination.
    sockaddr*& side = passive ? src : dst;
    free(side);
    side = named;
  }
  if (passive) {
    free(dst);
    dst = nullptr;
  }
  auto* r = static_cast<rdma_addrinfo*>(calloc(1, sizeof(rdma_addrinfo)));
  if (!r) {
    free(src);
    free(dst);
    return EAI_MEMORY;
  }
  r->ai_flags = hints ? hints->ai_flags : 0;
  r->ai_family = src ? src->sa_family : dst ? dst->sa_family : family;
  r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
  r->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type
                  : r->ai_port_space == RDMA_PS_UDP ? IBV_QPT_UD
                                                    : IBV_QPT_RC;
  r->ai_src_addr = src;
  r->ai_src_len = src ? addr_len(src->sa_family) : 0;
  r->ai_dst_addr = dst;
  r->ai_dst_len = dst ? addr_len(dst->sa_family) : 0;
  *res = r;
  return 0;
}

SOFTRDMA_EXPORT void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    free(res->ai_src_addr);
    free(res->ai_dst_addr);
    free(res->ai_src_canonname);
    free(res->ai_dst_canonname);
    free(res->ai_route);
    free(res->ai_connect);
    free(res);
    res = next;
  }
}

SOFTRDMA_EXPORT int rdma_create_ep(rdma_cm_id** out, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!out || !res) return fail(EINVAL);
  rdma_cm_id* pid;
  if (rdma_create_id(nullptr, &pid, nullptr, static_cast<rdma_port_space>(res->ai_port_space))) return -1;
  Id* id = to_id(pid);
  id->pub.qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
  int rc;
  if (res->ai_flags & RAI_PASSIVE) {
    rc = rdma_bind_addr(pid, res->ai_src_addr);
    if (!rc && qp_init_attr) {
      id->has_ep_attr = true;
      id->ep_attr = *qp_init_attr;
      id->ep_pd = pd;
    }
  } else {
    rc = rdma_resolve_addr(pid, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (!rc) rc = rdma_resolve_route(pid, 2000);
    if (!rc && qp_init_attr) rc = rdma_create_qp(pid, pd, qp_init_attr);
  }
  if (rc) {
    int e = errno;
    rdma_destroy_id(pid);
    return fail(e);
  }
  *out = pid;
  return 0;
}

SOFTRDMA_EXPORT void rdma_destroy_ep(rdma_cm_id* pid) {
  if (!pid) return;
  if (pid->qp) rdma_destroy_qp(pid);
  if (pid->srq) rdma_destroy_srq(pid);
  rdma_destroy_id(pid);
}

SOFTRDMA_EXPORT const char* rdma_event_str(rdma_cm_event_type e) {
  static const char* const names[] = {
      "RDMA_CM_EVENT_ADDR_RESOLVED",    "RDMA_CM_EVENT_ADDR_ERROR",     "RDMA_CM_EVENT_ROUTE_RESOLVED",
      "RDMA_CM_EVENT_ROUTE_ERROR",      "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
      "RDMA_CM_EVENT_CONNECT_ERROR",    "RDMA_CM_EVENT_UNREACHABLE",    "RDMA_CM_EVENT_REJECTED",
      "RDMA_CM_EVENT_ESTABLISHED",      "RDMA_CM_EVENT_DISCONNECTED",   "RDMA_CM_EVENT_DEVICE_REMOVAL",
      "RDMA_CM_EVENT_MULTICAST_JOIN",   "RDMA_CM_EVENT_MULTICAST_ERROR", "RDMA_CM_EVENT_ADDR_CHANGE",
      "RDMA_CM_EVENT_TIMEWAIT_EXIT",
  };
  unsigned i = static_cast<unsigned>(e);
  return i < sizeof names / sizeof names[0] ? names[i] : "UNKNOWN EVENT";
}

// softrdma's private ABI (version node SOFTRDMA_PRIVATE_1; not for applications): the iWARP CM's
// counters in cm::IwarpStats order (requests sent, received, bad frames, timeouts, rejects sent,
// rejects received, refused TCP connects, direct-path hits, refused connects retried). Fills up to n; returns how many exist.
SOFTRDMA_EXPORT int softrdma_cm_iwarp_stats(uint64_t* values, unsigned n) {
  const cm::IwarpStats& s = M().iwarp_stats();
  const uint64_t all[] = {s.mpa_requests_sent, s.mpa_requests_rcvd, s.mpa_bad_frames, s.mpa_timeouts,
                          s.mpa_rejects_sent,  s.mpa_rejects_rcvd,  s.tcp_refused,    s.direct_hits,
                          s.tcp_refused_retries};
  const unsigned count = sizeof all / sizeof all[0];
  for (unsigned i = 0; values && i < n && i < count; ++i) values[i] = all[i];
  return static_cast<int>(count);
}

// softrdma's private ABI, for in-process tests: sets a SOFTRDMA_* variable of this process without
// the environment, in librdmacm's table and in libibverbs' (softrdma_set_option), so that both
// libraries see one setting as they see one environment. Every later read takes it: the CM's timers
// and retries, iWARP's MPA settings, the device list (SOFTRDMA_TRANSPORT), contexts opened after.
// NULL: the environment's value again; "": the default. 0, or EINVAL (a name not in the table, a
// value its type does not take). Thread-safe.
SOFTRDMA_EXPORT int softrdma_cm_set_option(const char* name, const char* value) {
  const config::Variable* v = name ? config::find(name) : nullptr;
  if (!v || (value && !config::accepts(*v, value))) return EINVAL;
  if (int rc = softrdma_set_option(name, value)) return rc;
  return config::set_option(name, value) ? 0 : EINVAL;
}
