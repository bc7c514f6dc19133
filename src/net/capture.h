// Packet capture (SOFTRDMA_CAPTURE, `softrdma capture`): RoCE packets written to a pcapng file as
// Ethernet/IPv4/UDP frames, the way Wireshark and tshark decode RoCEv2. The packet ports tap what
// they send and what they receive from other hosts (a packet from this host was framed by its
// sender's port); the transport adds synthetic frames for what has no plain packet of its own
// (direct-path operations, protected packets before sealing and after opening), each with a comment
// saying so. Frames between two contexts of this host show UDP destination port 4791, where
// dissectors look, with the ICRC recomputed for it and a comment naming the real port. Several processes may append to one file: each frame is one write() of a
// whole block to a file opened O_APPEND. Off, a port pays one test of a null pointer per packet.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "wire/ip_address.h"

namespace softrdma::net {

class Capture {
 public:
  enum class Direction : uint8_t { Inbound = 1, Outbound = 2 };  // pcapng epb_flags bits 0-1

  // The capture writing to path, shared by every port and engine of this process that names it
  // (opened, and given its pcapng header if empty, on first use); nullptr when path is empty or the
  // file cannot be opened (reported once on stderr).
  static std::shared_ptr<Capture> open(const std::string& path);
  // Writes the pcapng section header and the one interface (Ethernet) every frame refers to.
  static bool write_header(int fd);

  // One RoCE packet, the UDP payload (BTH .. ICRC) as sent or received, framed with the addresses,
  // ports and IPv4 identification it had on the wire (the ICRC covers them). comment: a pcapng
  // comment on the frame, or nullptr.
  struct Endpoints {
    wire::IpAddress src_ip, dst_ip;
    uint16_t src_port, dst_port;  // host order
    uint16_t ip_id = 0;
  };
  void packet(const uint8_t* udp_payload, uint32_t len, const Endpoints& ends, Direction dir,
              const char* comment = nullptr);

  ~Capture();
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

 private:
  explicit Capture(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace softrdma::net
