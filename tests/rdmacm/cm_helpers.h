// The helpers of the rdma_cm tests, shared by tests/rdmacm/cm_test.cpp (RoCE) and
// tests/rdmacm/iwarp/iwarp_cm_test.cpp (iWARP; the build puts this folder on its include path):
// addresses, bounded event waits, and the cm ids with their verbs resources (Side, Listener,
// Client). Only the public <rdma/rdma_cma.h> / <infiniband/verbs.h> API, and librdmacm's private
// softrdma_cm_set_option, which gives this process settings without the environment.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

// librdmacm's private ABI (version node SOFTRDMA_PRIVATE_1, src/rdmacm/cma.cpp): sets a SOFTRDMA_*
// variable for this process's librdmacm and libibverbs, over the environment (nullptr: the
// environment's value again; "": the default). 0 or EINVAL.
extern "C" int softrdma_cm_set_option(const char* name, const char* value);

namespace softrdma::cm_test {

// One of the process's settings for a scope (softrdma_cm_set_option), the environment's after it.
struct CmOption {
  const char* name;
  int rc;
  CmOption(const char* n, const char* value) : name(n), rc(softrdma_cm_set_option(n, value)) {}
  ~CmOption() { softrdma_cm_set_option(name, nullptr); }
  CmOption(const CmOption&) = delete;
  CmOption& operator=(const CmOption&) = delete;
};

inline constexpr int kWaitMs = 20000;  // bound on every wait: fail instead of hanging
inline constexpr const char* kIp = "127.0.0.1";

inline sockaddr_in addr(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

inline sockaddr_in6 addr6(const char* ip, uint16_t port) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(port);
  inet_pton(AF_INET6, ip, &a.sin6_addr);
  return a;
}

// The address of an rdma_cm address slot as text, either family.
inline std::string str_of(const sockaddr* a) {
  char s[INET6_ADDRSTRLEN] = {};
  if (a->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, s, sizeof s);
  else
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a)->sin_addr, s, sizeof s);
  return s;
}

// The next event on ch (nullptr after timeout_ms). The caller acks it.
inline rdma_cm_event* next_event(rdma_event_channel* ch, int timeout_ms = kWaitMs) {
  pollfd p{ch->fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return nullptr;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev)) return nullptr;
  return ev;
}

// An event for a failure message: its name and status.
inline std::string name(const rdma_cm_event* ev) {
  return ev ? std::string(rdma_event_str(ev->event)) + " status " + std::to_string(ev->status) : "no event";
}

// Connection parameters for rdma_connect / rdma_accept: private data (data, len), responder
// resources, initiator depth and the retry counts; every other field zero.
inline rdma_conn_param conn_param(const void* data, size_t len, uint8_t resources, uint8_t depth,
                                  uint8_t retry = 0, uint8_t rnr_retry = 0) {
  rdma_conn_param p{};
  p.private_data = data;
  p.private_data_len = static_cast<uint8_t>(len);
  p.responder_resources = resources;
  p.initiator_depth = depth;
  p.retry_count = retry;
  p.rnr_retry_count = rnr_retry;
  return p;
}

// One signaled work request of one SGE: a receive, or a send of opcode op. 0 or ibv_post_*'s error.
inline int post_recv_one(ibv_qp* qp, ibv_sge sge, uint64_t wr_id) {
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}
inline int post_send_one(ibv_qp* qp, ibv_sge sge, uint64_t wr_id, ibv_wr_opcode op = IBV_WR_SEND) {
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

// Connects id (no private data, one read each way, retries 7) and returns the id that the listener's
// channel listen_ch announces in CONNECT_REQUEST (nullptr if another event or none came).
inline rdma_cm_id* connect_for_request(rdma_cm_id* id, rdma_event_channel* listen_ch) {
  rdma_conn_param cp = conn_param(nullptr, 0, 1, 1, 7, 7);
  if (rdma_connect(id, &cp)) return nullptr;
  rdma_cm_event* ev = next_event(listen_ch);
  rdma_cm_id* child = ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? ev->id : nullptr;
  if (ev) rdma_ack_cm_event(ev);
  return child;
}

// Accepts child (no private data, one read each way, rnr_retry 7) and waits for ESTABLISHED on the
// active side's channel: "" when it came, else what came instead.
inline std::string accept_until_established(rdma_cm_id* child, rdma_event_channel* active_ch) {
  rdma_conn_param ap = conn_param(nullptr, 0, 1, 1, 0, 7);
  if (rdma_accept(child, &ap)) return "rdma_accept failed";
  rdma_cm_event* ev = next_event(active_ch);
  const bool ok = ev && ev->event == RDMA_CM_EVENT_ESTABLISHED;
  std::string what = ok ? "" : name(ev);
  if (ev) rdma_ack_cm_event(ev);
  return what;
}

// One side's verbs resources on a cm id: one CQ, a QP, a registered buffer, and a PD of its own
// unless own_pd is false (then the id's: rdma_create_qp without one, as the iWARP tests do).
struct Side {
  rdma_cm_id* id = nullptr;
  ibv_pd* pd = nullptr;  // the PD this side allocated (nullptr when it uses the id's)
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> buf;
  unsigned poll_pause_us = 0;  // poll_one's pause after an empty poll (0: it spins)

  bool setup(rdma_cm_id* cm_id, size_t len, ibv_qp_type type = IBV_QPT_RC, bool own_pd = true) {
    id = cm_id;
    buf.assign(len, 0);
    if (own_pd && !(pd = ibv_alloc_pd(id->verbs))) return false;
    cq = ibv_create_cq(id->verbs, 16, nullptr, nullptr, 0);
    if (!cq) return false;
    mr = ibv_reg_mr(own_pd ? pd : id->pd, buf.data(), len,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
    ibv_qp_init_attr qa{};
    qa.send_cq = qa.recv_cq = cq;
    qa.qp_type = type;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 8;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    return mr && rdma_create_qp(id, pd, &qa) == 0;
  }
  // Frees the QP and the rest; the id itself stays (its owner destroys it afterwards).
  void release() {
    if (id && id->qp) rdma_destroy_qp(id);
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
    id = nullptr;
    mr = nullptr;
    cq = nullptr;
    pd = nullptr;
  }
  ~Side() { release(); }
  ibv_sge sge(size_t off, size_t len) const {
    return ibv_sge{reinterpret_cast<uint64_t>(buf.data() + off), static_cast<uint32_t>(len), mr->lkey};
  }
  // Polls one completion (status IBV_WC_GENERAL_ERR + 1000 when none comes within kWaitMs).
  ibv_wc poll_one() {
    ibv_wc wc{};
    wc.status = static_cast<ibv_wc_status>(IBV_WC_GENERAL_ERR + 1000);
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
    while (std::chrono::steady_clock::now() < end) {
      if (ibv_poll_cq(cq, 1, &wc) == 1) break;
      if (poll_pause_us) usleep(poll_pause_us);
    }
    return wc;
  }
};

// An id on its own event channel, destroyed with it; addresses of either family.
struct Id {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  Id() {
    if (ch) rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP);
  }
  ~Id() {
    if (id) rdma_destroy_id(id);
    if (ch) rdma_destroy_event_channel(ch);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  int afonly(int on) { return rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &on, sizeof on); }
  template <typename A>
  int bind(const A& a) {
    return rdma_bind_addr(id, reinterpret_cast<sockaddr*>(const_cast<A*>(&a)));
  }
  // Resolves address and route to dst; true when both events came without error.
  template <typename A>
  bool resolve(const A& dst) {
    if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(const_cast<A*>(&dst)), 2000)) return false;
    for (rdma_cm_event_type want : {RDMA_CM_EVENT_ADDR_RESOLVED, RDMA_CM_EVENT_ROUTE_RESOLVED}) {
      if (want == RDMA_CM_EVENT_ROUTE_RESOLVED && rdma_resolve_route(id, 2000)) return false;
      rdma_cm_event* ev = next_event(ch);
      const bool ok = ev && ev->event == want && ev->status == 0;
      if (ev) rdma_ack_cm_event(ev);
      if (!ok) return false;
    }
    return true;
  }
};

// A listener on 127.0.0.1, at port at (0: an ephemeral one).
struct Listener {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  uint16_t port = 0;
  explicit Listener(rdma_port_space ps = RDMA_PS_TCP, uint16_t at = 0) {
    if (!ch || rdma_create_id(ch, &id, nullptr, ps)) return;
    sockaddr_in a = addr(kIp, at);
    if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)) || rdma_listen(id, 8)) return;
    port = ntohs(rdma_get_src_port(id));
  }
  ~Listener() {
    if (id) rdma_destroy_id(id);
    if (ch) rdma_destroy_event_channel(ch);
  }
};

// An active id with its route resolved to 127.0.0.1:port.
struct Client {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  bool resolve(uint16_t port, rdma_port_space ps = RDMA_PS_TCP) {
    if (!ch || rdma_create_id(ch, &id, nullptr, ps)) return false;
    sockaddr_in a = addr(kIp, port);
    if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&a), 2000)) return false;
    rdma_cm_event* ev = next_event(ch);
    bool ok = ev && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->status == 0;
    if (ev) rdma_ack_cm_event(ev);
    if (!ok || rdma_resolve_route(id, 2000)) return false;
    ev = next_event(ch);
    ok = ev && ev->event == RDMA_CM_EVENT_ROUTE_RESOLVED && ev->status == 0;
    if (ev) rdma_ack_cm_event(ev);
    return ok && id->verbs != nullptr;
  }
  ~Client() {
    if (id) rdma_destroy_id(id);
    if (ch) rdma_destroy_event_channel(ch);
  }
};

}  // namespace softrdma::cm_test
