// QP1 (GSI) on the 4791 holder: CM MADs from other hosts are handed to the process they belong to.
// softrdma keeps no QP1 of its own; the connection manager (src/cm, under librdmacm) runs inside each
// application (docs/rdmacm.md). Routing on a host where many processes share one IP:
//  - REQ and SIDR_REQ name an IP-based service ID (port space, port). The listening rdma_cm id holds a
//    UDP socket on that port number, so the MAD is forwarded to (this IP, port). When no socket holds
//    the port, nobody listens: the holder answers itself, as the kernel CM does, with a REJ "invalid
//    service ID" (SIDR_REP "service ID not supported"); the CM module builds every such answer
//    (cm::answer_unowned).
//  - Every other MAD names the receiver's comm ID (SIDR_REP its request ID). CM processes take their comm
//    IDs from the host registry (the low 24 bits are a registry number that maps to the process's CM
//    socket), so a registry lookup finds the owner.
//  - A MAD for a comm ID whose owner is gone (the process died, and with it its connection manager)
//    is answered here, as the kernel CM of a dying process's host would have spoken for it: DREQ with
//    DREP; REP and RTU (what a surviving peer resends now and then to check on the connection,
//    docs/rdmacm.md) with REJ "invalid comm ID".
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <mutex>
#include <unordered_map>

#include "cm/cm.h"
#include "net/registry.h"
#include "transport/engine.h"
#include "transport/roce_ports.h"
#include "wire/cm_mad.h"

namespace softrdma::transport {

void RocePorts::handle_gsi(const uint8_t* data, uint32_t len, const wire::IpAddress& peer_ip, uint16_t local_port) {
  const uint8_t* mad = wire::gsi_mad(data, len);
  wire::MadHeader h;
  // Only the 4791 holder routes; our ephemeral port never receives MADs.
  if (!mad || local_port != wire::kRoceUdpPort || !roce_port_ || !wire::decode_mad_header(mad, wire::kMadLen, h)) {
    count(nullptr, &core::Counters::drop_unknown_qp);
    return;
  }
  auto reply = [&](const uint8_t* out_mad) {
    uint8_t pkt[wire::kGsiPacketLen];
    size_t n = wire::build_gsi_packet(iface().ip, peer_ip, wire::kRoceUdpPort, wire::kRoceUdpPort, 0, out_mad, pkt);
    roce_port_->send(pkt, static_cast<uint32_t>(n), peer_ip, wire::kRoceUdpPort);
  };
  const auto attr = static_cast<wire::CmAttr>(h.attr_id);
  if (attr == wire::CmAttr::Req || attr == wire::CmAttr::SidrReq) {
    uint64_t sid = wire::cm_service_id(mad, h.attr_id);
    uint16_t port = static_cast<uint16_t>(sid & 0xFFFF);
    if (wire::is_ip_service_id(sid) && port && net::udp_port_bound(port)) {
      roce_port_->send(data, len, iface().ip, port);
      count(nullptr, &core::Counters::forwarded);
      return;
    }
    // A server may be between two listens on its port (perftest -R re-listens between its connections):
    // the first REQ of a connection is dropped, as if lost, and only its resend is rejected.
    {
      static std::mutex first_seen_mu;
      static std::unordered_map<uint64_t, uint64_t> first_seen;  // (peer IP, comm/request ID) -> when
      const uint64_t key = (uint64_t{peer_ip.key()} << 32) | wire::cm_destination_comm_id(mad, static_cast<uint16_t>(wire::CmAttr::SidrRep));  // bytes 0-3: the sender's comm/request ID
      const uint64_t now = now_ns();
      std::lock_guard lock(first_seen_mu);
      std::erase_if(first_seen, [&](const auto& kv) { return now - kv.second > 60'000'000'000ull; });
      if (first_seen.emplace(key, now).second) {
        count(nullptr, &core::Counters::drop_unknown_qp);
        return;
      }
    }
    uint8_t out[wire::kMadLen];
    if (cm::answer_unowned(mad, out)) reply(out);
    return;
  }
  uint32_t comm_id = wire::cm_destination_comm_id(mad, h.attr_id);
  auto ep = net::Registry::instance().lookup(comm_id & 0xFFFFFF);
  if (ep && ep->port && !(kill(ep->pid, 0) != 0 && errno == ESRCH)) {
    roce_port_->send(data, len, iface().ip, ep->port);
    count(nullptr, &core::Counters::forwarded);
    return;
  }
  // Its owner is gone: the CM answers as that process's kernel would have.
  uint8_t out[wire::kMadLen];
  if (cm::answer_unowned(mad, out)) {
    reply(out);
    return;
  }
  count(nullptr, &core::Counters::drop_unknown_qp);
}

}  // namespace softrdma::transport
