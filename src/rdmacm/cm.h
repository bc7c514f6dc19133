// librdmacm internals: rdma_cm ids, event channels and the per-process connection manager (docs/rdmacm.md).
#pragma once
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "wire/cm_mad.h"

#define SOFTRDMA_EXPORT extern "C" __attribute__((visibility("default")))

namespace softrdma::rdmacm {

struct Device {
  ibv_context* ctx = nullptr;
  uint32_t ip_be = 0;
  uint64_t guid_be = 0;
  ibv_mtu mtu = IBV_MTU_1024;
  uint8_t max_rd_atom = 16;
  ibv_pd* pd = nullptr;  // default PD, made on first use
};

struct Id;
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

// Connection states, after the kernel's rdma_cm.
enum class St {
  Idle, Bound, AddrResolved, RouteResolved, Listen, ReqSent, RepRcvd, ReqRcvd, RepSent, Connected,
  DreqSent, Disconnected, Rejected, Failed,
};

struct Id {
  rdma_cm_id pub{};  // first: applications hold &pub
  bool sync = false;
  St st = St::Idle;
  int sock = -1;  // UDP socket holding this id's port (and receiving REQs while listening)
  Device* dev = nullptr;
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint64_t tid = 0;
  uint32_t peer_ip_be = 0;
  bool peer_local = false;
  uint16_t service_port = 0;  // active side: the port the REQ names
  // Negotiated transport parameters.
  uint32_t remote_qpn = 0;
  uint32_t remote_psn = 0, my_psn = 0;  // our QP's rq_psn and sq_psn
  uint8_t mtu = IBV_MTU_1024;
  uint8_t resp_res = 0, init_depth = 0;  // what our QP accepts / issues (max_dest_rd_atomic / max_rd_atomic)
  uint8_t retry_count = 7, rnr_retry = 7, ack_timeout = 17;
  uint8_t ack_timeout_opt = 0xFF;  // rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)
  // The last request MAD, resent until answered.
  uint8_t last_mad[wire::kMadLen];
  bool awaiting = false;
  int listener_probes = 0;  // REQ held back: no socket holds the service port yet (see rdma_connect)
  uint64_t deadline_ns = 0;
  int retries_left = 0;
  Id* listener = nullptr;
  int events_out = 0;  // delivered to the application, not yet acked
  // rdma_create_ep on a passive id: what rdma_get_request gives each new connection.
  bool has_ep_attr = false;
  ibv_qp_init_attr ep_attr{};
  ibv_pd* ep_pd = nullptr;
  bool own_cqs = false;
  std::vector<uint32_t> mcast_groups;  // IPv4 groups joined (network order)
  bool passive = false;                // made by a REQ (its last_mad is our REP)
  uint64_t next_probe_ns = 0;          // connected to another host: when to check on the peer next
};

}  // namespace softrdma::rdmacm
