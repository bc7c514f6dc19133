// Sharing one bound UDP socket among a user's processes (port_share.h): offers on abstract unix
// sockets, descriptors passed with SCM_RIGHTS, and the reader lock.
#include "net/port_share.h"

#include "net/os_socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

namespace softrdma::net {
namespace {

constexpr size_t kMaxOffersTried = 8;  // a taker needs one answer; more only cost connections

// One byte with room for one descriptor (SCM_RIGHTS): what an offer sends and a taker receives.
struct FdMessage {
  char byte = 'S';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  FdMessage() {
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctrl;
    m.msg_controllen = sizeof ctrl;
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

socklen_t abstract_addr(const std::string& name, sockaddr_un& a) {
  a = {};
  a.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(a.sun_path) - 1);
  std::memcpy(a.sun_path + 1, name.data(), n);  // sun_path[0] = 0: the abstract namespace
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

bool peer_is_this_user(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == geteuid();
}

// Whether fd is a UDP socket bound to ip:port: what a taker accepts from an offer.
bool bound_udp(int fd, const wire::IpAddress& ip, uint16_t port) {
  int type = 0;
  socklen_t tlen = sizeof type;
  sockaddr_storage a{};
  socklen_t alen = sizeof a;
  wire::IpAddress bound;
  uint16_t bound_port = 0;
  return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) == 0 && type == SOCK_DGRAM &&
         getsockname(fd, reinterpret_cast<sockaddr*>(&a), &alen) == 0 && a.ss_family == ip.family() &&
         wire::from_sockaddr(reinterpret_cast<const sockaddr*>(&a), &bound, &bound_port) && bound == ip &&
         bound_port == port;
}

// The listening offers for a prefix, as /proc/net/unix names them ("@" for the abstract namespace's NUL).
std::vector<std::string> offers(const std::string& prefix) {
  std::vector<std::string> names;
  std::ifstream in("/proc/net/unix");
  std::string line;
  const std::string want = "@" + prefix;
  while (std::getline(in, line) && names.size() < kMaxOffersTried) {
    const size_t at = line.find(want);
    if (at == std::string::npos) continue;
    // Fields: Num RefCount Protocol Flags Type St Inode Path; Flags 00010000 is a listening socket.
    char flags[16] = {};
    if (std::sscanf(line.c_str(), "%*s %*s %*s %15s", flags) != 1 || std::strcmp(flags, "00010000") != 0) continue;
    names.push_back(line.substr(at + 1));  // the reader lock never listens: not listed
  }
  return names;
}

// Every PortShare of this process. A forked child lets go of their reader locks and offers: it runs
// no engine (threads do not survive fork), so it would hold the lock, and keep an offer listening,
// without ever reading the socket or answering, long after its parent is gone.
// Never destroyed: a context that a thread or a later static destructor closes during exit still
// finds it (a static vector, destroyed first, was read after its free under ASan).
struct Live {
  std::mutex mu;
  std::vector<PortShare*> shares;
};
Live& live() {
  static Live* l = new Live;
  return *l;
}
void fork_prepare() { live().mu.lock(); }
void fork_parent() { live().mu.unlock(); }
void fork_child() {
  for (PortShare* p : live().shares) p->let_go_in_child();
  live().mu.unlock();
}

}  // namespace

void PortShare::let_go_in_child() {
  if (listener_ >= 0) close(listener_);
  listener_ = -1;
  release_reader();
}

std::string PortShare::prefix(const wire::IpAddress& ip, uint16_t port, uid_t uid) {
  char b[120];
  if (ip.is_v4()) {
    std::snprintf(b, sizeof b, "softrdma-share/u%u/%08x/%u/", static_cast<unsigned>(uid), ntohl(ip.v4_be()),
                  static_cast<unsigned>(port));
  } else {
    char hex[33];
    for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", ip.bytes[static_cast<size_t>(i)]);
    std::snprintf(b, sizeof b, "softrdma-share/u%u/%s/%u/", static_cast<unsigned>(uid), hex,
                  static_cast<unsigned>(port));
  }
  return b;
}

PortShare::PortShare(int fd, const wire::IpAddress& ip, uint16_t port) : fd_(fd), ip_(ip), port_(port) {
  static std::atomic<unsigned> offers_made{0};
  static std::once_flag at_fork;
  std::call_once(at_fork, [] { pthread_atfork(fork_prepare, fork_parent, fork_child); });
  {
    std::lock_guard lock(live().mu);
    live().shares.push_back(this);
  }
  listener_ = os_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listener_ < 0) return;
  sockaddr_un a;
  const std::string name = prefix(ip, port) + std::to_string(getpid()) + "." + std::to_string(offers_made++);
  const socklen_t len = abstract_addr(name, a);
  if (bind(listener_, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(listener_, 16) != 0) {
    close(listener_);
    listener_ = -1;
  }
}

PortShare::~PortShare() {
  {
    std::lock_guard lock(live().mu);
    std::erase(live().shares, this);
  }
  if (listener_ >= 0) close(listener_);
  release_reader();
}

void PortShare::serve() {
  if (listener_ < 0) return;
  for (;;) {
    const int c = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) return;
    // Only this user's processes: the socket carries every RoCE packet of the address.
    if (peer_is_this_user(c)) {
      FdMessage msg;
      cmsghdr* cm = CMSG_FIRSTHDR(&msg.m);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cm), &fd_, sizeof(int));
      (void)sendmsg(c, &msg.m, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    close(c);
  }
}

bool PortShare::lock_reader() {
  if (reader_lock_ >= 0) return true;
  const int s = os_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) return false;
  sockaddr_un a;
  const socklen_t len = abstract_addr(prefix(ip_, port_) + "reader", a);
  if (bind(s, reinterpret_cast<sockaddr*>(&a), len) != 0) {
    close(s);
    return false;
  }
  reader_lock_ = s;
  return true;
}

void PortShare::release_reader() {
  if (reader_lock_ >= 0) close(reader_lock_);
  reader_lock_ = -1;
}

PortShare::Taker::~Taker() {
  for (int c : pending_) close(c);
}

int PortShare::Taker::step() {
  ++steps_;
  if (pending_.empty()) {
    const std::string p = PortShare::prefix(ip_, port_, owner_);
    for (const std::string& name : offers(p)) {
      const int c = os_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (c < 0) break;
      sockaddr_un a;
      const socklen_t len = abstract_addr(name, a);
      // A listener's kernel completes the connection at once; the answer needs its process to run.
      if (connect(c, reinterpret_cast<sockaddr*>(&a), len) == 0 && peer_is_this_user(c))
        pending_.push_back(c);
      else
        close(c);
    }
  }
  for (size_t i = 0; i < pending_.size(); ++i) {
    FdMessage msg;
    const ssize_t n = recvmsg(pending_[i], &msg.m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EAGAIN) continue;
    int got = -1;
    cmsghdr* cm = n == 1 ? CMSG_FIRSTHDR(&msg.m) : nullptr;
    if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS && cm->cmsg_len == CMSG_LEN(sizeof(int)))
      std::memcpy(&got, CMSG_DATA(cm), sizeof(int));
    close(pending_[i]);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i--));
    if (got < 0) continue;
    if (bound_udp(got, ip_, port_)) {
      for (int c : pending_) close(c);
      pending_.clear();
      return got;
    }
    close(got);
  }
  return -1;
}

}  // namespace softrdma::net
