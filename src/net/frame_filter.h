// Which Ethernet frames a raw packet port delivers: a set of rules, each a conjunction of masked
// compares on the frame's bytes. A frame passes when any rule matches it. The same rules are matched
// in software (authoritative) and compiled to a classic BPF program for the AF_PACKET socket, which
// only has to let through a superset, so that unrelated traffic of the interface (softrdma's own
// RoCE datagrams among it) is never copied to the process.
#pragma once
#include <linux/filter.h>

#include <cstdint>
#include <vector>

namespace softrdma::net {

// One masked compare: (field & mask) == value, the field read big-endian (network order) at offset
// bytes from the start of its layer.
struct FrameTerm {
  enum class Base : uint8_t {
    L2,    // the Ethernet header, as the socket sees it (no 802.1Q tag: that is in vlan_tci)
    L3,    // the IPv4/IPv6 header (right after the 14-byte Ethernet header)
    L4,    // the TCP/UDP header: after the IPv4 header (its IHL) or the fixed IPv6 header
    Vlan,  // the frame's 802.1Q TCI (offset 0, width 2); a frame without a tag has none and fails
  };
  Base base = Base::L2;
  uint16_t offset = 0;
  uint8_t width = 1;  // 1, 2 or 4 bytes
  uint32_t mask = 0;
  uint32_t value = 0;
};

struct FrameRule {
  // The L3 protocol the L4 terms are relative to (an L4 offset depends on it); Any when none are.
  enum class L3 : uint8_t { Any, Ipv4, Ipv6 };
  L3 l3 = L3::Any;
  std::vector<FrameTerm> terms;
};

struct FrameView {
  const uint8_t* data = nullptr;  // from the destination MAC on, without an 802.1Q tag
  uint32_t len = 0;
  bool has_vlan = false;
  uint16_t vlan_tci = 0;
};

bool rule_matches(const FrameRule& rule, const FrameView& frame);
bool any_rule_matches(const std::vector<FrameRule>& rules, const FrameView& frame);

// A classic BPF program accepting at least every frame some rule matches (and nothing when rules is
// empty). VLAN terms are left to the software match.
std::vector<sock_filter> compile_bpf(const std::vector<FrameRule>& rules);

}  // namespace softrdma::net
