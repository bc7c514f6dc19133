#include "net/frame_filter.h"

#include <algorithm>

namespace softrdma::net {
namespace {

constexpr uint32_t kEthHeader = 14;
constexpr uint32_t kIpv6Header = 40;
constexpr uint32_t kAccept = 0x40000;  // snap length: the whole frame

uint32_t read_be(const uint8_t* p, uint8_t width) {
  uint32_t v = 0;
  for (uint8_t i = 0; i < width; ++i) v = v << 8 | p[i];
  return v;
}

uint32_t full_mask(uint8_t width) { return width >= 4 ? ~0u : (1u << (8 * width)) - 1; }

// Where a layer starts in this frame; false when the frame is too short to have it.
bool layer_start(const FrameRule& rule, FrameTerm::Base base, const FrameView& f, uint32_t* start) {
  switch (base) {
    case FrameTerm::Base::L2: *start = 0; return true;
    case FrameTerm::Base::L3: *start = kEthHeader; return true;
    case FrameTerm::Base::L4:
      if (rule.l3 == FrameRule::L3::Ipv6) {
        *start = kEthHeader + kIpv6Header;
        return true;
      }
      if (rule.l3 != FrameRule::L3::Ipv4 || f.len <= kEthHeader) return false;
      *start = kEthHeader + 4u * (f.data[kEthHeader] & 0x0F);
      return true;
    case FrameTerm::Base::Vlan: return false;
  }
  return false;
}

}  // namespace

bool rule_matches(const FrameRule& rule, const FrameView& f) {
  for (const FrameTerm& t : rule.terms) {
    uint32_t field;
    if (t.base == FrameTerm::Base::Vlan) {
      if (!f.has_vlan) return false;
      field = f.vlan_tci;
    } else {
      uint32_t start = 0;
      if (!layer_start(rule, t.base, f, &start)) return false;
      const uint64_t end = uint64_t{start} + t.offset + t.width;
      if (end > f.len) return false;
      field = read_be(f.data + start + t.offset, t.width);
    }
    if ((field & t.mask) != (t.value & t.mask)) return false;
  }
  return true;
}

bool any_rule_matches(const std::vector<FrameRule>& rules, const FrameView& f) {
  return std::any_of(rules.begin(), rules.end(), [&](const FrameRule& r) { return rule_matches(r, f); });
}

std::vector<sock_filter> compile_bpf(const std::vector<FrameRule>& rules) {
  auto stmt = [](uint16_t code, uint32_t k) { return sock_filter{code, 0, 0, k}; };
  auto load_code = [](uint8_t width, uint16_t mode) {
    const uint16_t size = width == 1 ? BPF_B : width == 2 ? BPF_H : BPF_W;
    return static_cast<uint16_t>(BPF_LD | size | mode);
  };
  std::vector<sock_filter> prog;
  for (const FrameRule& rule : rules) {
    // One block per rule: every failed compare jumps past the block's accept, to the next rule.
    // "fail" jumps are recorded and patched once the block's length is known.
    std::vector<sock_filter> block;
    std::vector<size_t> fails;
    auto fail_jump = [&](uint16_t code, uint32_t k) {
      fails.push_back(block.size());
      block.push_back(sock_filter{code, 0, 0, k});
    };
    // A load beyond the frame ends a classic BPF program with "drop", whatever later rules say, so the
    // length is checked first: the fixed part, then the L4 part behind a variable IPv4 header.
    uint32_t fixed_need = 0, l4_need = 0;
    bool has_l4 = false;
    for (const FrameTerm& t : rule.terms) {
      const uint32_t end = t.offset + t.width;
      if (t.base == FrameTerm::Base::L2) fixed_need = std::max(fixed_need, end);
      if (t.base == FrameTerm::Base::L3) fixed_need = std::max(fixed_need, kEthHeader + end);
      if (t.base == FrameTerm::Base::L4) {
        has_l4 = true;
        l4_need = std::max(l4_need, end);
      }
    }
    const bool l4_ipv4 = has_l4 && rule.l3 == FrameRule::L3::Ipv4;
    if (has_l4 && rule.l3 == FrameRule::L3::Ipv6) fixed_need = std::max(fixed_need, kEthHeader + kIpv6Header + l4_need);
    if (l4_ipv4) fixed_need = std::max(fixed_need, kEthHeader + 1);
    if (has_l4 && rule.l3 == FrameRule::L3::Any) continue;  // cannot match (rule_matches agrees)
    block.push_back(stmt(BPF_LD | BPF_W | BPF_LEN, 0));
    fail_jump(BPF_JMP | BPF_JGE | BPF_K, fixed_need);
    if (l4_ipv4) {
      block.push_back(stmt(BPF_LDX | BPF_B | BPF_MSH, kEthHeader));  // X = IHL * 4
      block.push_back(stmt(BPF_MISC | BPF_TXA, 0));
      block.push_back(stmt(BPF_ALU | BPF_ADD | BPF_K, kEthHeader + l4_need));
      block.push_back(stmt(BPF_MISC | BPF_TAX, 0));
      block.push_back(stmt(BPF_LD | BPF_W | BPF_LEN, 0));
      fail_jump(BPF_JMP | BPF_JGE | BPF_X, 0);
      block.push_back(stmt(BPF_LDX | BPF_B | BPF_MSH, kEthHeader));
    }
    for (const FrameTerm& t : rule.terms) {
      switch (t.base) {
        case FrameTerm::Base::Vlan: continue;  // the socket's frame has no tag: matched in software
        case FrameTerm::Base::L2: block.push_back(stmt(load_code(t.width, BPF_ABS), t.offset)); break;
        case FrameTerm::Base::L3: block.push_back(stmt(load_code(t.width, BPF_ABS), kEthHeader + t.offset)); break;
        case FrameTerm::Base::L4:
          if (l4_ipv4)
            block.push_back(stmt(load_code(t.width, BPF_IND), kEthHeader + t.offset));
          else
            block.push_back(stmt(load_code(t.width, BPF_ABS), kEthHeader + kIpv6Header + t.offset));
          break;
      }
      if ((t.mask & full_mask(t.width)) != full_mask(t.width)) block.push_back(stmt(BPF_ALU | BPF_AND | BPF_K, t.mask));
      fail_jump(BPF_JMP | BPF_JEQ | BPF_K, t.value & t.mask);
    }
    block.push_back(stmt(BPF_RET | BPF_K, kAccept));
    // jt 0 (go on), jf: to the instruction after the block. Jumps are 8-bit: a block too long to
    // express accepts everything, and the software match decides.
    if (block.size() > 250) return {stmt(BPF_RET | BPF_K, kAccept)};
    for (size_t i : fails) block[i].jf = static_cast<uint8_t>(block.size() - i - 1);
    prog.insert(prog.end(), block.begin(), block.end());
  }
  prog.push_back(stmt(BPF_RET | BPF_K, 0));
  return prog;
}

}  // namespace softrdma::net
