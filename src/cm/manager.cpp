// The per-process connection manager (cm.h): a thread that receives CM MADs on the process's CM socket
// and on listening endpoints' sockets, resends unanswered requests, and tells the consumer what
// happened. All state sits under one lock; the consumer's calls made under it never call back into us.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <openssl/crypto.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <thread>

#include "cm/cm.h"
#include "cm/protect.h"
#include "config/config.h"
#include "net/interfaces.h"
#include "net/os_socket.h"
#include "net/packet_port.h"
#include "net/registry.h"
#include "net/udp_port.h"
#include "wire/headers.h"

namespace softrdma::cm {
namespace {

// How long a CM request waits for its answer before it is sent again, and how often. The kernel waits
// 4.096 us * 2^20 (~4.3 s) 15 times; SOFTRDMA_CM_TIMEOUT_MS / SOFTRDMA_CM_RETRIES shorten that for tests.
uint64_t cm_timeout_ns() { return config::parse().cm_timeout_ms * 1000000ull; }
constexpr uint64_t kProbeIntervalNs = 50000000;  // 50 ms
int cm_retries() { return static_cast<int>(config::parse().cm_retries); }
// How often a connection to another host checks that its peer process still exists (docs/rdmacm.md).
uint64_t cm_probe_ns() { return config::parse().cm_probe_ms * 1000000ull; }

// Starting PSNs, communication IDs and transaction IDs come from the kernel's CSPRNG: a peer that
// saw the values of its own connections must learn nothing about another's (a seeded mt19937 gives
// its 32-bit seed away, and with it the PSNs of the next connections: a blind injector's target).
uint32_t random_u32() {
  uint32_t v = 0;
  for (;;) {
    ssize_t n = getrandom(&v, sizeof v, 0);
    if (n == static_cast<ssize_t>(sizeof v)) return v;
    if (n < 0 && errno != EINTR) return static_cast<uint32_t>(std::random_device{}());  // no getrandom(2)
  }
}
uint64_t random_tid() { return (uint64_t(random_u32()) << 32) | random_u32(); }

// RoCE v2 GIDs are the addresses: ::ffff:a.b.c.d for IPv4.
void set_gid(uint8_t* g, const wire::IpAddress& ip) { std::memcpy(g, ip.bytes.data(), 16); }
wire::IpAddress gid_ip(const uint8_t* raw) { return wire::IpAddress::from_bytes(raw); }

bool owner_alive(uint32_t comm_id) {
  auto ep = net::Registry::instance().lookup(comm_id & 0xFFFFFF);
  return ep && !(kill(ep->pid, 0) != 0 && errno == ESRCH);
}

}  // namespace

int route_source(const wire::IpAddress& dst_ip, uint16_t dst_port_be, wire::IpAddress& src_ip) {
  int fd = net::os_socket(dst_ip.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage probe{};
  const socklen_t len = wire::to_sockaddr(dst_ip, dst_port_be ? ntohs(dst_port_be) : 9, &probe);
  int err = 0;
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&probe), len) != 0) {
    err = fd < 0 ? EAFNOSUPPORT : errno;
  } else {
    sockaddr_storage a{};
    socklen_t l = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
    wire::from_sockaddr(reinterpret_cast<sockaddr*>(&a), &src_ip);
  }
  if (fd >= 0) close(fd);
  return err;
}

Manager& Manager::get() {
  static Manager* m = new Manager;  // leaked: endpoints may be used from exit-time code
  return *m;
}

Manager::Manager() {
  auto open_v4 = [this] {
    sock_ = net::os_socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    // DF with IP identification 0, as softrdma's data sockets send: the ICRC covers both
    // (wire/icrc.h), and kernel rxe drops MADs whose ICRC does not match.
    int pmtu = IP_PMTUDISC_DO;
    setsockopt(sock_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  };
  open_v4();
  // The same number in IPv6's port space for MADs over IPv6: the registry names one port per
  // process, and the 4791 holder of an IPv6 device hands MADs to it there.
  for (int attempt = 0; attempt < 16; ++attempt) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    bind(sock_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t l = sizeof a;
    getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &l);
    sock_port_ = ntohs(a.sin_port);
    sock6_ = net::os_socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (sock6_ < 0) break;  // no IPv6 here
    int one = 1, pmtu6 = IPV6_PMTUDISC_DO;
    setsockopt(sock6_, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    setsockopt(sock6_, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu6, sizeof pmtu6);
    sockaddr_in6 a6{};
    a6.sin6_family = AF_INET6;
    a6.sin6_port = a.sin_port;
    if (bind(sock6_, reinterpret_cast<sockaddr*>(&a6), sizeof a6) == 0) break;
    const int err = errno;
    close(sock6_);
    sock6_ = -1;
    if (err != EADDRINUSE) break;
    // Taken in IPv6's space: both sockets try another number.
    close(sock_);
    open_v4();
  }
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  // The thread takes none of the application's signals.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  std::thread([this] { loop(); }).detach();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  atexit([] { Manager::get().at_exit(); });
}

void Manager::wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
}

void Manager::post(Connection& c, Event e) {
  if (consumer_) consumer_->event(c, e);
}

uint32_t Manager::alloc_comm_id(Connection& c) {
  // The registry number maps the comm ID to this process's CM socket for the 4791 holder (gsi.cpp).
  uint32_t n = net::Registry::instance().allocate_qpn(wire::IpAddress::v4(htonl(INADDR_LOOPBACK)), sock_port_);
  if (!n) return 0;
  c.local_comm_id = (random_u32() & 0xFF000000u) | n;
  by_comm_[c.local_comm_id] = &c;
  return c.local_comm_id;
}

void Manager::release_comm_id(Connection& c) {
  if (!c.local_comm_id) return;
  by_comm_.erase(c.local_comm_id);
  net::Registry::instance().release_qpn(c.local_comm_id & 0xFFFFFF);
  c.local_comm_id = 0;
}

void Manager::send_to(const wire::IpAddress& dst_ip, uint16_t dst_port, const wire::IpAddress& src_ip,
                      const uint8_t* mad) {
  uint8_t pkt[wire::kGsiPacketLen];
  size_t n = wire::build_gsi_packet(src_ip, dst_ip, sock_port_, dst_port, random_u32(), mad, pkt);
  sockaddr_storage a{};
  const socklen_t len = wire::to_sockaddr(dst_ip, dst_port, &a);
  const int fd = dst_ip.is_v4() ? sock_ : sock6_;
  [[maybe_unused]] ssize_t r = fd >= 0 ? sendto(fd, pkt, n, 0, reinterpret_cast<sockaddr*>(&a), len) : -1;
}

void Manager::send_mad(Connection& c, const uint8_t* mad, bool request) {
  if (request) {
    std::memcpy(c.last_mad, mad, wire::kMadLen);
    c.awaiting = true;
    c.retries_left = cm_retries();
    c.deadline_ns = now_ns() + cm_timeout_ns();
  }
  wire::MadHeader h;
  wire::decode_mad_header(mad, wire::kMadLen, h);
  // The ICRC's source: the device's address, or ours where the device is another family's (::1 on lo).
  const wire::IpAddress src_ip = c.dev && c.dev->ip.is_v4() == c.peer_ip.is_v4() ? c.dev->ip : c.local_ip;
  if (c.listener_probes) return;
  if (!c.peer_local) {
    send_to(c.peer_ip, wire::kRoceUdpPort, src_ip, mad);
    return;
  }
  // A peer on this host: straight to its socket (docs/rdmacm.md), by service port or by its comm ID.
  if (h.attr_id == static_cast<uint16_t>(wire::CmAttr::Req) || h.attr_id == static_cast<uint16_t>(wire::CmAttr::SidrReq)) {
    send_to(c.peer_ip, c.service_port, src_ip, mad);
    return;
  }
  auto ep = net::Registry::instance().lookup(wire::cm_destination_comm_id(mad, h.attr_id) & 0xFFFFFF);
  if (ep) send_to(c.peer_ip, ep->port, src_ip, mad);
}

void Manager::send_rej(Connection& c, uint16_t reason, uint8_t msg, const void* pdata, uint8_t len) {
  wire::MadHeader h;
  h.tid = c.tid;
  h.attr_id = static_cast<uint16_t>(wire::CmAttr::Rej);
  wire::CmRej rej;
  rej.local_comm_id = c.local_comm_id;
  rej.remote_comm_id = c.remote_comm_id;
  rej.message_rejected = msg;
  rej.reason = reason;
  if (pdata && len) std::memcpy(rej.private_data, pdata, std::min<size_t>(len, wire::kRejPrivateLen));
  uint8_t mad[wire::kMadLen];
  wire::encode_rej(h, rej, mad);
  send_mad(c, mad, false);
}

void Manager::wire_reject(Connection& c, uint8_t msg) {
  send_rej(c, kRejWireProtection, msg, kProtectRejText, sizeof kProtectRejText);
  wire_rejects_.fetch_add(1);
  if (consumer_) consumer_->wire_rejected(c);
}

void Manager::send_simple(Connection& c, wire::CmAttr attr, uint64_t tid, uint32_t remote_qpn, bool request) {
  wire::MadHeader h;
  h.tid = tid;
  h.attr_id = static_cast<uint16_t>(attr);
  wire::CmSimple m;
  m.local_comm_id = c.local_comm_id;
  m.remote_comm_id = c.remote_comm_id;
  m.remote_qpn = remote_qpn;
  uint8_t mad[wire::kMadLen];
  wire::encode_simple(h, m, mad);
  send_mad(c, mad, request);
}

void Manager::send_dreq(Connection& c) {
  send_simple(c, wire::CmAttr::Dreq, random_tid(), c.remote_qpn, true);
  c.retries_left = std::min(c.retries_left, 3);
}

void Manager::send_rtu(Connection& c) { send_simple(c, wire::CmAttr::Rtu, c.tid, 0, false); }

void Manager::send_sidr_rep(Connection& c, uint8_t status, uint32_t qpn, const void* pdata, uint8_t len) {
  wire::MadHeader h;
  h.tid = c.tid;
  h.attr_id = static_cast<uint16_t>(wire::CmAttr::SidrRep);
  wire::CmSidrRep rep;
  rep.request_id = c.remote_comm_id;
  rep.status = status;
  rep.qpn = status == 0 ? qpn : 0;
  rep.qkey = status == 0 ? kUdpQkey : 0;
  rep.service_id = wire::ip_service_id(c.port_space, c.service_port);
  if (pdata && len) std::memcpy(rep.private_data, pdata, std::min<size_t>(len, wire::kSidrRepPrivateLen));
  wire::encode_sidr_rep(h, rep, c.last_mad);  // kept: a resent SIDR_REQ gets the same answer
  send_mad(c, c.last_mad, false);
}

int Manager::bind_port(Connection& c, const wire::IpAddress& ip, uint16_t port_be) {
  if (c.iwarp) return iw_bind(c, ip, port_be);
  return bind_socket(c, SOCK_DGRAM, ip, port_be);
}

int Manager::bind_socket(Connection& c, int type, const wire::IpAddress& ip, uint16_t port_be, bool v6_only) {
  int fd = net::os_socket(ip.family(), type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno;
  int one = 1;
  if (type == SOCK_STREAM)
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // a listener may come back at once
  // An IPv6 address's port is IPv6's alone: the IPv4 one of the same number is another id's.
  const int v6 = v6_only ? 1 : 0;
  if (!ip.is_v4()) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6, sizeof v6);
  sockaddr_storage a{};
  socklen_t l = wire::to_sockaddr(ip, ntohs(port_be), &a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), l) != 0) {
    int e = errno;
    close(fd);
    return e;
  }
  l = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
  wire::IpAddress bound;
  uint16_t port = 0;
  wire::from_sockaddr(reinterpret_cast<sockaddr*>(&a), &bound, &port);
  if (ip.is_v4()) {
    c.sock = fd;
  } else {
    c.sock6 = fd;
  }
  c.service_port = c.local_port = port;
  c.local_ip = ip;
  if (c.st == St::Idle) c.st = St::Bound;
  return 0;
}

int Manager::bind_port_v6(Connection& c, bool v6_only, uint16_t port_be) {
  if (c.iwarp) return iw_bind_any6(c, v6_only, port_be);  // one TCP socket takes both families
  if (!v6_only)
    if (int e = bind_port(c, wire::IpAddress::v4(INADDR_ANY), port_be)) return e;
  // Dual-stack: the same number in IPv6's space; the id stays IPv4's wildcard as well.
  const wire::IpAddress v4_any = c.local_ip;
  const uint16_t port6 = v6_only ? port_be : htons(c.local_port);
  if (int e = bind_socket(c, SOCK_DGRAM, wire::IpAddress{}, port6)) {
    if (c.sock >= 0) close(c.sock);
    c.sock = -1;
    c.st = St::Idle;
    return e;
  }
  if (!v6_only) c.local_ip = v4_any;
  return 0;
}

int Manager::listen(Connection& c) {
  if (c.sock < 0 && c.sock6 < 0)
    if (int e = bind_port(c, wire::IpAddress::v4(INADDR_ANY), 0)) return e;
  if (c.st != St::Bound && c.st != St::Listen) return EINVAL;
  if (c.iwarp) return iw_listen(c);  // its one TCP socket, of either family, is c.sock
  // A wildcard listener hears every device, as the kernel's: open them all, so that this host has a
  // 4791 holder to forward REQs from other hosts even when no other softrdma process runs here.
  if (!c.dev && consumer_) consumer_->device_for_ip(wire::IpAddress{});
  c.st = St::Listen;
  wake();
  return 0;
}

int Manager::resolve_addr(Connection& c, const wire::IpAddress& src, uint16_t src_port_be,
                          const wire::IpAddress& dst_ip) {
  wire::IpAddress src_ip = src;
  // A bound id resolves from its address, when that is of the destination's family.
  if (!src_ip.is_set() && c.local_ip.is_set() && c.local_ip.is_v4() == dst_ip.is_v4()) src_ip = c.local_ip;
  if (src_ip.is_set() && src_ip.is_v4() != dst_ip.is_v4()) return EAFNOSUPPORT;
  int err = 0;
  if (!src_ip.is_set()) err = route_source(dst_ip, 0, src_ip);  // what the kernel would pick for a datagram to dst
  const Device* d = err || !consumer_ ? nullptr : consumer_->device_for_ip(src_ip);
  if (!d) return err ? err : ENODEV;
  if (c.sock < 0 && c.sock6 < 0) {
    c.iwarp = d->iwarp;
    if (int e = bind_port(c, src_ip, src_port_be)) return -e;
  }
  c.dev = d;
  c.peer_ip = dst_ip;
  c.peer_local = net::is_local_ip(dst_ip);
  c.local_ip = src_ip;
  c.st = St::AddrResolved;
  return 0;
}

int Manager::resolve_route(Connection& c) {
  if (c.st != St::AddrResolved && c.st != St::RouteResolved) return EINVAL;
  c.mtu = c.dev ? c.dev->mtu : kDefaultMtu;
  c.st = St::RouteResolved;
  return 0;
}

int Manager::connect(Connection& c, uint16_t dst_port, const ConnectParams& p) {
  if (c.st != St::RouteResolved) return EINVAL;
  if (c.iwarp) return iw_connect(c, dst_port, p);
  wire::CmaIpHeader cma;
  cma.src_port = c.local_port;
  cma.src_ip = c.local_ip;
  cma.dst_ip = c.peer_ip;
  wire::MadHeader h;
  uint8_t mad[wire::kMadLen];
  if (c.ud) {
    // SIDR_REQ: asks the service for its QPN and Q_Key (IBTA 12.11.1).
    if (p.private_data_len > wire::kSidrReqPrivateLen - wire::kCmaHeaderLen) return EINVAL;
    c.tid = random_tid();
    c.service_port = dst_port;
    if (!alloc_comm_id(c)) return ENOMEM;
    wire::CmSidrReq req;
    req.request_id = c.local_comm_id;
    req.service_id = wire::ip_service_id(c.port_space, c.service_port);
    wire::encode_cma_header(cma, req.private_data);
    if (p.private_data_len)
      std::memcpy(req.private_data + wire::kCmaHeaderLen, p.private_data, p.private_data_len);
    h.tid = c.tid;
    h.attr_id = static_cast<uint16_t>(wire::CmAttr::SidrReq);
    wire::encode_sidr_req(h, req, mad);
  } else {
    const WireConfig& wc = wire_config();
    const size_t block = wc.on() ? kProtectBlockLen : 0;
    if (wc.on() && !wc.error.empty()) return EINVAL;
    if (p.private_data_len > wire::kReqPrivateLen - wire::kCmaHeaderLen - block) return EINVAL;
    uint8_t max_rd = c.dev->max_rd_atom;
    if (p.responder_resources != kMaxRdAtomic && p.responder_resources > max_rd) return EINVAL;
    if (p.initiator_depth != kMaxRdAtomic && p.initiator_depth > max_rd) return EINVAL;
    c.resp_res = std::min(p.responder_resources, max_rd);
    c.init_depth = std::min(p.initiator_depth, max_rd);
    c.retry_count = std::min<uint8_t>(p.retry_count, 7);
    c.remote_psn = random_u32() & 0xFFFFFF;  // what we expect to receive; the REP says what we send
    c.tid = random_tid();
    c.service_port = dst_port;
    if (!alloc_comm_id(c)) return ENOMEM;
    wire::CmReq req;
    req.local_comm_id = c.local_comm_id;
    req.service_id = wire::ip_service_id(c.port_space, c.service_port);
    req.local_ca_guid = c.dev->guid_be;
    req.local_qpn = p.qpn;
    req.responder_resources = c.resp_res;
    req.initiator_depth = c.init_depth;
    req.remote_cm_response_timeout = 20;
    req.local_cm_response_timeout = 20;
    req.transport_service_type = p.uc ? 1 : 0;
    req.e2e_flow_control = p.flow_control;
    req.starting_psn = c.remote_psn;
    req.retry_count = c.retry_count;
    req.pkey = 0xFFFF;
    req.path_mtu = c.mtu;
    req.rnr_retry_count = std::min<uint8_t>(p.rnr_retry_count, 7);
    req.max_cm_retries = 15;
    req.srq = p.srq;
    set_gid(req.primary.local_gid, c.local_ip);
    set_gid(req.primary.remote_gid, c.peer_ip);
    req.primary.hop_limit = 64;
    req.primary.packet_rate = 16;
    req.primary.local_ack_timeout = c.ack_timeout_opt != 0xFF ? c.ack_timeout_opt : 17;
    c.ack_timeout = req.primary.local_ack_timeout;
    wire::encode_cma_header(cma, req.private_data);
    if (block) {
      // Our X25519 share and a MAC under the operator key, before the application's private data.
      Share sh;
      if (!make_share(&sh)) return ENOMEM;
      std::memcpy(c.wire_priv, sh.priv, 32);
      std::memcpy(c.wire_pub, sh.pub, 32);
      OPENSSL_cleanse(sh.priv, sizeof sh.priv);
      c.wire_pending = true;
      c.wire_qpn = p.qpn;
      Transcript t;
      t.mode = wc.mode;
      std::memcpy(t.share_a, c.wire_pub, 32);
      t.qpn_a = p.qpn;
      t.psn_a = c.remote_psn;
      Block b;
      b.mode = wc.mode;
      std::memcpy(b.share, c.wire_pub, 32);
      req_mac(wc.key, t, b.mac);
      encode_block(b, req.private_data + wire::kCmaHeaderLen);
    }
    if (p.private_data_len)
      std::memcpy(req.private_data + wire::kCmaHeaderLen + block, p.private_data, p.private_data_len);
    h.tid = c.tid;
    h.attr_id = static_cast<uint16_t>(wire::CmAttr::Req);
    wire::encode_req(h, req, mad);
  }
  c.st = St::ReqSent;
  send_mad(c, mad, true);
  if (c.peer_local && !net::udp_port_bound(c.service_port)) {
    // Nobody on this host listens on that port yet. A server that re-listens on its port (perftest
    // does between its two connections) gets a moment, as a REQ crossing a real fabric gives it; then
    // the answer is what the 4791 holder gives a remote peer: REJ "invalid service ID".
    c.listener_probes = 20;
    c.deadline_ns = now_ns() + kProbeIntervalNs;
  }
  wake();
  return 0;
}

int Manager::accept(Connection& c, const AcceptParams& p) {
  if (c.st != St::ReqRcvd) return EINVAL;
  if (c.iwarp) return iw_accept(c, p);
  if (c.ud) {
    // SIDR_REP "valid QP" with our QPN and Q_Key. No ESTABLISHED here, as with the kernel's CM.
    if (p.private_data_len > wire::kSidrRepPrivateLen) return EINVAL;
    send_sidr_rep(c, 0, p.qpn, p.private_data, p.private_data_len);
    c.st = St::Connected;
    return 0;
  }
  const size_t block = c.wire_mode ? kProtectBlockLen : 0;
  if (p.private_data_len > wire::kRepPrivateLen - block) return EINVAL;
  Block rep_block{};
  if (block) {
    // Our share, the connection secret from both, and the MAC over the whole exchange.
    Share sh;
    Transcript t;
    t.mode = c.wire_mode;
    std::memcpy(t.share_a, c.wire_pub, 32);  // the peer's share, kept by on_req
    if (!make_share(&sh)) return ENOMEM;
    std::memcpy(t.share_b, sh.pub, 32);
    t.qpn_a = c.remote_qpn;
    t.qpn_b = p.qpn;
    t.psn_a = c.my_psn;
    t.psn_b = c.remote_psn;
    const bool ok = derive_secret(wire_config().key, sh.priv, t.share_a, t, c.wire_secret);
    OPENSSL_cleanse(sh.priv, sizeof sh.priv);
    if (!ok) return ENOMEM;
    rep_block.mode = c.wire_mode;
    std::memcpy(rep_block.share, sh.pub, 32);
    rep_mac(wire_config().key, t, rep_block.mac);
  }
  uint8_t max_rd = c.dev ? c.dev->max_rd_atom : 16;
  c.resp_res = std::min(p.responder_resources, max_rd);
  c.init_depth = std::min<uint8_t>(std::min(p.initiator_depth, max_rd), c.init_depth);
  if (consumer_ && consumer_->has_qp(c) && consumer_->ready_qp(c) != 0) {
    send_rej(c, wire::kRejNoQp, wire::kMsgReq, nullptr, 0);
    c.st = St::Failed;
    return EINVAL;
  }
  wire::CmRep rep;
  rep.local_comm_id = c.local_comm_id;
  rep.remote_comm_id = c.remote_comm_id;
  rep.local_qpn = p.qpn;
  rep.starting_psn = c.remote_psn;
  rep.responder_resources = c.resp_res;
  rep.initiator_depth = c.init_depth;
  rep.target_ack_delay = 15;
  rep.e2e_flow_control = p.flow_control;
  rep.rnr_retry_count = std::min<uint8_t>(p.rnr_retry_count, 7);
  rep.srq = p.srq;
  rep.local_ca_guid = c.dev ? c.dev->guid_be : 0;
  if (block) encode_block(rep_block, rep.private_data);
  if (p.private_data_len) std::memcpy(rep.private_data + block, p.private_data, p.private_data_len);
  wire::MadHeader h;
  h.tid = c.tid;
  h.attr_id = static_cast<uint16_t>(wire::CmAttr::Rep);
  uint8_t mad[wire::kMadLen];
  wire::encode_rep(h, rep, mad);
  c.st = St::RepSent;
  send_mad(c, mad, true);
  wake();
  return 0;
}

int Manager::reject(Connection& c, const void* pdata, uint8_t len) {
  if (c.st != St::ReqRcvd) return EINVAL;
  if (c.iwarp) return iw_reject(c, pdata, len);
  if (c.ud) {
    if (len > wire::kSidrRepPrivateLen) return EINVAL;
    send_sidr_rep(c, 2, 0, pdata, len);  // status 2: rejected by the service
  } else {
    if (len > wire::kRejPrivateLen) return EINVAL;
    send_rej(c, wire::kRejConsumerDefined, wire::kMsgReq, pdata, len);
  }
  c.st = St::Rejected;
  return 0;
}

int Manager::establish(Connection& c) {
  if (c.st != St::RepRcvd) return EINVAL;
  send_rtu(c);
  c.st = St::Connected;
  return 0;
}

void Manager::disconnect(Connection& c) {
  if (c.iwarp) return iw_disconnect(c);
  if (c.ud) {
    if (c.st == St::Connected) c.st = St::Disconnected;  // SIDR leaves no connection to tear down
    return;
  }
  if (c.st == St::Connected || c.st == St::RepSent || c.st == St::RepRcvd) {
    c.st = St::DreqSent;
    send_dreq(c);
    wake();
  }
}

void Manager::destroy(Connection& c, std::unique_lock<std::mutex>& lock) {
  if (c.iwarp) {
    iw_destroy(c);
  } else if (c.st == St::Connected && !c.ud) {
    send_dreq(c);
  } else if (c.st == St::ReqRcvd) {
    if (c.ud)
      send_sidr_rep(c, 2, 0, nullptr, 0);
    else
      send_rej(c, wire::kRejConsumerDefined, wire::kMsgReq, nullptr, 0);
  }
  release_comm_id(c);
  // Children of a destroyed listener keep working, as in the kernel.
  for (Connection* o : conns_)
    if (o->listener == &c) o->listener = nullptr;
  // An iWARP id's TCP socket is polled in every state it is open in.
  bool polled = c.st == St::Listen || c.iwarp;
  std::erase(conns_, &c);
  if (c.sock >= 0 || c.sock6 >= 0) {
    if (polled) {
      // The application may bind this port again at once (perftest -R re-listens).
      const uint64_t gen = loop_gen_;
      wake();
      loop_cv_.wait(lock, [&] { return loop_gen_ != gen; });
    }
    if (c.sock >= 0) close(c.sock);
    c.sock = -1;
  }
  if (c.sock6 >= 0) close(c.sock6);
  c.sock6 = -1;
}

void Manager::on_req(const wire::MadHeader& h, const uint8_t* mad, Connection* L) {
  wire::CmReq req;
  wire::decode_req(mad, req);
  wire::CmaIpHeader cma;
  bool have_cma = wire::decode_cma_header(req.private_data, cma);
  const wire::IpAddress peer_ip = have_cma ? cma.src_ip : gid_ip(req.primary.local_gid);
  const wire::IpAddress local_ip = have_cma ? cma.dst_ip : gid_ip(req.primary.remote_gid);
  if (!L || !consumer_) return;
  // A resent REQ: answer again with what we answered (REP), or keep waiting for the application.
  for (Connection* c : conns_) {
    if (c->listener == L && c->remote_comm_id == req.local_comm_id && c->peer_ip == peer_ip) {
      if (c->st == St::RepSent && c->awaiting) send_mad(*c, c->last_mad, false);
      return;
    }
  }
  Connection* c = consumer_->make_passive(*L);
  if (!c) return;
  c->ud = L->ud;
  c->port_space = L->port_space;
  c->listener = L;
  c->passive = true;
  c->dev = consumer_->device_for_ip(local_ip);
  if (!c->dev && L->dev) c->dev = L->dev;
  c->local_ip = local_ip;
  c->local_port = c->service_port = L->service_port;
  c->peer_ip = peer_ip;
  c->peer_port = have_cma ? cma.src_port : 0;
  c->peer_local = net::is_local_ip(peer_ip);
  c->tid = h.tid;
  c->remote_comm_id = req.local_comm_id;
  c->remote_qpn = req.local_qpn;
  // A message's starting PSN is the PSN its sender expects to receive, i.e. the one the other side
  // sends from (Linux ib_cm: the passive sq_psn is the REQ's, the REP's is its own rq_psn).
  c->my_psn = req.starting_psn;
  c->remote_psn = random_u32() & 0xFFFFFF;
  c->mtu = std::min<uint8_t>(req.path_mtu ? req.path_mtu : kDefaultMtu, c->dev ? c->dev->mtu : kDefaultMtu);
  c->retry_count = req.retry_count;
  c->rnr_retry = req.rnr_retry_count;
  c->ack_timeout = req.primary.local_ack_timeout ? req.primary.local_ack_timeout : 17;
  c->resp_res = req.initiator_depth;   // what the peer will issue
  c->init_depth = req.responder_resources;
  c->st = St::ReqRcvd;
  if (!alloc_comm_id(*c)) {
    consumer_->discard(*c);
    return;
  }
  size_t off = have_cma ? wire::kCmaHeaderLen : 0;
  if (!c->ud) {
    // Wire protection (protect.h): a REQ must carry a block exactly when we protect, with our mode
    // and version and a MAC under our operator key; anything else is refused here, before the
    // application sees it.
    const WireConfig& wc = wire_config();
    Block b;
    const bool has_block = off + kProtectBlockLen <= wire::kReqPrivateLen && parse_block(req.private_data + off, &b);
    bool ok = !has_block && !wc.on();
    if (has_block && wc.on() && wc.error.empty() && b.version == kProtectBlockVersion && b.mode == wc.mode) {
      Transcript t;
      t.mode = b.mode;
      std::memcpy(t.share_a, b.share, 32);
      t.qpn_a = req.local_qpn;
      t.psn_a = req.starting_psn;
      uint8_t mac[kProtectMacLen];
      req_mac(wc.key, t, mac);
      ok = mac_equal(mac, b.mac);
    }
    if (!ok) {
      wire_reject(*c, wire::kMsgReq);
      release_comm_id(*c);
      consumer_->discard(*c);
      return;
    }
    if (has_block) {
      c->wire_mode = b.mode;
      std::memcpy(c->wire_pub, b.share, 32);
      off += kProtectBlockLen;
    }
  }
  conns_.push_back(c);
  Event e{EventKind::ConnectRequest};
  e.private_data = req.private_data + off;
  e.private_data_len = static_cast<uint8_t>(wire::kReqPrivateLen - off);
  e.listener = L;
  e.responder_resources = req.initiator_depth;
  e.initiator_depth = req.responder_resources;
  e.flow_control = req.e2e_flow_control;
  e.retry_count = req.retry_count;
  e.rnr_retry_count = req.rnr_retry_count;
  e.srq = req.srq;
  e.qp_num = req.local_qpn;
  post(*c, e);
}

void Manager::on_sidr_req(const wire::MadHeader& h, const uint8_t* mad, Connection* L) {
  wire::CmSidrReq req;
  wire::decode_sidr_req(mad, req);
  wire::CmaIpHeader cma;
  if (!L || !consumer_ || !wire::decode_cma_header(req.private_data, cma)) return;
  for (Connection* c : conns_) {
    if (c->listener == L && c->remote_comm_id == req.request_id && c->peer_ip == cma.src_ip) {
      if (c->st == St::Connected || c->st == St::Rejected) send_mad(*c, c->last_mad, false);
      return;
    }
  }
  Connection* c = consumer_->make_passive(*L);
  if (!c) return;
  c->ud = true;
  c->port_space = L->port_space;
  c->listener = L;
  c->dev = consumer_->device_for_ip(cma.dst_ip);
  if (!c->dev && L->dev) c->dev = L->dev;
  c->local_ip = cma.dst_ip;
  c->local_port = L->service_port;
  c->peer_ip = cma.src_ip;
  c->peer_port = cma.src_port;
  c->peer_local = net::is_local_ip(cma.src_ip);
  c->tid = h.tid;
  c->remote_comm_id = req.request_id;
  c->service_port = L->service_port;
  c->st = St::ReqRcvd;
  conns_.push_back(c);
  Event e{EventKind::ConnectRequest};
  e.private_data = req.private_data + wire::kCmaHeaderLen;
  e.private_data_len = static_cast<uint8_t>(wire::kSidrReqPrivateLen - wire::kCmaHeaderLen);
  e.listener = L;
  post(*c, e);
}

void Manager::on_sidr_rep(Connection& c, const uint8_t* mad) {
  if (c.st != St::ReqSent || c.listener_probes) return;
  wire::CmSidrRep rep;
  wire::decode_sidr_rep(mad, rep);
  c.awaiting = false;
  if (rep.status != 0) {
    // Kernel rdma_cm: a SIDR_REP other than "valid QP" is UNREACHABLE with the SIDR status.
    c.st = St::Failed;
    Event e{EventKind::Unreachable};
    e.status = rep.status;
    post(c, e);
    return;
  }
  c.st = St::Connected;
  c.remote_qpn = rep.qpn;
  Event e{EventKind::Established};
  e.private_data = rep.private_data;
  e.private_data_len = wire::kSidrRepPrivateLen;
  e.qp_num = rep.qpn;
  e.qkey = rep.qkey;
  post(c, e);
}

void Manager::on_mad(const uint8_t* mad, Connection* listener) {
  wire::MadHeader h;
  if (!wire::decode_mad_header(mad, wire::kMadLen, h)) return;
  auto attr = static_cast<wire::CmAttr>(h.attr_id);
  if (attr == wire::CmAttr::Req || attr == wire::CmAttr::SidrReq) {
    if (!listener) {
      uint16_t port = wire::cm_service_id(mad, h.attr_id) & 0xFFFF;
      for (Connection* i : conns_)
        if (i->st == St::Listen && i->service_port == port) listener = i;
    }
    // A REQ names a connected port space, a SIDR_REQ a datagram one: the other kind finds no listener.
    if (listener && listener->ud != (attr == wire::CmAttr::SidrReq)) listener = nullptr;
    if (attr == wire::CmAttr::Req)
      on_req(h, mad, listener);
    else
      on_sidr_req(h, mad, listener);
    return;
  }
  auto it = by_comm_.find(wire::cm_destination_comm_id(mad, h.attr_id));
  if (it == by_comm_.end()) return;
  Connection& c = *it->second;
  switch (attr) {
    case wire::CmAttr::SidrRep:
      on_sidr_rep(c, mad);
      return;
    case wire::CmAttr::Rep: {
      wire::CmRep rep;
      wire::decode_rep(mad, rep);
      if (c.st == St::Connected) {  // our RTU was lost
        send_rtu(c);
        return;
      }
      if (c.st != St::ReqSent) return;
      c.awaiting = false;
      c.remote_comm_id = rep.local_comm_id;
      c.remote_qpn = rep.local_qpn;
      c.my_psn = rep.starting_psn;  // we send from the PSN the passive side expects
      c.init_depth = std::min(c.init_depth, rep.responder_resources);
      c.rnr_retry = rep.rnr_retry_count;
      size_t pd_off = 0;
      if (c.wire_pending) {
        // The passive side's share and its MAC over the whole exchange: the secret, or a refusal.
        const WireConfig& wc = wire_config();
        Block b;
        Transcript t;
        bool ok = parse_block(rep.private_data, &b) && b.version == kProtectBlockVersion && b.mode == wc.mode;
        if (ok) {
          t.mode = b.mode;
          std::memcpy(t.share_a, c.wire_pub, 32);
          std::memcpy(t.share_b, b.share, 32);
          t.qpn_a = c.wire_qpn;
          t.qpn_b = rep.local_qpn;
          t.psn_a = c.remote_psn;
          t.psn_b = rep.starting_psn;
          uint8_t mac[kProtectMacLen];
          rep_mac(wc.key, t, mac);
          ok = mac_equal(mac, b.mac) && derive_secret(wc.key, c.wire_priv, b.share, t, c.wire_secret);
        }
        OPENSSL_cleanse(c.wire_priv, sizeof c.wire_priv);
        c.wire_pending = false;
        if (!ok) {
          wire_reject(c, wire::kMsgRep);
          c.st = St::Rejected;
          Event rj{EventKind::Rejected};
          rj.status = kRejWireProtection;
          post(c, rj);
          return;
        }
        c.wire_mode = b.mode;
        pd_off = kProtectBlockLen;
      }
      Event e{EventKind::Established};
      if (!consumer_ || !consumer_->has_qp(c)) {
        c.st = St::RepRcvd;
        e.kind = EventKind::ConnectResponse;
      } else if (consumer_->ready_qp(c) != 0) {
        send_rej(c, wire::kRejNoQp, wire::kMsgRep, nullptr, 0);
        c.st = St::Failed;
        Event err{EventKind::ConnectError};
        err.status = -EINVAL;
        post(c, err);
        return;
      } else {
        send_rtu(c);
        c.st = St::Connected;
      }
      e.private_data = rep.private_data + pd_off;
      e.private_data_len = static_cast<uint8_t>(wire::kRepPrivateLen - pd_off);
      e.responder_resources = rep.initiator_depth;
      e.initiator_depth = rep.responder_resources;
      e.flow_control = rep.e2e_flow_control;
      e.rnr_retry_count = rep.rnr_retry_count;
      e.srq = rep.srq;
      e.qp_num = rep.local_qpn;
      post(c, e);
      return;
    }
    case wire::CmAttr::Rtu: {
      if (c.st != St::RepSent) return;
      wire::CmSimple rtu;
      wire::decode_simple(mad, h.attr_id, rtu);
      c.awaiting = false;
      c.st = St::Connected;
      Event e{EventKind::Established};
      e.private_data = rtu.private_data;
      e.private_data_len = wire::kRtuPrivateLen;
      post(c, e);
      return;
    }
    case wire::CmAttr::Rej: {
      wire::CmRej rej;
      wire::decode_rej(mad, rej);
      if ((c.st == St::Connected || c.st == St::DreqSent) && rej.reason == wire::kRejInvalidCommId) {
        // Our peer's host no longer knows the connection: its process is gone (gsi.cpp).
        c.awaiting = false;
        c.st = St::Disconnected;
        if (consumer_) consumer_->peer_ended(c, true);
        post(c, Event{EventKind::Disconnected});
        return;
      }
      if (c.st != St::ReqSent && c.st != St::RepSent && c.st != St::RepRcvd) return;
      if (rej.reason == kRejWireProtection) {  // the peer refused our protection (or its absence)
        wire_rejects_.fetch_add(1);
        consumer_->wire_rejected(c);
      }
      c.awaiting = false;
      c.st = St::Rejected;
      Event e{EventKind::Rejected};
      e.status = rej.reason;
      e.private_data = rej.private_data;
      e.private_data_len = wire::kRejPrivateLen;
      post(c, e);
      return;
    }
    case wire::CmAttr::Mra: {
      wire::CmMra mra;
      wire::decode_mra(mad, mra);
      // The peer needs more time: wait its service timeout on top of ours before resending.
      if (c.awaiting)
        c.deadline_ns = now_ns() + cm_timeout_ns() + (4096ull << std::min<uint8_t>(mra.service_timeout, 31));
      return;
    }
    case wire::CmAttr::Dreq: {
      send_simple(c, wire::CmAttr::Drep, h.tid, 0, false);
      if (c.st == St::Connected || c.st == St::DreqSent || c.st == St::RepSent) {
        c.awaiting = false;
        if (consumer_ && c.st != St::DreqSent) consumer_->peer_ended(c, false);
        c.st = St::Disconnected;
        post(c, Event{EventKind::Disconnected});
      }
      return;
    }
    case wire::CmAttr::Drep:
      if (c.st != St::DreqSent) return;
      c.awaiting = false;
      c.st = St::Disconnected;
      post(c, Event{EventKind::Disconnected});
      return;
    default:
      return;
  }
}

void Manager::receive(int fd, Connection* listener) {
  uint8_t buf[2048];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) return;
    // Senders are local peers or this host's 4791 holder, which checked the ICRC (gsi.cpp).
    if (const uint8_t* mad = wire::gsi_mad(buf, static_cast<size_t>(n))) on_mad(mad, listener);
  }
}

uint64_t Manager::now_ns() { return net::SystemClock::instance().now_ns(); }

void Manager::timers() {
  uint64_t now = now_ns();
  iw_timers(now);
  for (Connection* c : conns_) {
    if (!c->awaiting || now < c->deadline_ns) continue;
    if (c->listener_probes) {
      if (net::udp_port_bound(c->service_port)) {
        c->listener_probes = 0;
        send_mad(*c, c->last_mad, true);
      } else if (--c->listener_probes == 0) {
        c->awaiting = false;
        c->st = St::Rejected;
        if (c->ud) {
          Event e{EventKind::Unreachable};
          e.status = 1;  // SIDR_REP status 1: service ID not supported
          post(*c, e);
        } else {
          Event e{EventKind::Rejected};
          e.status = wire::kRejInvalidServiceId;
          post(*c, e);
        }
      } else {
        c->deadline_ns = now + kProbeIntervalNs;
      }
      continue;
    }
    if (c->retries_left-- > 0) {
      send_mad(*c, c->last_mad, false);
      c->deadline_ns = now + cm_timeout_ns();
      continue;
    }
    c->awaiting = false;
    switch (c->st) {
      case St::ReqSent:
      case St::RepSent: {
        c->st = St::Failed;
        Event e{EventKind::Unreachable};
        e.status = -ETIMEDOUT;
        post(*c, e);
        break;
      }
      case St::DreqSent:
        c->st = St::Disconnected;
        post(*c, Event{EventKind::Disconnected});
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
  for (Connection* c : conns_) {
    if (c->st != St::Connected || c->peer_local || c->ud || c->awaiting || c->iwarp) continue;
    if (!c->next_probe_ns) c->next_probe_ns = now + cm_probe_ns();
    if (now < c->next_probe_ns) continue;
    c->next_probe_ns = now + cm_probe_ns();
    if (c->passive) {
      send_mad(*c, c->last_mad, false);
    } else {
      send_rtu(*c);
    }
  }
  for (Connection* c : conns_) {
    if (c->st != St::Connected || c->ud || c->iwarp) continue;
    // A remote peer's host answers our probes only while a process holds its 4791 (the dead one
    // may have been the holder); the QP's peer context's kernel tells at once (reliability.md).
    if (c->peer_local ? owner_alive(c->remote_comm_id) : !(consumer_ && consumer_->peer_gone(*c))) continue;
    if (consumer_) consumer_->peer_ended(*c, true);
    c->st = St::Disconnected;
    post(*c, Event{EventKind::Disconnected});
  }
}

void Manager::loop() {
  std::vector<pollfd> fds;
  std::vector<Connection*> owners;
  std::vector<pollfd> iw_fds;  // iWARP sockets (iwarp.cpp), after the UDP ones
  std::vector<void*> iw_owners;
  std::vector<uint8_t> iw_kinds;
  for (;;) {
    int timeout_ms = 200;
    size_t n_udp = 0;
    {
      std::lock_guard lock(mu);
      fds.assign({pollfd{sock_, POLLIN, 0}, pollfd{wake_fd_, POLLIN, 0}, pollfd{sock6_, POLLIN, 0}});
      owners.assign(3, nullptr);
      iw_fds.clear();
      iw_owners.clear();
      iw_kinds.clear();
      uint64_t now = now_ns();
      for (Connection* c : conns_) {
        for (int fd : {c->sock, c->sock6}) {
          if (c->st != St::Listen || fd < 0 || c->iwarp) continue;
          fds.push_back(pollfd{fd, POLLIN, 0});
          owners.push_back(c);
        }
        if (c->awaiting) {
          int64_t ms = c->deadline_ns > now ? int64_t((c->deadline_ns - now) / 1000000) + 1 : 0;
          timeout_ms = static_cast<int>(std::min<int64_t>(timeout_ms, ms));
        }
      }
    }
    n_udp = fds.size();
    {
      std::lock_guard lock(mu);
      iw_poll_set(iw_fds, iw_owners, iw_kinds, timeout_ms);
    }
    fds.insert(fds.end(), iw_fds.begin(), iw_fds.end());
    poll(fds.data(), fds.size(), timeout_ms);
    std::lock_guard lock(mu);
    ++loop_gen_;
    loop_cv_.notify_all();
    uint64_t v;
    [[maybe_unused]] ssize_t n = read(wake_fd_, &v, sizeof v);
    receive(sock_, nullptr);
    if (sock6_ >= 0) receive(sock6_, nullptr);
    for (size_t i = n_udp; i < fds.size(); ++i)
      if (fds[i].revents) iw_dispatch(iw_owners[i - n_udp], iw_kinds[i - n_udp], fds[i].fd, fds[i].revents);
    for (size_t i = 3; i < n_udp; ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      // The endpoint may have been destroyed while we polled.
      if (std::find(conns_.begin(), conns_.end(), owners[i]) != conns_.end() &&
          (owners[i]->sock == fds[i].fd || owners[i]->sock6 == fds[i].fd))
        receive(fds[i].fd, owners[i]);
    }
    timers();
  }
}

void Manager::at_exit() {
  // A process that exits with connections up disconnects them, as the kernel does for a dying process.
  std::lock_guard lock(mu);
  if (consumer_) consumer_->before_exit();
  for (Connection* c : conns_)
    if (c->st == St::Connected && !c->ud && !c->iwarp) send_dreq(*c);
}

}  // namespace softrdma::cm
