// QP1 (GSI) on the 4791 holder: CM MADs from other hosts are handed to the process they belong to.
// softrdma keeps no QP1 of its own; librdmacm's connection manager runs inside each application
// (src/rdmacm, docs/rdmacm.md). Routing on a host where many processes share one IP:
//  - REQ and SIDR_REQ name an IP-based service ID (port space, port). The listening rdma_cm id holds a
//    UDP socket on that port number, so the MAD is forwarded to (this IP, port). When no socket holds
//    the port, nobody listens: the holder answers itself, as the kernel CM does, with a REJ "invalid
//    service ID" (SIDR_REP "service ID not supported").
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

#include "net/registry.h"
#include "transport/engine.h"
#include "wire/cm_mad.h"

namespace softrdma::transport {

void Engine::handle_gsi(const uint8_t* data, uint32_t len, uint32_t peer_ip, uint16_t local_port) {
  const uint8_t* mad = wire::gsi_mad(data, len);
  wire::MadHeader h;
  // Only the 4791 holder routes; our ephemeral port never receives MADs.
  if (!mad || local_port != wire::kRoceUdpPort || !roce_port_ || !wire::decode_mad_header(mad, wire::kMadLen, h)) {
    count(nullptr, &core::Counters::drop_unknown_qp);
    return;
  }
  auto reply = [&](const uint8_t* out_mad) {
    uint8_t pkt[wire::kGsiPacketLen];
    size_t n = wire::build_gsi_packet(iface_.ip_be, peer_ip, wire::kRoceUdpPort, wire::kRoceUdpPort, 0, out_mad, pkt);
    roce_port_->send(pkt, static_cast<uint32_t>(n), peer_ip, wire::kRoceUdpPort);
  };
  const auto attr = static_cast<wire::CmAttr>(h.attr_id);
  if (attr == wire::CmAttr::Req || attr == wire::CmAttr::SidrReq) {
    uint64_t sid = wire::cm_service_id(mad, h.attr_id);
    uint16_t port = static_cast<uint16_t>(sid & 0xFFFF);
    if (wire::is_ip_service_id(sid) && port && net::udp_port_bound(port)) {
      roce_port_->send(data, len, iface_.ip_be, port);
      count(nullptr, &core::Counters::forwarded);
      return;
    }
    // A server may be between two listens on its port (perftest -R re-listens between its connections):
    // the first REQ of a connection is dropped, as if lost, and only its resend is rejected.
    {
      static std::mutex first_seen_mu;
      static std::unordered_map<uint64_t, uint64_t> first_seen;  // (peer IP, comm/request ID) -> when
      const uint64_t key = (uint64_t{peer_ip} << 32) | wire::cm_destination_comm_id(mad, static_cast<uint16_t>(wire::CmAttr::SidrRep));  // bytes 0-3: the sender's comm/request ID
      const uint64_t now = now_ns();
      std::lock_guard lock(first_seen_mu);
      std::erase_if(first_seen, [&](const auto& kv) { return now - kv.second > 60'000'000'000ull; });
      if (first_seen.emplace(key, now).second) {
        count(nullptr, &core::Counters::drop_unknown_qp);
        return;
      }
    }
    uint8_t out[wire::kMadLen];
    wire::MadHeader rh;
    rh.tid = h.tid;
    if (attr == wire::CmAttr::Req) {
      wire::CmReq req;
      wire::decode_req(mad, req);
      wire::CmRej rej;
      rej.remote_comm_id = req.local_comm_id;
      rej.message_rejected = wire::kMsgReq;
      rej.reason = wire::kRejInvalidServiceId;
      rh.attr_id = static_cast<uint16_t>(wire::CmAttr::Rej);
      wire::encode_rej(rh, rej, out);
    } else {
      wire::CmSidrReq req;
      wire::decode_sidr_req(mad, req);
      wire::CmSidrRep rep;
      rep.request_id = req.request_id;
      rep.status = 1;  // service ID not supported
      rep.service_id = req.service_id;
      rh.attr_id = static_cast<uint16_t>(wire::CmAttr::SidrRep);
      wire::encode_sidr_rep(rh, rep, out);
    }
    reply(out);
    return;
  }
  uint32_t comm_id = wire::cm_destination_comm_id(mad, h.attr_id);
  auto ep = net::Registry::instance().lookup(comm_id & 0xFFFFFF);
  if (ep && ep->port && !(kill(ep->pid, 0) != 0 && errno == ESRCH)) {
    roce_port_->send(data, len, iface_.ip_be, ep->port);
    count(nullptr, &core::Counters::forwarded);
    return;
  }
  if (attr == wire::CmAttr::Dreq) {
    // A DREQ for a connection nobody here knows (its owner died): IBTA 12.6.10 answers with a DREP.
    wire::CmSimple dreq;
    wire::decode_simple(mad, h.attr_id, dreq);
    wire::CmSimple drep;
    drep.local_comm_id = dreq.remote_comm_id;
    drep.remote_comm_id = dreq.local_comm_id;
    wire::MadHeader rh;
    rh.tid = h.tid;
    rh.attr_id = static_cast<uint16_t>(wire::CmAttr::Drep);
    uint8_t out[wire::kMadLen];
    wire::encode_simple(rh, drep, out);
    reply(out);
    return;
  }
  if (attr == wire::CmAttr::Rep || attr == wire::CmAttr::Rtu) {
    wire::CmRej rej;
    if (attr == wire::CmAttr::Rep) {
      wire::CmRep rep;
      wire::decode_rep(mad, rep);
      rej.remote_comm_id = rep.local_comm_id;
      rej.message_rejected = wire::kMsgRep;
    } else {
      wire::CmSimple rtu;
      wire::decode_simple(mad, h.attr_id, rtu);
      rej.remote_comm_id = rtu.local_comm_id;
      rej.message_rejected = wire::kMsgOther;
    }
    rej.local_comm_id = comm_id;
    rej.reason = wire::kRejInvalidCommId;
    wire::MadHeader rh;
    rh.tid = h.tid;
    rh.attr_id = static_cast<uint16_t>(wire::CmAttr::Rej);
    uint8_t out[wire::kMadLen];
    wire::encode_rej(rh, rej, out);
    reply(out);
    return;
  }
  count(nullptr, &core::Counters::drop_unknown_qp);
}

}  // namespace softrdma::transport
