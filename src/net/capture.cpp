// Packet capture into pcapng (capture.h). Block layouts: pcapng (IETF draft-ietf-opsawg-pcapng)
// section header, interface description and enhanced packet blocks, in this host's byte order,
// which the section header's magic declares.
#include "net/capture.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/protect.h"

namespace softrdma::net {
namespace {

constexpr uint32_t kSectionHeader = 0x0A0D0D0A, kInterface = 1, kEnhancedPacket = 6;
constexpr uint16_t kLinkEthernet = 1;
constexpr uint16_t kOptEnd = 0, kOptComment = 1, kOptIfName = 2, kOptEpbFlags = 2;

// resize + memcpy rather than insert: GCC 12 at -O3 sees insert() right after open_block's clear()
// as a write into a zero-sized region (-Wstringop-overflow, a false positive that fails -Werror).
void put(std::vector<uint8_t>& b, const void* p, size_t n) {
  if (n == 0) return;
  const size_t at = b.size();
  b.resize(at + n);
  std::memcpy(b.data() + at, p, n);
}
template <class T>
void put(std::vector<uint8_t>& b, T v) {
  put(b, &v, sizeof v);
}
void pad4(std::vector<uint8_t>& b) { b.resize((b.size() + 3) & ~size_t{3}, 0); }
void option(std::vector<uint8_t>& b, uint16_t code, const void* p, uint16_t n) {
  put(b, code);
  put(b, n);
  put(b, p, n);
  pad4(b);
}
void end_options(std::vector<uint8_t>& b) { option(b, kOptEnd, nullptr, 0); }
// Opens a block of `type` in b (its length is patched by close_block).
void open_block(std::vector<uint8_t>& b, uint32_t type) {
  b.clear();
  put(b, type);
  put(b, uint32_t{0});
}
void close_block(std::vector<uint8_t>& b) {
  const auto total = static_cast<uint32_t>(b.size() + 4);
  std::memcpy(b.data() + 4, &total, 4);
  put(b, total);
}

bool write_all(int fd, const std::vector<uint8_t>& b) {
  return write(fd, b.data(), b.size()) == static_cast<ssize_t>(b.size());
}

uint16_t ip_checksum(const uint8_t* h, size_t n) {
  uint32_t sum = 0;
  for (size_t i = 0; i < n; i += 2) sum += static_cast<uint32_t>(h[i] << 8 | h[i + 1]);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

// A locally administered MAC derived from the address's last 4 bytes (the IPv4 address: 02:00:a:b:c:d):
// softrdma's packets have no Ethernet header of their own; the kernel's UDP socket adds the real one.
void mac_of(uint8_t* mac, const wire::IpAddress& ip) {
  mac[0] = 0x02;
  mac[1] = 0x00;
  std::memcpy(mac + 2, ip.bytes.data() + 12, 4);
}

}  // namespace

bool Capture::write_header(int fd) {
  std::vector<uint8_t> b;
  open_block(b, kSectionHeader);
  put(b, uint32_t{0x1A2B3C4D});  // byte-order magic
  put(b, uint16_t{1});           // version 1.0
  put(b, uint16_t{0});
  put(b, int64_t{-1});           // section length: unknown
  end_options(b);
  close_block(b);
  std::vector<uint8_t> i;
  open_block(i, kInterface);
  put(i, kLinkEthernet);
  put(i, uint16_t{0});
  put(i, uint32_t{0});  // snap length: none
  static constexpr char kName[] = "softrdma";
  option(i, kOptIfName, kName, sizeof kName - 1);
  end_options(i);
  close_block(i);
  b.insert(b.end(), i.begin(), i.end());
  return write_all(fd, b);
}

std::shared_ptr<Capture> Capture::open(const std::string& path) {
  if (path.empty()) return nullptr;
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<Capture>> open_files;
  std::lock_guard lock(mu);
  if (auto c = open_files[path].lock()) return c;
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  if (ok) {
    // The first process to open an empty file writes the header; the others wait for it.
    flock(fd, LOCK_EX);
    struct stat st {};
    ok = fstat(fd, &st) == 0 && (st.st_size > 0 || write_header(fd));
    flock(fd, LOCK_UN);
  }
  if (!ok) {
    std::fprintf(stderr, "softrdma: SOFTRDMA_CAPTURE=%s: cannot write: %s\n", path.c_str(), std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return nullptr;
  }
  std::shared_ptr<Capture> c(new Capture(fd));
  open_files[path] = c;
  return c;
}

Capture::~Capture() { ::close(fd_); }

void Capture::packet(const uint8_t* udp_payload, uint32_t len, const Endpoints& ends, Direction dir,
                     const char* comment) {
  // A sealed packet (wire/protect.h) would show as garbage: the transport frames it unsealed.
  if (wire::protected_form(udp_payload, len)) return;
  thread_local std::vector<uint8_t> b;
  const bool v6 = !ends.src_ip.is_v4();
  const uint32_t frame_len = 14 + (v6 ? 40 : 20) + 8 + len;
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  const uint64_t us = static_cast<uint64_t>(ts.tv_sec) * 1000000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
  open_block(b, kEnhancedPacket);
  put(b, uint32_t{0});  // interface 0
  put(b, static_cast<uint32_t>(us >> 32));
  put(b, static_cast<uint32_t>(us));
  put(b, frame_len);
  put(b, frame_len);

  uint8_t eth[14];
  mac_of(eth, ends.dst_ip);
  mac_of(eth + 6, ends.src_ip);
  eth[12] = v6 ? 0x86 : 0x08;
  eth[13] = v6 ? 0xDD : 0x00;
  put(b, eth, sizeof eth);
  if (v6) {
    uint8_t ip[40] = {0x60, 0, 0, 0, static_cast<uint8_t>((8 + len) >> 8), static_cast<uint8_t>(8 + len), 17, 64};
    std::memcpy(ip + 8, ends.src_ip.bytes.data(), 16);
    std::memcpy(ip + 24, ends.dst_ip.bytes.data(), 16);
    put(b, ip, sizeof ip);
  } else {
    uint8_t ip[20] = {0x45, 0, static_cast<uint8_t>((20 + 8 + len) >> 8), static_cast<uint8_t>(20 + 8 + len),
                      static_cast<uint8_t>(ends.ip_id >> 8), static_cast<uint8_t>(ends.ip_id), 0x40, 0, 64, 17};
    std::memcpy(ip + 12, ends.src_ip.bytes.data() + 12, 4);
    std::memcpy(ip + 16, ends.dst_ip.bytes.data() + 12, 4);
    const uint16_t sum = ip_checksum(ip, sizeof ip);
    ip[10] = static_cast<uint8_t>(sum >> 8);
    ip[11] = static_cast<uint8_t>(sum);
    put(b, ip, sizeof ip);
  }
  // UDP checksum 0 (none), as softrdma's own sockets leave it to offload; RoCE relies on the ICRC.
  const uint8_t udp[8] = {static_cast<uint8_t>(ends.src_port >> 8), static_cast<uint8_t>(ends.src_port),
                          static_cast<uint8_t>(ends.dst_port >> 8), static_cast<uint8_t>(ends.dst_port),
                          static_cast<uint8_t>((8 + len) >> 8),      static_cast<uint8_t>(8 + len),
                          0, 0};
  put(b, udp, sizeof udp);
  const size_t at = b.size();
  put(b, udp_payload, len);
  pad4(b);
  // Between two softrdma contexts neither port is 4791, where RoCE dissectors look: the frame shows
  // 4791 as the destination, with the ICRC recomputed for it, and says so.
  std::string note;
  if (ends.dst_port != wire::kRoceUdpPort && ends.src_port != wire::kRoceUdpPort && len >= wire::kBthLen + 4) {
    b[at - 6] = static_cast<uint8_t>(wire::kRoceUdpPort >> 8);
    b[at - 5] = static_cast<uint8_t>(wire::kRoceUdpPort & 0xff);
    wire::append_icrc({ends.src_ip, ends.dst_ip, ends.src_port, wire::kRoceUdpPort, ends.ip_id}, b.data() + at,
                      len - 4);
    note = "softrdma: to UDP port " + std::to_string(ends.dst_port) +
           " (a softrdma context's own), shown as 4791 with the ICRC recomputed for it";
    if (comment) note += "; ";
  }
  if (comment) note += comment;

  const auto flags = static_cast<uint32_t>(dir);
  option(b, kOptEpbFlags, &flags, sizeof flags);
  if (!note.empty()) option(b, kOptComment, note.data(), static_cast<uint16_t>(note.size()));
  end_options(b);
  close_block(b);
  // One write() of the whole block: appends of several threads and processes do not interleave.
  (void)write_all(fd_, b);
}

}  // namespace softrdma::net
