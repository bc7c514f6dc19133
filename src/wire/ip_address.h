// An IP address of either family, as RoCEv2 names it: the 16 bytes of a GID (IBTA Annex A17.4.5.1),
// with an IPv4 address as its IPv4-mapped IPv6 form ::ffff:a.b.c.d (RFC 4291 2.5.5.2).
#pragma once

#include <sys/socket.h>

#include <array>
#include <compare>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

namespace softrdma::wire {

struct IpAddress {
  std::array<uint8_t, 16> bytes{};  // network order

  // Not an aggregate: a brace list of integers must not fill the bytes by elision.
  constexpr IpAddress() = default;

  static constexpr IpAddress v4(uint32_t ip_be) {
    IpAddress a;
    a.bytes[10] = a.bytes[11] = 0xFF;
    a.bytes[12] = static_cast<uint8_t>(ip_be);
    a.bytes[13] = static_cast<uint8_t>(ip_be >> 8);
    a.bytes[14] = static_cast<uint8_t>(ip_be >> 16);
    a.bytes[15] = static_cast<uint8_t>(ip_be >> 24);
    return a;
  }
  static IpAddress from_bytes(const uint8_t* p) {
    IpAddress a;
    std::memcpy(a.bytes.data(), p, 16);
    return a;
  }
  constexpr bool is_v4() const {
    for (int i = 0; i < 10; ++i)
      if (bytes[i]) return false;
    return bytes[10] == 0xFF && bytes[11] == 0xFF;
  }
  // The IPv4 address of a mapped one (network order); 0 for an IPv6 address.
  constexpr uint32_t v4_be() const {
    if (!is_v4()) return 0;
    return uint32_t{bytes[12]} | uint32_t{bytes[13]} << 8 | uint32_t{bytes[14]} << 16 | uint32_t{bytes[15]} << 24;
  }
  // Neither family's unspecified address (0.0.0.0 mapped, or ::).
  constexpr bool is_set() const { return is_v4() ? v4_be() != 0 : *this != IpAddress{}; }
  constexpr bool is_multicast() const { return is_v4() ? (bytes[12] & 0xF0) == 0xE0 : bytes[0] == 0xFF; }
  constexpr bool is_loopback() const {
    if (is_v4()) return bytes[12] == 127;
    IpAddress one;
    one.bytes[15] = 1;
    return *this == one;
  }
  constexpr bool is_link_local() const { return !is_v4() && bytes[0] == 0xFE && (bytes[1] & 0xC0) == 0x80; }
  int family() const { return is_v4() ? AF_INET : AF_INET6; }

  // A 32-bit name of the address where a slot has no room for 16 bytes (the host registry): the IPv4
  // address itself, or a hash of an IPv6 address with the top bits 0x00 (0.0.0.0/8 is no unicast IPv4
  // address). Equal addresses have equal keys; only equality of keys means anything.
  uint32_t key() const;

  constexpr auto operator<=>(const IpAddress&) const = default;
};

// Text as inet_ntop writes it: dotted IPv4 for a mapped address, else IPv6.
std::string to_string(const IpAddress& a);
// Parses either family's text (an IPv4 one becomes mapped); false when it is neither.
bool parse(const char* text, IpAddress* out);

// A socket address of the address's own family (sockaddr_in for a mapped one). Returns its length.
// scope_id: the interface a link-local IPv6 address is on (ignored for any other address).
socklen_t to_sockaddr(const IpAddress& a, uint16_t port_host, sockaddr_storage* out, uint32_t scope_id = 0);
// The address and port of an AF_INET or AF_INET6 socket address (an IPv4-mapped AF_INET6 one comes out
// as the IPv4 address it maps, as it is the same). False for any other family.
bool from_sockaddr(const sockaddr* sa, IpAddress* addr, uint16_t* port_host = nullptr);

}  // namespace softrdma::wire

template <>
struct std::hash<softrdma::wire::IpAddress> {
  size_t operator()(const softrdma::wire::IpAddress& a) const noexcept {
    uint64_t lo, hi;
    std::memcpy(&lo, a.bytes.data(), 8);
    std::memcpy(&hi, a.bytes.data() + 8, 8);
    return std::hash<uint64_t>{}(lo * 0x9E3779B97F4A7C15ull ^ hi);
  }
};
