// fuzz_responder: hostile packets through one transport::Engine's whole receive path (parse, ICRC,
// P_Key, QPN lookup, responder and completer) via Engine::inject_datagram.
//
// Input format:
//   byte 0  WQEs posted before the packets: bit0 READ (2500 B), bit1 FETCH_ADD, bit2 CMP_SWAP,
//           bit3 SEND (100 B), bit4 WRITE (1500 B); bits 5..7: receive WQEs to post (0..7)
//   byte 1  bit0: PSNs just below the 24-bit wrap; bits 1..2: path MTU 1024/256/4096/512;
//           bit3: QP grants only REMOTE_READ (remote write/atomic must be refused: then only the
//           receive WQEs' SGEs and the posted READ/ATOMIC destinations may change)
//   then packets, each [ctl][len_hi][len_lo][len bytes] (len capped by what is left):
//     ctl bit0  keep BTH dest QP (else patched to the QP's QPN)
//     ctl bit1  keep PSN (else base + (psn & 0xF) - 4; base = expected PSN for requests, oldest
//               unacknowledged PSN for responses)
//     ctl bit2  patch RETH/AtomicETH rkey to the MR's and VA into [iova, iova + 64 KiB + 16)
//     ctl bit3  keep TVer and P_Key (else TVer 0, P_Key 0xFFFF)
//     ctl bit4  keep the ICRC bytes (else recomputed, so the packet reaches the transport)
//     ctl bit5  with bit2: leave the atomic VA unaligned
//     ctl bit6  before this packet: deregister the MR and poison its buffer (ASan), so any later
//               access through a pointer the engine kept is reported (use after deregistration)
//     ctl bit7  before this packet: register the buffer again (fresh keys)
// Each input starts from a fresh QP (RESET -> INIT -> RTR -> RTS, WQEs re-posted); a QP that goes to
// error is brought up again the same way, so later packets still reach deep states.
//
// Invariants: no sanitizer report; the guard bytes around the registered buffer never change; with
// config bit3, no byte outside what the local WQEs name changes (remote write/atomic are refused).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>
#include <algorithm>
#include <sanitizer/asan_interface.h>
#include <sched.h>

#include "config/config.h"
#include "core/cq.h"
#include "core/mr.h"
#include "net/interfaces.h"
#include "net/registry.h"
#include "transport/engine.h"
#include "transport/qp.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace {

using namespace softrdma;
using transport::QpState;

constexpr size_t kGuard = 4096;
constexpr size_t kBufLen = 64 * 1024;
constexpr uint64_t kIova = 0x40000000;  // != host address: catches code that uses one for the other
constexpr uint32_t kPd = 7;
constexpr uint8_t kGuardByte = 0xA5;
constexpr uint32_t kRqPsn = 0x100, kSqPsn = 0x200;
constexpr uint32_t kWrapRqPsn = 0xFFFFFE, kWrapSqPsn = 0xFFFFFD;
constexpr uint32_t kMaxPacket = 4096 + 128;

struct Harness {
  std::unique_ptr<transport::Engine> engine;
  std::unique_ptr<core::CompletionQueue> send_cq, recv_cq;
  uint8_t* storage = nullptr;  // guard | registered buffer | guard
  uint8_t* buf = nullptr;
  core::MrRegion mr{};
  transport::Qp* qp = nullptr;
  int sink_fd = -1;       // where the engine's ACKs, NAKs and responses go
  uint16_t sink_port = 0;
  uint32_t peer_qpn = 0;  // registered at the sink, so the engine resolves it there and not to 4791
  wire::IpAddress loopback = wire::IpAddress::v4(htonl(INADDR_LOOPBACK));

  bool mr_live = true;
  uint32_t deregistrations = 0;
  uint8_t post_flags = 0, cfg_flags = 0;
};

Harness* h = nullptr;
// FUZZ_VERBOSE=1: trace each packet and CQE (to check by hand that the seeds reach what they claim).
bool verbose = false;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_responder: invariant violated: %s\n", what);
  abort();
}

void drain() {
  core::Cqe c[64];
  for (core::CompletionQueue* cq : {h->send_cq.get(), h->recv_cq.get()}) {
    for (int n; (n = cq->poll(c, 64)) > 0;)
      for (int i = 0; verbose && i < n; ++i)
        std::fprintf(stderr, "  CQE %s wr_id %lu status %u opcode %u len %u\n",
                     cq == h->send_cq.get() ? "send" : "recv", static_cast<unsigned long>(c[i].wr_id),
                     static_cast<unsigned>(c[i].status), static_cast<unsigned>(c[i].opcode), c[i].byte_len);
  }
  uint8_t junk[kMaxPacket];
  while (recv(h->sink_fd, junk, sizeof junk, MSG_DONTWAIT) > 0) {
  }
}

// ibv_dereg_mr while operations are in flight: the application may unmap the memory at once, so
// from here on the engine must not touch it. Poisoning makes ASan report any access it still makes.
void deregister() {
  if (!h->mr_live) return;
  h->engine->deregister_mr(h->mr);
  h->mr_live = false;
  ++h->deregistrations;
  ASAN_POISON_MEMORY_REGION(h->buf, kBufLen);
}

void reregister() {
  if (h->mr_live) return;
  ASAN_UNPOISON_MEMORY_REGION(h->buf, kBufLen);
  if (!h->engine->register_mr(h->mr)) fail("register_mr again");
  h->mr_live = true;
}

transport::SendWqe send_wqe(transport::WrOp op, uint64_t local_off, uint32_t len) {
  transport::SendWqe w{};
  w.wr_id = static_cast<uint64_t>(op);
  w.op = op;
  w.flags = transport::kSignaled;
  w.remote_addr = 0x1000;
  w.rkey = 0x1234;
  w.num_sge = 1;
  w.length = len;
  w.sge[0] = {kIova + local_off, len, h->mr.lkey};
  return w;
}

// RESET -> INIT -> RTR -> RTS with the attributes the input selects, then the input's WQEs.
void bring_up() {
  transport::Engine& e = *h->engine;
  const bool wrap = h->cfg_flags & 1;
  static constexpr uint32_t kMtus[4] = {1024, 256, 4096, 512};

  transport::QpModify m{};
  m.mask = transport::kModState;
  m.state = QpState::Reset;
  e.modify_qp(h->qp, m);
  drain();
  reregister();

  m = {};
  m.mask = transport::kModState | transport::kModAccessFlags | transport::kModPkeyIndex | transport::kModPort;
  m.state = QpState::Init;
  m.access_flags = (h->cfg_flags & 8) ? core::kLocalWrite | core::kRemoteRead
                                      : core::kLocalWrite | core::kRemoteWrite | core::kRemoteRead |
                                            core::kRemoteAtomic;
  e.modify_qp(h->qp, m);

  // Receive WQEs: mostly two SGEs (3 KiB); #5 has a bad lkey, #6 holds only 64 bytes.
  const int nrecv = h->post_flags >> 5;
  for (int i = 0; i < nrecv; ++i) {
    transport::RecvWqe r{};
    r.wr_id = 100 + static_cast<uint64_t>(i);
    uint64_t base = kIova + static_cast<uint64_t>(i) * 4096;
    if (i == 6) {
      r.num_sge = 1;
      r.sge[0] = {base, 64, h->mr.lkey};
      r.length = 64;
    } else {
      r.num_sge = 2;
      uint32_t lkey = i == 5 ? h->mr.lkey ^ 1 : h->mr.lkey;
      r.sge[0] = {base, 1024, lkey};
      r.sge[1] = {base + 2048, 2048, lkey};
      r.length = 3072;
    }
    int bad = 0;
    if (e.post_recv(h->qp, &r, 1, &bad) != 0) fail("post_recv refused");
  }

  m = {};
  m.mask = transport::kModState | transport::kModAv | transport::kModPathMtu | transport::kModDestQpn |
           transport::kModRqPsn | transport::kModMaxDestRdAtomic | transport::kModMinRnrTimer;
  m.state = QpState::Rtr;
  m.mtu_bytes = kMtus[(h->cfg_flags >> 1) & 3];
  m.dest_qpn = h->peer_qpn;
  m.dest_ip = h->loopback;
  m.rq_psn = wrap ? kWrapRqPsn : kRqPsn;
  m.max_dest_rd_atomic = 4;
  m.min_rnr_timer = 1;
  e.modify_qp(h->qp, m);

  m = {};
  m.mask = transport::kModState | transport::kModSqPsn | transport::kModTimeout | transport::kModRetryCnt |
           transport::kModRnrRetry | transport::kModMaxQpRdAtomic;
  m.state = QpState::Rts;
  m.sq_psn = wrap ? kWrapSqPsn : kSqPsn;
  m.timeout = 0;  // no retransmit timer: what happens depends on the input, not on the clock
  m.retry_cnt = 7;
  m.rnr_retry = 3;
  m.max_rd_atomic = 4;
  e.modify_qp(h->qp, m);

  transport::SendWqe wqes[5];
  int n = 0;
  if (h->post_flags & 1) wqes[n++] = send_wqe(transport::WrOp::Read, 0x8000, 2500);
  if (h->post_flags & 2) {
    wqes[n] = send_wqe(transport::WrOp::FetchAdd, 0x9000, 8);
    wqes[n++].compare_add = 1;
  }
  if (h->post_flags & 4) {
    wqes[n] = send_wqe(transport::WrOp::CompareSwap, 0x9008, 8);
    wqes[n++].swap = 5;
  }
  if (h->post_flags & 8) wqes[n++] = send_wqe(transport::WrOp::Send, 0xA000, 100);
  if (h->post_flags & 16) wqes[n++] = send_wqe(transport::WrOp::Write, 0xB000, 1500);
  if (n) {
    int bad = 0;
    if (e.post_send(h->qp, wqes, n, &bad) != 0) fail("post_send refused");
    // Wait (bounded) until the requester has sent them, so the completer has PSNs to match.
    core::Cqe c[8];
    for (int spin = 0; spin < 100000 && h->qp->req.send_index < h->qp->sq.head.load(); ++spin) {
      e.poll_cq(h->send_cq.get(), c, 8);
      sched_yield();
    }
  }
}

void patch_and_inject(uint8_t ctl, uint8_t* pkt, uint32_t len) {
  transport::Qp& qp = *h->qp;
  if (len >= wire::kBthLen) {
    if (!(ctl & 8)) {
      pkt[1] &= 0xF0;  // TVer 0
      pkt[2] = pkt[3] = 0xFF;
    }
    if (!(ctl & 1)) {
      pkt[5] = static_cast<uint8_t>(qp.qpn >> 16);
      pkt[6] = static_cast<uint8_t>(qp.qpn >> 8);
      pkt[7] = static_cast<uint8_t>(qp.qpn);
    }
    const wire::OpcodeInfo& info = wire::opcode_info(pkt[0]);
    if (!(ctl & 2)) {
      bool response = info.kind == wire::OpKind::Ack || info.kind == wire::OpKind::AtomicAck ||
                      info.kind == wire::OpKind::ReadResponse;
      uint32_t base = response ? qp.comp.acked_psn : qp.resp.epsn;
      uint32_t psn = wire::psn_add(base, static_cast<uint32_t>((pkt[11] & 0xF) - 4) & wire::kPsnMask);
      pkt[9] = static_cast<uint8_t>(psn >> 16);
      pkt[10] = static_cast<uint8_t>(psn >> 8);
      pkt[11] = static_cast<uint8_t>(psn);
    }
    if ((ctl & 4) && info.valid && (info.headers & (wire::kHdrReth | wire::kHdrAtomicEth))) {
      size_t off = wire::kBthLen + ((info.headers & wire::kHdrDeth) ? wire::kDethLen : 0);
      if (len >= off + 12) {
        uint64_t va = 0;
        for (int i = 0; i < 8; ++i) va = va << 8 | pkt[off + i];
        va = kIova + va % (kBufLen + 16);
        if ((info.headers & wire::kHdrAtomicEth) && !(ctl & 32)) va &= ~uint64_t{7};
        for (int i = 7; i >= 0; --i, va >>= 8) pkt[off + i] = static_cast<uint8_t>(va);
        uint32_t rkey = h->mr.rkey;
        for (int i = 3; i >= 0; --i, rkey >>= 8) pkt[off + 8 + i] = static_cast<uint8_t>(rkey);
      }
    }
  }
  if (!(ctl & 16) && len >= wire::kBthLen + wire::kIcrcLen) {
    wire::UdpAddr addr{h->loopback, h->engine->interface().ip, h->sink_port, h->engine->udp_port()};
    wire::append_icrc(addr, pkt, len - wire::kIcrcLen);
  }
  h->engine->inject_datagram(pkt, len, h->loopback, h->sink_port);
  if (verbose)
    std::fprintf(stderr, "pkt %s len %u psn %06x -> state %d epsn %06x msn %u acked %06x next %06x\n",
                 len ? wire::opcode_info(pkt[0]).name : "-", len,
                 len >= 12 ? unsigned{pkt[9]} << 16 | unsigned{pkt[10]} << 8 | pkt[11] : 0u,
                 static_cast<int>(qp.state.load()), qp.resp.epsn, qp.resp.msn, qp.comp.acked_psn, qp.req.next_psn);
}

void check_guards() {
  for (size_t i = 0; i < kGuard; ++i) {
    if (h->storage[i] != kGuardByte) fail("byte before the registered buffer changed");
    if (h->buf[kBufLen + i] != kGuardByte) fail("byte after the registered buffer changed");
  }
}

// Config bit3: the QP has no REMOTE_WRITE/REMOTE_ATOMIC, so only local WQEs may have put data in the
// (zeroed) buffer: receive SGEs, and READ/ATOMIC result buffers of posted send WQEs.
void check_untouched() {
  static bool allowed[kBufLen];
  std::memset(allowed, 0, sizeof allowed);
  auto allow = [](uint64_t off, uint64_t len) { std::memset(allowed + off, 1, len); };
  const int nrecv = h->post_flags >> 5;
  for (int i = 0; i < nrecv; ++i) {
    uint64_t base = static_cast<uint64_t>(i) * 4096;
    if (i == 6) {
      allow(base, 64);
    } else {
      allow(base, 1024);
      allow(base + 2048, 2048);
    }
  }
  if (h->post_flags & 1) allow(0x8000, 2500);
  if (h->post_flags & 2) allow(0x9000, 8);
  if (h->post_flags & 4) allow(0x9008, 8);
  for (size_t i = 0; i < kBufLen; ++i)
    if (h->buf[i] != 0 && !allowed[i]) {
      std::fprintf(stderr, "offset 0x%zx changed\n", i);
      fail("a QP without REMOTE_WRITE/ATOMIC had memory outside its local WQEs changed");
    }
}

void setup() {
  // A private registry: our QPNs and the sink's never mix with other softrdma processes' traffic.
  setenv("SOFTRDMA_REGISTRY", "softrdma-registry-fuzz", 0);
  verbose = getenv("FUZZ_VERBOSE") != nullptr;
  h = new Harness;
  // A device context's options, but the progress thread blocks at once instead of spinning.
  transport::EngineOptions opts = transport::context_options(config::parse());
  opts.spin_us = 0;
  h->engine = std::make_unique<transport::Engine>(net::list_interfaces().back(), std::move(opts));

  h->sink_fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = h->engine->interface().ip.v4_be();
  socklen_t sl = sizeof sa;
  if (h->sink_fd < 0 || bind(h->sink_fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      getsockname(h->sink_fd, reinterpret_cast<sockaddr*>(&sa), &sl) != 0)
    fail("cannot bind the sink socket");
  h->sink_port = ntohs(sa.sin_port);
  h->peer_qpn = net::Registry::instance().allocate_qpn(h->engine->interface().ip, h->sink_port);
  if (!h->peer_qpn) fail("registry full");

  h->send_cq = h->engine->create_cq(256, nullptr);
  h->recv_cq = h->engine->create_cq(256, nullptr);
  h->storage = static_cast<uint8_t*>(aligned_alloc(4096, kGuard * 2 + kBufLen));
  std::memset(h->storage, kGuardByte, kGuard * 2 + kBufLen);
  h->buf = h->storage + kGuard;
  h->mr = {reinterpret_cast<uint64_t>(h->buf), kIova, kBufLen,
           core::kLocalWrite | core::kRemoteWrite | core::kRemoteRead | core::kRemoteAtomic, kPd, 0, 0};
  if (!h->engine->register_mr(h->mr)) fail("register_mr");

  transport::QpConfig cfg{};
  cfg.pd = kPd;
  cfg.send_cq = h->send_cq.get();
  cfg.recv_cq = h->recv_cq.get();
  cfg.max_send_wr = 16;
  cfg.max_recv_wr = 16;
  cfg.max_send_sge = 4;
  cfg.max_recv_sge = 4;
  h->qp = h->engine->create_qp(cfg);
  if (!h->qp) fail("create_qp");
}

void teardown() {
  h->engine->destroy_qp(h->qp);
  net::Registry::instance().release_qpn(h->peer_qpn);
  close(h->sink_fd);
  h->send_cq.reset();
  h->recv_cq.reset();
  h->engine.reset();  // joins the progress thread
  ASAN_UNPOISON_MEMORY_REGION(h->buf, kBufLen);
  free(h->storage);
  delete h;
  h = nullptr;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!h) {
    setup();
    static bool once = [] { return atexit([] { if (h) teardown(); }) == 0; }();
    (void)once;
  }
  // The key table keeps a tombstone per deregistered key and never reclaims them, so lookups slow
  // down after ~10^5 deregistrations (see the report): start over with a fresh engine now and then.
  if (h->deregistrations >= 20000) {
    teardown();
    setup();
  }
  if (size < 2) return 0;
  h->post_flags = data[0];
  h->cfg_flags = data[1];
  reregister();
  std::memset(h->buf, 0, kBufLen);
  bring_up();

  size_t pos = 2;
  while (pos + 3 <= size) {
    uint8_t ctl = data[pos];
    size_t len = static_cast<size_t>(data[pos + 1]) << 8 | data[pos + 2];
    pos += 3;
    len = std::min({len, size - pos, size_t{kMaxPacket}});
    // Exactly len bytes on the heap, so ASan sees any read past the datagram.
    std::vector<uint8_t> pkt(data + pos, data + pos + len);
    pos += len;
    if (ctl & 64) deregister();
    if (ctl & 128) reregister();
    patch_and_inject(ctl, pkt.data(), static_cast<uint32_t>(len));
    if (h->send_cq->in_error() || h->recv_cq->in_error()) fail("CQ overrun (harness drains too rarely)");
    if (h->qp->state.load() == QpState::Err) {
      if (verbose) drain();
      bring_up();
    }
  }
  check_guards();
  reregister();
  if (h->cfg_flags & 8) check_untouched();
  drain();
  return 0;
}
