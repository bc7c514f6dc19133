// The context's RoCEv2 ports (roce_ports.cpp, gsi.cpp): its own UDP port (its address in the host
// registry), UDP 4791 while this process holds it for the address (docs/architecture.md, "Devices
// and addressing"), and a socket per multicast group a UD QP joined. Receiving runs the port's checks
// -- forwarded trailer, wire protection, parse, ICRC, P_Key, QP1 -- then hands a packet for another
// local process to its owner, or one of ours to Engine::deliver. Sending writes a QP's packet with its
// ICRC, or a protected QP's sealed packet (no ICRC under the tag), straight into the port's send buffer.
// With packet capture on (net/capture.h), it frames what the port cannot show: protected packets as
// they were before sealing and after opening, and the direct path's operations as the packets they
// replaced.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "net/capture.h"
#include "net/liveness.h"
#include "net/packet_port.h"
#include "net/port_share.h"
#include "transport/icrc_gate.h"
#include "transport/path.h"
#include "transport/qp.h"
#include "wire/headers.h"

namespace softrdma::transport {

class RocePorts : PathServices {
 public:
  using OpenPort = std::function<std::unique_ptr<net::PacketPort>(const wire::IpAddress& ip, uint16_t port)>;
  using AdoptPort = std::function<std::unique_ptr<net::PacketPort>(int fd)>;
  // Opens the context's own port (throws std::system_error when it cannot) and watches it.
  // adopt_port: wraps 4791's socket taken from another process (empty: never shared).
  // capture: SOFTRDMA_CAPTURE's file ("": off).
  RocePorts(Engine& e, OpenPort open_port, AdoptPort adopt_port, bool take_roce_port, const std::string& capture = {});
  ~RocePorts();

  // Ends the thread that looks at a shared 4791 (it rings the engine's doorbell): before the engine's
  // fds close.
  void stop_watching();

  uint16_t port() const { return port_->port(); }
  net::Capture* capture() const { return capture_.get(); }
  // One look at every port (4791 less often during an application's own polls: app_pass); true when
  // any datagram came. Then flush sends what the progress pass left in the send buffers.
  bool receive(bool app_pass);
  void flush();
  void flush_own() { port_->flush(); }
  // What the context's own port holds queued leaves after what is queued from now on (net/packet_port.h).
  void defer_queued() { port_->defer_queued(); }
  size_t queued() const { return port_->queued(); }
  // Tries to take UDP 4791 for the address, at most once a second: binds it, or takes the socket
  // from a process of this user that holds it (net/port_share.h) and stands by to read it when that
  // one does not. next_roce_try: when to look again (the next try, the stand-by's next look at the
  // socket, the end of standing in; 0: nothing to do).
  void try_take_roce_port(uint64_t now_ns);
  uint64_t next_roce_try() const;
  // Serves fd when it is one of the ports' service sockets (liveness, 4791's offer): false when not.
  bool serve(int fd);
  // One datagram as if it had arrived on local_port from (peer_ip, peer_port) (Engine::inject_datagram).
  void handle_packet(const uint8_t* data, uint32_t len, wire::IpAddress peer_ip, uint16_t peer_port, uint16_t local_port,
                     uint32_t segment = 0);

  // The QP's packet to its peer, or to any address and port (UD). synthetic: to the capture only,
  // with that note.
  void send_packet(Qp& qp, wire::Packet& pkt, const uint8_t* payload, uint32_t len, const char* synthetic = nullptr);
  void send_packet_to(Qp& qp, wire::Packet& pkt, const uint8_t* payload, uint32_t len, const wire::IpAddress& dest_ip,
                      uint16_t dest_port);
  // A QP of a process on this host is reached at that process's own port; any other at 4791, until it
  // answers from its own (rc_path.cpp). again (a retransmission timeout): a port learned so stays,
  // as the liveness queries go to its number (a QP's process never changes).
  void resolve_destination(Qp& qp, bool again = false);
  // What the kernel of the QP's peer says of the peer's process (net/liveness.h): Unknown unless the
  // QP sends to a softrdma context's own port.
  net::Liveness::Verdict peer_liveness(const Qp& qp, uint64_t max_age_ns, uint64_t asked_from_ns,
                                       uint64_t asked_until_ns);
  // Answers the peers that ask about this context (every 64th receive, and when its fd wakes the
  // progress thread); the fd is -1 when the context has no listener.
  void serve_liveness();
  int liveness_fd();

  // UD multicast (IBTA 10.5): the QP joins/leaves the group, an address of the device's family
  // (EINVAL otherwise), on the device's interface (takes the engine lock). 0 or an errno. forget_qp:
  // a destroyed QP leaves its groups (lock held).
  int attach_mcast(Qp* qp, const wire::IpAddress& group);
  int detach_mcast(Qp* qp, const wire::IpAddress& group);
  void forget_qp(Qp* qp);

 private:
  void receive_from(net::PacketPort& port, bool& did);
  void take_shared_roce_port(uint64_t now);
  // 4791 is held (bound here when bound, else taken): offer it on, and read it or stand by.
  void hold_roce_port(bool bound);
  // A holder's own thread looks at 4791 every kStandbyLook; datagrams waiting at two looks in a row
  // mean the reader does not run: it sets roce_unread_ and rings the doorbell, and the next pass of a
  // holder that does not read reads for good when the reader lock is free (its holder died), else
  // stands in for kStandInNs at a time.
  void watch_roce_port(int fd);
  // Takes the reader lock (its holder died) and then needs no watching thread: false when held.
  bool become_reader();
  void read_roce_port(bool app_pass, bool& did, uint64_t now);
  void set_reading(bool on);
  // A datagram for a QP of another process of this host, arrived at 4791 from another host: handed to
  // that process with its original source in a trailer; false when no such process here takes it.
  bool forward_to_owner(const uint8_t* data, uint32_t len, uint32_t dest_qpn, const wire::IpAddress& peer_ip, uint16_t peer_port,
                        const wire::IpIdent& ident);
  // gsi.cpp: a datagram for QP1 (CM MADs): routed to the process it belongs to.
  void handle_gsi(const uint8_t* data, uint32_t len, const wire::IpAddress& peer_ip, uint16_t local_port);
  // The ICRC check of a datagram as the socket saw it (icrc_gate.h); counts what it drops.
  bool icrc_accepts(const wire::UdpAddr& addr, const uint8_t* data, uint32_t len, wire::IpIdent* ident);
  void mcast_receive(bool& did);
  // A frame of pkt (tver 0, with its ICRC) between the ends given, to the capture.
  void capture_packet(const wire::Packet& pkt, const uint8_t* payload, uint32_t len, const net::Capture::Endpoints& ends,
                      net::Capture::Direction dir, const char* note);

  std::shared_ptr<net::Capture> capture_;  // nullptr when off
  OpenPort open_port_;
  bool take_roce_port_;
  IcrcGate icrc_gate_;
  std::unique_ptr<net::PacketPort> port_;       // ephemeral port: this context's address in the registry
  AdoptPort adopt_port_;
  std::unique_ptr<net::PacketPort> roce_port_;  // UDP 4791: bound here, or taken from its holder
  std::unique_ptr<net::PortShare> roce_share_;  // roce_port_ offered on to this user's other processes
  std::unique_ptr<net::PortShare::Taker> roce_taker_;  // taking it from an offer
  bool roce_reading_ = false;      // this context reads roce_port_ (else it stands by)
  uint64_t roce_stand_in_until_ = 0;  // reading for a reader that does not run, until then (0: not)
  std::thread roce_watch_;            // watch_roce_port, while roce_port_ is held
  std::mutex roce_watch_mu_;
  std::condition_variable roce_watch_cv_;
  bool roce_watch_stop_ = false;      // under roce_watch_mu_
  std::atomic<bool> roce_unread_{false};
  uint64_t next_roce_try_ns_ = 0;
  bool roce_busy_ = false;  // 4791's last look found datagrams
  uint32_t roce_skips_ = 0;
  uint32_t liveness_skips_ = 0;
  // Multicast groups some QP of this context joined: a socket bound to group:4791 each.
  struct McastGroup {
    wire::IpAddress group;
    int fd;
    std::vector<Qp*> members;
  };
  std::vector<McastGroup> mcast_;
  bool mcast_if_set_ = false;  // port_ sends multicast out of the device's interface
};

}  // namespace softrdma::transport
