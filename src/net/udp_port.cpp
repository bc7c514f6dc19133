#include "net/udp_port.h"

#include "net/capture.h"
#include "net/impairment.h"
#include "net/interfaces.h"
#include "net/os_socket.h"
#include "net/gso.h"
#include "net/liveness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>

#include "config/config.h"
#include "wire/headers.h"

namespace softrdma::net {
namespace {

constexpr int kSocketBuffer = 8 << 20;
// How long flush() keeps waiting for socket space before it counts the rest as errors: long enough to
// ride out a full send buffer, short enough that a wedged socket cannot hang the progress engine.
constexpr auto kSendPatience = std::chrono::seconds(1);

// Ports created so far in this process: the impairment PRNG of a port is seeded with its index, not its
// (ephemeral, run-dependent) port number, so that a seed replays the same faults.
std::atomic<uint64_t> g_ports_created{0};

[[noreturn]] void throw_port_errno(int err, const std::string& what) {
  throw std::system_error(err, std::generic_category(), "softrdma UdpPort: " + what);
}

// The *BUFFORCE variants pass the rmem_max/wmem_max caps but need CAP_NET_ADMIN; without it, the plain
// option gives as much as the sysctl allows.
void set_buffer(int fd, int force_opt, int opt) {
  int size = kSocketBuffer;
  if (setsockopt(fd, SOL_SOCKET, force_opt, &size, sizeof(size)) == 0) return;
  (void)setsockopt(fd, SOL_SOCKET, opt, &size, sizeof(size));
}

}  // namespace

struct UdpPort::Buffers {
  std::unique_ptr<uint8_t[]> rx_data{new uint8_t[kBatch * kMaxDatagram]};
  std::unique_ptr<uint8_t[]> tx_data{new uint8_t[kBatch * kMaxDatagram]};
  mmsghdr rx_msgs[kBatch];
  iovec rx_iov[kBatch];
  sockaddr_storage rx_addr[kBatch];
  union Control {
    cmsghdr align;
    char bytes[CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(int))];
  } rx_ctrl[kBatch];
  SegmentCursor rx_cursor;  // the slot rx_next_ being split into its segments
  wire::IpAddress rx_peer_ip[kBatch], rx_local_ip[kBatch];
  uint32_t rx_seg[kBatch];
  uint16_t rx_peer_port[kBatch];
  mmsghdr tx_msgs[kBatch];
  iovec tx_iov[kBatch];
  sockaddr_storage tx_addr[kBatch];
  GsoRun tx_run[kBatch];
  union TxControl {
    cmsghdr align;
    char bytes[CMSG_SPACE(sizeof(uint16_t))];
  } tx_ctrl[kBatch];
};


UdpPort::UdpPort(const wire::IpAddress& ip, uint16_t port, const config::Settings& settings)
    : ip_(ip), buf_(std::make_unique<Buffers>()) {
  open_hooks(settings);
  const bool v6 = !ip.is_v4();
  if (v6) scope_id_ = scope_of(ip);  // the link of link-local peers (rxe's default GID)
  fd_ = os_socket(ip.family(), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw_port_errno(errno, "socket");
  auto fail = [this](const char* what) {
    int err = errno;
    close(fd_);
    fd_ = -1;
    throw_port_errno(err, what);
  };
  int on = 1;
  if (v6) {
    int pmtu = IPV6_PMTUDISC_DO;
    if (setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on)) != 0) fail("IPV6_V6ONLY");
    if (setsockopt(fd_, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof(pmtu)) != 0) fail("IPV6_MTU_DISCOVER");
    if (setsockopt(fd_, IPPROTO_IPV6, IPV6_RECVPKTINFO, &on, sizeof(on)) != 0) fail("IPV6_RECVPKTINFO");
    // Kernel rxe sends RoCEv2 over IPv6 with UDP checksum 0, as RFC 6935 lets a tunnel do (the ICRC
    // covers the packet); a UDPv6 socket drops such datagrams unless told otherwise.
    (void)setsockopt(fd_, SOL_UDP, UDP_NO_CHECK6_RX, &on, sizeof(on));
  } else {
    int pmtu = IP_PMTUDISC_DO;
    if (setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu)) != 0) fail("IP_MTU_DISCOVER");
    if (setsockopt(fd_, IPPROTO_IP, IP_PKTINFO, &on, sizeof(on)) != 0) fail("IP_PKTINFO");
  }
  // SOFTRDMA_GSO=0 turns segmentation offload off (to measure what it brings, or on a kernel without it).
  if (settings.gso) {
    // Segmented sends need UDP_SEGMENT (4.18) and segmented receives UDP_GRO (5.0); both or neither.
    int zero = 0;
    gso_ = setsockopt(fd_, SOL_UDP, UDP_SEGMENT, &zero, sizeof(zero)) == 0 &&
           setsockopt(fd_, SOL_UDP, UDP_GRO, &on, sizeof(on)) == 0;
  }
  set_buffer(fd_, SO_SNDBUFFORCE, SO_SNDBUF);
  set_buffer(fd_, SO_RCVBUFFORCE, SO_RCVBUF);

  sockaddr_storage addr{};
  const socklen_t addr_len = wire::to_sockaddr(ip, port, &addr, scope_id_);
  auto set_port = [&addr](uint16_t number) {
    if (addr.ss_family == AF_INET6)
      reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(number);
    else
      reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(number);
  };
  bool bound = false;
  if (port == 0) {
    // Random tries, then the kernel's choice (a receiver then only checks us less strictly than it could).
    static std::atomic<uint64_t> draw{static_cast<uint64_t>(getpid()) * 0x9E3779B97F4A7C15ull};
    // The TCP number too, for the liveness listener (liveness.h); the last tries take a UDP port alone.
    int listener = -1;
    for (int attempt = 0; attempt < 64 && !bound; ++attempt) {
      uint64_t r = draw.fetch_add(0x9E3779B97F4A7C15ull, std::memory_order_relaxed);
      r ^= r >> 29;
      const uint16_t number = static_cast<uint16_t>(kContextPortBegin + r % (kContextPortEnd - kContextPortBegin));
      set_port(number);
      listener = Liveness::listen_on(ip, number, scope_id_);
      if (listener < 0 && attempt < 48) continue;
      bound = bind(fd_, reinterpret_cast<const sockaddr*>(&addr), addr_len) == 0;
      if (!bound) {
        const int err = errno;
        if (listener >= 0) close(listener);
        listener = -1;
        errno = err;
        if (err != EADDRINUSE) fail("bind");
      }
    }
    if (bound) liveness_ = std::make_unique<Liveness>(listener, ip, scope_id_);
    set_port(0);
  }
  if (!bound && bind(fd_, reinterpret_cast<const sockaddr*>(&addr), addr_len) != 0) fail("bind");
  socklen_t alen = sizeof(addr);
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) fail("getsockname");
  wire::IpAddress bound_ip;
  (void)wire::from_sockaddr(reinterpret_cast<const sockaddr*>(&addr), &bound_ip, &port_);
  init_buffers();
}

UdpPort::UdpPort(Adopt, int fd, const config::Settings& settings)
    : fd_(fd), buf_(std::make_unique<Buffers>()) {
  open_hooks(settings);
  auto fail = [this](int err, const char* what) {
    close(fd_);
    fd_ = -1;
    throw_port_errno(err, what);
  };
  sockaddr_storage addr{};
  socklen_t alen = sizeof(addr);
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) fail(errno, "getsockname");
  if (!wire::from_sockaddr(reinterpret_cast<const sockaddr*>(&addr), &ip_, &port_)) fail(EAFNOSUPPORT, "family");
  if (!ip_.is_v4()) scope_id_ = scope_of(ip_);
  // Receiving must split what the socket's owner asked to get segmented: a port whose own settings
  // differ (SOFTRDMA_GSO=0 against a segmenting socket, or a kernel that cannot say) does not adopt it.
  int gro = 0;
  socklen_t glen = sizeof(gro);
  if (getsockopt(fd_, SOL_UDP, UDP_GRO, &gro, &glen) != 0) fail(errno, "UDP_GRO");
  if ((gro != 0) != settings.gso) fail(EPROTONOSUPPORT, "segmentation differs from the socket's owner");
  gso_ = gro != 0;
  int nonblocking = fcntl(fd_, F_GETFL);
  if (nonblocking < 0 || !(nonblocking & O_NONBLOCK)) fail(EINVAL, "a blocking socket");
  init_buffers();
}

void UdpPort::open_hooks(const config::Settings& settings) {
  const uint64_t index = g_ports_created.fetch_add(1, std::memory_order_relaxed);
  if (auto cfg = impairment_from(settings.impair)) impair_ = std::make_unique<PortImpairment>(*cfg, index);
  capture_ = Capture::open(settings.capture);
}

void UdpPort::init_buffers() {
  // Message headers point at fixed storage once; receive()/send() only refresh lengths.
  Buffers& b = *buf_;
  for (size_t i = 0; i < kBatch; ++i) {
    b.rx_iov[i] = {b.rx_data.get() + i * kMaxDatagram, kMaxDatagram};
    b.rx_msgs[i] = {};
    b.rx_msgs[i].msg_hdr.msg_name = &b.rx_addr[i];
    b.rx_msgs[i].msg_hdr.msg_iov = &b.rx_iov[i];
    b.rx_msgs[i].msg_hdr.msg_iovlen = 1;
    b.rx_msgs[i].msg_hdr.msg_control = b.rx_ctrl[i].bytes;

    b.tx_iov[i] = {b.tx_data.get() + i * kMaxDatagram, 0};
    b.tx_msgs[i] = {};
    b.tx_msgs[i].msg_hdr.msg_name = &b.tx_addr[i];
    b.tx_msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
    b.tx_msgs[i].msg_hdr.msg_iov = &b.tx_iov[i];
    b.tx_msgs[i].msg_hdr.msg_iovlen = 1;
  }
}

UdpPort::~UdpPort() {
  if (fd_ < 0) return;
  // Best effort: queued datagrams are part of what the caller already posted.
  if (impair_) {
    impair_->tx.release_all([this](const uint8_t* d, uint32_t n, const DirectionImpairment::Meta& m) {
      enqueue(d, n, m.ip, m.port, m.coalesce);
    });
    // One line per impaired port: what a fault test's log needs to show the faults happened.
    for (const auto* st : {&impair_->tx_stats, &impair_->rx_stats}) {
      if (st->seen == 0) continue;
      std::fprintf(stderr,
                   "softrdma impair port %u %s: seen %llu dropped %llu (burst %llu in %llu) duplicated %llu "
                   "reordered %llu held %llu corrupted %llu\n",
                   port_, st == &impair_->tx_stats ? "tx" : "rx", static_cast<unsigned long long>(st->seen),
                   static_cast<unsigned long long>(st->dropped), static_cast<unsigned long long>(st->burst_dropped),
                   static_cast<unsigned long long>(st->bursts), static_cast<unsigned long long>(st->duplicated),
                   static_cast<unsigned long long>(st->reordered), static_cast<unsigned long long>(st->held),
                   static_cast<unsigned long long>(st->corrupted));
    }
  }
  send_batch();
  close(fd_);
}

size_t UdpPort::receive(Datagram* out, size_t max) {
  if (impair_) [[unlikely]]
    return receive_impaired(out, max);
  return receive_raw(out, max);
}

size_t UdpPort::receive_impaired(Datagram* out, size_t max) {
  PortImpairment& im = *impair_;
  const size_t n = std::min(max, kBatch);
  if (n == 0) return 0;
  for (auto& r : im.rx_delivered) im.spare.push_back(std::move(r));
  im.rx_delivered.clear();
  auto emit = [&im](const uint8_t* d, uint32_t len, const DirectionImpairment::Meta& m) {
    PortImpairment::Ready r;
    if (!im.spare.empty()) {
      r = std::move(im.spare.back());
      im.spare.pop_back();
    }
    r.bytes.assign(d, d + len);
    r.meta = m;
    im.rx_ready.push_back(std::move(r));
  };
  // Drain the socket until a batch is ready. Held datagrams are let go as soon as the socket is empty, so
  // this returns 0 only when nothing is held: the engine never sleeps on a datagram the impairment holds.
  Datagram raw[kBatch];
  while (im.rx_ready.size() < n) {
    const size_t got = receive_raw(raw, n - im.rx_ready.size());
    if (got == 0) {
      im.rx.release_all(emit);
      break;
    }
    for (size_t i = 0; i < got; ++i)
      im.rx.offer(raw[i].data, raw[i].len,
                  {raw[i].peer_ip, raw[i].peer_port, raw[i].local_ip, false, raw[i].segment}, emit);
  }
  const size_t k = std::min(n, im.rx_ready.size());
  for (size_t i = 0; i < k; ++i) {
    im.rx_delivered.push_back(std::move(im.rx_ready.front()));
    im.rx_ready.pop_front();
  }
  for (size_t i = 0; i < k; ++i) {
    PortImpairment::Ready& r = im.rx_delivered[i];
    out[i] = {r.bytes.data(), static_cast<uint32_t>(r.bytes.size()), r.meta.ip, r.meta.port, r.meta.local_ip,
              r.meta.segment};
  }
  return k;
}

size_t UdpPort::receive_raw(Datagram* out, size_t max) {
  Buffers& b = *buf_;
  const size_t n = std::min(max, kBatch);
  if (n == 0) return 0;
  if (rx_next_ == rx_got_) {
    for (size_t i = 0; i < n; ++i) {
      b.rx_msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
      b.rx_msgs[i].msg_hdr.msg_controllen = sizeof(b.rx_ctrl[i].bytes);
      b.rx_msgs[i].msg_hdr.msg_flags = 0;
    }
    int got;
    do {
      got = recvmmsg(fd_, b.rx_msgs, static_cast<unsigned>(n), MSG_DONTWAIT, nullptr);
    } while (got < 0 && errno == EINTR);
    if (got <= 0) return 0;
    rx_got_ = static_cast<size_t>(got);
    rx_next_ = 0;
    for (size_t i = 0; i < rx_got_; ++i) {
      msghdr& h = b.rx_msgs[i].msg_hdr;
      wire::from_sockaddr(reinterpret_cast<const sockaddr*>(&b.rx_addr[i]), &b.rx_peer_ip[i], &b.rx_peer_port[i]);
      b.rx_local_ip[i] = ip_;
      b.rx_seg[i] = 0;
      for (cmsghdr* c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c)) {
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
          in_pktinfo info;
          std::memcpy(&info, CMSG_DATA(c), sizeof(info));
          b.rx_local_ip[i] = wire::IpAddress::v4(info.ipi_addr.s_addr);
        } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
          in6_pktinfo info;
          std::memcpy(&info, CMSG_DATA(c), sizeof(info));
          b.rx_local_ip[i] = wire::IpAddress::from_bytes(info.ipi6_addr.s6_addr);
        } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
          int seg = 0;
          std::memcpy(&seg, CMSG_DATA(c), sizeof(seg));
          b.rx_seg[i] = seg > 0 ? static_cast<uint32_t>(seg) : 0;
        }
      }
    }
    b.rx_cursor = {static_cast<uint8_t*>(b.rx_iov[0].iov_base), b.rx_msgs[0].msg_len, b.rx_seg[0]};
  }
  size_t k = 0;
  while (k < n && rx_next_ < rx_got_) {
    const size_t i = rx_next_;
    Datagram& d = out[k++];
    d.len = b.rx_cursor.next(&d.data, &d.segment);
    d.peer_ip = b.rx_peer_ip[i];
    d.peer_port = b.rx_peer_port[i];
    d.local_ip = b.rx_local_ip[i];
    // From this host, the sender's port captured it (when it is captured too): one frame per packet.
    if (capture_ && d.peer_ip != d.local_ip) [[unlikely]]
      capture_->packet(d.data, d.len, {d.peer_ip, d.local_ip, d.peer_port, port_, static_cast<uint16_t>(d.segment)},
                       Capture::Direction::Inbound);
    ++stats_.rx_packets;
    stats_.rx_bytes += d.len;
    if (b.rx_cursor.done() && ++rx_next_ < rx_got_)
      b.rx_cursor = {static_cast<uint8_t*>(b.rx_iov[rx_next_].iov_base), b.rx_msgs[rx_next_].msg_len,
                     b.rx_seg[rx_next_]};
  }
  return k;
}

uint8_t* UdpPort::reserve(uint32_t len, const wire::IpAddress& dst_ip, uint16_t dst_port, bool coalesce,
                          uint16_t* ip_id) {
  if (len > kMaxDatagram) {
    ++stats_.tx_errors;
    return nullptr;
  }
  if (impair_) [[unlikely]] {
    // Impair a copy, on commit(): corruption must not touch what the caller wrote.
    impair_->tx_scratch.resize(len);
    placing_len_ = len;
    placing_ip_ = dst_ip;
    placing_port_ = dst_port;
    placing_coalesce_ = coalesce;
    *ip_id = 0;  // the impairment may move it; receivers check segments of contexts leniently (icrc_gate.h)
    return impair_->tx_scratch.data();
  }
  return place(len, dst_ip, dst_port, coalesce, ip_id);
}

void UdpPort::commit() {
  if (impair_) [[unlikely]] {
    PortImpairment& im = *impair_;
    im.tx.offer(im.tx_scratch.data(), placing_len_, {placing_ip_, placing_port_, ip_, placing_coalesce_},
                [this](const uint8_t* d, uint32_t n, const DirectionImpairment::Meta& m) {
                  enqueue(d, n, m.ip, m.port, m.coalesce);
                });
    return;
  }
  place_commit();
}

uint8_t* UdpPort::place(uint32_t len, const wire::IpAddress& dst_ip, uint16_t dst_port, bool coalesce, uint16_t* ip_id) {
  Buffers& b = *buf_;
  placing_len_ = len;
  if (gso_ && coalesce && tx_count_ && b.tx_run[tx_count_ - 1].accepts(dst_ip, dst_port, len)) {
    placing_slot_ = tx_count_ - 1;
    placing_new_ = false;
    GsoRun& r = b.tx_run[placing_slot_];
    *ip_id = static_cast<uint16_t>(r.segments);
    placing_id_ = *ip_id;
    placing_at_ = static_cast<uint8_t*>(b.tx_iov[placing_slot_].iov_base) + r.bytes;
    placing_ip_ = dst_ip;
    placing_port_ = dst_port;
    return placing_at_;
  }
  if (tx_count_ == kBatch) send_batch();
  placing_slot_ = tx_count_;
  placing_new_ = true;
  placing_ip_ = dst_ip;
  placing_port_ = dst_port;
  placing_coalesce_ = coalesce;
  *ip_id = 0;
  placing_id_ = 0;
  placing_at_ = static_cast<uint8_t*>(b.tx_iov[placing_slot_].iov_base);
  return placing_at_;
}

void UdpPort::place_commit() {
  Buffers& b = *buf_;
  // From 4791 to this host's own address is the 4791 holder handing a packet from another host to its
  // owner (transport/roce_ports.cpp), already framed as it arrived.
  if (capture_ && !(port_ == wire::kRoceUdpPort && placing_ip_ == ip_)) [[unlikely]]
    capture_->packet(placing_at_, placing_len_, {ip_, placing_ip_, port_, placing_port_, placing_id_},
                     Capture::Direction::Outbound);
  GsoRun& r = b.tx_run[placing_slot_];
  if (!placing_new_) {
    r.add(placing_len_);
    return;
  }
  r.open(placing_ip_, placing_port_, placing_len_);
  if (!placing_coalesce_) r.closed = true;
  b.tx_msgs[placing_slot_].msg_hdr.msg_namelen = wire::to_sockaddr(placing_ip_, placing_port_, &b.tx_addr[placing_slot_], scope_id_);
  ++tx_count_;
}

void UdpPort::enqueue(const uint8_t* data, uint32_t len, const wire::IpAddress& dst_ip, uint16_t dst_port, bool coalesce) {
  uint16_t ip_id;
  std::memcpy(place(len, dst_ip, dst_port, coalesce, &ip_id), data, len);
  place_commit();
}

void UdpPort::flush() {
  if (impair_) [[unlikely]] {
    // A flush is a batch boundary: reordered datagrams age, and go out after a bounded number of flushes
    // (a tx_hold datagram waits for the next send instead).
    impair_->tx.tick([this](const uint8_t* d, uint32_t n, const DirectionImpairment::Meta& m) {
      enqueue(d, n, m.ip, m.port, m.coalesce);
    });
  }
  send_batch();
}

void UdpPort::send_batch() {
  Buffers& b = *buf_;
  for (size_t i = 0; i < tx_count_; ++i) {
    const GsoRun& r = b.tx_run[i];
    msghdr& h = b.tx_msgs[i].msg_hdr;
    b.tx_iov[i].iov_len = r.bytes;
    if (r.segments > 1) {
      h.msg_control = b.tx_ctrl[i].bytes;
      h.msg_controllen = sizeof(b.tx_ctrl[i].bytes);
      cmsghdr* c = CMSG_FIRSTHDR(&h);
      c->cmsg_level = SOL_UDP;
      c->cmsg_type = UDP_SEGMENT;
      c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      const auto seg = static_cast<uint16_t>(r.seg_size);
      std::memcpy(CMSG_DATA(c), &seg, sizeof(seg));
    } else {
      h.msg_control = nullptr;
      h.msg_controllen = 0;
    }
  }
  // Each message header points at its own slot's iovec and control: moving headers and runs together
  // changes only the order they leave in (and back after, for the slots' next use).
  const size_t count = tx_count_, older = deferred_ < count ? deferred_ : 0;
  deferred_ = 0;
  if (older) {
    std::rotate(b.tx_msgs, b.tx_msgs + older, b.tx_msgs + count);
    std::rotate(b.tx_run, b.tx_run + older, b.tx_run + count);
  }
  size_t done = 0;
  std::chrono::steady_clock::time_point deadline{};
  bool waiting = false;
  auto lost = [&](size_t from, size_t to) {
    for (size_t i = from; i < to; ++i) stats_.tx_errors += b.tx_run[i].segments;
  };
  while (done < tx_count_) {
    int r = sendmmsg(fd_, b.tx_msgs + done, static_cast<unsigned>(tx_count_ - done), 0);
    if (r > 0) {
      for (int k = 0; k < r; ++k) {
        stats_.tx_packets += b.tx_run[done + k].segments;
        stats_.tx_bytes += b.tx_msgs[done + k].msg_len;
      }
      done += static_cast<size_t>(r);
      waiting = false;
      continue;
    }
    const int err = errno;
    if (r < 0 && err == EINTR) continue;
    if (r < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS)) {
      auto now = std::chrono::steady_clock::now();
      if (!waiting) {
        waiting = true;
        deadline = now + kSendPatience;
      }
      if (now < deadline) {
        // ENOBUFS can persist while POLLOUT is already set (a full device queue), so poll with a timeout
        // and never spin on it.
        pollfd p{fd_, POLLOUT, 0};
        (void)poll(&p, 1, 1);
        continue;
      }
      // Out of patience: give up on what is left, but count it.
      lost(done, tx_count_);
      break;
    }
    // The kernel refused the first message of the rest (EMSGSIZE, ENETUNREACH, EPERM...): skip it. A
    // device that cannot take segmented sends (EIO: no checksum offload) gets single datagrams from now on.
    if (b.tx_run[done].segments > 1 && (err == EIO || err == EINVAL)) gso_ = false;
    lost(done, done + 1);
    ++done;
  }
  if (older) {
    std::rotate(b.tx_msgs, b.tx_msgs + (count - older), b.tx_msgs + count);
    std::rotate(b.tx_run, b.tx_run + (count - older), b.tx_run + count);
  }
  tx_count_ = 0;
}

bool udp_port_bound(uint16_t port) {
  // /proc/thread-self: /proc/net follows the thread-group leader, whose network namespace is gone once
  // it has exited (a process whose main thread ended, or that is dying) while this thread runs.
  bool bound = false;
  for (const char* table : {"udp", "udp6"}) {
    FILE* f = fopen(("/proc/thread-self/net/" + std::string(table)).c_str(), "re");
    if (!f) f = fopen(("/proc/net/" + std::string(table)).c_str(), "re");
    if (!f) return true;
    char line[512];
    unsigned local_port;
    while (!bound && fgets(line, sizeof line, f))
      if (sscanf(line, " %*d: %*x:%x", &local_port) == 1 && local_port == port) bound = true;
    fclose(f);
  }
  return bound;
}

}  // namespace softrdma::net
