// RAW_PACKET QPs (ibv_create_qp(3) IBV_QPT_RAW_PACKET, ibv_create_flow(3), ibv_create_wq(3),
// ibv_create_rwq_ind_table(3)): whole Ethernet frames sent by one context's QP and received by another
// context's QP through the flows steering them to it, on the loopback device's interface; receive-side
// scaling over WQs. Creating a raw packet QP needs CAP_NET_RAW (EPERM otherwise): without it every test
// is skipped. Frames go to locally administered MAC addresses unique to this process, so that other
// programs on the interface do not see them and the kernel's IP stack ignores them.
#include "helpers.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

namespace softrdma::verbs_test {
namespace {

constexpr uint16_t kExperimentalType = 0x88B5;  // IEEE 802 local experimental EtherType
constexpr size_t kBufLen = 65536;
constexpr size_t kRxOff = 8192;  // the receive half of each QP's buffer

using Mac = std::array<uint8_t, 6>;

// A MAC address of this process: locally administered, unicast.
Mac our_mac(uint8_t n) {
  const auto pid = static_cast<uint32_t>(getpid());
  return {0x02, 0x5f, static_cast<uint8_t>(pid >> 16), static_cast<uint8_t>(pid >> 8), static_cast<uint8_t>(pid), n};
}

// An Ethernet frame: dst, src, EtherType, then a pattern.
std::vector<uint8_t> frame(const Mac& dst, uint16_t type, size_t len, uint32_t seed) {
  std::vector<uint8_t> f(len);
  Mac src = our_mac(0xEE);
  std::memcpy(f.data(), dst.data(), 6);
  std::memcpy(f.data() + 6, src.data(), 6);
  f[12] = static_cast<uint8_t>(type >> 8);
  f[13] = static_cast<uint8_t>(type);
  fill_pattern(f.data() + 14, len - 14, seed);
  return f;
}

// An IPv4/UDP frame from src_ip to 10.255.0.1:dport.
std::vector<uint8_t> udp_frame(const Mac& dst, uint32_t src_ip_host, uint16_t dport, size_t len, uint32_t seed) {
  std::vector<uint8_t> f = frame(dst, 0x0800, len, seed);
  uint8_t* ip = f.data() + 14;
  std::memset(ip, 0, 28);
  ip[0] = 0x45;
  ip[2] = static_cast<uint8_t>((len - 14) >> 8);
  ip[3] = static_cast<uint8_t>(len - 14);
  ip[8] = 64;
  ip[9] = 17;
  const uint32_t src = htonl(src_ip_host), dst_ip = htonl(0x0AFF0001);
  std::memcpy(ip + 12, &src, 4);
  std::memcpy(ip + 16, &dst_ip, 4);
  uint8_t* udp = ip + 20;
  udp[0] = 0x30;
  udp[1] = 0x39;  // 12345
  udp[2] = static_cast<uint8_t>(dport >> 8);
  udp[3] = static_cast<uint8_t>(dport);
  udp[4] = static_cast<uint8_t>((len - 34) >> 8);
  udp[5] = static_cast<uint8_t>(len - 34);
  return f;
}

// An IPv6/UDP frame from fd77::1:5 to fd77::<dst_low>, port 12345 -> dport.
std::vector<uint8_t> udp6_frame(const Mac& dst, uint8_t dst_low, uint16_t dport, size_t len, uint32_t seed) {
  std::vector<uint8_t> f = frame(dst, 0x86DD, len, seed);
  uint8_t* ip = f.data() + 14;
  std::memset(ip, 0, 48);
  ip[0] = 0x60;
  ip[4] = static_cast<uint8_t>((len - 54) >> 8);
  ip[5] = static_cast<uint8_t>(len - 54);
  ip[6] = 17;
  ip[7] = 64;
  ip[8] = ip[24] = 0xfd;
  ip[9] = ip[25] = 0x77;
  ip[21] = 1;
  ip[23] = 5;
  ip[39] = dst_low;
  uint8_t* udp = ip + 40;
  udp[0] = 0x30;
  udp[1] = 0x39;
  udp[2] = static_cast<uint8_t>(dport >> 8);
  udp[3] = static_cast<uint8_t>(dport);
  udp[4] = ip[4];
  udp[5] = ip[5];
  return f;
}

ibv_flow_spec_eth eth_spec(const Mac& dst) {
  ibv_flow_spec_eth s{};
  s.type = IBV_FLOW_SPEC_ETH;
  s.size = sizeof s;
  std::memcpy(s.val.dst_mac, dst.data(), 6);
  std::memset(s.mask.dst_mac, 0xFF, 6);
  return s;
}

// An ibv_flow_attr followed by its specs.
struct FlowAttr {
  std::vector<uint8_t> bytes;
  explicit FlowAttr(ibv_flow_attr_type type = IBV_FLOW_ATTR_NORMAL) {
    ibv_flow_attr a{};
    a.type = type;
    a.size = sizeof a;
    a.port = kPort;
    bytes.assign(reinterpret_cast<uint8_t*>(&a), reinterpret_cast<uint8_t*>(&a) + sizeof a);
  }
  template <typename Spec>
  FlowAttr& add(const Spec& s) {
    bytes.insert(bytes.end(), reinterpret_cast<const uint8_t*>(&s), reinterpret_cast<const uint8_t*>(&s) + sizeof s);
    attr()->num_of_specs++;
    attr()->size = static_cast<uint16_t>(bytes.size());
    return *this;
  }
  ibv_flow_attr* attr() { return reinterpret_cast<ibv_flow_attr*>(bytes.data()); }
};

// One raw packet QP with its PD, CQ and buffer in its own device context.
struct RawEnd {
  Device dev;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  std::unique_ptr<Buffer> buf;
  std::vector<ibv_flow*> flows;
  int create_errno = 0;

  bool create(bool to_rts = true) {
    if (!dev.ok()) return false;
    pd = ibv_alloc_pd(dev.ctx);
    cq = ibv_create_cq(dev.ctx, 256, nullptr, nullptr, 0);
    if (!pd || !cq) return false;
    buf = std::make_unique<Buffer>(kBufLen);
    if (!buf->reg(pd, IBV_ACCESS_LOCAL_WRITE)) return false;
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RAW_PACKET;
    ia.cap = {64, 64, 4, 4, 0};
    qp = ibv_create_qp(pd, &ia);
    if (!qp) {
      create_errno = errno;
      return false;
    }
    return !to_rts || bring_up() == 0;
  }
  int bring_up() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = kPort;
    if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT)) return rc;
    a.qp_state = IBV_QPS_RTR;
    if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE)) return rc;
    a.qp_state = IBV_QPS_RTS;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE);
  }
  ibv_flow* flow(FlowAttr& fa) {
    ibv_flow* f = ibv_create_flow(qp, fa.attr());
    if (f) flows.push_back(f);
    return f;
  }
  // Posts a receive of len bytes at kRxOff + off.
  int recv(uint64_t wr_id, uint32_t len, size_t off = 0) { return post_recv(qp, wr_id, {buf->sge(kRxOff + off, len)}); }
  // Copies f into the send half of the buffer and posts it.
  int send(uint64_t wr_id, const std::vector<uint8_t>& f, unsigned flags = IBV_SEND_SIGNALED) {
    std::memcpy(buf->data, f.data(), f.size());
    SendWr w(wr_id, IBV_WR_SEND, {buf->sge(0, static_cast<uint32_t>(f.size()))}, flags);
    return post_send(qp, w);
  }
  ~RawEnd() {
    for (ibv_flow* f : flows) ibv_destroy_flow(f);
    if (qp) ibv_destroy_qp(qp);
    buf.reset();
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
  }
};

class RawPacket : public ::testing::Test {
 protected:
  RawEnd tx, rx;
  void SetUp() override {
    if (!tx.dev.ok() || !rx.dev.ok()) GTEST_SKIP() << "no loopback device";
    if (tx.dev.port.link_layer != IBV_LINK_LAYER_ETHERNET) GTEST_SKIP() << "not an Ethernet port";
    if (!tx.create()) {
      if (tx.create_errno == EPERM || tx.create_errno == EOPNOTSUPP)
        GTEST_SKIP() << "raw packet QPs need CAP_NET_RAW (errno " << tx.create_errno << ")";
      FAIL() << "raw packet QP: errno " << tx.create_errno;
    }
    ASSERT_TRUE(rx.create());
  }
  // Sends f from tx and expects its send completion.
  void send_ok(uint64_t wr_id, const std::vector<uint8_t>& f) {
    ASSERT_EQ(tx.send(wr_id, f), 0);
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(tx.cq, &wc));
    expect_wc(wc, {.wr_id = wr_id, .opcode = IBV_WC_SEND, .qp_num = tx.qp->qp_num});
  }
  // Expects the next receive completion on rx to be wr_id holding exactly f.
  void expect_received(uint64_t wr_id, const std::vector<uint8_t>& f, size_t off = 0) {
    ibv_wc wc{};
    ASSERT_TRUE(poll_wc(rx.cq, &wc));
    expect_wc(wc, {.wr_id = wr_id, .opcode = IBV_WC_RECV, .byte_len = static_cast<uint32_t>(f.size()),
                   .qp_num = rx.qp->qp_num});
    EXPECT_EQ(std::memcmp(rx.buf->data + kRxOff + off, f.data(), f.size()), 0) << "frame contents differ";
  }
};

TEST_F(RawPacket, StateMachineHasOnlyThePort) {
  RawEnd q;
  ASSERT_TRUE(q.create(false));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = kPort;
  EXPECT_EQ(ibv_modify_qp(q.qp, &a, IBV_QP_STATE), EINVAL) << "RESET->INIT needs the port";
  a.qkey = 1;
  EXPECT_EQ(ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_QKEY), EINVAL) << "no Q_Key on raw QPs";
  ASSERT_EQ(ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_PORT), 0);
  SendWr w(1, IBV_WR_SEND, {q.buf->sge(0, 64)});
  EXPECT_EQ(post_send(q.qp, w), EINVAL) << "no sends before RTS";
  a.qp_state = IBV_QPS_RTR;
  a.dest_qp_num = 5;
  EXPECT_EQ(ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN), EINVAL) << "a raw QP has no peer";
  ASSERT_EQ(ibv_modify_qp(q.qp, &a, IBV_QP_STATE), 0);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 1;
  EXPECT_EQ(ibv_modify_qp(q.qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), EINVAL) << "a raw QP has no PSNs";
  ASSERT_EQ(ibv_modify_qp(q.qp, &a, IBV_QP_STATE), 0);
  EXPECT_EQ(qp_state(q.qp), IBV_QPS_RTS);
}

TEST_F(RawPacket, FramesFollowTheirFlow) {
  const Mac mac = our_mac(1);
  FlowAttr fa;
  fa.add(eth_spec(mac));
  ASSERT_NE(rx.flow(fa), nullptr) << "errno " << errno;
  ASSERT_EQ(rx.recv(10, 2048), 0);
  ASSERT_EQ(rx.recv(11, 2048, 2048), 0);
  auto f1 = frame(mac, kExperimentalType, 200, 1);
  auto f2 = frame(mac, kExperimentalType, 1514, 2);
  send_ok(1, f1);
  expect_received(10, f1);
  // Each frame arrives once: the next completion is the next frame's.
  send_ok(2, f2);
  expect_received(11, f2, 2048);
}

TEST_F(RawPacket, OnlyMatchingFramesArrive) {
  const Mac mac = our_mac(2), other = our_mac(3);
  FlowAttr fa;
  ibv_flow_spec_eth eth = eth_spec(mac);
  ibv_flow_spec_ipv4 ip{};
  ip.type = IBV_FLOW_SPEC_IPV4;
  ip.size = sizeof ip;
  ip.val.dst_ip = htonl(0x0AFF0001);
  ip.mask.dst_ip = 0xFFFFFFFF;
  ibv_flow_spec_tcp_udp udp{};
  udp.type = IBV_FLOW_SPEC_UDP;
  udp.size = sizeof udp;
  udp.val.dst_port = htons(4000);
  udp.mask.dst_port = 0xFFFF;
  fa.add(eth).add(ip).add(udp);
  ASSERT_NE(rx.flow(fa), nullptr) << "errno " << errno;
  ASSERT_EQ(rx.recv(20, 2048), 0);
  send_ok(1, udp_frame(other, 0x01010101, 4000, 300, 1));            // another MAC
  send_ok(2, udp_frame(mac, 0x01010101, 4001, 300, 2));              // another port
  send_ok(3, frame(mac, kExperimentalType, 300, 3));                 // not IPv4
  auto good = udp_frame(mac, 0x01010101, 4000, 300, 4);
  send_ok(4, good);
  expect_received(20, good);
}

// IPv6 frames: a flow on the IPv6 destination and UDP port takes only its frames, and
// IBV_SEND_IP_CSUM fills the UDP checksum over IPv6's pseudo-header (IPv6 has no header checksum).
TEST_F(RawPacket, Ipv6FlowAndChecksumOffload) {
  const Mac mac = our_mac(12);
  FlowAttr fa;
  ibv_flow_spec_ipv6 ip{};
  ip.type = IBV_FLOW_SPEC_IPV6;
  ip.size = sizeof ip;
  ip.val.dst_ip[0] = 0xfd;
  ip.val.dst_ip[1] = 0x77;
  ip.val.dst_ip[15] = 2;
  std::memset(ip.mask.dst_ip, 0xFF, 16);
  ibv_flow_spec_tcp_udp udp{};
  udp.type = IBV_FLOW_SPEC_UDP;
  udp.size = sizeof udp;
  udp.val.dst_port = htons(4000);
  udp.mask.dst_port = 0xFFFF;
  fa.add(eth_spec(mac)).add(ip).add(udp);
  ASSERT_NE(rx.flow(fa), nullptr) << "errno " << errno;
  ASSERT_EQ(rx.recv(30, 2048), 0);
  send_ok(1, udp6_frame(mac, 3, 4000, 300, 1));     // another IPv6 destination
  send_ok(2, udp6_frame(mac, 2, 4001, 300, 2));     // another port
  send_ok(3, udp_frame(mac, 0x01010101, 4000, 300, 3));  // IPv4
  auto good = udp6_frame(mac, 2, 4000, 301, 4);     // odd UDP length: the last byte is padded
  const bool csum = tx.dev.attr.device_cap_flags & IBV_DEVICE_RAW_IP_CSUM;
  ASSERT_EQ(tx.send(4, good, IBV_SEND_SIGNALED | (csum ? IBV_SEND_IP_CSUM : 0)), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(tx.cq, &wc));
  expect_wc(wc, {.wr_id = 4, .opcode = IBV_WC_SEND});
  ASSERT_TRUE(poll_wc(rx.cq, &wc));
  expect_wc(wc, {.wr_id = 30, .opcode = IBV_WC_RECV, .byte_len = 301});
  std::vector<uint8_t> got(rx.buf->data + kRxOff, rx.buf->data + kRxOff + 301);
  if (csum) {
    const uint8_t* ip6 = got.data() + 14;
    uint32_t sum = 17 + (301u - 54);
    for (int i = 8; i < 40; i += 2) sum += uint32_t{ip6[i]} << 8 | ip6[i + 1];
    for (size_t i = 40; i < 301 - 14; i += 2) sum += uint32_t{ip6[i]} << 8 | (i + 1 < 301 - 14 ? ip6[i + 1] : 0);
    while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
    EXPECT_EQ(sum, 0xFFFFu) << "UDP checksum over the IPv6 pseudo-header";
    EXPECT_NE(got[60] | got[61], 0) << "a UDP checksum was written";
    got[60] = good[60];
    got[61] = good[61];
  }
  EXPECT_EQ(got, good) << "apart from the checksum, the frame as sent";
  EXPECT_EQ(drain_cq(rx.cq), 0) << "one frame only";
}

TEST_F(RawPacket, NoFlowNoFrames) {
  const Mac mac = our_mac(4);
  ASSERT_EQ(rx.recv(30, 2048), 0);
  send_ok(1, frame(mac, kExperimentalType, 100, 1));  // rx has no flow yet
  FlowAttr fa;
  fa.add(eth_spec(mac));
  ibv_flow* f = ibv_create_flow(rx.qp, fa.attr());
  ASSERT_NE(f, nullptr);
  auto f2 = frame(mac, kExperimentalType, 100, 2);
  send_ok(2, f2);
  expect_received(30, f2);
  ASSERT_EQ(ibv_destroy_flow(f), 0);
  ASSERT_EQ(rx.recv(31, 2048), 0);
  send_ok(3, frame(mac, kExperimentalType, 100, 3));  // the flow is gone
  ASSERT_NE(rx.flow(fa), nullptr);
  auto f4 = frame(mac, kExperimentalType, 100, 4);
  send_ok(4, f4);
  expect_received(31, f4);
}

TEST_F(RawPacket, GatherAndScatterLists) {
  const Mac mac = our_mac(5);
  FlowAttr fa;
  fa.add(eth_spec(mac));
  ASSERT_NE(rx.flow(fa), nullptr);
  auto f = frame(mac, kExperimentalType, 1000, 5);
  // Received into 100 + 2000 bytes, sent from 14 + 486 + 500 bytes.
  ASSERT_EQ(post_recv(rx.qp, 40, {rx.buf->sge(kRxOff, 100), rx.buf->sge(kRxOff + 100, 2000)}), 0);
  std::memcpy(tx.buf->data, f.data(), 14);
  std::memcpy(tx.buf->data + 1000, f.data() + 14, 486);
  std::memcpy(tx.buf->data + 3000, f.data() + 500, 500);
  SendWr w(7, IBV_WR_SEND, {tx.buf->sge(0, 14), tx.buf->sge(1000, 486), tx.buf->sge(3000, 500)});
  ASSERT_EQ(post_send(tx.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(tx.cq, &wc));
  expect_wc(wc, {.wr_id = 7, .opcode = IBV_WC_SEND});
  expect_received(40, f);
}

TEST_F(RawPacket, SendErrors) {
  // Only SEND carries a frame.
  SendWr write(1, IBV_WR_RDMA_WRITE, {tx.buf->sge(0, 64)});
  write.rdma(tx.buf->addr(), tx.buf->rkey());
  EXPECT_EQ(post_send(tx.qp, write), EINVAL);
  // A bad lkey: LOC_PROT_ERR, and the QP goes to error.
  SendWr bad(2, IBV_WR_SEND, {ibv_sge{tx.buf->addr(), 64, tx.buf->lkey() ^ 0x5a5a}});
  ASSERT_EQ(post_send(tx.qp, bad), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(tx.cq, &wc));
  expect_wc(wc, {.wr_id = 2, .status = IBV_WC_LOC_PROT_ERR});
  EXPECT_TRUE(wait_qp_state(tx.qp, IBV_QPS_ERR));
}

TEST_F(RawPacket, FrameShorterThanItsHeader) {
  SendWr w(3, IBV_WR_SEND, {tx.buf->sge(0, 10)});
  ASSERT_EQ(post_send(tx.qp, w), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(tx.cq, &wc));
  expect_wc(wc, {.wr_id = 3, .status = IBV_WC_LOC_LEN_ERR});
}

TEST_F(RawPacket, ReceiveBufferTooSmall) {
  const Mac mac = our_mac(6);
  FlowAttr fa;
  fa.add(eth_spec(mac));
  ASSERT_NE(rx.flow(fa), nullptr);
  ASSERT_EQ(rx.recv(50, 64), 0);
  send_ok(1, frame(mac, kExperimentalType, 200, 6));
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(rx.cq, &wc));
  expect_wc(wc, {.wr_id = 50, .status = IBV_WC_LOC_LEN_ERR});
  EXPECT_TRUE(wait_qp_state(rx.qp, IBV_QPS_ERR));
}

// IBV_SEND_IP_CSUM: the frame arrives with valid IPv4 header and UDP checksums; the sender's buffer
// keeps its zeros.
TEST_F(RawPacket, IpChecksumOffload) {
  if (!(tx.dev.attr.device_cap_flags & IBV_DEVICE_RAW_IP_CSUM)) GTEST_SKIP() << "no IBV_DEVICE_RAW_IP_CSUM";
  const Mac mac = our_mac(9);
  FlowAttr fa;
  fa.add(eth_spec(mac));
  ASSERT_NE(rx.flow(fa), nullptr);
  ASSERT_EQ(rx.recv(60, 2048), 0);
  auto f = udp_frame(mac, 0xC0A80001, 4000, 333, 9);  // odd UDP length: the last byte is padded
  ASSERT_EQ(tx.send(8, f, IBV_SEND_SIGNALED | IBV_SEND_IP_CSUM), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(tx.cq, &wc));
  expect_wc(wc, {.wr_id = 8, .opcode = IBV_WC_SEND});
  EXPECT_EQ(tx.buf->data[24], 0);
  EXPECT_EQ(tx.buf->data[25], 0);
  ASSERT_TRUE(poll_wc(rx.cq, &wc));
  expect_wc(wc, {.wr_id = 60, .opcode = IBV_WC_RECV, .byte_len = 333});
  const uint8_t* ip = rx.buf->data + kRxOff + 14;
  auto sum16 = [](const uint8_t* p, size_t n, uint32_t s) {
    for (size_t i = 0; i < n; i += 2) s += uint32_t{p[i]} << 8 | (i + 1 < n ? p[i + 1] : 0);
    while (s >> 16) s = (s & 0xFFFF) + (s >> 16);
    return s;
  };
  EXPECT_EQ(sum16(ip, 20, 0), 0xFFFFu) << "IPv4 header checksum";
  const size_t udp_len = 333 - 34;
  EXPECT_EQ(sum16(ip + 20, udp_len, sum16(ip + 12, 8, 17 + static_cast<uint32_t>(udp_len))), 0xFFFFu)
      << "UDP checksum";
  EXPECT_NE(ip[26] | ip[27], 0) << "a UDP checksum was written";
  // Apart from the checksums the frame is as sent.
  std::vector<uint8_t> got(rx.buf->data + kRxOff, rx.buf->data + kRxOff + 333);
  got[24] = got[25] = got[40] = got[41] = 0;
  EXPECT_EQ(got, f);
}

TEST_F(RawPacket, FlowRules) {
  FlowAttr bad_port;
  bad_port.add(eth_spec(our_mac(7)));
  bad_port.attr()->port = 2;
  EXPECT_EQ(ibv_create_flow(rx.qp, bad_port.attr()), nullptr);
  // A QP with a flow is not destroyed under it.
  FlowAttr fa;
  fa.add(eth_spec(our_mac(7)));
  ibv_flow* f = ibv_create_flow(rx.qp, fa.attr());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(ibv_destroy_qp(rx.qp), EBUSY);
  EXPECT_EQ(ibv_destroy_flow(f), 0);
}

// An RSS QP over four WQs on two CQs: each frame lands in the WQ that the Toeplitz hash of its IPv4
// addresses selects (the low bits index the table).
class RawRss : public RawPacket {
 protected:
  static constexpr int kWqs = 4;
  ibv_cq* cqs[2] = {};
  ibv_wq* wqs[kWqs] = {};
  ibv_rwq_ind_table* table = nullptr;
  ibv_qp* rss = nullptr;
  ibv_flow* flow = nullptr;
  uint8_t key[40];

  void SetUp() override {
    RawPacket::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ibv_device_attr_ex ax{};
    ASSERT_EQ(ibv_query_device_ex(rx.dev.ctx, nullptr, &ax), 0);
    if (!(ax.rss_caps.supported_qpts & (1u << IBV_QPT_RAW_PACKET)) ||
        !(ax.rss_caps.rx_hash_function & IBV_RX_HASH_FUNC_TOEPLITZ) || ax.rss_caps.max_rwq_indirection_table_size < kWqs)
      GTEST_SKIP() << "no Toeplitz RSS for raw packet QPs";
    for (auto& c : cqs) ASSERT_NE(c = ibv_create_cq(rx.dev.ctx, 256, nullptr, nullptr, 0), nullptr);
    for (int i = 0; i < kWqs; ++i) {
      ibv_wq_init_attr wa{};
      wa.wq_type = IBV_WQT_RQ;
      wa.max_wr = 64;
      wa.max_sge = 1;
      wa.pd = rx.pd;
      wa.cq = cqs[i % 2];
      ASSERT_NE(wqs[i] = ibv_create_wq(rx.dev.ctx, &wa), nullptr) << "errno " << errno;
      ibv_wq_attr m{};
      m.attr_mask = IBV_WQ_ATTR_STATE;
      m.wq_state = IBV_WQS_RDY;
      ASSERT_EQ(ibv_modify_wq(wqs[i], &m), 0);
    }
    ibv_rwq_ind_table_init_attr ta{};
    ta.log_ind_tbl_size = 2;
    ta.ind_tbl = wqs;
    ASSERT_NE(table = ibv_create_rwq_ind_table(rx.dev.ctx, &ta), nullptr) << "errno " << errno;
    for (int i = 0; i < 40; ++i) key[i] = static_cast<uint8_t>(0x6d + 37 * i);
    ibv_qp_init_attr_ex qa{};
    qa.qp_type = IBV_QPT_RAW_PACKET;
    qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH;
    qa.pd = rx.pd;
    qa.rwq_ind_tbl = table;
    qa.rx_hash_conf = {IBV_RX_HASH_FUNC_TOEPLITZ, 40, key, IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4};
    ASSERT_NE(rss = ibv_create_qp_ex(rx.dev.ctx, &qa), nullptr) << "errno " << errno;
  }
  void TearDown() override {
    if (flow) ibv_destroy_flow(flow);
    if (rss) ibv_destroy_qp(rss);
    if (table) ibv_destroy_rwq_ind_table(table);
    for (ibv_wq* w : wqs)
      if (w) ibv_destroy_wq(w);
    for (ibv_cq* c : cqs)
      if (c) ibv_destroy_cq(c);
  }
  // The Toeplitz hash of (src, dst), both in network order.
  uint32_t toeplitz(uint32_t src_be, uint32_t dst_be) const {
    uint8_t in[8];
    std::memcpy(in, &src_be, 4);
    std::memcpy(in + 4, &dst_be, 4);
    uint32_t h = 0;
    for (int bit = 0; bit < 64; ++bit) {
      if (!(in[bit / 8] & (0x80 >> (bit % 8)))) continue;
      uint32_t k = 0;  // key bits [bit, bit + 32)
      for (int j = 0; j < 32; ++j) k = k << 1 | ((key[(bit + j) / 8] >> (7 - (bit + j) % 8)) & 1);
      h ^= k;
    }
    return h;
  }
  int post_wq(int i, uint64_t wr_id, size_t off) {
    ibv_sge sge = rx.buf->sge(off, 512);
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_wq_recv(wqs[i], &wr, &bad);
  }
};

TEST_F(RawRss, FramesSpreadByTheirHash) {
  const Mac mac = our_mac(8);
  FlowAttr fa;
  fa.add(eth_spec(mac));
  ASSERT_NE(flow = ibv_create_flow(rss, fa.attr()), nullptr) << "errno " << errno;
  constexpr int kFrames = 12;
  for (int i = 0; i < kWqs; ++i)
    for (int k = 0; k < kFrames; ++k) ASSERT_EQ(post_wq(i, 1000 * i + k, 512 * (kFrames * i + k)), 0);
  std::map<uint32_t, int> wq_index;
  for (int i = 0; i < kWqs; ++i) wq_index[wqs[i]->wq_num] = i;
  std::vector<int> expected_at(kWqs, 0);
  std::vector<std::vector<uint8_t>> sent;
  for (int k = 0; k < kFrames; ++k) {
    const uint32_t src = 0x01010101u * static_cast<uint32_t>(k + 1);
    sent.push_back(udp_frame(mac, src, 4000, 120, k));
    send_ok(k, sent.back());
    ++expected_at[toeplitz(htonl(src), htonl(0x0AFF0001)) % kWqs];
  }
  std::vector<int> got_at(kWqs, 0);
  int got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kWaitSeconds);
  while (got < kFrames && std::chrono::steady_clock::now() < deadline) {
    for (ibv_cq* c : cqs) {
      ibv_wc wc{};
      if (ibv_poll_cq(c, 1, &wc) != 1) continue;
      ++got;
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
      EXPECT_EQ(wc.opcode, IBV_WC_RECV);
      EXPECT_EQ(wc.byte_len, 120u);
      ASSERT_TRUE(wq_index.count(wc.qp_num)) << "qp_num " << wc.qp_num << " is no WQ of the table";
      const int i = wq_index[wc.qp_num];
      EXPECT_EQ(cqs[i % 2], c) << "a WQ completes into its own CQ";
      EXPECT_EQ(wc.wr_id / 1000, static_cast<uint64_t>(i));
      // Which frame it is: its source address says; it must be whole and in the WQ its hash picks.
      const uint8_t* data = rx.buf->data + 512 * (kFrames * i + wc.wr_id % 1000);
      uint32_t src_be;
      std::memcpy(&src_be, data + 26, 4);
      const uint32_t k = ntohl(src_be) / 0x01010101u - 1;
      ASSERT_LT(k, sent.size());
      EXPECT_EQ(std::memcmp(data, sent[k].data(), sent[k].size()), 0) << "frame " << k;
      EXPECT_EQ(toeplitz(src_be, htonl(0x0AFF0001)) % kWqs, static_cast<uint32_t>(i)) << "frame " << k;
      ++got_at[i];
    }
  }
  ASSERT_EQ(got, kFrames) << "frames lost";
  EXPECT_EQ(got_at, expected_at);
  EXPECT_GT(std::count_if(expected_at.begin(), expected_at.end(), [](int n) { return n > 0; }), 1)
      << "the frames were meant to spread over several WQs";
}

TEST_F(RawRss, ObjectsInUseAreNotDestroyed) {
  EXPECT_EQ(ibv_destroy_wq(wqs[0]), EBUSY) << "the WQ is in an indirection table";
  EXPECT_EQ(ibv_destroy_rwq_ind_table(table), EBUSY) << "the table serves an RSS QP";
  ibv_wq_attr m{};
  m.attr_mask = IBV_WQ_ATTR_STATE;
  m.wq_state = IBV_WQS_ERR;
  ASSERT_EQ(ibv_modify_wq(wqs[0], &m), 0);
  m.wq_state = IBV_WQS_RDY;
  EXPECT_EQ(ibv_modify_wq(wqs[0], &m), EINVAL) << "ERR is left through RESET only";
  m.wq_state = IBV_WQS_RESET;
  EXPECT_EQ(ibv_modify_wq(wqs[0], &m), 0);
  // A receive posted to a WQ in error is flushed.
  m.wq_state = IBV_WQS_ERR;
  ASSERT_EQ(ibv_modify_wq(wqs[0], &m), 0);
  ASSERT_EQ(post_wq(0, 77, 0), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(cqs[0], &wc));
  EXPECT_EQ(wc.wr_id, 77u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
}

}  // namespace
}  // namespace softrdma::verbs_test
