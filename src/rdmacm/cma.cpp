// The rdma_cm API over softrdma's libibverbs, and the IBTA CM protocol that connects ids (docs/rdmacm.md).
// One connection manager per process: a thread that receives CM MADs on the process's CM socket and on
// listening ids' sockets, resends unanswered requests, and queues events on the ids' channels. All state
// sits under one lock; verbs calls made under it never call back into us.
#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_verbs.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>

#include "net/interfaces.h"
#include "net/registry.h"
#include "net/udp_port.h"
#include "rdmacm/cm.h"
#include "wire/headers.h"

namespace softrdma::rdmacm {
namespace {

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

uint64_t env_u64(const char* name, uint64_t dflt) {
  const char* s = getenv(name);
  return s && *s ? strtoull(s, nullptr, 10) : dflt;
}

// How long a CM request waits for its answer before it is sent again, and how often. The kernel waits
// 4.096 us * 2^20 (~4.3 s) 15 times; SOFTRDMA_CM_TIMEOUT_MS / SOFTRDMA_CM_RETRIES shorten that for tests.
uint64_t cm_timeout_ns() { return env_u64("SOFTRDMA_CM_TIMEOUT_MS", 1000) * 1000000ull; }
constexpr uint64_t kProbeIntervalNs = 50000000;  // 50 ms
int cm_retries() { return static_cast<int>(env_u64("SOFTRDMA_CM_RETRIES", 15)); }
// How often a connection to another host checks that its peer process still exists (docs/rdmacm.md).
uint64_t cm_probe_ns() { return env_u64("SOFTRDMA_CM_PROBE_MS", 2000) * 1000000ull; }

uint32_t random_u32() {
  thread_local std::mt19937 gen{std::random_device{}() ^ static_cast<uint32_t>(getpid())};
  return gen();
}

void set_gid(ibv_gid& g, uint32_t ip_be) {
  std::memset(&g, 0, sizeof g);
  g.raw[10] = g.raw[11] = 0xFF;
  std::memcpy(&g.raw[12], &ip_be, 4);
}
uint32_t gid_ip(const uint8_t* raw) {
  uint32_t ip;
  std::memcpy(&ip, raw + 12, 4);
  return ip;
}

sockaddr_in* sin_of(sockaddr* a) { return reinterpret_cast<sockaddr_in*>(a); }

// UD port spaces connect with SIDR (IBTA 12.11) instead of REQ/REP/RTU.
bool is_ud(const Id* id) { return id->pub.ps == RDMA_PS_UDP || id->pub.ps == RDMA_PS_IPOIB; }

// The address vector to reach a peer GID from port 1, GID index 0 (what a UD event hands out).
void fill_ah_attr(ibv_ah_attr& ah, const ibv_gid& dgid) {
  std::memset(&ah, 0, sizeof ah);
  ah.is_global = 1;
  ah.port_num = 1;
  ah.grh.dgid = dgid;
  ah.grh.sgid_index = 0;
  ah.grh.hop_limit = 64;
}

class Manager {
 public:
  static Manager& get() {
    static Manager* m = new Manager;  // leaked: ids may be used from exit-time code
    return *m;
  }
  std::mutex mu;
  std::condition_variable acked;
  std::vector<Device*> devices;
  std::vector<Id*> ids;
  std::unordered_map<uint32_t, Id*> by_comm;
  int sock = -1;
  uint16_t sock_port = 0;
  int wake_fd = -1;
  // Passes of the CM thread out of poll(): a socket it polls stays bound until poll returns (the kernel
  // holds the file while polling), so rdma_destroy_id waits for one pass before its port is free.
  uint64_t loop_gen = 0;
  std::condition_variable loop_cv;

  void wake() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd, &one, sizeof one);
  }
  Device* device_for_ip(uint32_t ip_be);
  void post(Id* id, rdma_cm_event_type type, int status, const uint8_t* pdata = nullptr, uint8_t plen = 0,
            Id* listen = nullptr, Channel* chan = nullptr, Event** out = nullptr);
  uint32_t alloc_comm_id(Id* id);
  void release_comm_id(Id* id);
  void send_mad(Id* id, const uint8_t* mad, bool request);
  void send_to(uint32_t dst_ip, uint16_t dst_port, uint32_t src_ip, const uint8_t* mad);
  void receive(int fd, Id* listener);
  void on_mad(const uint8_t* mad, Id* listener);
  void on_req(const wire::MadHeader& h, const uint8_t* mad, Id* listener);
  void on_sidr_req(const wire::MadHeader& h, const uint8_t* mad, Id* listener);
  void on_sidr_rep(Id* id, const uint8_t* mad);
  void send_sidr_rep(Id* id, uint8_t status, uint32_t qpn, const void* pdata, uint8_t len);
  void timers();
  // DREQ, DREP and RTU: the connection's comm IDs and nothing else (remote_qpn: DREQ only).
  void send_simple(Id* id, wire::CmAttr attr, uint64_t tid, uint32_t remote_qpn, bool request);
  void send_dreq(Id* id);
  void send_rtu(Id* id);  // answers the REP of id's connection (tid of its REQ)
  void send_rej(Id* id, uint16_t reason, uint8_t msg, const void* pdata, uint8_t len);
  void to_error(Id* id);
  int modify_rtr_rts(Id* id);

 private:
  Manager() {
    sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    // DF with IP identification 0, as softrdma's data sockets send: the ICRC covers both
    // (wire/icrc.h), and kernel rxe drops MADs whose ICRC does not match.
    int pmtu = IP_PMTUDISC_DO;
    setsockopt(sock, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    bind(sock, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t l = sizeof a;
    getsockname(sock, reinterpret_cast<sockaddr*>(&a), &l);
    sock_port = ntohs(a.sin_port);
    wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    // The thread takes none of the application's signals.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    std::thread([this] { loop(); }).detach();
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    atexit([] { Manager::get().at_exit(); });
  }
  void loop();
  void at_exit();
  uint64_t last_liveness_ns_ = 0;
};

Device* Manager::device_for_ip(uint32_t ip_be) {
  if (devices.empty()) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    for (int i = 0; list && i < n; ++i) {
      ibv_context* ctx = ibv_open_device(list[i]);
      if (!ctx) continue;
      auto* d = new Device;
      d->ctx = ctx;
      ibv_gid g;
      if (ibv_query_gid(ctx, 1, 0, &g) == 0) d->ip_be = gid_ip(g.raw);
      ibv_device_attr da;
      if (ibv_query_device(ctx, &da) == 0) {
        d->guid_be = da.node_guid;
        d->max_rd_atom = static_cast<uint8_t>(std::min(da.max_qp_rd_atom, 255));
      }
      ibv_port_attr pa;
      if (ibv_query_port(ctx, 1, &pa) == 0) d->mtu = pa.active_mtu;
      devices.push_back(d);
    }
    if (list) ibv_free_device_list(list);
  }
  for (Device* d : devices)
    if (d->ip_be == ip_be) return d;
  // Any 127/8 address is the loopback device's.
  if ((ntohl(ip_be) >> 24) == 127)
    for (Device* d : devices)
      if ((ntohl(d->ip_be) >> 24) == 127) return d;
  return nullptr;
}

void Manager::post(Id* id, rdma_cm_event_type type, int status, const uint8_t* pdata, uint8_t plen, Id* listen,
                   Channel* chan, Event** out) {
  if (!chan) chan = reinterpret_cast<Channel*>(id->pub.channel);
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

uint32_t Manager::alloc_comm_id(Id* id) {
  // The registry number maps the comm ID to this process's CM socket for the 4791 holder (gsi.cpp).
  uint32_t n = net::Registry::instance().allocate_qpn(htonl(INADDR_LOOPBACK), sock_port);
  if (!n) return 0;
  id->local_comm_id = (random_u32() & 0xFF000000u) | n;
  by_comm[id->local_comm_id] = id;
  return id->local_comm_id;
}

void Manager::release_comm_id(Id* id) {
  if (!id->local_comm_id) return;
  by_comm.erase(id->local_comm_id);
  net::Registry::instance().release_qpn(id->local_comm_id & 0xFFFFFF);
  id->local_comm_id = 0;
}

void Manager::send_to(uint32_t dst_ip, uint16_t dst_port, uint32_t src_ip, const uint8_t* mad) {
  uint8_t pkt[wire::kGsiPacketLen];
  size_t n = wire::build_gsi_packet(src_ip, dst_ip, sock_port, dst_port, random_u32(), mad, pkt);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = dst_ip;
  a.sin_port = htons(dst_port);
  [[maybe_unused]] ssize_t r = sendto(sock, pkt, n, 0, reinterpret_cast<sockaddr*>(&a), sizeof a);
}

void Manager::send_mad(Id* id, const uint8_t* mad, bool request) {
  if (request) {
    std::memcpy(id->last_mad, mad, wire::kMadLen);
    id->awaiting = true;
    id->retries_left = cm_retries();
    id->deadline_ns = now_ns() + cm_timeout_ns();
  }
  wire::MadHeader h;
  wire::decode_mad_header(mad, wire::kMadLen, h);
  uint32_t src_ip = id->dev ? id->dev->ip_be : 0;
  if (id->listener_probes) return;
  if (!id->peer_local) {
    send_to(id->peer_ip_be, wire::kRoceUdpPort, src_ip, mad);
    return;
  }
  // A peer on this host: straight to its socket (DESIGN §4), by service port or by its comm ID.
  if (h.attr_id == static_cast<uint16_t>(wire::CmAttr::Req) || h.attr_id == static_cast<uint16_t>(wire::CmAttr::SidrReq)) {
    send_to(id->peer_ip_be, id->service_port, src_ip, mad);
    return;
  }
  auto ep = net::Registry::instance().lookup(wire::cm_destination_comm_id(mad, h.attr_id) & 0xFFFFFF);
  if (ep) send_to(id->peer_ip_be, ep->port, src_ip, mad);
}

void Manager::send_rej(Id* id, uint16_t reason, uint8_t msg, const void* pdata, uint8_t len) {
  wire::MadHeader h;
  h.tid = id->tid;
  h.attr_id = static_cast<uint16_t>(wire::CmAttr::Rej);
  wire::CmRej rej;
  rej.local_comm_id = id->local_comm_id;
  rej.remote_comm_id = id->remote_comm_id;
  rej.message_rejected = msg;
  rej.reason = reason;
  if (pdata && len) std::memcpy(rej.private_data, pdata, std::min<size_t>(len, wire::kRejPrivateLen));
  uint8_t mad[wire::kMadLen];
  wire::encode_rej(h, rej, mad);
  send_mad(id, mad, false);
}

// Called in the application's threads only (rdma_disconnect, rdma_get_cm_event): the application may
// have destroyed the QP by now without telling us, as it may with rdma-core's librdmacm, which also
// moves the QP to ERR when it hands out the event rather than when the MAD arrives.
void Manager::to_error(Id* id) {
  if (!id->pub.qp) return;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(id->pub.qp, &a, IBV_QP_STATE);
}

void Manager::send_simple(Id* id, wire::CmAttr attr, uint64_t tid, uint32_t remote_qpn, bool request) {
  wire::MadHeader h;
  h.tid = tid;
  h.attr_id = static_cast<uint16_t>(attr);
  wire::CmSimple m;
  m.local_comm_id = id->local_comm_id;
  m.remote_comm_id = id->remote_comm_id;
  m.remote_qpn = remote_qpn;
  uint8_t mad[wire::kMadLen];
  wire::encode_simple(h, m, mad);
  send_mad(id, mad, request);
}

void Manager::send_dreq(Id* id) {
  send_simple(id, wire::CmAttr::Dreq, (uint64_t(random_u32()) << 32) | random_u32(), id->remote_qpn, true);
  id->retries_left = std::min(id->retries_left, 3);
}

void Manager::send_rtu(Id* id) { send_simple(id, wire::CmAttr::Rtu, id->tid, 0, false); }

// RTR then RTS with the negotiated parameters (what rdma_init_qp_attr reports).
void fill_qp_attr(Id* id, ibv_qp_state state, ibv_qp_attr& a, int& mask) {
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
    a.path_mtu = static_cast<ibv_mtu>(id->mtu);
    a.dest_qp_num = id->remote_qpn;
    a.rq_psn = id->remote_psn;
    a.max_dest_rd_atomic = std::max<uint8_t>(id->resp_res, 1);
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = id->pub.route.addr.addr.ibaddr.dgid;
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = 64;
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
            IBV_QP_MIN_RNR_TIMER;
  } else if (state == IBV_QPS_RTS) {
    a.sq_psn = id->my_psn;
    mask |= IBV_QP_SQ_PSN;
    if (!ud) {
      a.timeout = id->ack_timeout_opt != 0xFF ? id->ack_timeout_opt : id->ack_timeout;
      a.retry_cnt = id->retry_count;
      a.rnr_retry = id->rnr_retry;
      a.max_rd_atomic = std::max<uint8_t>(id->init_depth, 1);
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
  }
}

int Manager::modify_rtr_rts(Id* id) {
  if (!id->pub.qp) return 0;
  ibv_qp_attr a;
  int mask;
  // Re-INIT first: a QP made before the connection may carry defaults (as rdma-core's librdmacm does).
  for (ibv_qp_state s : {IBV_QPS_RTR, IBV_QPS_RTS}) {
    fill_qp_attr(id, s, a, mask);
    if (int rc = ibv_modify_qp(id->pub.qp, &a, mask)) return rc;
  }
  return 0;
}

void Manager::on_req(const wire::MadHeader& h, const uint8_t* mad, Id* L) {
  wire::CmReq req;
  wire::decode_req(mad, req);
  wire::CmaIpHeader cma;
  bool have_cma = wire::decode_cma_header(req.private_data, cma);
  uint32_t peer_ip = have_cma ? cma.src_ip_be : gid_ip(req.primary.local_gid);
  uint32_t local_ip = have_cma ? cma.dst_ip_be : gid_ip(req.primary.remote_gid);
  if (!L) return;
  // A resent REQ: answer again with what we answered (REP), or keep waiting for the application.
  for (Id* c : ids) {
    if (c->listener == L && c->remote_comm_id == req.local_comm_id && c->peer_ip_be == peer_ip) {
      if (c->st == St::RepSent && c->awaiting) send_mad(c, c->last_mad, false);
      return;
    }
  }
  auto* c = new Id;
  c->pub.channel = L->pub.channel;
  c->pub.context = L->pub.context;
  c->pub.ps = L->pub.ps;
  c->pub.qp_type = L->pub.qp_type;
  c->pub.port_num = 1;
  c->listener = L;
  c->passive = true;
  c->sync = L->sync;
  c->dev = device_for_ip(local_ip);
  if (!c->dev && L->dev) c->dev = L->dev;
  if (c->dev) c->pub.verbs = c->dev->ctx;
  c->peer_ip_be = peer_ip;
  c->peer_local = net::is_local_ip(peer_ip);
  c->tid = h.tid;
  c->remote_comm_id = req.local_comm_id;
  c->remote_qpn = req.local_qpn;
  // A message's starting PSN is the PSN its sender expects to receive, i.e. the one the other side
  // sends from (Linux ib_cm: the passive sq_psn is the REQ's, the REP's is its own rq_psn).
  c->my_psn = req.starting_psn;
  c->remote_psn = random_u32() & 0xFFFFFF;
  c->mtu = std::min<uint8_t>(req.path_mtu ? req.path_mtu : uint8_t{IBV_MTU_1024}, c->dev ? uint8_t(c->dev->mtu) : uint8_t{IBV_MTU_1024});
  c->retry_count = req.retry_count;
  c->rnr_retry = req.rnr_retry_count;
  c->ack_timeout = req.primary.local_ack_timeout ? req.primary.local_ack_timeout : 17;
  c->resp_res = req.initiator_depth;   // what the peer will issue
  c->init_depth = req.responder_resources;
  auto& r = c->pub.route;
  auto* src = sin_of(&r.addr.src_addr);
  src->sin_family = AF_INET;
  src->sin_addr.s_addr = local_ip;
  src->sin_port = htons(L->service_port);
  auto* dst = sin_of(&r.addr.dst_addr);
  dst->sin_family = AF_INET;
  dst->sin_addr.s_addr = peer_ip;
  dst->sin_port = htons(have_cma ? cma.src_port : 0);
  set_gid(r.addr.addr.ibaddr.sgid, local_ip);
  set_gid(r.addr.addr.ibaddr.dgid, peer_ip);
  r.addr.addr.ibaddr.pkey = 0xFFFF;
  c->st = St::ReqRcvd;
  if (!alloc_comm_id(c)) {
    delete c;
    return;
  }
  ids.push_back(c);
  Event* e = nullptr;
  const size_t off = have_cma ? wire::kCmaHeaderLen : 0;
  post(c, RDMA_CM_EVENT_CONNECT_REQUEST, 0, req.private_data + off,
       static_cast<uint8_t>(wire::kReqPrivateLen - off), L, reinterpret_cast<Channel*>(L->pub.channel), &e);
  if (e) {
    auto& p = e->ev.param.conn;
    p.responder_resources = req.initiator_depth;
    p.initiator_depth = req.responder_resources;
    p.flow_control = req.e2e_flow_control;
    p.retry_count = req.retry_count;
    p.rnr_retry_count = req.rnr_retry_count;
    p.srq = req.srq;
    p.qp_num = req.local_qpn;
  }
}

void Manager::send_sidr_rep(Id* id, uint8_t status, uint32_t qpn, const void* pdata, uint8_t len) {
  wire::MadHeader h;
  h.tid = id->tid;
  h.attr_id = static_cast<uint16_t>(wire::CmAttr::SidrRep);
  wire::CmSidrRep rep;
  rep.request_id = id->remote_comm_id;
  rep.status = status;
  rep.qpn = status == 0 ? qpn : 0;
  rep.qkey = status == 0 ? RDMA_UDP_QKEY : 0;
  rep.service_id = wire::ip_service_id(static_cast<uint16_t>(id->pub.ps), id->service_port);
  if (pdata && len) std::memcpy(rep.private_data, pdata, std::min<size_t>(len, wire::kSidrRepPrivateLen));
  wire::encode_sidr_rep(h, rep, id->last_mad);  // kept: a resent SIDR_REQ gets the same answer
  send_mad(id, id->last_mad, false);
}

void Manager::on_sidr_req(const wire::MadHeader& h, const uint8_t* mad, Id* L) {
  wire::CmSidrReq req;
  wire::decode_sidr_req(mad, req);
  wire::CmaIpHeader cma;
  if (!L || !wire::decode_cma_header(req.private_data, cma)) return;
  for (Id* c : ids) {
    if (c->listener == L && c->remote_comm_id == req.request_id && c->peer_ip_be == cma.src_ip_be) {
      if (c->st == St::Connected || c->st == St::Rejected) send_mad(c, c->last_mad, false);
      return;
    }
  }
  auto* c = new Id;
  c->pub.channel = L->pub.channel;
  c->pub.context = L->pub.context;
  c->pub.ps = L->pub.ps;
  c->pub.qp_type = IBV_QPT_UD;
  c->pub.port_num = 1;
  c->listener = L;
  c->sync = L->sync;
  c->dev = device_for_ip(cma.dst_ip_be);
  if (!c->dev && L->dev) c->dev = L->dev;
  if (c->dev) c->pub.verbs = c->dev->ctx;
  c->peer_ip_be = cma.src_ip_be;
  c->peer_local = net::is_local_ip(cma.src_ip_be);
  c->tid = h.tid;
  c->remote_comm_id = req.request_id;
  c->service_port = L->service_port;
  auto& r = c->pub.route;
  auto* src = sin_of(&r.addr.src_addr);
  src->sin_family = AF_INET;
  src->sin_addr.s_addr = cma.dst_ip_be;
  src->sin_port = htons(L->service_port);
  auto* dst = sin_of(&r.addr.dst_addr);
  dst->sin_family = AF_INET;
  dst->sin_addr.s_addr = cma.src_ip_be;
  dst->sin_port = htons(cma.src_port);
  set_gid(r.addr.addr.ibaddr.sgid, cma.dst_ip_be);
  set_gid(r.addr.addr.ibaddr.dgid, cma.src_ip_be);
  r.addr.addr.ibaddr.pkey = 0xFFFF;
  c->st = St::ReqRcvd;
  ids.push_back(c);
  Event* e = nullptr;
  post(c, RDMA_CM_EVENT_CONNECT_REQUEST, 0, req.private_data + wire::kCmaHeaderLen,
       static_cast<uint8_t>(wire::kSidrReqPrivateLen - wire::kCmaHeaderLen), L,
       reinterpret_cast<Channel*>(L->pub.channel), &e);
  if (e) fill_ah_attr(e->ev.param.ud.ah_attr, r.addr.addr.ibaddr.dgid);  // the way back to the requester
}

void Manager::on_sidr_rep(Id* id, const uint8_t* mad) {
  if (id->st != St::ReqSent || id->listener_probes) return;
  wire::CmSidrRep rep;
  wire::decode_sidr_rep(mad, rep);
  id->awaiting = false;
  if (rep.status != 0) {
    // Kernel rdma_cm: a SIDR_REP other than "valid QP" is UNREACHABLE with the SIDR status.
    id->st = St::Failed;
    post(id, RDMA_CM_EVENT_UNREACHABLE, rep.status);
    return;
  }
  id->st = St::Connected;
  id->remote_qpn = rep.qpn;
  Event* e = nullptr;
  post(id, RDMA_CM_EVENT_ESTABLISHED, 0, rep.private_data, wire::kSidrRepPrivateLen, nullptr, nullptr, &e);
  if (e) {
    auto& u = e->ev.param.ud;
    fill_ah_attr(u.ah_attr, id->pub.route.addr.addr.ibaddr.dgid);
    u.qp_num = rep.qpn;
    u.qkey = rep.qkey;
  }
}

void Manager::on_mad(const uint8_t* mad, Id* listener) {
  wire::MadHeader h;
  if (!wire::decode_mad_header(mad, wire::kMadLen, h)) return;
  auto attr = static_cast<wire::CmAttr>(h.attr_id);
  if (attr == wire::CmAttr::Req || attr == wire::CmAttr::SidrReq) {
    if (!listener) {
      uint16_t port = wire::cm_service_id(mad, h.attr_id) & 0xFFFF;
      for (Id* i : ids)
        if (i->st == St::Listen && i->service_port == port) listener = i;
    }
    // A REQ names a connected port space, a SIDR_REQ a datagram one: the other kind finds no listener.
    if (listener && is_ud(listener) != (attr == wire::CmAttr::SidrReq)) listener = nullptr;
    if (attr == wire::CmAttr::Req)
      on_req(h, mad, listener);
    else
      on_sidr_req(h, mad, listener);
    return;
  }
  auto it = by_comm.find(wire::cm_destination_comm_id(mad, h.attr_id));
  if (it == by_comm.end()) return;
  Id* id = it->second;
  switch (attr) {
    case wire::CmAttr::SidrRep:
      on_sidr_rep(id, mad);
      return;
    case wire::CmAttr::Rep: {
      wire::CmRep rep;
      wire::decode_rep(mad, rep);
      if (id->st == St::Connected) {  // our RTU was lost
        send_rtu(id);
        return;
      }
      if (id->st != St::ReqSent) return;
      id->awaiting = false;
      id->remote_comm_id = rep.local_comm_id;
      id->remote_qpn = rep.local_qpn;
      id->my_psn = rep.starting_psn;  // we send from the PSN the passive side expects
      id->init_depth = std::min(id->init_depth, rep.responder_resources);
      id->rnr_retry = rep.rnr_retry_count;
      Event* e = nullptr;
      if (!id->pub.qp) {
        id->st = St::RepRcvd;
        post(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, rep.private_data, wire::kRepPrivateLen, nullptr, nullptr, &e);
      } else if (modify_rtr_rts(id) != 0) {
        send_rej(id, wire::kRejNoQp, wire::kMsgRep, nullptr, 0);
        id->st = St::Failed;
        post(id, RDMA_CM_EVENT_CONNECT_ERROR, -EINVAL);
        return;
      } else {
        send_rtu(id);
        id->st = St::Connected;
        post(id, RDMA_CM_EVENT_ESTABLISHED, 0, rep.private_data, wire::kRepPrivateLen, nullptr, nullptr, &e);
      }
      if (e) {
        auto& p = e->ev.param.conn;
        p.responder_resources = rep.initiator_depth;
        p.initiator_depth = rep.responder_resources;
        p.flow_control = rep.e2e_flow_control;
        p.rnr_retry_count = rep.rnr_retry_count;
        p.srq = rep.srq;
        p.qp_num = rep.local_qpn;
      }
      return;
    }
    case wire::CmAttr::Rtu: {
      if (id->st != St::RepSent) return;
      wire::CmSimple rtu;
      wire::decode_simple(mad, h.attr_id, rtu);
      id->awaiting = false;
      id->st = St::Connected;
      post(id, RDMA_CM_EVENT_ESTABLISHED, 0, rtu.private_data, wire::kRtuPrivateLen);
      return;
    }
    case wire::CmAttr::Rej: {
      wire::CmRej rej;
      wire::decode_rej(mad, rej);
      if ((id->st == St::Connected || id->st == St::DreqSent) && rej.reason == wire::kRejInvalidCommId) {
        // Our peer's host no longer knows the connection: its process is gone (gsi.cpp).
        id->awaiting = false;
        id->st = St::Disconnected;
        post(id, RDMA_CM_EVENT_DISCONNECTED, 0);
        return;
      }
      if (id->st != St::ReqSent && id->st != St::RepSent && id->st != St::RepRcvd) return;
      id->awaiting = false;
      id->st = St::Rejected;
      post(id, RDMA_CM_EVENT_REJECTED, rej.reason, rej.private_data, wire::kRejPrivateLen);
      return;
    }
    case wire::CmAttr::Mra: {
      wire::CmMra mra;
      wire::decode_mra(mad, mra);
      // The peer needs more time: wait its service timeout on top of ours before resending.
      if (id->awaiting)
        id->deadline_ns = now_ns() + cm_timeout_ns() + (4096ull << std::min<uint8_t>(mra.service_timeout, 31));
      return;
    }
    case wire::CmAttr::Dreq: {
      send_simple(id, wire::CmAttr::Drep, h.tid, 0, false);
      if (id->st == St::Connected || id->st == St::DreqSent || id->st == St::RepSent) {
        id->awaiting = false;
        id->st = St::Disconnected;
        post(id, RDMA_CM_EVENT_DISCONNECTED, 0);
      }
      return;
    }
    case wire::CmAttr::Drep:
      if (id->st != St::DreqSent) return;
      id->awaiting = false;
      id->st = St::Disconnected;
      post(id, RDMA_CM_EVENT_DISCONNECTED, 0);
      return;
    default:
      return;
  }
}

void Manager::receive(int fd, Id* listener) {
  uint8_t buf[2048];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) return;
    // Senders are local peers or this host's 4791 holder, which checked the ICRC (gsi.cpp).
    if (const uint8_t* mad = wire::gsi_mad(buf, static_cast<size_t>(n))) on_mad(mad, listener);
  }
}

void Manager::timers() {
  uint64_t now = now_ns();
  for (Id* id : ids) {
    if (!id->awaiting || now < id->deadline_ns) continue;
    if (id->listener_probes) {
      if (net::udp_port_bound(id->service_port)) {
        id->listener_probes = 0;
        send_mad(id, id->last_mad, true);
      } else if (--id->listener_probes == 0) {
        id->awaiting = false;
        id->st = St::Rejected;
        if (is_ud(id))
          post(id, RDMA_CM_EVENT_UNREACHABLE, 1);  // SIDR_REP status 1: service ID not supported
        else
          post(id, RDMA_CM_EVENT_REJECTED, wire::kRejInvalidServiceId);
      } else {
        id->deadline_ns = now + kProbeIntervalNs;
      }
      continue;
    }
    if (id->retries_left-- > 0) {
      send_mad(id, id->last_mad, false);
      id->deadline_ns = now + cm_timeout_ns();
      continue;
    }
    id->awaiting = false;
    switch (id->st) {
      case St::ReqSent:
      case St::RepSent:
        id->st = St::Failed;
        post(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
        break;
      case St::DreqSent:
        id->st = St::Disconnected;
        post(id, RDMA_CM_EVENT_DISCONNECTED, 0);
        break;
      default:
        break;
    }
  }
  // A peer process on this host that died without a DREQ: its comm ID's owner is gone. (A real fabric
  // learns this from the peer's kernel, which sends the DREQ for a dying process.)
  if (now - last_liveness_ns_ < 200000000ull) return;
  last_liveness_ns_ = now;
  // A peer process on another host that died: its host answers for it (gsi.cpp) when we resend what
  // a live peer ignores or answers harmlessly (IBTA 12.9.x duplicates): the active side its RTU, the
  // passive side its REP (the peer answers with its RTU). A kernel rdma_cm peer needs none of this
  // (its kernel sends the DREQ for a dying process) and ignores the duplicates.
  for (Id* id : ids) {
    if (id->st != St::Connected || id->peer_local || is_ud(id) || id->awaiting) continue;
    if (!id->next_probe_ns) id->next_probe_ns = now + cm_probe_ns();
    if (now < id->next_probe_ns) continue;
    id->next_probe_ns = now + cm_probe_ns();
    if (id->passive) {
      send_mad(id, id->last_mad, false);
    } else {
      send_rtu(id);
    }
  }
  for (Id* id : ids) {
    if (id->st != St::Connected || !id->peer_local || is_ud(id)) continue;
    auto ep = net::Registry::instance().lookup(id->remote_comm_id & 0xFFFFFF);
    if (ep && !(kill(ep->pid, 0) != 0 && errno == ESRCH)) continue;
    id->st = St::Disconnected;
    post(id, RDMA_CM_EVENT_DISCONNECTED, 0);
  }
}

void Manager::loop() {
  std::vector<pollfd> fds;
  std::vector<Id*> owners;
  for (;;) {
    int timeout_ms = 200;
    {
      std::lock_guard lock(mu);
      fds.assign({pollfd{sock, POLLIN, 0}, pollfd{wake_fd, POLLIN, 0}});
      owners.assign(2, nullptr);
      uint64_t now = now_ns();
      for (Id* id : ids) {
        if (id->st == St::Listen && id->sock >= 0) {
          fds.push_back(pollfd{id->sock, POLLIN, 0});
          owners.push_back(id);
        }
        if (id->awaiting) {
          int64_t ms = id->deadline_ns > now ? int64_t((id->deadline_ns - now) / 1000000) + 1 : 0;
          timeout_ms = static_cast<int>(std::min<int64_t>(timeout_ms, ms));
        }
      }
    }
    poll(fds.data(), fds.size(), timeout_ms);
    std::lock_guard lock(mu);
    ++loop_gen;
    loop_cv.notify_all();
    uint64_t v;
    [[maybe_unused]] ssize_t n = read(wake_fd, &v, sizeof v);
    receive(sock, nullptr);
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      // The id may have been destroyed while we polled.
      if (std::find(ids.begin(), ids.end(), owners[i]) != ids.end() && owners[i]->sock == fds[i].fd)
        receive(fds[i].fd, owners[i]);
    }
    timers();
  }
}

void Manager::at_exit() {
  // A process that exits with connections up disconnects them, as the kernel does for a dying process.
  std::lock_guard lock(mu);
  for (Id* id : ids)
    if (id->st == St::Connected && !is_ud(id)) send_dreq(id);
}

Manager& M() { return Manager::get(); }

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

// Binds the id's UDP socket: its port is the rdma_cm port (docs/rdmacm.md, "port space").
int bind_port(Id* id, uint32_t ip_be, uint16_t port_be) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = ip_be;
  a.sin_port = port_be;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    int e = errno;
    close(fd);
    return e;
  }
  socklen_t l = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
  id->sock = fd;
  id->service_port = ntohs(a.sin_port);
  auto* src = sin_of(&id->pub.route.addr.src_addr);
  src->sin_family = AF_INET;
  src->sin_addr.s_addr = ip_be;
  src->sin_port = a.sin_port;
  if (id->st == St::Idle) id->st = St::Bound;
  return 0;
}

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
  if (ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IB && ps != RDMA_PS_IPOIB) return fail(EINVAL);
  auto* id = new Id;
  if (!ch) {
    Channel* c = new_channel();
    if (!c) {
      delete id;
      return -1;
    }
    ch = &c->pub;
    id->sync = true;
  }
  id->pub.channel = ch;
  id->pub.context = context;
  id->pub.ps = ps;
  id->pub.qp_type = ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
  id->pub.port_num = 1;
  std::lock_guard lock(M().mu);
  M().ids.push_back(id);
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
  while (id->events_out > 0 && m.acked.wait_until(lock, ack_deadline) != std::cv_status::timeout) {
  }
  const bool unacked = id->events_out > 0;
  if (id->st == St::Connected && !is_ud(id)) {
    m.send_dreq(id);
  } else if (id->st == St::ReqRcvd) {
    if (is_ud(id))
      m.send_sidr_rep(id, 2, 0, nullptr, 0);
    else
      m.send_rej(id, wire::kRejConsumerDefined, wire::kMsgReq, nullptr, 0);
  }
  m.release_comm_id(id);
  // Children of a destroyed listener keep working, as in the kernel.
  for (Id* o : m.ids)
    if (o->listener == id) o->listener = nullptr;
  bool polled = id->st == St::Listen;
  std::erase(m.ids, id);
  if (id->sock >= 0) {
    if (polled) {
      // The application may bind this port again at once (perftest -R re-listens).
      const uint64_t gen = m.loop_gen;
      m.wake();
      m.loop_cv.wait(lock, [&] { return m.loop_gen != gen; });
    }
    close(id->sock);
  }
  lock.unlock();
  if (id->sync) release_channel(reinterpret_cast<Channel*>(id->pub.channel), false);
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
        M().to_error(id);
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
  M().acked.notify_all();
  delete e;
  return 0;
}

SOFTRDMA_EXPORT int rdma_bind_addr(rdma_cm_id* pid, sockaddr* addr) {
  if (!pid || !addr) return fail(EINVAL);
  if (addr->sa_family != AF_INET) return fail(EAFNOSUPPORT);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  if (id->sock >= 0) return fail(EINVAL);
  uint32_t ip = sin_of(addr)->sin_addr.s_addr;
  // A loopback address binds to no device, as the wildcard does (the kernel's cma_any_addr): id->verbs
  // stays NULL, and ids that connect through this one find the loopback device then. libfabric's verbs
  // provider relies on it (its default source, "localhost", must not pick one device).
  const bool loopback = (ntohl(ip) >> 24) == 127;
  if (ip != INADDR_ANY && !loopback) {
    id->dev = M().device_for_ip(ip);
    if (!id->dev) return fail(EADDRNOTAVAIL);
    id->pub.verbs = id->dev->ctx;
    set_gid(id->pub.route.addr.addr.ibaddr.sgid, ip);
  }
  if (int e = bind_port(id, ip, sin_of(addr)->sin_port)) return fail(e);
  return 0;
}

SOFTRDMA_EXPORT int rdma_resolve_addr(rdma_cm_id* pid, sockaddr* src, sockaddr* dst, int /*timeout_ms*/) {
  if (!pid || !dst) return fail(EINVAL);
  if (dst->sa_family != AF_INET || (src && src->sa_family != AF_INET)) return fail(EAFNOSUPPORT);
  Id* id = to_id(pid);
  auto& m = M();
  {
    std::lock_guard lock(m.mu);
    uint32_t dst_ip = sin_of(dst)->sin_addr.s_addr;
    uint32_t src_ip = src ? sin_of(src)->sin_addr.s_addr : 0;
    if (!src_ip && id->sock >= 0) src_ip = sin_of(&id->pub.route.addr.src_addr)->sin_addr.s_addr;
    int err = 0;
    if (!src_ip) {
      // The route's source address: what the kernel would pick for a datagram to dst.
      int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      sockaddr_in probe = *sin_of(dst);
      if (!probe.sin_port) probe.sin_port = htons(9);
      if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&probe), sizeof probe) != 0) {
        err = errno;
      } else {
        sockaddr_in a{};
        socklen_t l = sizeof a;
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
        src_ip = a.sin_addr.s_addr;
      }
      if (fd >= 0) close(fd);
    }
    Device* d = err ? nullptr : m.device_for_ip(src_ip);
    if (!d) {
      m.post(id, RDMA_CM_EVENT_ADDR_ERROR, -(err ? err : ENODEV));
    } else {
      if (id->sock < 0) {
        uint16_t port = src ? sin_of(src)->sin_port : 0;
        if (int e = bind_port(id, src_ip, port)) return fail(e);
      }
      id->dev = d;
      id->pub.verbs = d->ctx;
      id->peer_ip_be = dst_ip;
      id->peer_local = net::is_local_ip(dst_ip);
      sin_of(&id->pub.route.addr.src_addr)->sin_addr.s_addr = src_ip;
      std::memcpy(&id->pub.route.addr.dst_addr, dst, sizeof(sockaddr_in));
      set_gid(id->pub.route.addr.addr.ibaddr.sgid, src_ip);
      set_gid(id->pub.route.addr.addr.ibaddr.dgid, dst_ip);
      id->pub.route.addr.addr.ibaddr.pkey = 0xFFFF;
      id->st = St::AddrResolved;
      m.post(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
    }
  }
  return id->sync ? wait_for(id, RDMA_CM_EVENT_ADDR_RESOLVED) : 0;
}

SOFTRDMA_EXPORT int rdma_resolve_route(rdma_cm_id* pid, int /*timeout_ms*/) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  {
    std::lock_guard lock(M().mu);
    if (id->st != St::AddrResolved && id->st != St::RouteResolved) return fail(EINVAL);
    // RoCE has no subnet administrator: the path record is the two GIDs and the port's MTU.
    auto& r = id->pub.route;
    if (!r.path_rec) r.path_rec = static_cast<ibv_sa_path_rec*>(calloc(1, sizeof(ibv_sa_path_rec)));
    ibv_sa_path_rec& p = *r.path_rec;
    p.dgid = r.addr.addr.ibaddr.dgid;
    p.sgid = r.addr.addr.ibaddr.sgid;
    p.pkey = htobe16(0xFFFF);
    p.mtu_selector = 2;
    p.mtu = id->dev ? id->dev->mtu : IBV_MTU_1024;
    p.rate_selector = 2;
    p.rate = 16;  // 40 Gb/s, nominal
    p.packet_life_time_selector = 2;
    p.packet_life_time = 16;
    p.hop_limit = 64;
    p.reversible = 1;
    p.numb_path = 1;
    r.num_paths = 1;
    id->mtu = p.mtu;
    id->st = St::RouteResolved;
    M().post(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
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
    if (!id->pub.pd && id->dev && !id->dev->pd) id->dev->pd = ibv_alloc_pd(id->pub.verbs);
    attr->pd = id->pub.pd ? id->pub.pd : (id->dev ? id->dev->pd : nullptr);
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
  auto& m = M();
  {
    std::lock_guard lock(m.mu);
    if (id->st != St::RouteResolved) return fail(EINVAL);
    rdma_conn_param dflt{};
    const rdma_conn_param& p = param ? *param : dflt;
    if (is_ud(id)) {
      // SIDR_REQ: asks the service for its QPN and Q_Key (IBTA 12.11.1).
      if (p.private_data_len > wire::kSidrReqPrivateLen - wire::kCmaHeaderLen) return fail(EINVAL);
      id->tid = (uint64_t(random_u32()) << 32) | random_u32();
      id->service_port = ntohs(sin_of(&id->pub.route.addr.dst_addr)->sin_port);
      if (!m.alloc_comm_id(id)) return fail(ENOMEM);
      wire::CmSidrReq req;
      req.request_id = id->local_comm_id;
      req.service_id = wire::ip_service_id(static_cast<uint16_t>(id->pub.ps), id->service_port);
      wire::CmaIpHeader cma;
      cma.src_port = ntohs(sin_of(&id->pub.route.addr.src_addr)->sin_port);
      cma.src_ip_be = sin_of(&id->pub.route.addr.src_addr)->sin_addr.s_addr;
      cma.dst_ip_be = id->peer_ip_be;
      wire::encode_cma_header(cma, req.private_data);
      if (p.private_data_len)
        std::memcpy(req.private_data + wire::kCmaHeaderLen, p.private_data, p.private_data_len);
      wire::MadHeader h;
      h.tid = id->tid;
      h.attr_id = static_cast<uint16_t>(wire::CmAttr::SidrReq);
      uint8_t mad[wire::kMadLen];
      wire::encode_sidr_req(h, req, mad);
      id->st = St::ReqSent;
      m.send_mad(id, mad, true);
      if (id->peer_local && !net::udp_port_bound(id->service_port)) {
        id->listener_probes = 20;  // as for a REQ (below)
        id->deadline_ns = now_ns() + kProbeIntervalNs;
      }
      m.wake();
    } else {
    if (p.private_data_len > wire::kReqPrivateLen - wire::kCmaHeaderLen) return fail(EINVAL);
    uint8_t max_rd = id->dev->max_rd_atom;
    if (p.responder_resources != RDMA_MAX_RESP_RES && p.responder_resources > max_rd) return fail(EINVAL);
    if (p.initiator_depth != RDMA_MAX_INIT_DEPTH && p.initiator_depth > max_rd) return fail(EINVAL);
    id->resp_res = std::min(p.responder_resources, max_rd);
    id->init_depth = std::min(p.initiator_depth, max_rd);
    id->retry_count = std::min<uint8_t>(p.retry_count, 7);
    id->remote_psn = random_u32() & 0xFFFFFF;  // what we expect to receive; the REP says what we send
    id->tid = (uint64_t(random_u32()) << 32) | random_u32();
    id->service_port = ntohs(sin_of(&id->pub.route.addr.dst_addr)->sin_port);
    if (!m.alloc_comm_id(id)) return fail(ENOMEM);
    wire::CmReq req;
    req.local_comm_id = id->local_comm_id;
    req.service_id = wire::ip_service_id(static_cast<uint16_t>(id->pub.ps), id->service_port);
    req.local_ca_guid = id->dev->guid_be;
    req.local_qpn = id->pub.qp ? id->pub.qp->qp_num : p.qp_num;
    req.responder_resources = id->resp_res;
    req.initiator_depth = id->init_depth;
    req.remote_cm_response_timeout = 20;
    req.local_cm_response_timeout = 20;
    req.transport_service_type = id->pub.qp && id->pub.qp->qp_type == IBV_QPT_UC ? 1 : 0;
    req.e2e_flow_control = p.flow_control;
    req.starting_psn = id->remote_psn;
    req.retry_count = id->retry_count;
    req.pkey = 0xFFFF;
    req.path_mtu = id->mtu;
    req.rnr_retry_count = std::min<uint8_t>(p.rnr_retry_count, 7);
    req.max_cm_retries = 15;
    req.srq = p.srq || (id->pub.qp && id->pub.qp->srq);
    uint32_t src_ip = sin_of(&id->pub.route.addr.src_addr)->sin_addr.s_addr;
    std::memcpy(req.primary.local_gid, id->pub.route.addr.addr.ibaddr.sgid.raw, 16);
    std::memcpy(req.primary.remote_gid, id->pub.route.addr.addr.ibaddr.dgid.raw, 16);
    req.primary.hop_limit = 64;
    req.primary.packet_rate = 16;
    req.primary.local_ack_timeout = id->ack_timeout_opt != 0xFF ? id->ack_timeout_opt : 17;
    id->ack_timeout = req.primary.local_ack_timeout;
    wire::CmaIpHeader cma;
    cma.src_port = ntohs(sin_of(&id->pub.route.addr.src_addr)->sin_port);
    cma.src_ip_be = src_ip;
    cma.dst_ip_be = id->peer_ip_be;
    wire::encode_cma_header(cma, req.private_data);
    if (p.private_data_len) std::memcpy(req.private_data + wire::kCmaHeaderLen, p.private_data, p.private_data_len);
    wire::MadHeader h;
    h.tid = id->tid;
    h.attr_id = static_cast<uint16_t>(wire::CmAttr::Req);
    uint8_t mad[wire::kMadLen];
    wire::encode_req(h, req, mad);
    id->st = St::ReqSent;
    m.send_mad(id, mad, true);
    if (id->peer_local && !net::udp_port_bound(id->service_port)) {
      // Nobody on this host listens on that port yet. A server that re-listens on its port (perftest
      // does between its two connections) gets a moment, as a REQ crossing a real fabric gives it; then
      // the answer is what the 4791 holder gives a remote peer: REJ "invalid service ID".
      id->listener_probes = 20;
      id->deadline_ns = now_ns() + kProbeIntervalNs;
    }
    m.wake();
    }
  }
  return id->sync ? wait_for(id, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

SOFTRDMA_EXPORT int rdma_listen(rdma_cm_id* pid, int /*backlog*/) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  if (id->sock < 0)
    if (int e = bind_port(id, INADDR_ANY, 0)) return fail(e);
  if (id->st != St::Bound && id->st != St::Listen) return fail(EINVAL);
  // A wildcard listener hears every device, as the kernel's: open them all, so that this host has a
  // 4791 holder to forward REQs from other hosts even when no other softrdma process runs here.
  if (!id->dev) M().device_for_ip(0);
  id->st = St::Listen;
  M().wake();
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
  auto& m = M();
  {
    std::lock_guard lock(m.mu);
    if (id->st == St::Listen) return fail(EINVAL);
    if (id->st != St::ReqRcvd) return fail(EINVAL);
    rdma_conn_param dflt{};
    dflt.responder_resources = RDMA_MAX_RESP_RES;
    dflt.initiator_depth = RDMA_MAX_INIT_DEPTH;
    const rdma_conn_param& p = param ? *param : dflt;
    if (is_ud(id)) {
      // SIDR_REP "valid QP" with our QPN and Q_Key. No ESTABLISHED here, as with the kernel's CM.
      if (p.private_data_len > wire::kSidrRepPrivateLen) return fail(EINVAL);
      m.send_sidr_rep(id, 0, id->pub.qp ? id->pub.qp->qp_num : p.qp_num, p.private_data, p.private_data_len);
      id->st = St::Connected;
      return 0;
    }
    if (p.private_data_len > wire::kRepPrivateLen) return fail(EINVAL);
    uint8_t max_rd = id->dev ? id->dev->max_rd_atom : 16;
    id->resp_res = std::min(p.responder_resources, max_rd);
    id->init_depth = std::min<uint8_t>(std::min(p.initiator_depth, max_rd), id->init_depth);
    if (m.modify_rtr_rts(id) != 0) {
      m.send_rej(id, wire::kRejNoQp, wire::kMsgReq, nullptr, 0);
      id->st = St::Failed;
      return fail(EINVAL);
    }
    wire::CmRep rep;
    rep.local_comm_id = id->local_comm_id;
    rep.remote_comm_id = id->remote_comm_id;
    rep.local_qpn = id->pub.qp ? id->pub.qp->qp_num : p.qp_num;
    rep.starting_psn = id->remote_psn;
    rep.responder_resources = id->resp_res;
    rep.initiator_depth = id->init_depth;
    rep.target_ack_delay = 15;
    rep.e2e_flow_control = p.flow_control;
    rep.rnr_retry_count = std::min<uint8_t>(p.rnr_retry_count, 7);
    rep.srq = p.srq || (id->pub.qp && id->pub.qp->srq);
    rep.local_ca_guid = id->dev ? id->dev->guid_be : 0;
    if (p.private_data_len) std::memcpy(rep.private_data, p.private_data, p.private_data_len);
    wire::MadHeader h;
    h.tid = id->tid;
    h.attr_id = static_cast<uint16_t>(wire::CmAttr::Rep);
    uint8_t mad[wire::kMadLen];
    wire::encode_rep(h, rep, mad);
    id->st = St::RepSent;
    m.send_mad(id, mad, true);
    m.wake();
  }
  return id->sync ? wait_for(id, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

SOFTRDMA_EXPORT int rdma_reject(rdma_cm_id* pid, const void* private_data, uint8_t len) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  if (id->st != St::ReqRcvd) return fail(EINVAL);
  if (is_ud(id)) {
    if (len > wire::kSidrRepPrivateLen) return fail(EINVAL);
    M().send_sidr_rep(id, 2, 0, private_data, len);  // status 2: rejected by the service
    id->st = St::Rejected;
    return 0;
  }
  if (len > wire::kRejPrivateLen) return fail(EINVAL);
  M().send_rej(id, wire::kRejConsumerDefined, wire::kMsgReq, private_data, len);
  id->st = St::Rejected;
  return 0;
}

SOFTRDMA_EXPORT int rdma_reject_ece(rdma_cm_id* pid, const void* private_data, uint8_t len) {
  return rdma_reject(pid, private_data, len);
}

SOFTRDMA_EXPORT int rdma_establish(rdma_cm_id* pid) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  if (id->st != St::RepRcvd) return fail(EINVAL);
  M().send_rtu(id);
  id->st = St::Connected;
  return 0;
}

SOFTRDMA_EXPORT int rdma_disconnect(rdma_cm_id* pid) {
  if (!pid) return fail(EINVAL);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  M().to_error(id);
  if (is_ud(id)) {
    if (id->st == St::Connected) id->st = St::Disconnected;  // SIDR leaves no connection to tear down
    return 0;
  }
  if (id->st == St::Connected || id->st == St::RepSent || id->st == St::RepRcvd) {
    id->st = St::DreqSent;
    M().send_dreq(id);
    M().wake();
  }
  return 0;
}

SOFTRDMA_EXPORT int rdma_init_qp_attr(rdma_cm_id* pid, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (!pid || !qp_attr || !qp_attr_mask) return fail(EINVAL);
  Id* id = to_id(pid);
  std::lock_guard lock(M().mu);
  ibv_qp_state s = qp_attr->qp_state;
  if (s != IBV_QPS_INIT && s != IBV_QPS_RTR && s != IBV_QPS_RTS) return fail(EINVAL);
  if (s != IBV_QPS_INIT && !id->remote_qpn && id->pub.qp_type != IBV_QPT_UD) return fail(EINVAL);
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
  M().acked.wait(lock, [&] { return id->events_out <= 0; });
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
  bool destroy_old = id->sync;
  id->pub.channel = ch;
  id->sync = sync;
  lock.unlock();
  if (destroy_old && old && old != nc) release_channel(old, false);
  return 0;
}

SOFTRDMA_EXPORT int rdma_set_option(rdma_cm_id* pid, int level, int optname, void* optval, size_t optlen) {
  if (!pid || !optval) return fail(EINVAL);
  Id* id = to_id(pid);
  if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_ACK_TIMEOUT && optlen == sizeof(uint8_t)) {
    id->ack_timeout_opt = std::min<uint8_t>(*static_cast<uint8_t*>(optval), 31);
    return 0;
  }
  if (level == RDMA_OPTION_ID || level == RDMA_OPTION_IB) return 0;  // TOS, REUSEADDR, AFONLY, path: accepted
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
  M().device_for_ip(0);  // opens them all
  auto& d = M().devices;
  auto** list = static_cast<ibv_context**>(calloc(d.size() + 1, sizeof(ibv_context*)));
  if (!list) return nullptr;
  for (size_t i = 0; i < d.size(); ++i) list[i] = d[i]->ctx;
  if (num) *num = static_cast<int>(d.size());
  return list;
}
SOFTRDMA_EXPORT void rdma_free_devices(ibv_context** list) { free(list); }

// RoCE multicast needs no subnet administrator: joining is local (the QP's engine joins the IPv4 group
// when the QP is attached, src/verbs/ah.cpp), and the event hands out the group's address vector.
SOFTRDMA_EXPORT int rdma_join_multicast(rdma_cm_id* pid, sockaddr* addr, void* context) {
  if (!pid || !addr) return fail(EINVAL);
  if (addr->sa_family != AF_INET) return fail(EAFNOSUPPORT);
  Id* id = to_id(pid);
  const uint32_t group = sin_of(addr)->sin_addr.s_addr;
  if (!IN_MULTICAST(ntohl(group))) return fail(EINVAL);
  std::lock_guard lock(M().mu);
  if (!id->dev || !is_ud(id)) return fail(EINVAL);
  if (std::find(id->mcast_groups.begin(), id->mcast_groups.end(), group) != id->mcast_groups.end())
    return fail(EADDRINUSE);
  id->mcast_groups.push_back(group);
  Event* e = nullptr;
  M().post(id, RDMA_CM_EVENT_MULTICAST_JOIN, 0, nullptr, 0, nullptr, nullptr, &e);
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
  if (addr->sa_family != AF_INET) return fail(EAFNOSUPPORT);
  Id* id = to_id(pid);
  const uint32_t group = sin_of(addr)->sin_addr.s_addr;
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
    if (id->dev && !id->dev->pd) id->dev->pd = ibv_alloc_pd(pid->verbs);
    pd = pid->pd ? pid->pd : id->dev ? id->dev->pd : nullptr;
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
// A copy of an IPv4 address given in hints (NULL when absent; false when it is not IPv4).
bool hint_addr(const sockaddr* a, socklen_t len, sockaddr_in** out) {
  *out = nullptr;
  if (!a || !len) return true;
  if (a->sa_family != AF_INET || len < sizeof(sockaddr_in)) return false;
  *out = static_cast<sockaddr_in*>(malloc(sizeof(sockaddr_in)));
  if (*out) std::memcpy(*out, a, sizeof(sockaddr_in));
  return true;
}
}  // namespace

// Without node and service the addresses come from hints.ai_src_addr / ai_dst_addr (rdma_getaddrinfo(3)),
// as libfabric's verbs provider asks for a connecting endpoint.
SOFTRDMA_EXPORT int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                                     rdma_addrinfo** res) {
  const bool hinted = hints && ((hints->ai_src_addr && hints->ai_src_len) || (hints->ai_dst_addr && hints->ai_dst_len));
  if (!res || (!node && !service && !hinted)) return fail(EINVAL);
  if (hints && hints->ai_family && hints->ai_family != AF_INET) return EAI_FAMILY;
  const bool passive = hints && (hints->ai_flags & RAI_PASSIVE);
  sockaddr_in* named = nullptr;  // what node/service resolve to
  if (node || service) {
    addrinfo h{};
    h.ai_family = AF_INET;
    h.ai_socktype = SOCK_STREAM;
    if (passive) h.ai_flags |= AI_PASSIVE;
    if (hints && (hints->ai_flags & RAI_NUMERICHOST)) h.ai_flags |= AI_NUMERICHOST;
    addrinfo* ai = nullptr;
    int rc = getaddrinfo(node, service, &h, &ai);
    if (rc) return rc;
    named = static_cast<sockaddr_in*>(malloc(sizeof(sockaddr_in)));
    if (named) std::memcpy(named, ai->ai_addr, sizeof *named);
    freeaddrinfo(ai);
    if (!named) return EAI_MEMORY;
  }
  sockaddr_in *src = nullptr, *dst = nullptr;
  if (!hint_addr(hints ? hints->ai_src_addr : nullptr, hints ? hints->ai_src_len : 0, &src) ||
      !hint_addr(hints ? hints->ai_dst_addr : nullptr, hints ? hints->ai_dst_len : 0, &dst)) {
    free(named);
    free(src);
    free(dst);
    return EAI_FAMILY;
  }
  if (named) {
    // The named address replaces the hinted one on its side: the source when passive, else the destination.
    sockaddr_in*& side = passive ? src : dst;
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
  r->ai_family = AF_INET;
  r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
  r->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type
                  : r->ai_port_space == RDMA_PS_UDP ? IBV_QPT_UD
                                                    : IBV_QPT_RC;
  r->ai_src_addr = reinterpret_cast<sockaddr*>(src);
  r->ai_src_len = src ? sizeof *src : 0;
  r->ai_dst_addr = reinterpret_cast<sockaddr*>(dst);
  r->ai_dst_len = dst ? sizeof *dst : 0;
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
