#include "transport/direct.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <system_error>

#include "net/registry.h"
#include "transport/direct_share.h"
#include "transport/work_request.h"

namespace softrdma::transport {

DirectEndpoint::PeerPolicy DirectEndpoint::peer_policy() { return config::parse().direct_peers; }

namespace {

// kHello and kQpDesc carry (target QPN << 32 | initiator QPN), kWake the target QPN, kMap an rkey.
// kRing (no reply): wake the target's engine, for a SEND left on an armed CQ; its server thread rings
// the engine's own doorbell (a peer never holds that eventfd: it could clear O_NONBLOCK on it, which is
// the engine's open file description too, and make the engine's reads block). kDoorbell is refused.
enum : uint32_t { kHello = 1, kQpDesc = 2, kMap = 3, kDoorbell = 4, kWake = 5, kRing = 6 };

struct Reply {
  int32_t status;  // 0 or an errno
  uint32_t index;
  uint64_t a, b, c, d;
};

constexpr uint32_t kLayout = sizeof(core::MrRegion) << 16 | sizeof(DirectShared) % 0xFFFF;

void socket_name(sockaddr_un& sa, socklen_t& len, uint32_t ip_be, uint16_t port) {
  sa = {};
  sa.sun_family = AF_UNIX;
  // Abstract (leading NUL): no file to clean up, and per network namespace like the registry.
  int n = snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "softrdma-direct-%08x-%u", ip_be, port);
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

bool send_reply(int fd, const Reply& r, int pass_fd, int pass_fd2 = -1) {
  iovec iov{const_cast<Reply*>(&r), sizeof r};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(2 * sizeof(int))];
  if (pass_fd >= 0) {
    const int fds[2] = {pass_fd, pass_fd2};
    const size_t n = pass_fd2 >= 0 ? 2 : 1;
    mh.msg_control = ctl;
    mh.msg_controllen = CMSG_SPACE(n * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, n * sizeof(int));
  }
  return sendmsg(fd, &mh, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof r);
}

// One request, one reply (and up to two fds). Blocking, bounded by a receive timeout.
bool call(int sock, const DirectEndpoint::Request& req, Reply* rep, int* fd, int* fd2 = nullptr) {
  if (fd) *fd = -1;
  if (fd2) *fd2 = -1;
  if (send(sock, &req, sizeof req, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof req)) return false;
  iovec iov{rep, sizeof *rep};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(2 * sizeof(int))];
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof ctl;
  ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  int got[2] = {-1, -1};
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t k = std::min<size_t>(2, (c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      std::memcpy(got, CMSG_DATA(c), k * sizeof(int));
    }
  const bool ok = n == static_cast<ssize_t>(sizeof *rep);
  int* outs[2] = {ok ? fd : nullptr, ok ? fd2 : nullptr};
  for (int i = 0; i < 2; ++i) {
    if (outs[i]) *outs[i] = got[i];
    else if (got[i] >= 0) close(got[i]);
  }
  return ok;
}

bool pid_alive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH); }

}  // namespace

// An initiator's view of one target context: its arena mapped here, our busy slot in it, and the
// target's registered memory mapped lazily, per share.
class DirectPeer {
 public:
  struct Mapping {
    uint64_t id, base, length;
    uint8_t* local;
    bool writable;
  };
  int sock = -1;
  int32_t pid = 0;
  const uint8_t* arena = nullptr;  // mapped read-only
  size_t arena_size = 0;
  uint8_t* rw = nullptr;  // the target's writable area: our busy slot, inboxes, CQ arm words
  size_t rw_size = 0;
  DirectPeerSlot* slots = nullptr;
  const DirectShared* shared = nullptr;
  const void* key_table = nullptr;
  const std::atomic<uint64_t>* key_seq = nullptr;
  uint32_t slot = 0;
  bool dead = false;
  bool vm_denied = false;  // process_vm_writev/readv refused (ptrace rules): unshared memory by packets
  uint64_t checked_ns = 0;
  std::vector<Mapping> maps;
  // The last rkey found, valid while the target's key table sequence number is still cached_seq (every
  // change of the table moves it; odd never matches), and the index of its mapping in maps.
  uint64_t cached_seq = 1;
  uint32_t cached_rkey = 0;
  core::MrRegion cached_region{};
  size_t cached_map = ~size_t{0};
  // The same for the last lkey of a receive WQE (odd cached_local_seq: nothing cached).
  uint64_t cached_local_seq = 1;
  core::MrRegion cached_local{};

  ~DirectPeer() {
    for (Mapping& m : maps) munmap(m.local, m.length);
    if (arena) munmap(const_cast<uint8_t*>(arena), arena_size);
    if (rw) munmap(rw, rw_size);
    if (sock >= 0) close(sock);  // the target frees our slot
  }

  // The share's mapping here, if it is mapped (with write access when asked); the last one found first.
  const Mapping* mapped(uint64_t id, bool writable) {
    auto fits = [&](const Mapping& x) { return x.id == id && (x.writable || !writable); };
    if (cached_map < maps.size() && fits(maps[cached_map])) return &maps[cached_map];
    for (size_t i = 0; i < maps.size(); ++i)
      if (fits(maps[i])) {
        cached_map = i;
        return &maps[i];
      }
    return nullptr;
  }

  // The same, mapped now if it is not: the target's server is asked for the fd of the share that
  // rkey lies in (it checks the key grants that access, in the PD of a QP connected to us).
  const Mapping* mapping(uint64_t id, uint32_t rkey, bool writable) {
    if (const Mapping* m = mapped(id, writable)) return m;
    DirectEndpoint::Request req{kMap, writable, rkey};
    Reply rep{};
    int fd = -1;
    if (!call(sock, req, &rep, &fd) || rep.status != 0 || fd < 0 || rep.index != static_cast<uint32_t>(id)) {
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
};

DirectEndpoint::DirectEndpoint(core::Arena& arena, const core::MrTable& keys, uint32_t ip_be, uint16_t port,
                               int doorbell_fd, core::Counters* counters)
    : arena_(arena),
      rw_(std::make_shared<core::Arena>(kWritableBytes, /*peers_write=*/true)),
      keys_(keys),
      counters_(counters),
      policy_(peer_policy()),
      doorbell_fd_(doorbell_fd) {
  // Peers get the arena read-only: sealed against writing (a descriptor's O_RDONLY alone is not enough:
  // a memfd can be reopened O_RDWR through /proc/self/fd), and neither file can change size.
  if (!arena_.sealed() || !rw_->sealed())
    throw std::system_error(ENOTSUP, std::generic_category(), "direct arena seals");
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", arena_.fd());
  ro_fd_ = open(path, O_RDONLY | O_CLOEXEC);
  if (ro_fd_ < 0) throw std::system_error(errno, std::generic_category(), "direct arena read-only");
  slots_ = static_cast<DirectPeerSlot*>(rw_->allocate(sizeof(DirectPeerSlot) * DirectShared::kPeers));
  shared_ = static_cast<DirectShared*>(arena_.allocate(sizeof(DirectShared)));
  if (!shared_ || !slots_) {
    close(ro_fd_);
    throw std::system_error(ENOMEM, std::generic_category(), "direct arena block");
  }
  shared_->peers_off = static_cast<uint64_t>(reinterpret_cast<uint8_t*>(slots_) - rw_->base());
  shared_->magic = DirectShared::kMagic;
  shared_->layout = kLayout;
  shared_->key_table_off = static_cast<uint64_t>(static_cast<const uint8_t*>(keys.slots()) - arena_.base());
  shared_->key_seq_off = static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(keys.seq()) - arena_.base());
  for (uint32_t i = DirectShared::kQps; i-- > 0;) free_descs_.push_back(i);
  for (int& fd : wake_fds_) fd = -1;
  for (auto& sp : slot_pid_) sp.store(0, std::memory_order_relaxed);
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  sockaddr_un sa;
  socklen_t len;
  socket_name(sa, len, ip_be, port);
  if (listen_fd_ < 0 || stop_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
      listen(listen_fd_, 64) != 0) {
    int e = errno;
    if (listen_fd_ >= 0) close(listen_fd_);
    if (stop_fd_ >= 0) close(stop_fd_);
    close(ro_fd_);
    arena_.release(shared_, sizeof(DirectShared));
    throw std::system_error(e, std::generic_category(), "direct socket");
  }
  // The server thread takes none of the application's signals (as the progress thread).
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  server_ = std::thread([this] { serve(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

DirectEndpoint::~DirectEndpoint() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(stop_fd_, &one, sizeof one);
  if (server_.joinable()) server_.join();
  for (Client& c : clients_) close(c.fd);
  close(listen_fd_);
  close(stop_fd_);
  peers_.clear();
  for (int fd : wake_fds_)
    if (fd >= 0) close(fd);
  close(ro_fd_);
  arena_.release(shared_, sizeof(DirectShared));
  rw_->release(slots_, sizeof(DirectPeerSlot) * DirectShared::kPeers);
}

void DirectEndpoint::serve() {
  // Blocks in poll: an idle target costs nothing. Only the connection set-up and the first use of each
  // registered range come here; data never does.
  for (;;) {
    std::vector<pollfd> pfds;
    pfds.push_back({stop_fd_, POLLIN, 0});
    pfds.push_back({listen_fd_, POLLIN, 0});
    for (const Client& c : clients_) pfds.push_back({c.fd, POLLIN, 0});
    if (poll(pfds.data(), pfds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (pfds[0].revents) return;
    if (pfds[1].revents & POLLIN) {
      int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      int32_t pid = 0;
      if (c >= 0) {
        timeval tv{1, 0};
        setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        ucred cred{};
        socklen_t cl = sizeof cred;
        getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl);
        if (!credentials_pass(c, &pid)) {
          // Another user (SOFTRDMA_DIRECT_PEERS): EPERM now, closed now -- it holds nothing of ours. What
          // it sent already is read first (closing with it unread resets the connection: the client
          // would see ECONNRESET once, then our EPERM).
          refused();
          Request junk;
          while (recv(c, &junk, sizeof junk, MSG_DONTWAIT) > 0) {
          }
          Reply no{};
          no.status = EPERM;
          send_reply(c, no, -1);
          close(c);
        } else if (clients_.size() >= kMaxClients) {
          close(c);  // a flood of connections costs us nothing more
        } else {
          // Connections of one user that have not been admitted yet are bounded: past kMaxIdlePerUid,
          // its oldest one goes (a real initiator says hello at once).
          size_t idle = 0, oldest = clients_.size();
          for (size_t k = 0; k < clients_.size(); ++k)
            if (clients_[k].fd >= 0 && clients_[k].slot < 0 && clients_[k].uid == cred.uid) {
              if (oldest == clients_.size()) oldest = k;
              ++idle;
            }
          if (idle >= kMaxIdlePerUid) {
            close(clients_[oldest].fd);
            clients_[oldest].fd = -1;
          }
          clients_.push_back({c, -1, pid, cred.uid, {}});
        }
      }
    }
    for (size_t i = 2; i < pfds.size(); ++i) {
      if (!pfds[i].revents) continue;
      size_t k = i - 2;
      if (clients_[k].fd < 0) continue;  // closed above (too many idle ones of its user)
      Request req{};
      ssize_t n = recv(pfds[i].fd, &req, sizeof req, MSG_DONTWAIT);
      if (n == static_cast<ssize_t>(sizeof req)) {
        handle_client(clients_[k], req);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      // Gone: its slot is free again (it held no copy: a process only closes after its last one).
      if (clients_[k].slot >= 0) {
        slots_[clients_[k].slot].busy.store(0, std::memory_order_release);
        slots_[clients_[k].slot].pid.store(0, std::memory_order_release);
        slot_pid_[clients_[k].slot].store(0, std::memory_order_seq_cst);
      }
      close(clients_[k].fd);
      clients_[k].fd = -1;
    }
    for (size_t k = clients_.size(); k-- > 0;)
      if (clients_[k].fd < 0) clients_.erase(clients_.begin() + static_cast<long>(k));
  }
}

bool DirectEndpoint::credentials_pass(int fd, int32_t* pid) {
  ucred cred{};
  socklen_t cl = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.pid <= 0) return false;
  *pid = cred.pid;
  // Root could ptrace us anyway; our own user is who the memory belongs to.
  if (policy_ == PeerPolicy::Any || cred.uid == 0 || cred.uid == geteuid()) return true;
  if (policy_ != PeerPolicy::Group) return false;
  const gid_t ours = getegid();
  if (cred.gid == ours) return true;
  // A member of our primary group by /etc/group (its own primary group may be another).
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* pwp = nullptr;
  group gr{};
  group* grp = nullptr;
  std::vector<char> gbuf(65536);
  if (getpwuid_r(cred.uid, &pw, buf.data(), buf.size(), &pwp) != 0 || !pwp) return false;
  if (getgrgid_r(ours, &gr, gbuf.data(), gbuf.size(), &grp) != 0 || !grp) return false;
  for (char** m = grp->gr_mem; m && *m; ++m)
    if (strcmp(*m, pwp->pw_name) == 0) return true;
  return false;
}

int DirectEndpoint::admit(Client& c, uint32_t target_qpn, uint32_t initiator_qpn, uint32_t* desc) {
  if (!target_qpn || !initiator_qpn) return EPERM;
  uint32_t i = 0;
  Gate g{};
  {
    std::lock_guard lock(gate_mu_);
    for (; i < DirectShared::kQps; ++i)
      if (gate_[i].qpn == target_qpn) break;
    if (i == DirectShared::kQps) return EPERM;
    g = gate_[i];
  }
  const auto st = static_cast<QpState>(g.state);
  const bool live = st == QpState::Rtr || st == QpState::Rts || st == QpState::Sqd;
  // Not yet in RTR: its peer may still be on its way to it (either side may reach RTR first).
  if (st == QpState::Reset || st == QpState::Init) return EAGAIN;
  if (!live || g.dest_qpn != initiator_qpn) return EPERM;
  // The client must be the process that owns the initiator QPN, not merely one that knows it: the
  // process our QP found its peer in at RTR (none when its peer is on another host, whatever the registry
  // says of that QPN now), and still the registry's owner of it.
  if (!g.peer_pid || g.peer_pid != c.pid) return EPERM;
  auto ep = net::Registry::instance().lookup(initiator_qpn);
  if (!ep || ep->pid != c.pid) return EPERM;
  bool known = false;
  for (Client::Conn& k : c.descs)
    if (k.desc == i) {
      k = {i, target_qpn, initiator_qpn};  // a reused descriptor: the new connection replaces the old
      known = true;
    }
  if (!known) c.descs.push_back({i, target_qpn, initiator_qpn});
  *desc = i;
  return 0;
}

bool DirectEndpoint::still_connected(const Client::Conn& k) const {
  const Gate& g = gate_[k.desc];
  const auto st = static_cast<QpState>(g.state);
  return g.qpn == k.qpn && g.dest_qpn == k.peer_qpn &&
         (st == QpState::Rtr || st == QpState::Rts || st == QpState::Sqd);
}

bool DirectEndpoint::connected_desc(const Client& c, uint32_t target_qpn, uint32_t* desc) {
  std::lock_guard lock(gate_mu_);
  for (const Client::Conn& k : c.descs)
    if (k.qpn == target_qpn && still_connected(k)) {
      *desc = k.desc;
      return true;
    }
  return false;
}

void DirectEndpoint::handle_client(Client& c, const Request& req) {
  const int fd = c.fd;
  Reply rep{};
  auto refuse = [&](int err) {
    if (err != EAGAIN) refused();
    rep.status = err;
    send_reply(fd, rep, -1);
  };
  switch (req.type) {
    case kHello: {
      uint32_t desc = 0;
      if (c.slot >= 0) return refuse(EBUSY);
      if (int err = admit(c, static_cast<uint32_t>(req.arg >> 32), static_cast<uint32_t>(req.arg), &desc))
        return refuse(err);
      int32_t slot = -1;
      // Who holds which slot is ours to know (slot_pid_), not what peers wrote in the writable area.
      for (uint32_t i = 0; i < DirectShared::kPeers && slot < 0; ++i) {
        if (slot_pid_[i].load(std::memory_order_relaxed) != 0) continue;
        slots_[i].busy.store(0, std::memory_order_relaxed);
        slots_[i].pid.store(c.pid, std::memory_order_release);
        slot_pid_[i].store(c.pid, std::memory_order_seq_cst);
        slot = static_cast<int32_t>(i);
      }
      if (slot < 0) return refuse(EBUSY);
      c.slot = slot;
      rep.index = static_cast<uint32_t>(slot);
      rep.a = arena_.capacity();
      rep.b = static_cast<uint64_t>(reinterpret_cast<uint8_t*>(shared_) - arena_.base());
      rep.c = kLayout;
      rep.d = rw_->capacity();
      send_reply(fd, rep, ro_fd_, rw_->fd());
      return;
    }
    case kQpDesc: {
      uint32_t desc = 0;
      if (c.slot < 0) return refuse(EPERM);
      if (int err = admit(c, static_cast<uint32_t>(req.arg >> 32), static_cast<uint32_t>(req.arg), &desc))
        return refuse(err);
      rep.index = desc;
      send_reply(fd, rep, -1);
      return;
    }
    case kDoorbell:
      // No fd of the engine's (kRing instead).
      if (c.slot < 0 || c.descs.empty()) return refuse(EPERM);
      return refuse(ENOTSUP);
    case kRing:
      if (c.slot >= 0 && !c.descs.empty()) {
        uint64_t one = 1;
        [[maybe_unused]] ssize_t n = write(doorbell_fd_, &one, sizeof one);
      }
      return;  // no reply
    case kWake: {
      // The wake-up pipe of a QP's receive CQ channel, for the initiator connected to it (it can only wake).
      uint32_t desc = 0;
      if (c.slot < 0 || !connected_desc(c, static_cast<uint32_t>(req.arg), &desc)) return refuse(EPERM);
      std::lock_guard lock(wake_mu_);
      // A new open file description of the pipe's write end, the peer's own: O_NONBLOCK is a flag of the
      // description, and a peer that cleared it on a dup of ours would make our own writes block.
      int wfd = -1;
      if (wake_fds_[desc] >= 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", wake_fds_[desc]);
        wfd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      }
      rep.status = wfd >= 0 ? 0 : ENOENT;
      send_reply(fd, rep, wfd);
      if (wfd >= 0) close(wfd);
      return;
    }
    case kMap: {
      if (c.slot < 0 || c.descs.empty()) return refuse(EPERM);
      // The rkey must be live now and grant what is asked, in the PD of a QP connected to this client
      // whose own access flags allow it (what the responder checks for each request).
      const uint32_t need = req.writable ? core::kRemoteWrite | core::kRemoteAtomic : core::kRemoteRead;
      core::MrRegion r{};
      bool found = false;
      for (int tries = 0; tries < 100 && !found; ++tries) {
        const uint64_t seq = keys_.seq()->load(std::memory_order_acquire);
        if (seq & 1) {
          sched_yield();
          continue;
        }
        const bool hit = core::MrTable::find_in(keys_.slots(), static_cast<uint32_t>(req.arg), true, &r);
        if (keys_.seq()->load(std::memory_order_acquire) != seq) continue;
        if (!hit) break;
        found = true;
      }
      constexpr uint32_t kWriteBits = core::kRemoteWrite | core::kRemoteAtomic;
      bool allowed = found && (r.access & need) && r.share_id != 0;
      bool may_write = false;  // a QP of this client may write this MR: it may get the share's writable file
      if (allowed) {
        allowed = false;
        std::lock_guard lock(gate_mu_);
        for (const Client::Conn& k : c.descs) {
          if (!still_connected(k) || gate_[k.desc].pd != r.pd) continue;
          // One right asked for, granted by both the QP and the MR (not one bit by each).
          if (gate_[k.desc].access & r.access & need) allowed = true;
          if (gate_[k.desc].access & r.access & kWriteBits) may_write = true;
        }
      }
      if (!allowed) return refuse(EACCES);
      ShareInfo info;
      const bool writable = req.writable && (r.access & kWriteBits);
      int sfd = ShareTable::instance().open_fd(r.share_id, writable, may_write, &info);
      if (sfd < 0) {
        rep.status = EACCES;
        send_reply(fd, rep, -1);
        return;
      }
      rep.index = static_cast<uint32_t>(r.share_id);
      rep.a = info.base;
      rep.b = info.length;
      rep.c = info.file_off;
      send_reply(fd, rep, sfd);
      close(sfd);
      return;
    }
    default:
      rep.status = EINVAL;
      send_reply(fd, rep, -1);
  }
}

void DirectEndpoint::publish_gate(const Qp& qp) {
  if (qp.direct.desc == ~0u) return;
  std::lock_guard lock(gate_mu_);
  Gate& g = gate_[qp.direct.desc];
  g.qpn = qp.qpn;
  g.dest_qpn = qp.cfg.type == QpType::Rc ? qp.dest_qpn : 0;
  g.state = static_cast<uint32_t>(qp.state.load(std::memory_order_relaxed));
  g.pd = qp.cfg.pd;
  g.access = qp.access_flags;
  g.peer_pid = qp.cfg.type == QpType::Rc ? qp.direct.retry_pid : 0;
}

void DirectEndpoint::qp_created(Qp& qp) {
  // XRC QPs have no descriptor: initiators never take them for a direct target (packets only).
  if (free_descs_.empty() || qp.cfg.xrc != XrcRole::None) return;
  qp.direct.desc = free_descs_.back();
  free_descs_.pop_back();
  DirectQpDesc& d = shared_->qps[qp.direct.desc];
  d.state.store(static_cast<uint32_t>(QpState::Reset), std::memory_order_relaxed);
  d.access.store(0, std::memory_order_relaxed);
  d.pd.store(qp.cfg.pd, std::memory_order_relaxed);
  d.inbox_off.store(0, std::memory_order_relaxed);
  d.rq_ring_off.store(static_cast<uint64_t>(reinterpret_cast<uint8_t*>(qp.rq.slots) - arena_.base()),
                      std::memory_order_relaxed);
  d.rq_mask.store(qp.rq.mask, std::memory_order_relaxed);
  // 0 for a receive CQ without a completion channel: nobody can be waiting on it, so initiators skip
  // the fence and the look at its arm state.
  const core::CompletionQueue* rcq = qp.cfg.recv_cq;
  // (The arm word is in the writable area, where initiators may claim it.)
  const bool arm_shared = rcq && rcq->notifies() && rcq->arm_arena() == rw_.get();
  d.recv_cq_arm_off.store(
      arm_shared ? static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(rcq->arm_word()) - rw_->base()) : 0,
      std::memory_order_relaxed);
  d.rq_head.store(0, std::memory_order_relaxed);
  d.tails.store(0, std::memory_order_relaxed);
  d.generation.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(wake_mu_);
    wake_fds_[qp.direct.desc] = rcq && rcq->notifies() && rcq->wake_fd() >= 0 ? fcntl(rcq->wake_fd(), F_DUPFD_CLOEXEC, 0) : -1;
  }
  d.qpn.store(qp.qpn, std::memory_order_release);
  publish_gate(qp);
}

void DirectEndpoint::qp_changed(Qp& qp) {
  if (qp.direct.desc == ~0u) return;
  DirectQpDesc& d = shared_->qps[qp.direct.desc];
  const QpState st = qp.state.load(std::memory_order_relaxed);
  // An inbox for a connected RC QP whose peer is another context here (attach found it: the peer is
  // symmetric). With an SRQ, initiators could not know which WQE a message takes: packets.
  // (Or will be: its server said EAGAIN, and the peer may already be sending to us.)
  // A receive CQ with a channel whose arm word initiators cannot reach could never be woken: packets.
  const core::CompletionQueue* rcq = qp.cfg.recv_cq;
  const bool wakeable = !rcq || !rcq->notifies() || rcq->arm_arena() == rw_.get();
  if (st == QpState::Rtr && !qp.direct.inbox && (qp.direct.peer || qp.direct.retry_ns) && qp.cfg.type == QpType::Rc &&
      !qp.srq && wakeable) {
    if (void* mem = rw_->allocate(sizeof(DirectInbox))) {  // zeroed, in the writable area
      qp.direct.inbox = static_cast<DirectInbox*>(mem);
      d.inbox_off.store(static_cast<uint64_t>(static_cast<uint8_t*>(mem) - rw_->base()), std::memory_order_release);
    }
  }
  d.access.store(qp.access_flags, std::memory_order_relaxed);
  d.state.store(static_cast<uint32_t>(st), std::memory_order_seq_cst);
  publish_gate(qp);
  if (st == QpState::Err || st == QpState::Reset) {
    // From here on no initiator takes the QP as live: nothing more enters its inbox, and what did is
    // placed (error: before the flush) or dropped (reset).
    wait_copies();
    if (st == QpState::Reset) {
      if (DirectInbox* in = qp.direct.inbox) {
        in->head = 0;
        in->data_head = 0;
        in->data_tail.store(0, std::memory_order_relaxed);
        for (DirectInboxEntry& en : in->entries) en.stamp.store(0, std::memory_order_relaxed);
      }
      d.generation.fetch_add(1, std::memory_order_release);
      qp.direct.inbox_tail = 0;
      publish_rq_head(qp, 0);
      publish_tails(qp);
    }
  }
}

void DirectEndpoint::qp_access_changed(Qp& qp) {
  if (qp.direct.desc == ~0u) return;
  DirectQpDesc& d = shared_->qps[qp.direct.desc];
  const uint32_t before = d.access.load(std::memory_order_relaxed);
  d.access.store(qp.access_flags, std::memory_order_seq_cst);
  publish_gate(qp);
  // An initiator that read the old flags is inside its copy window: let it finish.
  if (before & ~qp.access_flags) wait_copies();
}

void DirectEndpoint::release_inbox(Qp& qp) {
  if (!qp.direct.inbox) return;
  rw_->release(qp.direct.inbox, sizeof(DirectInbox));
  qp.direct.inbox = nullptr;
}

void DirectEndpoint::qp_destroyed(Qp& qp) {
  detach(qp);
  if (qp.direct.desc == ~0u) return;
  DirectQpDesc& d = shared_->qps[qp.direct.desc];
  d.state.store(static_cast<uint32_t>(QpState::Err), std::memory_order_relaxed);
  d.qpn.store(0, std::memory_order_seq_cst);
  {
    std::lock_guard lock(gate_mu_);
    gate_[qp.direct.desc] = Gate{};
  }
  // An initiator that saw this QP live may be finishing a copy: let it, before the QP's memory goes.
  wait_copies();
  {
    std::lock_guard lock(wake_mu_);
    if (wake_fds_[qp.direct.desc] >= 0) close(wake_fds_[qp.direct.desc]);
    wake_fds_[qp.direct.desc] = -1;
  }
  free_descs_.push_back(qp.direct.desc);
  qp.direct.desc = ~0u;
}

void DirectEndpoint::wait_copies() {
  // Every initiator either saw the new sequence number before its copy (and re-checks), or announced
  // its copy before we looked (and we wait for it): a seq_cst store and load on each side.
  // Only slots our server gave to a connected client count (slot_pid_; a peer can write any slot's pid and
  // busy words), and only while that client is connected.
  for (uint32_t i = 0; i < DirectShared::kPeers; ++i) {
    DirectPeerSlot& s = slots_[i];
    const int32_t pid = slot_pid_[i].load(std::memory_order_seq_cst);
    if (pid == 0) continue;
    for (uint32_t spins = 0; s.busy.load(std::memory_order_seq_cst); ++spins) {
      if (slot_pid_[i].load(std::memory_order_relaxed) != pid) break;  // its client went
      if ((spins & 1023) == 1023 && !pid_alive(pid)) break;  // it died mid-copy: nothing left to wait for
      sched_yield();
    }
  }
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
}  // namespace

void DirectEndpoint::attach(Qp& qp, int32_t pid, uint16_t port) {
  forget_peer(qp);  // not detach(): a connection to the same peer is reused, not torn down and remade
  qp.direct.retry_pid = pid;
  qp.direct.retry_port = port;
  qp.direct.retries = 0;
  if (connect_peer(qp) == EAGAIN) qp.direct.retry_ns = 1;  // due at the first execute
}

int DirectEndpoint::connect_peer(Qp& qp) {
  const int32_t pid = qp.direct.retry_pid;
  const uint16_t port = qp.direct.retry_port;
  // Both QPNs name the connection: the target serves only the process owning ours, for its QP
  // connected to ours.
  const uint64_t conn = static_cast<uint64_t>(qp.dest_qpn) << 32 | qp.qpn;
  uint64_t key = static_cast<uint64_t>(qp.dest_ip_be) << 16 | port;
  std::shared_ptr<DirectPeer>& peer = peers_[key];
  if (peer && (peer->dead || peer->pid != pid)) peer.reset();
  if (!peer) {
    auto p = std::make_shared<DirectPeer>();
    p->pid = pid;
    p->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un sa;
    socklen_t len;
    socket_name(sa, len, qp.dest_ip_be, port);
    timeval tv{2, 0};
    if (p->sock < 0) return EIO;
    setsockopt(p->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(p->sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(p->sock, reinterpret_cast<sockaddr*>(&sa), len) != 0) return EIO;  // no direct server there
    // Abstract names belong to whoever binds them first: the server must be the process that owns the
    // target QP (the registry's, at our RTR) and of a user our policy serves, before we say anything.
    int32_t server_pid = 0;
    if (!credentials_pass(p->sock, &server_pid) || server_pid != pid) {
      refused();
      return EPERM;
    }
    DirectEndpoint::Request req{kHello, 0, conn};
    Reply rep{};
    int afd = -1, wfd = -1;
    const bool got = call(p->sock, req, &rep, &afd, &wfd);
    auto close_both = [&] {
      if (afd >= 0) close(afd);
      if (wfd >= 0) close(wfd);
    };
    if (!got || rep.status != 0 || afd < 0 || wfd < 0 || rep.c != kLayout) {
      close_both();
      return got && rep.status == EAGAIN ? EAGAIN : EPERM;  // EPERM: another user, or not connected to us
    }
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
      p->arena = static_cast<const uint8_t*>(a);
      p->arena_size = rep.a;
    }
    if (w != MAP_FAILED) {
      p->rw = static_cast<uint8_t*>(w);
      p->rw_size = rep.d;
    }
    if (a == MAP_FAILED || w == MAP_FAILED) return EIO;
    if (rep.b > rep.a || sizeof(DirectShared) > rep.a - rep.b) return EIO;
    p->shared = reinterpret_cast<const DirectShared*>(p->arena + rep.b);
    if (p->shared->magic != DirectShared::kMagic) return EIO;
    // Where the target says its key table is must lie inside what we mapped (we read it on every WQE).
    const uint64_t kt = p->shared->key_table_off, ks = p->shared->key_seq_off;
    if (kt > rep.a || core::MrTable::slots_bytes() > rep.a - kt || ks > rep.a - sizeof(uint64_t) || ks % 8)
      return EIO;
    // (The values checked, not read again: the target could change them in between.)
    p->key_table = p->arena + kt;
    p->key_seq = reinterpret_cast<const std::atomic<uint64_t>*>(p->arena + ks);
    p->slot = rep.index;
    const uint64_t po = p->shared->peers_off;
    if (p->slot >= DirectShared::kPeers || po > p->rw_size ||
        sizeof(DirectPeerSlot) * DirectShared::kPeers > p->rw_size - po || po % alignof(DirectPeerSlot))
      return EIO;
    p->slots = reinterpret_cast<DirectPeerSlot*>(p->rw + po);
    peer = std::move(p);
  }
  Request req{kQpDesc, 0, conn};
  Reply rep{};
  if (!call(peer->sock, req, &rep, nullptr)) return EIO;
  if (rep.status != 0 || rep.index >= DirectShared::kQps) return rep.status == EAGAIN ? EAGAIN : EPERM;
  qp.direct.peer = peer;
  qp.direct.peer_desc = rep.index;
  // Where to wake a thread waiting for the peer QP's receive completions (none: its doorbell).
  Request wreq{kWake, 0, qp.dest_qpn};
  if (!call(peer->sock, wreq, &rep, &qp.direct.peer_wake_fd) || rep.status != 0) {
    if (qp.direct.peer_wake_fd >= 0) close(qp.direct.peer_wake_fd);
    qp.direct.peer_wake_fd = -1;
  }
  return 0;
}

void DirectEndpoint::detach(Qp& qp) {
  const bool had_peer = qp.direct.peer != nullptr;
  forget_peer(qp);
  qp.direct.retry_pid = 0;  // no local peer (publish_gate: nobody is admitted for this QP)
  if (!had_peer) return;
  // The connection goes with the last QP that used it.
  for (auto it = peers_.begin(); it != peers_.end();)
    it = it->second.use_count() == 1 ? peers_.erase(it) : std::next(it);
}

namespace {
uint64_t coarse_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The data movement of a checked WRITE, READ or ATOMIC; dst: the target bytes, mapped here.
void copy_one_sided(const SendWqe& w, uint8_t* const* host, uint8_t* dst, uint64_t len) {
  switch (w.op) {
    case WrOp::Write:
    case WrOp::WriteImm:
      if (w.flags & kInline) {
        std::memcpy(dst, w.inline_data, len);
      } else {
        for_each_sge_piece(w.sge, host, w.num_sge, 0, len, [&](uint8_t* p, uint64_t n) {
          std::memcpy(dst, p, n);
          dst += n;
          return true;
        });
      }
      break;
    case WrOp::AtomicWrite: {
      // One aligned 8-byte store: no reader of the target sees a torn value (IBTA 1.5 ATOMIC WRITE).
      uint64_t value = 0;
      if (w.flags & kInline) {
        std::memcpy(&value, w.inline_data, 8);
      } else {
        auto* out = reinterpret_cast<uint8_t*>(&value);
        for_each_sge_piece(w.sge, host, w.num_sge, 0, 8, [&](uint8_t* p, uint64_t n) {
          std::memcpy(out, p, n);
          out += n;
          return true;
        });
      }
      __atomic_store_n(reinterpret_cast<uint64_t*>(dst), value, __ATOMIC_SEQ_CST);
      break;
    }
    case WrOp::Read: {
      const uint8_t* src = dst;
      for_each_sge_piece(w.sge, host, w.num_sge, 0, len, [&](uint8_t* p, uint64_t n) {
        std::memcpy(p, src, n);
        src += n;
        return true;
      });
      break;
    }
    default: {
      auto* word = reinterpret_cast<uint64_t*>(dst);
      uint64_t orig;
      if (w.op == WrOp::CompareSwap) {
        orig = w.compare_add;
        __atomic_compare_exchange_n(word, &orig, w.swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      } else {
        orig = __atomic_fetch_add(word, w.compare_add, __ATOMIC_SEQ_CST);
      }
      // The original value lands in the local buffer in host order, as the packet path leaves it.
      const auto* src = reinterpret_cast<const uint8_t*>(&orig);
      for_each_sge_piece(w.sge, host, w.num_sge, 0, 8, [&](uint8_t* p, uint64_t n) {
        std::memcpy(p, src, n);
        src += n;
        return true;
      });
    }
  }
}

// The target QP's inbox when its next message (of len payload bytes) will find room there and a receive
// WQE that takes it without error -- exactly what the target's engine checks when it places it;
// nullptr otherwise (no inbox, RNR, too long, a bad receive SGE: the packet path answers). v: what this
// QP knows of the target's receive queue, refreshed only when it runs out, so that a message costs one
// line of the target's that moved (the WQE's). Everything read here is the target's and is
// bounds-checked. Called inside the copy window, under the key table's seq (which the caller checks
// again).
DirectInbox* receive_room(DirectPeer& p, const DirectQpDesc& d, Qp::DirectRecvView& v, uint64_t len) {
  const uint64_t off = d.inbox_off.load(std::memory_order_acquire);
  if (!off || off > p.rw_size || sizeof(DirectInbox) > p.rw_size - off || off % 64) return nullptr;
  auto* in = reinterpret_cast<DirectInbox*>(p.rw + off);
  const uint32_t gen = d.generation.load(std::memory_order_acquire);
  const auto head = static_cast<uint32_t>(in->head);
  if (!v.valid || v.generation != gen) {
    const uint64_t tails = d.tails.load(std::memory_order_acquire);
    v.consumed = static_cast<uint32_t>(tails >> 32);
    // The WQEs before ours are spoken for by the messages still in the inbox.
    v.next_wqe = static_cast<uint32_t>(tails) + (head - v.consumed);
    v.rq_head = static_cast<uint32_t>(d.rq_head.load(std::memory_order_acquire));
    v.data_tail = in->data_tail.load(std::memory_order_acquire);
    v.generation = gen;
    v.valid = true;
  }
  if (static_cast<int32_t>(v.rq_head - v.next_wqe) <= 0) {
    v.rq_head = static_cast<uint32_t>(d.rq_head.load(std::memory_order_acquire));
    if (static_cast<int32_t>(v.rq_head - v.next_wqe) <= 0) return nullptr;  // RNR: the wire's answer
  }
  if (head - v.consumed >= DirectInbox::kEntries) {
    v.consumed = static_cast<uint32_t>(d.tails.load(std::memory_order_acquire) >> 32);
    if (head - v.consumed >= DirectInbox::kEntries) return nullptr;
  }
  if (len > DirectInboxEntry::kInlineBytes && len > DirectInbox::kDataBytes - (in->data_head - v.data_tail)) {
    v.data_tail = in->data_tail.load(std::memory_order_acquire);
    if (len > DirectInbox::kDataBytes - (in->data_head - v.data_tail)) return nullptr;
  }
  const uint64_t ring = d.rq_ring_off.load(std::memory_order_relaxed);
  const uint64_t slots = uint64_t{d.rq_mask.load(std::memory_order_relaxed)} + 1;
  if (!ring || ring > p.arena_size || slots > (p.arena_size - ring) / sizeof(RecvWqe)) return nullptr;
  const auto* wqe = reinterpret_cast<const RecvWqe*>(p.arena + ring + (v.next_wqe & (slots - 1)) * sizeof(RecvWqe));
  const uint32_t num_sge = wqe->num_sge;
  if (num_sge > core::DeviceLimits::kMaxSge || len > wqe->length) return nullptr;
  const uint32_t pd = d.pd.load(std::memory_order_relaxed);
  const uint64_t seq = p.key_seq->load(std::memory_order_acquire);
  for (uint32_t i = 0; i < num_sge; ++i) {
    const Sge g = wqe->sge[i];
    core::MrRegion& r = p.cached_local;
    if (!(seq == p.cached_local_seq && g.lkey == r.lkey) && !core::MrTable::find_in(p.key_table, g.lkey, false, &r))
      return nullptr;
    p.cached_local_seq = seq;
    // An on-demand region's pages can be checked only by the target as it places the message, too late
    // for the status the initiator must see: such receives take the packet path, whose responder NAKs.
    if (!(r.access & core::kLocalWrite) || (r.access & core::kOnDemand) || r.pd != pd || g.addr < r.iova ||
        g.addr - r.iova > r.length || g.length > r.length - (g.addr - r.iova))
      return nullptr;
  }
  // The line of the WQE after it, for the next message: by then it is likely posted and still.
  __builtin_prefetch(p.arena + ring + ((v.next_wqe + 1) & (slots - 1)) * sizeof(RecvWqe));
  return in;
}

// Appends the message to the inbox (receive_room said it fits) and publishes it.
void post_to_inbox(DirectInbox& in, const SqEntry& e, uint64_t payload) {
  const SendWqe& w = e.wqe;
  const uint64_t h = in.head;
  DirectInboxEntry& en = in.entries[h % DirectInbox::kEntries];
  auto gather = [&](auto&& put) {
    if (w.flags & kInline)
      put(w.inline_data, payload);
    else
      for_each_sge_piece(w.sge, e.host, w.num_sge, 0, payload, [&](const uint8_t* p, uint64_t n) {
        put(p, n);
        return true;
      });
  };
  if (payload <= DirectInboxEntry::kInlineBytes) {
    uint8_t* dst = en.inline_data;
    gather([&](const uint8_t* src, uint64_t n) {
      std::memcpy(dst, src, n);
      dst += n;
    });
  } else {
    uint64_t dh = in.data_head;
    gather([&](const uint8_t* src, uint64_t n) {
      while (n) {
        const uint64_t at = dh % DirectInbox::kDataBytes;
        const uint64_t k = std::min<uint64_t>(n, DirectInbox::kDataBytes - at);
        std::memcpy(in.data + at, src, k);
        dh += k;
        src += k;
        n -= k;
      }
    });
    in.data_head = dh;
  }
  en.op = w.op == WrOp::Send ? DirectInbox::kSend : w.op == WrOp::SendImm ? DirectInbox::kSendImm
                                                                          : DirectInbox::kWriteImm;
  en.length = static_cast<uint32_t>(w.length);
  en.imm_be = w.imm_be;
  en.solicited = (w.flags & kSolicited) ? 1 : 0;
  en.stamp.store(static_cast<uint32_t>(h + 1), std::memory_order_release);
  in.head = h + 1;
}
// The target places a message when its application polls; one blocked in ibv_get_cq_event has armed
// the CQ first, and then it is woken. Publish, then read the arm state: the target arms, then looks at
// its inboxes (Engine::arm_cq), so one of the two sides sees the other.
// With the channel's wake-up pipe, the initiator takes the arm (kClaimed: the event is its to wake)
// and writes the event's byte there, so the thread waiting on the channel places the message itself:
// one wake-up, not the progress thread's and then the application's. The CQE then raises the event
// without a byte of its own, so each event still has exactly one. Only a message that raises the event
// claims it (a solicited-only arm waits for a solicited one); without a pipe, the doorbell wakes the
// target's engine.
void wake_if_armed(const DirectPeer& p, const DirectQpDesc& d, int wake_fd, bool solicited) {
  const uint64_t arm_off = d.recv_cq_arm_off.load(std::memory_order_relaxed);
  if (!arm_off || arm_off > p.rw_size - sizeof(std::atomic<int>) || arm_off % alignof(std::atomic<int>))
    return;  // no completion channel
  std::atomic_thread_fence(std::memory_order_seq_cst);
  auto* arm = reinterpret_cast<std::atomic<int>*>(p.rw + arm_off);
  int cur = arm->load(std::memory_order_relaxed);
  if (cur == core::CompletionQueue::kUnarmed || cur == core::CompletionQueue::kClaimed) return;
  if (wake_fd >= 0) {
    if (cur == core::CompletionQueue::kArmedSolicited && !solicited) return;  // raises no event
    if (!arm->compare_exchange_strong(cur, core::CompletionQueue::kClaimed)) return;  // raised already
    const char b = 1;
    if (write(wake_fd, &b, 1) == 1) return;
    // A full pipe (64 Ki wake-ups unread): give the arm back and wake the engine instead.
    int claimed = core::CompletionQueue::kClaimed;
    arm->compare_exchange_strong(claimed, cur);
  }
  // The target's server rings its engine (kRing: no reply). Never blocks: a full socket buffer means
  // rings are still unread there.
  const DirectEndpoint::Request ring{kRing, 0, 0};
  [[maybe_unused]] ssize_t n = send(p.sock, &ring, sizeof ring, MSG_DONTWAIT | MSG_NOSIGNAL);
}

// A WRITE or READ of len bytes at the target's address target, by process_vm_writev/readv; false (and
// nothing to undo: the packet path repeats the whole operation) when the kernel refuses or falls short.
bool copy_across(DirectPeer& p, const SendWqe& w, uint8_t* const* host, uint64_t target, uint64_t len) {
  iovec local[core::DeviceLimits::kMaxSge];
  unsigned long n = 0;
  if (w.flags & kInline) {
    local[n++] = {const_cast<uint8_t*>(w.inline_data), len};
  } else {
    for_each_sge_piece(w.sge, host, w.num_sge, 0, len, [&](uint8_t* ptr, uint64_t k) {
      local[n++] = {ptr, k};
      return true;
    });
  }
  iovec remote{reinterpret_cast<void*>(target), len};
  ssize_t got = w.op == WrOp::Read ? process_vm_readv(p.pid, local, n, &remote, 1, 0)
                                   : process_vm_writev(p.pid, local, n, &remote, 1, 0);
  if (got < 0 && (errno == EPERM || errno == ENOSYS)) p.vm_denied = true;
  return got == static_cast<ssize_t>(len);
}
}  // namespace

DirectEndpoint::Result DirectEndpoint::execute(Qp& qp, SqEntry& e, uint64_t now) {
  DirectPeer* peer = qp.direct.peer.get();
  const SendWqe& w = e.wqe;
  const WorkRequest wr = work_request(w.op, qp.cfg.type);
  // SEND, SEND with immediate and WRITE with immediate take a receive WQE through the inbox (a SEND
  // with invalidate is left to the wire); WRITE, READ and ATOMIC touch the target's memory only.
  const bool send = wr.consumes_receive && !wr.remote_access && w.op != WrOp::SendInv;
  const bool two_sided = send || (wr.consumes_receive && wr.remote_access);
  const bool one_sided = !wr.consumes_receive && !wr.local;
  // A zero-length WRITE or READ is left to the wire (no key is checked there).
  const bool remote_mem = one_sided || (two_sided && wr.remote_access && w.length);
  if (!peer && qp.direct.retry_ns) {
    // The peer's QP was not yet in RTR towards ours when we were: ask again, at most once a millisecond
    // (each ask is a round trip to its server thread), for a while.
    if (!now) now = coarse_now_ns();
    if (static_cast<int64_t>(now - qp.direct.retry_ns) < 0) return Result::Fallback;
    const uint32_t retries = qp.direct.retries + 1;
    const int err = connect_peer(qp);
    qp.direct.retries = retries;
    qp.direct.retry_ns = err == EAGAIN && retries < 10000 ? now + 1000000 : 0;
    peer = qp.direct.peer.get();
  }
  if (!peer || peer->dead || (!two_sided && !one_sided) || (!two_sided && w.length == 0))
    return Result::Fallback;
  if (send && w.length > DirectInbox::kMaxMessage) return Result::Fallback;
  // A poster's thread passes no time (now 0): the coarse clock is enough here and much cheaper. Signed,
  // as the coarse clock lags the precise one the progress thread passes by up to a tick.
  if (!now) now = coarse_now_ns();
  if (static_cast<int64_t>(now - peer->checked_ns) > 1000000) {
    // The target process may have died: then its memory is no longer anybody's, and the packet path
    // gives what the wire would (retries, then RETRY_EXC_ERR). Looked at once a millisecond or tick.
    peer->checked_ns = now;
    pollfd pf{peer->sock, POLLIN, 0};
    if (poll(&pf, 1, 0) > 0 && (pf.revents & (POLLHUP | POLLERR | POLLIN))) {
      peer->dead = true;
      return Result::Fallback;
    }
  }
  // ATOMIC WRITE needs the atomicity of an aligned store in a shared mapping, as the ATOMICs do.
  const bool atomic = wr.atomic || wr.atomic_write;
  const uint32_t need = wr.remote_access;
  const bool writable = !wr.read;
  const uint64_t len = atomic ? 8 : w.length;
  if (atomic && w.remote_addr % 8 != 0) return Result::Fallback;
  const DirectShared& sh = *peer->shared;
  DirectPeerSlot& slot = peer->slots[peer->slot];
  const DirectQpDesc& d = sh.qps[qp.direct.peer_desc];
  for (int attempt = 0; attempt < 2; ++attempt) {
    slot.busy.store(1, std::memory_order_seq_cst);
    auto leave = [&] { slot.busy.store(0, std::memory_order_release); };
    uint64_t seq = peer->key_seq->load(std::memory_order_seq_cst);
    auto st = static_cast<QpState>(d.state.load(std::memory_order_acquire));
    bool ok = !(seq & 1) && d.qpn.load(std::memory_order_acquire) == qp.dest_qpn &&
              (st == QpState::Rtr || st == QpState::Rts || st == QpState::Sqd);
    core::MrRegion r{};
    if (ok && remote_mem) {
      // Unchanged table since the last lookup of this rkey: the same region (seq is never odd when cached).
      const bool cached = seq == peer->cached_seq && w.rkey == peer->cached_rkey;
      if (cached) r = peer->cached_region;
      ok = (d.access.load(std::memory_order_relaxed) & need) &&
           (cached || core::MrTable::find_in(peer->key_table, w.rkey, true, &r)) && (r.access & need) == need &&
           r.pd == d.pd.load(std::memory_order_relaxed) && (r.share_id != 0 || !atomic) && w.remote_addr >= r.iova &&
           w.remote_addr - r.iova <= r.length && len <= r.length - (w.remote_addr - r.iova);
    }
    DirectInbox* inbox = nullptr;
    if (ok && two_sided) {
      inbox = receive_room(*peer, d, qp.direct.recv, send ? len : 0);
      ok = inbox != nullptr;
    }
    if (!ok || peer->key_seq->load(std::memory_order_seq_cst) != seq) {
      leave();
      return Result::Fallback;
    }
    if (remote_mem) {
      // Read under an unchanged even seq: a consistent copy, worth keeping.
      peer->cached_seq = seq;
      peer->cached_rkey = w.rkey;
      peer->cached_region = r;
      uint64_t target = r.addr + (w.remote_addr - r.iova);
      if (r.share_id == 0) {
        // Memory the target could not share (stack, private file mapping, hugetlbfs): copied by the
        // kernel between the address spaces, still inside the copy window.
        if (peer->vm_denied || !copy_across(*peer, w, e.host, target, len)) {
          leave();
          return Result::Fallback;
        }
      } else {
        const DirectPeer::Mapping* m = peer->mapped(r.share_id, writable);
        if (!m) {
          // First use of this range: ask the target for it (its server thread answers), outside the copy
          // window, and check everything again.
          leave();
          if (attempt || !peer->mapping(r.share_id, w.rkey, writable)) return Result::Fallback;
          continue;
        }
        if (target < m->base || target - m->base > m->length || len > m->length - (target - m->base)) {
          leave();
          return Result::Fallback;
        }
        copy_one_sided(w, e.host, m->local + (target - m->base), len);
      }
    }
    if (inbox) {
      post_to_inbox(*inbox, e, send ? len : 0);
      ++qp.direct.recv.next_wqe;
    }
    leave();
    if (inbox) wake_if_armed(*peer, d, qp.direct.peer_wake_fd, (w.flags & kSolicited) != 0);
    return Result::Done;
  }
  return Result::Fallback;
}

}  // namespace softrdma::transport
