// Watches the network interface under a softrdma device, so the device's port follows its link as a
// RoCE HCA's port follows its netdev: a NETLINK_ROUTE socket subscribed to link and IPv4 address
// notifications, whose fd the engine polls next to its packet sockets.
#pragma once

#include <cstddef>
#include <cstdint>

#include "wire/ip_address.h"

namespace softrdma::net {

struct LinkState {
  bool admin_up = false;     // IFF_UP: the interface is configured up
  bool carrier = false;      // IFF_LOWER_UP: the link beneath it is up (a veth whose peer is up)
  bool has_address = false;  // the device's IPv4 address is still on the interface
  // The port can carry traffic: what IBV_PORT_ACTIVE means for a softrdma device.
  bool active() const { return admin_up && carrier && has_address; }
  bool operator==(const LinkState&) const = default;
};

class LinkMonitor {
 public:
  // Watches interface ifindex and the address ip on it. Throws std::system_error when no
  // netlink socket can be had; the initial state is read after subscribing, so no change is missed.
  LinkMonitor(int ifindex, const wire::IpAddress& ip);
  ~LinkMonitor();
  LinkMonitor(const LinkMonitor&) = delete;
  LinkMonitor& operator=(const LinkMonitor&) = delete;

  // Readable when notifications are pending.
  int fd() const { return fd_; }
  const LinkState& state() const { return state_; }

  // Reads every pending notification without blocking and applies those about the watched
  // interface and address. Returns true when state() changed.
  bool update();

 private:
  // Applies the messages in buf; a reply that ends a resync request clears its bit in *pending.
  void apply(const void* buf, size_t len, unsigned* pending);
  // Re-reads the state from the kernel over the same socket, so it is ordered with the
  // notifications: at start, and when the socket overflowed (ENOBUFS). Waits for the replies.
  void resync();

  int fd_ = -1;
  int ifindex_;
  wire::IpAddress ip_;
  uint32_t seq_ = 0;  // of the last resync's requests (link: seq_, addresses: seq_ + 1)
  LinkState state_;
};

}  // namespace softrdma::net
