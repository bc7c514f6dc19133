// The IBTA CM protocol (vol. 1 ch. 12) over wire/cm_mad, as one per-process connection manager: the
// connection state machine, its CM socket, thread and timers, REQ/REP/RTU/DREQ/DREP/REJ/MRA and
// SIDR_REQ/SIDR_REP handling, comm IDs from the host registry, and address resolution (docs/rdmacm.md).
// It knows nothing of librdmacm's ABI or of QPs: src/rdmacm translates rdma_cm ids and events to and
// from Connections and cm::Events, and readies QPs through the Consumer it installs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <poll.h>
#include <unordered_map>
#include <vector>

#include "wire/cm_mad.h"
#include "wire/iwarp.h"

namespace softrdma::cm {

// The Q_Key that UD port spaces use (librdmacm's RDMA_UDP_QKEY).
inline constexpr uint32_t kUdpQkey = 0x01234567;
inline constexpr uint8_t kDefaultMtu = 3;  // IBTA path MTU code: 1024 bytes

// What the protocol needs of the device a connection runs on.
struct Device {
  wire::IpAddress ip;  // its address (an iWARP device's is IPv4)
  uint64_t guid_be = 0;
  uint8_t mtu = kDefaultMtu;  // the port's active MTU (IBTA code)
  uint8_t max_rd_atom = 16;
  // An iWARP device (transport IWARP): its ids connect over TCP + MPA (iwarp.cpp), not CM MADs.
  bool iwarp = false;
  uint16_t max_ird = 16, max_ord = 16;  // max_qp_rd_atom / max_qp_init_rd_atom
};

// ---- iWARP (iwarp.cpp; docs/iwarp.md) -------------------------------------------------------------
inline constexpr size_t kMpaMaxFrame = wire::iwarp::kMpaHeaderLen + wire::iwarp::kMpaMaxPrivateData;
// The most private data rdma_connect/accept/reject take on iWARP: 256 octets of MPA private data
// (what siw takes, RDMA_MAX_PRIVATE_DATA) less the RFC 6581 IRD/ORD words.
inline constexpr size_t kIwarpMaxPrivateData = 256 - wire::iwarp::kMpaEnhancedLen;

// The first-FPDU rule, as softrdma_iwarp_rtr numbers it (verbs/private_abi.h), value for value.
// clang-format off
enum class IwRtr : uint8_t { None = 0, SendWrite = 1, SendRead = 2, SendSend = 3,
                             Await = 4, AwaitWrite = 5, AwaitRead = 6, AwaitSend = 7 };
// clang-format on

// What the consumer hands the QP once the MPA exchange is done (softrdma_iwarp_conn).
struct IwarpConn {
  int fd = -1;  // the connection; the CM keeps it, the QP's owner dup()s what it keeps
  bool crc = false, markers_rx = false, markers_tx = false;
  IwRtr rtr = IwRtr::None;
  bool await_grace = false;  // rtr Await from an initiator without peer-to-peer (IwarpAttach)
  uint32_t ird = 0, ord = 0;
  uint32_t peer_qpn = 0;  // direct path: the peer QP of this host (tuple table hit), 0 if none
  bool rtr_hold = false;  // our RTR waits a moment after the MPA reply (IwarpAttach::rtr_hold)
};

enum class IwStep : uint8_t {
  None,
  Connecting,   // active: non-blocking TCP connect under way
  Refused,      // active: the connect was refused; tried again at deadline_ns (refused_retries left)
  AwaitReply,   // active: MPA request sent (or being sent), reading the reply
  ReqRcvd,      // passive: MPA request read, the application decides
  Established,  // frames exchanged, the QP attached: polled for the peer's close only
  Closed,
};

// One id's TCP connection and MPA exchange.
struct IwarpState {
  IwStep step = IwStep::None;
  uint8_t rx[kMpaMaxFrame];  // the peer's frame as it arrives (exactly its length, never beyond)
  size_t rx_len = 0;
  uint8_t tx[kMpaMaxFrame + wire::iwarp::kMpaEnhancedLen];  // our frame, until the socket took it
  size_t tx_len = 0, tx_off = 0;
  wire::iwarp::MpaFrame peer;  // the peer's frame, parsed (private_data points into rx)
  uint16_t ird = 0, ord = 0;   // ours: offered, then negotiated
  bool crc = false, markers_tx = false;
  IwRtr rtr = IwRtr::None;
  uint32_t qpn = 0;
  uint32_t peer_qpn = 0;
  // The connection's addresses (their 32-bit keys, wire::IpAddress::key: an IPv4 address itself) and
  // ports (network order), once connected; published in the tuple table.
  uint32_t tuple_local_ip = 0, tuple_remote_ip = 0;
  uint16_t tuple_local_port = 0, tuple_remote_port = 0;
  bool published = false;
  bool hup_posted = false;
  uint64_t deadline_ns = 0;
  uint8_t refused_retries = 0;
};

// What the iWARP CM counts (process-wide; softrdma_cm_iwarp_stats in librdmacm's private ABI).
struct IwarpStats {
  std::atomic<uint64_t> mpa_requests_sent{0}, mpa_requests_rcvd{0};
  std::atomic<uint64_t> mpa_bad_frames{0};     // malformed request/reply: key, revision, length, extra bytes
  std::atomic<uint64_t> mpa_timeouts{0};       // no complete frame in time
  std::atomic<uint64_t> mpa_rejects_sent{0}, mpa_rejects_rcvd{0};
  std::atomic<uint64_t> tcp_refused{0};        // connect answered with RST / unreachable
  std::atomic<uint64_t> direct_hits{0};        // tuple table found a local peer QP
  std::atomic<uint64_t> tcp_refused_retries{0};  // refused connects tried again (iw_retry_refused)
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
  // An IPv6 socket (IPV6_V6ONLY) holding the port in IPv6's port space, for a bind to "::" (with sock
  // holding IPv4's unless AFONLY): a listener receives REQs over IPv6 on it.
  int sock6 = -1;
  const Device* dev = nullptr;
  wire::IpAddress local_ip;    // the bound or resolved source address (unset: a wildcard)
  uint16_t local_port = 0;     // the port bound (host order)
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint64_t tid = 0;
  wire::IpAddress peer_ip;
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
  bool iwarp = false;           // TCP + MPA instead of CM MADs; sock is a TCP socket (iwarp.cpp)
  std::unique_ptr<IwarpState> iw;
  // Wire protection (protect.h): the mode agreed (0: none) and the secret the consumer installs on
  // the QP before RTR; the active side keeps its X25519 share, QPN and expected PSN until the REP.
  uint8_t wire_mode = 0;
  uint8_t wire_secret[32] = {};
  bool wire_pending = false;  // active: our REQ carried a share
  uint8_t wire_priv[32] = {}, wire_pub[32] = {};
  uint32_t wire_qpn = 0;
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
  // The device that holds ip; nullptr when none does (unset: opens every device, returns nullptr).
  virtual const Device* device_for_ip(const wire::IpAddress& ip) = 0;
  virtual void event(Connection& c, const Event& e) = 0;
  // Whether the connection has a QP, and moving it to RTR/RTS with c's parameters (0: done).
  virtual bool has_qp(const Connection& c) = 0;
  virtual int ready_qp(Connection& c) = 0;
  // iWARP: the connection's QP number (0: none) and handing it its connection (0 or an errno).
  virtual uint32_t qp_num(const Connection&) { return 0; }
  virtual int attach_iwarp(Connection&, const IwarpConn&) { return EOPNOTSUPP; }
  // Whether ids bound to no device (wildcard, loopback) are iWARP: the first device's transport.
  virtual bool default_iwarp() { return false; }
  // Whether the connection's QP says its peer's process is gone (a peer on another host; its kernel
  // tells: transport/engine.h, peer_gone).
  virtual bool peer_gone(const Connection&) { return false; }
  // A connection refused for a wire protection mismatch (protect.h), by either side: counted.
  virtual void wire_rejected(Connection&) {}
  // A connection the peer ended (a DREQ) or found gone (no DREQ; peer_gone), before it is reported
  // DISCONNECTED: counted.
  virtual void peer_ended(Connection&, bool /*peer_gone*/) {}
  // The process exits (Manager::at_exit), before its connections' DREQs leave: whatever the
  // transport still holds for its peers (an ACK) goes first.
  virtual void before_exit() {}
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
  int bind_port(Connection& c, const wire::IpAddress& ip, uint16_t port_be);
  // A bind to "::": the port in IPv6's port space and, unless v6_only, IPv4's wildcard too (the
  // connections that can come). 0 or an errno.
  int bind_port_v6(Connection& c, bool v6_only, uint16_t port_be);
  int listen(Connection& c);  // binds to the wildcard first if unbound; 0 or an errno
  // Address resolution: the source address (src_ip, or what the route to dst picks), its device,
  // the port bound. 0: resolved; > 0: an errno for an ADDR_ERROR event; < 0: -errno of the bind.
  int resolve_addr(Connection& c, const wire::IpAddress& src_ip, uint16_t src_port_be, const wire::IpAddress& dst_ip);
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
  const IwarpStats& iwarp_stats() const { return iw_stats_; }
  // Connections this process refused, or was refused, for a wire protection mismatch (protect.h).
  uint64_t wire_rejects() const { return wire_rejects_.load(); }

 private:
  // iWARP (iwarp.cpp).
  struct IwAccept {  // a TCP connection accepted on a listener, its MPA request not yet complete
    int fd = -1;
    Connection* listener = nullptr;
    uint8_t rx[kMpaMaxFrame];
    size_t rx_len = 0;
    uint64_t deadline_ns = 0;
  };
  // A non-blocking socket of type bound to (ip, port), as c's rdma_cm port. An IPv6 one is IPv6's
  // alone unless v6_only is false (an iWARP "::": one TCP socket for both families). 0 or an errno.
  int bind_socket(Connection& c, int type, const wire::IpAddress& ip, uint16_t port_be, bool v6_only = true);
  int iw_bind(Connection& c, const wire::IpAddress& ip, uint16_t port_be);
  int iw_bind_any6(Connection& c, bool v6_only, uint16_t port_be);  // "::", dual-stack unless v6_only
  int iw_listen(Connection& c);
  int iw_connect(Connection& c, uint16_t dst_port, const ConnectParams& p);
  int iw_accept(Connection& c, const AcceptParams& p);
  int iw_reject(Connection& c, const void* pdata, uint8_t len);
  void iw_disconnect(Connection& c);
  void iw_destroy(Connection& c);
  void iw_poll_set(std::vector<struct pollfd>& fds, std::vector<void*>& owners, std::vector<uint8_t>& kinds, int& timeout_ms);
  void iw_dispatch(void* owner, uint8_t kind, int fd, short revents);
  void iw_timers(uint64_t now);
  void iw_on_listener(Connection& L);
  void iw_on_accepted(IwAccept& a, short revents);
  void iw_on_active(Connection& c, short revents);
  void iw_start_connect(Connection& c);  // the TCP connect of iw_connect, and of each retry
  bool iw_retry_refused(Connection& c);  // a refused connect: schedule another while retries last
  void iw_on_reply(Connection& c);
  void iw_fail(Connection& c, EventKind kind, int status, bool with_pdata = false);
  bool iw_flush(Connection& c);
  void iw_publish(Connection& c);
  void iw_unpublish(Connection& c);
  uint32_t iw_lookup_peer(Connection& c);
  std::vector<std::unique_ptr<IwAccept>> iw_accepts_;
  IwarpStats iw_stats_;

  Manager();
  void loop();
  void at_exit();
  void timers();
  // CLOCK_MONOTONIC in ns (net::SystemClock), for the CM's and MPA's deadlines.
  static uint64_t now_ns();
  uint32_t alloc_comm_id(Connection& c);
  void release_comm_id(Connection& c);
  void send_mad(Connection& c, const uint8_t* mad, bool request);
  void send_to(const wire::IpAddress& dst_ip, uint16_t dst_port, const wire::IpAddress& src_ip, const uint8_t* mad);
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

  // Wire protection (protect.h): the REJ for a mismatch, counted and told to the consumer.
  void wire_reject(Connection& c, uint8_t msg);
  std::atomic<uint64_t> wire_rejects_{0};

  Consumer* consumer_ = nullptr;
  std::vector<Connection*> conns_;
  std::unordered_map<uint32_t, Connection*> by_comm_;
  int sock_ = -1;
  // The same port in IPv6's port space (IPV6_V6ONLY), for MADs to and from IPv6 peers (-1: no IPv6).
  int sock6_ = -1;
  uint16_t sock_port_ = 0;
  int wake_fd_ = -1;
  // Passes of the CM thread out of poll(): a socket it polls stays bound until poll returns (the kernel
  // holds the file while polling), so destroy waits for one pass before its port is free.
  uint64_t loop_gen_ = 0;
  std::condition_variable loop_cv_;
  uint64_t last_liveness_ns_ = 0;
};

// Address resolution: the source address the kernel's route would use for dst (UDP connect +
// getsockname). 0 or an errno.
int route_source(const wire::IpAddress& dst_ip, uint16_t dst_port_be, wire::IpAddress& src_ip);

// What the 4791 holder (transport/gsi.cpp) answers, as a dead process's kernel CM would, for a MAD to
// this host that no live process takes: REQ -> REJ "invalid service ID", SIDR_REQ -> SIDR_REP
// "service ID not supported", DREQ -> DREP, REP/RTU -> REJ "invalid comm ID". Fills out (a whole MAD)
// and returns true, or false when the MAD gets no answer.
bool answer_unowned(const uint8_t* mad, uint8_t* out);

}  // namespace softrdma::cm
