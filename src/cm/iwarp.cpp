// rdma_cm on iWARP devices (cm.h, docs/iwarp.md): the rdma_cm port is a TCP port; connect and
// accept are TCP connect/accept plus the MPA request/reply exchange (RFC 5044 §7.1 with RFC 6581's
// enhanced connection setup, peer-to-peer), after which the consumer hands the QP the socket. The CM
// keeps its own descriptor of the socket and polls it for the peer's close only (DISCONNECTED).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "cm/cm.h"
#include "config/config.h"
#include "net/interfaces.h"  // is_local_ip, scope_of
#include "net/tuple_table.h"

namespace softrdma::cm {
namespace wi = wire::iwarp;
namespace {

uint64_t env_ms(uint64_t dflt_ms) { return config::parse().mpa_timeout_ms.value_or(dflt_ms) * 1000000ull; }
// RFC 5044 leaves the MPA timers to the implementation; these are siw's: the initiator waits 10 s
// for the reply, the responder 5 s for the request. SOFTRDMA_MPA_TIMEOUT_MS sets both (tests).
uint64_t reply_timeout_ns() { return env_ms(10000); }
uint64_t request_timeout_ns() { return env_ms(5000); }
bool want_crc() { return config::parse().mpa_crc; }
// The table's one definition, which the engine's contexts follow too (off under SOFTRDMA_IMPAIR).
bool direct_enabled() { return config::parse().direct; }

constexpr size_t kMaxPendingAccepts = 1024;  // TCP connections whose MPA request is still awaited
constexpr uint8_t kKindConn = 1, kKindAccept = 2;
constexpr uint8_t kRefusedRetries = 20;              // a refused connect: 20 more tries,
constexpr uint64_t kRefusedRetryNs = 50'000'000;     // 50 ms apart (about a second in all)

// Reads the rest of one MPA frame into rx, never past its end: what follows belongs to the QP.
// 1: complete; 0: more to come; -1: EOF or error; -2: not an MPA frame (key, length).
int read_frame(int fd, uint8_t* rx, size_t& have) {
  for (;;) {
    size_t want = wi::kMpaHeaderLen;
    if (have >= wi::kMpaHeaderLen) {
      want = wi::mpa_frame_len(rx);
      if (!want) return -2;
    }
    if (have == want) return 1;
    ssize_t n = recv(fd, rx + have, want - have, MSG_DONTWAIT);
    if (n == 0) return -1;
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
    have += static_cast<size_t>(n);
  }
}

uint8_t clamp_u8(size_t v) { return static_cast<uint8_t>(std::min<size_t>(v, 255)); }

void close_fd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// A socket's address of either family as getsockname or getpeername gives it (an IPv4 peer of a
// dual-stack listener comes out as its IPv4 address); false when the call fails.
bool sock_address(int fd, bool peer, wire::IpAddress& ip, uint16_t& port_host) {
  sockaddr_storage a{};
  socklen_t l = sizeof a;
  auto* sa = reinterpret_cast<sockaddr*>(&a);
  if ((peer ? getpeername(fd, sa, &l) : getsockname(fd, sa, &l)) != 0) return false;
  return wire::from_sockaddr(sa, &ip, &port_host);
}

// The connection's tuple (cm.h, IwarpState) from its socket.
bool read_tuple(int fd, IwarpState& w) {
  wire::IpAddress l, r;
  uint16_t lp = 0, rp = 0;
  if (!sock_address(fd, false, l, lp) || !sock_address(fd, true, r, rp)) return false;
  w.tuple_local_ip = l.key();
  w.tuple_local_port = htons(lp);
  w.tuple_remote_ip = r.key();
  w.tuple_remote_port = htons(rp);
  return true;
}

}  // namespace

int Manager::iw_bind(Connection& c, const wire::IpAddress& ip, uint16_t port_be) {
  if (int rc = bind_socket(c, SOCK_STREAM, ip, port_be)) return rc;
  // An iWARP id has one TCP socket, whichever its family: c.sock.
  if (c.sock < 0) std::swap(c.sock, c.sock6);
  if (!c.iw) c.iw = std::make_unique<IwarpState>();
  return 0;
}

int Manager::iw_bind_any6(Connection& c, bool v6_only, uint16_t port_be) {
  // Not v6_only: IPv4 connections arrive on it too, as IPv4-mapped addresses (the kernel's dual stack).
  if (int rc = bind_socket(c, SOCK_STREAM, wire::IpAddress{}, port_be, v6_only)) return rc;
  std::swap(c.sock, c.sock6);  // an iWARP id's one TCP socket is c.sock
  // As a RoCE id on "::": IPv4's wildcard as well, unless v6_only.
  if (!v6_only) c.local_ip = wire::IpAddress::v4(INADDR_ANY);
  if (!c.iw) c.iw = std::make_unique<IwarpState>();
  return 0;
}

int Manager::iw_listen(Connection& c) {
  if (c.ud) return ENOSYS;  // iWARP has no datagram service
  if (::listen(c.sock, 128) != 0) return errno;
  c.st = St::Listen;
  wake();
  return 0;
}

void Manager::iw_publish(Connection& c) {
  IwarpState& w = *c.iw;
  if (!read_tuple(c.sock, w)) return;
  if (!direct_enabled() || !w.qpn || w.published) return;
  try {
    net::TcpTuple t{w.tuple_local_ip, w.tuple_remote_ip, w.tuple_local_port, w.tuple_remote_port};
    w.published = net::TupleTable::instance().publish(t, w.qpn);
  } catch (...) {
    // No shared memory: the connection runs over TCP FPDUs.
  }
}

void Manager::iw_unpublish(Connection& c) {
  if (!c.iw || !c.iw->published) return;
  IwarpState& w = *c.iw;
  try {
    net::TupleTable::instance().remove({w.tuple_local_ip, w.tuple_remote_ip, w.tuple_local_port, w.tuple_remote_port});
  } catch (...) {
  }
  w.published = false;
}

uint32_t Manager::iw_lookup_peer(Connection& c) {
  IwarpState& w = *c.iw;
  if (!direct_enabled() || !w.qpn || !w.tuple_remote_port) return 0;
  try {
    net::TcpTuple mine{w.tuple_local_ip, w.tuple_remote_ip, w.tuple_local_port, w.tuple_remote_port};
    if (auto q = net::TupleTable::instance().lookup(mine.reversed())) {
      iw_stats_.direct_hits++;
      return *q;
    }
  } catch (...) {
  }
  return 0;
}

void Manager::iw_fail(Connection& c, EventKind kind, int status, bool with_pdata) {
  IwarpState& w = *c.iw;
  iw_unpublish(c);
  w.step = IwStep::Closed;
  c.st = kind == EventKind::Rejected ? St::Rejected : St::Failed;
  Event e{kind};
  e.status = status;
  if (with_pdata) {
    e.private_data = w.peer.private_data;
    e.private_data_len = clamp_u8(w.peer.private_data_len);
  }
  close_fd(c.sock);
  post(c, e);
}

bool Manager::iw_flush(Connection& c) {
  IwarpState& w = *c.iw;
  while (w.tx_off < w.tx_len) {
    ssize_t n = send(c.sock, w.tx + w.tx_off, w.tx_len - w.tx_off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    w.tx_off += static_cast<size_t>(n);
  }
  return true;
}

int Manager::iw_connect(Connection& c, uint16_t dst_port, const ConnectParams& p) {
  if (c.ud) return ENOSYS;  // as the kernel: no UD on iWARP
  if (!c.iw || c.sock < 0) return EINVAL;
  if (p.private_data_len > kIwarpMaxPrivateData) return EINVAL;
  const uint16_t max_ird = c.dev ? c.dev->max_ird : 16, max_ord = c.dev ? c.dev->max_ord : 16;
  if (p.responder_resources != kMaxRdAtomic && p.responder_resources > max_ird) return EINVAL;
  if (p.initiator_depth != kMaxRdAtomic && p.initiator_depth > max_ord) return EINVAL;
  IwarpState& w = *c.iw;
  w.qpn = consumer_ ? consumer_->qp_num(c) : 0;
  if (!w.qpn) w.qpn = p.qpn;
  w.ird = p.responder_resources == kMaxRdAtomic ? max_ird : p.responder_resources;
  w.ord = p.initiator_depth == kMaxRdAtomic ? max_ord : p.initiator_depth;
  if (w.ord == 0) w.ord = 1;  // peer-to-peer: a READ RTR needs one outstanding READ (siw does the same)
  w.crc = want_crc();
  wi::MpaFrame f;
  f.reply = false;
  f.crc = w.crc;
  f.markers = false;  // we never ask for markers
  f.revision = 2;
  f.enhanced = true;
  f.peer_to_peer = true;
  f.rtr_write = true;
  f.rtr_read = true;
  f.ird = w.ird;
  f.ord = w.ord;
  f.private_data = static_cast<const uint8_t*>(p.private_data);
  f.private_data_len = p.private_data_len;
  w.tx_len = wi::encode_mpa(f, w.tx);
  w.tx_off = 0;
  c.service_port = dst_port;
  c.st = St::ReqSent;
  // A server that re-listens on its port between two connections (perftest, and qperf, which names
  // its port before it listens) refuses a connect that comes too soon: as our RoCE CM holds a REQ
  // back for a moment (manager.cpp, listener_probes), a refused connect is tried again for a second.
  w.refused_retries = kRefusedRetries;
  iw_start_connect(c);
  return 0;
}

void Manager::iw_start_connect(Connection& c) {
  IwarpState& w = *c.iw;
  w.step = IwStep::Connecting;
  sockaddr_storage a{};
  // A link-local peer is reached over the link of our address.
  const socklen_t len = wire::to_sockaddr(c.peer_ip, c.service_port, &a, net::scope_of(c.local_ip));
  if (::connect(c.sock, reinterpret_cast<sockaddr*>(&a), len) != 0 && errno != EINPROGRESS) {
    // Refused at once (loopback answers a SYN to a closed port before connect returns).
    int e = errno;
    if (e == ECONNREFUSED && iw_retry_refused(c)) return;
    iw_stats_.tcp_refused++;
    iw_fail(c, e == ECONNREFUSED ? EventKind::Rejected : EventKind::Unreachable, -e);
    return;
  }
  wake();
}

bool Manager::iw_retry_refused(Connection& c) {
  IwarpState& w = *c.iw;
  if (w.refused_retries == 0) return false;
  w.refused_retries--;
  // A socket whose connect failed cannot connect again: a new one, on the same address and port.
  const uint16_t service = c.service_port, port = c.local_port;
  const wire::IpAddress ip = c.local_ip;
  close_fd(c.sock);
  if (iw_bind(c, ip, htons(port)) != 0) return false;
  c.service_port = service;
  w.step = IwStep::Refused;
  w.deadline_ns = now_ns() + kRefusedRetryNs;
  iw_stats_.tcp_refused_retries++;
  wake();
  return true;
}

void Manager::iw_on_active(Connection& c, short revents) {
  IwarpState& w = *c.iw;
  if (w.step == IwStep::Connecting) {
    int err = 0;
    socklen_t l = sizeof err;
    getsockopt(c.sock, SOL_SOCKET, SO_ERROR, &err, &l);
    if (err) {
      if (err == ECONNREFUSED && iw_retry_refused(c)) return;
      // librdmacm over the kernel's iw_cm: a refused TCP connect is REJECTED (-ECONNREFUSED), one
      // that timed out UNREACHABLE (-ETIMEDOUT), anything else CONNECT_ERROR.
      iw_stats_.tcp_refused++;
      EventKind k = err == ECONNREFUSED ? EventKind::Rejected
                    : err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH ? EventKind::Unreachable
                                                                                  : EventKind::ConnectError;
      iw_fail(c, k, k == EventKind::Unreachable ? -ETIMEDOUT : -err);
      return;
    }
    if (!(revents & POLLOUT)) return;
    set_nodelay(c.sock);
    iw_publish(c);  // before our MPA frame leaves: the peer looks us up once it has it
    w.step = IwStep::AwaitReply;
    w.deadline_ns = now_ns() + reply_timeout_ns();
    iw_stats_.mpa_requests_sent++;
  }
  if (w.step != IwStep::AwaitReply) return;
  if (!iw_flush(c)) {
    iw_fail(c, EventKind::Rejected, -ECONNRESET);
    return;
  }
  int r = read_frame(c.sock, w.rx, w.rx_len);
  if (r == 0) return;
  if (r == -1) {
    // The responder closed or reset the connection without a reply (siw: -ECONNRESET, REJECTED).
    iw_fail(c, EventKind::Rejected, -ECONNRESET);
    return;
  }
  if (r == -2) {
    iw_stats_.mpa_bad_frames++;
    iw_fail(c, EventKind::ConnectError, -EPROTO);
    return;
  }
  iw_on_reply(c);
}

void Manager::iw_on_reply(Connection& c) {
  IwarpState& w = *c.iw;
  wi::MpaFrame& f = w.peer;
  if (!wi::parse_mpa(w.rx, w.rx_len, true, f) || f.revision > 2) {
    iw_stats_.mpa_bad_frames++;
    iw_fail(c, EventKind::ConnectError, -EPROTO);
    return;
  }
  if (f.reject) {
    // The kernel's iw_cm reports siw's "MPA reject" as REJECTED with -ECONNRESET and the private data.
    iw_stats_.mpa_rejects_rcvd++;
    iw_fail(c, EventKind::Rejected, -ECONNRESET, true);
    return;
  }
  if (f.revision != 2 || !f.enhanced) {
    // RFC 6581: a responder to an enhanced request replies revision 2, enhanced.
    iw_stats_.mpa_bad_frames++;
    iw_fail(c, EventKind::ConnectError, -EPROTO);
    return;
  }
  w.crc = w.crc || f.crc;      // RFC 5044: CRC in both directions if either side asks
  w.markers_tx = f.markers;    // the responder wants markers in what it receives
  if (f.peer_to_peer) {
    w.rtr = f.rtr_write ? IwRtr::SendWrite : f.rtr_read ? IwRtr::SendRead : IwRtr::None;
    if (w.rtr == IwRtr::None) {  // no RTR we offered (siw: Terminate, "no matching RTR")
      iw_stats_.mpa_bad_frames++;
      iw_fail(c, EventKind::ConnectError, -EPROTO);
      return;
    }
  }
  if (f.ord > w.ird) {
    // The responder would have more READs outstanding at us than we take (RFC 6581 "insufficient
    // IRD"; siw answers the same with a Terminate and -ENOMEM).
    iw_fail(c, EventKind::ConnectError, -ENOMEM);
    return;
  }
  w.ord = std::min<uint16_t>(w.ord, f.ird);
  w.ird = std::min<uint16_t>(w.ird, f.ord);
  if (w.rtr == IwRtr::SendRead && w.ord == 0) {
    iw_fail(c, EventKind::ConnectError, -ENOMEM);
    return;
  }
  w.peer_qpn = iw_lookup_peer(c);
  if (consumer_ && consumer_->has_qp(c)) {
    IwarpConn ic{c.sock, w.crc, false, w.markers_tx, w.rtr, false, w.ird, w.ord, w.peer_qpn};
    ic.rtr_hold = w.rtr != IwRtr::None;
    if (int rc = consumer_->attach_iwarp(c, ic)) {
      iw_fail(c, EventKind::ConnectError, -rc);
      return;
    }
  }
  w.step = IwStep::Established;
  c.st = St::Connected;
  Event e{EventKind::Established};
  e.private_data = f.private_data;
  e.private_data_len = clamp_u8(f.private_data_len);
  // As the kernel's cma_iw_handler: the negotiated IRD as initiator_depth, ORD as responder_resources.
  e.initiator_depth = clamp_u8(w.ird);
  e.responder_resources = clamp_u8(w.ord);
  post(c, e);
}

void Manager::iw_on_listener(Connection& L) {
  for (;;) {
    int fd = accept4(L.sock, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    if (iw_accepts_.size() >= kMaxPendingAccepts) {
      iw_stats_.mpa_timeouts++;  // dropped unheard: counted as a request that never came
      close(fd);
      continue;
    }
    auto a = std::make_unique<IwAccept>();
    a->fd = fd;
    a->listener = &L;
    a->deadline_ns = now_ns() + request_timeout_ns();
    iw_accepts_.push_back(std::move(a));
  }
}

void Manager::iw_on_accepted(IwAccept& a, short /*revents*/) {
  auto drop = [&](bool bad) {
    if (bad) iw_stats_.mpa_bad_frames++;
    close_fd(a.fd);
    std::erase_if(iw_accepts_, [&](const std::unique_ptr<IwAccept>& p) { return p.get() == &a; });
  };
  int r = read_frame(a.fd, a.rx, a.rx_len);
  if (r == 0) return;
  if (r < 0) return drop(r == -2);
  wi::MpaFrame f;
  if (!wi::parse_mpa(a.rx, a.rx_len, false, f) || f.reply || f.reject || f.revision < 1 || f.revision > 2)
    return drop(true);
  // The initiator sends nothing after its request until our reply (RFC 5044 §7.1.4); siw refuses
  // such a request too.
  uint8_t extra;
  if (recv(a.fd, &extra, 1, MSG_PEEK | MSG_DONTWAIT) > 0) return drop(true);
  iw_stats_.mpa_requests_rcvd++;
  Connection* L = a.listener;
  if (!L || !consumer_) return drop(false);
  Connection* c = consumer_->make_passive(*L);
  if (!c) return drop(false);
  c->iwarp = true;
  c->iw = std::make_unique<IwarpState>();
  IwarpState& w = *c->iw;
  std::memcpy(w.rx, a.rx, a.rx_len);
  w.rx_len = a.rx_len;
  w.peer = f;
  if (f.private_data) w.peer.private_data = w.rx + (f.private_data - a.rx);
  c->sock = a.fd;
  a.fd = -1;
  std::erase_if(iw_accepts_, [&](const std::unique_ptr<IwAccept>& p) { return p.get() == &a; });
  wire::IpAddress local_ip, peer_ip;
  uint16_t local_port = 0, peer_port = 0;
  sock_address(c->sock, false, local_ip, local_port);
  sock_address(c->sock, true, peer_ip, peer_port);
  read_tuple(c->sock, w);
  set_nodelay(c->sock);
  c->port_space = L->port_space;
  c->listener = L;
  c->passive = true;
  c->dev = consumer_->device_for_ip(local_ip);
  if (!c->dev) c->dev = L->dev;
  c->local_ip = local_ip;
  c->local_port = c->service_port = L->service_port;
  c->peer_ip = peer_ip;
  c->peer_port = peer_port;
  c->peer_local = net::is_local_ip(c->peer_ip);
  c->st = St::ReqRcvd;
  w.step = IwStep::ReqRcvd;
  const uint16_t max_ird = c->dev ? c->dev->max_ird : 16, max_ord = c->dev ? c->dev->max_ord : 16;
  // What the application accepts with by default: as many READs as the peer issues (its ORD) and
  // as it takes (its IRD), within our device (siw, then rdma_accept with RDMA_MAX_*).
  w.ird = f.enhanced ? std::min(f.ord, max_ird) : max_ird;
  w.ord = f.enhanced ? std::min(f.ird, max_ord) : max_ord;
  conns_.push_back(c);
  Event e{EventKind::ConnectRequest};
  e.private_data = w.peer.private_data;
  e.private_data_len = clamp_u8(w.peer.private_data_len);
  e.listener = L;
  e.initiator_depth = clamp_u8(w.ord);  // READs we may issue: the peer's IRD
  e.responder_resources = clamp_u8(w.ird);  // READs the peer issues: its ORD
  post(*c, e);
}

int Manager::iw_accept(Connection& c, const AcceptParams& p) {
  if (c.st != St::ReqRcvd || !c.iw || c.iw->step != IwStep::ReqRcvd || c.sock < 0) return EINVAL;
  if (p.private_data_len > kIwarpMaxPrivateData) return EINVAL;
  IwarpState& w = *c.iw;
  const wi::MpaFrame& q = w.peer;
  const uint16_t max_ird = c.dev ? c.dev->max_ird : 16, max_ord = c.dev ? c.dev->max_ord : 16;
  if (p.responder_resources != kMaxRdAtomic && p.responder_resources > max_ird) return EINVAL;
  if (p.initiator_depth != kMaxRdAtomic && p.initiator_depth > max_ord) return EINVAL;
  uint16_t ird = p.responder_resources == kMaxRdAtomic ? w.ird : p.responder_resources;
  uint16_t ord = p.initiator_depth == kMaxRdAtomic ? w.ord : p.initiator_depth;
  wi::MpaFrame f;
  f.reply = true;
  f.revision = q.revision;
  f.enhanced = q.enhanced;
  if (q.enhanced) {
    // RFC 6581: our ORD within the initiator's IRD, our IRD no more than the initiator's ORD needs.
    ord = std::min(ord, q.ird);
    ird = std::min(ird, q.ord);
    if (q.peer_to_peer) {
      // The first FPDU we wait for: a zero-length WRITE if offered, else READ, else SEND; a WRITE
      // when nothing is offered (siw proposes the same).
      f.peer_to_peer = true;
      if (q.rtr_write || (!q.rtr_read && !q.rtr_send))
        f.rtr_write = true;
      else if (q.rtr_read)
        f.rtr_read = true;
      else
        f.rtr_send = true;
      if (f.rtr_read) ird = std::max<uint16_t>(ird, 1);
    }
    f.ird = ird;
    f.ord = ord;
  }
  // The responder sends nothing before the initiator's first FPDU: the RTR we chose with
  // peer-to-peer, the ULP's first message without (RFC 5044 §7.1.2; siw fails a connection on bytes
  // after the reply).
  w.rtr = !f.peer_to_peer ? IwRtr::Await
          : f.rtr_write   ? IwRtr::AwaitWrite
          : f.rtr_read    ? IwRtr::AwaitRead
                          : IwRtr::AwaitSend;
  w.ird = ird;
  w.ord = ord;
  w.crc = q.crc || want_crc();
  w.markers_tx = q.markers;
  f.crc = w.crc;
  f.markers = false;
  f.private_data = static_cast<const uint8_t*>(p.private_data);
  f.private_data_len = p.private_data_len;
  w.qpn = consumer_ ? consumer_->qp_num(c) : 0;
  if (!w.qpn) w.qpn = p.qpn;
  iw_publish(c);  // before our reply leaves: the initiator looks us up once it has it
  w.peer_qpn = iw_lookup_peer(c);
  if (consumer_ && consumer_->has_qp(c)) {
    IwarpConn ic{c.sock, w.crc, false, w.markers_tx, w.rtr, !w.peer.peer_to_peer, w.ird, w.ord, w.peer_qpn};
    if (int rc = consumer_->attach_iwarp(c, ic)) {
      iw_reject(c, nullptr, 0);
      c.st = St::Failed;
      return rc;
    }
  }
  w.tx_len = wi::encode_mpa(f, w.tx);
  w.tx_off = 0;
  if (!iw_flush(c)) {
    iw_unpublish(c);
    w.step = IwStep::Closed;
    c.st = St::Failed;
    return ECONNRESET;
  }
  w.step = IwStep::Established;
  c.st = St::Connected;
  Event e{EventKind::Established};
  e.initiator_depth = clamp_u8(w.ird);
  e.responder_resources = clamp_u8(w.ord);
  post(c, e);
  wake();
  return 0;
}

int Manager::iw_reject(Connection& c, const void* pdata, uint8_t len) {
  if (c.st != St::ReqRcvd || !c.iw || c.iw->step != IwStep::ReqRcvd) return EINVAL;
  if (len > kIwarpMaxPrivateData) return EINVAL;
  IwarpState& w = *c.iw;
  wi::MpaFrame f;
  f.reply = true;
  f.reject = true;
  f.revision = w.peer.revision;
  f.enhanced = w.peer.enhanced;  // IRD/ORD 0
  f.private_data = static_cast<const uint8_t*>(pdata);
  f.private_data_len = len;
  w.tx_len = wi::encode_mpa(f, w.tx);
  w.tx_off = 0;
  iw_flush(c);
  iw_stats_.mpa_rejects_sent++;
  // All of the request was read, so the close sends FIN after the reply, not RST.
  close_fd(c.sock);
  w.step = IwStep::Closed;
  c.st = St::Rejected;
  return 0;
}

void Manager::iw_disconnect(Connection& c) {
  if (!c.iw || c.sock < 0) return;
  IwStep s = c.iw->step;
  if (s == IwStep::Established || s == IwStep::Connecting || s == IwStep::Refused ||
      s == IwStep::AwaitReply) {
    // The socket is shared with the QP's descriptor: both ends see the close, the CM thread raises
    // DISCONNECTED here (POLLHUP) and the peer's at its end (POLLRDHUP).
    shutdown(c.sock, SHUT_RDWR);
    if (s != IwStep::Established) iw_fail(c, EventKind::ConnectError, -ECONNABORTED);
    wake();
  }
}

void Manager::iw_destroy(Connection& c) {
  for (auto& a : iw_accepts_)
    if (a->listener == &c) close_fd(a->fd);
  std::erase_if(iw_accepts_, [](const std::unique_ptr<IwAccept>& a) { return a->fd < 0; });
  if (!c.iw) return;
  if (c.iw->step == IwStep::ReqRcvd) {
    iw_reject(c, nullptr, 0);
  } else if (c.sock >= 0 && c.iw->step != IwStep::Closed && c.st != St::Listen) {
    shutdown(c.sock, SHUT_RDWR);  // the peer sees the close even while the QP keeps its descriptor
  }
  iw_unpublish(c);
  c.iw->step = IwStep::Closed;
}

void Manager::iw_poll_set(std::vector<pollfd>& fds, std::vector<void*>& owners, std::vector<uint8_t>& kinds,
                          int& timeout_ms) {
  const uint64_t now = now_ns();
  auto until = [&](uint64_t deadline) {
    int64_t ms = deadline > now ? int64_t((deadline - now) / 1000000) + 1 : 0;
    timeout_ms = static_cast<int>(std::min<int64_t>(timeout_ms, ms));
  };
  for (Connection* c : conns_) {
    if (!c->iwarp || !c->iw || c->sock < 0) continue;
    const IwarpState& w = *c->iw;
    short ev = 0;
    if (c->st == St::Listen) {
      ev = POLLIN;
    } else if (w.step == IwStep::Connecting) {
      ev = POLLOUT;
    } else if (w.step == IwStep::Refused) {
      until(w.deadline_ns);
    } else if (w.step == IwStep::AwaitReply) {
      ev = POLLIN | (w.tx_off < w.tx_len ? POLLOUT : 0);
      until(w.deadline_ns);
    } else if (w.step == IwStep::Established && !w.hup_posted) {
      ev = POLLRDHUP | (w.tx_off < w.tx_len ? POLLOUT : 0);
    }
    if (!ev) continue;
    fds.push_back(pollfd{c->sock, ev, 0});
    owners.push_back(c);
    kinds.push_back(kKindConn);
  }
  for (auto& a : iw_accepts_) {
    fds.push_back(pollfd{a->fd, POLLIN, 0});
    owners.push_back(a.get());
    kinds.push_back(kKindAccept);
    until(a->deadline_ns);
  }
}

void Manager::iw_dispatch(void* owner, uint8_t kind, int fd, short revents) {
  if (kind == kKindAccept) {
    for (auto& a : iw_accepts_)
      if (a.get() == owner && a->fd == fd) return iw_on_accepted(*a, revents);
    return;
  }
  auto* c = static_cast<Connection*>(owner);
  if (std::find(conns_.begin(), conns_.end(), c) == conns_.end() || c->sock != fd || !c->iw) return;
  IwarpState& w = *c->iw;
  if (c->st == St::Listen) return iw_on_listener(*c);
  if (w.step == IwStep::Connecting || w.step == IwStep::AwaitReply) return iw_on_active(*c, revents);
  if (w.step != IwStep::Established) return;
  if (w.tx_off < w.tx_len) iw_flush(*c);
  if ((revents & (POLLRDHUP | POLLHUP | POLLERR)) && !w.hup_posted) {
    // The peer closed (or we shut the socket down in rdma_disconnect): DISCONNECTED, once.
    w.hup_posted = true;
    iw_unpublish(*c);
    c->st = St::Disconnected;
    post(*c, Event{EventKind::Disconnected});
  }
}

void Manager::iw_timers(uint64_t now) {
  for (auto& a : iw_accepts_) {
    if (now < a->deadline_ns) continue;
    iw_stats_.mpa_timeouts++;  // a TCP connection that never sent a whole MPA request
    close_fd(a->fd);
  }
  std::erase_if(iw_accepts_, [](const std::unique_ptr<IwAccept>& a) { return a->fd < 0; });
  for (Connection* c : conns_) {
    if (!c->iwarp || !c->iw || now < c->iw->deadline_ns) continue;
    if (c->iw->step == IwStep::Refused) {
      iw_start_connect(*c);
      continue;
    }
    if (c->iw->step != IwStep::AwaitReply) continue;
    iw_stats_.mpa_timeouts++;
    iw_fail(*c, EventKind::Unreachable, -ETIMEDOUT);  // siw: no reply in time is -ETIMEDOUT
  }
}

}  // namespace softrdma::cm
