// rdma_cm programs over softrdma's librdmacm: connection setup with private data both ways and data
// over the connected QPs, rejection, nobody listening, a peer that never answers, peer death. Only
// the public <rdma/rdma_cma.h> / <infiniband/verbs.h> API: these would pass against the kernel's
// rdma_cm on a RoCE NIC (with 127.0.0.1 replaced by the NIC's address).
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cm_helpers.h"
#include "my_counter.h"  // tests/verbs

namespace {

using namespace softrdma::cm_test;
using softrdma::verbs_test::my_counter;
namespace core = softrdma::core;

// What the server tells the client in its accept: where to RDMA READ from.
struct Remote {
  uint64_t addr;
  uint32_t rkey;
  char text[20];
};

TEST(RdmaCm, ConnectAcceptPrivateDataBothWaysThenSendReadAndDisconnect) {
  Listener L;
  ASSERT_NE(L.port, 0);
  Client C;
  ASSERT_TRUE(C.resolve(L.port));
  Side cs;
  ASSERT_TRUE(cs.setup(C.id, 8192));

  const char hello[] = "client-hello-0123";
  rdma_conn_param cp = conn_param(hello, sizeof hello, 1, 1, 7, 7);
  ASSERT_EQ(rdma_connect(C.id, &cp), 0);

  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) << name(ev);
  EXPECT_EQ(ev->listen_id, L.id);
  ASSERT_GE(ev->param.conn.private_data_len, sizeof hello);
  EXPECT_EQ(memcmp(ev->param.conn.private_data, hello, sizeof hello), 0);
  EXPECT_EQ(ev->param.conn.initiator_depth, 1);  // the client's responder resources, seen from here
  EXPECT_EQ(ev->param.conn.responder_resources, 1);
  rdma_cm_id* child = ev->id;
  ASSERT_EQ(rdma_ack_cm_event(ev), 0);
  EXPECT_EQ(ntohs(rdma_get_src_port(child)), L.port);
  EXPECT_EQ(rdma_get_dst_port(child), rdma_get_src_port(C.id));

  Side ss;
  ASSERT_TRUE(ss.setup(child, 8192));
  for (size_t i = 0; i < 4096; ++i) ss.buf[4096 + i] = static_cast<uint8_t>(i * 7 + 3);  // READ source
  ibv_sge rs = ss.sge(0, 4096);
  ibv_recv_wr rwr{};
  rwr.wr_id = 11;
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  ibv_recv_wr* bad_r = nullptr;
  ASSERT_EQ(ibv_post_recv(child->qp, &rwr, &bad_r), 0);

  Remote rem{reinterpret_cast<uint64_t>(ss.buf.data() + 4096), ss.mr->rkey, "server-accepts"};
  rdma_conn_param ap = conn_param(&rem, sizeof rem, 1, 1, 0, 7);
  ASSERT_EQ(rdma_accept(child, &ap), 0);

  ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED) << name(ev);
  ASSERT_GE(ev->param.conn.private_data_len, sizeof rem);
  Remote got;
  memcpy(&got, ev->param.conn.private_data, sizeof got);
  EXPECT_EQ(memcmp(&got, &rem, sizeof rem), 0);
  ASSERT_EQ(rdma_ack_cm_event(ev), 0);
  ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->id == child) << name(ev);
  ASSERT_EQ(rdma_ack_cm_event(ev), 0);

  // SEND client -> server, checked byte by byte.
  for (size_t i = 0; i < 4096; ++i) cs.buf[i] = static_cast<uint8_t>(i ^ 0x5A);
  ibv_sge s = cs.sge(0, 4096);
  ibv_send_wr swr{};
  swr.wr_id = 21;
  swr.sg_list = &s;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad_s = nullptr;
  ASSERT_EQ(ibv_post_send(C.id->qp, &swr, &bad_s), 0);
  ibv_wc wc = cs.poll_one();
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 21u);
  wc = ss.poll_one();
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_EQ(wc.byte_len, 4096u);
  EXPECT_EQ(memcmp(ss.buf.data(), cs.buf.data(), 4096), 0);

  // RDMA READ from the buffer the server named in its private data.
  ibv_sge d = cs.sge(4096, 4096);
  swr.wr_id = 22;
  swr.sg_list = &d;
  swr.opcode = IBV_WR_RDMA_READ;
  swr.wr.rdma.remote_addr = got.addr;
  swr.wr.rdma.rkey = got.rkey;
  ASSERT_EQ(ibv_post_send(C.id->qp, &swr, &bad_s), 0);
  wc = cs.poll_one();
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(memcmp(cs.buf.data() + 4096, ss.buf.data() + 4096, 4096), 0);

  // Disconnect: both sides see DISCONNECTED.
  ASSERT_EQ(rdma_disconnect(C.id), 0);
  ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_DISCONNECTED) << name(ev);
  rdma_ack_cm_event(ev);
  ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_DISCONNECTED && ev->id == child) << name(ev);
  rdma_ack_cm_event(ev);
  // rdma_disconnect flushed the client's QP: a receive posted now completes in error.
  ibv_sge r2 = cs.sge(0, 16);
  rwr.sg_list = &r2;
  rwr.wr_id = 31;
  if (ibv_post_recv(C.id->qp, &rwr, &bad_r) == 0) {
    wc = cs.poll_one();
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  }
  ss.release();
  EXPECT_EQ(rdma_destroy_id(child), 0);
}

TEST(RdmaCm, RejectCarriesReasonAndPrivateData) {
  Listener L;
  ASSERT_NE(L.port, 0);
  Client C;
  ASSERT_TRUE(C.resolve(L.port));
  Side cs;
  ASSERT_TRUE(cs.setup(C.id, 64));
  rdma_conn_param cp{};
  ASSERT_EQ(rdma_connect(C.id, &cp), 0);

  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) << name(ev);
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  const char why[] = "server-busy-try-later";
  ASSERT_EQ(rdma_reject(child, why, sizeof why), 0);

  ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_REJECTED) << name(ev);
  EXPECT_EQ(ev->status, 28);  // IBTA REJ reason 28: consumer defined
  ASSERT_GE(ev->param.conn.private_data_len, sizeof why);
  EXPECT_EQ(memcmp(ev->param.conn.private_data, why, sizeof why), 0);
  rdma_ack_cm_event(ev);
  // A rejected connection's QP is flushed: a receive completes in error.
  ibv_sge r = cs.sge(0, 16);
  ibv_recv_wr rwr{};
  rwr.wr_id = 5;
  rwr.sg_list = &r;
  rwr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_recv(C.id->qp, &rwr, &bad), 0);
  EXPECT_EQ(cs.poll_one().status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(rdma_destroy_id(child), 0);
}

TEST(RdmaCm, RejectTwiceOrAcceptAfterRejectFails) {
  Listener L;
  ASSERT_NE(L.port, 0);
  Client C;
  ASSERT_TRUE(C.resolve(L.port));
  rdma_conn_param cp{};
  cp.qp_num = 0x123;  // no QP: rdma_connect without one sends the given QPN
  ASSERT_EQ(rdma_connect(C.id, &cp), 0);
  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) << name(ev);
  EXPECT_EQ(ev->param.conn.qp_num, 0x123u);
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  ASSERT_EQ(rdma_reject(child, nullptr, 0), 0);
  errno = 0;
  EXPECT_EQ(rdma_reject(child, nullptr, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_accept(child, nullptr), -1);
  ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_REJECTED) << name(ev);
  EXPECT_EQ(ev->status, 28);
  rdma_ack_cm_event(ev);
  EXPECT_EQ(rdma_destroy_id(child), 0);
}

// A port nobody listens on: the peer's CM answers REJ "invalid service ID" (IBTA reason 8), as the
// kernel's does.
TEST(RdmaCm, NobodyListeningIsRejected) {
  uint16_t port;
  {
    // A port that was free a moment ago (bound, then released).
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a = addr(kIp, 0);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t l = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
    port = ntohs(a.sin_port);
    close(fd);
  }
  Client C;
  ASSERT_TRUE(C.resolve(port));
  Side cs;
  ASSERT_TRUE(cs.setup(C.id, 64));
  rdma_conn_param cp{};
  ASSERT_EQ(rdma_connect(C.id, &cp), 0);
  rdma_cm_event* ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_REJECTED) << name(ev);
  EXPECT_EQ(ev->status, 8);
  rdma_ack_cm_event(ev);
}

// Starts tests/rdmacm/peer with args; its stdin and stdout are pipes.
struct Peer {
  pid_t pid = -1;
  int to = -1, from = -1;
  bool start(std::vector<std::string> args) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)) return false;
    pid = fork();
    if (pid == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      std::vector<char*> argv;
      static char path[] = RDMACM_PEER;
      argv.push_back(path);
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(path, argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to = in[1];
    from = out[0];
    return pid > 0;
  }
  // One line of the peer's stdout ("" on EOF or after kWaitMs).
  std::string line() {
    std::string s;
    char c;
    pollfd p{from, POLLIN, 0};
    while (poll(&p, 1, kWaitMs) == 1 && read(from, &c, 1) == 1 && c != '\n') s += c;
    return s;
  }
  int wait() {
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0);
    pid = -1;
    return st;
  }
  ~Peer() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      wait();
    }
    if (to >= 0) close(to);
    if (from >= 0) close(from);
  }
};

// A listener whose process never answers (stopped): the REQ is resent SOFTRDMA_CM_RETRIES times,
// SOFTRDMA_CM_TIMEOUT_MS apart, then UNREACHABLE with -ETIMEDOUT.
TEST(RdmaCm, SilentPeerIsUnreachableAfterTheTimeout) {
  Peer P;
  ASSERT_TRUE(P.start({"listen-stop", kIp}));
  int port = atoi(P.line().c_str());
  ASSERT_GT(port, 0);
  int st = 0;
  ASSERT_EQ(waitpid(P.pid, &st, WUNTRACED), P.pid);
  ASSERT_TRUE(WIFSTOPPED(st));
  // The process's settings. No id of this process awaits an answer now, so the CM thread reads
  // neither meanwhile.
  CmOption timeout("SOFTRDMA_CM_TIMEOUT_MS", "100"), retries("SOFTRDMA_CM_RETRIES", "2");
  ASSERT_EQ(timeout.rc, 0);
  ASSERT_EQ(retries.rc, 0);
  {
    Client C;
    ASSERT_TRUE(C.resolve(static_cast<uint16_t>(port)));
    Side cs;
    ASSERT_TRUE(cs.setup(C.id, 64));
    rdma_conn_param cp{};
    ASSERT_EQ(rdma_connect(C.id, &cp), 0);
    rdma_cm_event* ev = next_event(C.ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_UNREACHABLE) << name(ev);
    EXPECT_EQ(ev->status, -ETIMEDOUT);
    rdma_ack_cm_event(ev);
  }
}

// A connected peer process that goes away: the survivor gets DISCONNECTED, whether the peer exits
// (its exit handlers send a DREQ, as the kernel does for a dying process) or is killed outright, and
// counts why (cm_dreq_rcvd, cm_peer_gone).
void peer_goes_away(bool killed) {
  const uint64_t dreqs = my_counter(&core::Counters::cm_dreq_rcvd);
  const uint64_t gone = my_counter(&core::Counters::cm_peer_gone);
  Listener L;
  ASSERT_NE(L.port, 0);
  Peer P;
  ASSERT_TRUE(P.start({"connect", kIp, std::to_string(L.port)}));
  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) << name(ev);
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  {
    Side ss;
    ASSERT_TRUE(ss.setup(child, 64));
    rdma_conn_param ap{};
    ASSERT_EQ(rdma_accept(child, &ap), 0);
    ev = next_event(L.ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED) << name(ev);
    rdma_ack_cm_event(ev);
    ASSERT_EQ(P.line(), "up");
    if (killed) {
      kill(P.pid, SIGKILL);
    } else {
      close(P.to);
      P.to = -1;
    }
    int st = P.wait();
    if (killed)
      EXPECT_TRUE(WIFSIGNALED(st));
    else
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
    ev = next_event(L.ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_DISCONNECTED && ev->id == child) << name(ev);
    rdma_ack_cm_event(ev);
    // A killed peer sends no DREQ. An exiting one does, but the survivor may find the process gone
    // before it reads the DREQ: either way, one reason counted.
    const uint64_t by_dreq = my_counter(&core::Counters::cm_dreq_rcvd) - dreqs;
    const uint64_t by_gone = my_counter(&core::Counters::cm_peer_gone) - gone;
    EXPECT_EQ(by_dreq + by_gone, 1u);
    if (killed) {
      EXPECT_EQ(by_gone, 1u);
    }
  }
  EXPECT_EQ(rdma_destroy_id(child), 0);
}

TEST(RdmaCm, PeerExitWithoutDisconnectIsDisconnected) { peer_goes_away(false); }
TEST(RdmaCm, KilledPeerIsDisconnected) { peer_goes_away(true); }

TEST(RdmaCm, BadCallsFailWithErrno) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  errno = 0;
  EXPECT_EQ(rdma_create_id(ch, &id, nullptr, static_cast<rdma_port_space>(0x0107)), -1);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  // Connecting or accepting before the route is resolved / a request arrived.
  EXPECT_EQ(rdma_connect(id, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_accept(id, nullptr), -1);
  EXPECT_EQ(rdma_reject(id, nullptr, 0), -1);
  // Two ids cannot hold one port.
  Listener L;
  ASSERT_NE(L.port, 0);
  sockaddr_in a = addr(kIp, L.port);
  EXPECT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  // Private data over the REQ's room (92 bytes less the 36-byte rdma_cm header).
  EXPECT_EQ(rdma_destroy_id(id), 0);
  Client C;
  ASSERT_TRUE(C.resolve(L.port));
  uint8_t big[57] = {};
  rdma_conn_param cp{};
  cp.private_data = big;
  cp.private_data_len = sizeof big;
  EXPECT_EQ(rdma_connect(C.id, &cp), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_destroy_event_channel(ch);
}

// UD ids: rdma_connect sends a SIDR_REQ, rdma_accept answers with the QPN and Q_Key; the client's
// ESTABLISHED carries them with an address vector, and datagrams flow.
TEST(RdmaCm, UdIdLearnsServiceQpnAndQkeyThenDatagramsFlow) {
  Listener L(RDMA_PS_UDP);
  ASSERT_NE(L.port, 0);
  Client C;
  ASSERT_TRUE(C.resolve(L.port, RDMA_PS_UDP));
  Side cs;
  ASSERT_TRUE(cs.setup(C.id, 4096, IBV_QPT_UD));
  const char hello[] = "ud-hello";
  rdma_conn_param cp{};
  cp.private_data = hello;
  cp.private_data_len = sizeof hello;
  ASSERT_EQ(rdma_connect(C.id, &cp), 0);

  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) << name(ev);
  ASSERT_GE(ev->param.ud.private_data_len, sizeof hello);
  EXPECT_EQ(memcmp(ev->param.ud.private_data, hello, sizeof hello), 0);
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  Side ss;
  ASSERT_TRUE(ss.setup(child, 4096, IBV_QPT_UD));
  ibv_sge rs = ss.sge(0, 40 + 256);  // GRH area, then the datagram
  ibv_recv_wr rwr{};
  rwr.wr_id = 1;
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  ibv_recv_wr* bad_r = nullptr;
  ASSERT_EQ(ibv_post_recv(child->qp, &rwr, &bad_r), 0);
  const char welcome[] = "ud-welcome";
  rdma_conn_param ap{};
  ap.private_data = welcome;
  ap.private_data_len = sizeof welcome;
  ASSERT_EQ(rdma_accept(child, &ap), 0);

  ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED) << name(ev);
  EXPECT_EQ(ev->status, 0);
  ASSERT_GE(ev->param.ud.private_data_len, sizeof welcome);
  EXPECT_EQ(memcmp(ev->param.ud.private_data, welcome, sizeof welcome), 0);
  EXPECT_EQ(ev->param.ud.qp_num, child->qp->qp_num);
  EXPECT_EQ(ev->param.ud.qkey, static_cast<uint32_t>(RDMA_UDP_QKEY));
  const uint32_t qpn = ev->param.ud.qp_num, qkey = ev->param.ud.qkey;
  ibv_ah* ah = ibv_create_ah(cs.pd, &ev->param.ud.ah_attr);
  rdma_ack_cm_event(ev);
  ASSERT_NE(ah, nullptr);

  for (size_t i = 0; i < 256; ++i) cs.buf[i] = static_cast<uint8_t>(255 - i);
  ibv_sge s = cs.sge(0, 256);
  ibv_send_wr swr{};
  swr.wr_id = 2;
  swr.sg_list = &s;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  swr.wr.ud.ah = ah;
  swr.wr.ud.remote_qpn = qpn;
  swr.wr.ud.remote_qkey = qkey;
  ibv_send_wr* bad_s = nullptr;
  ASSERT_EQ(ibv_post_send(C.id->qp, &swr, &bad_s), 0);
  EXPECT_EQ(cs.poll_one().status, IBV_WC_SUCCESS);
  ibv_wc wc = ss.poll_one();
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 40u + 256u);
  EXPECT_EQ(wc.src_qp, C.id->qp->qp_num);
  EXPECT_EQ(memcmp(ss.buf.data() + 40, cs.buf.data(), 256), 0);
  ibv_destroy_ah(ah);
  ss.release();
  EXPECT_EQ(rdma_destroy_id(child), 0);
}

// A SIDR_REP other than "valid QP" ends in UNREACHABLE with the SIDR status, as with the kernel:
// 2 when the service rejects, 1 when no service listens on the port.
TEST(RdmaCm, UdRejectAndNobodyListeningAreUnreachable) {
  {
    Listener L(RDMA_PS_UDP);
    ASSERT_NE(L.port, 0);
    Client C;
    ASSERT_TRUE(C.resolve(L.port, RDMA_PS_UDP));
    rdma_conn_param cp{};
    ASSERT_EQ(rdma_connect(C.id, &cp), 0);
    rdma_cm_event* ev = next_event(L.ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) << name(ev);
    rdma_cm_id* child = ev->id;
    rdma_ack_cm_event(ev);
    ASSERT_EQ(rdma_reject(child, nullptr, 0), 0);
    ev = next_event(C.ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_UNREACHABLE) << name(ev);
    EXPECT_EQ(ev->status, 2);
    rdma_ack_cm_event(ev);
    EXPECT_EQ(rdma_destroy_id(child), 0);
  }
  uint16_t port;
  {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a = addr(kIp, 0);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t l = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
    port = ntohs(a.sin_port);
    close(fd);
  }
  Client C;
  ASSERT_TRUE(C.resolve(port, RDMA_PS_UDP));
  rdma_conn_param cp{};
  ASSERT_EQ(rdma_connect(C.id, &cp), 0);
  rdma_cm_event* ev = next_event(C.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_UNREACHABLE) << name(ev);
  EXPECT_EQ(ev->status, 1);
  rdma_ack_cm_event(ev);
}

// rdma_join_multicast: MULTICAST_JOIN hands out the group's address vector (QPN 0xFFFFFF, the UDP
// Q_Key); the id's QP is attached when the event is read, and receives what is sent to the group.
TEST(RdmaCm, MulticastJoinAttachesTheQp) {
  sockaddr_in group = addr("239.0.0.1", 0);
  group.sin_addr.s_addr = htonl(0xEF000000u | (static_cast<uint32_t>(getpid()) & 0xFFFF) << 8 | 7);
  struct Member {
    rdma_event_channel* ch = rdma_create_event_channel();
    rdma_cm_id* id = nullptr;
    Side side;
    ibv_ah* ah = nullptr;
    ~Member() {
      if (ah) ibv_destroy_ah(ah);
      side.release();
      if (id) rdma_destroy_id(id);
      if (ch) rdma_destroy_event_channel(ch);
    }
  } rx, tx;
  int ctx_rx = 1, ctx_tx = 2;
  for (Member* m : {&rx, &tx}) {
    ASSERT_EQ(rdma_create_id(m->ch, &m->id, nullptr, RDMA_PS_UDP), 0);
    // As mckey: resolving the group from a source address attaches the id to that address's device
    // (binding a loopback address alone attaches none, as in the kernel).
    sockaddr_in a = addr(kIp, 0);
    ASSERT_EQ(rdma_resolve_addr(m->id, reinterpret_cast<sockaddr*>(&a), reinterpret_cast<sockaddr*>(&group), 2000), 0);
    rdma_cm_event* rev = next_event(m->ch);
    ASSERT_TRUE(rev && rev->event == RDMA_CM_EVENT_ADDR_RESOLVED) << name(rev);
    rdma_ack_cm_event(rev);
    ASSERT_TRUE(m->side.setup(m->id, 4096, IBV_QPT_UD));
    ASSERT_EQ(rdma_join_multicast(m->id, reinterpret_cast<sockaddr*>(&group), m == &rx ? &ctx_rx : &ctx_tx), 0);
    rdma_cm_event* ev = next_event(m->ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_MULTICAST_JOIN) << name(ev);
    EXPECT_EQ(ev->param.ud.private_data, m == &rx ? &ctx_rx : &ctx_tx);
    EXPECT_EQ(ev->param.ud.qp_num, 0xFFFFFFu);
    EXPECT_EQ(ev->param.ud.qkey, static_cast<uint32_t>(RDMA_UDP_QKEY));
    EXPECT_EQ(ev->param.ud.ah_attr.is_global, 1);
    EXPECT_EQ(memcmp(ev->param.ud.ah_attr.grh.dgid.raw + 12, &group.sin_addr.s_addr, 4), 0);
    m->ah = ibv_create_ah(m->side.pd, &ev->param.ud.ah_attr);
    rdma_ack_cm_event(ev);
    ASSERT_NE(m->ah, nullptr);
  }
  EXPECT_EQ(rdma_join_multicast(rx.id, reinterpret_cast<sockaddr*>(&group), nullptr), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  ibv_sge rs = rx.side.sge(0, 40 + 64);
  ibv_recv_wr rwr{};
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  ibv_recv_wr* bad_r = nullptr;
  ASSERT_EQ(ibv_post_recv(rx.id->qp, &rwr, &bad_r), 0);
  for (size_t i = 0; i < 64; ++i) tx.side.buf[i] = static_cast<uint8_t>(i * 3);
  ibv_sge s = tx.side.sge(0, 64);
  ibv_send_wr swr{};
  swr.sg_list = &s;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  swr.wr.ud.ah = tx.ah;
  swr.wr.ud.remote_qpn = 0xFFFFFF;
  swr.wr.ud.remote_qkey = RDMA_UDP_QKEY;
  ibv_send_wr* bad_s = nullptr;
  ASSERT_EQ(ibv_post_send(tx.id->qp, &swr, &bad_s), 0);
  EXPECT_EQ(tx.side.poll_one().status, IBV_WC_SUCCESS);
  ibv_wc wc = rx.side.poll_one();
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 40u + 64u);
  EXPECT_EQ(memcmp(rx.side.buf.data() + 40, tx.side.buf.data(), 64), 0);
  EXPECT_EQ(rdma_leave_multicast(rx.id, reinterpret_cast<sockaddr*>(&group)), 0);
  EXPECT_EQ(rdma_leave_multicast(rx.id, reinterpret_cast<sockaddr*>(&group)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
}

// Data before a disconnect: the peer (another process, so the intra-host direct path when it is on)
// posts N SENDs after our "go", has them completed, and disconnects at once. When DISCONNECTED
// arrives, one poll of our CQ, without waiting, must return our own SEND's completion and all N
// receive completions, in order, with status success -- as on hardware, where an acknowledged SEND's
// receive completion is in the CQ before the peer's DREQ can be. Our SEND's completion stays in the
// CQ on purpose: a poll that finds the ring not empty must still see what the peer left. Many rounds,
// since a lost ordering shows in some rounds only.
TEST(RdmaCm, SendsBeforeDisconnectAreCompleteWhenDisconnectedArrives) {
  constexpr int kSends = 6, kRounds = 60;
  Listener L;
  ASSERT_NE(L.port, 0);
  Peer P;
  ASSERT_TRUE(P.start({"sends", kIp, std::to_string(L.port), std::to_string(kSends), std::to_string(kRounds)}));
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    rdma_cm_event* ev = next_event(L.ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) << name(ev);
    rdma_cm_id* child = ev->id;
    rdma_ack_cm_event(ev);
    std::vector<uint32_t> buf(kSends + 1, 0xFFFFFFFFu);
    ibv_pd* pd = ibv_alloc_pd(child->verbs);
    ASSERT_NE(pd, nullptr);
    ibv_cq* cq = ibv_create_cq(child->verbs, 2 * kSends + 4, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size() * 4, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr);
    ibv_qp_init_attr qa{};
    qa.qp_type = IBV_QPT_RC;
    qa.send_cq = qa.recv_cq = cq;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = kSends + 1;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    ASSERT_EQ(rdma_create_qp(child, pd, &qa), 0);
    for (int i = 0; i < kSends; ++i) {
      ibv_sge rs{reinterpret_cast<uint64_t>(&buf[1 + i]), 4, mr->lkey};
      ibv_recv_wr rwr{};
      rwr.wr_id = 100 + i;
      rwr.sg_list = &rs;
      rwr.num_sge = 1;
      ibv_recv_wr* bad_r = nullptr;
      ASSERT_EQ(ibv_post_recv(child->qp, &rwr, &bad_r), 0);
    }
    rdma_conn_param ap{};
    ap.rnr_retry_count = 7;
    ap.retry_count = 7;
    ASSERT_EQ(rdma_accept(child, &ap), 0);
    ev = next_event(L.ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->id == child) << name(ev);
    rdma_ack_cm_event(ev);
    buf[0] = 0x60;
    ibv_sge s{reinterpret_cast<uint64_t>(&buf[0]), 4, mr->lkey};
    ibv_send_wr swr{};
    swr.wr_id = 7;
    swr.sg_list = &s;
    swr.num_sge = 1;
    swr.opcode = IBV_WR_SEND;
    swr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad_s = nullptr;
    ASSERT_EQ(ibv_post_send(child->qp, &swr, &bad_s), 0);
    ev = next_event(L.ch);
    ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_DISCONNECTED && ev->id == child) << name(ev);
    rdma_ack_cm_event(ev);
    ibv_wc wc[2 * kSends + 4];
    const int got = ibv_poll_cq(cq, 2 * kSends + 4, wc);
    int recvs = 0, sends = 0;
    std::string bad;
    for (int i = 0; i < got; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS)
        bad += " wr_id " + std::to_string(wc[i].wr_id) + " status " + ibv_wc_status_str(wc[i].status) + ";";
      else if (wc[i].opcode == IBV_WC_SEND)
        ++sends;
      else if (wc[i].opcode == IBV_WC_RECV && wc[i].wr_id == static_cast<uint64_t>(100 + recvs) && wc[i].byte_len == 4)
        ++recvs;
      else
        bad += " unexpected wr_id " + std::to_string(wc[i].wr_id) + ";";
    }
    EXPECT_EQ(recvs, kSends) << "receive completions found by the one poll after DISCONNECTED (" << got
                             << " completions in all)" << bad;
    EXPECT_EQ(sends, 1) << "our own SEND's completion" << bad;
    for (int i = 0; i < recvs; ++i) EXPECT_EQ(buf[1 + i], static_cast<uint32_t>(i)) << "payload of SEND " << i;
    rdma_destroy_qp(child);
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    EXPECT_EQ(rdma_destroy_id(child), 0);
    if (HasFatalFailure()) break;
  }
  EXPECT_EQ(P.wait(), 0) << "the peer failed (its stderr says at which round and step)";
}

}  // namespace
