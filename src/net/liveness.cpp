// Liveness evidence through the peer host's kernel (liveness.h).
#include "net/liveness.h"
#include "net/interfaces.h"
#include "net/os_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace softrdma::net {

namespace {
// Connections a context keeps accepted at once (one per peer context that asked); more are closed at
// once, so that nobody can take a context's descriptors.
constexpr size_t kMaxAccepted = 256;
// A connection not answered for this long is given up and started again.
constexpr uint64_t kConnectGiveUpNs = 10'000'000'000ull;
// Queries per QP at most every 10 ms, and only while the previous one is acknowledged: a paused peer's
// receive buffer takes 60 s of them (24 KB) without closing its window.
constexpr uint64_t kMinProbeGapNs = 10'000'000;

// The link-local scope comes from the interface holding our own address: both ends share its link.
struct Address {
  sockaddr_storage sa;
  socklen_t len;
  Address(const wire::IpAddress& ip, uint16_t port, uint32_t scope = 0) { len = wire::to_sockaddr(ip, port, &sa, scope); }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&sa); }
};
}  // namespace

int Liveness::listen_on(const wire::IpAddress& ip, uint16_t port, uint32_t scope_id) {
  int fd = os_socket(ip.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const Address a(ip, port, scope_id);
  if (bind(fd, a.get(), a.len) != 0 || listen(fd, 128) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

Liveness::Liveness(int listen_fd, const wire::IpAddress& local_ip, uint32_t scope_id)
    : listen_fd_(listen_fd), local_ip_(local_ip), scope_id_(scope_id), epoll_fd_(epoll_create1(EPOLL_CLOEXEC)) {
  if (epoll_fd_ >= 0 && listen_fd_ >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  }
}

Liveness::~Liveness() {
  for (const Probe& p : probes_) close(p.fd);
  for (const Asker& a : askers_) close(a.fd);
  if (listen_fd_ >= 0) close(listen_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void Liveness::drop_asker(size_t i) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, askers_[i].fd, nullptr);
  close(askers_[i].fd);
  askers_[i] = askers_.back();
  askers_.pop_back();
}

void Liveness::serve(const std::function<bool(uint32_t qpn, const wire::IpAddress& asker_ip)>& receives) {
  if (epoll_fd_ < 0) return;
  epoll_event evs[16];
  const int n = epoll_wait(epoll_fd_, evs, 16, 0);
  for (int e = 0; e < n; ++e) {
    const int fd = evs[e].data.fd;
    if (fd == listen_fd_) {
      sockaddr_storage from{};
      socklen_t len = sizeof from;
      for (int c; (c = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &len, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;
           len = sizeof from) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = c;
        if (askers_.size() >= kMaxAccepted || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c, &ev) != 0) {
          close(c);
          continue;
        }
        wire::IpAddress asker;
        (void)wire::from_sockaddr(reinterpret_cast<const sockaddr*>(&from), &asker);
        askers_.push_back(Asker{c, asker, {}, 0});
      }
      continue;
    }
    size_t i = 0;
    while (i < askers_.size() && askers_[i].fd != fd) ++i;
    if (i == askers_.size()) continue;
    Asker& a = askers_[i];
    // Queries of 4 bytes (the QPN), each answered with 4 (QPN << 8 | receives); an asker that sends
    // more than it reads back is the one whose answers stop (MSG_DONTWAIT: never blocks the engine).
    uint8_t buf[256];
    ssize_t r;
    bool ended = false;
    while ((r = recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
      uint8_t out[sizeof buf + 4];
      size_t out_len = 0;
      for (ssize_t k = 0; k < r; ++k) {
        a.rx[a.rx_len++] = buf[k];
        if (a.rx_len < 4) continue;
        a.rx_len = 0;
        const uint32_t qpn = (uint32_t{a.rx[1]} << 16) | (uint32_t{a.rx[2]} << 8) | a.rx[3];
        const uint32_t v = (qpn << 8) | (receives(qpn, a.ip) ? 1u : 0u);
        for (int b = 3; b >= 0; --b) out[out_len++] = static_cast<uint8_t>(v >> (8 * b));
      }
      if (out_len && send(fd, out, out_len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN) ended = true;
    }
    if (ended || r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) drop_asker(i);
  }
}

void Liveness::forget(size_t i) {
  close(probes_[i].fd);
  probes_[i] = std::move(probes_.back());
  probes_.pop_back();
}

Liveness::Verdict Liveness::check(const wire::IpAddress& ip, uint16_t port, uint32_t qpn, uint64_t now_ns, uint64_t max_age_ns,
                                  uint64_t asked_from_ns, uint64_t asked_until_ns) {
  size_t i = 0;
  while (i < probes_.size() && !(probes_[i].ip == ip && probes_[i].port == port)) ++i;
  if (i == probes_.size()) {
    const int fd = os_socket(local_ip_.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return Verdict::Unknown;
    const Address local(local_ip_, 0, scope_id_);
    const Address a(ip, port, scope_id_);
    if (bind(fd, local.get(), local.len) != 0) {
      close(fd);
      return Verdict::Unknown;
    }
    if (connect(fd, a.get(), a.len) != 0 && errno != EINPROGRESS) {
      const int err = errno;
      close(fd);
      return err == ECONNREFUSED ? Verdict::Dead : Verdict::Unknown;
    }
    probes_.push_back(Probe{ip, port, fd, false, is_local_ip(ip), now_ns, 0, {}, 0, {}});
    return Verdict::Unknown;
  }
  Probe& p = probes_[i];
  if (!p.connected) {
    pollfd pf{p.fd, POLLOUT, 0};
    if (poll(&pf, 1, 0) <= 0) {
      if (now_ns - p.started_ns > kConnectGiveUpNs) forget(i);
      return Verdict::Unknown;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      forget(i);
      // The host answered for a port nobody listens on: the context's process is gone.
      return err == ECONNREFUSED ? Verdict::Dead : Verdict::Unknown;
    }
    p.connected = true;
  }
  // The answers to earlier queries; an end of stream or a reset is the peer's kernel closing its
  // sockets (the process died or closed the context).
  uint8_t buf[256];
  ssize_t r;
  while ((r = recv(p.fd, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
    for (ssize_t k = 0; k < r; ++k) {
      p.rx[p.rx_len++] = buf[k];
      if (p.rx_len < 4) continue;
      p.rx_len = 0;
      const uint32_t v = (uint32_t{p.rx[0]} << 24) | (uint32_t{p.rx[1]} << 16) | (uint32_t{p.rx[2]} << 8) | p.rx[3];
      for (Answer& ans : p.answers) {
        if (ans.qpn != v >> 8 || ans.pending == 0) continue;
        ans.denied = (v & 1) == 0;
        if (--ans.pending == 0) ans.answered_through = ans.asked_ns;
      }
    }
  }
  if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
    forget(i);
    return Verdict::Dead;
  }
  int unacked = 0;
  if (ioctl(p.fd, SIOCOUTQ, &unacked) != 0) unacked = 1;
  // Queries go one at a time: the one in flight was sent at sent_ns. A host that keeps it unacknowledged
  // past max_age_ns has stopped answering (a stopped process's kernel delays its ACKs, never that long).
  const bool host_silent = unacked != 0 && now_ns - p.sent_ns > max_age_ns;
  Answer* ans = nullptr;
  for (Answer& x : p.answers)
    if (x.qpn == qpn) ans = &x;
  if (!ans) {
    p.answers.push_back(Answer{qpn, false, 0, 0, 0});
    ans = &p.answers.back();
  }
  const Answer seen = *ans;
  if (unacked == 0 && now_ns - ans->asked_ns >= kMinProbeGapNs) {
    const uint8_t q[4] = {0, static_cast<uint8_t>(qpn >> 16), static_cast<uint8_t>(qpn >> 8), static_cast<uint8_t>(qpn)};
    if (send(p.fd, q, sizeof q, MSG_DONTWAIT | MSG_NOSIGNAL) == sizeof q) {
      ++ans->pending;
      ans->asked_ns = now_ns;
      p.sent_ns = now_ns;
    }
  }
  if (seen.denied) return Verdict::NoQp;
  // A host that went away answers nothing, but this host has not gone away: for a peer on it, the
  // connection itself is the evidence (its ACKs may wait for a softirq thread the load starves).
  if (!p.local && host_silent) return Verdict::Unknown;
  // Every query answered, the last one asked in the window: the engine runs. Otherwise it was not
  // asked in it (it is now), or has not answered: the process exists and does not run.
  if (seen.pending == 0 && seen.asked_ns && seen.answered_through >= asked_from_ns &&
      seen.answered_through <= asked_until_ns)
    return Verdict::Running;
  return Verdict::Paused;
}

}  // namespace softrdma::net
