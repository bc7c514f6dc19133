// Two processes on one host (the target forked before either opens a device): RC one-sided operations
// between them, and the protection rules a responder enforces -- wrong rkey, out-of-range address,
// missing access right, deregistered region, destroyed QP. On softrdma these run on the intra-host
// direct path (docs/direct-path.md) unless SOFTRDMA_DIRECT=0; the statuses and data are those of the
// wire either way, and the test also checks which path was taken (the stats page's direct_ops).
#include "two_process.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace softrdma::verbs_test {
namespace {

constexpr size_t kALen = 64 * 1024;  // the target's main buffer: every right
constexpr size_t kRLen = 4096;       // LOCAL_WRITE | REMOTE_READ only
constexpr size_t kDLen = 4096;       // deregistered on request
constexpr size_t kPLen = 16 * 1024;  // a private file mapping (cannot be shared): every right

struct Info {
  uint32_t qpn, psn;
  uint32_t a_rkey, r_rkey, d_rkey, p_rkey;
  uint64_t a_addr, r_addr, d_addr, p_addr;
  uint8_t gid[16];
};

// A private writable mapping of a (deleted) temporary file, filled with pattern seed; nullptr on failure.
uint8_t* private_file_mapping(size_t len, uint32_t seed) {
  char path[] = "/tmp/softrdma-direct-test-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return nullptr;
  unlink(path);
  void* p = ftruncate(fd, static_cast<off_t>(len)) == 0
                ? mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0)
                : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) return nullptr;
  fill_pattern(static_cast<uint8_t*>(p), len, seed);
  return static_cast<uint8_t*>(p);
}

// The target: registers its buffers, connects, then obeys one-byte commands until 'x'.
int target_main(int sock) {
  Device dev;
  if (!dev.ok()) return 10;
  Side s;
  if (!s.create(dev, QpConfig{})) return 11;
  auto a = s.buf(kALen);
  auto r = s.buf(kRLen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  auto d = s.buf(kDLen);
  if (!a->mr || !r->mr || !d->mr) return 12;
  fill_pattern(a->data, kALen, 11);
  fill_pattern(r->data, kRLen, 12);
  fill_pattern(d->data, kDLen, 13);
  uint8_t* pm = private_file_mapping(kPLen, 14);
  ibv_mr* pmr = pm ? ibv_reg_mr(s.pd, pm, kPLen, kAllAccess) : nullptr;
  if (!pmr) return 12;
  if (modify_to_init(s.qp, kAllAccess)) return 13;
  const Info me{s.qpn(), s.psn, a->rkey(), r->rkey(), d->rkey(), pmr->rkey,
                a->addr(), r->addr(), d->addr(), reinterpret_cast<uint64_t>(pm), {}};
  Info peer{};
  if (int rc = serve_connect(sock, dev, s, me, peer, 14)) return rc;
  for (;;) {
    char cmd = 0;
    if (!read_full(sock, &cmd, 1)) return 16;
    switch (cmd) {
      case 'c':  // contents of all three buffers
        if (!write_full(sock, a->data, kALen) || !write_full(sock, r->data, kRLen) ||
            !write_full(sock, d->data, kDLen))
          return 17;
        break;
      case 'p':  // contents of P
        if (!write_full(sock, pm, kPLen)) return 17;
        break;
      case 'd':  // deregister D; its memory stays mapped, so any write to it would show
        if (ibv_dereg_mr(d->mr)) return 18;
        d->mr = nullptr;
        break;
      case 'q':
        s.destroy_qp();
        break;
      case 'w': {  // the QP, in RTS, stops granting REMOTE_WRITE (the access flags alone)
        ibv_qp_attr attr{};
        attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        if (ibv_modify_qp(s.qp, &attr, IBV_QP_ACCESS_FLAGS)) return 21;
        break;
      }
      case 'x':
        return 0;
      default:
        return 19;
    }
    if (!write_full(sock, &cmd, 1)) return 20;
  }
}

// Whether softrdma takes the direct path here: SOFTRDMA_DIRECT=0/1, else its default (on).
constexpr bool kDirectByDefault = true;
bool direct_expected() {
  const char* s = getenv("SOFTRDMA_DIRECT");
  bool on = s ? std::strcmp(s, "0") != 0 : kDirectByDefault && getenv("SOFTRDMA_IMPAIR") == nullptr;
  return on && getenv("VT_DEVICE") == nullptr;
}

class DirectPath : public ForkedTarget {
 protected:
  DirectPath() : ForkedTarget(target_main) {}

  Info peer{};
  std::unique_ptr<Device> dev;
  Side s;
  std::unique_ptr<Buffer> src, dst;
  ConnConfig conn;
  QpConfig qcfg;

  void TearDown() override {
    src.reset();  // MRs before their PD
    dst.reset();
    s.reset();
    dev.reset();
    ForkedTarget::TearDown();
  }

  // Opens our side and connects it to the target's QP.
  void connect() {
    dev = std::make_unique<Device>();
    ASSERT_TRUE(dev->ok());
    ASSERT_TRUE(s.create(*dev, qcfg));
    src = s.buf(kALen);
    dst = s.buf(kALen);
    ASSERT_TRUE(src->mr && dst->mr);
    ASSERT_EQ(modify_to_init(s.qp, kAllAccess), 0);
    ASSERT_NO_FATAL_FAILURE(connect_target(Info{s.qpn(), s.psn, 0, 0, 0, 0, 0, 0, 0, 0, {}}, peer, s, *dev, conn));
  }

  void command(char c) {
    ASSERT_TRUE(write_full(sock, &c, 1));
    char ack = 0;
    ASSERT_TRUE(read_full(sock, &ack, 1));
    ASSERT_EQ(ack, c);
  }

  struct Contents {
    std::vector<uint8_t> a, r, d;
  };
  Contents contents() {
    Contents c{std::vector<uint8_t>(kALen), std::vector<uint8_t>(kRLen), std::vector<uint8_t>(kDLen)};
    char cmd = 'c';
    EXPECT_TRUE(write_full(sock, &cmd, 1));
    EXPECT_TRUE(read_full(sock, c.a.data(), kALen));
    EXPECT_TRUE(read_full(sock, c.r.data(), kRLen));
    EXPECT_TRUE(read_full(sock, c.d.data(), kDLen));
    char ack = 0;
    EXPECT_TRUE(read_full(sock, &ack, 1));
    return c;
  }

  // The target's buffers are exactly as it filled them.
  void expect_untouched() {
    Contents c = contents();
    EXPECT_EQ(check_pattern(c.a.data(), kALen, 11), kALen);
    EXPECT_EQ(check_pattern(c.r.data(), kRLen, 12), kRLen);
    EXPECT_EQ(check_pattern(c.d.data(), kDLen, 13), kDLen);
  }

  ibv_wc one(SendWr& w) {
    EXPECT_EQ(post_send(s.qp, w), 0);
    ibv_wc wc{};
    EXPECT_TRUE(poll_wc(s.scq, &wc));
    return wc;
  }
};

TEST_F(DirectPath, WriteReadAtomicsAcrossProcesses) {
  ASSERT_NO_FATAL_FAILURE(connect());
  const uint64_t ops_before = my_counter(&core::Counters::direct_ops);
  const uint64_t tx_before = my_counter(&core::Counters::tx_packets);
  // WRITE 60 KiB + 13 B at an odd offset, from two SGEs.
  fill_pattern(src->data, kALen, 21);
  SendWr w(1, IBV_WR_RDMA_WRITE, {src->sge(0, 1000), src->sge(1000, 60 * 1024 + 13 - 1000)});
  w.rdma(peer.a_addr + 7, peer.a_rkey);
  ibv_wc wc = one(w);
  expect_wc(wc, {.wr_id = 1, .opcode = IBV_WC_RDMA_WRITE, .qp_num = s.qpn()});
  // READ the read-only region.
  SendWr r(2, IBV_WR_RDMA_READ, {dst->sge(3, kRLen)});
  r.rdma(peer.r_addr, peer.r_rkey);
  wc = one(r);
  expect_wc(wc, {.wr_id = 2, .opcode = IBV_WC_RDMA_READ, .byte_len = kRLen, .qp_num = s.qpn()});
  EXPECT_EQ(check_pattern(dst->data + 3, kRLen, 12), kRLen);
  // Atomics on the last word of A (which the WRITE did not reach).
  const size_t word = kALen - 8;
  Contents before = contents();
  uint64_t orig;
  std::memcpy(&orig, before.a.data() + word, 8);
  SendWr fa(3, IBV_WR_ATOMIC_FETCH_AND_ADD, {dst->sge(0, 8)});
  fa.fetch_add(peer.a_addr + word, peer.a_rkey, 5);
  wc = one(fa);
  expect_wc(wc, {.wr_id = 3, .opcode = IBV_WC_FETCH_ADD, .byte_len = 8, .qp_num = s.qpn()});
  EXPECT_EQ(dst->u64(0), orig);
  SendWr cs(4, IBV_WR_ATOMIC_CMP_AND_SWP, {dst->sge(8, 8)});
  cs.cmp_swp(peer.a_addr + word, peer.a_rkey, orig + 5, 0x1122334455667788ull);
  wc = one(cs);
  expect_wc(wc, {.wr_id = 4, .opcode = IBV_WC_COMP_SWAP, .byte_len = 8, .qp_num = s.qpn()});
  EXPECT_EQ(dst->u64(8), orig + 5);
  SendWr cs2(5, IBV_WR_ATOMIC_CMP_AND_SWP, {dst->sge(16, 8)});
  cs2.cmp_swp(peer.a_addr + word, peer.a_rkey, 1, 2);  // compare fails: no swap
  wc = one(cs2);
  expect_wc(wc, {.wr_id = 5, .opcode = IBV_WC_COMP_SWAP, .qp_num = s.qpn()});
  EXPECT_EQ(dst->u64(16), 0x1122334455667788ull);

  Contents c = contents();
  EXPECT_EQ(check_pattern(c.a.data(), 7, 11), 7u) << "bytes before the WRITE";
  EXPECT_EQ(check_pattern(c.a.data() + 7, 60 * 1024 + 13, 21), 60u * 1024 + 13);
  EXPECT_EQ(check_pattern(c.a.data() + 7 + 60 * 1024 + 13, word - (7 + 60 * 1024 + 13), 11, 7 + 60 * 1024 + 13),
            word - (7 + 60 * 1024 + 13))
      << "bytes after the WRITE";
  uint64_t now;
  std::memcpy(&now, c.a.data() + word, 8);
  EXPECT_EQ(now, 0x1122334455667788ull);
  EXPECT_EQ(check_pattern(c.r.data(), kRLen, 12), kRLen);
  if (direct_expected()) {
    EXPECT_EQ(my_counter(&core::Counters::direct_ops) - ops_before, 5u) << "every operation on the direct path";
    EXPECT_EQ(my_counter(&core::Counters::tx_packets), tx_before) << "and no packet";
  }
}

// ATOMIC WRITE to another process: one aligned 8-byte store into its memory, the bytes around it
// untouched; on the direct path without a packet. A misaligned one goes by packets and is refused.
TEST_F(DirectPath, AtomicWriteAcrossProcesses) {
  ASSERT_NO_FATAL_FAILURE(connect());
  const uint64_t ops_before = my_counter(&core::Counters::direct_ops);
  const uint64_t tx_before = my_counter(&core::Counters::tx_packets);
  src->u64(0) = 0x0102030405060708ull;
  SendWr aw(1, IBV_WR_ATOMIC_WRITE, {src->sge(0, 8)});
  aw.rdma(peer.a_addr + 4096, peer.a_rkey);
  expect_wc(one(aw), {.wr_id = 1, .opcode = IBV_WC_ATOMIC_WRITE, .qp_num = s.qpn()});
  Contents c = contents();
  uint64_t now;
  std::memcpy(&now, c.a.data() + 4096, 8);
  EXPECT_EQ(now, 0x0102030405060708ull);
  EXPECT_EQ(check_pattern(c.a.data(), 4096, 11), 4096u) << "bytes before it";
  EXPECT_EQ(check_pattern(c.a.data() + 4104, kALen - 4104, 11, 4104), kALen - 4104) << "bytes after it";
  if (direct_expected()) {
    EXPECT_EQ(my_counter(&core::Counters::direct_ops) - ops_before, 1u) << "on the direct path";
    EXPECT_EQ(my_counter(&core::Counters::tx_packets), tx_before) << "and no packet";
  }
  SendWr bad(2, IBV_WR_ATOMIC_WRITE, {src->sge(0, 8)});
  bad.rdma(peer.a_addr + 4100, peer.a_rkey);
  expect_wc(one(bad), {.wr_id = 2, .status = IBV_WC_REM_INV_REQ_ERR, .qp_num = s.qpn()});
}

// Memory the target cannot share (a private file mapping) is still reached without packets for WRITE
// and READ, by process_vm_writev/readv; an ATOMIC on it must be atomic with the target's own CPU
// atomics and goes by packets. The data is the same either way.
TEST_F(DirectPath, UnshareableMemoryWriteReadThroughTheKernel) {
  ASSERT_NO_FATAL_FAILURE(connect());
  const uint64_t ops_before = my_counter(&core::Counters::direct_ops);
  const uint64_t tx_before = my_counter(&core::Counters::tx_packets);
  fill_pattern(src->data, kALen, 23);
  SendWr w(1, IBV_WR_RDMA_WRITE, {src->sge(0, 1000), src->sge(1000, 2000)});
  w.rdma(peer.p_addr + 5, peer.p_rkey);
  expect_wc(one(w), {.wr_id = 1, .opcode = IBV_WC_RDMA_WRITE, .qp_num = s.qpn()});
  SendWr r(2, IBV_WR_RDMA_READ, {dst->sge(0, 100), dst->sge(100, 8092)});
  r.rdma(peer.p_addr + 4096, peer.p_rkey);
  expect_wc(one(r), {.wr_id = 2, .opcode = IBV_WC_RDMA_READ, .byte_len = 8192, .qp_num = s.qpn()});
  EXPECT_EQ(check_pattern(dst->data, 8192, 14, 4096), 8192u) << "READ of P";
  const uint64_t ops_after_rw = my_counter(&core::Counters::direct_ops);
  const uint64_t tx_after_rw = my_counter(&core::Counters::tx_packets);
  SendWr fa(3, IBV_WR_ATOMIC_FETCH_AND_ADD, {dst->sge(0, 8)});
  fa.fetch_add(peer.p_addr + kPLen - 8, peer.p_rkey, 9);
  expect_wc(one(fa), {.wr_id = 3, .opcode = IBV_WC_FETCH_ADD, .byte_len = 8, .qp_num = s.qpn()});
  std::vector<uint8_t> pc(kPLen);
  char cmd = 'p';
  ASSERT_TRUE(write_full(sock, &cmd, 1));
  ASSERT_TRUE(read_full(sock, pc.data(), kPLen));
  char ack = 0;
  ASSERT_TRUE(read_full(sock, &ack, 1));
  uint64_t orig;
  std::vector<uint8_t> expect(kPLen);
  fill_pattern(expect.data(), kPLen, 14);
  std::memcpy(&orig, expect.data() + kPLen - 8, 8);
  EXPECT_EQ(dst->u64(0), orig) << "FETCH_ADD's original value";
  EXPECT_EQ(check_pattern(pc.data(), 5, 14), 5u) << "bytes before the WRITE";
  EXPECT_EQ(check_pattern(pc.data() + 5, 3000, 23), 3000u) << "the WRITE";
  EXPECT_EQ(check_pattern(pc.data() + 3005, kPLen - 8 - 3005, 14, 3005), kPLen - 8 - 3005) << "bytes after it";
  uint64_t word;
  std::memcpy(&word, pc.data() + kPLen - 8, 8);
  EXPECT_EQ(word, orig + 9);
  if (direct_expected()) {
    EXPECT_EQ(ops_after_rw - ops_before, 2u) << "WRITE and READ without packets";
    EXPECT_EQ(tx_after_rw, tx_before);
    EXPECT_GT(my_counter(&core::Counters::tx_packets), tx_after_rw) << "the ATOMIC by packets";
  }
}

TEST_F(DirectPath, WrongRkeyIsRemoteAccessError) {
  ASSERT_NO_FATAL_FAILURE(connect());
  fill_pattern(src->data, kALen, 22);
  SendWr w(1, IBV_WR_RDMA_WRITE, {src->sge(0, 64)});
  w.rdma(peer.a_addr, peer.a_rkey ^ 0x100);
  ibv_wc wc = one(w);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  expect_untouched();
}

TEST_F(DirectPath, OutOfRangeIsRemoteAccessError) {
  ASSERT_NO_FATAL_FAILURE(connect());
  fill_pattern(src->data, kALen, 23);
  // Ends 8 bytes past A: the in-range part is not written either.
  SendWr w(1, IBV_WR_RDMA_WRITE, {src->sge(0, 16)});
  w.rdma(peer.a_addr + kALen - 8, peer.a_rkey);
  ibv_wc wc = one(w);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  expect_untouched();
}

TEST_F(DirectPath, ReadOutOfRangeIsRemoteAccessError) {
  ASSERT_NO_FATAL_FAILURE(connect());
  std::memset(dst->data, 0xEE, kALen);
  SendWr r(1, IBV_WR_RDMA_READ, {dst->sge(0, 64)});
  r.rdma(peer.r_addr - 32, peer.r_rkey);
  ibv_wc wc = one(r);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(dst->data[i], 0xEE) << "byte " << i << " of the local buffer";
}

TEST_F(DirectPath, WriteWithoutRemoteWriteIsRemoteAccessError) {
  ASSERT_NO_FATAL_FAILURE(connect());
  fill_pattern(src->data, kALen, 24);
  SendWr w(1, IBV_WR_RDMA_WRITE, {src->sge(0, 64)});
  w.rdma(peer.r_addr, peer.r_rkey);
  ibv_wc wc = one(w);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  expect_untouched();
}

// Access flags changed in RTS by themselves (no state change) bind the next request, as a responder's
// check of its QP's flags does: a WRITE after REMOTE_WRITE was taken away is a remote access error, on
// a connection whose earlier WRITE went through (the initiator had the target's memory mapped already).
TEST_F(DirectPath, RemoteWriteRevokedInRtsIsRemoteAccessError) {
  ASSERT_NO_FATAL_FAILURE(connect());
  fill_pattern(src->data, kALen, 11);  // the target's own pattern: this WRITE changes nothing
  SendWr w1(1, IBV_WR_RDMA_WRITE, {src->sge(0, 64)});
  w1.rdma(peer.a_addr, peer.a_rkey);
  ibv_wc wc = one(w1);
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  ASSERT_NO_FATAL_FAILURE(command('w'));
  fill_pattern(src->data, kALen, 25);
  SendWr w2(2, IBV_WR_RDMA_WRITE, {src->sge(0, 64)});
  w2.rdma(peer.a_addr + 4096, peer.a_rkey);
  wc = one(w2);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  expect_untouched();
}

TEST_F(DirectPath, AtomicWithoutRemoteAtomicIsRemoteAccessError) {
  ASSERT_NO_FATAL_FAILURE(connect());
  SendWr fa(1, IBV_WR_ATOMIC_FETCH_AND_ADD, {dst->sge(0, 8)});
  fa.fetch_add(peer.r_addr, peer.r_rkey, 1);
  ibv_wc wc = one(fa);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  expect_untouched();
}

TEST_F(DirectPath, DeregisteredRegionIsRemoteAccessError) {
  ASSERT_NO_FATAL_FAILURE(connect());
  const uint64_t ops_before = my_counter(&core::Counters::direct_ops);
  // Used once while registered, so the initiator holds a mapping of it.
  fill_pattern(src->data, kDLen, 13);
  SendWr w0(1, IBV_WR_RDMA_WRITE, {src->sge(0, kDLen)});
  w0.rdma(peer.d_addr, peer.d_rkey);
  ibv_wc wc = one(w0);
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  if (direct_expected()) {
    EXPECT_EQ(my_counter(&core::Counters::direct_ops) - ops_before, 1u);
  }
  ASSERT_NO_FATAL_FAILURE(command('d'));
  fill_pattern(src->data, kALen, 25);
  SendWr w(2, IBV_WR_RDMA_WRITE, {src->sge(0, 64)});
  w.rdma(peer.d_addr, peer.d_rkey);
  wc = one(w);
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  expect_untouched();
}

TEST_F(DirectPath, DestroyedQpIsRetryExceeded) {
  conn.timeout = 10;  // ~4 ms per try
  conn.retry_cnt = 2;
  ASSERT_NO_FATAL_FAILURE(connect());
  ASSERT_NO_FATAL_FAILURE(command('q'));
  fill_pattern(src->data, kALen, 26);
  SendWr w(1, IBV_WR_RDMA_WRITE, {src->sge(0, 64)});
  w.rdma(peer.a_addr, peer.a_rkey);
  ibv_wc wc = one(w);
  EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << ibv_wc_status_str(wc.status);
  expect_untouched();
}

// A send-queue slot is the application's again only once its completion, or a later one of the same
// send queue, has been polled (ibv_post_send(3)): also when the operation is done at once (on the direct
// path, inside ibv_post_send), for unsignaled WRs, and for WRs flushed in error.
TEST_F(DirectPath, SendQueueSlotsReturnWhenCompletionsArePolled) {
  qcfg.max_send_wr = 4;
  ASSERT_NO_FATAL_FAILURE(connect());
  const uint32_t depth = s.cap.max_send_wr;
  ASSERT_GE(depth, 4u);
  fill_pattern(src->data, 64, 27);
  auto write = [&](uint64_t id, unsigned flags) {
    SendWr w(id, IBV_WR_RDMA_WRITE, {src->sge(0, 8)}, flags);
    w.rdma(peer.a_addr, peer.a_rkey);
    return post_send(s.qp, w);
  };
  for (uint32_t i = 0; i + 1 < depth; ++i) ASSERT_EQ(write(i, 0), 0) << "unsignaled WR " << i;
  ASSERT_EQ(write(100, IBV_SEND_SIGNALED), 0);
  EXPECT_EQ(write(101, IBV_SEND_SIGNALED), ENOMEM) << "full until a completion is polled";
  ibv_wc wc{};
  ASSERT_TRUE(poll_wc(s.scq, &wc));
  expect_wc(wc, {.wr_id = 100, .opcode = IBV_WC_RDMA_WRITE, .qp_num = s.qpn()});
  // That one completion gave back its own slot and those of the unsignaled WRs before it.
  for (uint32_t i = 0; i < depth; ++i) ASSERT_EQ(write(200 + i, IBV_SEND_SIGNALED), 0) << "WR " << i;
  EXPECT_EQ(write(300, IBV_SEND_SIGNALED), ENOMEM);
  ASSERT_TRUE(poll_wc(s.scq, &wc));
  expect_wc(wc, {.wr_id = 200, .opcode = IBV_WC_RDMA_WRITE, .qp_num = s.qpn()});
  EXPECT_EQ(write(301, IBV_SEND_SIGNALED), 0) << "one polled completion, one slot";
  EXPECT_EQ(write(302, IBV_SEND_SIGNALED), ENOMEM);
  // Flushed WRs hold their slots until their flush completions are polled too.
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(s.qp, &attr, IBV_QP_STATE), 0);
  EXPECT_EQ(write(400, 0), ENOMEM);
  auto wcs = poll_wcs(s.scq, depth);
  ASSERT_EQ(wcs.size(), depth);
  for (uint32_t i = 0; i + 1 < depth; ++i)
    EXPECT_EQ(wcs[i].wr_id, 201 + i) << "completions in order";
  EXPECT_EQ(wcs[depth - 1].wr_id, 301u);
  for (uint32_t i = 0; i < depth; ++i) ASSERT_EQ(write(500 + i, 0), 0) << "posted in error, WR " << i;
  EXPECT_EQ(write(600, 0), ENOMEM);
  wcs = poll_wcs(s.scq, depth);
  ASSERT_EQ(wcs.size(), depth);
  for (uint32_t i = 0; i < depth; ++i) {
    EXPECT_EQ(wcs[i].wr_id, 500 + i);
    EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << ibv_wc_status_str(wcs[i].status);
  }
  EXPECT_EQ(write(601, 0), 0);
}

}  // namespace
}  // namespace softrdma::verbs_test
