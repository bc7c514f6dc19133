// Connecting to a peer on the direct path (direct_peer.h), the initiator's side: attach and detach a
// QP, open a connection to the target context's server -- only one whose SO_PEERCRED is the target QP's
// owner and passes our policy (docs/security.md, "Local isolation", item 6) --, map its arena and
// writable area after checking them, and map a share of its registered memory on first use (kMap).
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

#include <cerrno>

#include "transport/direct_peer.h"
#include "transport/direct_protocol.h"

namespace softrdma::transport {

const DirectPeer::Mapping* DirectPeer::mapping(uint64_t id, uint32_t rkey, bool writable) {
  if (const Mapping* m = mapped(id, writable)) return m;
  direct::Request req{direct::kMap, writable, rkey};
  direct::Reply rep{};
  int fd = -1;
  if (!direct::call(sock, req, &rep, &fd) || rep.status != 0 || fd < 0 || rep.index != static_cast<uint32_t>(id)) {
    if (fd >= 0) close(fd);
    return nullptr;
  }
  // The file must hold what we map, and stay so (sealed against shrinking): else our copies would
  // fault (SIGBUS) past its end.
  struct stat st {};
  const int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &st) != 0 || st.st_size < 0 || seals < 0 || !(seals & F_SEAL_SHRINK) ||
      rep.c > static_cast<uint64_t>(st.st_size) || rep.b > static_cast<uint64_t>(st.st_size) - rep.c) {
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, rep.b, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd,
                 static_cast<off_t>(rep.c));
  close(fd);
  if (p == MAP_FAILED) return nullptr;
  // A read-only mapping of the same share is superseded by a writable one.
  for (size_t i = 0; i < maps.size(); ++i)
    if (maps[i].id == id) {
      munmap(maps[i].local, maps[i].length);
      maps[i] = maps.back();
      maps.pop_back();
      break;
    }
  maps.push_back({id, rep.a, rep.b, static_cast<uint8_t*>(p), writable});
  return &maps.back();
}

namespace {
// The QP lets go of its peer and the peer QP's wake-up pipe; the connection itself stays for reuse.
void forget_peer(Qp& qp) {
  qp.direct.recv.valid = false;
  qp.direct.retry_ns = 0;
  if (qp.direct.peer_wake_fd >= 0) close(qp.direct.peer_wake_fd);
  qp.direct.peer_wake_fd = -1;
  qp.direct.peer.reset();
}

// Maps what a target's kHello passed (afd: its arena, wfd: its writable area; both closed here) into p,
// after checking the files and every offset the target gave: 0 or EIO.
int map_target(DirectPeer& p, const direct::Reply& rep, int afd, int wfd) {
  auto close_both = [&] {
    if (afd >= 0) close(afd);
    if (wfd >= 0) close(wfd);
  };
  // A file shorter than the size it claims would fault (SIGBUS) where we read past its end.
  struct stat ast {}, wst {};
  const int aseals = fcntl(afd, F_GET_SEALS), wseals = fcntl(wfd, F_GET_SEALS);
  if (aseals < 0 || wseals < 0 || !(aseals & F_SEAL_SHRINK) || !(wseals & F_SEAL_SHRINK) ||
      fstat(afd, &ast) != 0 || fstat(wfd, &wst) != 0 || ast.st_size < 0 || wst.st_size < 0 ||
      static_cast<uint64_t>(ast.st_size) < rep.a || static_cast<uint64_t>(wst.st_size) < rep.d) {
    close_both();
    return EIO;
  }
  // The arena only to read (its fd is read-only anyway); the writable area read-write.
  void* a = mmap(nullptr, rep.a, PROT_READ, MAP_SHARED, afd, 0);
  void* w = mmap(nullptr, rep.d, PROT_READ | PROT_WRITE, MAP_SHARED, wfd, 0);
  close_both();
  if (a != MAP_FAILED) {
    p.arena = static_cast<const uint8_t*>(a);
    p.arena_size = rep.a;
  }
  if (w != MAP_FAILED) {
    p.rw = static_cast<uint8_t*>(w);
    p.rw_size = rep.d;
  }
  if (a == MAP_FAILED || w == MAP_FAILED) return EIO;
  if (rep.b > rep.a || sizeof(DirectShared) > rep.a - rep.b) return EIO;
  p.shared = reinterpret_cast<const DirectShared*>(p.arena + rep.b);
  if (p.shared->magic != DirectShared::kMagic) return EIO;
  // Where the target says its key table is must lie inside what we mapped (we read it on every WQE).
  const uint64_t kt = p.shared->key_table_off, ks = p.shared->key_seq_off;
  if (kt > rep.a || core::MrTable::slots_bytes() > rep.a - kt || ks > rep.a - sizeof(uint64_t) || ks % 8)
    return EIO;
  // (The values checked, not read again: the target could change them in between.)
  p.key_table = p.arena + kt;
  p.key_seq = reinterpret_cast<const std::atomic<uint64_t>*>(p.arena + ks);
  p.slot = rep.index;
  const uint64_t po = p.shared->peers_off;
  if (p.slot >= DirectShared::kPeers || po > p.rw_size ||
      sizeof(DirectPeerSlot) * DirectShared::kPeers > p.rw_size - po || po % alignof(DirectPeerSlot))
    return EIO;
  p.slots = reinterpret_cast<DirectPeerSlot*>(p.rw + po);
  return 0;
}
}  // namespace

uint64_t DirectInitiator::coarse_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void DirectInitiator::attach(Qp& qp, int32_t pid, uint16_t port) {
  forget_peer(qp);  // not detach(): a connection to the same peer is reused, not torn down and remade
  qp.direct.retry_pid = pid;
  qp.direct.retry_port = port;
  qp.direct.retries = 0;
  const int err = connect_peer(qp);
  if (err == EAGAIN) qp.direct.retry_ns = 1;  // due at the first execute
  else if (err) gate_.unavailable();
}

int DirectInitiator::open_peer(const Qp& qp, int32_t pid, uint16_t port, std::shared_ptr<DirectPeer>* out) {
  auto p = std::make_shared<DirectPeer>();
  p->pid = pid;
  p->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un sa;
  socklen_t len;
  direct::socket_name(sa, len, qp.dest_ip.key(), port);
  timeval tv{2, 0};
  if (p->sock < 0) return EIO;
  setsockopt(p->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(p->sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(p->sock, reinterpret_cast<sockaddr*>(&sa), len) != 0) return EIO;  // no direct server there
  // Abstract names belong to whoever binds them first: the server must be the process that owns the
  // target QP (the registry's, at our RTR) and of a user our policy serves, before we say anything.
  int32_t server_pid = 0;
  if (!gate_.credentials_pass(p->sock, &server_pid) || server_pid != pid) {
    gate_.refused();
    return EPERM;
  }
  // Both QPNs name the connection: the target serves only the process owning ours, for its QP
  // connected to ours.
  const direct::Request req{direct::kHello, 0, static_cast<uint64_t>(qp.dest_qpn) << 32 | qp.qpn};
  direct::Reply rep{};
  int afd = -1, wfd = -1;
  const bool got = direct::call(p->sock, req, &rep, &afd, &wfd);
  if (!got || rep.status != 0 || afd < 0 || wfd < 0 || rep.c != direct::kLayout) {
    if (afd >= 0) close(afd);
    if (wfd >= 0) close(wfd);
    return got && rep.status == EAGAIN ? EAGAIN : EPERM;  // EPERM: another user, or not connected to us
  }
  if (int err = map_target(*p, rep, afd, wfd)) return err;
  *out = std::move(p);
  return 0;
}

int DirectInitiator::connect_peer(Qp& qp) {
  const int32_t pid = qp.direct.retry_pid;
  const uint16_t port = qp.direct.retry_port;
  const uint64_t conn = static_cast<uint64_t>(qp.dest_qpn) << 32 | qp.qpn;
  uint64_t key = static_cast<uint64_t>(qp.dest_ip.key()) << 16 | port;
  std::shared_ptr<DirectPeer>& peer = peers_[key];
  if (peer && (peer->dead || peer->pid != pid)) peer.reset();
  if (!peer)
    if (int err = open_peer(qp, pid, port, &peer)) return err;
  direct::Request req{direct::kQpDesc, 0, conn};
  direct::Reply rep{};
  if (!direct::call(peer->sock, req, &rep, nullptr)) return EIO;
  if (rep.status != 0 || rep.index >= DirectShared::kQps) return rep.status == EAGAIN ? EAGAIN : EPERM;
  qp.direct.peer = peer;
  qp.direct.peer_desc = rep.index;
  // Where to wake a thread waiting for the peer QP's receive completions (none: its doorbell).
  direct::Request wreq{direct::kWake, 0, qp.dest_qpn};
  if (!direct::call(peer->sock, wreq, &rep, &qp.direct.peer_wake_fd) || rep.status != 0) {
    if (qp.direct.peer_wake_fd >= 0) close(qp.direct.peer_wake_fd);
    qp.direct.peer_wake_fd = -1;
  }
  return 0;
}

void DirectInitiator::detach(Qp& qp) {
  const bool had_peer = qp.direct.peer != nullptr;
  forget_peer(qp);
  qp.direct.retry_pid = 0;  // no local peer (DirectGate::publish: nobody is admitted for this QP)
  if (!had_peer) return;
  // The connection goes with the last QP that used it.
  for (auto it = peers_.begin(); it != peers_.end();)
    it = it->second.use_count() == 1 ? peers_.erase(it) : std::next(it);
}

DirectPeer* DirectInitiator::reconnect_if_due(Qp& qp, uint64_t& now) {
  if (!qp.direct.peer && qp.direct.retry_ns) {
    // The peer's QP was not yet in RTR towards ours when we were: ask again, at most once a millisecond
    // (each ask is a round trip to its server thread), for a while.
    if (!now) now = coarse_now_ns();
    if (static_cast<int64_t>(now - qp.direct.retry_ns) < 0) return nullptr;
    const uint32_t retries = qp.direct.retries + 1;
    const int err = connect_peer(qp);
    qp.direct.retries = retries;
    qp.direct.retry_ns = err == EAGAIN && retries < 10000 ? now + 1000000 : 0;
    if (!qp.direct.retry_ns && err) gate_.unavailable();
  }
  return qp.direct.peer.get();
}

bool DirectInitiator::peer_alive(DirectPeer& peer, uint64_t now) {
  if (static_cast<int64_t>(now - peer.checked_ns) <= 1000000) return true;
  // The target process may have died: then its memory is no longer anybody's, and the packet path
  // gives what the wire would (retries, then RETRY_EXC_ERR). Looked at once a millisecond or tick.
  peer.checked_ns = now;
  pollfd pf{peer.sock, POLLIN, 0};
  if (poll(&pf, 1, 0) > 0 && (pf.revents & (POLLHUP | POLLERR | POLLIN))) {
    peer.dead = true;
    return false;
  }
  return true;
}

}  // namespace softrdma::transport
