#include "transport/icrc_gate.h"

#include "net/gso.h"
#include "wire/headers.h"

namespace softrdma::transport {

IcrcGate::Verdict IcrcGate::check(const wire::UdpAddr& addr, const uint8_t* pkt, uint32_t len, uint64_t now,
                                  wire::IpIdent* ident) {
  *ident = {addr.ip_id, addr.ip_flags};
  if (wire::check_icrc(addr, pkt, len)) return Verdict::Exact;
  if (addr.src_port < kForeignPortFloor) {
    // A softrdma context: a segment of a segmented send that arrived alone, or in another place of a
    // buffer than it left in (reordered, or regrouped by GRO), carries an identification below 64.
    auto solved = wire::solve_ip_ident(addr, pkt, len);
    if (!solved || solved->ip_flags != 0x40 || solved->ip_id >= net::kGsoMaxSegments) return Verdict::Bad;
    *ident = *solved;
    return Verdict::Segment;
  }
  if (addr.dst_port != wire::kRoceUdpPort) return Verdict::Bad;
  auto solved = wire::solve_ip_ident(addr, pkt, len);
  if (!solved) return Verdict::Bad;
  auto [it, first_contact] = senders_.try_emplace(addr.src_ip, Sender{solved->ip_id, solved->ip_flags, false, 0, 0, now});
  Sender& s = it->second;
  if (first_contact) {
    // Nothing to compare with yet: the one packet that opens a sender's history has only the solution.
    if (senders_.size() > kMaxSenders) {
      senders_.clear();
      senders_.emplace(addr.src_ip, Sender{solved->ip_id, solved->ip_flags, false, 0, 0, now});
    }
    *ident = *solved;
    return Verdict::Solved;
  }
  const auto step = static_cast<uint16_t>(solved->ip_id - s.last_id);
  const uint64_t idle_ms = (now - s.last_ns) / 1000000;
  const uint64_t ahead = kAhead + idle_ms;
  const bool forward = step >= 1 && step <= ahead;
  const bool near = forward || step == 0 || step >= 0x10000 - kBehind;
  if (solved->ip_flags == s.flags && near) {
    if (forward) {
      s.last_id = solved->ip_id;
      s.last_ns = now;
    }
    s.resync_pending = false;
    *ident = *solved;
    return Verdict::Solved;
  }
  // The sender's counter jumped (other traffic of that host, a long pause) or this is a corruption. Two
  // packets in a row whose identifications agree are the sender; corruptions do not agree.
  if (s.resync_pending && solved->ip_flags == s.resync_flags) {
    const auto from_pending = static_cast<uint16_t>(solved->ip_id - s.resync_id);
    if (from_pending >= 1 && from_pending <= kBehind) {
      s = Sender{solved->ip_id, solved->ip_flags, false, 0, 0, now};
      *ident = *solved;
      return Verdict::Solved;
    }
  }
  s.resync_pending = true;
  s.resync_id = solved->ip_id;
  s.resync_flags = solved->ip_flags;
  return Verdict::OutOfWindow;
}

}  // namespace softrdma::transport
