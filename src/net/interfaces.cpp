#include "net/interfaces.h"
#include "net/os_socket.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace softrdma::net {
namespace {

uint32_t loopback_ip_be() { return htonl(INADDR_LOOPBACK); }

uint8_t prefix_of(const sockaddr* mask) {
  if (!mask) return 0;
  const uint8_t* b = nullptr;
  size_t n = 0;
  if (mask->sa_family == AF_INET) {
    b = reinterpret_cast<const uint8_t*>(&reinterpret_cast<const sockaddr_in*>(mask)->sin_addr);
    n = 4;
  } else if (mask->sa_family == AF_INET6) {
    b = reinterpret_cast<const sockaddr_in6*>(mask)->sin6_addr.s6_addr;
    n = 16;
  }
  uint8_t bits = 0;
  for (size_t i = 0; i < n; ++i) bits = static_cast<uint8_t>(bits + __builtin_popcount(b[i]));
  return bits;
}

// Owns the getifaddrs list so every exit path frees it.
struct IfAddrs {
  ifaddrs* head = nullptr;
  IfAddrs() {
    if (getifaddrs(&head) != 0) head = nullptr;
  }
  ~IfAddrs() {
    if (head) freeifaddrs(head);
  }
  IfAddrs(const IfAddrs&) = delete;
  IfAddrs& operator=(const IfAddrs&) = delete;
};

// MTU and hardware address come from ioctls on any socket; a failure leaves defaults, because a missing
// detail must not hide a usable interface.
void fill_link_details(int sock, Interface& itf) {
  if (sock < 0) return;
  ifreq req{};
  std::strncpy(req.ifr_name, itf.ifname.c_str(), IFNAMSIZ - 1);
  if (ioctl(sock, SIOCGIFMTU, &req) == 0 && req.ifr_mtu > 0) itf.mtu = static_cast<uint32_t>(req.ifr_mtu);
  std::memset(&req.ifr_ifru, 0, sizeof(req.ifr_ifru));
  if (ioctl(sock, SIOCGIFHWADDR, &req) == 0 && req.ifr_hwaddr.sa_family == ARPHRD_ETHER) {
    std::memcpy(itf.mac.data(), req.ifr_hwaddr.sa_data, itf.mac.size());
  }
}

}  // namespace

std::vector<Interface> list_interfaces() {
  std::vector<Interface> out;
  IfAddrs addrs;
  int sock = os_socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  for (ifaddrs* ifa = addrs.head; ifa; ifa = ifa->ifa_next) {
    if (!ifa->ifa_addr || (ifa->ifa_addr->sa_family != AF_INET && ifa->ifa_addr->sa_family != AF_INET6)) continue;
    if (!(ifa->ifa_flags & IFF_UP)) continue;
    Interface itf{};
    itf.ifname = ifa->ifa_name;
    (void)wire::from_sockaddr(ifa->ifa_addr, &itf.ip);
    // Link-local IPv6 addresses need a scope everywhere they are used, and ::1 is softrdma_lo's.
    if (!itf.ip.is_v4() && (itf.ip.is_link_local() || itf.ip.is_loopback())) continue;
    if (itf.ip.is_v4())
      itf.netmask_be = ifa->ifa_netmask && ifa->ifa_netmask->sa_family == AF_INET
                           ? reinterpret_cast<const sockaddr_in*>(ifa->ifa_netmask)->sin_addr.s_addr
                           : 0xffffffffu;
    itf.prefix_len = ifa->ifa_netmask ? prefix_of(ifa->ifa_netmask) : (itf.ip.is_v4() ? 32 : 128);
    itf.ifindex = static_cast<int>(if_nametoindex(ifa->ifa_name));
    itf.mtu = 1500;
    itf.loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
    itf.mac = {};
    fill_link_details(sock, itf);
    out.push_back(std::move(itf));
  }
  if (sock >= 0) close(sock);

  // Order: non-loopback by (ifindex, address), then loopback, with 127.0.0.1 the very last.
  const uint32_t lo_ip = loopback_ip_be();
  const wire::IpAddress lo_addr = wire::IpAddress::v4(lo_ip);
  auto rank = [lo_addr](const Interface& i) { return !i.loopback ? 0 : (i.ip != lo_addr ? 1 : 2); };
  std::stable_sort(out.begin(), out.end(), [&](const Interface& a, const Interface& b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    if (a.ifindex != b.ifindex) return a.ifindex < b.ifindex;
    if (a.ip.is_v4() != b.ip.is_v4()) return a.ip.is_v4();
    return a.ip < b.ip;  // byte order: numeric for both families
  });
  // Only one 127.0.0.1 device, even if several loopback links carry that address.
  auto first_lo = std::find_if(out.begin(), out.end(), [&](const Interface& i) { return rank(i) == 2; });
  if (first_lo != out.end()) {
    auto keep = std::find_if(first_lo, out.end(), [](const Interface& i) { return i.ifname == "lo"; });
    Interface chosen = keep != out.end() ? *keep : *first_lo;
    out.erase(first_lo, out.end());
    out.push_back(std::move(chosen));
  } else {
    Interface lo{};
    lo.ifname = "lo";
    lo.ip = lo_addr;
    lo.netmask_be = htonl(0xff000000u);
    lo.prefix_len = 8;
    unsigned idx = if_nametoindex("lo");
    lo.ifindex = idx ? static_cast<int>(idx) : 1;
    lo.mtu = 65536;
    lo.loopback = true;
    lo.mac = {};
    out.push_back(std::move(lo));
  }
  return out;
}

bool is_local_ip(const wire::IpAddress& ip) {
  if (ip.is_loopback()) return true;
  IfAddrs addrs;
  for (ifaddrs* ifa = addrs.head; ifa; ifa = ifa->ifa_next) {
    wire::IpAddress a;
    if (wire::from_sockaddr(ifa->ifa_addr, &a) && a == ip) return true;
  }
  return false;
}

uint32_t scope_of(const wire::IpAddress& ip) {
  if (ip.is_v4()) return 0;
  IfAddrs addrs;
  for (ifaddrs* ifa = addrs.head; ifa; ifa = ifa->ifa_next) {
    wire::IpAddress a;
    if (wire::from_sockaddr(ifa->ifa_addr, &a) && a == ip)
      return reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr)->sin6_scope_id;
  }
  return 0;
}

uint32_t netns_inode() {
  struct stat st{};
  if (stat("/proc/self/ns/net", &st) != 0) return 0;
  return static_cast<uint32_t>(st.st_ino);
}

}  // namespace softrdma::net
