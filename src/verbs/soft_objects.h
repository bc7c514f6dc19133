// The libibverbs objects softrdma hands to applications. Each embeds rdma-core's public struct first,
// so the pointer an application holds converts back with a cast; everything else is translation state.
#pragma once
#include <infiniband/verbs.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/cq.h"
#include "core/event_queue.h"
#include "core/mr.h"
#include "net/interfaces.h"
#include "transport/engine.h"
#include "transport/srq.h"

#define SOFTRDMA_EXPORT extern "C" __attribute__((visibility("default")))

namespace softrdma::verbs {

struct SoftDevice {
  ibv_device dev;  // first: applications hold &dev
  net::Interface iface;
  uint64_t guid_be;
  int index;
  bool iwarp = false;  // an iWARP device (SOFTRDMA_TRANSPORT=iwarp|both; docs/iwarp.md)
  std::atomic<uint64_t> dm_used{0};  // bytes of device memory allocated in this process (dm.cpp)
};

struct SoftPd;
struct SoftMr;
struct DmBuffer;

// What the kernel keeps per uverbs file: the engine and every object by handle. ibv_open_device makes
// one; ibv_import_device (import.cpp) makes another context over the same one, found through the
// memfd that is its cmd_fd. It lives while any context on it does.
struct ContextShared {
  SoftDevice* device = nullptr;
  std::unique_ptr<transport::Engine> engine;
  std::atomic<uint32_t> next_handle{1};
  std::atomic<uint32_t> pds{0}, cqs{0};  // against max_pd / max_cq
  uint64_t fd_dev = 0, fd_ino = 0;       // the cmd_fd memfd's inode (the import registry's key)
  int owner_pid = 0;                      // the process whose engine this is
  std::mutex mu;                          // the handle tables and the import counts below
  std::unordered_map<uint32_t, SoftPd*> pds_by_handle;
  std::unordered_map<uint32_t, SoftMr*> mrs_by_handle;
  std::unordered_map<uint32_t, std::shared_ptr<DmBuffer>> dms_by_handle;
  ~ContextShared();
};

struct SoftContext {
  verbs_context vctx;  // ends with the ibv_context applications hold
  SoftDevice* device;
  std::shared_ptr<ContextShared> shared;
  transport::Engine* engine;
  std::atomic<uint32_t>& next_handle;
  std::atomic<uint32_t>& pds;
  std::atomic<uint32_t>& cqs;
  explicit SoftContext(std::shared_ptr<ContextShared> s)
      : vctx{}, device(s->device), shared(s), engine(s->engine.get()), next_handle(s->next_handle),
        pds(s->pds), cqs(s->cqs) {}
};

// Takes one of `limit` slots of a per-context object count; false when all are taken.
inline bool take_slot(std::atomic<uint32_t>& count, uint32_t limit) {
  uint32_t n = count.load();
  do {
    if (n >= limit) return false;
  } while (!count.compare_exchange_weak(n, n + 1));
  return true;
}

struct SoftPd {
  ibv_pd pd;
  std::atomic<int> users{0};  // MRs and QPs created in it: dealloc is refused while any remain
  // ibv_import_pd (import.cpp): an import names the original, which holds the object's state. Every
  // struct is given back by a successful dealloc through it or by unimport; the original's memory
  // goes once the object is destroyed and no struct refers to it (ContextShared::mu guards these).
  SoftPd* origin = nullptr;
  int imports = 0;
  bool destroyed = false;
  bool released = false;  // the original's own struct was given back
  bool parent_domain = false;  // made by ibv_alloc_parent_domain (verbs/parent_domain.h)
};
// The PD object itself: an imported PD resolves to the original.
inline SoftPd* to_pd(ibv_pd* p) {
  auto* s = reinterpret_cast<SoftPd*>(p);
  return s->origin ? s->origin : s;
}

// Device memory (dm.cpp): host pages standing for on-device memory, shared by the ibv_dm, its
// imports and the MRs on it.
struct DmBuffer {
  uint8_t* base = nullptr;
  size_t length = 0;     // as allocated
  size_t map_len = 0;    // whole pages
  uint64_t charged = 0;  // against SoftDevice::dm_used until ibv_free_dm
  SoftDevice* device = nullptr;
  std::atomic<int> mrs{0};  // MRs registered on it: ibv_free_dm is refused while any remain
  std::atomic<bool> destroyed{false};
  ~DmBuffer();
};

struct SoftDm {
  ibv_dm dm;  // first: applications hold &dm
  std::shared_ptr<DmBuffer> buf;
  bool imported = false;
};

struct SoftMr {
  ibv_mr mr;
  core::MrRegion region;
  std::shared_ptr<DmBuffer> dm;  // ibv_reg_dm_mr: the device memory the region lies in
  SoftMr* origin = nullptr;      // ibv_import_mr, as SoftPd::origin
  int imports = 0;
  bool destroyed = false;
  bool released = false;
};

// A completion channel. Its fd (channel.fd) is the event pipe's, readable exactly when an event is
// queued, as the kernel's. A thread blocked in ibv_get_cq_event sleeps instead on wait_fd, an epoll set
// of the pipe and the input of the engines of its CQs (Engine::input_fd), and does the engines' work
// itself, so one wake-up carries a message to it; it reads the pipe through reader_fd, a non-blocking
// description of its own (channel.fd's O_NONBLOCK is the application's). -1: none, the plain pipe.
struct SoftChannel {
  ibv_comp_channel channel;
  core::EventQueue<struct SoftCq*> events;
  int wait_fd = -1;
  int reader_fd = -1;
  // The last blocking ibv_get_cq_event slept on wait_fd: the application waits there, so the next one
  // takes the sockets from the progress thread as it enters (Engine::waiter_arrives).
  std::atomic<bool> waits_here{false};
  // The engines of its CQs: a wake-up byte from an intra-host peer has them place what it left.
  std::mutex engines_mu;
  std::vector<transport::Engine*> engines;
  ~SoftChannel() {
    if (wait_fd >= 0) close(wait_fd);
    if (reader_fd >= 0) close(reader_fd);
  }
};

struct SoftCq {
  ibv_cq_ex cq;  // an ibv_cq_ex starts with the ibv_cq fields
  std::unique_ptr<core::CompletionQueue> queue;
  SoftChannel* channel = nullptr;
  std::atomic<int> qp_refs{0};
  std::atomic<uint32_t> events_delivered{0};
  ibv_pd* parent_domain = nullptr;  // ibv_create_cq_ex's, whose allocator placed this object
  // ibv_create_cq_ex (cq_ex.cpp): the CQE between ibv_start_poll and ibv_end_poll that the
  // ibv_wc_read_* accessors read, and the lock that makes that span a critical section.
  core::Cqe current{};
  std::mutex poll_ex_mutex;
  bool poll_ex_locked = false;  // false for IBV_CREATE_CQ_ATTR_SINGLE_THREADED
};

// An XRC domain handle (xrc.cpp). Handles opened on the same file (same inode) share one domain.
struct XrcDomain;
struct SoftXrcd {
  ibv_xrcd xrcd;  // first: applications hold &xrcd
  XrcDomain* domain = nullptr;
  uint32_t id = 0;            // the domain's number, what the transport compares (never 0)
  std::atomic<int> users{0};  // XRC SRQs and XRC_RECV QPs created in it: close is EBUSY while any remain
};
inline SoftXrcd* to_xrcd(ibv_xrcd* x) { return reinterpret_cast<SoftXrcd*>(x); }

struct SoftQp {
  ibv_qp_ex qpx;  // starts with the ibv_qp applications hold
  transport::Qp* tqp = nullptr;
  SoftXrcd* xrcd = nullptr;  // XRC_RECV: its domain
  // XRC_RECV handles (xrc.cpp): a handle of ibv_open_qp names the QP it opened (the one created);
  // the created one counts the handles that share it. The QP goes when its last handle does.
  SoftQp* opened_of = nullptr;
  int handles = 1;  // under the XRC target registry's lock
  ibv_qp_attr attr{};          // every attribute as last set, for ibv_query_qp
  ibv_qp_init_attr init{};
  std::vector<transport::SendWqe> staged;  // ibv_wr_start .. ibv_wr_complete
  int staged_error = 0;
  std::mutex wr_mutex;  // held from ibv_wr_start to ibv_wr_complete/abort (ibv_wr_post(3) CONCURRENCY)
  struct SoftRwqIndTable* ind_table = nullptr;  // an RSS QP's (raw.cpp)
  int iw_fd = -1;  // an iWARP QP attached over the direct path: its TCP socket, kept until destroy (iwarp.cpp)
};

// RAW_PACKET receive-side scaling (raw.cpp): work queues and the indirection tables that group them.
struct SoftWq {
  ibv_wq wq;  // first: applications hold &wq
  transport::Wq* twq = nullptr;
  std::atomic<int> ind_refs{0};  // indirection tables holding it: destroy is refused while any remain
};
struct SoftRwqIndTable {
  ibv_rwq_ind_table table;  // first
  std::vector<SoftWq*> wqs;
  std::atomic<int> qp_refs{0};
};

struct SoftSrq {
  ibv_srq srq;  // first: applications hold &srq (transport::Srq::user points here)
  transport::Srq* tsrq = nullptr;
  SoftXrcd* xrcd = nullptr;  // an XRC SRQ: its domain
  SoftCq* cq = nullptr;      // XRC and tag-matching SRQs: the CQ of their completions (held: qp_refs)
};
inline SoftSrq* to_srq(ibv_srq* s) { return reinterpret_cast<SoftSrq*>(s); }

// vctx is SoftContext's first member, so the ibv_context inside it is at this offset in SoftContext.
inline SoftContext* to_ctx(ibv_context* c) {
  return reinterpret_cast<SoftContext*>(reinterpret_cast<uint8_t*>(c) - offsetof(verbs_context, context));
}
inline SoftCq* to_cq(ibv_cq* c) { return reinterpret_cast<SoftCq*>(c); }
inline SoftQp* to_qp(ibv_qp* q) { return reinterpret_cast<SoftQp*>(q); }
inline transport::Engine& engine_of(ibv_context* c) { return *to_ctx(c)->engine; }
inline bool is_iwarp(ibv_context* c) { return to_ctx(c)->device->iwarp; }

// device.cpp: the devices SOFTRDMA_TRANSPORT selects now (roce, iwarp or both; read at each call, each
// list made once and never freed).
const std::vector<SoftDevice*>& all_devices();
// iwarp.cpp: the verbs rules of iWARP QPs (as siw's; docs/iwarp.md). 0 or an errno.
int iwarp_check_send(const transport::SendWqe& w);
int iwarp_check_modify(ibv_qp_state cur, ibv_qp_state next, int mask);
// device.cpp: the path MTU an iWARP QP's RC attach (the direct path) uses.
ibv_mtu iwarp_rc_path_mtu(ibv_context* ctx);
// qp.cpp: ibv_modify_qp without the iWARP refusal of RTR/RTS (the attach's own transitions).
int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask, bool attach);
// A context on `shared` with every op installed (ibv_open_device, ibv_import_device); cmd_fd is its.
ibv_context* make_context(std::shared_ptr<ContextShared> shared, int cmd_fd);
// dm.cpp: the verbs_context ops of device memory, and max_dm_size.
inline constexpr uint64_t kMaxDmSize = 256 * 1024;
ibv_dm* alloc_dm(ibv_context* ctx, ibv_alloc_dm_attr* attr);
int free_dm(ibv_dm* dm);
ibv_mr* reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t offset, size_t length, unsigned int access);
// import.cpp: a new command fd naming `shared` (a memfd in the process's import registry); -1 + errno.
int open_command_fd(const std::shared_ptr<ContextShared>& shared);
// mr_cq.cpp: publishes a registered MR under its handle (ibv_import_mr finds it there).
void publish_mr(SoftMr* m);
// qp.cpp / cq.cpp: the data-path entries installed in every context's ops table.
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
// srq.cpp
int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
ibv_srq* create_srq_ex(ibv_context* ctx, ibv_srq_init_attr_ex* attr);
// tm.cpp: tag-matching SRQs (IBV_SRQT_TM), their list operations and the device's tm_caps.
ibv_srq* create_tm_srq(ibv_context* ctx, ibv_srq_init_attr_ex* attr);
int post_srq_ops(ibv_srq* srq, ibv_ops_wr* wr, ibv_ops_wr** bad);
ibv_tm_caps tm_caps();
int poll_cq(ibv_cq* cq, int n, ibv_wc* wc);
int req_notify_cq(ibv_cq* cq, int solicited_only);
// xrc.cpp: XRC domains (context ops) and SRQ numbers.
ibv_xrcd* open_xrcd(ibv_context* ctx, ibv_xrcd_init_attr* attr);
int close_xrcd(ibv_xrcd* xrcd);
int get_srq_num(ibv_srq* srq, uint32_t* srq_num);
ibv_qp* open_qp(ibv_context* ctx, ibv_qp_open_attr* attr);
// XRC_RECV QPs of this process that ibv_open_qp can find; release says whether the QP itself goes
// now (its last handle is being destroyed) and detaches the handle.
void register_xrc_target(SoftQp* q);
bool release_xrc_handle(SoftQp* q, SoftQp** owner);
// mw.cpp: memory windows (context ops), and a bind WR's translation (0 or EINVAL).
ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type);
int dealloc_mw(ibv_mw* mw);
int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind);
int fill_mw_bind(transport::SendWqe& w, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info& info);
// mr_cq.cpp: the CQ object behind ibv_create_cq and ibv_create_cq_ex (nullptr + errno on failure).
SoftCq* create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector,
                  ibv_pd* parent_domain = nullptr);
// mr_cq.cpp: ibv_advise_mr on on-demand regions (0 or an errno value).
int advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge);
// cq_ex.cpp
ibv_cq_ex* create_cq_ex(ibv_context* ctx, ibv_cq_init_attr_ex* attr);
int query_rt_values(ibv_context* ctx, ibv_values_ex* values);
ibv_qp* create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr);
int query_port_ex(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t size);
int query_device_ex(ibv_context* ctx, const ibv_query_device_ex_input* in, ibv_device_attr_ex* attr,
                    size_t size);
// raw.cpp: RAW_PACKET flow steering, WQs, indirection tables, RSS QPs (installed in verbs_context).
void install_raw_ops(verbs_context& v);
ibv_qp* create_rss_qp(ibv_context* ctx, ibv_qp_init_attr_ex* attr);
// qp.cpp: a QP of any offered type; rss (RAW_PACKET only) makes it a receive-only RSS QP.
struct RssSetup {
  SoftRwqIndTable* table = nullptr;
  std::vector<uint8_t> key;
  uint64_t fields = 0;
};
ibv_qp* create_qp_with(ibv_context* ctx, ibv_pd* pd, const ibv_qp_init_attr& ia, const RssSetup* rss);
void fill_raw_caps(ibv_device_attr_ex& a);

}  // namespace softrdma::verbs
