// librdmacm's objects: rdma_cm ids, event channels and events as the ABI defines them, each id
// holding its CM protocol endpoint (cm::Connection, src/cm) (docs/rdmacm.md).
#pragma once
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <deque>
#include <vector>

#include "cm/cm.h"

#define SOFTRDMA_EXPORT extern "C" __attribute__((visibility("default")))

namespace softrdma::rdmacm {

// A softrdma device as rdma_cm uses it: what the protocol needs, plus the verbs context.
struct Device : cm::Device {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;  // default PD, made on first use
};

struct Event {
  rdma_cm_event ev{};
  uint8_t pdata[256] = {};
  ibv_gid mgid{};  // MULTICAST_JOIN: the group the id's QP is attached to when the event is read
};

struct Channel {
  rdma_event_channel pub;  // first: applications hold &pub
  int write_fd = -1;
  std::deque<Event*> queue;
};

struct Id {
  rdma_cm_id pub{};  // first: applications hold &pub
  cm::Connection conn;  // the protocol endpoint (conn.owner == this)
  bool sync = false;
  // The id made its channel itself (rdma_create_id or rdma_migrate_id without one) and releases it.
  // A synchronous listener's requests share its channel until rdma_get_request gives them their own.
  bool owns_channel = false;
  // The family of the id's addresses as the application gave them: AF_INET6 for "::" and IPv4-mapped
  // addresses, which are carried as IPv4 (docs/rdmacm.md).
  sa_family_t family = AF_INET;
  int afonly = -1;  // RDMA_OPTION_ID_AFONLY (-1: not set; net.ipv6.bindv6only decides)
  int events_out = 0;  // delivered to the application, not yet acked
  // rdma_create_ep on a passive id: what rdma_get_request gives each new connection.
  bool has_ep_attr = false;
  ibv_qp_init_attr ep_attr{};
  ibv_pd* ep_pd = nullptr;
  bool own_cqs = false;
  std::vector<wire::IpAddress> mcast_groups;  // groups joined (IPv4 ones IPv4-mapped)
  // The QP number rdma_connect or rdma_accept gave the peer: the CM thread asks about the connection's
  // QP by number, never through pub.qp, which the application may destroy at any time.
  uint32_t conn_qpn = 0;

  Device* dev() const { return static_cast<Device*>(const_cast<cm::Device*>(conn.dev)); }
};

}  // namespace softrdma::rdmacm
