// RAW_PACKET QPs (raw.cpp): whole Ethernet frames through a net::RawPort, flow steering rules, and
// receive-side scaling over work queues. The verbs layer translates ibv_flow_spec_* into a FlowMatch
// and ibv_wq into a Wq; what a match means on the frame, and the hash, are here.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "net/frame_filter.h"
#include "transport/qp.h"

namespace softrdma::transport {

// A receive work queue (ibv_create_wq, IBV_WQT_RQ): an RQ with its own CQ, for RSS QPs.
enum class WqState : uint8_t { Reset = 0, Rdy = 1, Err = 2 };  // numerically enum ibv_wq_state
struct Wq {
  void* user = nullptr;
  uint32_t wqn = 0;
  uint32_t pd = 0;
  uint32_t max_sge = 0;
  core::CompletionQueue* cq = nullptr;
  WorkQueue<RecvWqe> rq;  // in the context's arena, as a QP's RQ
  size_t rq_bytes = 0;
  std::atomic<WqState> state{WqState::Reset};
};

// One flow steering rule (ibv_flow_attr of type NORMAL and its specs), fields in host order; a mask
// bit of 0 means "any". A spec of a layer implies the layer below (IPv4 implies EtherType 0x0800,
// TCP implies IP protocol 6).
struct FlowMatch {
  struct Eth {
    uint8_t dst[6], src[6];
    uint16_t ether_type, vlan_tci;
  };
  struct Ipv4 {
    uint32_t src, dst;
    uint8_t proto, tos, ttl, flags;  // flags: the 3 bits above the fragment offset
  };
  struct Ipv6 {
    uint8_t src[16], dst[16];
    uint32_t flow_label;
    uint8_t next_hdr, traffic_class, hop_limit;
  };
  struct Ports {
    uint16_t src, dst;
  };
  bool has_eth = false, has_ipv4 = false, has_ipv6 = false;
  enum class L4 : uint8_t { None, Tcp, Udp } l4 = L4::None;
  Eth eth{}, eth_mask{};
  Ipv4 ipv4{}, ipv4_mask{};
  Ipv6 ipv6{}, ipv6_mask{};
  Ports ports{}, ports_mask{};
  bool match_all = false;  // a sniffer rule: every frame of the port
};

// The frame rule a match stands for; false when it cannot be expressed (an L4 spec without an L3 one,
// IPv4 and IPv6 together).
bool flow_rule(const FlowMatch& m, net::FrameRule* out);

// enum ibv_rx_hash_fields
enum RxHashField : uint64_t {
  kHashSrcIpv4 = 1 << 0, kHashDstIpv4 = 1 << 1, kHashSrcIpv6 = 1 << 2, kHashDstIpv6 = 1 << 3,
  kHashSrcPortTcp = 1 << 4, kHashDstPortTcp = 1 << 5, kHashSrcPortUdp = 1 << 6, kHashDstPortUdp = 1 << 7,
};
// The Toeplitz hash of a frame's selected fields (source address, destination address, source port,
// destination port, each in network order, as Microsoft's RSS specification orders them).
uint32_t rss_hash(const std::vector<uint8_t>& key, uint64_t fields, const net::FrameView& frame);
uint32_t toeplitz(const uint8_t* key, size_t key_len, const uint8_t* input, size_t len);

}  // namespace softrdma::transport
