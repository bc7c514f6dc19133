// The target's server thread for the direct path (direct_server.h): the accept and request loop, and
// one handler per request. What a client may have is decided by DirectGate; what it gets is DirectTarget's.
#include "transport/direct_server.h"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "transport/direct_share.h"

namespace softrdma::transport {

DirectServer::DirectServer(DirectGate& gate, DirectTarget& target, const core::MrTable& keys, uint32_t ip_key,
                           uint16_t port, int doorbell_fd)
    : gate_(gate), target_(target), keys_(keys), doorbell_fd_(doorbell_fd) {
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  sockaddr_un sa;
  socklen_t len;
  direct::socket_name(sa, len, ip_key, port);
  if (listen_fd_ < 0 || stop_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
      listen(listen_fd_, 64) != 0) {
    int e = errno;
    if (listen_fd_ >= 0) close(listen_fd_);
    if (stop_fd_ >= 0) close(stop_fd_);
    throw std::system_error(e, std::generic_category(), "direct socket");
  }
  // The server thread takes none of the application's signals (as the progress thread).
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  thread_ = std::thread([this] { serve(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

DirectServer::~DirectServer() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(stop_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  for (Client& c : clients_) close(c.fd);
  close(listen_fd_);
  close(stop_fd_);
}

void DirectServer::serve() {
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
    if (pfds[1].revents & POLLIN) accept_client();
    // (Clients accepted just now come after these.)
    for (size_t i = 2; i < pfds.size(); ++i)
      if (pfds[i].revents) read_client(i - 2);
    for (size_t k = clients_.size(); k-- > 0;)
      if (clients_[k].fd < 0) clients_.erase(clients_.begin() + static_cast<long>(k));
  }
}

void DirectServer::accept_client() {
  int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (c < 0) return;
  int32_t pid = 0;
  timeval tv{1, 0};
  setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  ucred cred{};
  socklen_t cl = sizeof cred;
  getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl);
  if (!gate_.credentials_pass(c, &pid)) {
    // Another user (SOFTRDMA_DIRECT_PEERS): EPERM now, closed now -- it holds nothing of ours. What
    // it sent already is read first (closing with it unread resets the connection: the client
    // would see ECONNRESET once, then our EPERM).
    gate_.refused();
    direct::Request junk;
    while (recv(c, &junk, sizeof junk, MSG_DONTWAIT) > 0) {
    }
    direct::Reply no{};
    no.status = EPERM;
    direct::send_reply(c, no, -1);
    close(c);
    return;
  }
  if (clients_.size() >= kMaxClients) {
    close(c);  // a flood of connections costs us nothing more
    return;
  }
  // Connections of one user that have not been admitted yet are bounded: past kMaxIdlePerUid, its
  // oldest one goes (a real initiator says hello at once).
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

void DirectServer::read_client(size_t k) {
  Client& c = clients_[k];
  if (c.fd < 0) return;  // closed by accept_client (too many idle ones of its user)
  direct::Request req{};
  ssize_t n = recv(c.fd, &req, sizeof req, MSG_DONTWAIT);
  if (n == static_cast<ssize_t>(sizeof req)) {
    handle(c, req);
    return;
  }
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  // Gone: its slot is free again (it held no copy: a process only closes after its last one).
  if (c.slot >= 0) target_.free_slot(c.slot);
  close(c.fd);
  c.fd = -1;
}

void DirectServer::refuse(const Client& c, int err) {
  if (err != EAGAIN) gate_.refused();
  direct::Reply rep{};
  rep.status = err;
  direct::send_reply(c.fd, rep, -1);
}

void DirectServer::handle(Client& c, const direct::Request& req) {
  switch (req.type) {
    case direct::kHello:
      return on_hello(c, req);
    case direct::kQpDesc:
      return on_qp_desc(c, req);
    case direct::kDoorbell:
      // No fd of the engine's (kRing instead).
      if (c.slot < 0 || c.descs.empty()) return refuse(c, EPERM);
      return refuse(c, ENOTSUP);
    case direct::kRing:
      if (c.slot >= 0 && !c.descs.empty()) {
        uint64_t one = 1;
        [[maybe_unused]] ssize_t n = write(doorbell_fd_, &one, sizeof one);
      }
      return;  // no reply
    case direct::kWake:
      return on_wake(c, req);
    case direct::kMap:
      return on_map(c, req);
    default: {
      direct::Reply rep{};
      rep.status = EINVAL;
      direct::send_reply(c.fd, rep, -1);
    }
  }
}

void DirectServer::on_hello(Client& c, const direct::Request& req) {
  uint32_t desc = 0;
  if (c.slot >= 0) return refuse(c, EBUSY);
  if (int err = gate_.admit(c.descs, c.pid, static_cast<uint32_t>(req.arg >> 32), static_cast<uint32_t>(req.arg),
                            &desc))
    return refuse(c, err);
  const int32_t slot = target_.claim_slot(c.pid);
  if (slot < 0) return refuse(c, EBUSY);
  c.slot = slot;
  const DirectTarget::Hello h = target_.hello();
  direct::Reply rep{};
  rep.index = static_cast<uint32_t>(slot);
  rep.a = h.arena_bytes;
  rep.b = h.shared_off;
  rep.c = direct::kLayout;
  rep.d = h.rw_bytes;
  direct::send_reply(c.fd, rep, h.arena_fd, h.rw_fd);
}

void DirectServer::on_qp_desc(Client& c, const direct::Request& req) {
  uint32_t desc = 0;
  if (c.slot < 0) return refuse(c, EPERM);
  if (int err = gate_.admit(c.descs, c.pid, static_cast<uint32_t>(req.arg >> 32), static_cast<uint32_t>(req.arg),
                            &desc))
    return refuse(c, err);
  direct::Reply rep{};
  rep.index = desc;
  direct::send_reply(c.fd, rep, -1);
}

void DirectServer::on_wake(Client& c, const direct::Request& req) {
  // The wake-up pipe of a QP's receive CQ channel, for the initiator connected to it (it can only wake).
  uint32_t desc = 0;
  if (c.slot < 0 || !gate_.connected_desc(c.descs, static_cast<uint32_t>(req.arg), &desc)) return refuse(c, EPERM);
  const int wfd = target_.open_wake_fd(desc);
  direct::Reply rep{};
  rep.status = wfd >= 0 ? 0 : ENOENT;
  direct::send_reply(c.fd, rep, wfd);
  if (wfd >= 0) close(wfd);
}

namespace {
// The region of a live rkey in our key table, read as a peer would (the server thread holds no engine
// lock): under the table's sequence number, retried while it moves.
bool find_rkey(const core::MrTable& keys, uint32_t rkey, core::MrRegion* r) {
  for (int tries = 0; tries < 100; ++tries) {
    const uint64_t seq = keys.seq()->load(std::memory_order_acquire);
    if (seq & 1) {
      sched_yield();
      continue;
    }
    const bool hit = core::MrTable::find_in(keys.slots(), rkey, true, r);
    if (keys.seq()->load(std::memory_order_acquire) != seq) continue;
    return hit;
  }
  return false;
}
}  // namespace

void DirectServer::on_map(Client& c, const direct::Request& req) {
  if (c.slot < 0 || c.descs.empty()) return refuse(c, EPERM);
  // The rkey must be live now and grant what is asked, in the PD of a QP connected to this client
  // whose own access flags allow it (what the responder checks for each request).
  constexpr uint32_t kWriteBits = core::kRemoteWrite | core::kRemoteAtomic;
  const uint32_t need = req.writable ? kWriteBits : core::kRemoteRead;
  core::MrRegion r{};
  DirectGate::MapRights rights;
  if (find_rkey(keys_, static_cast<uint32_t>(req.arg), &r) && (r.access & need) && r.share_id != 0)
    rights = gate_.map_rights(c.descs, r, need);
  if (!rights.allowed) return refuse(c, EACCES);
  ShareInfo info;
  const bool writable = req.writable && (r.access & kWriteBits);
  int sfd = ShareTable::instance().open_fd(r.share_id, writable, rights.may_write, &info);
  direct::Reply rep{};
  if (sfd < 0) {
    rep.status = EACCES;
    direct::send_reply(c.fd, rep, -1);
    return;
  }
  rep.index = static_cast<uint32_t>(r.share_id);
  rep.a = info.base;
  rep.b = info.length;
  rep.c = info.file_off;
  direct::send_reply(c.fd, rep, sfd);
  close(sfd);
}

}  // namespace softrdma::transport
