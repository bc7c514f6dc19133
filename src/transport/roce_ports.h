// The context's RoCEv2 ports (roce_ports.cpp, gsi.cpp): its own UDP port (its address in the host
// registry), UDP 4791 while this process holds it for the address (docs/architecture.md, "Devices
// and addressing"), and a socket per multicast group a UD QP joined. Receiving runs the port's checks
// -- forwarded trailer, wire protection, parse, ICRC, P_Key, QP1 -- then hands a packet for another
// local process to its owner, or one of ours to Engine::deliver. Sending writes a QP's packet with its
// ICRC, or a protected QP's sealed packet (no ICRC under the tag), straight into the port's send buffer.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "net/packet_port.h"
#include "transport/icrc_gate.h"
#include "transport/path.h"
#include "transport/qp.h"
#include "wire/headers.h"

namespace softrdma::transport {

class RocePorts : PathServices {
 public:
  using OpenPort = std::function<std::unique_ptr<net::PacketPort>(uint32_t ip_be, uint16_t port)>;
  // Opens the context's own port (throws std::system_error when it cannot) and watches it.
  RocePorts(Engine& e, OpenPort open_port, bool take_roce_port);
  ~RocePorts();

  uint16_t port() const { return port_->port(); }
  // One look at every port (4791 less often during an application's own polls: app_pass); true when
  // any datagram came. Then flush sends what the progress pass left in the send buffers.
  bool receive(bool app_pass);
  void flush();
  void flush_own() { port_->flush(); }
  // Tries to take UDP 4791 for the address, at most once a second; the time of the next try while
  // another process holds it (0: held here, or not wanted).
  void try_take_roce_port(uint64_t now_ns);
  uint64_t next_roce_try() const { return roce_port_ || !take_roce_port_ ? 0 : next_roce_try_ns_; }
  // One datagram as if it had arrived on local_port from (peer_ip_be, peer_port) (Engine::inject_datagram).
  void handle_packet(const uint8_t* data, uint32_t len, uint32_t peer_ip, uint16_t peer_port, uint16_t local_port,
                     uint32_t segment = 0);

  // The QP's packet to its peer, or to any address and port (UD).
  void send_packet(Qp& qp, wire::Packet& pkt, const uint8_t* payload, uint32_t len);
  void send_packet_to(Qp& qp, wire::Packet& pkt, const uint8_t* payload, uint32_t len, uint32_t dest_ip_be,
                      uint16_t dest_port);
  // A QP of a process on this host is reached at that process's own port; any other at 4791.
  void resolve_destination(Qp& qp);

  // UD multicast (IBTA 10.5): the QP joins/leaves the IPv4 group on the device's interface (takes the
  // engine lock). 0 or an errno. forget_qp: a destroyed QP leaves its groups (lock held).
  int attach_mcast(Qp* qp, uint32_t group_ip_be);
  int detach_mcast(Qp* qp, uint32_t group_ip_be);
  void forget_qp(Qp* qp);

 private:
  void receive_from(net::PacketPort& port, bool& did);
  // A datagram for a QP of another process of this host, arrived at 4791 from another host: handed to
  // that process with its original source in a trailer; false when no such process here takes it.
  bool forward_to_owner(const uint8_t* data, uint32_t len, uint32_t dest_qpn, uint32_t peer_ip, uint16_t peer_port,
                        const wire::IpIdent& ident);
  // gsi.cpp: a datagram for QP1 (CM MADs): routed to the process it belongs to.
  void handle_gsi(const uint8_t* data, uint32_t len, uint32_t peer_ip, uint16_t local_port);
  // The ICRC check of a datagram as the socket saw it (icrc_gate.h); counts what it drops.
  bool icrc_accepts(const wire::Ipv4UdpAddr& addr, const uint8_t* data, uint32_t len, wire::IpIdent* ident);
  void mcast_receive(bool& did);

  OpenPort open_port_;
  bool take_roce_port_;
  IcrcGate icrc_gate_;
  std::unique_ptr<net::PacketPort> port_;       // ephemeral port: this context's address in the registry
  std::unique_ptr<net::PacketPort> roce_port_;  // UDP 4791, when this process holds it
  uint64_t next_roce_try_ns_ = 0;
  bool roce_busy_ = false;  // 4791's last look found datagrams
  uint32_t roce_skips_ = 0;
  // Multicast groups some QP of this context joined: a socket bound to group:4791 each.
  struct McastGroup {
    uint32_t group_ip_be;
    int fd;
    std::vector<Qp*> members;
  };
  std::vector<McastGroup> mcast_;
  bool mcast_if_set_ = false;  // port_ sends multicast out of the device's interface
};

}  // namespace softrdma::transport
