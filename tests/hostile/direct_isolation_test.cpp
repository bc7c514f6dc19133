// Attacks on the intra-host direct path (docs/direct-path.md, docs/security.md): a local process that
// talks to a victim context's direct-path socket (abstract Unix socket softrdma-direct-<ip>-<port>)
// without being the victim's connected RC peer gets no fd at all -- not the arena, not a share of
// registered memory, not a doorbell or wake-up pipe -- whether it is another user (a throwaway uid, when
// the test runs as root) or the same user; a connected peer gets share fds only for the access its rkey
// grants; a connected peer that writes garbage into the victim's inbox harms only that QP. And a
// cross-user RC pair still works, by packets.
#include "hostile.h"
#include "two_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/kcmp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "transport/direct.h"  // the layout of the shared block and the inbox (header only)
#include "verbs/private_abi.h"    // softrdma_set_option

namespace softrdma::hostile_test {
namespace {

using transport::DirectInbox;
using transport::DirectShared;
using transport::DirectSrqDesc;

constexpr uid_t kAttackerId = 61234;
// A context that serves the direct path whatever the environment says (also under the CI's second
// pass, SOFTRDMA_DIRECT=0): its own setting (Device(settings), softrdma_open_device_with).
constexpr const char* kDirect = "SOFTRDMA_DIRECT=1";

// The direct-path protocol, as an attacker writes it (transport/direct.cpp).
enum : uint32_t { kHello = 1, kQpDesc = 2, kMap = 3, kDoorbell = 4, kWake = 5 };
struct Req {
  uint32_t type, writable;
  uint64_t arg;
};
struct Rep {
  int32_t status;
  uint32_t index;
  uint64_t a, b, c, d;  // kHello: arena size, DirectShared offset, layout, writable area size
};

// What one request got back: a reply (its status) or none (closed), and any fds passed with it
// (kHello: the arena, then the writable area).
struct Answer {
  bool replied = false;
  Rep rep{};
  int fd = -1;
  int fd2 = -1;
  void close_fds() {
    if (fd >= 0) close(fd);
    if (fd2 >= 0) close(fd2);
    fd = fd2 = -1;
  }
};

sockaddr_un direct_address(const net::Endpoint& ep, socklen_t* len) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  int n = snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "softrdma-direct-%08x-%u", ep.ip_key, ep.port);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return sa;
}

int connect_to(const sockaddr_un& sa, socklen_t len) {
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  timeval tv{2, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(s, reinterpret_cast<const sockaddr*>(&sa), len) != 0) {
    close(s);
    return -1;
  }
  return s;
}

Answer ask(int s, const Req& r) {
  Answer ans;
  // A server that refused us at accept has queued its EPERM and closed: the send may fail, the reply
  // is still there to read.
  (void)send(s, &r, sizeof r, MSG_NOSIGNAL);
  iovec iov{&ans.rep, sizeof ans.rep};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(2 * sizeof(int))];
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof ctl;
  ssize_t n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
  // A server that closed us with our request unread reports ECONNRESET once; its reply still follows.
  if (n < 0 && errno == ECONNRESET) n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); n > 0 && c; c = CMSG_NXTHDR(&mh, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int fds[2] = {-1, -1};
      std::memcpy(fds, CMSG_DATA(c), std::min<size_t>(2, (c->cmsg_len - CMSG_LEN(0)) / sizeof(int)) * sizeof(int));
      ans.fd = fds[0];
      ans.fd2 = fds[1];
    }
  ans.replied = n == static_cast<ssize_t>(sizeof ans.rep);
  return ans;
}

// What a connected peer maps from a kHello answer (whose fds it closes): the arena read-only, the
// writable area read-write, and the DirectShared block in the arena. Unmapped when it goes.
struct PeerMaps {
  void* m = MAP_FAILED;
  void* wm = MAP_FAILED;
  size_t arena_len = 0, rw_len = 0;
  const uint8_t* arena = nullptr;
  uint8_t* rw = nullptr;
  const DirectShared* sh = nullptr;
  ~PeerMaps() {
    if (m != MAP_FAILED) munmap(m, arena_len);
    if (wm != MAP_FAILED) munmap(wm, rw_len);
  }
};

void map_peer(Answer& hello, PeerMaps* p) {
  p->arena_len = hello.rep.a;
  p->rw_len = hello.rep.d;
  p->m = mmap(nullptr, p->arena_len, PROT_READ, MAP_SHARED, hello.fd, 0);
  p->wm = mmap(nullptr, p->rw_len, PROT_READ | PROT_WRITE, MAP_SHARED, hello.fd2, 0);
  hello.close_fds();
  ASSERT_NE(p->m, MAP_FAILED);
  ASSERT_NE(p->wm, MAP_FAILED);
  p->arena = static_cast<const uint8_t*>(p->m);
  p->rw = static_cast<uint8_t*>(p->wm);
  p->sh = reinterpret_cast<const DirectShared*>(p->arena + hello.rep.b);
}

// True once the server has closed our socket (EOF within 2 s).
bool closed_by_server(int s) {
  pollfd pf{s, POLLIN, 0};
  if (poll(&pf, 1, 2000) <= 0) return false;
  char b;
  return recv(s, &b, 1, MSG_DONTWAIT) == 0;
}

// Becomes uid 61234 with no supplementary groups and gid `gid` (61234: a stranger; our gid: a member of
// our primary group, for SOFTRDMA_DIRECT_PEERS=group).
bool drop_to_attacker(gid_t gid = kAttackerId) {
  return setgroups(0, nullptr) == 0 && setresgid(gid, gid, gid) == 0 &&
         setresuid(kAttackerId, kAttackerId, kAttackerId) == 0 && geteuid() == kAttackerId;
}

// Runs f in a forked child (that touches no verbs object) and returns its exit status (-1: no child).
template <class F>
int in_child(F f) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) _exit(f());
  int st = 0;
  if (!reap_within(pid, 30, &st) || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

uint64_t refused_of(uint32_t qpn) {
  auto s = read_stats(qpn);
  return s ? s->dev.direct_refused : 0;
}

class DirectIsolation : public ::testing::Test {
 protected:
  void SetUp() override {
    // Both contexts of the pair serve the direct path (the default; also under the CI's second pass).
    p = std::make_unique<Pair>(kDirect);
    ASSERT_TRUE(p->up());
    // The legitimate peer a connects to b's server on its first WQE (b reached RTR after a): that one.
    p->sanity();
    sa = direct_address(p->ep, &sa_len);
  }
  void TearDown() override { p.reset(); }
  static bool root() { return geteuid() == 0; }

  std::unique_ptr<Pair> p;
  sockaddr_un sa{};
  socklen_t sa_len = 0;
};

// (a) Another user: refused at accept (EPERM), closed, no fd -- whatever it asks, even naming the
// real connection.
TEST_F(DirectIsolation, OtherUserGetsNothing) {
  if (!root()) GTEST_SKIP() << "needs root to run the attacker as uid " << kAttackerId;
  const uint64_t before = refused_of(p->b.qpn());
  const uint64_t conn = uint64_t{p->b.qpn()} << 32 | p->a.qpn();
  const uint32_t rkey = p->target->rkey();
  const Req reqs[] = {{kHello, 0, conn}, {kMap, 1, rkey}, {kDoorbell, 0, 0}, {kWake, 0, p->b.qpn()}};
  for (const Req& r : reqs) {
    int rc = in_child([&] {
      if (!drop_to_attacker()) return 2;
      int s = connect_to(sa, sa_len);
      if (s < 0) return 3;
      Answer ans = ask(s, r);
      if (ans.fd >= 0) return 4;  // got an fd: the attack worked
      if (!ans.replied || ans.rep.status != EPERM) return 5;
      if (!closed_by_server(s)) return 6;
      return 0;
    });
    EXPECT_EQ(rc, 0) << "request type " << r.type;
  }
  EXPECT_EQ(refused_of(p->b.qpn()) - before, 4u) << "each refusal counted";
  p->expect_memory_intact();
  p->sanity();  // the real pair is unaffected
}

// (a) The same user, but not the victim's connected peer: a QPN pair that is not a connection, or the
// real pair's QPNs named by a process that does not own the initiator QPN.
TEST_F(DirectIsolation, SameUserWithoutConnectionGetsNoArena) {
  const uint64_t before = refused_of(p->b.qpn());
  {
    int s = connect_to(sa, sa_len);
    ASSERT_GE(s, 0);
    Answer ans = ask(s, {kHello, 0, uint64_t{p->b.qpn()} << 32 | 0x123456});
    EXPECT_TRUE(ans.replied);
    EXPECT_EQ(ans.rep.status, EPERM) << "no QP of the victim is connected to QPN 0x123456";
    EXPECT_LT(ans.fd, 0) << "no arena fd";
    Answer ans2 = ask(s, {kHello, 0, uint64_t{0xABCDEF} << 32 | p->a.qpn()});
    EXPECT_EQ(ans2.rep.status, EPERM) << "no such QP in the victim";
    EXPECT_LT(ans2.fd, 0);
    ans.close_fds();
    if (ans2.fd >= 0) close(ans2.fd);
    close(s);
  }
  // A forked child of the same user knows both QPNs but owns neither.
  const uint64_t conn = uint64_t{p->b.qpn()} << 32 | p->a.qpn();
  int rc = in_child([&] {
    int s = connect_to(sa, sa_len);
    if (s < 0) return 3;
    Answer ans = ask(s, {kHello, 0, conn});
    if (ans.fd >= 0) return 4;
    if (!ans.replied || ans.rep.status != EPERM) return 5;
    return 0;
  });
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(refused_of(p->b.qpn()) - before, 3u);
  p->expect_memory_intact();
  p->sanity();
}

// (b) No share of registered memory, doorbell, wake-up pipe or QP descriptor without an admitted hello,
// even for a valid rkey.
TEST_F(DirectIsolation, NoShareFdWithoutConnection) {
  const uint64_t before = refused_of(p->b.qpn());
  int s = connect_to(sa, sa_len);
  ASSERT_GE(s, 0);
  const Req reqs[] = {{kMap, 1, p->target->rkey()},
                      {kMap, 0, p->target->rkey()},
                      {kDoorbell, 0, 0},
                      {kWake, 0, p->b.qpn()},
                      {kQpDesc, 0, uint64_t{p->b.qpn()} << 32 | p->a.qpn()}};
  for (const Req& r : reqs) {
    Answer ans = ask(s, r);
    EXPECT_TRUE(ans.replied) << "request type " << r.type;
    EXPECT_EQ(ans.rep.status, EPERM) << "request type " << r.type;
    EXPECT_LT(ans.fd, 0) << "request type " << r.type;
    ans.close_fds();
  }
  close(s);
  EXPECT_EQ(refused_of(p->b.qpn()) - before, 5u);
  p->expect_memory_intact();
}

// A connected peer (this process owns a, b's peer) is admitted, and gets a share fd only for what its
// rkey grants: no writable share for a read-only MR, none for an MR of another PD, none for a bad rkey.
TEST_F(DirectIsolation, ConnectedPeerGetsOnlyWhatItsRkeyGrants) {
  auto ro = p->b.buf(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_TRUE(ro && ro->mr);
  ibv_pd* other_pd = ibv_alloc_pd(p->db.ctx);
  ASSERT_NE(other_pd, nullptr);
  Buffer other(4096);
  ASSERT_TRUE(other.reg(other_pd, kAllAccess));
  const uint64_t before = refused_of(p->b.qpn());
  int s = connect_to(sa, sa_len);
  ASSERT_GE(s, 0);
  Answer hello = ask(s, {kHello, 0, uint64_t{p->b.qpn()} << 32 | p->a.qpn()});
  EXPECT_EQ(hello.rep.status, 0);
  EXPECT_GE(hello.fd, 0) << "the connected peer gets the arena";
  hello.close_fds();
  struct Case {
    uint32_t rkey, writable;
    int status;
  } cases[] = {{ro->rkey(), 1, EACCES}, {other.rkey(), 0, EACCES}, {other.rkey(), 1, EACCES},
               {p->target->rkey() ^ 0x5a5a00, 1, EACCES}, {ro->rkey(), 0, 0}, {p->target->rkey(), 1, 0}};
  for (const Case& c : cases) {
    Answer ans = ask(s, {kMap, c.writable, c.rkey});
    EXPECT_EQ(ans.rep.status, c.status) << "rkey " << c.rkey << " writable " << c.writable;
    EXPECT_EQ(ans.fd >= 0, c.status == 0) << "rkey " << c.rkey << " writable " << c.writable;
    if (ans.fd >= 0) {
      // A share for reading only is open read-only: it cannot be mapped for writing.
      if (!c.writable) {
        void* m = mmap(nullptr, ans.rep.b, PROT_READ | PROT_WRITE, MAP_SHARED, ans.fd, static_cast<off_t>(ans.rep.c));
        EXPECT_EQ(m, MAP_FAILED) << "a read-only MR's share is read-only";
        if (m != MAP_FAILED) munmap(m, ans.rep.b);
      }
      close(ans.fd);
    }
  }
  close(s);
  EXPECT_EQ(refused_of(p->b.qpn()) - before, 4u);
  ro.reset();
  ASSERT_EQ(ibv_dereg_mr(other.mr), 0);
  other.mr = nullptr;
  ibv_dealloc_pd(other_pd);
  p->expect_memory_intact();
}

// Rights end with the connection: once b's QP is reset, the peer that was admitted for it gets no more
// share fds or pipes, and a new hello is answered EAGAIN (not yet connected again), without an fd.
TEST_F(DirectIsolation, RightsEndWithTheConnection) {
  int s = connect_to(sa, sa_len);
  ASSERT_GE(s, 0);
  const uint64_t conn = uint64_t{p->b.qpn()} << 32 | p->a.qpn();
  Answer hello = ask(s, {kHello, 0, conn});
  ASSERT_EQ(hello.rep.status, 0);
  hello.close_fds();
  Answer m1 = ask(s, {kMap, 1, p->target->rkey()});
  EXPECT_EQ(m1.rep.status, 0);
  EXPECT_GE(m1.fd, 0);
  if (m1.fd >= 0) close(m1.fd);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(p->b.qp, &attr, IBV_QP_STATE), 0);
  Answer m2 = ask(s, {kMap, 1, p->target->rkey()});
  EXPECT_EQ(m2.rep.status, EACCES);
  EXPECT_LT(m2.fd, 0);
  if (m2.fd >= 0) close(m2.fd);
  Answer w = ask(s, {kWake, 0, p->b.qpn()});
  EXPECT_EQ(w.rep.status, EPERM);
  EXPECT_LT(w.fd, 0);
  if (w.fd >= 0) close(w.fd);
  close(s);
  int s2 = connect_to(sa, sa_len);
  ASSERT_GE(s2, 0);
  Answer again = ask(s2, {kHello, 0, conn});
  EXPECT_EQ(again.rep.status, EAGAIN) << "b's QP is in RESET: not connected (yet)";
  EXPECT_LT(again.fd, 0);
  if (again.fd >= 0) close(again.fd);
  close(s2);
  p->expect_memory_intact();
}

// (c) A connected same-user peer writes garbage into the inbox of b's QP: b's engine drops the entry and
// puts that QP in error (counted); it does not crash, its memory is unchanged, and its other QP (to a
// second peer) keeps working.
TEST_F(DirectIsolation, GarbageInInboxHarmsOnlyThatQp) {
  // b's context gets a second QP, connected to a second QP of a's context.
  Side a2, b2;
  ASSERT_TRUE(a2.create(p->da, QpConfig{}) && b2.create(p->db, QpConfig{}));
  auto src2 = a2.buf(8192), dst2 = b2.buf(8192);
  ASSERT_TRUE(src2->mr && dst2->mr);
  ASSERT_EQ(bring_up(a2.qp, a2.psn, b2.qpn(), b2.psn, p->db.gid, p->conn, p->db.attr), 0);
  ASSERT_EQ(bring_up(b2.qp, b2.psn, a2.qpn(), a2.psn, p->da.gid, p->conn, p->da.attr), 0);
  ASSERT_EQ(post_recv(p->b.qp, 77, {p->scratch_b->sge(0, 64)}), 0);

  int s = connect_to(sa, sa_len);
  ASSERT_GE(s, 0);
  Answer hello = ask(s, {kHello, 0, uint64_t{p->b.qpn()} << 32 | p->a.qpn()});
  ASSERT_EQ(hello.rep.status, 0);
  ASSERT_GE(hello.fd, 0);
  Answer desc = ask(s, {kQpDesc, 0, uint64_t{p->b.qpn()} << 32 | p->a.qpn()});
  ASSERT_EQ(desc.rep.status, 0);
  ASSERT_LT(desc.rep.index, DirectShared::kQps);
  ASSERT_GE(hello.fd2, 0) << "and the writable area";
  // The arena is the peer's to read only: its fd cannot be mapped writable, nor reopened so.
  void* rw_try = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, hello.fd, 0);
  EXPECT_EQ(rw_try, MAP_FAILED) << "the arena fd a peer gets is read-only";
  if (rw_try != MAP_FAILED) munmap(rw_try, 4096);
  EXPECT_EQ(fcntl(hello.fd, F_GETFL) & O_ACCMODE, O_RDONLY);
  const uint64_t rw_len = hello.rep.d;
  PeerMaps pm;
  ASSERT_NO_FATAL_FAILURE(map_peer(hello, &pm));
  uint8_t* rw = pm.rw;
  const DirectShared* sh = pm.sh;
  const uint64_t inbox_off = sh->qps[desc.rep.index].inbox_off.load();
  ASSERT_NE(inbox_off, 0u) << "b's QP has an inbox";
  ASSERT_LE(inbox_off + sizeof(DirectInbox), rw_len);
  auto* in = reinterpret_cast<DirectInbox*>(rw + inbox_off);
  const auto consumed = static_cast<uint32_t>(sh->qps[desc.rep.index].tails.load() >> 32);
  const uint64_t bad_before = read_stats(p->b.qpn())->dev.direct_bad_inbox;
  // Garbage everywhere the peer can write: consumer counters, the byte ring's tail, and an entry that
  // claims to be the next one, with an unknown operation and a huge length.
  in->data_tail.store(0xdeadbeefcafef00dull);
  std::memset(in->data, 0xA5, sizeof in->data);
  auto& en = in->entries[consumed % DirectInbox::kEntries];
  en.op = 0xFFFF;
  en.length = 0xFFFFFFFF;
  std::memset(en.inline_data, 0x5A, sizeof en.inline_data);
  en.stamp.store(consumed + 1);
  // b's application polls: the engine looks at the inbox.
  bool errored = false;
  for (int i = 0; i < 2000 && !errored; ++i) {
    ibv_wc wc[4];
    ibv_poll_cq(p->b.rcq, 4, wc);
    errored = qp_state(p->b.qp) == IBV_QPS_ERR;
    if (!errored) usleep(1000);
  }
  EXPECT_TRUE(errored) << "the QP whose inbox held garbage is in error";
  EXPECT_GE(read_stats(p->b.qpn())->dev.direct_bad_inbox - bad_before, 1u) << "and the entry was counted";
  close(s);
  p->expect_memory_intact();
  // The other QP of b's context: a WRITE and a SEND arrive intact.
  fill_pattern(src2->data, 8192, 91);
  ASSERT_EQ(post_recv(b2.qp, 5, {dst2->sge(4096, 4096)}), 0);
  SendWr w(1, IBV_WR_RDMA_WRITE, {src2->sge(0, 4096)});
  w.rdma(dst2->addr(0), dst2->rkey());
  ASSERT_EQ(post_send(a2.qp, w), 0);
  SendWr snd(2, IBV_WR_SEND, {src2->sge(4096, 4096)});
  ASSERT_EQ(post_send(a2.qp, snd), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a2.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(poll_wc(a2.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(poll_wc(b2.rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 4096u);
  EXPECT_EQ(check_pattern(dst2->data, 8192, 91), 8192u) << "byte for byte";
  src2.reset();
  dst2.reset();
}

// (c') b's QP receives through an SRQ: a connected peer forges an inbox entry naming an SRQ WQE it never
// claimed, and writes nonsense into the SRQ's claim word (the one word of the SRQ it can write). b's
// engine drops the entry and puts that QP in error (counted), mends the claim word, and the SRQ's WQEs
// still serve another QP on it, byte for byte.
TEST_F(DirectIsolation, ForgedSrqClaimHarmsOnlyThatQp) {
  QpConfig on_srq;
  on_srq.srq_wr = 16;
  Side a3, b3;
  ASSERT_TRUE(a3.create(p->da, QpConfig{}) && b3.create(p->db, on_srq));
  auto src = a3.buf(8192), dst = b3.buf(8192);
  ASSERT_TRUE(src->mr && dst->mr);
  // a3 first: b3 finds its peer at RTR, and gets an inbox.
  ASSERT_EQ(bring_up(a3.qp, a3.psn, b3.qpn(), b3.psn, p->db.gid, p->conn, p->db.attr), 0);
  ASSERT_EQ(bring_up(b3.qp, b3.psn, a3.qpn(), a3.psn, p->da.gid, p->conn, p->da.attr), 0);
  constexpr uint32_t kWqes = 4, kSlot = 1024;
  for (uint32_t i = 0; i < kWqes; ++i) {
    ibv_sge sge = dst->sge(i * kSlot, kSlot);
    ibv_recv_wr wr{};
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_srq_recv(b3.srq, &wr, &bad), 0);
  }

  int s = connect_to(sa, sa_len);
  ASSERT_GE(s, 0);
  const uint64_t conn = uint64_t{b3.qpn()} << 32 | a3.qpn();
  Answer hello = ask(s, {kHello, 0, conn});
  ASSERT_EQ(hello.rep.status, 0);
  Answer desc = ask(s, {kQpDesc, 0, conn});
  ASSERT_EQ(desc.rep.status, 0);
  ASSERT_LT(desc.rep.index, DirectShared::kQps);
  ASSERT_TRUE(hello.fd >= 0 && hello.fd2 >= 0);
  const uint64_t arena_len = hello.rep.a, rw_len = hello.rep.d;
  auto pm = std::make_unique<PeerMaps>();
  ASSERT_NO_FATAL_FAILURE(map_peer(hello, pm.get()));
  const uint8_t* arena = pm->arena;
  uint8_t* rw = pm->rw;
  const auto& qd = pm->sh->qps[desc.rep.index];
  const uint64_t inbox_off = qd.inbox_off.load(), srq_off = qd.srq_off.load();
  ASSERT_NE(inbox_off, 0u) << "b3 has an inbox";
  ASSERT_NE(srq_off, 0u) << "and initiators may claim its SRQ's WQEs";
  ASSERT_LE(srq_off + sizeof(DirectSrqDesc), arena_len);
  const auto* sd = reinterpret_cast<const DirectSrqDesc*>(arena + srq_off);
  EXPECT_EQ(sd->head.load(), kWqes) << "the SRQ's producer index, published";
  const uint64_t claim_off = sd->claim_off.load();
  ASSERT_LE(claim_off + 8, rw_len);
  auto* claim = reinterpret_cast<std::atomic<uint64_t>*>(rw + claim_off);
  auto* in = reinterpret_cast<DirectInbox*>(rw + inbox_off);
  const auto consumed = static_cast<uint32_t>(qd.tails.load() >> 32);
  const uint64_t bad_before = read_stats(b3.qpn())->dev.direct_bad_inbox;
  claim->store(uint64_t{1} << 40);  // far past what was posted
  auto& en = in->entries[consumed % DirectInbox::kEntries];
  en.op = DirectInbox::kSend;
  en.length = 8;
  en.imm_be = 0;
  en.solicited = 0;
  en.srq_index = 1234;  // never posted, never claimed
  std::memset(en.inline_data, 0x5A, sizeof en.inline_data);
  en.stamp.store(consumed + 1);
  bool errored = false;
  for (int i = 0; i < 2000 && !errored; ++i) {
    ibv_wc wc[4];
    EXPECT_EQ(ibv_poll_cq(b3.rcq, 4, wc), 0) << "a receive completion for a forged message";
    errored = qp_state(b3.qp) == IBV_QPS_ERR;
    if (!errored) usleep(1000);
  }
  EXPECT_TRUE(errored) << "the QP whose inbox held the forged claim is in error";
  EXPECT_GE(read_stats(b3.qpn())->dev.direct_bad_inbox - bad_before, 1u) << "and the entry was counted";
  pm.reset();
  close(s);
  p->expect_memory_intact();

  // Another QP on the same SRQ: every WQE posted serves one of its SENDs.
  Side a4;
  ASSERT_TRUE(a4.create(p->da, QpConfig{}));
  ibv_qp_init_attr ia{};
  ia.send_cq = b3.scq;
  ia.recv_cq = b3.rcq;
  ia.srq = b3.srq;
  ia.cap.max_send_wr = 16;
  ia.cap.max_send_sge = 1;
  ia.qp_type = IBV_QPT_RC;
  ibv_qp* b4 = ibv_create_qp(b3.pd, &ia);
  ASSERT_NE(b4, nullptr);
  const uint32_t b4_psn = random_psn();
  ASSERT_EQ(bring_up(a4.qp, a4.psn, b4->qp_num, b4_psn, p->db.gid, p->conn, p->db.attr), 0);
  ASSERT_EQ(bring_up(b4, b4_psn, a4.qpn(), a4.psn, p->da.gid, p->conn, p->da.attr), 0);
  auto src4 = a4.buf(kWqes * kSlot);
  ASSERT_TRUE(src4->mr);
  constexpr uint32_t kLen = 1000;
  for (uint32_t i = 0; i < kWqes; ++i) {
    fill_pattern(src4->data + i * kSlot, kLen, 500);  // the same bytes: WQEs may be taken in any order
    SendWr w(i, IBV_WR_SEND, {src4->sge(i * kSlot, kLen)});
    ASSERT_EQ(post_send(a4.qp, w), 0);
  }
  std::vector<bool> seen(kWqes, false);
  for (uint32_t i = 0; i < kWqes; ++i) {
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(a4.scq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    ASSERT_TRUE(poll_wc(b3.rcq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.qp_num, b4->qp_num);
    EXPECT_EQ(wc.byte_len, kLen);
    ASSERT_LT(wc.wr_id, kWqes);
    EXPECT_FALSE(seen[wc.wr_id]) << "WQE " << wc.wr_id << " taken twice";
    seen[wc.wr_id] = true;
    EXPECT_EQ(check_pattern(dst->data + wc.wr_id * kSlot, kLen, 500), kLen) << "WQE " << wc.wr_id;
  }
  EXPECT_EQ(ibv_destroy_qp(b4), 0);
  src.reset();
  dst.reset();
  src4.reset();
}

// ---- issue 17, second review: what a connected peer can do with what it is given ----

// True when something writes through fd: mprotect of a read-only shared mapping to writable, or the fd
// reopened O_RDWR through /proc/self/fd (a memfd's inode is mode 0777, and we may be root) and then a
// writable shared mapping of it, or a write() of the byte already there.
bool can_write_through(int fd, size_t len, off_t off) {
  bool w = false;
  void* m = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, off);
  if (m != MAP_FAILED) {
    if (mprotect(m, len, PROT_READ | PROT_WRITE) == 0) w = true;
    munmap(m, len);
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int rw = open(path, O_RDWR | O_CLOEXEC);
  if (rw >= 0) {
    void* wm = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, rw, off);
    if (wm != MAP_FAILED) {
      w = true;
      munmap(wm, len);
    }
    uint8_t b = 0;
    if (pread(rw, &b, 1, off) == 1 && pwrite(rw, &b, 1, off) == 1) w = true;
    close(rw);
  }
  return w;
}

// Brings x (on dx) and y (on dy) to RTS towards each other, y granting its peer only y_access.
void connect_with_access(Side& x, Device& dx, Side& y, Device& dy, unsigned y_access) {
  ConnConfig conn;
  ASSERT_EQ(modify_to_init(x.qp, kAllAccess), 0);
  ASSERT_EQ(modify_to_init(y.qp, y_access), 0);
  ASSERT_EQ(modify_to_rtr(x.qp, y.qpn(), y.psn, dy.gid, conn, dy.attr), 0);
  ASSERT_EQ(modify_to_rtr(y.qp, x.qpn(), x.psn, dx.gid, conn, dx.attr), 0);
  ASSERT_EQ(modify_to_rts(x.qp, x.psn, conn, dx.attr), 0);
  ASSERT_EQ(modify_to_rts(y.qp, y.psn, conn, dy.attr), 0);
}

// Every fd a connected peer gets only to read -- the arena, the share of a read-only MR -- stays
// read-only however it is reopened or remapped: no key-table slot or registered byte of the target
// can be written through it.
TEST_F(DirectIsolation, ReadOnlyFdsCannotBeReopenedWritable) {
  auto ro = p->b.buf(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_TRUE(ro && ro->mr);
  int s = connect_to(sa, sa_len);
  ASSERT_GE(s, 0);
  Answer hello = ask(s, {kHello, 0, uint64_t{p->b.qpn()} << 32 | p->a.qpn()});
  ASSERT_EQ(hello.rep.status, 0);
  ASSERT_GE(hello.fd, 0);
  EXPECT_FALSE(can_write_through(hello.fd, 4096, 0)) << "the arena (key table, QP descriptors)";
  hello.close_fds();
  Answer m = ask(s, {kMap, 0, ro->rkey()});
  ASSERT_EQ(m.rep.status, 0);
  ASSERT_GE(m.fd, 0);
  EXPECT_FALSE(can_write_through(m.fd, m.rep.b, static_cast<off_t>(m.rep.c))) << "a read-only MR's share";
  m.close_fds();
  close(s);
  p->expect_memory_intact();
  p->sanity();
}

// A peer whose QP grants it only REMOTE_READ, on an MR that grants REMOTE_WRITE too (to peers of other
// QPs), gets no fd of that MR's memory that it could reopen writable; its READ still works.
TEST_F(DirectIsolation, ReadOnlyPeerGetsNoWritableFileOfAWritableMr) {
  Side a2, b2;
  ASSERT_TRUE(a2.create(p->da, QpConfig{}) && b2.create(p->db, QpConfig{}));
  auto mine = a2.buf(8192), theirs = b2.buf(8192);  // every right
  ASSERT_TRUE(mine->mr && theirs->mr);
  fill_pattern(theirs->data, 8192, 71);
  ASSERT_NO_FATAL_FAILURE(
      connect_with_access(a2, p->da, b2, p->db, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
  int s = connect_to(sa, sa_len);
  ASSERT_GE(s, 0);
  Answer hello = ask(s, {kHello, 0, uint64_t{b2.qpn()} << 32 | a2.qpn()});
  ASSERT_EQ(hello.rep.status, 0);
  hello.close_fds();
  Answer w = ask(s, {kMap, 1, theirs->rkey()});
  EXPECT_LT(w.fd, 0) << "its QP does not grant REMOTE_WRITE";
  w.close_fds();
  Answer r = ask(s, {kMap, 0, theirs->rkey()});
  if (r.fd >= 0) {
    EXPECT_FALSE(can_write_through(r.fd, r.rep.b, static_cast<off_t>(r.rep.c))) << "the share it may only read";
  }
  r.close_fds();
  close(s);
  EXPECT_EQ(check_pattern(theirs->data, 8192, 71), 8192u);
  SendWr rd(1, IBV_WR_RDMA_READ, {mine->sge(0, 4096)});
  rd.rdma(theirs->addr(4096), theirs->rkey());
  ASSERT_EQ(post_send(a2.qp, rd), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a2.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  std::vector<uint8_t> want(8192);
  fill_pattern(want.data(), 8192, 71);
  EXPECT_EQ(std::memcmp(mine->data, want.data() + 4096, 4096), 0) << "the READ brought the target's bytes";
  mine.reset();
  theirs.reset();
}

// No file a peer gets can change size: a shrunk writable area or MR share would fault the target (SIGBUS)
// where it touches the lost pages. (A grow is tried first: on a file without the seals it is harmless
// and is undone; a shrink is tried only where the grow was refused.)
TEST_F(DirectIsolation, PeerCannotResizeWhatItMaps) {
  int s = connect_to(sa, sa_len);
  ASSERT_GE(s, 0);
  Answer hello = ask(s, {kHello, 0, uint64_t{p->b.qpn()} << 32 | p->a.qpn()});
  ASSERT_EQ(hello.rep.status, 0);
  ASSERT_GE(hello.fd, 0);
  ASSERT_GE(hello.fd2, 0);
  Answer m = ask(s, {kMap, 1, p->target->rkey()});
  ASSERT_EQ(m.rep.status, 0);
  ASSERT_GE(m.fd, 0);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", hello.fd);
  int arena_rw = open(path, O_RDWR | O_CLOEXEC);  // root may; a memfd's mode lets its owner too
  struct Case {
    const char* what;
    int fd;
  } cases[] = {{"writable area", hello.fd2}, {"writable MR share", m.fd}, {"arena reopened O_RDWR", arena_rw}};
  for (const Case& c : cases) {
    if (c.fd < 0) continue;
    struct stat st{};
    ASSERT_EQ(fstat(c.fd, &st), 0) << c.what;
    const int grow = ftruncate(c.fd, st.st_size + 4096);
    const int grow_errno = errno;
    EXPECT_EQ(grow, -1) << c.what << " grew";
    if (grow == 0) {
      EXPECT_EQ(ftruncate(c.fd, st.st_size), 0) << c.what;  // back to what the target maps
      continue;
    }
    EXPECT_EQ(grow_errno, EPERM) << c.what;
    errno = 0;
    EXPECT_EQ(ftruncate(c.fd, 0), -1) << c.what << " shrank";
    EXPECT_EQ(errno, EPERM) << c.what;
  }
  if (arena_rw >= 0) close(arena_rw);
  hello.close_fds();
  m.close_fds();
  close(s);
  p->expect_memory_intact();
  p->sanity();
}

// Whether fd shares its open file description with any other fd of this process (kcmp KCMP_FILE).
bool description_shared(int fd) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return true;
  bool shared = false;
  const pid_t me = getpid();
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long other = strtol(e->d_name, &end, 10);
    if (*end || other == fd || other == dirfd(d)) continue;
    if (syscall(SYS_kcmp, me, me, KCMP_FILE, fd, static_cast<int>(other)) == 0) shared = true;
  }
  closedir(d);
  return shared;
}

// The doorbell and the wake-up pipe a connected peer gets are its own open file descriptions, not the
// target engine's or completion channel's: flags it sets there (O_NONBLOCK cleared, to make the target's
// writes block once it has filled the pipe) do not reach the target, which keeps delivering events.
TEST_F(DirectIsolation, WakeFdsArePeersOwn) {
  ibv_comp_channel* ch = ibv_create_comp_channel(p->db.ctx);
  ASSERT_NE(ch, nullptr);
  QpConfig with_channel;
  with_channel.recv_channel = ch;
  Side a2, b2;
  ASSERT_TRUE(a2.create(p->da, QpConfig{}) && b2.create(p->db, with_channel));
  auto src2 = a2.buf(4096), dst2 = b2.buf(4096);
  ASSERT_TRUE(src2->mr && dst2->mr);
  ASSERT_NO_FATAL_FAILURE(connect_with_access(a2, p->da, b2, p->db, kAllAccess));
  int s = connect_to(sa, sa_len);
  ASSERT_GE(s, 0);
  Answer hello = ask(s, {kHello, 0, uint64_t{b2.qpn()} << 32 | a2.qpn()});
  ASSERT_EQ(hello.rep.status, 0);
  hello.close_fds();
  Answer bell = ask(s, {kDoorbell, 0, 0});
  Answer wake = ask(s, {kWake, 0, b2.qpn()});
  for (Answer* x : {&bell, &wake}) {
    if (x->fd < 0) continue;
    // (The target's server thread, in this process, closes its own fd of what it sent just after
    // sending: looked at again until it has, or for good.)
    bool shared = true;
    for (int i = 0; i < 200 && shared; ++i)
      if ((shared = description_shared(x->fd))) usleep(5000);
    ASSERT_FALSE(shared) << (x == &bell ? "the doorbell" : "the wake-up fd")
                                            << " is the target's own open file";
    // What an attacker does with it: blocking, then as full as it gets.
    ASSERT_EQ(fcntl(x->fd, F_SETFL, 0), 0);
  }
  close(s);
  // b2's application waits for a SEND on its channel: the event comes.
  ASSERT_EQ(ibv_req_notify_cq(b2.rcq, 0), 0);
  ASSERT_EQ(post_recv(b2.qp, 9, {dst2->sge(0, 64)}), 0);
  SendWr snd(3, IBV_WR_SEND, {src2->sge(0, 64)});
  ASSERT_EQ(post_send(a2.qp, snd), 0);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch, &ev_cq, &ev_ctx), 0);
  EXPECT_EQ(ev_cq, b2.rcq);
  ibv_ack_cq_events(ev_cq, 1);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(b2.rcq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(poll_wc(a2.scq, &wc));
  bell.close_fds();
  wake.close_fds();
  src2.reset();
  dst2.reset();
  b2.reset();
  ibv_destroy_comp_channel(ch);
}

// A connected peer marks a busy slot that is not its own as taken by a live process (pid 1) and busy:
// the target's ibv_dereg_mr (which waits for copies in flight) still returns.
TEST_F(DirectIsolation, ForgedBusySlotDoesNotHangTheTarget) {
  int s = connect_to(sa, sa_len);
  ASSERT_GE(s, 0);
  Answer hello = ask(s, {kHello, 0, uint64_t{p->b.qpn()} << 32 | p->a.qpn()});
  ASSERT_EQ(hello.rep.status, 0);
  ASSERT_GE(hello.fd, 0);
  ASSERT_GE(hello.fd2, 0);
  void* m = mmap(nullptr, hello.rep.a, PROT_READ, MAP_SHARED, hello.fd, 0);
  void* wm = mmap(nullptr, hello.rep.d, PROT_READ | PROT_WRITE, MAP_SHARED, hello.fd2, 0);
  ASSERT_NE(m, MAP_FAILED);
  ASSERT_NE(wm, MAP_FAILED);
  const auto* sh = reinterpret_cast<const DirectShared*>(static_cast<const uint8_t*>(m) + hello.rep.b);
  auto* slots = reinterpret_cast<transport::DirectPeerSlot*>(static_cast<uint8_t*>(wm) + sh->peers_off);
  const uint32_t forged = (hello.rep.index + 7) % DirectShared::kPeers;  // not ours, not a's
  slots[forged].pid.store(1);
  slots[forged].busy.store(1);
  slots[hello.rep.index].pid.store(1);  // and ours claims to be init's
  auto mr = p->b.buf(4096);
  ASSERT_TRUE(mr && mr->mr);
  std::atomic<bool> done{false};
  std::thread t([&] {
    EXPECT_EQ(ibv_dereg_mr(mr->mr), 0);
    mr->mr = nullptr;
    done = true;
  });
  for (int i = 0; i < 300 && !done; ++i) usleep(100000);
  const bool returned = done;
  slots[forged].busy.store(0);  // let a hung target go, so that the test can end
  slots[forged].pid.store(0);
  t.join();
  EXPECT_TRUE(returned) << "ibv_dereg_mr waited for a slot nobody holds";
  munmap(m, hello.rep.a);
  munmap(wm, hello.rep.d);
  hello.close_fds();
  close(s);
  p->sanity();
}

// A writable share needs one write right (REMOTE_WRITE or REMOTE_ATOMIC) granted by both the QP and the
// MR: a QP granting READ and ATOMIC with an MR granting only WRITE gives nothing to write with.
TEST_F(DirectIsolation, WritableShareNeedsOneRightGrantedByBoth) {
  Side a2, b2;
  ASSERT_TRUE(a2.create(p->da, QpConfig{}) && b2.create(p->db, QpConfig{}));
  auto write_only = b2.buf(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  auto atomic_only = b2.buf(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  ASSERT_TRUE(write_only->mr && atomic_only->mr);
  ASSERT_NO_FATAL_FAILURE(connect_with_access(
      a2, p->da, b2, p->db, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC));
  int s = connect_to(sa, sa_len);
  ASSERT_GE(s, 0);
  Answer hello = ask(s, {kHello, 0, uint64_t{b2.qpn()} << 32 | a2.qpn()});
  ASSERT_EQ(hello.rep.status, 0);
  hello.close_fds();
  Answer no = ask(s, {kMap, 1, write_only->rkey()});
  EXPECT_EQ(no.rep.status, EACCES) << "QP: READ|ATOMIC, MR: WRITE";
  EXPECT_LT(no.fd, 0);
  no.close_fds();
  Answer yes = ask(s, {kMap, 1, atomic_only->rkey()});
  EXPECT_EQ(yes.rep.status, 0) << "QP and MR both grant ATOMIC";
  EXPECT_GE(yes.fd, 0);
  yes.close_fds();
  close(s);
  write_only.reset();
  atomic_only.reset();
}

// The target's QP is connected to a QP of another host; a local process that the registry says owns a
// QPN of that number (here: this process, whose a2 has it) is not its peer and is not admitted.
TEST_F(DirectIsolation, QpConnectedElsewhereCannotBeAdopted) {
  Side a2, b2;
  ASSERT_TRUE(a2.create(p->da, QpConfig{}) && b2.create(p->db, QpConfig{}));
  ConnConfig conn;
  ibv_gid remote{};  // ::ffff:192.0.2.1 (TEST-NET-1): another host
  remote.raw[10] = remote.raw[11] = 0xff;
  remote.raw[12] = 192;
  remote.raw[13] = 0;
  remote.raw[14] = 2;
  remote.raw[15] = 1;
  ASSERT_EQ(modify_to_init(b2.qp, kAllAccess), 0);
  ASSERT_EQ(modify_to_rtr(b2.qp, a2.qpn(), a2.psn, remote, conn, p->db.attr), 0);
  ASSERT_EQ(modify_to_rts(b2.qp, b2.psn, conn, p->db.attr), 0);
  const uint64_t before = refused_of(p->b.qpn());
  int s = connect_to(sa, sa_len);
  ASSERT_GE(s, 0);
  Answer hello = ask(s, {kHello, 0, uint64_t{b2.qpn()} << 32 | a2.qpn()});
  EXPECT_EQ(hello.rep.status, EPERM) << "b2's peer is on 192.0.2.1";
  EXPECT_LT(hello.fd, 0);
  hello.close_fds();
  close(s);
  EXPECT_EQ(refused_of(p->b.qpn()) - before, 1u);
}

// Another user's idle connections (refused at accept) do not fill the server's table: after 4200 of
// them, held open, the real peer is still served.
TEST_F(DirectIsolation, RefusedIdleClientsDoNotShutOthersOut) {
  if (!root()) GTEST_SKIP() << "needs root to run the attacker as uid " << kAttackerId;
  int ready[2], go[2];
  ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(go, O_CLOEXEC), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    close(go[1]);
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (!drop_to_attacker()) _exit(2);
    int held = 0;
    for (int i = 0; i < 4200; ++i) {
      int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (c < 0) break;
      bool ok = false;
      for (int tries = 0; tries < 200 && !ok; ++tries) {
        ok = connect(c, reinterpret_cast<const sockaddr*>(&sa), sa_len) == 0;
        if (!ok && errno != EAGAIN) break;
        if (!ok) usleep(1000);
      }
      if (!ok) {
        close(c);
        break;
      }
      ++held;
    }
    (void)!write(ready[1], &held, sizeof held);
    char c;
    (void)!read(go[0], &c, 1);  // holds them all until the parent is done
    _exit(0);
  }
  close(ready[1]);
  close(go[0]);
  int held = 0;
  ASSERT_EQ(read(ready[0], &held, sizeof held), static_cast<ssize_t>(sizeof held));
  int s = connect_to(sa, sa_len);
  Answer hello{};
  if (s >= 0) hello = ask(s, {kHello, 0, uint64_t{p->b.qpn()} << 32 | p->a.qpn()});
  close(go[1]);
  int st = 0;
  reap_within(child, 30, &st);
  close(ready[0]);
  EXPECT_GE(s, 0) << "after " << held << " idle connections of another user";
  EXPECT_TRUE(hello.replied) << "after " << held << " idle connections of another user";
  EXPECT_EQ(hello.rep.status, 0);
  hello.close_fds();
  if (s >= 0) close(s);
  p->sanity();
}

// The connection gate answers EAGAIN while the target QP is not yet in RTR towards the initiator; the
// initiator asks again on a later WQE. Whichever side reaches RTR first, both end up on the direct path.
TEST(DirectGate, EitherSideMayReachRtrFirst) {
  for (int first = 0; first < 2; ++first) {
    SCOPED_TRACE(first ? "b reaches RTR first" : "a reaches RTR first");
    Device da(kDirect), db(kDirect);
    ASSERT_TRUE(da.ok() && db.ok());
    Side a, b;
    ASSERT_TRUE(a.create(da, QpConfig{}) && b.create(db, QpConfig{}));
    auto abuf = a.buf(8192), bbuf = b.buf(8192);
    ASSERT_TRUE(abuf->mr && bbuf->mr);
    ConnConfig conn;
    ASSERT_EQ(modify_to_init(a.qp, kAllAccess), 0);
    ASSERT_EQ(modify_to_init(b.qp, kAllAccess), 0);
    Side* order[2] = {first ? &b : &a, first ? &a : &b};
    for (Side* x : order) {
      Side& y = x == &a ? b : a;
      Device& ydev = x == &a ? db : da;
      ASSERT_EQ(modify_to_rtr(x->qp, y.qpn(), y.psn, ydev.gid, conn, ydev.attr), 0);
    }
    ASSERT_EQ(modify_to_rts(a.qp, a.psn, conn, da.attr), 0);
    ASSERT_EQ(modify_to_rts(b.qp, b.psn, conn, db.attr), 0);
    const uint64_t ops_before = my_counter(&core::Counters::direct_ops);
    for (Side* x : {&a, &b}) {
      Buffer& src = x == &a ? *abuf : *bbuf;
      Buffer& dst = x == &a ? *bbuf : *abuf;
      fill_pattern(src.data, 4096, 40 + (x == &a));
      SendWr w(1, IBV_WR_RDMA_WRITE, {src.sge(0, 4096)});
      w.rdma(dst.addr(4096), dst.rkey());
      ASSERT_EQ(post_send(x->qp, w), 0);
      ibv_wc wc{};
      ASSERT_TRUE(poll_wc(x->scq, &wc));
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
      EXPECT_EQ(check_pattern(dst.data + 4096, 4096, 40 + (x == &a)), 4096u);
    }
    EXPECT_EQ(my_counter(&core::Counters::direct_ops) - ops_before, 2u) << "both WRITEs on the direct path";
    abuf.reset();
    bbuf.reset();
  }
}

// Another process (of our own user) serving the abstract name of a target context that does not serve
// the direct path itself (SOFTRDMA_DIRECT=0 there) is not that target: the initiator, whose QP is
// connected to the real target QP, sends it nothing -- no hello naming the connection, no SEND -- and
// its WRITE arrives by packets.
TEST(DirectImpostor, InitiatorTalksOnlyToTheTargetsOwner) {
  auto db = std::make_unique<Device>("SOFTRDMA_DIRECT=0");
  auto da = std::make_unique<Device>(kDirect);
  ASSERT_TRUE(da->ok() && db->ok());
  Side a, b;
  ASSERT_TRUE(a.create(*da, QpConfig{}) && b.create(*db, QpConfig{}));
  auto abuf = a.buf(8192), bbuf = b.buf(8192);
  ASSERT_TRUE(abuf->mr && bbuf->mr);
  auto ep = net::Registry::instance().lookup(b.qpn());
  ASSERT_TRUE(ep);
  socklen_t name_len = 0;
  const sockaddr_un name = direct_address(*ep, &name_len);
  int ready[2], result[2];
  ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(result, O_CLOEXEC), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (l < 0 || bind(l, reinterpret_cast<const sockaddr*>(&name), name_len) != 0 || listen(l, 8) != 0) _exit(3);
    (void)!write(ready[1], "r", 1);
    int got = 0;  // requests the initiator sent us
    pollfd pf{l, POLLIN, 0};
    while (poll(&pf, 1, 20000) > 0) {
      int c = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) break;
      pollfd cf{c, POLLIN, 0};
      bool closed = false;
      while (!closed && poll(&cf, 1, 5000) > 0) {
        Req r{};
        ssize_t n = recv(c, &r, sizeof r, 0);
        if (n <= 0) {
          closed = true;
          break;
        }
        ++got;
        Rep no{};
        no.status = EPERM;
        (void)send(c, &no, sizeof no, MSG_NOSIGNAL);
      }
      close(c);
      if (closed || got) break;
    }
    (void)!write(result[1], &got, sizeof got);
    _exit(0);
  }
  close(ready[1]);
  close(result[1]);
  char r = 0;
  ASSERT_EQ(read(ready[0], &r, 1), 1);
  ConnConfig conn;
  ASSERT_NO_FATAL_FAILURE(connect_with_access(a, *da, b, *db, kAllAccess));
  fill_pattern(abuf->data, 4096, 61);
  SendWr w(1, IBV_WR_RDMA_WRITE, {abuf->sge(0, 4096)});
  w.rdma(bbuf->addr(0), bbuf->rkey());
  ASSERT_EQ(post_send(a.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(a.scq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(check_pattern(bbuf->data, 4096, 61), 4096u);
  int got = -1;
  EXPECT_EQ(read(result[0], &got, sizeof got), static_cast<ssize_t>(sizeof got));
  EXPECT_EQ(got, 0) << "requests the initiator sent to a process that is not its target";
  int st = 0;
  EXPECT_TRUE(reap_within(child, 30, &st));
  close(ready[0]);
  close(result[0]);
  abuf.reset();
  bbuf.reset();
  a.reset();
  b.reset();
}

// A cross-user RC pair on one host: the other user's initiator is refused the direct path (counted
// here) and its WRITE and READ go by packets, byte for byte, under RoCE's own rules.
constexpr size_t kXLen = 16 * 1024;
struct XInfo {
  uint32_t qpn, psn, rkey, pad;
  uint64_t addr;
  uint8_t gid[16];
};

gid_t g_peer_gid = kAttackerId;  // the gid the peer process takes (set before the fork)

int cross_user_main(int sock) {
  if (!drop_to_attacker(g_peer_gid)) return 2;
  Device dev(kDirect);
  if (!dev.ok()) return 10;
  Side s;
  if (!s.create(dev, QpConfig{})) return 11;
  auto src = s.buf(kXLen), back = s.buf(kXLen);
  if (!src->mr || !back->mr) return 12;
  fill_pattern(src->data, kXLen, 31);
  if (modify_to_init(s.qp, kAllAccess)) return 13;
  XInfo peer{};
  if (int rc = serve_connect(sock, dev, s, XInfo{s.qpn(), s.psn, src->rkey(), 0, src->addr(), {}}, peer, 14))
    return rc;
  // Our QP is in RTS once we say go: the first WQE finds it connected (else its first ask is EAGAIN,
  // and the WQEs of the next millisecond go by packets).
  char go = 0;
  if (!read_full(sock, &go, 1) || go != 'g') return 19;
  SendWr w(1, IBV_WR_RDMA_WRITE, {src->sge(0, kXLen)});
  w.rdma(peer.addr, peer.rkey);
  ibv_wc wc{};
  if (post_send(s.qp, w) || !poll_wc(s.scq, &wc) || wc.status != IBV_WC_SUCCESS) return 20;
  SendWr r(2, IBV_WR_RDMA_READ, {back->sge(0, kXLen)});
  r.rdma(peer.addr + kXLen, peer.rkey);
  if (post_send(s.qp, r) || !poll_wc(s.scq, &wc) || wc.status != IBV_WC_SUCCESS) return 21;
  if (check_pattern(back->data, kXLen, 32) != kXLen) return 22;
  const uint64_t direct_ops = my_counter(&core::Counters::direct_ops);
  if (!write_full(sock, &direct_ops, sizeof direct_ops)) return 23;
  char bye = 0;
  if (!read_full(sock, &bye, 1) || bye != 'x') return 24;
  return 0;
}

class CrossUserPair : public ForkedTarget {
 protected:
  CrossUserPair() : ForkedTarget(cross_user_main) {}
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run the peer as uid " << kAttackerId;
    g_peer_gid = kAttackerId;
    ForkedTarget::SetUp();
  }
  void TearDown() override {
    buf.reset();
    s.reset();
    dev.reset();
    ForkedTarget::TearDown();  // says 'x', expects the peer's exit status 0
    softrdma_set_option("SOFTRDMA_DIRECT_PEERS", nullptr);
  }
  // Our side: a buffer whose first half the peer WRITEs and whose second half it READs.
  void connect_peer(uint64_t* peer_direct_ops) {
    dev = std::make_unique<Device>(kDirect);
    ASSERT_TRUE(dev->ok());
    ASSERT_TRUE(s.create(*dev, QpConfig{}));
    buf = s.buf(2 * kXLen);
    ASSERT_TRUE(buf->mr);
    std::memset(buf->data, 0, kXLen);
    fill_pattern(buf->data + kXLen, kXLen, 32);
    ASSERT_EQ(modify_to_init(s.qp, kAllAccess), 0);
    XInfo peer{};
    ASSERT_NO_FATAL_FAILURE(
        connect_target(XInfo{s.qpn(), s.psn, buf->rkey(), 0, buf->addr(), {}}, peer, s, *dev, ConnConfig{}));
    ASSERT_TRUE(write_full(sock, "g", 1));
    ASSERT_TRUE(read_full(sock, peer_direct_ops, sizeof *peer_direct_ops)) << "the peer's WRITE and READ failed";
    EXPECT_EQ(check_pattern(buf->data, kXLen, 31), kXLen) << "its WRITE arrived byte for byte";
    EXPECT_EQ(check_pattern(buf->data + kXLen, kXLen, 32), kXLen) << "its READ changed nothing";
  }
  std::unique_ptr<Device> dev;
  Side s;
  std::unique_ptr<Buffer> buf;
};

// SOFTRDMA_DIRECT_PEERS=group: a peer of another uid whose gid is ours is served the direct path.
class GroupPeerPair : public CrossUserPair {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run the peer as uid " << kAttackerId;
    // The process's (the engine reads it from the process's table when our device is opened); the
    // peer, forked after, inherits it as it did the environment.
    ASSERT_EQ(softrdma_set_option("SOFTRDMA_DIRECT_PEERS", "group"), 0);
    g_peer_gid = getegid();
    ForkedTarget::SetUp();
  }
};

TEST_F(GroupPeerPair, SameGroupPeerIsServed) {
  uint64_t peer_direct_ops = 0;
  ASSERT_NO_FATAL_FAILURE(connect_peer(&peer_direct_ops));
  EXPECT_EQ(peer_direct_ops, 2u) << "its WRITE and READ took the direct path";
  EXPECT_EQ(my_counter(&core::Counters::direct_refused), 0u);
}

TEST_F(CrossUserPair, TransfersByPackets) {
  uint64_t peer_direct_ops = ~0ull;
  ASSERT_NO_FATAL_FAILURE(connect_peer(&peer_direct_ops));
  EXPECT_EQ(peer_direct_ops, 0u) << "the other user's initiator never used the direct path";
  EXPECT_GE(my_counter(&core::Counters::direct_refused), 1u) << "its hello was refused and counted";
  EXPECT_GT(my_counter(&core::Counters::rx_packets), 0u) << "it came by packets";
}

}  // namespace
}  // namespace softrdma::hostile_test
