#include "wire/ip_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

namespace softrdma::wire {

uint32_t IpAddress::key() const {
  if (is_v4()) return v4_be();
  // FNV-1a over the 16 bytes, folded into 24 bits under a zero top byte (network order: 0.x.y.z).
  uint32_t h = 2166136261u;
  for (uint8_t b : bytes) h = (h ^ b) * 16777619u;
  h = (h ^ (h >> 24)) & 0xFFFFFFu;
  return htonl(h);
}

std::string to_string(const IpAddress& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.is_v4()) {
    in_addr v4{a.v4_be()};
    inet_ntop(AF_INET, &v4, buf, sizeof buf);
  } else {
    inet_ntop(AF_INET6, a.bytes.data(), buf, sizeof buf);
  }
  return buf;
}

bool parse(const char* text, IpAddress* out) {
  in_addr v4{};
  if (inet_pton(AF_INET, text, &v4) == 1) {
    *out = IpAddress::v4(v4.s_addr);
    return true;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, text, &v6) == 1) {
    *out = IpAddress::from_bytes(v6.s6_addr);
    return true;
  }
  return false;
}

socklen_t to_sockaddr(const IpAddress& a, uint16_t port_host, sockaddr_storage* out, uint32_t scope_id) {
  std::memset(out, 0, sizeof *out);
  if (a.is_v4()) {
    auto* sin = reinterpret_cast<sockaddr_in*>(out);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port_host);
    sin->sin_addr.s_addr = a.v4_be();
    return sizeof(sockaddr_in);
  }
  auto* sin6 = reinterpret_cast<sockaddr_in6*>(out);
  sin6->sin6_family = AF_INET6;
  sin6->sin6_port = htons(port_host);
  std::memcpy(sin6->sin6_addr.s6_addr, a.bytes.data(), 16);
  if (a.is_link_local()) sin6->sin6_scope_id = scope_id;
  return sizeof(sockaddr_in6);
}

bool from_sockaddr(const sockaddr* sa, IpAddress* addr, uint16_t* port_host) {
  if (!sa) return false;
  if (sa->sa_family == AF_INET) {
    const auto* sin = reinterpret_cast<const sockaddr_in*>(sa);
    *addr = IpAddress::v4(sin->sin_addr.s_addr);
    if (port_host) *port_host = ntohs(sin->sin_port);
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(sa);
    *addr = IpAddress::from_bytes(sin6->sin6_addr.s6_addr);
    if (port_host) *port_host = ntohs(sin6->sin6_port);
    return true;
  }
  return false;
}

}  // namespace softrdma::wire
