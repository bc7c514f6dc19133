// Which softrdma devices exist: one per IPv4 address of the host's UP interfaces (docs/architecture.md, "Devices and addressing").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace softrdma::net {

struct Interface {
  std::string ifname;
  uint32_t ip_be;       // IPv4 address, network byte order
  uint32_t netmask_be;  // network byte order
  int ifindex;
  uint32_t mtu;  // link MTU in bytes (IP packet size)
  bool loopback;
  std::array<uint8_t, 6> mac;  // zeros if the link has no Ethernet address
};

// Up interfaces with an IPv4 address, non-loopback first (sorted by ifindex, then address), loopback
// entries last; the very last entry is always ("lo", 127.0.0.1), synthesised if the namespace lacks it,
// so a device on loopback exists with no configuration at all.
std::vector<Interface> list_interfaces();

// True for any IPv4 address of this network namespace's interfaces (up or not); 127/8 always counts.
bool is_local_ip(uint32_t ip_be);

// Inode of /proc/self/ns/net: names this network namespace (0 if it cannot be read).
uint32_t netns_inode();

}  // namespace softrdma::net
