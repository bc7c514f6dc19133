// The IBTA CM protocol (vol. 1 ch. 12) over wire/cm_mad, as one per-process connection manager: the
// connection state machine, its CM socket, thread and timers, REQ/REP/RTU/DREQ/DREP/REJ/MRA and
// SIDR_REQ/SIDR_REP handling, comm IDs from the host registry, and address resolution (docs/rdmacm.md).
// It knows nothing of librdmacm's ABI or of QPs: src/rdmacm translates rdma_cm ids and events to and
// from Connections and cm::Events, and readies QPs through the Consumer it installs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "wire/cm_mad.h"

namespace softrdma::cm {

// The Q_Key that UD port spaces use (librdmacm's RDMA_UDP_QKEY).
inline constexpr uint32_t kUdpQkey = 0x01234567;
inline constexpr uint8_t kDefaultMtu = 3;  // IBTA path MTU code: 1024 bytes

// What the protocol needs of the device a connection runs on.
struct Device {
  uint32_t ip_be = 0;
  uint64_t guid_be = 0;
  uint8_t mtu = kDefaultMtu;  // the port's active MTU (IBTA code)
  uint8_t max_rd_atom = 16;
};

// Connection states, after the kernel's rdma_cm.
enum class St {
  Idle, Bound, AddrResolved, RouteResolved, Listen, ReqSent, RepRcvd, ReqRcvd, RepSent, Connected,
  DreqSent, Disconnected, Rejected, Failed,
};

// One endpoint of a connection (an rdma_cm id's protocol half). Owned by the consumer; registered
// with the Manager from creation to Manager::destroy.
struct Connection {
  void* owner = nullptr;  // the consumer's object
  St st = St::Idle;
  bool ud = false;             // a datagram port space: SIDR instead of REQ/REP/RTU
  uint16_t port_space = 0;     // for IP service IDs
  int sock = -1;  // UDP socket holding this endpoint's port (and receiving REQs while listening)
  const Device* dev = nullptr;
  uint32_t local_ip_be = 0;    // the bound or resolved source address
  uint16_t local_port = 0;     // the port bound (host order)
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint64_t tid = 0;
  uint32_t peer_ip_be = 0;
  uint16_t peer_port = 0;      // the peer's rdma_cm port (from the REQ's IP header)
  bool peer_local = false;
  uint16_t service_port = 0;  // own port; active side: the port the REQ names
  // Negotiated transport parameters.
  uint32_t remote_qpn = 0;
  uint32_t remote_psn = 0, my_psn = 0;  // our QP's rq_psn and sq_psn
  uint8_t mtu = kDefaultMtu;
  uint8_t resp_res = 0, init_depth = 0;  // what our QP accepts / issues (max_dest_rd_atomic / max_rd_atomic)
  uint8_t retry_count = 7, rnr_retry = 7, ack_timeout = 17;
  uint8_t ack_timeout_opt = 0xFF;  // set by the consumer (rdma_set_option ACK_TIMEOUT)
  // The last request MAD, resent until answered.
  uint8_t last_mad[wire::kMadLen];
  bool awaiting = false;
  int listener_probes = 0;  // REQ held back: no socket holds the service port yet (see connect)
  uint64_t deadline_ns = 0;
  int retries_left = 0;
  Connection* listener = nullptr;
  bool passive = false;         // made by a REQ (its last_mad is our REP)
  uint64_t next_probe_ns = 0;   // connected to another host: when to check on the peer next
};

enum class EventKind {
  ConnectRequest, ConnectResponse, ConnectError, Unreachable, Rejected, Established, Disconnected,
};

// What a MAD told a connection, for the consumer to deliver.
struct Event {
  EventKind kind;
  int status = 0;
  const uint8_t* private_data = nullptr;
  uint8_t private_data_len = 0;
  Connection* listener = nullptr;  // ConnectRequest: the listening endpoint
  // The peer's connection parameters (REQ/REP), from the receiver's point of view.
  uint8_t responder_resources = 0, initiator_depth = 0;
  bool flow_control = false, srq = false;
  uint8_t retry_count = 0, rnr_retry_count = 0;
  uint32_t qp_num = 0;
  uint32_t qkey = 0;  // SIDR_REP
};

// The consumer (librdmacm's ABI layer). Called on the CM thread under Manager::mu.
class Consumer {
 public:
  virtual ~Consumer() = default;
  // A REQ or SIDR_REQ for listener: the consumer makes the passive endpoint (nullptr: dropped).
  virtual Connection* make_passive(Connection& listener) = 0;
  virtual void discard(Connection& c) = 0;  // a passive endpoint that could not be set up
  // The device that holds ip (0: open every device, return any); nullptr when none does.
  virtual const Device* device_for_ip(uint32_t ip_be) = 0;
  virtual void event(Connection& c, const Event& e) = 0;
  // Whether the connection has a QP, and moving it to RTR/RTS with c's parameters (0: done).
  virtual bool has_qp(const Connection& c) = 0;
  virtual int ready_qp(Connection& c) = 0;
};

// What the active side asks for (rdma_connect's parameters).
struct ConnectParams {
  const void* private_data = nullptr;
  uint8_t private_data_len = 0;
  uint8_t responder_resources = 0, initiator_depth = 0;
  uint8_t retry_count = 7, rnr_retry_count = 7;
  bool flow_control = false, srq = false;
  uint32_t qpn = 0;
  bool uc = false;  // transport service UC instead of RC
};
inline constexpr uint8_t kMaxRdAtomic = 0xFF;  // responder_resources / initiator_depth: "the most"

// What the passive side answers with (rdma_accept's parameters, already within the device's limits).
struct AcceptParams {
  const void* private_data = nullptr;
  uint8_t responder_resources = kMaxRdAtomic, initiator_depth = kMaxRdAtomic;
  uint8_t private_data_len = 0;
  uint32_t qpn = 0;
  bool flow_control = false, srq = false;
  uint8_t rnr_retry_count = 7;
};

class Manager {
 public:
  static Manager& get();  // the process's one manager (its thread starts with it)
  std::mutex mu;          // all connection state, and the consumer's own, sits under it

  void set_consumer(Consumer* c) { consumer_ = c; }
  void add(Connection* c) { conns_.push_back(c); }
  const std::vector<Connection*>& connections() const { return conns_; }

  // Binds c's UDP socket (its port is the rdma_cm port; docs/rdmacm.md "port space"). 0 or an errno.
  int bind_port(Connection& c, uint32_t ip_be, uint16_t port_be);
  int listen(Connection& c);  // binds to the wildcard first if unbound; 0 or an errno
  // Address resolution: the source address (src_ip_be, or what the route to dst picks), its device,
  // the port bound. 0: resolved; > 0: an errno for an ADDR_ERROR event; < 0: -errno of the bind.
  int resolve_addr(Connection& c, uint32_t src_ip_be, uint16_t src_port_be, uint32_t dst_ip_be);
  int resolve_route(Connection& c);  // RoCE has no SA: the path is the two GIDs and the port's MTU
  // The active side. connect sends the REQ (SIDR_REQ for UD); the REP/SIDR_REP arrives as an event.
  int connect(Connection& c, uint16_t dst_port, const ConnectParams& p);  // 0 or an errno
  // The passive side: readies the QP and sends REP (SIDR_REP "valid QP" for UD); reject sends REJ
  // consumer-defined (SIDR_REP "rejected"). 0 or an errno.
  int accept(Connection& c, const AcceptParams& p);
  int reject(Connection& c, const void* pdata, uint8_t len);
  int establish(Connection& c);  // RTU after CONNECT_RESPONSE (no QP at REP time)
  void disconnect(Connection& c);
  // Unregisters c, answering for it as destroy does (DREQ, REJ, SIDR_REP), and closes its socket; the
  // lock is held by the caller and released while waiting for the CM thread to let go of the socket.
  void destroy(Connection& c, std::unique_lock<std::mutex>& lock);
  void wake();

 private:
  Manager();
  void loop();
  void at_exit();
  void timers();
  uint32_t alloc_comm_id(Connection& c);
  void release_comm_id(Connection& c);
  void send_mad(Connection& c, const uint8_t* mad, bool request);
  void send_to(uint32_t dst_ip, uint16_t dst_port, uint32_t src_ip, const uint8_t* mad);
  void receive(int fd, Connection* listener);
  void on_mad(const uint8_t* mad, Connection* listener);
  void on_req(const wire::MadHeader& h, const uint8_t* mad, Connection* listener);
  void on_sidr_req(const wire::MadHeader& h, const uint8_t* mad, Connection* listener);
  void on_sidr_rep(Connection& c, const uint8_t* mad);
  void send_sidr_rep(Connection& c, uint8_t status, uint32_t qpn, const void* pdata, uint8_t len);
  void send_simple(Connection& c, wire::CmAttr attr, uint64_t tid, uint32_t remote_qpn, bool request);
  void send_dreq(Connection& c);
  void send_rtu(Connection& c);  // answers the REP of c's connection (tid of its REQ)
  void send_rej(Connection& c, uint16_t reason, uint8_t msg, const void* pdata, uint8_t len);
  void post(Connection& c, Event e);

  Consumer* consumer_ = nullptr;
  std::vector<Connection*> conns_;
  std::unordered_map<uint32_t, Connection*> by_comm_;
  int sock_ = -1;
  uint16_t sock_port_ = 0;
  int wake_fd_ = -1;
  // Passes of the CM thread out of poll(): a socket it polls stays bound until poll returns (the kernel
  // holds the file while polling), so destroy waits for one pass before its port is free.
  uint64_t loop_gen_ = 0;
  std::condition_variable loop_cv_;
  uint64_t last_liveness_ns_ = 0;
};

// Address resolution: the source address the kernel's route would use for dst (UDP connect +
// getsockname), network order. 0 or an errno.
int route_source(uint32_t dst_ip_be, uint16_t dst_port_be, uint32_t& src_ip_be);
// Whether ip is one of this host's addresses (a peer here is reached straight at its socket).
bool is_local(uint32_t ip_be);

// What the 4791 holder (transport/gsi.cpp) answers, as a dead process's kernel CM would, for a MAD to
// this host that no live process takes: REQ -> REJ "invalid service ID", SIDR_REQ -> SIDR_REP
// "service ID not supported", DREQ -> DREP, REP/RTU -> REJ "invalid comm ID". Fills out (a whole MAD)
// and returns true, or false when the MAD gets no answer.
bool answer_unowned(const uint8_t* mad, uint8_t* out);

}  // namespace softrdma::cm
