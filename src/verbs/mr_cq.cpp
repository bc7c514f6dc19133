// Memory regions, completion queues and completion channels.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/limits.h"
#include "verbs/parent_domain.h"
#include "verbs/soft_objects.h"

using namespace softrdma;
using namespace softrdma::verbs;

static_assert(static_cast<int>(core::WcStatus::GeneralErr) == IBV_WC_GENERAL_ERR);
static_assert(static_cast<int>(core::WcStatus::RetryExcErr) == IBV_WC_RETRY_EXC_ERR);
static_assert(static_cast<int>(core::WcOpcode::RecvRdmaWithImm) == IBV_WC_RECV_RDMA_WITH_IMM);
static_assert(static_cast<int>(core::WcOpcode::FetchAdd) == IBV_WC_FETCH_ADD);
static_assert(+core::kWcWithImm == +IBV_WC_WITH_IMM && +core::kWcWithInv == +IBV_WC_WITH_INV);
static_assert(+core::kOnDemand == +IBV_ACCESS_ON_DEMAND && +core::kMwBind == +IBV_ACCESS_MW_BIND);
static_assert(+core::kLocalWrite == +IBV_ACCESS_LOCAL_WRITE && +core::kRemoteWrite == +IBV_ACCESS_REMOTE_WRITE &&
              +core::kRemoteRead == +IBV_ACCESS_REMOTE_READ && +core::kRemoteAtomic == +IBV_ACCESS_REMOTE_ATOMIC);

namespace {
// The access bits a region keeps (the others are hints to the registration or are refused there).
constexpr unsigned kMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                               IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ON_DEMAND;

// Every page of [addr, addr+len) must be mapped, as pinning would require of a real HCA.
bool range_is_mapped(const void* addr, size_t len) {
  long page = sysconf(_SC_PAGESIZE);
  uintptr_t start = reinterpret_cast<uintptr_t>(addr) & ~static_cast<uintptr_t>(page - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(addr) + len;
  constexpr size_t kChunkPages = 4096;
  unsigned char vec[kChunkPages];
  for (uintptr_t p = start; p < end; p += kChunkPages * page) {
    size_t n = std::min<uintptr_t>(end - p, kChunkPages * page);
    if (mincore(reinterpret_cast<void*>(p), n, vec) != 0) return false;
  }
  return true;
}
}  // namespace

SOFTRDMA_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                         unsigned int access) {
  // REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE (IBTA 10.6.3.1; ibv_reg_mr(3)).
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;
    return nullptr;
  }
  const bool odp = access & IBV_ACCESS_ON_DEMAND;
  // An iWARP device has no on-demand paging (as siw: ib_core refuses it without the capability).
  if (odp && pd && is_iwarp(pd->context)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // Implicit on-demand paging: (NULL, SIZE_MAX) registers the whole address space, at iova 0.
  const bool implicit = odp && !addr && length == SIZE_MAX;
  if (implicit && iova != 0) {
    errno = EINVAL;
    return nullptr;
  }
  if (!implicit && (length > core::DeviceLimits::kMaxMrSize || (length && !addr))) {
    errno = EINVAL;
    return nullptr;
  }
  // An on-demand region needs no mapping yet: its pages are faulted in when an access reaches them.
  if (!odp && length && !range_is_mapped(addr, length)) {
    errno = EFAULT;
    return nullptr;
  }
  auto* m = new (std::nothrow) SoftMr{};
  if (!m) {
    errno = ENOMEM;
    return nullptr;
  }
  m->region.addr = reinterpret_cast<uint64_t>(addr);
  m->region.iova = iova;
  m->region.length = length;
  m->region.access = access & kMrAccess;
  m->region.pd = pd->handle;
  if (!engine_of(pd->context).register_mr(m->region)) {
    delete m;
    errno = ENOMEM;
    return nullptr;
  }
  ++to_pd(pd)->users;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  m->mr.handle = m->region.lkey;
  m->mr.lkey = m->region.lkey;
  m->mr.rkey = m->region.rkey;
  publish_mr(m);
  return &m->mr;
}

namespace softrdma::verbs {
void publish_mr(SoftMr* m) {
  ContextShared& sh = *to_ctx(m->mr.context)->shared;
  std::lock_guard lock(sh.mu);
  try {
    sh.mrs_by_handle[m->mr.handle] = m;
  } catch (const std::bad_alloc&) {
    // Not importable then; the MR itself is fine.
  }
}
}  // namespace softrdma::verbs

#undef ibv_reg_mr
SOFTRDMA_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uint64_t>(addr), static_cast<unsigned>(access));
}

#undef ibv_reg_mr_iova
SOFTRDMA_EXPORT ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

// Destroys the MR object, through the original or an import of it (ibv_import_mr), and gives that
// struct back; the original's memory stays while any struct refers to it.
SOFTRDMA_EXPORT int ibv_dereg_mr(ibv_mr* mr) {
  auto* self = reinterpret_cast<SoftMr*>(mr);
  SoftMr* m = self->origin ? self->origin : self;
  ContextShared& sh = *to_ctx(mr->context)->shared;
  std::lock_guard lock(sh.mu);
  if (m->destroyed) return EINVAL;  // an import of an MR already deregistered: only unimport is left
  if (int rc = engine_of(mr->context).deregister_mr(m->region)) return rc;  // EBUSY: windows bound to it
  --to_pd(m->mr.pd)->users;
  if (m->dm) --m->dm->mrs;
  auto it = sh.mrs_by_handle.find(m->mr.handle);
  if (it != sh.mrs_by_handle.end() && it->second == m) sh.mrs_by_handle.erase(it);
  m->destroyed = true;
  if (self != m) {
    --m->imports;
    delete self;
  } else {
    m->released = true;
  }
  if (m->imports == 0 && m->released) delete m;
  return 0;
}

namespace softrdma::verbs {

// ibv_advise_mr(3): the prefetch advices fault the SGEs' pages in (writable too for PREFETCH_WRITE),
// always before returning, so IBV_ADVISE_MR_FLAG_FLUSH changes nothing; PREFETCH_NO_FAULT only
// checks the SGEs, as pages already present are all an access finds without faulting.
int advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge) {
  if (flags & ~uint32_t{IBV_ADVISE_MR_FLAG_FLUSH}) return EINVAL;
  if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
      advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
    return EOPNOTSUPP;
  if (num_sge == 0 || !sg_list) return EINVAL;
  const bool write = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
  // Every SGE is checked before any is faulted in.
  std::vector<core::MrRegion> regions(num_sge);
  for (uint32_t i = 0; i < num_sge; ++i) {
    const ibv_sge& g = sg_list[i];
    core::MrRegion& r = regions[i];
    if (!engine_of(pd->context).lookup_mr(g.lkey, &r)) return EFAULT;  // no such lkey
    if (r.pd != pd->handle) return EPERM;                              // outside this PD's scope
    if (!(r.access & core::kOnDemand)) return ENOENT;                  // not an on-demand region
    if (write && !(r.access & core::kLocalWrite)) return EPERM;        // not registered writable
    if (g.addr < r.iova || g.addr - r.iova > r.length || g.length > r.length - (g.addr - r.iova)) return EFAULT;
  }
  if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) return 0;
  for (uint32_t i = 0; i < num_sge; ++i) {
    const core::MrRegion& r = regions[i];
    if (!core::fault_in(r.addr + (sg_list[i].addr - r.iova), sg_list[i].length, write)) return EFAULT;
  }
  return 0;
}

}  // namespace softrdma::verbs

// ibv_rereg_mr(3). The checks libibverbs makes before it asks the provider fail with
// IBV_REREG_MR_ERR_INPUT; what the kernel and the device would refuse fails with IBV_REREG_MR_ERR_CMD.
// Either way the MR is unchanged and usable (stronger than ERR_CMD promises). pd is read only with
// IBV_REREG_MR_CHANGE_PD. The keys stay the same (hardware may hand out new ones: callers read
// mr->lkey and mr->rkey again, which stay right). Through an import (ibv_import_mr) it changes the
// one MR object; the other imports' structs keep what they said, as with libibverbs.
SOFTRDMA_EXPORT int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  constexpr int kAll = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
  auto* self = reinterpret_cast<SoftMr*>(mr);
  SoftMr* m = self->origin ? self->origin : self;
  const bool translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION;
  // A device-memory MR is no IBV_MR_TYPE_MR: libibverbs refuses it first.
  if (m->dm || (flags & ~kAll) || (translation && (!length || !addr)) ||
      (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS))) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  auto fail = [](int err) {
    errno = err;
    return IBV_REREG_MR_ERR_CMD;
  };
  if (!flags) return fail(EINVAL);
  ContextShared& sh = *to_ctx(mr->context)->shared;
  std::lock_guard lock(sh.mu);  // against a deregistration or import of the same MR meanwhile
  if (m->destroyed) return fail(EINVAL);
  core::MrRegion wanted = m->region;
  // On-demand regions are not re-registered (nor made on-demand by it), as ConnectX long refused.
  if (wanted.access & core::kOnDemand) return fail(EOPNOTSUPP);
  if (flags & IBV_REREG_MR_CHANGE_PD) {
    if (!pd || pd->context != mr->context) return fail(EINVAL);
    wanted.pd = pd->handle;
  }
  if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
    const auto a = static_cast<unsigned>(access);
    if ((a & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(a & IBV_ACCESS_LOCAL_WRITE))
      return fail(EINVAL);
    if (a & IBV_ACCESS_ON_DEMAND) return fail(EOPNOTSUPP);
    wanted.access = a & kMrAccess;
  }
  if (translation) {
    if (length > core::DeviceLimits::kMaxMrSize) return fail(EINVAL);
    if (!range_is_mapped(addr, length)) return fail(EFAULT);
    wanted.addr = reinterpret_cast<uint64_t>(addr);
    wanted.iova = wanted.addr;  // as ibv_reg_mr: the region is addressed by its virtual addresses
    wanted.length = length;
  }
  if (int rc = engine_of(mr->context).reregister_mr(m->region, wanted, translation)) return fail(rc);
  self->region = m->region;
  if (flags & IBV_REREG_MR_CHANGE_PD) {
    --to_pd(m->mr.pd)->users;
    ++to_pd(pd)->users;
  }
  for (SoftMr* s : {m, self}) {  // the same one twice when mr is no import: harmless
    if (flags & IBV_REREG_MR_CHANGE_PD) s->mr.pd = pd;
    if (translation) {
      s->mr.addr = addr;
      s->mr.length = length;
    }
  }
  return 0;
}

SOFTRDMA_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* ctx) {
  SoftChannel* ch = nullptr;
  try {
    ch = new SoftChannel{};
  } catch (const std::exception&) {
    errno = EMFILE;
    return nullptr;
  }
  ch->channel.context = ctx;
  ch->channel.fd = ch->events.fd();
  // A second open file description of the pipe (its own O_NONBLOCK) through /proc; without /proc, or
  // without epoll, ibv_get_cq_event reads the pipe itself and the progress thread does the work.
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", ch->events.fd());
  ch->reader_fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ch->wait_fd = ch->reader_fd >= 0 ? epoll_create1(EPOLL_CLOEXEC) : -1;
  epoll_event ev{};
  ev.events = EPOLLIN;
  if (ch->wait_fd < 0 || epoll_ctl(ch->wait_fd, EPOLL_CTL_ADD, ch->reader_fd, &ev) != 0) {
    if (ch->wait_fd >= 0) close(ch->wait_fd);
    if (ch->reader_fd >= 0) close(ch->reader_fd);
    ch->wait_fd = ch->reader_fd = -1;
  }
  ch->events.set_empty_wake([ch] {
    std::vector<transport::Engine*> engines;
    {
      std::lock_guard lock(ch->engines_mu);
      engines = ch->engines;
    }
    for (transport::Engine* e : engines) e->place_direct();
  });
  ch->channel.refcnt = 0;
  return &ch->channel;
}

SOFTRDMA_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  if (channel->refcnt) return EBUSY;
  delete reinterpret_cast<SoftChannel*>(channel);
  return 0;
}

namespace softrdma::verbs {

SoftCq* create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector,
                  ibv_pd* parent_domain) {
  if (cqe < 1 || static_cast<uint32_t>(cqe) > core::DeviceLimits::kMaxCqe || comp_vector < 0 ||
      comp_vector >= ctx->num_comp_vectors) {
    errno = EINVAL;
    return nullptr;
  }
  if (!take_slot(to_ctx(ctx)->cqs, core::DeviceLimits::kMaxCq)) {
    errno = ENOMEM;
    return nullptr;
  }
  // With a parent domain that has allocators, the CQ object lives in the application's memory (the
  // ring stays in the context's arena, where intra-host peers reach it).
  auto* cq = pd_new<SoftCq>(parent_domain, kResourceCq);
  if (!cq) {
    --to_ctx(ctx)->cqs;
    errno = ENOMEM;
    return nullptr;
  }
  cq->parent_domain = parent_domain;
  cq->channel = reinterpret_cast<SoftChannel*>(channel);
  core::CompletionQueue::EventFn notify;
  if (cq->channel) {
    notify = [cq](core::CompletionQueue&, bool woken) {
      cq->events_delivered.fetch_add(1);
      // One wake-up byte per event: an intra-host initiator that claimed it wrote the byte already.
      cq->channel->events.push(cq, !woken);
    };
  }
  try {
    cq->queue = engine_of(ctx).create_cq(static_cast<uint32_t>(cqe), std::move(notify));
  } catch (const std::bad_alloc&) {
    pd_delete(parent_domain, cq, kResourceCq);
    --to_ctx(ctx)->cqs;
    errno = ENOMEM;
    return nullptr;
  }
  cq->queue->user = cq;
  if (cq->channel) {
    cq->queue->set_wake_fd(cq->channel->events.write_fd());
    std::lock_guard lock(cq->channel->engines_mu);
    auto& es = cq->channel->engines;
    if (std::find(es.begin(), es.end(), &engine_of(ctx)) == es.end()) {
      es.push_back(&engine_of(ctx));
      epoll_event ev{};
      ev.events = EPOLLIN;
      if (cq->channel->wait_fd >= 0) epoll_ctl(cq->channel->wait_fd, EPOLL_CTL_ADD, engine_of(ctx).input_fd(), &ev);
    }
  }
  ibv_cq_ex& c = cq->cq;
  c.context = ctx;
  c.channel = channel;
  c.cq_context = cq_context;
  c.handle = to_ctx(ctx)->next_handle.fetch_add(1);
  c.cqe = static_cast<int>(cq->queue->capacity());
  pthread_mutex_init(&c.mutex, nullptr);
  pthread_cond_init(&c.cond, nullptr);
  if (channel) ++channel->refcnt;
  if (parent_domain) ++to_pd(parent_domain)->users;
  return cq;
}

}  // namespace softrdma::verbs

SOFTRDMA_EXPORT ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel,
                                      int comp_vector) {
  return reinterpret_cast<ibv_cq*>(create_cq(ctx, cqe, cq_context, channel, comp_vector));
}

SOFTRDMA_EXPORT int ibv_destroy_cq(ibv_cq* ibcq) {
  SoftCq* cq = to_cq(ibcq);
  if (cq->qp_refs.load()) return EBUSY;
  engine_of(ibcq->context).destroy_cq(cq->queue.get());
  if (cq->channel) {
    // Events not yet read by the application die with the CQ; events read must have been acked.
    uint32_t discarded = 0;
    cq->channel->events.discard_if([&](SoftCq* c) {
      bool mine = c == cq;
      discarded += mine;
      return mine;
    });
    pthread_mutex_lock(&ibcq->mutex);
    while (ibcq->comp_events_completed + discarded < cq->events_delivered.load())
      pthread_cond_wait(&ibcq->cond, &ibcq->mutex);
    pthread_mutex_unlock(&ibcq->mutex);
    --cq->channel->channel.refcnt;
  }
  pthread_cond_destroy(&ibcq->cond);
  pthread_mutex_destroy(&ibcq->mutex);
  --to_ctx(ibcq->context)->cqs;
  ibv_pd* pd = cq->parent_domain;
  pd_delete(pd, cq, kResourceCq);
  if (pd) --to_pd(pd)->users;  // last: a parent domain's free() may run only while it exists
  return 0;
}

SOFTRDMA_EXPORT int ibv_resize_cq(ibv_cq* cq, int cqe) {
  // cqe is a minimum (ibv_resize_cq(3)); the ring rounds it up to a power of two and cq->cqe says
  // what it holds. Shrinking below the CQEs present is refused, and the CQ is then unchanged.
  if (cqe < 1 || static_cast<uint32_t>(cqe) > core::DeviceLimits::kMaxCqe) return errno = EINVAL;
  SoftCq* c = to_cq(cq);
  if (int rc = engine_of(cq->context).resize_cq(c->queue.get(), static_cast<uint32_t>(cqe))) return errno = rc;
  c->cq.cqe = static_cast<int>(c->queue->capacity());
  return 0;
}

namespace {

// Faults are delivered to the faulting thread, never to one asleep in a wait (sanitizers and crash
// reporters install handlers for them without SA_RESTART), and must never be blocked.
constexpr int kFaultSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS};
bool is_fault_signal(int sig) { return std::ranges::count(kFaultSignals, sig) != 0; }

// A read of the kernel's channel fd, interrupted by a signal whose handler ran, fails with EINTR
// unless the handler has SA_RESTART, and a stop (SIGSTOP, a debugger) does not interrupt it at all.
// ppoll gives the second (it restarts when no handler ran, where epoll_wait fails); for the first,
// after EINTR: restart when every installed handler has SA_RESTART (the one that ran is among them).
bool restartable_interrupt() {
  for (int sig = 1; sig < SIGRTMAX; ++sig) {
    if (is_fault_signal(sig)) continue;
    struct sigaction sa{};
    if (sigaction(sig, nullptr, &sa) != 0) continue;
    const bool handled = (sa.sa_flags & SA_SIGINFO) ? sa.sa_sigaction != nullptr
                                                    : sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
    if (handled && !(sa.sa_flags & SA_RESTART)) return false;
  }
  return true;
}

// Waits for the next event of a channel whose fd blocks, doing its engines' work in this thread
// meanwhile (Engine::waiter_pass): before it sleeps, on every wake-up and at every timer of theirs.
// 0, or -1 with errno EINTR (a signal ends the wait, as it ends a read of the kernel's channel fd: qperf
// stops its loop from SIGALRM). An application that polls channel.fd itself, or made it non-blocking,
// finds the event there already and leaves the work to the progress thread.
int wait_event(SoftChannel* ch, SoftCq*& out) {
  // Signals stay blocked from here until the sleep, whose ppoll unblocks them while it waits: one that
  // comes during a pass interrupts the next sleep instead of being lost before it (a read of the
  // kernel's fd blocks once; this loop passes and sleeps many times, and a lost SIGALRM left qperf's
  // or EndsOnSignal's wait asleep for good). Faults are not blocked.
  sigset_t block, old;
  sigfillset(&block);
  for (int sig : kFaultSignals) sigdelset(&block, sig);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  struct Unblock {
    const sigset_t* mask;
    ~Unblock() { pthread_sigmask(SIG_SETMASK, mask, nullptr); }
  } unblock{&old};
  if (ch->waits_here.load(std::memory_order_relaxed)) {
    std::lock_guard lock(ch->engines_mu);
    for (transport::Engine* e : ch->engines) e->waiter_arrives();
  }
  if (ch->events.try_pop(ch->reader_fd, out)) {
    ch->waits_here.store(false, std::memory_order_relaxed);
    return 0;
  }
  std::vector<transport::Engine*> engines;
  for (;;) {
    uint64_t deadline = 0;
    bool drives = true;
    {
      std::lock_guard lock(ch->engines_mu);
      for (transport::Engine* e : ch->engines) drives = e->waiter_pass(&deadline) && drives;
      engines = ch->engines;
    }
    if (ch->events.try_pop(ch->reader_fd, out)) return 0;
    int n;
    if (drives) {
      // Asleep on the pipe and the engines' sockets, until the earliest timer of theirs.
      ch->waits_here.store(true, std::memory_order_relaxed);
      for (transport::Engine* e : engines) e->waiter_sleeps(true);
      timespec ts{};
      if (deadline) {
        const uint64_t t = engines.front()->now();
        const uint64_t wait = deadline > t ? deadline - t : 0;
        ts = {static_cast<time_t>(wait / 1000000000ull), static_cast<long>(wait % 1000000000ull)};
      }
      pollfd p{ch->wait_fd, POLLIN, 0};
      n = ppoll(&p, 1, deadline ? &ts : nullptr, &old);
      const int err = errno;
      for (transport::Engine* e : engines) e->waiter_sleeps(false);
      errno = err;
    } else {
      // The progress threads serve the sockets: the pipe alone, whose byte they write.
      pollfd p{ch->reader_fd, POLLIN, 0};
      n = ppoll(&p, 1, nullptr, &old);
    }
    if (n < 0 && errno == EINTR && !restartable_interrupt()) return -1;
    if (ch->events.try_pop(ch->reader_fd, out)) return 0;
  }
}

}  // namespace

SOFTRDMA_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  SoftCq* c = nullptr;
  SoftChannel* ch = reinterpret_cast<SoftChannel*>(channel);
  const bool blocking = ch->wait_fd >= 0 && !(fcntl(channel->fd, F_GETFL) & O_NONBLOCK);
  if ((blocking ? wait_event(ch, c) : ch->events.pop(c)) != 0) return -1;
  *cq = reinterpret_cast<ibv_cq*>(c);
  *cq_context = c->cq.cq_context;
  return 0;
}

SOFTRDMA_EXPORT void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

namespace softrdma::verbs {

int poll_cq(ibv_cq* ibcq, int n, ibv_wc* wc) {
  SoftCq* cq = to_cq(ibcq);
  if (n < 0) return -1;
  int total = 0;
  while (total < n) {
    core::Cqe cqes[32];
    int got = engine_of(ibcq->context).poll_cq(cq->queue.get(), cqes, std::min(n - total, 32));
    for (int i = 0; i < got; ++i) {
      const core::Cqe& c = cqes[i];
      ibv_wc& w = wc[total + i];
      std::memset(&w, 0, sizeof w);
      w.wr_id = c.wr_id;
      w.status = static_cast<ibv_wc_status>(c.status);
      w.opcode = static_cast<ibv_wc_opcode>(c.opcode);
      w.vendor_err = c.vendor_err;
      w.byte_len = c.byte_len;
      w.imm_data = c.imm_or_inv;
      w.qp_num = c.qp_num;
      w.src_qp = c.src_qp;
      w.wc_flags = c.wc_flags;
      w.sl = c.sl;
    }
    total += got;
    if (got < 32) break;
  }
  return total;
}

int req_notify_cq(ibv_cq* ibcq, int solicited_only) {
  engine_of(ibcq->context).arm_cq(to_cq(ibcq)->queue.get(), solicited_only != 0);
  return 0;
}

}  // namespace softrdma::verbs
