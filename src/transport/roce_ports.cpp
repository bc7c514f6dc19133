// The context's RoCEv2 ports (roce_ports.h): receiving with the port's checks, forwarding what
// arrives at 4791 for another local process, sending a QP's packets, and the multicast groups' sockets.
#include "transport/roce_ports.h"

#include "net/liveness.h"
#include "net/os_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>

#include "core/limits.h"
#include "net/registry.h"
#include "net/udp_port.h"
#include "transport/engine.h"
#include "wire/cm_mad.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace softrdma::transport {

namespace {
// A packet the 4791 holder hands to another local process carries, after its ICRC, the original
// source and the IPv4 identification the holder found it was sent with: the address (16 bytes, IPv4
// mapped), UDP port (2, big-endian), identification (2, big-endian; 0 over IPv6), flags (1), then this
// magic (4). The receiver checks the ICRC again with them, at full strength: the hop is no way around
// the check.
constexpr uint32_t kForwardTrailerLen = 25;
constexpr uint8_t kForwardMagic[4] = {'S', 'R', 'F', '2'};
constexpr uint32_t kMaxDatagram = 8192;  // far above MTU 4096 plus every header
// Sharing 4791 (net/port_share.h). A stand-by looks at the socket every 25 ms, so datagrams wait at
// most about 50 ms for a stopped reader (kernel rxe's shortest usual timeout, 14, is 67 ms; it
// resends anyway); a stand-in reads 2 s before it looks again whether it is still needed. A taker
// collects an offer's answer in steps 5 ms apart, 20 at most, then tries again a second later.
constexpr auto kStandbyLook = std::chrono::milliseconds(25);
constexpr uint64_t kStandInNs = 2'000'000'000;
constexpr uint64_t kTakeStepNs = 5'000'000;
constexpr unsigned kTakeSteps = 20;
// Packet capture's notes on protected packets, which it shows unsealed.
constexpr char kProtectedNote[] =
    "softrdma protected wire: sent sealed (authenticated or encrypted); shown before sealing, with the ICRC of "
    "the plain packet";
constexpr char kOpenedNote[] =
    "softrdma protected wire: received sealed (authenticated or encrypted); shown after opening, with the ICRC "
    "of the plain packet";
}  // namespace

RocePorts::RocePorts(Engine& e, OpenPort open_port, AdoptPort adopt_port, bool take_roce_port,
                     const std::string& capture)
    : PathServices(e), capture_(net::Capture::open(capture)), open_port_(std::move(open_port)),
      take_roce_port_(take_roce_port), adopt_port_(std::move(adopt_port)) {
  port_ = open_port_(iface().ip, 0);
  if (port_->fd() >= 0) watch(port_->fd(), EPOLLIN);
  if (liveness_fd() >= 0) watch(liveness_fd(), EPOLLIN);
}

RocePorts::~RocePorts() {
  stop_watching();
  for (McastGroup& g : mcast_) close(g.fd);
}

void RocePorts::stop_watching() {
  if (!roce_watch_.joinable()) return;
  {
    std::lock_guard lock(roce_watch_mu_);
    roce_watch_stop_ = true;
  }
  roce_watch_cv_.notify_all();
  roce_watch_.join();
}

bool RocePorts::receive(bool app_pass) {
  bool did = false;
  receive_from(*port_, did);
  const uint64_t t = now();
  try_take_roce_port(t);
  if (roce_port_) read_roce_port(app_pass, did, t);
  if (!mcast_.empty()) mcast_receive(did);
  // Peers asking whether this process exists (liveness.h): their kernel already has its answer, so
  // the connections and probe bytes are only drained, every 64th pass (a system call saved on most).
  if ((++liveness_skips_ & 63) == 0) {
    serve_liveness();
    if (roce_share_) roce_share_->serve();  // processes waiting for 4791's socket (port_share.h)
  }
  return did;
}

void RocePorts::serve_liveness() {
  net::Liveness* l = port_->liveness();
  if (!l) return;
  // A QP answers "receiving" only to its own peer's address: nobody else learns which QPNs exist.
  l->serve([this](uint32_t qpn, const wire::IpAddress& asker_ip) {
    const Qp* qp = find_qp(qpn);
    if (!qp || qp->dest_ip != asker_ip) return false;
    const QpState st = qp->state.load(std::memory_order_relaxed);
    return st == QpState::Rtr || st == QpState::Rts || st == QpState::Sqd;
  });
}

int RocePorts::liveness_fd() {
  net::Liveness* l = port_->liveness();
  return l ? l->fd() : -1;
}

void RocePorts::flush() {
  port_->flush();
  if (roce_port_) roce_port_->flush();
}

void RocePorts::try_take_roce_port(uint64_t now) {
  // One process of the host reads UDP 4791 for an address and forwards what is not its own. The
  // first binds it; the others of its user take the same socket from it and stand by (net/port_share.h).
  // Another user's process tries to bind it once a second, and takes over when it is free.
  if (!take_roce_port_ || roce_port_ || now < next_roce_try_ns_) return;
  next_roce_try_ns_ = now + 1000000000ull;
  if (!roce_taker_) {
    try {
      roce_port_ = open_port_(iface().ip, wire::kRoceUdpPort);
    } catch (const std::system_error&) {
      // held by another process: our peers reach us through it, and we take its socket
    }
    if (roce_port_) {
      hold_roce_port(true);
      return;
    }
  }
  take_shared_roce_port(now);
}

void RocePorts::take_shared_roce_port(uint64_t now) {
  if (!adopt_port_) return;
  if (!roce_taker_) roce_taker_ = std::make_unique<net::PortShare::Taker>(iface().ip, wire::kRoceUdpPort);
  const int fd = roce_taker_->step();
  if (fd < 0) {
    // An offer answers when its process runs: a few more looks shortly, then a new try in a second.
    if (roce_taker_->waiting() && roce_taker_->steps() < kTakeSteps)
      next_roce_try_ns_ = now + kTakeStepNs;
    else
      roce_taker_.reset();
    return;
  }
  roce_taker_.reset();
  try {
    roce_port_ = adopt_port_(fd);
  } catch (const std::system_error&) {
    return;  // fd closed; the next try binds again, or asks again
  }
  count(nullptr, &core::Counters::roce_port_shared);
  hold_roce_port(false);
}

void RocePorts::hold_roce_port(bool bound) {
  if (!adopt_port_ || roce_port_->fd() < 0) {  // not a socket to share (a test's in-memory port)
    set_reading(true);
    return;
  }
  roce_share_ = std::make_unique<net::PortShare>(roce_port_->fd(), iface().ip, wire::kRoceUdpPort);
  if (roce_share_->listener() >= 0) watch(roce_share_->listener(), EPOLLIN);
  // The binder reads; a taker reads only if the reader lock is free (nobody reads: its holder died).
  if (roce_share_->lock_reader() || bound) set_reading(true);
  // Any holder may come to stand in: a thread of its own looks at the socket, so that looking wakes
  // neither the progress thread nor the application (the engine lock is not needed to look).
  if (roce_share_->reader()) return;
  try {
    roce_watch_ = std::thread([this, fd = roce_port_->fd()] { watch_roce_port(fd); });
  } catch (const std::system_error&) {
    // No thread to spare: this context holds the socket but never stands in.
  }
}

bool RocePorts::become_reader() {
  if (!roce_share_->lock_reader()) return false;
  stop_watching();  // the reader for good: nobody left to watch for
  return true;
}

void RocePorts::watch_roce_port(int fd) {
  bool seen = false;
  std::unique_lock lock(roce_watch_mu_);
  while (!roce_watch_cv_.wait_for(lock, kStandbyLook, [this] { return roce_watch_stop_; })) {
    int waiting = 0;
    if (ioctl(fd, FIONREAD, &waiting) != 0 || waiting <= 0) {
      seen = false;
      continue;
    }
    if (!seen) {
      seen = true;
      continue;
    }
    // Datagrams waited through a whole look: the reader does not run (stopped, starved or gone).
    seen = false;
    if (!roce_unread_.exchange(true, std::memory_order_acq_rel)) doorbell();
  }
}

void RocePorts::set_reading(bool on) {
  if (on == roce_reading_) return;
  roce_reading_ = on;
  if (roce_port_->fd() < 0) return;
  if (on)
    watch(roce_port_->fd(), EPOLLIN);
  else
    unwatch(roce_port_->fd());
}

void RocePorts::read_roce_port(bool app_pass, bool& did, uint64_t now) {
  if (roce_unread_.load(std::memory_order_relaxed) && roce_unread_.exchange(false, std::memory_order_acq_rel) &&
      !roce_reading_) {
    // The reader did not read: this context reads for good when the reader lock is free (its holder
    // died), else stands in for a while.
    count(nullptr, &core::Counters::roce_stand_in);
    roce_stand_in_until_ = become_reader() ? 0 : now + kStandInNs;
    set_reading(true);
  }
  if (!roce_reading_) return;
  // Softrdma peers move to our own port after their first packets (peer_port_learned), so an empty
  // 4791 is looked at again only every 8th pass of a polling application: a system call saved on
  // most of its polls. The progress thread looks every pass.
  if (!app_pass || roce_busy_ || (++roce_skips_ & 7) == 0) {
    bool got = false;
    receive_from(*roce_port_, got);
    roce_busy_ = got;
    did |= got;
  }
  if (roce_stand_in_until_ && now >= roce_stand_in_until_) {
    // Standing in ends: for good when the reader lock is free now, else back to standing by.
    roce_stand_in_until_ = 0;
    if (!become_reader()) set_reading(false);
  }
}

uint64_t RocePorts::next_roce_try() const {
  if (!roce_port_) return take_roce_port_ ? next_roce_try_ns_ : 0;
  return roce_stand_in_until_;
}

bool RocePorts::serve(int fd) {
  if (fd < 0) return false;
  if (roce_share_ && fd == roce_share_->listener())
    roce_share_->serve();
  else if (fd == liveness_fd())
    serve_liveness();
  else
    return false;
  return true;
}

void RocePorts::receive_from(net::PacketPort& port, bool& did) {
  net::Datagram dgrams[net::PacketPort::kBatch];
  size_t n = port.receive(dgrams, net::PacketPort::kBatch);
  for (size_t i = 0; i < n; ++i)
    handle_packet(dgrams[i].data, dgrams[i].len, dgrams[i].peer_ip, dgrams[i].peer_port, port.port(),
                  dgrams[i].segment);
  if (n) {
    did = true;
    batch_done();
  }
}

void RocePorts::handle_packet(const uint8_t* data, uint32_t len, wire::IpAddress peer_ip, uint16_t peer_port,
                           uint16_t local_port, uint32_t segment) {
  count(nullptr, &core::Counters::rx_packets);
  count(nullptr, &core::Counters::rx_bytes, len);
  // Forwarded by this host's 4791 holder, which checked the ICRC against the original addresses and
  // appended them (UD receivers report the sender's address in the GRH).
  bool forwarded = peer_ip == iface().ip && peer_port == wire::kRoceUdpPort && local_port != wire::kRoceUdpPort;
  // Segment k of a segmented send carried identification k (net/gso.h).
  wire::UdpAddr addr{peer_ip, iface().ip, peer_port, local_port, static_cast<uint16_t>(segment)};
  if (forwarded && len >= kForwardTrailerLen && std::memcmp(data + len - 4, kForwardMagic, 4) == 0) {
    len -= kForwardTrailerLen;
    const uint8_t* t = data + len;
    peer_ip = wire::IpAddress::from_bytes(t);
    peer_port = static_cast<uint16_t>(t[16] << 8 | t[17]);
    addr = {peer_ip, iface().ip, peer_port, wire::kRoceUdpPort, static_cast<uint16_t>(t[18] << 8 | t[19]), t[20]};
  } else {
    forwarded = false;
  }
  wire::IpIdent ident{addr.ip_id, addr.ip_flags};
  // A protected QP's packets (wire/protect.h: BTH version kProtectTver, a trailer, no ICRC) are checked
  // by their tag, then the replay window; the packet without the trailer is then parsed. The ICRC is
  // checked for every other packet.
  Qp* sealed = nullptr;
  bool local_qp = false;
  if (len >= wire::kBthLen) {
    Qp* q = find_qp(uint32_t{data[5]} << 16 | uint32_t{data[6]} << 8 | data[7]);
    local_qp = q != nullptr;
    if (q && q->prot && q->prot->rx) sealed = q;
  }
  if (sealed) {
    // The cheap source check (below, for every connected QP) before any cryptography.
    if (sealed->dest_ip.is_set() && peer_ip != sealed->dest_ip) {
      count(sealed, &core::Counters::drop_src_addr);
      return;
    }
    if (!protection().open(*sealed, data, len)) return;
  }
  // A protected packet for no QP of ours at 4791, which this process holds for the address: one for a
  // QP of another process here (forwarded below, where its owner checks the tag), or for none. Its
  // headers are what matters; the trailer makes a packet without payload look too long. (At a
  // context's own port such a packet is for no QP that could check it: malformed, TVer 1 not being
  // RoCEv2's.)
  const bool foreign_sealed =
      !local_qp && roce_port_ && local_port == wire::kRoceUdpPort && wire::protected_form(data, len);
  const uint8_t tver = sealed || foreign_sealed ? wire::kProtectTver : 0;
  wire::Packet pkt;
  wire::ParseError perr = wire::parse_packet(data, len, pkt, tver);
  if (perr != wire::ParseError::Ok && foreign_sealed && len >= wire::kProtectTrailerLen + wire::kBthLen + wire::kIcrcLen)
    perr = wire::parse_packet(data, len - static_cast<uint32_t>(wire::kProtectTrailerLen), pkt, tver);
  if (perr != wire::ParseError::Ok) {
    count(nullptr, &core::Counters::drop_malformed);
    return;
  }
  if (!sealed && !foreign_sealed &&
      (forwarded ? !wire::check_icrc(addr, data, len) : !icrc_accepts(addr, data, len, &ident)))
    return;
  // Opened: framed as it would have been plain (from this host, the sender's capture has it).
  if (sealed && capture_ && peer_ip != iface().ip) [[unlikely]]
    capture_packet(pkt, pkt.payload, pkt.payload_len, {peer_ip, iface().ip, peer_port, local_port},
                   net::Capture::Direction::Inbound, kOpenedNote);
  // A single P_Key (the default, full or limited member) is all a softrdma port has.
  if ((pkt.bth.pkey & 0x7FFF) != 0x7FFF) {
    count(nullptr, &core::Counters::drop_pkey);
    return;
  }
  if (pkt.bth.dest_qp == wire::kGsiQpn) {
    if (foreign_sealed) {  // MADs are never protected, and this one has no ICRC
      count(nullptr, &core::Counters::drop_malformed);
      return;
    }
    handle_gsi(data, len, peer_ip, local_port);
    return;
  }
  Qp* qp = find_qp(pkt.bth.dest_qp);
  if (!qp && local_port == wire::kRoceUdpPort && roce_port_ &&
      forward_to_owner(data, len, pkt.bth.dest_qp, peer_ip, peer_port, ident))
    return;
  if (!qp) {
    count(nullptr, &core::Counters::drop_unknown_qp);
    return;
  }
  deliver(*qp, pkt, Arrival{peer_ip, peer_port, iface().ip, len});
}

bool RocePorts::forward_to_owner(const uint8_t* data, uint32_t len, uint32_t dest_qpn, const wire::IpAddress& peer_ip,
                              uint16_t peer_port, const wire::IpIdent& ident) {
  // From another host, for a QP of another process here: hand it over (docs/architecture.md,
  // "Devices and addressing").
  auto ep = net::Registry::instance().lookup(dest_qpn);
  if (!ep || ep->ip_key != iface().ip.key() || ep->port == port_->port() || len > kMaxDatagram - kForwardTrailerLen)
    return false;
  // The original source address travels in a trailer after the ICRC.
  uint8_t fwd[kMaxDatagram];
  std::memcpy(fwd, data, len);
  std::memcpy(fwd + len, peer_ip.bytes.data(), 16);
  fwd[len + 16] = static_cast<uint8_t>(peer_port >> 8);
  fwd[len + 17] = static_cast<uint8_t>(peer_port);
  fwd[len + 18] = static_cast<uint8_t>(ident.ip_id >> 8);
  fwd[len + 19] = static_cast<uint8_t>(ident.ip_id);
  fwd[len + 20] = ident.ip_flags;
  std::memcpy(fwd + len + 21, kForwardMagic, 4);
  roce_port_->send(fwd, len + kForwardTrailerLen, iface().ip, ep->port);
  count(nullptr, &core::Counters::forwarded);
  return true;
}

bool RocePorts::icrc_accepts(const wire::UdpAddr& addr, const uint8_t* data, uint32_t len, wire::IpIdent* ident) {
  switch (icrc_gate_.check(addr, data, len, now(), ident)) {
    case IcrcGate::Verdict::Exact:
      return true;
    case IcrcGate::Verdict::Segment:
      count(nullptr, &core::Counters::icrc_moved_segment);
      return true;
    case IcrcGate::Verdict::Solved:
      count(nullptr, &core::Counters::icrc_solved_ip_id);
      return true;
    case IcrcGate::Verdict::OutOfWindow:
      count(nullptr, &core::Counters::drop_icrc_ip_id);
      return false;
    case IcrcGate::Verdict::Bad:
      break;
  }
  count(nullptr, &core::Counters::drop_icrc);
  return false;
}

void RocePorts::send_packet(Qp& qp, wire::Packet& pkt, const uint8_t* payload, uint32_t len, const char* synthetic) {
  pkt.bth.dest_qp = qp.dest_qpn;
  // XRC QPs send the XRC form of the RC opcode (requests with the XRCETH in pkt.xrc_srqn).
  if (qp.cfg.xrc != XrcRole::None) pkt.bth.opcode |= wire::kXrcClassBits;
  if (synthetic) [[unlikely]] {
    if (capture_)
      capture_packet(pkt, payload, len, {iface().ip, qp.dest_ip, port_->port(), qp.dest_port},
                     net::Capture::Direction::Outbound, synthetic);
    return;
  }
  send_packet_to(qp, pkt, payload, len, qp.dest_ip, qp.dest_port);
}

void RocePorts::capture_packet(const wire::Packet& in, const uint8_t* payload, uint32_t len,
                               const net::Capture::Endpoints& ends, net::Capture::Direction dir, const char* note) {
  wire::Packet pkt = in;
  pkt.bth.pkey = wire::kDefaultPkey;
  pkt.bth.pad_count = wire::pad_for(len);
  pkt.bth.tver = 0;
  const uint32_t hdr = wire::opcode_info(pkt.bth.opcode).header_len;
  const uint32_t n = hdr + len + pkt.bth.pad_count + wire::kIcrcLen;
  std::vector<uint8_t> buf(n, 0);
  wire::write_headers(pkt, buf.data());
  if (len) std::memcpy(buf.data() + hdr, payload, len);
  wire::append_icrc({ends.src_ip, ends.dst_ip, ends.src_port, ends.dst_port, ends.ip_id}, buf.data(),
                    n - wire::kIcrcLen);
  capture_->packet(buf.data(), n, ends, dir, note);
}

void RocePorts::send_packet_to(Qp& qp, wire::Packet& pkt, const uint8_t* payload, uint32_t len,
                               const wire::IpAddress& dest_ip, uint16_t dest_port) {
  if (dest_ip.is_multicast() && !mcast_if_set_) {
    // Multicast (UD) leaves through the device's own interface, not the default route's.
    if (dest_ip.is_v4()) {
      in_addr ifa{};
      ifa.s_addr = iface().ip.v4_be();
      setsockopt(port_->fd(), IPPROTO_IP, IP_MULTICAST_IF, &ifa, sizeof ifa);
    } else {
      const int ifindex = iface().ifindex;
      setsockopt(port_->fd(), IPPROTO_IPV6, IPV6_MULTICAST_IF, &ifindex, sizeof ifindex);
    }
    mcast_if_set_ = true;
  }
  pkt.bth.pkey = wire::kDefaultPkey;
  pkt.bth.pad_count = wire::pad_for(len);
  const uint32_t hdr = wire::opcode_info(pkt.bth.opcode).header_len;
  wire::PacketCipher* seal = qp.prot ? qp.prot->tx.get() : nullptr;  // protected: a trailer before the ICRC
  // The port's capture shows only plain RoCEv2 (TVer 0): a sealed packet is framed here, unsealed.
  if (seal && capture_) [[unlikely]]
    capture_packet(pkt, payload, len, {iface().ip, dest_ip, port_->port(), dest_port},
                   net::Capture::Direction::Outbound, kProtectedNote);
  const uint32_t n = hdr + len + pkt.bth.pad_count + (seal ? uint32_t{wire::kProtectTrailerLen} : 0) + wire::kIcrcLen;
  // Written in place into the port's send buffer. Packets to a softrdma context (not to 4791, where
  // RoCE stacks listen) may travel as segments of one send; the ICRC covers the identification that
  // segment gets on the wire.
  uint16_t ip_id = 0;
  uint8_t* buf = port_->reserve(n, dest_ip, dest_port, dest_port != wire::kRoceUdpPort, &ip_id);
  if (!buf) return;
  pkt.bth.tver = seal ? wire::kProtectTver : 0;  // a protected packet's form (wire/protect.h)
  wire::write_headers(pkt, buf);
  if (seal) {
    // One pass: the payload is sealed (encrypted in Encrypt mode) on its way into the send buffer.
    // Every packet takes the next counter, a retransmission too: a nonce is never used twice.
    if (!seal->seal(buf, hdr, payload, len, pkt.bth.pad_count, qp.prot->tx_counter++)) return;
  } else {
    if (len) std::memcpy(buf + hdr, payload, len);
    for (uint8_t i = 0; i < pkt.bth.pad_count; ++i) buf[hdr + len + i] = 0;
  }
  if (seal) {
    std::memset(buf + n - wire::kIcrcLen, 0, wire::kIcrcLen);  // no ICRC under the tag
  } else {
    wire::UdpAddr addr{iface().ip, dest_ip, port_->port(), dest_port, ip_id};
    wire::append_icrc(addr, buf, n - wire::kIcrcLen);
  }
  port_->commit();
  count(&qp, &core::Counters::tx_packets);
  count(&qp, &core::Counters::tx_bytes, n);
}

net::Liveness::Verdict RocePorts::peer_liveness(const Qp& qp, uint64_t max_age_ns, uint64_t asked_from_ns,
                                                uint64_t asked_until_ns) {
  // Only a softrdma context's own port has a listener at its number (4791 may be another process's).
  net::Liveness* l = port_->liveness();
  if (!l || !net::UdpPort::is_context_port(qp.dest_port))
    return net::Liveness::Verdict::Unknown;
  return l->check(qp.dest_ip, qp.dest_port, qp.dest_qpn, now(), max_age_ns, asked_from_ns, asked_until_ns);
}

void RocePorts::resolve_destination(Qp& qp, bool again) {
  auto ep = net::Registry::instance().lookup(qp.dest_qpn);
  if (ep && ep->ip_key == qp.dest_ip.key())
    qp.dest_port = ep->port;
  else if (!again || !net::UdpPort::is_context_port(qp.dest_port))
    qp.dest_port = wire::kRoceUdpPort;
}

// ---- Multicast (IBTA 10.5; RoCE v2: the group's IP multicast address, destination QPN 0xFFFFFF) ----

int RocePorts::attach_mcast(Qp* qp, const wire::IpAddress& group) {
  // A group of the device's family: its socket joins on the device's interface.
  if (!group.is_multicast() || group.is_v4() != iface().ip.is_v4()) return EINVAL;
  std::lock_guard lock(engine_lock());
  for (McastGroup& g : mcast_) {
    if (g.group != group) continue;
    if (std::find(g.members.begin(), g.members.end(), qp) != g.members.end()) return 0;
    if (g.members.size() >= core::DeviceLimits::kMaxMcastQpAttach) return ENOMEM;
    g.members.push_back(qp);
    return 0;
  }
  if (mcast_.size() >= core::DeviceLimits::kMaxMcastGrp) return ENOMEM;
  // One socket per group and context, bound to group:4791: every process (and context) that joined
  // gets its own copy of each datagram (SO_REUSEADDR on a multicast address).
  int fd = net::os_socket(group.family(), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  // As deep as the unicast ports' buffers: a burst of datagrams must not overflow it.
  int rcvbuf = 8 << 20;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  sockaddr_storage sa{};
  const socklen_t sa_len = wire::to_sockaddr(group, wire::kRoceUdpPort, &sa);
  // A link-scope group (ff02::) is bound on the device's interface (the scope of any other is ignored).
  if (!group.is_v4()) reinterpret_cast<sockaddr_in6*>(&sa)->sin6_scope_id = static_cast<uint32_t>(iface().ifindex);
  int joined = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sa_len) == 0) {
    if (group.is_v4()) {
      ip_mreq mreq{};
      mreq.imr_multiaddr.s_addr = group.v4_be();
      mreq.imr_interface.s_addr = iface().ip.v4_be();
      joined = setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mreq, sizeof mreq);
    } else {
      ipv6_mreq mreq{};
      std::memcpy(&mreq.ipv6mr_multiaddr, group.bytes.data(), 16);
      mreq.ipv6mr_interface = static_cast<unsigned>(iface().ifindex);
      // Kernel rxe sends RoCEv2 over IPv6 with UDP checksum 0 (udp_port.cpp).
      setsockopt(fd, SOL_UDP, UDP_NO_CHECK6_RX, &one, sizeof one);
      joined = setsockopt(fd, IPPROTO_IPV6, IPV6_ADD_MEMBERSHIP, &mreq, sizeof mreq);
    }
  }
  if (joined != 0) {
    int e = errno;
    close(fd);
    return e;
  }
  watch(fd, EPOLLIN);
  mcast_.push_back(McastGroup{group, fd, {qp}});
  return 0;
}

int RocePorts::detach_mcast(Qp* qp, const wire::IpAddress& group) {
  std::lock_guard lock(engine_lock());
  for (size_t i = 0; i < mcast_.size(); ++i) {
    McastGroup& g = mcast_[i];
    if (g.group != group) continue;
    auto it = std::find(g.members.begin(), g.members.end(), qp);
    if (it == g.members.end()) return EINVAL;
    g.members.erase(it);
    if (g.members.empty()) {
      // Closing the socket leaves the group.
      unwatch(g.fd);
      close(g.fd);
      mcast_.erase(mcast_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    return 0;
  }
  return EINVAL;
}

void RocePorts::forget_qp(Qp* qp) {
  for (size_t i = mcast_.size(); i-- > 0;) {
    McastGroup& g = mcast_[i];
    g.members.erase(std::remove(g.members.begin(), g.members.end(), qp), g.members.end());
    if (g.members.empty()) {
      unwatch(g.fd);
      close(g.fd);
      mcast_.erase(mcast_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
}

void RocePorts::mcast_receive(bool& did) {
  uint8_t buf[4096 + 256];
  for (McastGroup& g : mcast_) {
    for (int n = 0; n < 32; ++n) {
      sockaddr_storage from{};
      socklen_t fl = sizeof from;
      ssize_t len = recvfrom(g.fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &fl);
      if (len <= 0) break;
      wire::IpAddress from_ip;
      uint16_t from_port = 0;
      wire::from_sockaddr(reinterpret_cast<const sockaddr*>(&from), &from_ip, &from_port);
      did = true;
      count(nullptr, &core::Counters::rx_packets);
      count(nullptr, &core::Counters::rx_bytes, static_cast<uint64_t>(len));
      wire::Packet pkt;
      uint32_t ulen = static_cast<uint32_t>(len);
      if (wire::parse_packet(buf, ulen, pkt) != wire::ParseError::Ok) {
        count(nullptr, &core::Counters::drop_malformed);
        continue;
      }
      const wire::IpAddress& group_ip = g.group;
      wire::UdpAddr addr{from_ip, group_ip, from_port, wire::kRoceUdpPort};
      wire::IpIdent ident;
      if (!icrc_accepts(addr, buf, ulen, &ident)) continue;
      if ((pkt.bth.pkey & 0x7FFF) != 0x7FFF) {
        count(nullptr, &core::Counters::drop_pkey);
        continue;
      }
      // Only UD datagrams to the multicast QPN belong to a group (IBTA 10.5.2.x).
      if (wire::opcode_info(pkt.bth.opcode).qp_class != wire::QpClass::UD || pkt.bth.dest_qp != 0xFFFFFF) {
        count(nullptr, &core::Counters::drop_bad_opcode);
        continue;
      }
      // Each attached QP gets its own copy.
      const Arrival a{from_ip, from_port, group_ip, ulen};
      for (Qp* qp : g.members) deliver(*qp, pkt, a);
    }
  }
}

}  // namespace softrdma::transport
