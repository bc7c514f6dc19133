// rsockets (rdma/rsocket.h) over softrdma's librdmacm. Two kinds of programs, public API only, that
// would pass against rdma-core's librdmacm on a RoCE NIC (with 127.0.0.1 replaced by its address):
// - RsocketWire: one end is an rsocket, the other plain rdma_cm + verbs speaking rdma-core's rsocket
//   protocol by hand (its facts: librdmacm/rsocket.c), so the bytes on the wire are checked, not
//   only that two of our rsockets agree: the connection private data, DATA as RDMA WRITE WITH
//   IMMEDIATE at the granted address, the SGL update, credits, CTRL DISCONNECT.
// - Rsocket: two rsockets, with buffers and queues small enough that credits run out, the receive
//   ring wraps many times and one send is many times the buffer; shutdown and rpoll.
#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "cm_helpers.h"

namespace {

using namespace softrdma::cm_test;

// rdma-core's rsocket protocol, version 1, as its peer sees it (rsocket.c: struct rs_sge,
// struct rs_conn_data, the immediate data's op << 29 | data).
struct WireSge {
  uint64_t addr;
  uint32_t key;
  uint32_t length;
};
struct WireConnData {
  uint8_t version;
  uint8_t flags;
  uint16_t credits;  // big-endian
  uint8_t reserved[3];
  uint8_t target_iomap_size;
  WireSge target_sgl;  // big-endian fields
  WireSge data_buf;
};
static_assert(sizeof(WireConnData) == 40);
constexpr uint32_t kOpData = 0, kOpSgl = 4, kOpCtrl = 7, kCtrlDisconnect = 0;
constexpr uint32_t imm(uint32_t op, uint32_t data) { return op << 29 | data; }

int set_int(int fd, int level, int name, int v) { return rsetsockopt(fd, level, name, &v, sizeof v); }

// Posts one RDMA WRITE WITH IMMEDIATE (len bytes of the side's buffer at off; none when len is 0).
bool write_imm(Side& s, size_t off, uint32_t len, uint64_t raddr, uint32_t rkey, uint32_t imm_host) {
  ibv_sge sge = s.sge(off, len);
  ibv_send_wr wr{}, *bad = nullptr;
  wr.sg_list = len ? &sge : nullptr;
  wr.num_sge = len ? 1 : 0;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htobe32(imm_host);
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  if (ibv_post_send(s.id->qp, &wr, &bad)) return false;
  return s.poll_one().status == IBV_WC_SUCCESS;
}

bool post_recvs(Side& s, int n) {
  for (int i = 0; i < n; ++i) {
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = 100 + i;
    if (ibv_post_recv(s.id->qp, &wr, &bad)) return false;
  }
  return true;
}

TEST(RsocketWire, ConnectionDataDataCreditsSglUpdateAndDisconnectAsRdmaCoreSpeaksThem) {
  Listener L;
  ASSERT_NE(L.port, 0);
  // The rsocket: receive buffer 8 KiB (SO_RCVBUF is doubled, as with TCP), 32 receive credits.
  int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(set_int(fd, SOL_SOCKET, SO_RCVBUF, 4096), 0);
  ASSERT_EQ(set_int(fd, SOL_RDMA, RDMA_RQSIZE, 32), 0);
  ASSERT_EQ(rfcntl(fd, F_SETFL, O_NONBLOCK), 0);
  sockaddr_in to = addr(kIp, L.port);
  ASSERT_EQ(rconnect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), -1);
  ASSERT_EQ(errno, EINPROGRESS);

  rdma_cm_event* ev = next_event(L.ch);
  ASSERT_TRUE(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) << name(ev);
  ASSERT_GE(ev->param.conn.private_data_len, sizeof(WireConnData));
  WireConnData req;
  memcpy(&req, ev->param.conn.private_data, sizeof req);
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  EXPECT_EQ(req.version, 1);
  EXPECT_EQ(req.flags & 0x1, 0) << "little-endian host: RS_CONN_FLAG_NET clear";
  EXPECT_NE(req.flags & 0x2, 0) << "RS_CONN_FLAG_IOMAP";
  EXPECT_EQ(be16toh(req.credits), 32);
  EXPECT_EQ(be32toh(req.target_sgl.length), 2u);
  EXPECT_EQ(be32toh(req.data_buf.length), 4096u) << "the first half of the receive buffer";
  const uint64_t cli_buf = be64toh(req.data_buf.addr);
  const uint32_t cli_key = be32toh(req.data_buf.key);

  // This end: data buffer [0, 4096), target SGL at 4096, staging for its own writes at 8192.
  Side s;
  ASSERT_TRUE(s.setup(child, 16384));
  ASSERT_TRUE(post_recvs(s, 8));
  WireConnData rep{};
  rep.version = 1;
  rep.flags = 0x2;
  rep.credits = htobe16(4);
  rep.target_sgl = {htobe64(reinterpret_cast<uint64_t>(s.buf.data() + 4096)), htobe32(s.mr->rkey), htobe32(2)};
  rep.data_buf = {htobe64(reinterpret_cast<uint64_t>(s.buf.data())), htobe32(s.mr->rkey), htobe32(4096)};
  rdma_conn_param ap = conn_param(&rep, sizeof rep, 1, 1, 7, 7);
  ASSERT_EQ(rdma_accept(child, &ap), 0);

  pollfd p{fd, POLLOUT, 0};
  ASSERT_EQ(rpoll(&p, 1, kWaitMs), 1);
  ASSERT_TRUE(p.revents & POLLOUT) << p.revents;

  // Four credits: four messages go, the fifth waits for an SGL update.
  const char* msgs[] = {"hello", "m1", "m2", "m3"};
  for (const char* m : msgs) ASSERT_EQ(rsend(fd, m, strlen(m), 0), static_cast<ssize_t>(strlen(m))) << m;
  EXPECT_EQ(rsend(fd, "m4", 2, 0), -1);
  EXPECT_EQ(errno, EWOULDBLOCK);

  // What arrived: each DATA a WRITE WITH IMMEDIATE (op 0, its length) placed back to back from the
  // start of the granted buffer, and the rsocket's grant of the second half of its buffer (op 4)
  // written into our target SGL entry 1.
  std::string data;
  int sgl_updates = 0;
  for (int got = 0; got < 5;) {
    ibv_wc wc = s.poll_one();
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    ASSERT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    ASSERT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
    const uint32_t m = be32toh(wc.imm_data);
    if (m >> 29 == kOpSgl) {
      WireSge e;
      memcpy(&e, s.buf.data() + 4096 + sizeof e, sizeof e);
      EXPECT_EQ(e.addr, cli_buf + 4096);
      EXPECT_EQ(e.length, 4096u);
      EXPECT_EQ(e.key, cli_key);
      sgl_updates++;
    } else {
      ASSERT_EQ(m >> 29, kOpData);
      data.append(reinterpret_cast<const char*>(s.buf.data()) + data.size(), m & 0x1FFFFFFF);
    }
    got++;
  }
  EXPECT_EQ(data, "hellom1m2m3");
  EXPECT_EQ(sgl_updates, 1);

  // Credits up to message 8: the fifth goes.
  ASSERT_TRUE(write_imm(s, 0, 0, 0, 0, imm(kOpSgl, 8)));
  p = {fd, POLLOUT, 0};
  ASSERT_EQ(rpoll(&p, 1, kWaitMs), 1);
  ASSERT_EQ(rsend(fd, "m4", 2, 0), 2);
  ibv_wc wc = s.poll_one();
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(be32toh(wc.imm_data), imm(kOpData, 2));
  EXPECT_EQ(memcmp(s.buf.data() + data.size(), "m4", 2), 0);

  // DATA the other way, at the start of the buffer the rsocket granted in its private data.
  memcpy(s.buf.data() + 8192, "pong!", 5);
  ASSERT_TRUE(write_imm(s, 8192, 5, cli_buf, cli_key, imm(kOpData, 5)));
  char in[16] = {};
  p = {fd, POLLIN, 0};
  ASSERT_EQ(rpoll(&p, 1, kWaitMs), 1);
  ASSERT_EQ(rrecv(fd, in, sizeof in, 0), 5);
  EXPECT_STREQ(in, "pong!");

  // CTRL DISCONNECT: end of stream.
  ASSERT_TRUE(write_imm(s, 0, 0, 0, 0, imm(kOpCtrl, kCtrlDisconnect)));
  p = {fd, POLLIN, 0};
  ASSERT_EQ(rpoll(&p, 1, kWaitMs), 1);
  EXPECT_EQ(rrecv(fd, in, sizeof in, 0), 0);
  EXPECT_EQ(rclose(fd), 0);
  s.release();
  rdma_destroy_id(child);
}

// A connected pair of rsockets on 127.0.0.1; opts runs on each before it connects or listens.
struct Pair {
  int a = -1, b = -1;
  template <typename Opts>
  explicit Pair(Opts opts) {
    int l = rsocket(AF_INET, SOCK_STREAM, 0);
    if (l < 0) return;
    opts(l);
    sockaddr_in sa = addr(kIp, 0);
    socklen_t len = sizeof sa;
    if (rbind(l, reinterpret_cast<sockaddr*>(&sa), sizeof sa) || rlisten(l, 4) ||
        rgetsockname(l, reinterpret_cast<sockaddr*>(&sa), &len)) {
      rclose(l);
      return;
    }
    std::thread acceptor([&] { b = raccept(l, nullptr, nullptr); });
    a = rsocket(AF_INET, SOCK_STREAM, 0);
    opts(a);
    if (rconnect(a, reinterpret_cast<sockaddr*>(&sa), sizeof sa)) {
      rclose(a);
      a = -1;
    }
    acceptor.join();
    rclose(l);
  }
  ~Pair() {
    if (a >= 0) rclose(a);
    if (b >= 0) rclose(b);
  }
};

uint8_t pattern(size_t i) { return static_cast<uint8_t>(i * 131 + (i >> 13)); }

// Receives exactly n bytes (n > 0), checking each against pattern(offset).
::testing::AssertionResult recv_checked(int fd, size_t n, size_t chunk) {
  std::vector<uint8_t> in(chunk);
  for (size_t off = 0; off < n;) {
    ssize_t r = rrecv(fd, in.data(), std::min(chunk, n - off), 0);
    if (r <= 0) return ::testing::AssertionFailure() << "rrecv " << r << " errno " << errno << " at " << off;
    for (ssize_t i = 0; i < r; ++i)
      if (in[i] != pattern(off + i)) return ::testing::AssertionFailure() << "byte " << off + i << " differs";
    off += static_cast<size_t>(r);
  }
  return ::testing::AssertionSuccess();
}

TEST(Rsocket, StreamOutrunsCreditsAndWrapsTheRingManyTimesEveryByteInOrder) {
  // 4 KiB receive buffer (2 KiB grants) and 16 credits: 8 MiB is 4096 grants and far more messages
  // than credits, in sends of changing sizes and receives of another size.
  Pair P([](int fd) {
    set_int(fd, SOL_SOCKET, SO_RCVBUF, 2048);
    set_int(fd, SOL_SOCKET, SO_SNDBUF, 2048);
    set_int(fd, SOL_RDMA, RDMA_RQSIZE, 16);
    set_int(fd, SOL_RDMA, RDMA_SQSIZE, 16);
  });
  ASSERT_GE(P.a, 0);
  ASSERT_GE(P.b, 0);
  constexpr size_t kTotal = 8 << 20;
  std::thread sender([&] {
    std::vector<uint8_t> out(70000);
    for (size_t off = 0, k = 0; off < kTotal; ++k) {
      const size_t n = std::min(kTotal - off, size_t{1} + (k * 7919) % out.size());
      for (size_t i = 0; i < n; ++i) out[i] = pattern(off + i);
      ssize_t w = rsend(P.a, out.data(), n, 0);
      if (w <= 0) return;
      off += static_cast<size_t>(w);
    }
  });
  EXPECT_TRUE(recv_checked(P.b, kTotal, 3001));
  sender.join();
}

TEST(Rsocket, OneSendManyTimesTheReceiveBufferArrivesWhole) {
  Pair P([](int fd) { set_int(fd, SOL_SOCKET, SO_RCVBUF, 4096); });
  ASSERT_GE(P.a, 0);
  ASSERT_GE(P.b, 0);
  constexpr size_t kLen = 3 << 20;
  std::vector<uint8_t> out(kLen), in(kLen);
  for (size_t i = 0; i < kLen; ++i) out[i] = pattern(i);
  ssize_t sent = -2;
  std::thread sender([&] { sent = rsend(P.a, out.data(), kLen, 0); });
  EXPECT_EQ(rrecv(P.b, in.data(), kLen, MSG_WAITALL), static_cast<ssize_t>(kLen));
  sender.join();
  EXPECT_EQ(sent, static_cast<ssize_t>(kLen));
  EXPECT_TRUE(in == out);
}

TEST(Rsocket, ShutdownWriteEndsThePeersStreamWhileItStillAnswers) {
  Pair P([](int) {});
  ASSERT_GE(P.a, 0);
  ASSERT_GE(P.b, 0);
  ASSERT_EQ(rsend(P.a, "question", 8, 0), 8);
  ASSERT_EQ(rshutdown(P.a, SHUT_WR), 0);
  EXPECT_EQ(rsend(P.a, "more", 4, 0), -1) << "no sends after SHUT_WR";
  char buf[32] = {};
  ASSERT_EQ(rrecv(P.b, buf, sizeof buf, MSG_WAITALL), 8) << "the data, then end of stream";
  EXPECT_STREQ(buf, "question");
  EXPECT_EQ(rrecv(P.b, buf, sizeof buf, 0), 0);
  ASSERT_EQ(rsend(P.b, "answer", 6, 0), 6) << "the other direction stays open";
  memset(buf, 0, sizeof buf);
  ASSERT_EQ(rrecv(P.a, buf, 6, MSG_WAITALL), 6);
  EXPECT_STREQ(buf, "answer");
  // The peer closes: the rest of its direction ends too.
  ASSERT_EQ(rclose(P.b), 0);
  P.b = -1;
  EXPECT_EQ(rrecv(P.a, buf, sizeof buf, 0), 0);
}

TEST(Rsocket, NonblockingRecvWouldBlockUntilRpollSeesData) {
  Pair P([](int) {});
  ASSERT_GE(P.a, 0);
  ASSERT_GE(P.b, 0);
  ASSERT_EQ(rfcntl(P.b, F_SETFL, O_NONBLOCK), 0);
  EXPECT_EQ(rfcntl(P.b, F_GETFL), O_NONBLOCK);
  char c;
  EXPECT_EQ(rrecv(P.b, &c, 1, 0), -1);
  EXPECT_EQ(errno, EWOULDBLOCK);
  pollfd p{P.b, POLLIN, 0};
  EXPECT_EQ(rpoll(&p, 1, 0), 0);
  std::thread sender([&] { rsend(P.a, "x", 1, 0); });
  p.revents = 0;
  ASSERT_EQ(rpoll(&p, 1, kWaitMs), 1);
  EXPECT_TRUE(p.revents & POLLIN);
  EXPECT_EQ(rrecv(P.b, &c, 1, 0), 1);
  EXPECT_EQ(c, 'x');
  sender.join();
  sockaddr_in peer{}, self{};
  socklen_t pl = sizeof peer, sl = sizeof self;
  ASSERT_EQ(rgetpeername(P.b, reinterpret_cast<sockaddr*>(&peer), &pl), 0);
  ASSERT_EQ(rgetsockname(P.a, reinterpret_cast<sockaddr*>(&self), &sl), 0);
  EXPECT_EQ(peer.sin_port, self.sin_port) << "the accepted socket's peer is the connecting socket";
}

// A free number below an open fd, as when another thread closed one: returns the open fd (the caller
// closes it), or -1.
int open_fd_above_a_gap() {
  const int gap = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int above = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (gap >= 0) close(gap);
  return gap >= 0 && above > gap ? above : -1;
}

// rdma-core's librspreload makes an fd of its own, then the rsocket behind it, and maps its fds back
// from rsocket numbers by scanning upwards: an rsocket numbered below that fd breaks its select().
TEST(Rsocket, NumberedAboveEveryFdOpenWhenMadeStreamDatagramAndAccepted) {
  for (int type : {SOCK_STREAM, SOCK_DGRAM}) {
    const int above = open_fd_above_a_gap();
    ASSERT_GE(above, 0);
    const int s = rsocket(AF_INET, type, 0);
    EXPECT_GT(s, above) << "type " << type;
    // Still a working socket under its new number.
    sockaddr_in sa = addr(kIp, 0);
    EXPECT_EQ(rbind(s, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << "type " << type;
    EXPECT_EQ(rclose(s), 0);
    close(above);
  }
  const int l = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(l, 0);
  sockaddr_in sa = addr(kIp, 0);
  socklen_t len = sizeof sa;
  ASSERT_EQ(rbind(l, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(rlisten(l, 4), 0);
  ASSERT_EQ(rgetsockname(l, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  const int c = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(c, 0);
  std::thread connector([&] { EXPECT_EQ(rconnect(c, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0); });
  const int above = open_fd_above_a_gap();
  ASSERT_GE(above, 0);
  const int b = raccept(l, nullptr, nullptr);
  connector.join();
  EXPECT_GT(b, above);
  ASSERT_EQ(rsend(c, "x", 1, 0), 1);
  char in = 0;
  EXPECT_EQ(rrecv(b, &in, 1, 0), 1);
  EXPECT_EQ(in, 'x');
  close(above);
  rclose(b);
  rclose(c);
  rclose(l);
}

TEST(Rsocket, CallsOnSomethingThatIsNoRsocketFailWithEbadf) {
  char c;
  EXPECT_EQ(rrecv(0, &c, 1, 0), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(rsend(-1, &c, 1, 0), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(rsocket(AF_UNIX, SOCK_STREAM, 0), -1);
  EXPECT_EQ(errno, ENOTSUP);
}

}  // namespace

namespace {

// A datagram rsocket bound to 127.0.0.1 (an ephemeral port), and that address.
struct Dgram {
  int fd = rsocket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in at = addr(kIp, 0);
  Dgram() {
    socklen_t len = sizeof at;
    if (fd < 0 || rbind(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) ||
        rgetsockname(fd, reinterpret_cast<sockaddr*>(&at), &len))
      fd = -1;
  }
  ~Dgram() {
    if (fd >= 0) rclose(fd);
  }
};

// Waits (bounded) for one datagram; returns its length, its text in out and its sender in from.
ssize_t recv_one(int fd, std::string& out, sockaddr_in& from) {
  pollfd p{fd, POLLIN, 0};
  if (rpoll(&p, 1, kWaitMs) != 1) return -1;
  char buf[4096];
  socklen_t len = sizeof from;
  ssize_t n = rrecvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
  if (n >= 0) out.assign(buf, static_cast<size_t>(n));
  return n;
}

TEST(RsocketDgram, DatagramsBothWaysFirstOverUdpThenOverUdEachFromItsSender) {
  Dgram A, B;
  ASSERT_GE(A.fd, 0);
  ASSERT_GE(B.fd, 0);
  // The first datagrams find the peer through its UDP socket; later ones go by UD SENDs. Either
  // way each arrives whole, once, with its sender's address.
  for (int i = 0; i < 50; ++i) {
    const std::string ping = "ping-" + std::to_string(i);
    ASSERT_EQ(rsendto(A.fd, ping.data(), ping.size(), 0, reinterpret_cast<sockaddr*>(&B.at), sizeof B.at),
              static_cast<ssize_t>(ping.size()));
    std::string got;
    sockaddr_in from{};
    ASSERT_EQ(recv_one(B.fd, got, from), static_cast<ssize_t>(ping.size())) << i;
    EXPECT_EQ(got, ping);
    EXPECT_EQ(from.sin_port, A.at.sin_port);
    EXPECT_EQ(from.sin_addr.s_addr, A.at.sin_addr.s_addr);
    const std::string pong = "pong-" + std::to_string(i) + std::string(static_cast<size_t>(i) * 30, 'x');
    ASSERT_EQ(rsendto(B.fd, pong.data(), pong.size(), 0, reinterpret_cast<sockaddr*>(&from), sizeof from),
              static_cast<ssize_t>(pong.size()));
    ASSERT_EQ(recv_one(A.fd, got, from), static_cast<ssize_t>(pong.size())) << i;
    EXPECT_EQ(got, pong);
    EXPECT_EQ(from.sin_port, B.at.sin_port);
  }
  char big[2048] = {};
  EXPECT_EQ(rsendto(A.fd, big, sizeof big, 0, reinterpret_cast<sockaddr*>(&B.at), sizeof B.at), -1)
      << "with its 8-byte header a datagram is at most 2048 bytes";
  EXPECT_EQ(errno, EMSGSIZE);
}

}  // namespace
