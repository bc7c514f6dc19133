// The port of a softrdma device follows the network interface beneath it, as a RoCE HCA's port
// follows its netdev: ACTIVE while the interface is up with carrier and still holds the device's
// IPv4 address, DOWN otherwise. Each change is an affiliated-less async event (IBV_EVENT_PORT_ERR,
// IBV_EVENT_PORT_ACTIVE) on every context of the device; the address coming or going changes the
// port's only GID, which is IBV_EVENT_GID_CHANGE. QPs are left alone: their packets fail to leave
// and the usual retries and timeouts take their course, as on hardware.
#include <sys/epoll.h>

#include <system_error>

#include "transport/engine.h"

namespace softrdma::transport {
namespace {

uint32_t pack(const net::LinkState& s) {
  return (s.admin_up ? 1u : 0u) | (s.carrier ? 2u : 0u) | (s.has_address ? 4u : 0u);
}

net::LinkState unpack(uint32_t v) {
  net::LinkState s;
  s.admin_up = (v & 1u) != 0;
  s.carrier = (v & 2u) != 0;
  s.has_address = (v & 4u) != 0;
  return s;
}

// A notification is read as soon as the progress thread sleeps (the fd is in its epoll set); a busy
// thread, which never sleeps, looks this often.
constexpr uint64_t kBusyCheckNs = 10'000'000;

}  // namespace

net::LinkState Engine::port_link() const { return unpack(port_link_.load(std::memory_order_acquire)); }

void Engine::start_link_monitor() {
  try {
    link_ = std::make_unique<net::LinkMonitor>(iface_.ifindex, iface_.ip);
  } catch (const std::system_error&) {
    return;  // no netlink here (a seccomp sandbox): the port stays ACTIVE, as before
  }
  port_link_.store(pack(link_->state()), std::memory_order_release);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = link_->fd();
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, link_->fd(), &ev);
}

void Engine::check_link(uint64_t now, bool readable) {
  if (!link_) return;
  if (!readable && now - link_checked_ns_ < kBusyCheckNs) return;
  link_checked_ns_ = now;
  if (!link_->update()) return;
  const net::LinkState before = port_link();
  const net::LinkState after = link_->state();
  port_link_.store(pack(after), std::memory_order_release);
  if (after.has_address && !before.has_address) async_events_.push(AsyncEvent{AsyncEventType::GidChange});
  if (before.active() != after.active())
    async_events_.push(AsyncEvent{after.active() ? AsyncEventType::PortActive : AsyncEventType::PortErr});
  if (before.has_address && !after.has_address) async_events_.push(AsyncEvent{AsyncEventType::GidChange});
}

}  // namespace softrdma::transport
