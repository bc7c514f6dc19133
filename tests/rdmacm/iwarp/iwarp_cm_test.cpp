// rdma_cm on iWARP devices (docs/iwarp.md): TCP connect/accept plus the MPA request/reply, with
// private data both ways, reject, refused and silent peers, disconnect from either side, IRD/ORD and
// RTR negotiation checked on the wire against a hand-written TCP peer, and hostile TCP clients at a
// listener; data between two local QPs (the direct path). Runs with SOFTRDMA_TRANSPORT=iwarp.
// Only the public rdma_cm API, plus librdmacm's private ABI: softrdma_cm_iwarp_stats for counters and
// softrdma_cm_set_option (cm_helpers.h) for the process's settings.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cm_helpers.h"

extern "C" int softrdma_cm_iwarp_stats(uint64_t* values, unsigned n);

namespace {

// Before any rdma_* call: the CM reads these when it opens devices and arms MPA timers. The
// process's settings (librdmacm's and libibverbs'), not the environment.
const int options_rc = softrdma_cm_set_option("SOFTRDMA_TRANSPORT", "iwarp") |
                       softrdma_cm_set_option("SOFTRDMA_MPA_TIMEOUT_MS", "1500");

namespace cmt = softrdma::cm_test;  // the helpers shared with tests/rdmacm/cm_test.cpp
using cmt::addr;
using cmt::conn_param;
using cmt::kIp;
using cmt::kWaitMs;
using cmt::Listener;
using cmt::name;
using cmt::next_event;

enum Stat {
  kReqSent, kReqRcvd, kBadFrames, kTimeouts, kRejSent, kRejRcvd, kRefused, kDirectHits, kRefusedRetries,
  kNStats
};
struct Stats {
  uint64_t v[kNStats] = {};
  Stats() { softrdma_cm_iwarp_stats(v, kNStats); }
  uint64_t operator[](Stat s) const { return v[s]; }
};

// An iWARP side: the id's PD (rdma_create_qp without one), a 16 KiB buffer, a pause between polls.
struct Side : cmt::Side {
  Side() { poll_pause_us = 100; }
  bool setup(rdma_cm_id* cm_id) { return cmt::Side::setup(cm_id, 16384, IBV_QPT_RC, false); }
};

// A client whose Side is set up on its id once the route is resolved (unless qp is false). The
// Side, a member, is released before the base destroys the id.
struct Client : cmt::Client {
  Side side;
  bool resolve(uint16_t port, bool qp = true) { return cmt::Client::resolve(port) && (!qp || side.setup(id)); }
};

// The tests against a hand-written peer use ids without QPs: the CM protocol alone (a QP would need
// a real iWARP peer for its FPDUs).

// ---- a hand-written MPA peer over a plain TCP socket ----------------------------------------------
const char kReqKey[] = "MPA ID Req Frame";
const char kRepKey[] = "MPA ID Rep Frame";

struct Frame {
  std::string key;
  uint16_t bits = 0;      // M C R E flags and revision
  uint16_t ird_word = 0, ord_word = 0;
  std::vector<uint8_t> pdata;  // after the enhanced words
};

std::vector<uint8_t> frame_bytes(const char* key, uint16_t bits, bool enhanced, uint16_t ird_word, uint16_t ord_word,
                                 const std::vector<uint8_t>& pdata) {
  std::vector<uint8_t> b(key, key + 16);
  b.push_back(bits >> 8);
  b.push_back(bits & 0xFF);
  uint16_t len = static_cast<uint16_t>(pdata.size() + (enhanced ? 4 : 0));
  b.push_back(len >> 8);
  b.push_back(len & 0xFF);
  if (enhanced) {
    b.push_back(ird_word >> 8);
    b.push_back(ird_word & 0xFF);
    b.push_back(ord_word >> 8);
    b.push_back(ord_word & 0xFF);
  }
  b.insert(b.end(), pdata.begin(), pdata.end());
  return b;
}

bool read_exact(int fd, uint8_t* p, size_t n) {
  while (n) {
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, kWaitMs) != 1) return false;
    ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool read_frame(int fd, Frame& f) {
  uint8_t h[20];
  if (!read_exact(fd, h, 20)) return false;
  f.key.assign(reinterpret_cast<char*>(h), 16);
  f.bits = static_cast<uint16_t>(h[16] << 8 | h[17]);
  uint16_t len = static_cast<uint16_t>(h[18] << 8 | h[19]);
  std::vector<uint8_t> body(len);
  if (len && !read_exact(fd, body.data(), len)) return false;
  size_t off = 0;
  if (f.bits & 0x1000) {
    if (len < 4) return false;
    f.ird_word = static_cast<uint16_t>(body[0] << 8 | body[1]);
    f.ord_word = static_cast<uint16_t>(body[2] << 8 | body[3]);
    off = 4;
  }
  f.pdata.assign(body.begin() + static_cast<long>(off), body.end());
  return true;
}

// A TCP listener on 127.0.0.1 that plays the MPA responder by hand.
struct RawServer {
  int lfd = -1;
  uint16_t port = 0;
  RawServer() {
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = addr(kIp, 0);
    socklen_t l = sizeof a;
    if (bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) || listen(lfd, 4) ||
        getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &l))
      return;
    port = ntohs(a.sin_port);
  }
  int accept_one() {
    pollfd p{lfd, POLLIN, 0};
    if (poll(&p, 1, kWaitMs) != 1) return -1;
    return accept(lfd, nullptr, nullptr);
  }
  ~RawServer() {
    if (lfd >= 0) close(lfd);
  }
};

int raw_connect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = addr(kIp, port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::vector<uint8_t>& b) {
  return send(fd, b.data(), b.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(b.size());
}

// Whether the peer closed fd (EOF) within kWaitMs.
bool sees_eof(int fd) {
  uint8_t b[64];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, kWaitMs) != 1) return false;
    ssize_t r = recv(fd, b, sizeof b, 0);
    if (r <= 0) return true;
  }
}

// The direct path is off and keeps local peers on TCP FPDUs: SOFTRDMA_DIRECT=0 (ctest
// rdmacm.iwarp_tcp_path), or SOFTRDMA_IMPAIR without SOFTRDMA_DIRECT (ctest rdmacm.iwarp_impaired),
// as for the contexts.
bool direct_off() {
  const char* direct = getenv("SOFTRDMA_DIRECT");
  const char* impair = getenv("SOFTRDMA_IMPAIR");
  return direct && *direct ? !strcmp(direct, "0") : impair && *impair;
}

// Connects a Client to L with private data, accepts with private data; returns the passive id.
rdma_cm_id* connect_pair(Listener& L, Client& C, Side& ss, rdma_conn_param cp, rdma_conn_param ap,
                         rdma_cm_event* req_out = nullptr) {
  if (rdma_connect(C.id, &cp)) return nullptr;
  rdma_cm_event* ev = next_event(L.ch);
  if (!ev || ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
    ADD_FAILURE() << name(ev);
    return nullptr;
  }
  if (req_out) *req_out = *ev;
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  if (!ss.setup(child) || rdma_accept(child, &ap)) return nullptr;
  return child;
}

// The process's settings above were taken, and the devices librdmacm lists are iWARP ones.
TEST(IwarpCm, ProcessSettings) {
  EXPECT_EQ(options_rc, 0);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_GT(n, 0);
  for (int i = 0; i < n; ++i) EXPECT_EQ(list[i]->transport_type, IBV_TRANSPORT_IWARP) << list[i]->name;
  ibv_free_device_list(list);
}

TEST(IwarpCm, ConnectAcceptPrivateDataBothWays) {
  Listener L;
  ASSERT_NE(L.port, 0);
  Client C;
  ASSERT_TRUE(C.resolve(L.port));
  Stats before;
  const char hello[] = "iwarp-client-hello";
  rdma_conn_param cp = conn_param(hello, sizeof hello, 4, 2);
  ASSERT_EQ(rdma_connect(C.id, &cp), 0);

  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) << name(ev);
  EXPECT_EQ(ev->listen_id, L.id);
  // Exactly the client's private data: iWARP carries no rdma_cm header and no padding.
  ASSERT_EQ(ev->param.conn.private_data_len, sizeof hello);
  EXPECT_EQ(memcmp(ev->param.conn.private_data, hello, sizeof hello), 0);
  EXPECT_EQ(ev->param.conn.initiator_depth, 4);      // READs we may issue: the client's IRD
  EXPECT_EQ(ev->param.conn.responder_resources, 2);  // READs it issues: its ORD
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  EXPECT_EQ(ntohs(rdma_get_src_port(child)), L.port);
  EXPECT_EQ(rdma_get_dst_port(child), rdma_get_src_port(C.id));
  Side ss;
  ASSERT_TRUE(ss.setup(child));
  const char welcome[] = "iwarp-server-accepts-you";
  rdma_conn_param ap = conn_param(welcome, sizeof welcome, 2, 3);
  ASSERT_EQ(rdma_accept(child, &ap), 0);
  ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->id == child) << name(ev);
  rdma_ack_cm_event(ev);
  ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED) << name(ev);
  ASSERT_EQ(ev->param.conn.private_data_len, sizeof welcome);
  EXPECT_EQ(memcmp(ev->param.conn.private_data, welcome, sizeof welcome), 0);
  // As the kernel's cma_iw_handler reports them: negotiated IRD, ORD (client IRD 4 against the
  // server's ORD 3, client ORD 2 within the server's IRD 2).
  EXPECT_EQ(ev->param.conn.initiator_depth, 3);
  EXPECT_EQ(ev->param.conn.responder_resources, 2);
  rdma_ack_cm_event(ev);
  Stats after;
  EXPECT_EQ(after[kReqSent] - before[kReqSent], 1u);
  EXPECT_EQ(after[kReqRcvd] - before[kReqRcvd], 1u);
  // Both ends are this host's softrdma: each found the other's QP in the tuple table.
  EXPECT_EQ(after[kDirectHits] - before[kDirectHits], direct_off() ? 0u : 2u);
  ss.release();
  EXPECT_EQ(rdma_destroy_id(child), 0);
}

TEST(IwarpCm, RejectCarriesPrivateData) {
  Listener L;
  Client C;
  ASSERT_TRUE(C.resolve(L.port));
  Stats before;
  rdma_conn_param cp{};
  ASSERT_EQ(rdma_connect(C.id, &cp), 0);
  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) << name(ev);
  EXPECT_EQ(ev->param.conn.private_data_len, 0);
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  const char why[] = "iwarp-server-busy";
  // At most 256 octets of MPA private data, the 4 of RFC 6581 included (siw's limit).
  std::vector<uint8_t> big(253, 0x5A);
  EXPECT_EQ(rdma_reject(child, big.data(), static_cast<uint8_t>(big.size())), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_conn_param ap{};
  ap.private_data = big.data();
  ap.private_data_len = static_cast<uint8_t>(big.size());
  EXPECT_EQ(rdma_accept(child, &ap), -1);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(rdma_reject(child, why, sizeof why), 0);
  EXPECT_EQ(rdma_reject(child, nullptr, 0), -1);  // once only
  ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_REJECTED) << name(ev);
  EXPECT_EQ(ev->status, -ECONNRESET);  // an MPA reject, as iw_cm reports siw's
  ASSERT_EQ(ev->param.conn.private_data_len, sizeof why);
  EXPECT_EQ(memcmp(ev->param.conn.private_data, why, sizeof why), 0);
  rdma_ack_cm_event(ev);
  Stats after;
  EXPECT_EQ(after[kRejSent] - before[kRejSent], 1u);
  EXPECT_EQ(after[kRejRcvd] - before[kRejRcvd], 1u);
  EXPECT_EQ(rdma_destroy_id(child), 0);
}

// A TCP port of this host that is bound but not listening, held for as long as the object lives: a
// connect to it is refused, and no other socket (a parallel test, or the client's own ephemeral port)
// can take it meanwhile.
struct RefusingPort {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  uint16_t port = 0;
  RefusingPort() {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a = addr(kIp, 0);
    socklen_t l = sizeof a;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l) == 0)
      port = ntohs(a.sin_port);
  }
  void release() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  ~RefusingPort() { release(); }
};

// Resolves C to refusing's port (a fatal failure when it has none or the resolve fails).
static void resolve_to(const RefusingPort& refusing, Client& C) {
  ASSERT_NE(refusing.port, 0);
  ASSERT_TRUE(C.resolve(refusing.port, false));
}

// A port nobody listens on: the TCP connect is refused. siw refuses in rdma_connect itself (its
// connect blocks); a NIC reports REJECTED with -ECONNREFUSED, as we do, after the second of retries
// that a server re-listening on its port gets.
TEST(IwarpCm, NobodyListeningIsRefused) {
  RefusingPort refusing;
  Stats before;
  Client C;
  ASSERT_NO_FATAL_FAILURE(resolve_to(refusing, C));
  rdma_conn_param cp{};
  if (rdma_connect(C.id, &cp) != 0) {
    EXPECT_EQ(errno, ECONNREFUSED);
    return;
  }
  rdma_cm_event* ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_REJECTED) << name(ev);
  EXPECT_EQ(ev->status, -ECONNREFUSED);
  rdma_ack_cm_event(ev);
  Stats after;
  EXPECT_EQ(after[kRefusedRetries] - before[kRefusedRetries], 20u);
  EXPECT_EQ(after[kRefused] - before[kRefused], 1u);
}

// A server that listens only after the client's first connect was refused (perftest re-listens
// between its two connections; qperf names its port before listening): the retry reaches it.
TEST(IwarpCm, ListenerThatComesLateIsReached) {
  RefusingPort refusing;
  Stats before;
  Client C;
  ASSERT_NO_FATAL_FAILURE(resolve_to(refusing, C));
  const uint16_t port = refusing.port;
  rdma_conn_param cp{};
  ASSERT_EQ(rdma_connect(C.id, &cp), 0);
  // No listener yet: wait until the CM has seen a refusal, then listen on the port.
  for (int i = 0; i < 2000 && Stats()[kRefusedRetries] == before[kRefusedRetries]; ++i) usleep(1000);
  ASSERT_GT(Stats()[kRefusedRetries], before[kRefusedRetries]);
  refusing.release();
  Listener L(RDMA_PS_TCP, port);
  ASSERT_EQ(L.port, port);
  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) << name(ev);
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  rdma_conn_param ap{};
  ASSERT_EQ(rdma_accept(child, &ap), 0);
  ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED) << name(ev);
  rdma_ack_cm_event(ev);
  EXPECT_EQ(Stats()[kRefused], before[kRefused]);  // no refusal reached the application
  EXPECT_EQ(rdma_destroy_id(child), 0);
}

// Data over a connection rdma_cm set up between two softrdma iWARP QPs of this host: the tuple
// table found the peer, so the QPs run on the direct path (with SOFTRDMA_DIRECT=0: FPDUs over the
// TCP connection). SEND, WRITE and READ, byte by byte.
TEST(IwarpCm, SendWriteReadBetweenLocalPeers) {
  Listener L;
  Client C;
  ASSERT_TRUE(C.resolve(L.port));
  ASSERT_EQ(C.id->verbs->device->transport_type, IBV_TRANSPORT_IWARP);
  Side ss;
  rdma_conn_param cp{};
  cp.responder_resources = 2;
  cp.initiator_depth = 2;
  rdma_cm_id* child = connect_pair(L, C, ss, cp, cp);
  ASSERT_NE(child, nullptr);
  for (rdma_event_channel* ch : {L.ch, C.ch}) {
    rdma_cm_event* ev = next_event(ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED) << name(ev);
    rdma_ack_cm_event(ev);
  }
  Side& cs = C.side;
  for (size_t i = 0; i < 4096; ++i) {
    cs.buf[i] = static_cast<uint8_t>(i * 13 + 1);
    ss.buf[8192 + i] = static_cast<uint8_t>(i * 7 + 3);
  }
  ibv_sge rs = ss.sge(0, 4096);
  ibv_recv_wr rwr{};
  rwr.wr_id = 1;
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  ibv_recv_wr* bad_r = nullptr;
  ASSERT_EQ(ibv_post_recv(child->qp, &rwr, &bad_r), 0);
  ibv_sge s = cs.sge(0, 4096);
  ibv_send_wr swr{};
  swr.wr_id = 2;
  swr.sg_list = &s;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad_s = nullptr;
  ASSERT_EQ(ibv_post_send(C.id->qp, &swr, &bad_s), 0);
  EXPECT_EQ(cs.poll_one().status, IBV_WC_SUCCESS);
  ibv_wc wc = ss.poll_one();
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 4096u);
  EXPECT_EQ(memcmp(ss.buf.data(), cs.buf.data(), 4096), 0);
  // WRITE into the server's buffer at 4096, READ back its bytes at 8192.
  swr.opcode = IBV_WR_RDMA_WRITE;
  swr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(ss.buf.data() + 4096);
  swr.wr.rdma.rkey = ss.mr->rkey;
  ASSERT_EQ(ibv_post_send(C.id->qp, &swr, &bad_s), 0);
  // On iWARP a WRITE completes at its source once the bytes are handed to TCP, not when they are
  // placed (RFC 5040); the READ behind it on the same QP completes only after they are.
  EXPECT_EQ(cs.poll_one().status, IBV_WC_SUCCESS);
  ibv_sge d = cs.sge(8192, 4096);
  swr.sg_list = &d;
  swr.opcode = IBV_WR_RDMA_READ;
  swr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(ss.buf.data() + 8192);
  ASSERT_EQ(ibv_post_send(C.id->qp, &swr, &bad_s), 0);
  wc = cs.poll_one();
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(memcmp(cs.buf.data() + 8192, ss.buf.data() + 8192, 4096), 0);
  EXPECT_EQ(memcmp(ss.buf.data() + 4096, cs.buf.data(), 4096), 0);
  ASSERT_EQ(rdma_disconnect(C.id), 0);
  for (rdma_event_channel* ch : {C.ch, L.ch}) {
    rdma_cm_event* ev = next_event(ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_DISCONNECTED) << name(ev);
    rdma_ack_cm_event(ev);
  }
  ss.release();
  EXPECT_EQ(rdma_destroy_id(child), 0);
}

void disconnect_test(bool active_side) {
  Listener L;
  Client C;
  ASSERT_TRUE(C.resolve(L.port));
  Side ss;
  rdma_cm_id* child = connect_pair(L, C, ss, rdma_conn_param{}, rdma_conn_param{});
  ASSERT_NE(child, nullptr);
  for (rdma_event_channel* ch : {L.ch, C.ch}) {
    rdma_cm_event* ev = next_event(ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED) << name(ev);
    rdma_ack_cm_event(ev);
  }
  ASSERT_EQ(rdma_disconnect(active_side ? C.id : child), 0);
  // iWARP: both ends get DISCONNECTED, the one that closed too; each exactly once.
  for (rdma_event_channel* ch : {C.ch, L.ch}) {
    rdma_cm_event* ev = next_event(ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_DISCONNECTED) << name(ev);
    rdma_ack_cm_event(ev);
  }
  EXPECT_EQ(rdma_disconnect(active_side ? child : C.id), 0);  // the other side too: no second event
  EXPECT_EQ(next_event(C.ch, 300), nullptr);
  EXPECT_EQ(next_event(L.ch, 300), nullptr);
  ss.release();
  EXPECT_EQ(rdma_destroy_id(child), 0);
}
TEST(IwarpCm, DisconnectFromActiveSide) { disconnect_test(true); }
TEST(IwarpCm, DisconnectFromPassiveSide) { disconnect_test(false); }

// The MPA request on the wire, field by field, and a reply that picks READ RTR, asks CRC and
// markers and gives less IRD than asked: the client connects with what was negotiated.
TEST(IwarpCm, RequestOnTheWireAndNegotiatedReply) {
  RawServer S;
  ASSERT_NE(S.port, 0);
  Client C;
  ASSERT_TRUE(C.resolve(S.port, false));
  const char hello[] = "on-the-wire";
  rdma_conn_param cp = conn_param(hello, sizeof hello, 5, 3);
  ASSERT_EQ(rdma_connect(C.id, &cp), 0);
  int fd = S.accept_one();
  ASSERT_GE(fd, 0);
  Frame f;
  ASSERT_TRUE(read_frame(fd, f));
  EXPECT_EQ(f.key, std::string(kReqKey, 16));
  EXPECT_EQ(f.bits & 0xFF, 2);           // revision 2
  EXPECT_TRUE(f.bits & 0x1000);          // enhanced (RFC 6581)
  EXPECT_FALSE(f.bits & 0x8000);         // no markers asked
  EXPECT_FALSE(f.bits & 0x4000);         // no CRC unless SOFTRDMA_MPA_CRC=1
  EXPECT_FALSE(f.bits & 0x2000);
  EXPECT_EQ(f.ird_word, 0x8000 | 5);     // P, IRD 5
  EXPECT_EQ(f.ord_word, 0xC000 | 3);     // WRITE and READ RTR offered, ORD 3
  EXPECT_EQ(f.pdata, std::vector<uint8_t>(hello, hello + sizeof hello));
  const std::vector<uint8_t> pd = {'o', 'k'};
  // Reply: CRC and markers asked, P with READ RTR, IRD 2 (below the client's ORD), ORD 4 (within
  // its IRD).
  ASSERT_TRUE(send_all(fd, frame_bytes(kRepKey, 0x8000 | 0x4000 | 0x1000 | 2, true, 0x8000 | 2, 0x4000 | 4, pd)));
  rdma_cm_event* ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED) << name(ev);
  ASSERT_EQ(ev->param.conn.private_data_len, 2);
  EXPECT_EQ(memcmp(ev->param.conn.private_data, "ok", 2), 0);
  EXPECT_EQ(ev->param.conn.initiator_depth, 4);      // IRD: min(5, the server's ORD 4)
  EXPECT_EQ(ev->param.conn.responder_resources, 2);  // ORD: min(3, the server's IRD 2)
  rdma_ack_cm_event(ev);
  // rdma_disconnect closes the stream: the server sees EOF, the client DISCONNECTED.
  ASSERT_EQ(rdma_disconnect(C.id), 0);
  EXPECT_TRUE(sees_eof(fd));
  ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_DISCONNECTED) << name(ev);
  rdma_ack_cm_event(ev);
  close(fd);
}

// A reply the client cannot use: a wrong key, then one whose ORD exceeds the client's IRD.
TEST(IwarpCm, BadRepliesAreConnectErrors) {
  struct Case {
    const char* key;
    uint16_t ord_word;
    int status;
  } cases[] = {{kReqKey, 0x8000 | 1, -EPROTO}, {kRepKey, 0x8000 | 9, -ENOMEM}};
  for (const Case& k : cases) {
    RawServer S;
    Client C;
    ASSERT_TRUE(C.resolve(S.port, false));
    rdma_conn_param cp{};
    cp.responder_resources = 2;
    cp.initiator_depth = 2;
    Stats before;
    ASSERT_EQ(rdma_connect(C.id, &cp), 0);
    int fd = S.accept_one();
    Frame f;
    ASSERT_TRUE(read_frame(fd, f));
    ASSERT_TRUE(send_all(fd, frame_bytes(k.key, 0x1000 | 2, true, 0x8000 | 2, k.ord_word, {})));
    rdma_cm_event* ev = next_event(C.ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_ERROR) << name(ev);
    EXPECT_EQ(ev->status, k.status);
    rdma_ack_cm_event(ev);
    EXPECT_TRUE(sees_eof(fd));  // the client closed the connection
    if (k.status == -EPROTO) {
      EXPECT_EQ(Stats()[kBadFrames] - before[kBadFrames], 1u);
    }
    close(fd);
  }
}

// A responder that accepts the TCP connection and never replies: UNREACHABLE with -ETIMEDOUT once
// the MPA timer (SOFTRDMA_MPA_TIMEOUT_MS here) runs out.
TEST(IwarpCm, SilentResponderIsUnreachable) {
  RawServer S;
  Client C;
  ASSERT_TRUE(C.resolve(S.port, false));
  rdma_conn_param cp{};
  ASSERT_EQ(rdma_connect(C.id, &cp), 0);
  int fd = S.accept_one();
  ASSERT_GE(fd, 0);
  rdma_cm_event* ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_UNREACHABLE) << name(ev);
  EXPECT_EQ(ev->status, -ETIMEDOUT);
  rdma_ack_cm_event(ev);
  close(fd);
}

// The passive side on the wire: a request offering only READ RTR, asking CRC and markers; the
// reply mirrors CRC, asks no markers, picks READ, and answers IRD/ORD within what was offered.
TEST(IwarpCm, ReplyOnTheWire) {
  Listener L;
  ASSERT_NE(L.port, 0);
  int fd = raw_connect(L.port);
  ASSERT_GE(fd, 0);
  const std::vector<uint8_t> pd = {1, 2, 3, 4, 5};
  ASSERT_TRUE(send_all(fd, frame_bytes(kReqKey, 0x8000 | 0x4000 | 0x1000 | 2, true, 0x8000 | 6, 0x4000 | 3, pd)));
  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) << name(ev);
  ASSERT_EQ(ev->param.conn.private_data_len, 5);
  EXPECT_EQ(memcmp(ev->param.conn.private_data, pd.data(), 5), 0);
  EXPECT_EQ(ev->param.conn.initiator_depth, 6);
  EXPECT_EQ(ev->param.conn.responder_resources, 3);
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  const char welcome[] = "hi";
  rdma_conn_param ap{};
  ap.private_data = welcome;
  ap.private_data_len = sizeof welcome;
  ap.responder_resources = 8;  // more than the peer's ORD 3: answered as 3
  ap.initiator_depth = 8;      // more than its IRD 6: answered as 6
  ASSERT_EQ(rdma_accept(child, &ap), 0);
  Frame f;
  ASSERT_TRUE(read_frame(fd, f));
  EXPECT_EQ(f.key, std::string(kRepKey, 16));
  EXPECT_EQ(f.bits, 0x4000 | 0x1000 | 2);  // CRC (asked by the peer), enhanced, rev 2; no M, no R
  EXPECT_EQ(f.ird_word, 0x8000 | 3);
  EXPECT_EQ(f.ord_word, 0x4000 | 6);        // READ RTR chosen
  EXPECT_EQ(f.pdata, std::vector<uint8_t>(welcome, welcome + sizeof welcome));
  ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->id == child) << name(ev);
  rdma_ack_cm_event(ev);
  close(fd);  // the peer goes away: DISCONNECTED
  ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_DISCONNECTED && ev->id == child) << name(ev);
  rdma_ack_cm_event(ev);
  EXPECT_EQ(rdma_destroy_id(child), 0);
}

// Hostile TCP clients at a listener: garbage, a valid key with an oversized length, a request
// with bytes after it, a request cut short. Each is closed and counted, no CONNECT_REQUEST is
// raised, and the listener then takes a real connection.
TEST(IwarpCm, HostileClientsAreClosedAndCounted) {
  Listener L;
  ASSERT_NE(L.port, 0);
  Stats before;
  std::vector<uint8_t> garbage(64, 0xEE);
  std::vector<uint8_t> oversized = frame_bytes(kReqKey, 0x1000 | 2, false, 0, 0, {});
  oversized[18] = 0xFF;
  oversized[19] = 0xFF;
  std::vector<uint8_t> extra = frame_bytes(kReqKey, 0x1000 | 2, true, 0x8000 | 1, 0x8000 | 1, {});
  extra.push_back(0);
  std::vector<uint8_t> short_enh = frame_bytes(kReqKey, 0x1000 | 2, false, 0, 0, {9, 9});  // E with 2 octets
  short_enh[17] = 2;
  for (const auto& bytes : {garbage, oversized, extra, short_enh}) {
    int fd = raw_connect(L.port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, bytes));
    EXPECT_TRUE(sees_eof(fd));
    close(fd);
  }
  int cut = raw_connect(L.port);
  std::vector<uint8_t> half = frame_bytes(kReqKey, 0x1000 | 2, true, 0, 0, {});
  half.resize(10);
  ASSERT_TRUE(send_all(cut, half));
  EXPECT_TRUE(sees_eof(cut));  // after the MPA request timer
  close(cut);
  Stats mid;
  EXPECT_EQ(mid[kBadFrames] - before[kBadFrames], 4u);
  EXPECT_EQ(mid[kTimeouts] - before[kTimeouts], 1u);
  EXPECT_EQ(mid[kReqRcvd], before[kReqRcvd]);
  EXPECT_EQ(next_event(L.ch, 200), nullptr);

  Client C;
  ASSERT_TRUE(C.resolve(L.port));
  Side ss;
  rdma_cm_id* child = connect_pair(L, C, ss, rdma_conn_param{}, rdma_conn_param{});
  ASSERT_NE(child, nullptr);
  rdma_cm_event* ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED) << name(ev);
  rdma_ack_cm_event(ev);
  ss.release();
  EXPECT_EQ(rdma_destroy_id(child), 0);
}

// A destroyed listener's port is free again at once (perftest -R re-listens on it).
// ---- IPv6: TCP/IPv6 under the MPA exchange -------------------------------------------------------
using cmt::addr6;
using cmt::Id;
using cmt::str_of;

// C connects to the listener L; SEND, WRITE and READ cross, their bytes checked; check sees the
// accepted id before it is accepted.
void connect_and_move_data(Id& L, Id& C, const std::function<void(rdma_cm_id*)>& check) {
  Side cs, ss;
  ASSERT_TRUE(cs.setup(C.id));
  rdma_cm_id* child = cmt::connect_for_request(C.id, L.ch);
  ASSERT_NE(child, nullptr);
  check(child);
  ASSERT_TRUE(ss.setup(child));
  ASSERT_EQ(cmt::post_recv_one(child->qp, ss.sge(0, 4096), 1), 0);
  ASSERT_EQ(cmt::accept_until_established(child, C.ch), "");
  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->id == child) << name(ev);
  rdma_ack_cm_event(ev);
  for (size_t i = 0; i < 4096; ++i) {
    cs.buf[i] = static_cast<uint8_t>(i * 11 + 5);
    ss.buf[8192 + i] = static_cast<uint8_t>(i * 3 + 1);
  }
  ASSERT_EQ(cmt::post_send_one(C.id->qp, cs.sge(0, 4096), 2), 0);
  EXPECT_EQ(cs.poll_one().status, IBV_WC_SUCCESS);
  ibv_wc wc = ss.poll_one();
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 4096u);
  EXPECT_EQ(memcmp(ss.buf.data(), cs.buf.data(), 4096), 0);
  ibv_sge w = cs.sge(0, 4096), r = cs.sge(8192, 4096);
  ibv_send_wr wr[2] = {};
  wr[0].sg_list = &w;
  wr[0].opcode = IBV_WR_RDMA_WRITE;
  wr[0].wr.rdma.remote_addr = reinterpret_cast<uint64_t>(ss.buf.data() + 4096);
  wr[1].sg_list = &r;
  wr[1].opcode = IBV_WR_RDMA_READ;
  wr[1].wr.rdma.remote_addr = reinterpret_cast<uint64_t>(ss.buf.data() + 8192);
  for (ibv_send_wr& x : wr) {
    x.num_sge = 1;
    x.send_flags = IBV_SEND_SIGNALED;
    x.wr.rdma.rkey = ss.mr->rkey;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(C.id->qp, &x, &bad), 0);
    EXPECT_EQ(cs.poll_one().status, IBV_WC_SUCCESS);
  }
  EXPECT_EQ(memcmp(ss.buf.data() + 4096, cs.buf.data(), 4096), 0);
  EXPECT_EQ(memcmp(cs.buf.data() + 8192, ss.buf.data() + 8192, 4096), 0);
  ss.release();
  rdma_destroy_id(child);
}

// ::1 is the loopback iWARP device's, as 127.0.0.1 (the kernel's cma_bind_loopback); the connection
// runs over TCP/IPv6, and both ends report IPv6 addresses.
TEST(IwarpCm, Ipv6LoopbackConnectsAndMovesData) {
  Id L;
  ASSERT_EQ(L.bind(addr6("::1", 0)), 0) << strerror(errno);
  ASSERT_NE(L.id->verbs, nullptr);
  EXPECT_STREQ(ibv_get_device_name(L.id->verbs->device), "softrdma_iw_lo");
  EXPECT_EQ(str_of(rdma_get_local_addr(L.id)), "::1");
  const uint16_t port = ntohs(rdma_get_src_port(L.id));
  ASSERT_EQ(rdma_listen(L.id, 4), 0);
  Id C;
  ASSERT_TRUE(C.resolve(addr6("::1", port))) << strerror(errno);
  EXPECT_STREQ(ibv_get_device_name(C.id->verbs->device), "softrdma_iw_lo");
  EXPECT_EQ(rdma_get_peer_addr(C.id)->sa_family, AF_INET6);
  const uint16_t c_port = ntohs(rdma_get_src_port(C.id));
  Stats before;
  connect_and_move_data(L, C, [c_port](rdma_cm_id* child) {
    EXPECT_EQ(rdma_get_peer_addr(child)->sa_family, AF_INET6);
    EXPECT_EQ(str_of(rdma_get_peer_addr(child)), "::1");
    EXPECT_EQ(ntohs(rdma_get_dst_port(child)), c_port);
  });
  // The tuple table names the IPv6 connection by its addresses' keys: each end found the other.
  Stats after;
  EXPECT_EQ(after[kDirectHits] - before[kDirectHits], direct_off() ? 0u : 2u);
}

// "::" without AFONLY is one dual-stack TCP listener: an IPv4 client reaches it (its accepted id is
// IPv4's, as the connection), and so does an IPv6 one. With AFONLY, IPv4 is refused.
TEST(IwarpCm, Ipv6WildcardListenerWithAndWithoutAfonly) {
  Id L;
  ASSERT_EQ(L.afonly(0), 0);
  ASSERT_EQ(L.bind(addr6("::", 0)), 0) << strerror(errno);
  EXPECT_EQ(L.id->verbs, nullptr);
  const uint16_t port = ntohs(rdma_get_src_port(L.id));
  ASSERT_NE(port, 0);
  ASSERT_EQ(rdma_listen(L.id, 4), 0);
  {
    Id C;
    ASSERT_TRUE(C.resolve(addr(kIp, port)));
    connect_and_move_data(L, C, [](rdma_cm_id* child) {
      EXPECT_EQ(rdma_get_peer_addr(child)->sa_family, AF_INET);
      EXPECT_EQ(str_of(rdma_get_peer_addr(child)), "127.0.0.1");
    });
  }
  {
    Id C;
    ASSERT_TRUE(C.resolve(addr6("::1", port)));
    connect_and_move_data(L, C, [](rdma_cm_id* child) { EXPECT_EQ(str_of(rdma_get_peer_addr(child)), "::1"); });
  }

  Id only;
  ASSERT_EQ(only.afonly(1), 0);
  ASSERT_EQ(only.bind(addr6("::", 0)), 0) << strerror(errno);
  const uint16_t port6 = ntohs(rdma_get_src_port(only.id));
  ASSERT_EQ(rdma_listen(only.id, 4), 0);
  Id C;
  ASSERT_TRUE(C.resolve(addr(kIp, port6)));
  rdma_conn_param cp{};
  ASSERT_EQ(rdma_connect(C.id, &cp), 0);
  rdma_cm_event* ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_REJECTED) << "nothing listens on IPv4's port: " << name(ev);
  rdma_ack_cm_event(ev);
}

TEST(IwarpCm, ListenerPortReusableAfterDestroy) {
  uint16_t port;
  {
    Listener L;
    ASSERT_NE(L.port, 0);
    port = L.port;
  }
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in a = addr(kIp, port);
  EXPECT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)), 0);
  EXPECT_EQ(rdma_listen(id, 1), 0);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
}

}  // namespace
