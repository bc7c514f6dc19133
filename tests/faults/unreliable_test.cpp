// The unreliable services under injected faults (SOFTRDMA_IMPAIR): UD loses datagrams but every one
// delivered is intact, and UC loses whole messages only: every message received is complete and
// correct, and a WRITE's target holds, byte for byte, either what was there or what was written.
// Two device contexts of this process on the loopback device, each given its own SOFTRDMA_IMPAIR by
// softrdma_open_device_with (verbs/private_abi.h); otherwise only the public verbs API is used.
// FAULT_SEED=<n> reproduces a run.
#include <infiniband/verbs.h>

#include <arpa/inet.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include "splitmix.h"
#include "verbs/private_abi.h"

namespace softrdma::faults_unreliable {
namespace {

constexpr uint8_t kPort = 1;
constexpr uint32_t kGrh = 40;
constexpr uint32_t kQkey = 0x0BADCAFE;
constexpr auto kQuiet = std::chrono::milliseconds(300);  // no completion for this long: traffic is over
constexpr auto kNoProgress = std::chrono::seconds(60);   // bound on a hang, not a timing assertion

uint64_t seed_from_env(uint64_t dflt) {
  const char* s = std::getenv("FAULT_SEED");
  return s && *s ? std::strtoull(s, nullptr, 0) : dflt;
}

using softrdma::fault_test::Rng;

// Message bytes: a function of (message id, offset), never zero (so a never-written byte, zero, can
// be told from a written one).
uint8_t byte_of(uint32_t id, size_t off) {
  uint32_t x = id * 2654435761u + static_cast<uint32_t>(off) * 40503u;
  x ^= x >> 13;
  return static_cast<uint8_t>(x | 1);
}

// A message: [id u32][len u32][fnv1a of the body u64][body], body = byte_of(id, i).
constexpr uint32_t kHdr = 16;
uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}
void make_message(uint8_t* p, uint32_t id, uint32_t body) {
  for (uint32_t i = 0; i < body; ++i) p[kHdr + i] = byte_of(id, i);
  uint64_t h = fnv1a(p + kHdr, body);
  std::memcpy(p, &id, 4);
  std::memcpy(p + 4, &body, 4);
  std::memcpy(p + 8, &h, 8);
}
// True when p[0..len) is a whole, correct message; its id in *id.
bool message_intact(const uint8_t* p, uint32_t len, uint32_t* id) {
  if (len < kHdr) return false;
  uint32_t body;
  uint64_t h;
  std::memcpy(id, p, 4);
  std::memcpy(&body, p + 4, 4);
  std::memcpy(&h, p + 8, 8);
  if (body != len - kHdr || fnv1a(p + kHdr, body) != h) return false;
  for (uint32_t i = 0; i < body; ++i)
    if (p[kHdr + i] != byte_of(*id, i)) return false;
  return true;
}

struct Context {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_gid gid{};
  ibv_port_attr port{};
  explicit Context(const char* impair) {
    // The context's own SOFTRDMA_IMPAIR (none: "", the default, whatever the environment says).
    const std::string settings = std::string("SOFTRDMA_IMPAIR=") + (impair ? impair : "");
    ctx = softrdma_open_device_with("softrdma_lo", 0, settings.c_str());
    if (!ctx) return;
    pd = ibv_alloc_pd(ctx);
    if (!pd || ibv_query_gid(ctx, kPort, 0, &gid) || ibv_query_port(ctx, kPort, &port)) {
      if (pd) ibv_dealloc_pd(pd);
      ibv_close_device(ctx);
      ctx = nullptr;
    }
  }
  ~Context() {
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
};

struct Mr {
  std::vector<uint8_t> mem;
  ibv_mr* mr = nullptr;
  Mr(ibv_pd* pd, size_t len) : mem(len) {
    mr = ibv_reg_mr(pd, mem.data(), len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  }
  ~Mr() {
    if (mr) ibv_dereg_mr(mr);
  }
  uint8_t* at(size_t off) { return mem.data() + off; }
  uint64_t addr(size_t off) { return reinterpret_cast<uint64_t>(at(off)); }
};

struct Qp {
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  ibv_qp* qp = nullptr;
  Qp(Context& c, ibv_qp_type type, uint32_t depth) {
    scq = ibv_create_cq(c.ctx, static_cast<int>(depth), nullptr, nullptr, 0);
    rcq = ibv_create_cq(c.ctx, static_cast<int>(depth), nullptr, nullptr, 0);
    ibv_qp_init_attr a{};
    a.send_cq = scq;
    a.recv_cq = rcq;
    a.qp_type = type;
    a.cap.max_send_wr = depth;
    a.cap.max_recv_wr = depth;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    if (scq && rcq) qp = ibv_create_qp(c.pd, &a);
  }
  ~Qp() {
    if (qp) ibv_destroy_qp(qp);
    if (scq) ibv_destroy_cq(scq);
    if (rcq) ibv_destroy_cq(rcq);
  }
};

int to_rts_ud(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = kPort;
  a.qkey = kQkey;
  if (int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return r;
  a.qp_state = IBV_QPS_RTR;
  if (int r = ibv_modify_qp(qp, &a, IBV_QP_STATE)) return r;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0x123;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

int to_rts_uc(ibv_qp* qp, uint32_t dest_qpn, const ibv_gid& gid, uint32_t psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = kPort;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return r;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = psn;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.port_num = kPort;
  if (int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN))
    return r;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = psn;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

std::string impair_spec(uint64_t seed) {
  if (const char* e = std::getenv("FAULT_IMPAIR"); e && *e) return "seed=" + std::to_string(seed) + "," + e;
  return "seed=" + std::to_string(seed) +
         ",tx_drop=0.04,rx_drop=0.02,tx_dup=0.04,rx_dup=0.02,tx_reorder=0.04,rx_reorder=0.02,reorder_depth=8,"
         "tx_corrupt=0.02,rx_corrupt=0.01";
}

// Waits for n send completions, all successful.
void wait_sends(ibv_cq* cq, int n) {
  auto deadline = std::chrono::steady_clock::now() + kNoProgress;
  ibv_wc wc[16];
  while (n > 0) {
    int got = ibv_poll_cq(cq, 16, wc);
    ASSERT_GE(got, 0);
    for (int i = 0; i < got; ++i) ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS) << "send wr " << wc[i].wr_id;
    n -= got;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "send completions stopped";
    if (!got) std::this_thread::yield();
  }
}

// Reaps until no completion has come for kQuiet: the traffic still in flight is over.
template <typename Reap>
void drain(Reap& reap, const uint64_t& reaped) {
  auto last = std::chrono::steady_clock::now();
  const auto give_up = last + kNoProgress;
  uint64_t before = reaped;
  while (std::chrono::steady_clock::now() - last < kQuiet && std::chrono::steady_clock::now() < give_up) {
    ASSERT_NO_FATAL_FAILURE(reap());
    if (reaped != before) {
      before = reaped;
      last = std::chrono::steady_clock::now();
    }
    std::this_thread::yield();
  }
}

class Unreliable : public ::testing::Test {
 protected:
  uint64_t seed = seed_from_env(0x5EED0001);
  void SetUp() override { std::fprintf(stderr, "FAULT_SEED=%llu\n", static_cast<unsigned long long>(seed)); }
};

TEST_F(Unreliable, UdLosesDatagramsButNeverCorruptsOne) {
  const std::string spec_a = impair_spec(seed), spec_b = impair_spec(seed + 1);
  Context ca(spec_a.c_str()), cb(spec_b.c_str());
  ASSERT_TRUE(ca.ctx && cb.ctx) << "softrdma_lo did not open";
  constexpr uint32_t kDepth = 256, kMsgs = 3200, kBatch = 32;  // kMsgs: whole batches
  const uint32_t mtu = 128u << ca.port.active_mtu;
  const uint32_t slot = kGrh + mtu;
  Qp a(ca, IBV_QPT_UD, kDepth), b(cb, IBV_QPT_UD, kDepth);
  ASSERT_TRUE(a.qp && b.qp);
  ASSERT_EQ(to_rts_ud(a.qp), 0);
  ASSERT_EQ(to_rts_ud(b.qp), 0);
  ibv_ah_attr at{};
  at.is_global = 1;
  at.grh.dgid = cb.gid;
  at.port_num = kPort;
  ibv_ah* ah = ibv_create_ah(ca.pd, &at);
  ASSERT_NE(ah, nullptr);
  Mr src(ca.pd, size_t{kBatch} * mtu), dst(cb.pd, size_t{kDepth} * slot);
  ASSERT_TRUE(src.mr && dst.mr);

  auto post_slot = [&](uint32_t s) {
    ibv_sge sge{dst.addr(size_t{s} * slot), slot, dst.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = s;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(b.qp, &wr, &bad);
  };
  for (uint32_t s = 0; s < kDepth; ++s) ASSERT_EQ(post_slot(s), 0);

  uint32_t received = 0, duplicates = 0;
  std::vector<bool> seen(kMsgs);
  uint64_t reaped = 0;
  auto reap = [&]() -> void {
    ibv_wc wc[16];
    int got;
    while ((got = ibv_poll_cq(b.rcq, 16, wc)) > 0) {
      for (int i = 0; i < got; ++i) {
        ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS);
        ASSERT_TRUE(wc[i].wc_flags & IBV_WC_GRH);
        ASSERT_EQ(wc[i].src_qp, a.qp->qp_num);
        const uint8_t* p = dst.at(wc[i].wr_id * slot);
        ASSERT_EQ(p[20], 0x45);
        uint32_t id = 0;
        ASSERT_GE(wc[i].byte_len, kGrh);
        ASSERT_TRUE(message_intact(p + kGrh, wc[i].byte_len - kGrh, &id)) << "a corrupted datagram was delivered";
        ASSERT_LT(id, kMsgs);
        if (seen[id]) ++duplicates;  // the network duplicated it: UD has no duplicate detection
        seen[id] = true;
        ++received;
        ASSERT_EQ(post_slot(static_cast<uint32_t>(wc[i].wr_id)), 0);
      }
      reaped += static_cast<uint64_t>(got);
    }
  };

  Rng rng{seed};
  for (uint32_t base = 0; base < kMsgs; base += kBatch) {
    for (uint32_t k = 0; k < kBatch; ++k) {
      uint32_t id = base + k;
      uint32_t len = kHdr + static_cast<uint32_t>(rng.next() % (mtu - kHdr + 1));
      make_message(src.at(size_t{k} * mtu), id, len - kHdr);
      ibv_sge sge{src.addr(size_t{k} * mtu), len, src.mr->lkey};
      ibv_send_wr wr{};
      wr.wr_id = id;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_SEND;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.ud.ah = ah;
      wr.wr.ud.remote_qpn = b.qp->qp_num;
      wr.wr.ud.remote_qkey = kQkey;
      ibv_send_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_send(a.qp, &wr, &bad), 0);
    }
    ASSERT_NO_FATAL_FAILURE(wait_sends(a.scq, kBatch));
    ASSERT_NO_FATAL_FAILURE(reap());
  }
  ASSERT_NO_FATAL_FAILURE(drain(reap, reaped));
  uint32_t distinct = 0;
  for (bool s : seen) distinct += s;
  std::fprintf(stderr, "UD: %u of %u datagrams arrived (%u distinct, %u duplicates)\n", received, kMsgs, distinct,
               duplicates);
  EXPECT_GT(distinct, kMsgs / 2) << "far more lost than the injected faults explain";
  EXPECT_LT(distinct, kMsgs) << "nothing was lost: the impairment did not act";
  ibv_destroy_ah(ah);
}

TEST_F(Unreliable, UcDropsWholeSendsOnly) {
  const std::string spec_a = impair_spec(seed + 2), spec_b = impair_spec(seed + 3);
  Context ca(spec_a.c_str()), cb(spec_b.c_str());
  ASSERT_TRUE(ca.ctx && cb.ctx) << "softrdma_lo did not open";
  constexpr uint32_t kDepth = 256, kMsgs = 1600, kBatch = 16, kMax = 6000;  // kMsgs: whole batches
  Qp a(ca, IBV_QPT_UC, kDepth), b(cb, IBV_QPT_UC, kDepth);
  ASSERT_TRUE(a.qp && b.qp);
  ASSERT_EQ(to_rts_uc(a.qp, b.qp->qp_num, cb.gid, 0x777), 0);
  ASSERT_EQ(to_rts_uc(b.qp, a.qp->qp_num, ca.gid, 0x777), 0);
  Mr src(ca.pd, size_t{kBatch} * kMax), dst(cb.pd, size_t{kDepth} * kMax);
  ASSERT_TRUE(src.mr && dst.mr);
  auto post_slot = [&](uint32_t s) {
    ibv_sge sge{dst.addr(size_t{s} * kMax), kMax, dst.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = s;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(b.qp, &wr, &bad);
  };
  for (uint32_t s = 0; s < kDepth; ++s) ASSERT_EQ(post_slot(s), 0);

  uint32_t received = 0;
  int64_t last_id = -1;
  uint64_t reaped = 0;
  auto reap = [&]() -> void {
    ibv_wc wc[16];
    int got;
    while ((got = ibv_poll_cq(b.rcq, 16, wc)) > 0) {
      for (int i = 0; i < got; ++i) {
        ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS);
        uint32_t id = 0;
        ASSERT_TRUE(message_intact(dst.at(wc[i].wr_id * kMax), wc[i].byte_len, &id))
            << "a partial or corrupted message was delivered (" << wc[i].byte_len << " bytes)";
        // In order, each at most once: UC delivers no duplicates and never reorders messages.
        ASSERT_GT(static_cast<int64_t>(id), last_id);
        last_id = id;
        ++received;
        // Stale bytes of an abandoned message must not pass for a later one: wipe the slot.
        std::memset(dst.at(wc[i].wr_id * kMax), 0, kMax);
        ASSERT_EQ(post_slot(static_cast<uint32_t>(wc[i].wr_id)), 0);
      }
      reaped += static_cast<uint64_t>(got);
    }
  };
  Rng rng{seed + 7};
  for (uint32_t base = 0; base < kMsgs; base += kBatch) {
    for (uint32_t k = 0; k < kBatch; ++k) {
      uint32_t id = base + k;
      uint32_t len = kHdr + static_cast<uint32_t>(rng.next() % (kMax - kHdr + 1));
      make_message(src.at(size_t{k} * kMax), id, len - kHdr);
      ibv_sge sge{src.addr(size_t{k} * kMax), len, src.mr->lkey};
      ibv_send_wr wr{};
      wr.wr_id = id;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_SEND;
      wr.send_flags = IBV_SEND_SIGNALED;
      ibv_send_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_send(a.qp, &wr, &bad), 0);
    }
    ASSERT_NO_FATAL_FAILURE(wait_sends(a.scq, kBatch));
    ASSERT_NO_FATAL_FAILURE(reap());
  }
  ASSERT_NO_FATAL_FAILURE(drain(reap, reaped));
  std::fprintf(stderr, "UC SEND: %u of %u messages arrived\n", received, kMsgs);
  EXPECT_GT(received, kMsgs / 4);
  EXPECT_LT(received, kMsgs) << "nothing was lost: the impairment did not act";
}

TEST_F(Unreliable, UcWritesLandWholeOrNotAtAll) {
  const std::string spec_a = impair_spec(seed + 4), spec_b = impair_spec(seed + 5);
  Context ca(spec_a.c_str()), cb(spec_b.c_str());
  ASSERT_TRUE(ca.ctx && cb.ctx) << "softrdma_lo did not open";
  // Every WRITE goes to a region of its own, zero before. Single-packet WRITEs (<= the 1024-byte
  // path MTU) must land whole or not at all. A multi-packet WRITE that lost a packet may have placed
  // its first packets (UC abandons the rest, the spec leaves the target undefined): each of its bytes
  // is then either zero or the written byte, never anything else; and one whose immediate arrived
  // is complete.
  constexpr uint32_t kWrites = 1200, kBatch = 16, kMax = 6000, kDepth = 256;  // kWrites: whole batches
  Qp a(ca, IBV_QPT_UC, kDepth), b(cb, IBV_QPT_UC, kDepth);
  ASSERT_TRUE(a.qp && b.qp);
  ASSERT_EQ(to_rts_uc(a.qp, b.qp->qp_num, cb.gid, 0x10), 0);
  ASSERT_EQ(to_rts_uc(b.qp, a.qp->qp_num, ca.gid, 0x10), 0);
  Mr src(ca.pd, size_t{kBatch} * kMax), dst(cb.pd, size_t{kWrites} * kMax);
  ASSERT_TRUE(src.mr && dst.mr);
  for (uint32_t s = 0; s < kDepth; ++s) {
    ibv_recv_wr wr{};
    wr.wr_id = s;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_recv(b.qp, &wr, &bad), 0);
  }
  std::vector<uint32_t> lens(kWrites);
  std::vector<bool> with_imm(kWrites), completed(kWrites);
  uint64_t reaped = 0;
  auto reap = [&]() -> void {
    ibv_wc wc[16];
    int got;
    while ((got = ibv_poll_cq(b.rcq, 16, wc)) > 0) {
      for (int i = 0; i < got; ++i) {
        ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS);
        ASSERT_EQ(wc[i].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
        uint32_t id = ntohl(wc[i].imm_data);
        ASSERT_LT(id, kWrites);
        ASSERT_TRUE(with_imm[id]);
        ASSERT_EQ(wc[i].byte_len, lens[id]);
        completed[id] = true;
        ibv_recv_wr wr{};
        wr.wr_id = wc[i].wr_id;
        ibv_recv_wr* bad = nullptr;
        ASSERT_EQ(ibv_post_recv(b.qp, &wr, &bad), 0);
      }
      reaped += static_cast<uint64_t>(got);
    }
  };
  Rng rng{seed + 11};
  for (uint32_t base = 0; base < kWrites; base += kBatch) {
    for (uint32_t k = 0; k < kBatch; ++k) {
      uint32_t id = base + k;
      bool single = rng.next() % 2;
      uint32_t len = 1 + static_cast<uint32_t>(rng.next() % (single ? 1024 : kMax));
      lens[id] = len;
      with_imm[id] = rng.next() % 2;
      for (uint32_t i = 0; i < len; ++i) *src.at(size_t{k} * kMax + i) = byte_of(id, i);
      ibv_sge sge{src.addr(size_t{k} * kMax), len, src.mr->lkey};
      ibv_send_wr wr{};
      wr.wr_id = id;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = with_imm[id] ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
      wr.imm_data = htonl(id);
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = dst.addr(size_t{id} * kMax);
      wr.wr.rdma.rkey = dst.mr->rkey;
      ibv_send_wr* bad = nullptr;
      ASSERT_EQ(ibv_post_send(a.qp, &wr, &bad), 0);
    }
    ASSERT_NO_FATAL_FAILURE(wait_sends(a.scq, kBatch));
    ASSERT_NO_FATAL_FAILURE(reap());
  }
  ASSERT_NO_FATAL_FAILURE(drain(reap, reaped));
  // Stop the responder: a packet still held by the impairment must not land while memory is checked.
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(b.qp, &err, IBV_QP_STATE), 0);

  uint32_t whole = 0, untouched = 0, partial = 0, completions = 0;
  for (uint32_t id = 0; id < kWrites; ++id) {
    const uint8_t* p = dst.at(size_t{id} * kMax);
    uint32_t written = 0;
    for (uint32_t i = 0; i < lens[id]; ++i) {
      ASSERT_TRUE(p[i] == 0 || p[i] == byte_of(id, i)) << "write " << id << " byte " << i << " is neither old nor new";
      written += p[i] != 0;
    }
    for (uint32_t i = lens[id]; i < kMax; ++i) ASSERT_EQ(p[i], 0) << "write " << id << " spilled past its end";
    completions += completed[id];
    if (completed[id]) {
      ASSERT_EQ(written, lens[id]) << "write " << id << " completed but is not all there";
    }
    if (lens[id] <= 1024) {
      ASSERT_TRUE(written == 0 || written == lens[id]) << "single-packet write " << id << " is torn";
    }
    if (written == lens[id]) ++whole;
    else if (written == 0) ++untouched;
    else ++partial;
  }
  std::fprintf(stderr, "UC WRITE: %u whole, %u untouched, %u partly placed (abandoned); %u immediates\n", whole,
               untouched, partial, completions);
  EXPECT_GT(whole, kWrites / 4);
  EXPECT_LT(whole, kWrites) << "nothing was lost: the impairment did not act";
}

}  // namespace
}  // namespace softrdma::faults_unreliable
