// The context's RoCEv2 ports (roce_ports.h): receiving with the port's checks, forwarding what
// arrives at 4791 for another local process, sending a QP's packets, and the multicast groups' sockets.
#include "transport/roce_ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/limits.h"
#include "net/registry.h"
#include "transport/engine.h"
#include "wire/cm_mad.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace softrdma::transport {

namespace {
// A packet the 4791 holder hands to another local process carries, after its ICRC, the original
// source and the IPv4 identification the holder found it was sent with: IPv4 address (4), UDP port (2,
// big-endian), identification (2, big-endian), flags (1), then this magic (4). The receiver checks the
// ICRC again with them, at full strength: the hop is no way around the check.
constexpr uint32_t kForwardTrailerLen = 13;
constexpr uint8_t kForwardMagic[4] = {'S', 'R', 'F', 'W'};
constexpr uint32_t kMaxDatagram = 8192;  // far above MTU 4096 plus every header
}  // namespace

RocePorts::RocePorts(Engine& e, OpenPort open_port, bool take_roce_port)
    : PathServices(e), open_port_(std::move(open_port)), take_roce_port_(take_roce_port) {
  port_ = open_port_(iface().ip_be, 0);
  if (port_->fd() >= 0) watch(port_->fd(), EPOLLIN);
}

RocePorts::~RocePorts() {
  for (McastGroup& g : mcast_) close(g.fd);
}

bool RocePorts::receive(bool app_pass) {
  bool did = false;
  receive_from(*port_, did);
  try_take_roce_port(now());
  if (roce_port_) {
    // Softrdma peers move to our own port after their first packets (peer_port_learned), so an empty
    // 4791 is looked at again only every 8th pass of a polling application: a system call saved on
    // most of its polls. The progress thread looks every pass.
    if (!app_pass || roce_busy_ || (++roce_skips_ & 7) == 0) {
      bool got = false;
      receive_from(*roce_port_, got);
      roce_busy_ = got;
      did |= got;
    }
  }
  if (!mcast_.empty()) mcast_receive(did);
  return did;
}

void RocePorts::flush() {
  port_->flush();
  if (roce_port_) roce_port_->flush();
}

void RocePorts::try_take_roce_port(uint64_t now) {
  // One process of the host holds UDP 4791 for an address and forwards what is not its own; when it
  // exits, the next one to try takes over. Tried at most once a second.
  if (!take_roce_port_ || roce_port_ || now < next_roce_try_ns_) return;
  next_roce_try_ns_ = now + 1000000000ull;
  try {
    roce_port_ = open_port_(iface().ip_be, wire::kRoceUdpPort);
  } catch (const std::system_error&) {
    return;  // held by another process: our peers reach us through it, or on port_ directly
  }
  if (roce_port_->fd() >= 0) watch(roce_port_->fd(), EPOLLIN);
}

void RocePorts::receive_from(net::PacketPort& port, bool& did) {
  net::Datagram dgrams[net::PacketPort::kBatch];
  size_t n = port.receive(dgrams, net::PacketPort::kBatch);
  for (size_t i = 0; i < n; ++i)
    handle_packet(dgrams[i].data, dgrams[i].len, dgrams[i].peer_ip_be, dgrams[i].peer_port, port.port(),
                  dgrams[i].segment);
  if (n) {
    did = true;
    batch_done();
  }
}

void RocePorts::handle_packet(const uint8_t* data, uint32_t len, uint32_t peer_ip, uint16_t peer_port,
                           uint16_t local_port, uint32_t segment) {
  count(nullptr, &core::Counters::rx_packets);
  count(nullptr, &core::Counters::rx_bytes, len);
  // Forwarded by this host's 4791 holder, which checked the ICRC against the original addresses and
  // appended them (UD receivers report the sender's address in the GRH).
  bool forwarded = peer_ip == iface().ip_be && peer_port == wire::kRoceUdpPort && local_port != wire::kRoceUdpPort;
  // Segment k of a segmented send carried identification k (net/gso.h).
  wire::Ipv4UdpAddr addr{peer_ip, iface().ip_be, peer_port, local_port, static_cast<uint16_t>(segment)};
  if (forwarded && len >= kForwardTrailerLen && std::memcmp(data + len - 4, kForwardMagic, 4) == 0) {
    len -= kForwardTrailerLen;
    const uint8_t* t = data + len;
    std::memcpy(&peer_ip, t, 4);
    peer_port = static_cast<uint16_t>(t[4] << 8 | t[5]);
    addr = {peer_ip, iface().ip_be, peer_port, wire::kRoceUdpPort, static_cast<uint16_t>(t[6] << 8 | t[7]), t[8]};
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
    if (sealed->dest_ip_be != 0 && peer_ip != sealed->dest_ip_be) {
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
  deliver(*qp, pkt, Arrival{peer_ip, peer_port, iface().ip_be, len});
}

bool RocePorts::forward_to_owner(const uint8_t* data, uint32_t len, uint32_t dest_qpn, uint32_t peer_ip,
                              uint16_t peer_port, const wire::IpIdent& ident) {
  // From another host, for a QP of another process here: hand it over (docs/architecture.md,
  // "Devices and addressing").
  auto ep = net::Registry::instance().lookup(dest_qpn);
  if (!ep || ep->ip_be != iface().ip_be || ep->port == port_->port() || len > kMaxDatagram - kForwardTrailerLen)
    return false;
  // The original source address travels in a trailer after the ICRC.
  uint8_t fwd[kMaxDatagram];
  std::memcpy(fwd, data, len);
  std::memcpy(fwd + len, &peer_ip, 4);
  fwd[len + 4] = static_cast<uint8_t>(peer_port >> 8);
  fwd[len + 5] = static_cast<uint8_t>(peer_port);
  fwd[len + 6] = static_cast<uint8_t>(ident.ip_id >> 8);
  fwd[len + 7] = static_cast<uint8_t>(ident.ip_id);
  fwd[len + 8] = ident.ip_flags;
  std::memcpy(fwd + len + 9, kForwardMagic, 4);
  roce_port_->send(fwd, len + kForwardTrailerLen, ep->ip_be, ep->port);
  count(nullptr, &core::Counters::forwarded);
  return true;
}

bool RocePorts::icrc_accepts(const wire::Ipv4UdpAddr& addr, const uint8_t* data, uint32_t len, wire::IpIdent* ident) {
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

void RocePorts::send_packet(Qp& qp, wire::Packet& pkt, const uint8_t* payload, uint32_t len) {
  pkt.bth.dest_qp = qp.dest_qpn;
  // XRC QPs send the XRC form of the RC opcode (requests with the XRCETH in pkt.xrc_srqn).
  if (qp.cfg.xrc != XrcRole::None) pkt.bth.opcode |= wire::kXrcClassBits;
  send_packet_to(qp, pkt, payload, len, qp.dest_ip_be, qp.dest_port);
}

void RocePorts::send_packet_to(Qp& qp, wire::Packet& pkt, const uint8_t* payload, uint32_t len, uint32_t dest_ip_be,
                            uint16_t dest_port) {
  if ((ntohl(dest_ip_be) >> 28) == 0xE && !mcast_if_set_) {
    // Multicast (UD) leaves through the device's own interface, not the default route's.
    in_addr ifa{};
    ifa.s_addr = iface().ip_be;
    setsockopt(port_->fd(), IPPROTO_IP, IP_MULTICAST_IF, &ifa, sizeof ifa);
    mcast_if_set_ = true;
  }
  pkt.bth.pkey = wire::kDefaultPkey;
  pkt.bth.pad_count = wire::pad_for(len);
  const uint32_t hdr = wire::opcode_info(pkt.bth.opcode).header_len;
  wire::PacketCipher* seal = qp.prot ? qp.prot->tx.get() : nullptr;  // protected: a trailer before the ICRC
  const uint32_t n = hdr + len + pkt.bth.pad_count + (seal ? uint32_t{wire::kProtectTrailerLen} : 0) + wire::kIcrcLen;
  // Written in place into the port's send buffer. Packets to a softrdma context (not to 4791, where
  // RoCE stacks listen) may travel as segments of one send; the ICRC covers the identification that
  // segment gets on the wire.
  uint16_t ip_id = 0;
  uint8_t* buf = port_->reserve(n, dest_ip_be, dest_port, dest_port != wire::kRoceUdpPort, &ip_id);
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
    wire::Ipv4UdpAddr addr{iface().ip_be, dest_ip_be, port_->port(), dest_port, ip_id};
    wire::append_icrc(addr, buf, n - wire::kIcrcLen);
  }
  port_->commit();
  count(&qp, &core::Counters::tx_packets);
  count(&qp, &core::Counters::tx_bytes, n);
}

void RocePorts::resolve_destination(Qp& qp) {
  // A QP of a process on this host is reached at that process's own port; any other at 4791.
  auto ep = net::Registry::instance().lookup(qp.dest_qpn);
  qp.dest_port = (ep && ep->ip_be == qp.dest_ip_be) ? ep->port : wire::kRoceUdpPort;
}

// ---- Multicast (IBTA 10.5; RoCE v2: the group's IPv4 multicast address, destination QPN 0xFFFFFF) ----

int RocePorts::attach_mcast(Qp* qp, uint32_t group_ip_be) {
  std::lock_guard lock(engine_lock());
  for (McastGroup& g : mcast_) {
    if (g.group_ip_be != group_ip_be) continue;
    if (std::find(g.members.begin(), g.members.end(), qp) != g.members.end()) return 0;
    if (g.members.size() >= core::DeviceLimits::kMaxMcastQpAttach) return ENOMEM;
    g.members.push_back(qp);
    return 0;
  }
  if (mcast_.size() >= core::DeviceLimits::kMaxMcastGrp) return ENOMEM;
  // One socket per group and context, bound to group:4791: every process (and context) that joined
  // gets its own copy of each datagram (SO_REUSEADDR on a multicast address).
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  // As deep as the unicast ports' buffers: a burst of datagrams must not overflow it.
  int rcvbuf = 8 << 20;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(wire::kRoceUdpPort);
  sa.sin_addr.s_addr = group_ip_be;
  ip_mreq mreq{};
  mreq.imr_multiaddr.s_addr = group_ip_be;
  mreq.imr_interface.s_addr = iface().ip_be;
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mreq, sizeof mreq) != 0) {
    int e = errno;
    close(fd);
    return e;
  }
  watch(fd, EPOLLIN);
  mcast_.push_back(McastGroup{group_ip_be, fd, {qp}});
  return 0;
}

int RocePorts::detach_mcast(Qp* qp, uint32_t group_ip_be) {
  std::lock_guard lock(engine_lock());
  for (size_t i = 0; i < mcast_.size(); ++i) {
    McastGroup& g = mcast_[i];
    if (g.group_ip_be != group_ip_be) continue;
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
      sockaddr_in from{};
      socklen_t fl = sizeof from;
      ssize_t len = recvfrom(g.fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &fl);
      if (len <= 0) break;
      did = true;
      count(nullptr, &core::Counters::rx_packets);
      count(nullptr, &core::Counters::rx_bytes, static_cast<uint64_t>(len));
      wire::Packet pkt;
      uint32_t ulen = static_cast<uint32_t>(len);
      if (wire::parse_packet(buf, ulen, pkt) != wire::ParseError::Ok) {
        count(nullptr, &core::Counters::drop_malformed);
        continue;
      }
      wire::Ipv4UdpAddr addr{from.sin_addr.s_addr, g.group_ip_be, ntohs(from.sin_port), wire::kRoceUdpPort};
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
      const Arrival a{from.sin_addr.s_addr, ntohs(from.sin_port), g.group_ip_be, ulen};
      for (Qp* qp : g.members) deliver(*qp, pkt, a);
    }
  }
}

}  // namespace softrdma::transport
