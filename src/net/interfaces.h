// Which softrdma devices exist: one per IPv4 and global IPv6 address of the host's UP interfaces
// (docs/architecture.md, "Devices and addressing").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "wire/ip_address.h"

namespace softrdma::net {

struct Interface {
  std::string ifname;
  wire::IpAddress ip;
  uint32_t netmask_be;  // IPv4: network byte order (0 for IPv6)
  uint8_t prefix_len;   // the address's prefix length, either family
  int ifindex;
  uint32_t mtu;  // link MTU in bytes (IP packet size)
  bool loopback;
  std::array<uint8_t, 6> mac;  // zeros if the link has no Ethernet address
};

// One entry per address of an up interface: IPv4 ones, and IPv6 ones that are neither link-local nor
// loopback. Non-loopback first (sorted by ifindex, then IPv4 before IPv6, then address), loopback
// entries last; the very last entry is always ("lo", 127.0.0.1), synthesised if the namespace lacks it,
// so a device on loopback exists with no configuration at all.
std::vector<Interface> list_interfaces();

// True for any address of this network namespace's interfaces (up or not); 127/8 and ::1 always count.
bool is_local_ip(const wire::IpAddress& ip);
// The interface index that holds an IPv6 address: the scope of the link-local peers a socket bound to
// it reaches (wire::to_sockaddr applies it to link-local destinations only). 0 when none does.
uint32_t scope_of(const wire::IpAddress& ip);

// Inode of /proc/self/ns/net: names this network namespace (0 if it cannot be read).
uint32_t netns_inode();

}  // namespace softrdma::net
