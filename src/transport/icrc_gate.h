// The receive side's ICRC check (IBTA A17.3.3) when the IPv4 identification is unseen: a UDP socket
// does not report it, and the ICRC covers it. softrdma contexts send identification 0 (DF set), or k
// for segment k of a segmented send (net/gso.h), and are checked with the one the segment's place in
// its received buffer implies; failing that, with any identification below 64 (26 bits of strength). RoCE stacks (Linux rxe, NICs) send changing identifications; for them the
// identification is solved from the ICRC and accepted only near the one that sender used last, since a
// solution alone would pass about 1 in 2^15 corrupted packets (docs/reliability.md).
#pragma once

#include <cstdint>
#include <unordered_map>

#include "net/udp_port.h"
#include "wire/icrc.h"

namespace softrdma::transport {

class IcrcGate {
 public:
  // softrdma contexts send from UDP ports below this one (net::UdpPort picks its ephemeral port there);
  // RoCE stacks send from 0xC000 up (rxe and mlx5: 0xC000 | a flow hash). Only the latter, and only
  // towards UDP 4791 (where foreign stacks send), may have their identification solved.
  static constexpr uint16_t kForeignPortFloor = net::UdpPort::kContextPortEnd;
  // Identifications a foreign sender may step back (reordering) or repeat (duplication).
  static constexpr uint16_t kBehind = 64;
  // How far it may step forward: this many, plus one per millisecond since its last accepted packet
  // (Linux adds a random step below the jiffies elapsed to an idle identification counter).
  static constexpr uint32_t kAhead = 256;
  static constexpr size_t kMaxSenders = 4096;  // forged source addresses cannot grow the table further

  enum class Verdict : uint8_t {
    Exact,        // the ICRC matches with the identification given (0, or the segment index) and DF: accepted
    Segment,      // a softrdma context's segment with another identification below 64: accepted
    Solved,       // a foreign sender's packet, with an identification it plausibly sent: accepted
    Bad,          // no identification the sender may use explains the ICRC: dropped
    OutOfWindow,  // some identification explains it, but not one this sender could have sent now
  };
  static bool accepted(Verdict v) { return v == Verdict::Exact || v == Verdict::Solved || v == Verdict::Segment; }

  // addr: the datagram's addresses as the socket saw them, ip_id its segment index (0 when alone). *ident gets the identification and flags
  // the packet checked out with (for a hop that forwards it on, which re-checks at full strength).
  Verdict check(const wire::UdpAddr& addr, const uint8_t* pkt, uint32_t len, uint64_t now_ns,
                wire::IpIdent* ident);

 private:
  struct Sender {
    uint16_t last_id;
    uint8_t flags;
    bool resync_pending = false;  // an out-of-window identification was seen: a second just after it resyncs
    uint16_t resync_id = 0;
    uint8_t resync_flags = 0;
    uint64_t last_ns;
  };
  std::unordered_map<wire::IpAddress, Sender> senders_;  // by source address (Linux: one IPv4 counter per pair)
};

}  // namespace softrdma::transport
