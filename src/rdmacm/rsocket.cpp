// The rsocket API (rdma/rsocket.h, rsocket(7)): stream sockets over RC QPs and datagram sockets
// over UD QPs, speaking rdma-core's rsocket protocol (rsocket_wire.h) so that either end may be
// rdma-core's librdmacm. Built, as rdma-core builds it, on the public rdma_cm and verbs API only, so
// it runs over every softrdma path.
//
// A stream, each direction: the receiver grants halves of its receive buffer (SGL updates written
// into the sender's target SGL) and message credits (its receive queue); the sender RDMA WRITEs data
// WITH IMMEDIATE (length in the immediate) at the granted address, in order, and the receiver copies
// out. docs/rdmacm.md ("rsockets") says what is and is not supported.
#include <dirent.h>
#include <endian.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "rdmacm/event_channel.h"
#include "rdmacm/rsocket_wire.h"

#define SOFTRDMA_EXPORT extern "C" __attribute__((visibility("default")))

namespace softrdma::rsock {
namespace {

// An int, not the enum: ibv_reg_mr() is a macro that ORs its access with an enum of another type,
// which clang rejects (-Wdeprecated-enum-enum-conversion).
constexpr int kLocalWrite = IBV_ACCESS_LOCAL_WRITE;

// rdma-core's defaults (and its configuration files' names under /etc/rdma/rsocket).
struct Defaults {
  uint16_t inline_size = 64;
  uint16_t sq_size = 384;
  uint16_t rq_size = 384;
  uint32_t mem = 1 << 17;   // receive buffer
  uint32_t wmem = 1 << 17;  // send buffer
  uint16_t iomap_size = 0;
  uint32_t polling_us = 10;
};

constexpr uint32_t kOlapStart = 2048;  // first transfer of a send; doubles up to kMaxTransfer
constexpr uint32_t kMaxTransfer = 65536;
constexpr uint32_t kSndLowat = 2048;
constexpr uint16_t kQpMin = 16;
constexpr uint16_t kQpMax = 0xFFFE;
constexpr unsigned kCtrlSlots = 4;  // control messages in flight (power of 2)
constexpr uint32_t kCtrlMsgMax = sizeof(Sge);
constexpr uint64_t kRecvFlag = uint64_t{1} << 63;
constexpr uint64_t kMsgSendFlag = uint64_t{1} << 62;  // the SEND that carries a message (iWARP)
constexpr int kTableSize = 1 << 16;
// A thread asleep on an rsocket's channels looks at its CQ again after this long even when nothing
// woke it: another thread may have read the event it waited for, and an intra-host message published
// while the CQ was being armed can leave no wake-up (the arm places the inboxes only when the engine
// lock is free, transport/engine.cpp arm_cq), which left rstream -T b asleep beside a ready CQE.
constexpr int kRepollMs = 20;

const Defaults& defaults() {
  static const Defaults d = [] {
    Defaults v;
    auto read = [](const char* name, auto& out) {
      char path[128];
      snprintf(path, sizeof path, "/etc/rdma/rsocket/%s", name);
      if (FILE* f = fopen(path, "r")) {
        unsigned long x;
        if (fscanf(f, "%lu", &x) == 1) out = static_cast<std::remove_reference_t<decltype(out)>>(x);
        fclose(f);
      }
    };
    read("polling_time", v.polling_us);
    read("inline_default", v.inline_size);
    read("sqsize_default", v.sq_size);
    read("rqsize_default", v.rq_size);
    read("mem_default", v.mem);
    read("wmem_default", v.wmem);
    read("iomap_size", v.iomap_size);
    v.mem = std::max<uint32_t>(v.mem, 1);
    if (v.wmem < kSndLowat) v.wmem = kSndLowat << 1;
    v.iomap_size = static_cast<uint16_t>(value_of(static_cast<uint8_t>(scale_of(v.iomap_size, 8)), 8));
    return v;
  }();
  return d;
}

// Connection states, ordered as rdma-core orders them (passive < opening < connected < closed).
enum State : int {
  kInit = 0,
  kBound = 0x1,
  kListening = 0x2,
  kOpening = 0x4,
  kResolvingAddr = kOpening | 0x10,
  kResolvingRoute = kOpening | 0x20,
  kConnecting = kOpening | 0x40,
  kConnected = 0x100,
  kWritable = 0x200,
  kReadable = 0x400,
  kConnectRdwr = kConnected | kReadable | kWritable,
  kConnectError = 0x800,
  kDisconnected = 0x1000,
  kError = 0x2000,
};

struct IomapMr {
  uint64_t offset = 0;
  ibv_mr* mr = nullptr;
  int index = -1;  // slot in the peer's table; -1 for a read-only (local) mapping
};

struct RMsg {
  uint32_t op;
  uint32_t data;
};

// Page-aligned and zeroed, as rdma-core's fork-safe buffers.
struct Buffer {
  uint8_t* p = nullptr;
  size_t len = 0;
  bool alloc(size_t n) {
    len = (n + 4095) & ~size_t{4095};
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return false;
    p = static_cast<uint8_t*>(m);
    return true;
  }
  void release() {
    if (p) munmap(p, len);
    p = nullptr;
  }
};

// Datagram rsockets: one UD QP per local address a peer is reached from, and per peer address the
// QP it sends to (learnt over UDP) and an address handle.
struct DgQp {
  rdma_cm_id* id = nullptr;
  ibv_comp_channel* cch = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* smr = nullptr;  // the rsocket's send slots, registered with this QP's PD
  ibv_mr* rmr = nullptr;
  Buffer rbuf;  // rq_size receive slots of kDgramMsgSize, then the GRH every receive writes
  DgramHeader hdr{};
  sockaddr_storage src{};
  bool cq_armed = false;
  unsigned unacked_events = 0;
};
struct DgDest {
  sockaddr_storage addr{};
  DgQp* qp = nullptr;
  ibv_ah* ah = nullptr;
  uint32_t qpn = 0;
};
struct DgMsg {
  DgQp* qp;
  uint32_t offset;
  uint32_t length;
};
struct UdpDelivered {  // a payload that came over UDP (before the sender knew our QP)
  std::vector<uint8_t> data;
  sockaddr_storage src;
};

struct Rs {
  int type = SOCK_STREAM;
  int index = -1;
  std::mutex slock, rlock;  // one sender, one receiver at a time (stream order)
  std::mutex mu;            // everything below
  std::mutex wait_mu;       // one thread blocked on the channels at a time
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  ibv_comp_channel* cch = nullptr;
  ibv_cq* cq = nullptr;
  int state = kInit;
  int err = 0;
  int fs_flags = 0, fd_flags = 0;
  uint64_t so_opts = 0, tcp_opts = 0, ipv6_opts = 0;
  int ipv4_opts = 0;
  unsigned keepalive_time = 0;
  bool swap = false;  // the peer's byte order differs (SGL and iomap entries)
  // iWARP has no immediate data: each message goes as a 4-byte SEND (after its data's RDMA WRITE),
  // received into a slot after the receive buffer (rdma-core's RS_OPT_MSG_SEND).
  bool msg_send = false;
  uint32_t rbuf_msg_index = 0;
  bool cq_armed = false;
  unsigned unacked_events = 0;

  uint32_t sbuf_size, rbuf_size;
  uint16_t sq_size, rq_size, sq_inline, target_iomap_size;

  // Requester side.
  unsigned ctrl_seqno = 0, ctrl_max_seqno = kCtrlSlots;
  uint16_t sseq_no = 0, sseq_comp = 0;
  int sqe_avail = 0;
  uint32_t sbuf_bytes_avail = 0;
  Buffer sbuf;  // sbuf_size bytes of data, then kCtrlSlots control messages
  ibv_mr* smr = nullptr;
  ibv_sge ssgl[2]{};
  int target_sge = 0;
  Buffer target;  // the peer writes here: kSglSize Sge, then the iomap table
  ibv_mr* target_mr = nullptr;
  volatile Sge* target_sgl = nullptr;
  Iomap* target_iomap = nullptr;
  int remote_sge = 1;
  Sge remote_sgl{}, remote_iomap{};

  // Responder side.
  uint16_t rseq_no = 0, rseq_comp = 0;
  Buffer rbuf;
  ibv_mr* rmr = nullptr;
  uint32_t rbuf_bytes_avail = 0, rbuf_free_offset = 0, rbuf_offset = 0;
  std::vector<RMsg> rmsg;  // rq_size + 1
  int rmsg_head = 0, rmsg_tail = 0;

  // Datagram sockets: index is the UDP socket.
  int udp = -1;
  std::vector<std::unique_ptr<DgQp>> qps;
  std::vector<std::unique_ptr<DgDest>> dests;
  DgDest* conn_dest = nullptr;
  Buffer dsbuf;                     // sq_size send slots
  std::vector<uint32_t> smsg_free;  // offsets of free send slots
  std::vector<DgMsg> dmsg;          // rq_size + 1, head/tail as rmsg
  int rqe_avail = 0;
  std::deque<UdpDelivered> delivered;

  // riomap.
  std::vector<IomapMr> remote_iomappings;  // writable maps, by the peer's table index
  std::list<IomapMr> local_iomappings;     // read-only ones
  std::vector<int> iomap_queue;            // indices still to announce
};

std::atomic<Rs*> g_table[kTableSize];

int fail(int e) {
  errno = e;
  return -1;
}

Rs* lookup(int fd) { return fd >= 0 && fd < kTableSize ? g_table[fd].load(std::memory_order_acquire) : nullptr; }

Rs* alloc_rs(const Rs* parent) {
  auto* rs = new Rs;
  const Defaults& d = defaults();
  rs->sbuf_size = parent ? parent->sbuf_size : d.wmem;
  rs->rbuf_size = parent ? parent->rbuf_size : d.mem;
  rs->sq_inline = parent ? parent->sq_inline : d.inline_size;
  rs->sq_size = parent ? parent->sq_size : d.sq_size;
  rs->rq_size = parent ? parent->rq_size : d.rq_size;
  rs->target_iomap_size = parent ? parent->target_iomap_size : d.iomap_size;
  if (parent) {
    rs->fs_flags = parent->fs_flags;
    rs->fd_flags = parent->fd_flags;
  }
  return rs;
}

int set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

// The highest fd open in this process, or -1 when /proc does not tell.
int highest_open_fd() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  const int own = dirfd(d);
  int hi = -1;
  while (const dirent* e = readdir(d)) {
    char* end = nullptr;
    const long v = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && v != own) hi = std::max(hi, static_cast<int>(v));
  }
  closedir(d);
  return hi;
}

// An rsocket's number must come after every fd open when it is made. rdma-core's librspreload (as
// Debian 12 ships it) opens a real fd for each socket, then makes the rsocket behind it, and its
// select() finds which of its fds maps to an rsocket by scanning upwards from 0: a number below its
// own fd is met first, taken for a plain fd, and the scan runs past FD_SETSIZE (iperf3 aborted:
// "bit out of range 0 - FD_SETSIZE on fd_set"). The kernel hands out the lowest free fd, and one
// that another thread (ours: the CM's and the link monitor's transient sockets) closed in between
// is lower. Returns the number to ask for, or 0 when the fd is already the highest.
int number_above_open_fds(int fd) {
  const int hi = highest_open_fd();
  return hi > fd ? hi + 1 : 0;
}

// Its own event channel, whose fd is the rsocket's number (unique among the process's fds, so
// rpoll can tell rsockets from other fds). Always O_NONBLOCK: blocking waits poll it.
bool open_channel(Rs* rs) {
  rs->ch = rdma_create_event_channel();
  if (!rs->ch || set_nonblock(rs->ch->fd)) return false;
  if (const int min = number_above_open_fds(rs->ch->fd); min && rdmacm::renumber_event_channel(rs->ch, min) < 0)
    return false;
  rs->index = rs->ch->fd;
  return rs->index < kTableSize;
}

void dgram_release(Rs* rs);

void release(Rs* rs) {
  if (rs->index >= 0 && lookup(rs->index) == rs) g_table[rs->index].store(nullptr, std::memory_order_release);
  if (rs->type == SOCK_DGRAM) dgram_release(rs);
  for (auto& m : rs->remote_iomappings)
    if (m.mr) ibv_dereg_mr(m.mr);
  for (auto& m : rs->local_iomappings) ibv_dereg_mr(m.mr);
  if (rs->id && rs->id->qp) rdma_destroy_qp(rs->id);
  if (rs->cq) {
    if (rs->unacked_events) ibv_ack_cq_events(rs->cq, rs->unacked_events);
    ibv_destroy_cq(rs->cq);
  }
  if (rs->cch) ibv_destroy_comp_channel(rs->cch);
  for (ibv_mr* mr : {rs->smr, rs->rmr, rs->target_mr})
    if (mr) ibv_dereg_mr(mr);
  rs->sbuf.release();
  rs->rbuf.release();
  rs->target.release();
  if (rs->id) rdma_destroy_id(rs->id);
  if (rs->ch) rdma_destroy_event_channel(rs->ch);
  delete rs;
}

bool nonblocking(const Rs* rs, int flags) { return (rs->fs_flags & O_NONBLOCK) || (flags & MSG_DONTWAIT); }

// ---- the QP and its buffers ----

// A receive for one message: no buffer (the immediate is the message), or its SEND's slot.
int post_recv(Rs* rs) {
  ibv_recv_wr wr{}, *bad;
  ibv_sge sge;
  wr.wr_id = kRecvFlag;
  if (rs->msg_send) {
    wr.wr_id |= rs->rbuf_msg_index;
    sge = {reinterpret_cast<uintptr_t>(rs->rbuf.p + rs->rbuf_size + rs->rbuf_msg_index * sizeof(uint32_t)),
           sizeof(uint32_t), rs->rmr->lkey};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (++rs->rbuf_msg_index == rs->rq_size) rs->rbuf_msg_index = 0;
  }
  return ibv_post_recv(rs->id->qp, &wr, &bad);
}

// A non-blocking completion channel and a CQ of n entries on it, on the id's device.
bool make_cq(rdma_cm_id* id, int n, void* ctx, ibv_comp_channel*& cch, ibv_cq*& cq) {
  cch = ibv_create_comp_channel(id->verbs);
  if (!cch || set_nonblock(cch->fd)) return false;
  cq = ibv_create_cq(id->verbs, n, ctx, cch, 0);
  return cq != nullptr;
}

// The id's QP (every send signalled) on cq; the socket's inline size becomes what the QP got.
bool make_qp(Rs* rs, rdma_cm_id* id, ibv_cq* cq, void* ctx, ibv_qp_type type, uint32_t send_sge, uint32_t recv_sge) {
  ibv_qp_init_attr qa{};
  qa.qp_context = ctx;
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = type;
  qa.sq_sig_all = 1;
  qa.cap.max_send_wr = rs->sq_size;
  qa.cap.max_recv_wr = rs->rq_size;
  qa.cap.max_send_sge = send_sge;
  qa.cap.max_recv_sge = recv_sge;
  qa.cap.max_inline_data = rs->sq_inline;
  if (rdma_create_qp(id, nullptr, &qa)) return false;
  rs->sq_inline = static_cast<uint16_t>(std::min<uint32_t>(qa.cap.max_inline_data, kQpMax));
  return true;
}

int create_ep(Rs* rs) {
  ibv_device_attr da{};
  uint16_t max = kQpMax;
  if (ibv_query_device(rs->id->verbs, &da) == 0) max = static_cast<uint16_t>(std::min<int>(da.max_qp_wr, kQpMax));
  rs->sq_size = std::clamp<uint16_t>(rs->sq_size, kQpMin, max);
  rs->rq_size = std::clamp<uint16_t>(rs->rq_size, kQpMin, max);
  if (rs->id->verbs->device->transport_type == IBV_TRANSPORT_IWARP) {
    rs->msg_send = true;
    rs->sq_inline = std::max<uint16_t>(rs->sq_inline, sizeof(uint32_t));
  }
  if (!make_cq(rs->id, rs->sq_size + rs->rq_size, rs, rs->cch, rs->cq) ||
      !make_qp(rs, rs->id, rs->cq, rs, IBV_QPT_RC, 2, 1))
    return -1;
  if (rs->msg_send && rs->sq_inline < sizeof(uint32_t)) return fail(ENOTSUP);
  ibv_pd* pd = rs->id->qp->pd;

  rs->rmsg.assign(rs->rq_size + 1u, RMsg{});
  const uint32_t total_sbuf = rs->sbuf_size + kCtrlMsgMax * kCtrlSlots;
  if (!rs->sbuf.alloc(total_sbuf)) return fail(ENOMEM);
  if (!(rs->smr = ibv_reg_mr(pd, rs->sbuf.p, total_sbuf, kLocalWrite))) return -1;
  const size_t tlen = sizeof(Sge) * kSglSize + sizeof(Iomap) * rs->target_iomap_size;
  if (!rs->target.alloc(tlen)) return fail(ENOMEM);
  if (!(rs->target_mr = ibv_reg_mr(pd, rs->target.p, tlen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)))
    return -1;
  rs->target_sgl = reinterpret_cast<volatile Sge*>(rs->target.p);
  if (rs->target_iomap_size) rs->target_iomap = reinterpret_cast<Iomap*>(rs->target.p + sizeof(Sge) * kSglSize);
  const uint32_t total_rbuf = rs->rbuf_size + (rs->msg_send ? rs->rq_size * sizeof(uint32_t) : 0);
  if (!rs->rbuf.alloc(total_rbuf)) return fail(ENOMEM);
  if (!(rs->rmr = ibv_reg_mr(pd, rs->rbuf.p, total_rbuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)))
    return -1;

  rs->ssgl[0].addr = rs->ssgl[1].addr = reinterpret_cast<uintptr_t>(rs->sbuf.p);
  rs->ssgl[0].lkey = rs->ssgl[1].lkey = rs->smr->lkey;
  rs->sbuf_bytes_avail = rs->sbuf_size;
  rs->rbuf_free_offset = rs->rbuf_size >> 1;
  rs->rbuf_bytes_avail = rs->rbuf_size >> 1;
  rs->sqe_avail = rs->sq_size - static_cast<int>(rs->ctrl_max_seqno);
  rs->rseq_comp = rs->rq_size >> 1;
  for (int i = 0; i < rs->rq_size; ++i)
    if (int e = post_recv(rs)) return fail(e);
  return 0;
}

void format_conn_data(const Rs* rs, ConnData& c) {
  std::memset(&c, 0, sizeof c);
  c.version = kVersion;
  c.flags = kConnFlagIomap | (__BYTE_ORDER == __BIG_ENDIAN ? kConnFlagNet : 0);
  c.credits_be = htobe16(rs->rq_size);
  c.target_iomap_size = static_cast<uint8_t>(scale_of(rs->target_iomap_size, 8));
  c.target_sgl.addr = htobe64(reinterpret_cast<uintptr_t>(rs->target.p));
  c.target_sgl.length = htobe32(kSglSize);
  c.target_sgl.key = htobe32(rs->target_mr->rkey);
  c.data_buf.addr = htobe64(reinterpret_cast<uintptr_t>(rs->rbuf.p));
  c.data_buf.length = htobe32(rs->rbuf_size >> 1);
  c.data_buf.key = htobe32(rs->rmr->rkey);
}

// Connection parameters carrying this socket's connection data (in cd).
rdma_conn_param conn_param(const Rs* rs, ConnData& cd) {
  format_conn_data(rs, cd);
  rdma_conn_param p{};
  p.private_data = &cd;
  p.private_data_len = sizeof cd;
  p.flow_control = 1;
  p.rnr_retry_count = 7;
  return p;
}

void save_conn_data(Rs* rs, const ConnData& c) {
  rs->remote_sgl.addr = be64toh(c.target_sgl.addr);
  rs->remote_sgl.length = be32toh(c.target_sgl.length);
  rs->remote_sgl.key = be32toh(c.target_sgl.key);
  rs->remote_sge = 1;
  rs->swap = ((c.flags & kConnFlagNet) != 0) != (__BYTE_ORDER == __BIG_ENDIAN);
  if (c.flags & kConnFlagIomap) {
    rs->remote_iomap.addr = rs->remote_sgl.addr + sizeof(Sge) * rs->remote_sgl.length;
    rs->remote_iomap.length = static_cast<uint32_t>(value_of(c.target_iomap_size, 8));
    rs->remote_iomap.key = rs->remote_sgl.key;
  }
  rs->target_sgl[0].addr = be64toh(c.data_buf.addr);
  rs->target_sgl[0].length = be32toh(c.data_buf.length);
  rs->target_sgl[0].key = be32toh(c.data_buf.key);
  rs->sseq_comp = be16toh(c.credits_be);
}

// ---- posting ----

int post_send(Rs* rs, ibv_send_wr& wr) {
  ibv_send_wr* bad;
  if (int e = ibv_post_send(rs->id->qp, &wr, &bad)) return fail(e);
  return 0;
}

// A message with no data: an RDMA WRITE WITH IMMEDIATE of length 0, or (iWARP) a SEND of the
// message in the sender's byte order.
// wr_id: what the completion accounts for (the message itself unless given).
int post_msg(Rs* rs, uint32_t m, uint64_t wr_id = ~uint64_t{0}) {
  ibv_send_wr wr{};
  ibv_sge sge{reinterpret_cast<uintptr_t>(&m), sizeof m, 0};
  wr.wr_id = wr_id == ~uint64_t{0} ? m : wr_id;
  if (rs->msg_send) {
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_INLINE;
  } else {
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htobe32(m);
  }
  return post_send(rs, wr);
}

int post_write(Rs* rs, ibv_sge* sgl, int nsge, uint32_t tag, bool with_imm, int flags, uint64_t addr,
               uint32_t rkey) {
  ibv_send_wr wr{};
  wr.wr_id = tag;
  wr.sg_list = sgl;
  wr.num_sge = nsge;
  const bool imm = with_imm && !rs->msg_send;
  wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = flags;
  if (imm) wr.imm_data = htobe32(tag);
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  if (int ret = post_send(rs, wr)) return ret;
  // iWARP: the message follows its data (its completion returns no buffer bytes).
  return with_imm && rs->msg_send ? post_msg(rs, tag, msg(msg_op(tag), 0) | kMsgSendFlag) : 0;
}

uint32_t sbuf_left(const Rs* rs) {
  return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(rs->sbuf.p + rs->sbuf_size) - rs->ssgl[0].addr);
}

// Stages len bytes (copied by copy(dst, n)) in the send ring and posts them: inline when small,
// else one or two SGEs of the ring (wrapping at its end).
template <typename Copy, typename Post>
int stage_and_post(Rs* rs, uint32_t len, bool inline_ok, Copy copy, Post post) {
  if (len <= sbuf_left(rs)) {
    copy(reinterpret_cast<uint8_t*>(rs->ssgl[0].addr), len);
    rs->ssgl[0].length = len;
    int ret = post(rs->ssgl, 1, inline_ok && len <= rs->sq_inline ? IBV_SEND_INLINE : 0);
    if (len < sbuf_left(rs))
      rs->ssgl[0].addr += len;
    else
      rs->ssgl[0].addr = reinterpret_cast<uintptr_t>(rs->sbuf.p);
    return ret;
  }
  rs->ssgl[0].length = sbuf_left(rs);
  copy(reinterpret_cast<uint8_t*>(rs->ssgl[0].addr), rs->ssgl[0].length);
  rs->ssgl[1].length = len - rs->ssgl[0].length;
  copy(rs->sbuf.p, rs->ssgl[1].length);
  int ret = post(rs->ssgl, 2, inline_ok && len <= rs->sq_inline ? IBV_SEND_INLINE : 0);
  rs->ssgl[0].addr = reinterpret_cast<uintptr_t>(rs->sbuf.p) + rs->ssgl[1].length;
  return ret;
}

// Posts len bytes of a flat buffer: inline from it when small, else staged in the send ring.
template <typename Post>
int post_flat(Rs* rs, const uint8_t* p, uint32_t len, Post post) {
  if (len <= rs->sq_inline) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(p), len, 0};
    return post(&sge, 1, IBV_SEND_INLINE);
  }
  return stage_and_post(
      rs, len, false,
      [&](uint8_t* dst, size_t n) {
        std::memcpy(dst, p, n);
        p += n;
      },
      post);
}

// The next transfer of a send: small first (so the peer starts copying out early), doubling.
uint32_t next_xfer(uint32_t& olen, size_t left) {
  if (olen >= left) return static_cast<uint32_t>(left);
  const uint32_t x = olen;
  if (olen < kMaxTransfer) olen <<= 1;
  return x;
}

// DATA into the current target SGL entry, which is advanced first (the peer may refill it).
int write_data(Rs* rs, ibv_sge* sgl, int nsge, uint32_t len, int flags) {
  rs->sseq_no++;
  rs->sqe_avail -= rs->msg_send ? 2 : 1;
  rs->sbuf_bytes_avail -= len;
  volatile Sge& t = rs->target_sgl[rs->target_sge];
  const uint64_t addr = t.addr;
  const uint32_t rkey = t.key;
  t.addr = addr + len;
  t.length = t.length - len;
  if (t.length == 0 && ++rs->target_sge == static_cast<int>(kSglSize)) rs->target_sge = 0;
  return post_write(rs, sgl, nsge, msg(kOpData, len), true, flags, addr, rkey);
}

uint64_t swap64_if(bool s, uint64_t v) { return s ? __builtin_bswap64(v) : v; }
uint32_t swap32_if(bool s, uint32_t v) { return s ? __builtin_bswap32(v) : v; }

bool ctrl_avail(const Rs* rs) { return rs->ctrl_seqno != rs->ctrl_max_seqno; }
// A credit update may take two control slots (iWARP: a WRITE and its message).
bool credit_slots(const Rs* rs) {
  return rs->msg_send ? static_cast<int>(rs->ctrl_seqno + 1 - rs->ctrl_max_seqno) < 0 : ctrl_avail(rs);
}

// Grants the peer credits up to rseq_no + rq_size and, when half the receive buffer is free, that
// half (an SGL update written into the peer's target SGL).
void send_credits(Rs* rs) {
  rs->ctrl_seqno++;
  rs->rseq_comp = static_cast<uint16_t>(rs->rseq_no + (rs->rq_size >> 1));
  const uint32_t m = msg(kOpSgl, static_cast<uint32_t>(rs->rseq_no) + rs->rq_size);
  if (rs->rbuf_bytes_avail < (rs->rbuf_size >> 1)) {
    post_msg(rs, m);
    return;
  }
  if (rs->msg_send) rs->ctrl_seqno++;  // the WRITE and its message
  Sge sge;
  sge.addr = swap64_if(rs->swap, reinterpret_cast<uintptr_t>(rs->rbuf.p + rs->rbuf_free_offset));
  sge.key = swap32_if(rs->swap, rs->rmr->rkey);
  sge.length = swap32_if(rs->swap, rs->rbuf_size >> 1);
  ibv_sge ib{};
  ib.length = sizeof sge;
  int flags = 0;
  if (rs->sq_inline >= sizeof sge) {
    ib.addr = reinterpret_cast<uintptr_t>(&sge);
    flags = IBV_SEND_INLINE;
  } else {
    uint8_t* slot = rs->sbuf.p + rs->sbuf_size + kCtrlMsgMax * (rs->ctrl_seqno & (kCtrlSlots - 1));
    std::memcpy(slot, &sge, sizeof sge);
    ib.addr = reinterpret_cast<uintptr_t>(slot);
    ib.lkey = rs->smr->lkey;
  }
  post_write(rs, &ib, 1, m, true, flags, rs->remote_sgl.addr + rs->remote_sge * sizeof(Sge), rs->remote_sgl.key);
  rs->rbuf_bytes_avail -= rs->rbuf_size >> 1;
  rs->rbuf_free_offset += rs->rbuf_size >> 1;
  if (rs->rbuf_free_offset >= rs->rbuf_size) rs->rbuf_free_offset = 0;
  if (++rs->remote_sge == static_cast<int>(rs->remote_sgl.length)) rs->remote_sge = 0;
}

void update_credits(Rs* rs) {
  const bool due = rs->rbuf_bytes_avail >= (rs->rbuf_size >> 1) ||
                   static_cast<int16_t>(rs->rseq_no - rs->rseq_comp) >= 0;  // modulo 2^16
  if (due && credit_slots(rs) && (rs->state & kConnected)) send_credits(rs);
}

// ---- completions ----

void poll_cq(Rs* rs) {
  ibv_wc wcs[16];
  int n, reposts = 0;
  while ((n = ibv_poll_cq(rs->cq, 16, wcs)) > 0) {
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[i];
      if (wc.wr_id & kRecvFlag) {
        if (wc.status != IBV_WC_SUCCESS) continue;
        reposts++;
        uint32_t m;
        if (wc.wc_flags & IBV_WC_WITH_IMM)
          m = be32toh(wc.imm_data);
        else
          std::memcpy(&m, rs->rbuf.p + rs->rbuf_size + static_cast<uint32_t>(wc.wr_id) * sizeof m, sizeof m);
        switch (msg_op(m)) {
          case kOpSgl:
            rs->sseq_comp = static_cast<uint16_t>(msg_data(m));
            break;
          case kOpIomapSgl:  // the peer's table changed; riowrite reads it when used
          case kOpWrite:
            break;
          case kOpCtrl:
            if (msg_data(m) == kCtrlDisconnect) {
              rs->state = kDisconnected;
            } else if (msg_data(m) == kCtrlShutdown) {
              if (rs->state & kWritable)
                rs->state &= ~kReadable;
              else
                rs->state = kDisconnected;
            }
            break;
          default:
            rs->rmsg[rs->rmsg_tail] = RMsg{msg_op(m), msg_data(m)};
            if (++rs->rmsg_tail == rs->rq_size + 1) rs->rmsg_tail = 0;
            break;
        }
      } else {
        const uint32_t tag = static_cast<uint32_t>(wc.wr_id);
        switch (msg_op(tag)) {
          case kOpSgl:
            rs->ctrl_max_seqno++;
            break;
          case kOpCtrl:
            rs->ctrl_max_seqno++;
            if (msg_data(tag) == kCtrlDisconnect) rs->state = kDisconnected;
            break;
          case kOpIomapSgl:
            rs->sqe_avail++;
            if (!(wc.wr_id & kMsgSendFlag)) rs->sbuf_bytes_avail += sizeof(Iomap);
            break;
          default:
            rs->sqe_avail++;
            rs->sbuf_bytes_avail += msg_data(tag);
            break;
        }
        if (wc.status != IBV_WC_SUCCESS && (rs->state & kConnected)) {
          rs->state = kError;
          rs->err = EIO;
        }
      }
    }
  }
  if (!(rs->state & kConnected)) return;
  while (reposts-- > 0) {
    if (int e = post_recv(rs)) {
      rs->state = kError;
      rs->err = e;
      return;
    }
  }
}

void process_cq(Rs* rs) {
  if (!rs->cq) return;
  update_credits(rs);
  poll_cq(rs);
  update_credits(rs);
}

// Events of a connected (or closing) rsocket's id: a DREQ from the peer ends the connection after
// what it sent before is read.
void drain_cm(Rs* rs) {
  rdma_cm_event* ev;
  while (rdma_get_cm_event(rs->ch, &ev) == 0) {
    const rdma_cm_event_type t = ev->event;
    rdma_ack_cm_event(ev);
    if ((t == RDMA_CM_EVENT_DISCONNECTED || t == RDMA_CM_EVENT_DEVICE_REMOVAL) && (rs->state & kConnected)) {
      process_cq(rs);
      rs->state = kDisconnected;
    }
  }
}

// Reads a completion channel's events (acked 64 at a time); true when there were any, so the CQ is
// no longer armed.
bool drain_channel(ibv_comp_channel* ch, ibv_cq* cq, unsigned& unacked) {
  bool any = false;
  ibv_cq* c;
  void* ctx;
  while (ibv_get_cq_event(ch, &c, &ctx) == 0) {
    any = true;
    if (++unacked >= 64u) {
      ibv_ack_cq_events(cq, unacked);
      unacked = 0;
    }
  }
  return any;
}

void drain_cq_events(Rs* rs) {
  if (drain_channel(rs->cch, rs->cq, rs->unacked_events)) rs->cq_armed = false;
}

uint64_t now_us() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// Waits (with rs->mu held by lock) until test(rs): polls the CQ, spins polling_time, then arms the CQ
// and sleeps on the completion and CM channels. EWOULDBLOCK when nonblock and not ready.
template <typename Test>
int wait(Rs* rs, std::unique_lock<std::mutex>& lock, bool nonblock, Test test) {
  const uint64_t start = now_us();
  for (;;) {
    process_cq(rs);
    if (test(rs)) return 0;
    if (nonblock) return fail(EWOULDBLOCK);
    if (now_us() - start <= defaults().polling_us) continue;
    if (!rs->cq_armed) {
      ibv_req_notify_cq(rs->cq, 0);
      rs->cq_armed = true;
      continue;
    }
    lock.unlock();
    int n;
    {
      std::lock_guard w(rs->wait_mu);
      pollfd p[2] = {{rs->cch->fd, POLLIN, 0}, {rs->ch->fd, POLLIN, 0}};
      n = poll(p, 2, kRepollMs);
    }
    const int e = errno;
    lock.lock();
    if (n < 0 && e == EINTR) return fail(EINTR);  // a signal ends a blocking call, as on a kernel socket
    drain_cq_events(rs);
    drain_cm(rs);
  }
}

bool have_rdata(const Rs* rs) { return rs->rmsg_head != rs->rmsg_tail; }
bool conn_have_rdata(const Rs* rs) { return have_rdata(rs) || !(rs->state & kReadable); }
bool can_send(const Rs* rs) {
  return rs->sqe_avail >= (rs->msg_send ? 2 : 1) && rs->sbuf_bytes_avail >= kSndLowat && rs->sseq_no != rs->sseq_comp &&
         rs->target_sgl[rs->target_sge].length != 0;
}
bool conn_can_send(const Rs* rs) { return can_send(rs) || !(rs->state & kWritable); }
bool all_sends_done(const Rs* rs) {
  return static_cast<int>(rs->ctrl_max_seqno - rs->ctrl_seqno) + rs->sqe_avail == rs->sq_size ||
         !(rs->state & kConnected);
}

// ---- connecting ----

int cm_errno(const rdma_cm_event& ev) {
  switch (ev.event) {
    case RDMA_CM_EVENT_REJECTED:
      return ECONNREFUSED;
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
      return ETIMEDOUT;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return EHOSTUNREACH;
    default:
      return ev.status < 0 ? -ev.status : ECONNREFUSED;
  }
}

// The next event of a connecting id: 0 and the event, or -1 (EWOULDBLOCK when nonblock).
int next_event(Rs* rs, bool nonblock, rdma_cm_event** ev) {
  for (;;) {
    if (rdma_get_cm_event(rs->ch, ev) == 0) return 0;
    if (errno != EAGAIN || nonblock) return -1;
    pollfd p{rs->ch->fd, POLLIN, 0};
    if (poll(&p, 1, -1) < 0 && errno == EINTR) return -1;
  }
}

// Drives an active open one step at a time (as far as it goes without waiting when nonblock).
int do_connect(Rs* rs, bool nonblock) {
  for (;;) {
    switch (rs->state) {
      case kInit:
      case kBound:
        if (rdma_resolve_addr(rs->id, nullptr, &rs->id->route.addr.dst_addr, 2000)) goto error;
        rs->state = kResolvingAddr;
        break;
      case kResolvingAddr:
      case kResolvingRoute:
      case kConnecting: {
        rdma_cm_event* ev;
        if (next_event(rs, nonblock, &ev)) {
          if (errno == EAGAIN) return fail(EINPROGRESS);
          if (errno == EINTR) return -1;  // the open goes on; a later call finishes it
          goto error;
        }
        const rdma_cm_event_type t = ev->event;
        const int e = cm_errno(*ev);
        ConnData cd{};
        const bool have_cd = ev->param.conn.private_data && ev->param.conn.private_data_len >= sizeof cd;
        if (have_cd) std::memcpy(&cd, ev->param.conn.private_data, sizeof cd);
        rdma_ack_cm_event(ev);
        if (rs->state == kResolvingAddr && t == RDMA_CM_EVENT_ADDR_RESOLVED) {
          if (rdma_resolve_route(rs->id, 2000)) goto error;
          rs->state = kResolvingRoute;
        } else if (rs->state == kResolvingRoute && t == RDMA_CM_EVENT_ROUTE_RESOLVED) {
          if (create_ep(rs)) goto error;
          ConnData req;
          rdma_conn_param param = conn_param(rs, req);
          param.retry_count = 7;
          if (rs->msg_send) param.initiator_depth = 1;  // as rdma-core: iWARP may READ while connecting
          if (rdma_connect(rs->id, &param)) goto error;
          rs->state = kConnecting;
        } else if (rs->state == kConnecting && t == RDMA_CM_EVENT_ESTABLISHED) {
          if (!have_cd || cd.version != kVersion) {
            errno = ENOTSUP;
            goto error;
          }
          save_conn_data(rs, cd);
          rs->state = kConnectRdwr;
          return 0;
        } else {
          errno = e;
          goto error;
        }
        break;
      }
      case kConnectError:
      case kDisconnected:
      case kError:
        return fail(ENOTCONN);
      default:
        return (rs->state & kConnected) ? 0 : fail(EINVAL);
    }
  }
error:
  rs->state = kConnectError;
  rs->err = errno;
  return -1;
}

// rsend/rrecv on a socket still opening: one more step of the open.
int finish_open(Rs* rs, int flags) {
  if (!(rs->state & kOpening)) return 0;
  std::lock_guard lock(rs->mu);
  if (do_connect(rs, nonblocking(rs, flags)) == 0) return 0;
  if (errno == EINPROGRESS) errno = EAGAIN;
  return -1;
}

template <typename Fn>
auto with_rs(int socket, Fn fn) -> decltype(fn(static_cast<Rs*>(nullptr))) {
  Rs* rs = lookup(socket);
  if (!rs) return fail(EBADF);
  return fn(rs);
}

// ---- data ----

// Copies received data out of the ring (or only looks, for MSG_PEEK).
size_t copy_out(Rs* rs, uint8_t* buf, size_t len, bool peek) {
  size_t left = len;
  int head = rs->rmsg_head;
  uint32_t offset = rs->rbuf_offset;
  while (left && head != rs->rmsg_tail) {
    uint32_t rsize;
    if (left < rs->rmsg[head].data) {
      rsize = static_cast<uint32_t>(left);
      if (!peek) rs->rmsg[head].data -= rsize;
    } else {
      rsize = rs->rmsg[head].data;
      if (!peek) rs->rseq_no++;
      if (++head == rs->rq_size + 1) head = 0;
    }
    left -= rsize;
    while (rsize) {
      const uint32_t chunk = std::min(rsize, rs->rbuf_size - offset);
      std::memcpy(buf, rs->rbuf.p + offset, chunk);
      buf += chunk;
      rsize -= chunk;
      offset += chunk;
      if (!peek) rs->rbuf_bytes_avail += chunk;
      if (offset == rs->rbuf_size) offset = 0;
    }
  }
  if (!peek) {
    rs->rmsg_head = head;
    rs->rbuf_offset = offset;
  }
  return len - left;
}

ssize_t recv_stream(Rs* rs, void* buf, size_t len, int flags) {
  if (finish_open(rs, flags)) return -1;
  std::lock_guard rl(rs->rlock);
  std::unique_lock lock(rs->mu);
  size_t done = 0;
  int ret = 0;
  do {
    if (!have_rdata(rs) && (ret = wait(rs, lock, nonblocking(rs, flags), conn_have_rdata))) break;
    if (flags & MSG_PEEK) {
      done = copy_out(rs, static_cast<uint8_t*>(buf), len, true);
      break;
    }
    done += copy_out(rs, static_cast<uint8_t*>(buf) + done, len - done, false);
  } while (done < len && (flags & MSG_WAITALL) && (rs->state & kReadable));
  update_credits(rs);
  return ret && done == 0 ? ret : static_cast<ssize_t>(done);
}

// Gathers from an iovec array (the cursor moves as bytes are taken).
struct IovCursor {
  const iovec* iov;
  size_t off = 0;
  void take(uint8_t* dst, size_t n) {
    while (n) {
      const size_t c = std::min(n, iov->iov_len - off);
      std::memcpy(dst, static_cast<const uint8_t*>(iov->iov_base) + off, c);
      dst += c;
      n -= c;
      off += c;
      if (off == iov->iov_len) {
        ++iov;
        off = 0;
      }
    }
  }
};

// Waits until a message may go: 0, or -1 (EWOULDBLOCK, ECONNRESET once the socket cannot send).
int wait_sendable(Rs* rs, std::unique_lock<std::mutex>& lock, int flags) {
  if (can_send(rs)) return 0;
  if (int ret = wait(rs, lock, nonblocking(rs, flags), conn_can_send)) return ret;
  return (rs->state & kWritable) ? 0 : fail(ECONNRESET);
}

int send_iomaps(Rs* rs, std::unique_lock<std::mutex>& lock, int flags);

ssize_t send_stream(Rs* rs, const iovec* iov, int iovcnt, int flags) {
  if (finish_open(rs, flags)) return -1;
  size_t len = 0;
  for (int i = 0; i < iovcnt; ++i) len += iov[i].iov_len;
  std::lock_guard sl(rs->slock);
  std::unique_lock lock(rs->mu);
  if (!(rs->state & kWritable))  // shut down here (EPIPE), by the peer or an error, or never connected
    return fail((rs->state & kConnected) ? EPIPE : (rs->state & (kDisconnected | kError)) ? ECONNRESET : ENOTCONN);
  int ret = 0;
  if (!rs->iomap_queue.empty() && (ret = send_iomaps(rs, lock, flags))) return ret;
  IovCursor cur{iov};
  while (cur.iov->iov_len == 0 && len) ++cur.iov;
  size_t left = len;
  uint32_t olen = kOlapStart;
  const bool single = iovcnt == 1;
  while (left) {
    if ((ret = wait_sendable(rs, lock, flags))) break;
    uint32_t xfer = next_xfer(olen, left);
    xfer = std::min({xfer, rs->sbuf_bytes_avail, static_cast<uint32_t>(rs->target_sgl[rs->target_sge].length)});
    auto post = [&](ibv_sge* sgl, int n, int fl) { return write_data(rs, sgl, n, xfer, fl); };
    if (single && xfer <= rs->sq_inline) {
      // Straight from the caller's buffer: an inline send copies it at post time.
      ibv_sge sge{reinterpret_cast<uintptr_t>(static_cast<const uint8_t*>(cur.iov->iov_base) + cur.off), xfer, 0};
      ret = write_data(rs, &sge, 1, xfer, IBV_SEND_INLINE);
      cur.off += xfer;
    } else {
      ret = stage_and_post(rs, xfer, !single, [&](uint8_t* dst, size_t n) { cur.take(dst, n); }, post);
    }
    if (ret) break;
    left -= xfer;
  }
  return ret && left == len ? ret : static_cast<ssize_t>(len - left);
}

// ---- riomap ----

int send_iomaps(Rs* rs, std::unique_lock<std::mutex>& lock, int flags) {
  while (!rs->iomap_queue.empty()) {
    if (int ret = wait_sendable(rs, lock, flags)) return ret;
    const IomapMr& m = rs->remote_iomappings[rs->iomap_queue.front()];
    Iomap iom;
    iom.offset = swap64_if(rs->swap, m.offset);
    iom.sge.addr = swap64_if(rs->swap, reinterpret_cast<uintptr_t>(m.mr->addr));
    iom.sge.length = swap32_if(rs->swap, static_cast<uint32_t>(m.mr->length));
    iom.sge.key = swap32_if(rs->swap, m.mr->rkey);
    auto post = [&](ibv_sge* sgl, int n, int fl) {
      rs->sseq_no++;
      rs->sqe_avail -= rs->msg_send ? 2 : 1;
      rs->sbuf_bytes_avail -= sizeof(Iomap);
      return post_write(rs, sgl, n, msg(kOpIomapSgl, static_cast<uint32_t>(m.index)), true, fl,
                        rs->remote_iomap.addr + static_cast<uint64_t>(m.index) * sizeof(Iomap),
                        rs->remote_iomap.key);
    };
    const int ret = post_flat(rs, reinterpret_cast<const uint8_t*>(&iom), sizeof iom, post);
    rs->iomap_queue.erase(rs->iomap_queue.begin());
    if (ret) return ret;
  }
  return 0;
}

const Iomap* find_iomap(const Rs* rs, uint64_t offset) {
  for (int i = 0; i < rs->target_iomap_size; ++i) {
    const Iomap& m = rs->target_iomap[i];
    if (offset >= m.offset && offset < m.offset + m.sge.length) return &m;
  }
  return nullptr;
}


// ---- datagram rsockets ----

// The kernel's socket(2), not a preloaded library's (librspreload would make it an rsocket again).
int os_socket(int domain, int type, int protocol) {
  return static_cast<int>(syscall(SYS_socket, domain, type, protocol));
}

socklen_t addr_len(const sockaddr_storage& a) {
  return a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

// Same family, address and port.
bool same_addr(const sockaddr_storage& a, const sockaddr* b) {
  if (a.ss_family != b->sa_family) return false;
  if (a.ss_family == AF_INET) {
    auto* x = reinterpret_cast<const sockaddr_in*>(&a);
    auto* y = reinterpret_cast<const sockaddr_in*>(b);
    return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
  }
  auto* x = reinterpret_cast<const sockaddr_in6*>(&a);
  auto* y = reinterpret_cast<const sockaddr_in6*>(b);
  return x->sin6_port == y->sin6_port && std::memcmp(&x->sin6_addr, &y->sin6_addr, 16) == 0;
}

void set_port(sockaddr_storage& a, uint16_t port_be) {
  if (a.ss_family == AF_INET6)
    reinterpret_cast<sockaddr_in6*>(&a)->sin6_port = port_be;
  else
    reinterpret_cast<sockaddr_in*>(&a)->sin_port = port_be;
}

void format_hdr(DgramHeader& h, const sockaddr_storage& a) {
  std::memset(&h, 0, sizeof h);
  if (a.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    h.version = 4;
    h.length = kDgramIpv4HdrLen;
    h.port_be = in->sin_port;
    h.addr.ipv4 = in->sin_addr.s_addr;
  } else {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    h.version = 6;
    h.length = kDgramIpv6HdrLen;
    h.port_be = in6->sin6_port;
    h.addr.ipv6.flowinfo = in6->sin6_flowinfo;
    std::memcpy(h.addr.ipv6.addr, &in6->sin6_addr, 16);
  }
}

sockaddr_storage hdr_addr(const DgramHeader& h) {
  sockaddr_storage a{};
  if (h.version == 4) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a);
    in->sin_family = AF_INET;
    in->sin_port = h.port_be;
    in->sin_addr.s_addr = h.addr.ipv4;
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = h.port_be;
    in6->sin6_flowinfo = h.addr.ipv6.flowinfo;
    std::memcpy(&in6->sin6_addr, h.addr.ipv6.addr, 16);
  }
  return a;
}

void copy_src(const sockaddr_storage& a, sockaddr* out, socklen_t* len) {
  if (!out || !len) return;
  const socklen_t n = addr_len(a);
  std::memcpy(out, &a, std::min(*len, n));
  *len = n;
}

// Buffers and queues of a datagram rsocket, sized as rdma-core sizes them (a slot per message).
int dgram_init(Rs* rs) {
  if (rs->dsbuf.p) return 0;
  rs->rq_size = static_cast<uint16_t>(std::clamp<uint32_t>(std::min<uint32_t>(rs->rq_size, rs->rbuf_size / kDgramMsgSize), 1, kQpMax));
  rs->rbuf_size = rs->rq_size * kDgramMsgSize;
  rs->sq_size = static_cast<uint16_t>(std::clamp<uint32_t>(std::min<uint32_t>(rs->sq_size, rs->sbuf_size / kDgramMsgSize), 1, kQpMax));
  rs->sbuf_size = rs->sq_size * kDgramMsgSize;
  if (!rs->dsbuf.alloc(rs->sbuf_size)) return fail(ENOMEM);
  for (uint32_t i = 0; i < rs->sq_size; ++i) rs->smsg_free.push_back(i * kDgramMsgSize);
  rs->dmsg.assign(rs->rq_size + 1u, DgMsg{});
  rs->sqe_avail = rs->sq_size;
  rs->rqe_avail = rs->rq_size;
  rs->state = kReadable | kWritable;
  return 0;
}

// The UDP socket needs a port before its address goes into headers.
int dgram_local(Rs* rs, sockaddr_storage& out) {
  socklen_t len = sizeof out;
  if (getsockname(rs->udp, reinterpret_cast<sockaddr*>(&out), &len)) return -1;
  const uint16_t port = out.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&out)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&out)->sin_port;
  if (port) return 0;
  sockaddr_storage any{};
  any.ss_family = out.ss_family;
  if (bind(rs->udp, reinterpret_cast<sockaddr*>(&any), addr_len(any))) return -1;
  len = sizeof out;
  return getsockname(rs->udp, reinterpret_cast<sockaddr*>(&out), &len);
}

bool any_or_loopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    const uint32_t ip = ntohl(reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr);
    return ip == INADDR_ANY || ip == INADDR_LOOPBACK;
  }
  const in6_addr& ip6 = reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr;
  return IN6_IS_ADDR_UNSPECIFIED(&ip6) || IN6_IS_ADDR_LOOPBACK(&ip6);
}

// The address this socket sends to dst from: its own, or the route's source with its port.
int dgram_src(Rs* rs, const sockaddr* dst, socklen_t dst_len, sockaddr_storage& src) {
  if (dgram_local(rs, src)) return -1;
  if (!any_or_loopback(src)) return 0;
  const uint16_t port = src.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&src)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&src)->sin_port;
  int fd = os_socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  socklen_t len = sizeof src;
  int ret = connect(fd, dst, dst_len) || getsockname(fd, reinterpret_cast<sockaddr*>(&src), &len) ? -1 : 0;
  close(fd);
  set_port(src, port);
  return ret;
}

void post_drecv(Rs* rs, DgQp* qp, uint32_t offset) {
  ibv_sge sge[2] = {{reinterpret_cast<uintptr_t>(qp->rbuf.p + rs->rbuf_size), sizeof(ibv_grh), qp->rmr->lkey},
                    {reinterpret_cast<uintptr_t>(qp->rbuf.p + offset), kDgramMsgSize, qp->rmr->lkey}};
  ibv_recv_wr wr{}, *bad;
  wr.wr_id = kRecvFlag | offset;
  wr.sg_list = sge;
  wr.num_sge = 2;
  ibv_post_recv(qp->id->qp, &wr, &bad);
}

void release_qp(DgQp* qp) {
  if (qp->id && qp->id->qp) rdma_destroy_qp(qp->id);
  if (qp->cq) {
    if (qp->unacked_events) ibv_ack_cq_events(qp->cq, qp->unacked_events);
    ibv_destroy_cq(qp->cq);
  }
  if (qp->cch) ibv_destroy_comp_channel(qp->cch);
  for (ibv_mr* mr : {qp->smr, qp->rmr})
    if (mr) ibv_dereg_mr(mr);
  qp->rbuf.release();
  if (qp->id) rdma_destroy_id(qp->id);
}

// A UD QP for source address src (resolved towards dst, which attaches its device).
DgQp* dgram_qp(Rs* rs, const sockaddr_storage& src, const sockaddr* dst) {
  for (auto& q : rs->qps)
    if (same_addr(q->src, reinterpret_cast<const sockaddr*>(&src))) return q.get();
  auto qp = std::make_unique<DgQp>();
  qp->src = src;
  format_hdr(qp->hdr, src);
  sockaddr_storage bind_src = src;
  set_port(bind_src, 0);  // the rdma_cm port is not on the wire; the UDP socket holds src's port
  bool ok = rdma_create_id(nullptr, &qp->id, qp.get(), RDMA_PS_UDP) == 0 &&
            rdma_resolve_addr(qp->id, reinterpret_cast<sockaddr*>(&bind_src), const_cast<sockaddr*>(dst), 2000) == 0 &&
            make_cq(qp->id, rs->sq_size + rs->rq_size, qp.get(), qp->cch, qp->cq) &&
            qp->rbuf.alloc(rs->rbuf_size + sizeof(ibv_grh)) && make_qp(rs, qp->id, qp->cq, qp.get(), IBV_QPT_UD, 1, 2);
  if (ok) {
    ibv_pd* pd = qp->id->qp->pd;
    ok = (qp->smr = ibv_reg_mr(pd, rs->dsbuf.p, rs->sbuf_size, kLocalWrite)) &&
         (qp->rmr = ibv_reg_mr(pd, qp->rbuf.p, rs->rbuf_size + sizeof(ibv_grh), kLocalWrite));
  }
  if (!ok) {
    const int e = errno ? errno : ENOMEM;
    release_qp(qp.get());
    errno = e;
    return nullptr;
  }
  for (uint32_t i = 0; i < rs->rq_size; ++i) post_drecv(rs, qp.get(), i * kDgramMsgSize);
  rs->qps.push_back(std::move(qp));
  return rs->qps.back().get();
}

DgDest* dgram_dest(Rs* rs, const sockaddr* addr, socklen_t len) {
  for (auto& d : rs->dests)
    if (same_addr(d->addr, addr)) return d.get();
  if (addr->sa_family != AF_INET && addr->sa_family != AF_INET6) return fail(EAFNOSUPPORT), nullptr;
  sockaddr_storage src;
  if (dgram_src(rs, addr, len, src)) return nullptr;
  DgQp* qp = dgram_qp(rs, src, addr);
  if (!qp) return nullptr;
  auto d = std::make_unique<DgDest>();
  std::memcpy(&d->addr, addr, std::min<size_t>(len, sizeof d->addr));
  d->qp = qp;
  rs->dests.push_back(std::move(d));
  return rs->dests.back().get();
}

// The address handle to a peer's QP qpn, from the route rdma_cm resolves to it.
void dgram_ah(DgDest* d, uint32_t qpn) {
  if (d->ah) ibv_destroy_ah(d->ah);
  d->ah = nullptr;
  rdma_cm_id* id;
  if (rdma_create_id(nullptr, &id, nullptr, RDMA_PS_UDP)) return;
  sockaddr_storage src = d->qp->src;
  set_port(src, 0);
  if (rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&d->addr), 2000) == 0 &&
      rdma_resolve_route(id, 2000) == 0 && id->route.num_paths) {
    const ibv_sa_path_rec& p = *id->route.path_rec;
    ibv_ah_attr a{};
    a.is_global = 1;
    a.grh.dgid = p.dgid;
    a.grh.flow_label = be32toh(p.flow_label);
    a.grh.hop_limit = p.hop_limit;
    a.grh.traffic_class = p.traffic_class;
    for (uint8_t i = 0; i < 16; ++i) {
      ibv_gid g;
      if (ibv_query_gid(d->qp->id->verbs, d->qp->id->port_num, i, &g) == 0 && std::memcmp(&g, &p.sgid, sizeof g) == 0) {
        a.grh.sgid_index = i;
        break;
      }
    }
    a.dlid = be16toh(p.dlid);
    a.sl = p.sl;
    a.port_num = d->qp->id->port_num;
    d->ah = ibv_create_ah(d->qp->id->qp->pd, &a);
    d->qpn = qpn;
  }
  rdma_destroy_id(id);
}

ssize_t send_udp(Rs* rs, DgDest* d, uint8_t op, const void* buf, size_t len) {
  UdpHeader h{};
  h.tag_be = htobe32(kUdpTag);
  h.version = d->qp->hdr.version;
  h.op = op;
  h.qpn_be = htobe32(d->qp->id->qp->qp_num & 0xFFFFFF);
  if (h.version == 4) {
    h.length = kUdpIpv4HdrLen;
    h.addr.ipv4 = d->qp->hdr.addr.ipv4;
  } else {
    h.length = kUdpIpv6HdrLen;
    std::memcpy(h.addr.ipv6, d->qp->hdr.addr.ipv6.addr, 16);
  }
  iovec iov[2] = {{&h, h.length}, {const_cast<void*>(buf), len}};
  msghdr m{};
  m.msg_name = &d->addr;
  m.msg_namelen = addr_len(d->addr);
  m.msg_iov = iov;
  m.msg_iovlen = len ? 2 : 1;
  ssize_t n = sendmsg(rs->udp, &m, MSG_DONTWAIT);
  return n > 0 ? n - h.length : n;
}

// What arrived on the UDP socket: a peer's QP (an address handle to it), a payload to deliver, and
// for a payload our own QP's number back, so that the peer's next datagrams come over UD.
void dgram_udp(Rs* rs) {
  uint8_t buf[kDgramMsgSize];
  for (;;) {
    sockaddr_storage from{};
    socklen_t flen = sizeof from;
    ssize_t n = recvfrom(rs->udp, buf, sizeof buf, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &flen);
    if (n < 0) return;
    UdpHeader h;
    if (n < kUdpIpv4HdrLen) continue;
    std::memcpy(&h, buf, std::min<size_t>(static_cast<size_t>(n), sizeof h));
    const bool valid = be32toh(h.tag_be) == kUdpTag &&
                       ((h.version == 4 && from.ss_family == AF_INET && h.length == kUdpIpv4HdrLen) ||
                        (h.version == 6 && from.ss_family == AF_INET6 && h.length == kUdpIpv6HdrLen)) &&
                       n >= h.length;
    if (!valid) continue;
    const uint32_t qpn = be32toh(h.qpn_be) & 0xFFFFFF;
    DgDest* d = dgram_dest(rs, reinterpret_cast<sockaddr*>(&from), flen);
    if (!d) continue;
    if (h.op == kOpData) send_udp(rs, d, kOpCtrl, nullptr, 0);
    if (!d->ah || d->qpn != qpn) dgram_ah(d, qpn);
    if (h.op == kOpData)
      rs->delivered.push_back({std::vector<uint8_t>(buf + h.length, buf + n), from});
  }
}

bool dgram_valid(const DgQp* qp, const ibv_wc& wc) {
  const auto* h = reinterpret_cast<const DgramHeader*>(qp->rbuf.p + static_cast<uint32_t>(wc.wr_id));
  return wc.byte_len >= sizeof(ibv_grh) + kDgramIpv4HdrLen &&
         ((h->version == 4 && h->length == kDgramIpv4HdrLen) || (h->version == 6 && h->length == kDgramIpv6HdrLen)) &&
         wc.byte_len - sizeof(ibv_grh) >= h->length;
}

void dgram_poll(Rs* rs) {
  dgram_udp(rs);
  for (auto& q : rs->qps) {
    ibv_wc wcs[16];
    int n;
    while ((n = ibv_poll_cq(q->cq, 16, wcs)) > 0) {
      for (int i = 0; i < n; ++i) {
        const ibv_wc& wc = wcs[i];
        const uint32_t offset = static_cast<uint32_t>(wc.wr_id);
        if (!(wc.wr_id & kRecvFlag)) {
          rs->smsg_free.push_back(offset);
          rs->sqe_avail++;
        } else if (rs->rqe_avail && wc.status == IBV_WC_SUCCESS && dgram_valid(q.get(), wc)) {
          rs->rqe_avail--;
          rs->dmsg[rs->rmsg_tail] = DgMsg{q.get(), offset, wc.byte_len - static_cast<uint32_t>(sizeof(ibv_grh))};
          if (++rs->rmsg_tail == rs->rq_size + 1) rs->rmsg_tail = 0;
        } else if (wc.status != IBV_WC_WR_FLUSH_ERR) {
          post_drecv(rs, q.get(), offset);  // dropped: no room, or not an rsocket datagram
        }
      }
    }
  }
}

bool drain_dgram_events(DgQp* q) {
  if (!drain_channel(q->cch, q->cq, q->unacked_events)) return false;
  q->cq_armed = false;
  return true;
}

bool have_ddata(const Rs* rs) { return rs->rmsg_head != rs->rmsg_tail || !rs->delivered.empty(); }
bool can_dsend(const Rs* rs) { return rs->sqe_avail > 0; }

// As wait(), for a datagram socket: its UDP socket and every QP's completion channel wake it.
template <typename Test>
int dgram_wait(Rs* rs, std::unique_lock<std::mutex>& lock, bool nonblock, Test test) {
  const uint64_t start = now_us();
  bool armed = false;
  for (;;) {
    dgram_poll(rs);
    if (test(rs)) return 0;
    if (nonblock) return fail(EWOULDBLOCK);
    if (now_us() - start <= defaults().polling_us) continue;
    if (!armed) {
      for (auto& q : rs->qps)
        if (!q->cq_armed) {
          ibv_req_notify_cq(q->cq, 0);
          q->cq_armed = true;
        }
      armed = true;
      continue;
    }
    std::vector<pollfd> p{{rs->udp, POLLIN, 0}};
    for (auto& q : rs->qps) p.push_back({q->cch->fd, POLLIN, 0});
    lock.unlock();
    const int n = poll(p.data(), p.size(), kRepollMs);
    const int e = errno;
    lock.lock();
    if (n < 0 && e == EINTR) return fail(EINTR);
    for (auto& q : rs->qps)
      if (drain_dgram_events(q.get())) armed = false;
  }
}

ssize_t dgram_send(Rs* rs, DgDest* d, const iovec* iov, int iovcnt, int flags, std::unique_lock<std::mutex>& lock) {
  size_t len = 0;
  for (int i = 0; i < iovcnt; ++i) len += iov[i].iov_len;
  if (len + d->qp->hdr.length > kDgramMsgSize) return fail(EMSGSIZE);
  if (!d->ah) {
    std::vector<uint8_t> flat(len);
    IovCursor{iov}.take(flat.data(), len);
    return send_udp(rs, d, kOpData, flat.data(), len);
  }
  if (!can_dsend(rs))
    if (int ret = dgram_wait(rs, lock, nonblocking(rs, flags), can_dsend)) return ret;
  const uint32_t offset = rs->smsg_free.back();
  rs->smsg_free.pop_back();
  rs->sqe_avail--;
  uint8_t* slot = rs->dsbuf.p + offset;
  std::memcpy(slot, &d->qp->hdr, d->qp->hdr.length);
  IovCursor{iov}.take(slot + d->qp->hdr.length, len);
  ibv_sge sge{reinterpret_cast<uintptr_t>(slot), static_cast<uint32_t>(d->qp->hdr.length + len), d->qp->smr->lkey};
  ibv_send_wr wr{}, *bad;
  wr.wr_id = offset;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = sge.length <= rs->sq_inline ? IBV_SEND_INLINE : 0;
  wr.wr.ud.ah = d->ah;
  wr.wr.ud.remote_qpn = d->qpn;
  wr.wr.ud.remote_qkey = RDMA_UDP_QKEY;
  if (int e = ibv_post_send(d->qp->id->qp, &wr, &bad)) {
    rs->smsg_free.push_back(offset);
    rs->sqe_avail++;
    return fail(e);
  }
  return static_cast<ssize_t>(len);
}

ssize_t dgram_sendto(Rs* rs, const iovec* iov, int iovcnt, int flags, const sockaddr* to, socklen_t tolen) {
  std::lock_guard sl(rs->slock);
  std::unique_lock lock(rs->mu);
  if (dgram_init(rs)) return -1;
  if (!(rs->state & kWritable)) return fail(EPIPE);
  DgDest* d = rs->conn_dest;
  if (to && (d = dgram_dest(rs, to, tolen)) == nullptr) return -1;
  if (!d) return fail(EDESTADDRREQ);
  return dgram_send(rs, d, iov, iovcnt, flags, lock);
}

ssize_t dgram_recvfrom(Rs* rs, void* buf, size_t len, int flags, sockaddr* from, socklen_t* fromlen) {
  std::lock_guard rl(rs->rlock);
  std::unique_lock lock(rs->mu);
  if (dgram_init(rs)) return -1;
  if (!(rs->state & kReadable)) return fail(EINVAL);
  if (!have_ddata(rs))
    if (int ret = dgram_wait(rs, lock, nonblocking(rs, flags), have_ddata)) return ret;
  if (!rs->delivered.empty()) {
    UdpDelivered& u = rs->delivered.front();
    const size_t n = std::min(len, u.data.size());
    std::memcpy(buf, u.data.data(), n);
    copy_src(u.src, from, fromlen);
    if (!(flags & MSG_PEEK)) rs->delivered.pop_front();
    return static_cast<ssize_t>(n);
  }
  const DgMsg& m = rs->dmsg[rs->rmsg_head];
  const auto* h = reinterpret_cast<const DgramHeader*>(m.qp->rbuf.p + m.offset);
  const size_t n = std::min<size_t>(len, m.length - h->length);
  std::memcpy(buf, reinterpret_cast<const uint8_t*>(h) + h->length, n);
  copy_src(hdr_addr(*h), from, fromlen);
  if (!(flags & MSG_PEEK)) {
    post_drecv(rs, m.qp, m.offset);
    if (++rs->rmsg_head == rs->rq_size + 1) rs->rmsg_head = 0;
    rs->rqe_avail++;
  }
  return static_cast<ssize_t>(n);
}

void dgram_release(Rs* rs) {
  {
    // Sends still in flight finish first (for a while at most: a peer may be gone).
    std::unique_lock lock(rs->mu);
    const uint64_t until = now_us() + 1'000'000;
    while (rs->sqe_avail < rs->sq_size && now_us() < until) dgram_poll(rs);
  }
  for (auto& d : rs->dests)
    if (d->ah) ibv_destroy_ah(d->ah);
  for (auto& q : rs->qps) release_qp(q.get());
  rs->dsbuf.release();
  if (rs->udp >= 0) close(rs->udp);
}

// ---- shutdown ----

int shutdown_stream(Rs* rs, int how) {
  std::unique_lock lock(rs->mu);
  int ret = 0;
  const int saved_flags = rs->fs_flags;
  rs->fs_flags &= ~O_NONBLOCK;  // the control message and the sends before it complete first
  if (rs->state & kConnected) {
    uint32_t ctrl;
    if (how == SHUT_RDWR) {
      ctrl = kCtrlDisconnect;
      rs->state &= ~(kReadable | kWritable);
    } else if (how == SHUT_WR) {
      rs->state &= ~kWritable;
      ctrl = (rs->state & kReadable) ? kCtrlShutdown : kCtrlDisconnect;
    } else {
      rs->state &= ~kReadable;
      if (rs->state & kWritable) {
        rs->fs_flags = saved_flags;
        return 0;
      }
      ctrl = kCtrlDisconnect;
    }
    if (!ctrl_avail(rs))
      ret = wait(rs, lock, false, [](const Rs* r) { return ctrl_avail(r) || !(r->state & kConnected); });
    if (!ret && (rs->state & kConnected) && ctrl_avail(rs)) {
      rs->ctrl_seqno++;
      ret = post_msg(rs, msg(kOpCtrl, ctrl));
    }
  }
  if (rs->state & kConnected) wait(rs, lock, false, all_sends_done);
  rs->fs_flags = saved_flags;
  return ret;
}

void copy_addr(sockaddr* dst, const sockaddr* src, socklen_t* len) {
  const socklen_t size = src->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  std::memcpy(dst, src, std::min(*len, size));
  *len = size;
}

// ---- rpoll ----

short poll_rs(Rs* rs, short events) {
  std::unique_lock lock(rs->mu);
  if (rs->type == SOCK_DGRAM) {
    if (dgram_init(rs)) return POLLERR;
    dgram_poll(rs);
    short rev = 0;
    if ((events & POLLIN) && have_ddata(rs)) rev |= POLLIN;
    if ((events & POLLOUT) && can_dsend(rs)) rev |= POLLOUT;
    return rev;
  }
  if ((rs->state & kConnected) || rs->state == kDisconnected || (rs->state & kError)) {
    process_cq(rs);
    short rev = 0;
    if ((events & POLLIN) && conn_have_rdata(rs)) rev |= POLLIN;
    if ((events & POLLOUT) && can_send(rs)) rev |= POLLOUT;
    // Hung up once what the peer sent before is read (as TCP after a FIN: rstream -T a treats POLLHUP
    // beside its last data as an error).
    if (!(rs->state & kConnected)) rev |= rs->state != kDisconnected ? POLLERR : have_rdata(rs) ? 0 : POLLHUP;
    return rev;
  }
  if (rs->state == kListening) {
    pollfd p{rs->ch->fd, static_cast<short>(events & POLLIN), 0};
    poll(&p, 1, 0);
    return p.revents;
  }
  if (rs->state & kOpening) {
    if (do_connect(rs, true) == 0 || errno != EINPROGRESS) {
      lock.unlock();
      return poll_rs(rs, events);
    }
    return 0;
  }
  if (rs->state == kConnectError) return static_cast<short>((events & (POLLIN | POLLOUT)) | POLLERR);
  return 0;
}

int poll_check(pollfd* fds, nfds_t nfds) {
  int cnt = 0;
  for (nfds_t i = 0; i < nfds; ++i) {
    if (Rs* rs = lookup(fds[i].fd))
      fds[i].revents = poll_rs(rs, fds[i].events);
    else
      poll(&fds[i], 1, 0);
    if (fds[i].revents) cnt++;
  }
  return cnt;
}

// Arms each rsocket's CQ and lists the fds that wake it: its completion channel and its CM channel.
// Returns true when an rsocket turned ready while arming.
bool poll_arm(pollfd* fds, nfds_t nfds, std::vector<pollfd>& real, std::vector<int>& owner) {
  real.clear();
  owner.clear();
  for (nfds_t i = 0; i < nfds; ++i) {
    Rs* rs = lookup(fds[i].fd);
    if (!rs) {
      real.push_back({fds[i].fd, fds[i].events, 0});
      owner.push_back(static_cast<int>(i));
      continue;
    }
    if (rs->type == SOCK_DGRAM) {
      std::lock_guard lock(rs->mu);
      real.push_back({rs->udp, POLLIN, 0});
      owner.push_back(static_cast<int>(i));
      for (auto& q : rs->qps) {
        if (!q->cq_armed) {
          ibv_req_notify_cq(q->cq, 0);
          q->cq_armed = true;
        }
        real.push_back({q->cch->fd, POLLIN, 0});
        owner.push_back(static_cast<int>(i));
      }
    } else {
      std::lock_guard lock(rs->mu);
      if (rs->cq && !rs->cq_armed) {
        ibv_req_notify_cq(rs->cq, 0);
        rs->cq_armed = true;
      }
      if (rs->cq && rs->state != kListening) {
        real.push_back({rs->cch->fd, POLLIN, 0});
        owner.push_back(static_cast<int>(i));
      }
      real.push_back({rs->ch->fd, POLLIN, 0});
      owner.push_back(static_cast<int>(i));
    }
    fds[i].revents = poll_rs(rs, fds[i].events);
    if (fds[i].revents) return true;
  }
  return false;
}

}  // namespace
}  // namespace softrdma::rsock

using namespace softrdma::rsock;

SOFTRDMA_EXPORT int rsocket(int domain, int type, int protocol) {
  const int socket_type = type & ~(SOCK_CLOEXEC | SOCK_NONBLOCK);
  if ((domain != AF_INET && domain != AF_INET6) || (socket_type != SOCK_STREAM && socket_type != SOCK_DGRAM) ||
      (socket_type == SOCK_STREAM && protocol && protocol != IPPROTO_TCP) ||
      (socket_type == SOCK_DGRAM && protocol && protocol != IPPROTO_UDP))
    return fail(ENOTSUP);
  Rs* rs = alloc_rs(nullptr);
  rs->type = socket_type;
  rs->fd_flags = (type & SOCK_CLOEXEC) ? FD_CLOEXEC : 0;
  rs->fs_flags = (type & SOCK_NONBLOCK) ? O_NONBLOCK : 0;
  if (socket_type == SOCK_DGRAM) {
    // Its number is its UDP socket's, through which peers learn its QPs.
    rs->udp = rs->index = os_socket(domain, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (const int min = rs->index >= 0 ? number_above_open_fds(rs->index) : 0) {
      const int moved = fcntl(rs->index, F_DUPFD_CLOEXEC, min);
      const int e = errno;
      close(rs->index);
      rs->udp = rs->index = moved;
      errno = e;
    }
    if (rs->index < 0 || rs->index >= kTableSize) {
      int e = rs->index < 0 ? errno : EMFILE;
      release(rs);
      return fail(e);
    }
    g_table[rs->index].store(rs, std::memory_order_release);
    return rs->index;
  }
  if (!open_channel(rs) || rdma_create_id(rs->ch, &rs->id, rs, RDMA_PS_TCP)) {
    int e = errno ? errno : EMFILE;
    release(rs);
    return fail(e);
  }
  rs->id->route.addr.src_addr.sa_family = static_cast<sa_family_t>(domain);
  g_table[rs->index].store(rs, std::memory_order_release);
  return rs->index;
}

SOFTRDMA_EXPORT int rbind(int socket, const struct sockaddr* addr, socklen_t addrlen) {
  return with_rs(socket, [&](Rs* rs) {
    std::lock_guard lock(rs->mu);
    if (rs->type == SOCK_DGRAM) return dgram_init(rs) ? -1 : bind(rs->udp, addr, addrlen);
    int ret = rdma_bind_addr(rs->id, const_cast<sockaddr*>(addr));
    if (!ret) rs->state = kBound;
    return ret;
  });
}

SOFTRDMA_EXPORT int rlisten(int socket, int backlog) {
  return with_rs(socket, [&](Rs* rs) {
    std::lock_guard lock(rs->mu);
    if (rs->type == SOCK_DGRAM) return fail(EOPNOTSUPP);
    if (rs->state == kListening) return 0;
    if (rdma_listen(rs->id, backlog)) return -1;
    rs->state = kListening;
    return 0;
  });
}

SOFTRDMA_EXPORT int raccept(int socket, struct sockaddr* addr, socklen_t* addrlen) {
  Rs* rs = lookup(socket);
  if (!rs) return fail(EBADF);
  if (rs->type == SOCK_DGRAM) return fail(EOPNOTSUPP);
  if (rs->state != kListening) return fail(EINVAL);
  for (;;) {
    rdma_cm_event* ev;
    if (next_event(rs, nonblocking(rs, 0), &ev)) return -1;
    if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_ack_cm_event(ev);
      continue;
    }
    rdma_cm_id* child = ev->id;
    ConnData creq{};
    const bool have = ev->param.conn.private_data && ev->param.conn.private_data_len >= sizeof creq;
    if (have) std::memcpy(&creq, ev->param.conn.private_data, sizeof creq);
    rdma_ack_cm_event(ev);
    Rs* nrs = alloc_rs(rs);
    nrs->id = child;
    child->context = nrs;
    bool ok = have && creq.version == kVersion && open_channel(nrs) && rdma_migrate_id(child, nrs->ch) == 0 &&
              create_ep(nrs) == 0;
    if (ok) {
      save_conn_data(nrs, creq);
      ConnData resp;
      rdma_conn_param param = conn_param(nrs, resp);
      param.responder_resources = 1;
      param.initiator_depth = 1;
      ok = rdma_accept(child, &param) == 0;
      // The QP is ready once accepted; ESTABLISHED (the peer's RTU) follows on the new channel.
      rdma_cm_event* est;
      while (ok && next_event(nrs, false, &est) == 0) {
        const rdma_cm_event_type t = est->event;
        rdma_ack_cm_event(est);
        if (t == RDMA_CM_EVENT_ESTABLISHED) break;
        ok = false;
      }
    }
    if (!ok) {
      rdma_reject(child, nullptr, 0);
      release(nrs);
      if (nonblocking(rs, 0)) return fail(EAGAIN);
      continue;
    }
    nrs->state = kConnectRdwr;
    g_table[nrs->index].store(nrs, std::memory_order_release);
    if (addr && addrlen) copy_addr(addr, rdma_get_peer_addr(child), addrlen);
    return nrs->index;
  }
}

SOFTRDMA_EXPORT int rconnect(int socket, const struct sockaddr* addr, socklen_t addrlen) {
  return with_rs(socket, [&](Rs* rs) {
    std::lock_guard lock(rs->mu);
    if (rs->type == SOCK_DGRAM) {
      if (dgram_init(rs) || connect(rs->udp, addr, addrlen)) return -1;
      return (rs->conn_dest = dgram_dest(rs, addr, addrlen)) ? 0 : -1;
    }
    if (rs->state < kOpening)
      std::memcpy(&rs->id->route.addr.dst_addr, addr, std::min<size_t>(addrlen, sizeof(sockaddr_storage)));
    return do_connect(rs, nonblocking(rs, 0));
  });
}

SOFTRDMA_EXPORT int rshutdown(int socket, int how) {
  return with_rs(socket, [&](Rs* rs) {
    if (rs->type == SOCK_DGRAM) {
      std::lock_guard lock(rs->mu);
      if (how != SHUT_WR) rs->state &= ~kReadable;
      if (how != SHUT_RD) rs->state &= ~kWritable;
      return 0;
    }
    return shutdown_stream(rs, how);
  });
}

SOFTRDMA_EXPORT int rclose(int socket) {
  Rs* rs = lookup(socket);
  if (!rs) return fail(EBADF);
  if (rs->type == SOCK_STREAM && (rs->state & kConnected)) shutdown_stream(rs, SHUT_RDWR);
  release(rs);
  return 0;
}

SOFTRDMA_EXPORT ssize_t rrecv(int socket, void* buf, size_t len, int flags) {
  return with_rs(socket, [&](Rs* rs) -> ssize_t {
    return rs->type == SOCK_DGRAM ? dgram_recvfrom(rs, buf, len, flags, nullptr, nullptr)
                                  : recv_stream(rs, buf, len, flags);
  });
}

SOFTRDMA_EXPORT ssize_t rrecvfrom(int socket, void* buf, size_t len, int flags, struct sockaddr* src_addr,
                                  socklen_t* addrlen) {
  Rs* rs = lookup(socket);
  if (rs && rs->type == SOCK_DGRAM) return dgram_recvfrom(rs, buf, len, flags, src_addr, addrlen);
  ssize_t ret = rrecv(socket, buf, len, flags);
  if (ret > 0 && src_addr) rgetpeername(socket, src_addr, addrlen);
  return ret;
}

// As rdma-core: only the first vector is filled.
SOFTRDMA_EXPORT ssize_t rrecvmsg(int socket, struct msghdr* msg, int flags) {
  if (msg->msg_control && msg->msg_controllen) return fail(ENOTSUP);
  if (msg->msg_iovlen == 0) return 0;
  return rrecv(socket, msg->msg_iov[0].iov_base, msg->msg_iov[0].iov_len, flags);
}

SOFTRDMA_EXPORT ssize_t rread(int socket, void* buf, size_t count) { return rrecv(socket, buf, count, 0); }

SOFTRDMA_EXPORT ssize_t rreadv(int socket, const struct iovec* iov, int iovcnt) {
  if (iovcnt <= 0) return 0;
  return rrecv(socket, iov[0].iov_base, iov[0].iov_len, 0);
}

SOFTRDMA_EXPORT ssize_t rsend(int socket, const void* buf, size_t len, int flags) {
  iovec v{const_cast<void*>(buf), len};
  return with_rs(socket, [&](Rs* rs) -> ssize_t {
    return rs->type == SOCK_DGRAM ? dgram_sendto(rs, &v, 1, flags, nullptr, 0) : send_stream(rs, &v, 1, flags);
  });
}

SOFTRDMA_EXPORT ssize_t rsendto(int socket, const void* buf, size_t len, int flags, const struct sockaddr* dest_addr,
                                socklen_t addrlen) {
  iovec v{const_cast<void*>(buf), len};
  return with_rs(socket, [&](Rs* rs) -> ssize_t {
    if (rs->type == SOCK_DGRAM) return dgram_sendto(rs, &v, 1, flags, dest_addr, addrlen);
    return send_stream(rs, &v, 1, flags);  // an address is ignored, as on a TCP socket (sockperf passes one)
  });
}

SOFTRDMA_EXPORT ssize_t rsendmsg(int socket, const struct msghdr* msg, int flags) {
  if (msg->msg_control && msg->msg_controllen) return fail(ENOTSUP);
  return with_rs(socket, [&](Rs* rs) -> ssize_t {
    const int n = static_cast<int>(msg->msg_iovlen);
    if (rs->type == SOCK_DGRAM)
      return dgram_sendto(rs, msg->msg_iov, n, flags, static_cast<const sockaddr*>(msg->msg_name), msg->msg_namelen);
    return send_stream(rs, msg->msg_iov, n, flags);
  });
}

SOFTRDMA_EXPORT ssize_t rwrite(int socket, const void* buf, size_t count) { return rsend(socket, buf, count, 0); }

SOFTRDMA_EXPORT ssize_t rwritev(int socket, const struct iovec* iov, int iovcnt) {
  return with_rs(socket, [&](Rs* rs) -> ssize_t {
    return rs->type == SOCK_DGRAM ? dgram_sendto(rs, iov, iovcnt, 0, nullptr, 0) : send_stream(rs, iov, iovcnt, 0);
  });
}

SOFTRDMA_EXPORT int rpoll(struct pollfd* fds, nfds_t nfds, int timeout) {
  const uint64_t start = now_us();
  for (;;) {
    int cnt = poll_check(fds, nfds);
    if (cnt || timeout == 0) return cnt;
    if (now_us() - start > defaults().polling_us) break;
  }
  std::vector<pollfd> real;
  std::vector<int> owner;
  for (;;) {
    if (poll_arm(fds, nfds, real, owner)) return poll_check(fds, nfds);
    int wait_ms = -1;
    if (timeout >= 0) {
      const int64_t left = timeout - static_cast<int64_t>((now_us() - start) / 1000);
      if (left <= 0) return 0;
      wait_ms = static_cast<int>(left);
    }
    if (wait_ms < 0 || wait_ms > kRepollMs) wait_ms = kRepollMs;
    int n = poll(real.data(), real.size(), wait_ms);
    if (n < 0) return -1;
    for (nfds_t i = 0; i < nfds; ++i) fds[i].revents = 0;
    int cnt = 0;
    for (size_t k = 0; k < real.size(); ++k) {
      pollfd& f = fds[owner[k]];
      if (Rs* rs = lookup(f.fd)) {
        if (!real[k].revents) continue;
        std::lock_guard lock(rs->mu);
        if (rs->type == SOCK_DGRAM) {
          for (auto& q : rs->qps)
            if (real[k].fd == q->cch->fd) drain_dgram_events(q.get());
          continue;
        }
        if (rs->cch && real[k].fd == rs->cch->fd) drain_cq_events(rs);
        if (real[k].fd == rs->ch->fd && (rs->state & kConnected)) drain_cm(rs);
      } else if ((f.revents = real[k].revents)) {
        cnt++;
      }
    }
    for (nfds_t i = 0; i < nfds; ++i)
      if (Rs* rs = lookup(fds[i].fd); rs && (fds[i].revents = poll_rs(rs, fds[i].events))) cnt++;
    if (cnt) return cnt;
  }
}

SOFTRDMA_EXPORT int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds,
                            struct timeval* timeout) {
  std::vector<pollfd> fds;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    if (readfds && FD_ISSET(fd, readfds)) ev |= POLLIN;
    if (writefds && FD_ISSET(fd, writefds)) ev |= POLLOUT;
    if (ev || (exceptfds && FD_ISSET(fd, exceptfds))) fds.push_back({fd, ev, 0});
  }
  const int to = timeout ? static_cast<int>(timeout->tv_sec * 1000 + (timeout->tv_usec + 999) / 1000) : -1;
  int ret = rpoll(fds.data(), fds.size(), to);
  if (ret < 0) return ret;
  if (readfds) FD_ZERO(readfds);
  if (writefds) FD_ZERO(writefds);
  if (exceptfds) FD_ZERO(exceptfds);
  int cnt = 0;
  for (const pollfd& p : fds) {
    if (readfds && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
      FD_SET(p.fd, readfds);
      cnt++;
    }
    if (writefds && (p.revents & (POLLOUT | POLLERR))) {
      FD_SET(p.fd, writefds);
      cnt++;
    }
    if (exceptfds && (p.revents & POLLERR)) {
      FD_SET(p.fd, exceptfds);
      cnt++;
    }
  }
  return cnt;
}

SOFTRDMA_EXPORT int rgetpeername(int socket, struct sockaddr* addr, socklen_t* addrlen) {
  return with_rs(socket, [&](Rs* rs) {
    if (rs->type == SOCK_DGRAM) return getpeername(rs->udp, addr, addrlen);
    copy_addr(addr, rdma_get_peer_addr(rs->id), addrlen);
    return 0;
  });
}

SOFTRDMA_EXPORT int rgetsockname(int socket, struct sockaddr* addr, socklen_t* addrlen) {
  return with_rs(socket, [&](Rs* rs) {
    if (rs->type == SOCK_DGRAM) return getsockname(rs->udp, addr, addrlen);
    copy_addr(addr, rdma_get_local_addr(rs->id), addrlen);
    return 0;
  });
}

SOFTRDMA_EXPORT int rsetsockopt(int socket, int level, int optname, const void* optval, socklen_t optlen) {
  return with_rs(socket, [&](Rs* rs) {
    std::lock_guard lock(rs->mu);
    if (!optval) return fail(EFAULT);
    // A datagram socket's own options are its UDP socket's too.
    if (rs->type == SOCK_DGRAM && level != SOL_RDMA && setsockopt(rs->udp, level, optname, optval, optlen)) return -1;
    const int ival = optlen >= sizeof(int) ? *static_cast<const int*>(optval) : 0;
    uint64_t* opts = nullptr;
    bool on = false;
    int ret = -1;
    errno = ENOTSUP;
    auto record = [&](bool value) {  // an option kept for rgetsockopt only
      on = value;
      ret = 0;
    };
    switch (level) {
      case SOL_SOCKET:
        opts = &rs->so_opts;
        switch (optname) {
          case SO_REUSEADDR:
            if (rs->id) rdma_set_option(rs->id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, const_cast<void*>(optval), optlen);
            record(ival);
            break;
          case SO_RCVBUF:
            if (!rs->rbuf.p && rs->qps.empty()) rs->rbuf_size = static_cast<uint32_t>(ival) << 1;
            ret = 0;
            break;
          case SO_SNDBUF:
            if (!rs->sbuf.p && !rs->dsbuf.p) rs->sbuf_size = static_cast<uint32_t>(ival) << 1;
            if (rs->sbuf_size < kSndLowat) rs->sbuf_size = kSndLowat << 1;
            ret = 0;
            break;
          case SO_LINGER:  // stored inverted, so that the default (0) reads "on"
            record(optlen >= sizeof(linger) && !static_cast<const linger*>(optval)->l_onoff);
            break;
          case SO_KEEPALIVE:  // the connection's liveness is the RC transport's
          case SO_OOBINLINE:
            record(ival);
            break;
          default:
            break;
        }
        break;
      case IPPROTO_IP:
        if (optname == IP_TOS) {
          rs->ipv4_opts = ival;
          ret = !rs->id ? 0 : rdma_set_option(rs->id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, const_cast<void*>(optval), optlen);
        }
        break;
      case IPPROTO_TCP:
        opts = &rs->tcp_opts;
        switch (optname) {
          case TCP_KEEPCNT:
          case TCP_KEEPINTVL:
          case TCP_MAXSEG:
          case TCP_CONGESTION:
            ret = 0;
            break;
          case TCP_KEEPIDLE:
            if (ival <= 0) return fail(EINVAL);
            rs->keepalive_time = static_cast<unsigned>(ival);
            ret = 0;
            break;
          case TCP_NODELAY:
            record(ival);
            break;
          default:
            break;
        }
        break;
      case IPPROTO_IPV6:
        opts = &rs->ipv6_opts;
        if (optname == IPV6_V6ONLY) {
          if (rs->id) rdma_set_option(rs->id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, const_cast<void*>(optval), optlen);
          record(ival);
        }
        break;
      case SOL_RDMA:
        if (rs->state >= kOpening) return fail(EINVAL);
        ret = 0;
        switch (optname) {
          case RDMA_SQSIZE:
            rs->sq_size = static_cast<uint16_t>(std::min<uint32_t>(static_cast<uint32_t>(ival), kQpMax));
            break;
          case RDMA_RQSIZE:
            rs->rq_size = static_cast<uint16_t>(std::min<uint32_t>(static_cast<uint32_t>(ival), kQpMax));
            break;
          case RDMA_INLINE:
            rs->sq_inline = static_cast<uint16_t>(std::min<uint32_t>(static_cast<uint32_t>(ival), kQpMax));
            break;
          case RDMA_IOMAPSIZE:
            rs->target_iomap_size = static_cast<uint16_t>(value_of(static_cast<uint8_t>(scale_of(ival, 8)), 8));
            break;
          case RDMA_ROUTE:  // RoCE routes come from rdma_resolve_route; a given path record is accepted
            break;
          default:
            ret = fail(ENOTSUP);
            break;
        }
        break;
      default:
        break;
    }
    if (!ret && opts && optname < 64) {
      if (on)
        *opts |= uint64_t{1} << optname;
      else
        *opts &= ~(uint64_t{1} << optname);
    }
    return ret;
  });
}

SOFTRDMA_EXPORT int rgetsockopt(int socket, int level, int optname, void* optval, socklen_t* optlen) {
  return with_rs(socket, [&](Rs* rs) {
    std::lock_guard lock(rs->mu);
    if (!optval || !optlen) return fail(EFAULT);
    auto put = [&](int v) {
      if (*optlen >= sizeof(int)) *static_cast<int*>(optval) = v;
      *optlen = sizeof(int);
      return 0;
    };
    auto bit = [](uint64_t opts, int name) { return name < 64 && (opts >> name & 1) ? 1 : 0; };
    switch (level) {
      case SOL_SOCKET:
        switch (optname) {
          case SO_REUSEADDR:
          case SO_KEEPALIVE:
          case SO_OOBINLINE:
            return put(bit(rs->so_opts, optname));
          case SO_RCVBUF:
            return put(static_cast<int>(rs->rbuf_size));
          case SO_SNDBUF:
            return put(static_cast<int>(rs->sbuf_size));
          case SO_LINGER:
            if (*optlen < sizeof(linger)) return fail(EINVAL);
            static_cast<linger*>(optval)->l_onoff = !bit(rs->so_opts, SO_LINGER);
            static_cast<linger*>(optval)->l_linger = 0;
            *optlen = sizeof(linger);
            return 0;
          case SO_ERROR: {
            int e = rs->err;
            rs->err = 0;
            return put(e);
          }
          case SO_TYPE:
            return put(rs->type);
          default:
            return fail(ENOTSUP);
        }
      case IPPROTO_IP:
        if (optname == IP_TOS) return put(rs->ipv4_opts);
        return fail(ENOTSUP);
      case IPPROTO_TCP:
        switch (optname) {
          case TCP_CONGESTION:
          case TCP_KEEPCNT:
          case TCP_KEEPINTVL:
            return put(1);
          case TCP_KEEPIDLE:
            return put(static_cast<int>(rs->keepalive_time));
          case TCP_NODELAY:
            return put(bit(rs->tcp_opts, TCP_NODELAY));
          case TCP_MAXSEG:
            return put(rs->id && rs->id->route.num_paths ? 1 << (7 + rs->id->route.path_rec->mtu) : 2048);
          case TCP_INFO: {
            tcp_info info{};
            info.tcpi_state = (rs->state & kConnected) ? TCP_ESTABLISHED : TCP_CLOSE;
            info.tcpi_snd_cwnd = rs->sq_size;
            std::memcpy(optval, &info, std::min<size_t>(*optlen, sizeof info));
            *optlen = std::min<socklen_t>(*optlen, sizeof info);
            return 0;
          }
          default:
            return fail(ENOTSUP);
        }
      case IPPROTO_IPV6:
        if (optname == IPV6_V6ONLY) return put(bit(rs->ipv6_opts, IPV6_V6ONLY));
        return fail(ENOTSUP);
      case SOL_RDMA:
        switch (optname) {
          case RDMA_SQSIZE:
            return put(rs->sq_size);
          case RDMA_RQSIZE:
            return put(rs->rq_size);
          case RDMA_INLINE:
            return put(rs->sq_inline);
          case RDMA_IOMAPSIZE:
            return put(rs->target_iomap_size);
          default:
            return fail(ENOTSUP);
        }
      default:
        return fail(ENOTSUP);
    }
  });
}

SOFTRDMA_EXPORT int rfcntl(int socket, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  const int arg = (cmd == F_SETFL || cmd == F_SETFD) ? va_arg(ap, int) : 0;
  va_end(ap);
  return with_rs(socket, [&](Rs* rs) {
    std::lock_guard lock(rs->mu);
    switch (cmd) {
      case F_GETFL:
        return rs->fs_flags;
      case F_SETFL:
        rs->fs_flags = arg;  // the channels stay O_NONBLOCK; blocking calls wait in poll
        return 0;
      case F_GETFD:
        return rs->fd_flags;
      case F_SETFD:
        rs->fd_flags = arg;
        return 0;
      default:
        return fail(ENOTSUP);
    }
  });
}

// A writable mapping takes a slot of the peer's iomap table (announced before the next send); a
// read-only one only registers the memory. offset -1: the buffer's address is its offset.
SOFTRDMA_EXPORT off_t riomap(int socket, void* buf, size_t len, int prot, int, off_t offset) {
  Rs* rs = lookup(socket);
  if (!rs) return fail(EBADF);
  std::lock_guard lock(rs->mu);
  if (rs->type != SOCK_STREAM || !rs->id || !rs->id->qp || (prot & ~(PROT_WRITE | PROT_NONE))) return fail(EINVAL);
  IomapMr m;
  int access = IBV_ACCESS_LOCAL_WRITE;
  if (prot & PROT_WRITE) {
    if (rs->remote_iomappings.empty()) {
      rs->remote_iomappings.resize(rs->remote_iomap.length);
      for (size_t i = 0; i < rs->remote_iomappings.size(); ++i) rs->remote_iomappings[i].index = static_cast<int>(i);
    }
    auto it = std::find_if(rs->remote_iomappings.begin(), rs->remote_iomappings.end(),
                           [](const IomapMr& x) { return !x.mr; });
    if (it == rs->remote_iomappings.end()) return fail(ENOMEM);
    m.index = it->index;
    access |= IBV_ACCESS_REMOTE_WRITE;
  }
  m.mr = ibv_reg_mr(rs->id->qp->pd, buf, len, access);
  if (!m.mr) return -1;
  m.offset = offset == -1 ? reinterpret_cast<uintptr_t>(buf) : static_cast<uint64_t>(offset);
  if (m.index >= 0) {
    rs->remote_iomappings[m.index] = m;
    rs->iomap_queue.push_back(m.index);
  } else {
    rs->local_iomappings.push_back(m);
  }
  return static_cast<off_t>(m.offset);
}

SOFTRDMA_EXPORT int riounmap(int socket, void* buf, size_t len) {
  Rs* rs = lookup(socket);
  if (!rs) return fail(EBADF);
  std::lock_guard lock(rs->mu);
  auto match = [&](const IomapMr& m) { return m.mr && m.mr->addr == buf && m.mr->length == len; };
  for (auto& m : rs->remote_iomappings)
    if (match(m)) {
      ibv_dereg_mr(m.mr);
      m.mr = nullptr;
      std::erase(rs->iomap_queue, m.index);
      return 0;
    }
  for (auto it = rs->local_iomappings.begin(); it != rs->local_iomappings.end(); ++it)
    if (match(*it)) {
      ibv_dereg_mr(it->mr);
      rs->local_iomappings.erase(it);
      return 0;
    }
  return fail(EINVAL);
}

// RDMA WRITEs into the peer's riomap'd memory; the peer is not told (it learns through a send).
SOFTRDMA_EXPORT size_t riowrite(int socket, const void* buf, size_t count, off_t offset, int flags) {
  Rs* rs = lookup(socket);
  if (!rs) return static_cast<size_t>(fail(EBADF));
  if (rs->type != SOCK_STREAM) return static_cast<size_t>(fail(EOPNOTSUPP));
  std::lock_guard sl(rs->slock);
  std::unique_lock lock(rs->mu);
  int ret = 0;
  if (!rs->iomap_queue.empty() && (ret = send_iomaps(rs, lock, flags))) return static_cast<size_t>(ret);
  const uint8_t* p = static_cast<const uint8_t*>(buf);
  size_t left = count;
  uint64_t off = static_cast<uint64_t>(offset);
  uint32_t olen = kOlapStart;
  while (left) {
    const Iomap* iom = find_iomap(rs, off);
    if (!iom) break;
    if ((ret = wait_sendable(rs, lock, flags))) break;
    uint32_t xfer = next_xfer(olen, left);
    xfer = static_cast<uint32_t>(std::min<uint64_t>({xfer, rs->sbuf_bytes_avail, iom->offset + iom->sge.length - off}));
    const uint64_t raddr = iom->sge.addr + off - iom->offset;
    const uint32_t rkey = iom->sge.key;
    auto post = [&](ibv_sge* sgl, int n, int fl) {
      rs->sqe_avail--;
      rs->sbuf_bytes_avail -= xfer;
      return post_write(rs, sgl, n, msg(kOpWrite, xfer), false, fl, raddr, rkey);
    };
    if ((ret = post_flat(rs, p, xfer, post))) break;
    p += xfer;
    off += xfer;
    left -= xfer;
  }
  return ret && left == count ? static_cast<size_t>(ret) : count - left;
}
