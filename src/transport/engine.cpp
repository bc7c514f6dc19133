// The engine (engine.h): a context's objects built and torn down, the progress loop and its passes,
// delivery of a packet to its QP's path, QPs and their state changes, posting, polling, memory
// registration's effect on operations in flight, and error and flush.
#include "transport/engine.h"

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <type_traits>

#include "net/registry.h"
#include "transport/direct_share.h"
#include "transport/datagram_path.h"
#include "transport/direct_path.h"
#include "transport/iwarp_path.h"
#include "transport/rc_path.h"
#include "transport/roce_ports.h"
#include "transport/raw_path.h"
#include "transport/srq.h"
#include "transport/work_request.h"
#include "wire/cm_mad.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace softrdma::transport {

uint64_t now_ns() { return net::SystemClock::instance().now_ns(); }

namespace {
// The arena is a sparse memfd: only the pages that rings and tables touch cost memory.
constexpr size_t kArenaBytes = size_t{1} << 30;

// True when more threads are runnable than there are CPUs (/proc/stat procs_running, which counts
// us). Spinning then only steals the core from the thread that would produce our next packet: a
// blocked thread woken by the kernel (~20 us) beats a spinner waiting for a scheduler tick (~4 ms).
bool cpus_oversubscribed() {
  static const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  FILE* f = fopen("/proc/stat", "re");
  if (!f) return false;
  char line[256];
  long running = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "procs_running %ld", &running) == 1) break;
  fclose(f);
  return running > ncpu;
}

// The process's live engines, for flush_all_held at exit (an atexit handler, registered with it).
// Never destroyed: exit-time code uses it. A forked child starts with none: its parent's engines have
// no thread there and are not its to flush.
struct LiveEngines {
  std::mutex mu;
  std::vector<Engine*> all;
};
LiveEngines& live_engines() {
  static LiveEngines* l = [] {
    auto* n = new LiveEngines;
    atexit(Engine::flush_all_held);
    pthread_atfork([] { live_engines().mu.lock(); }, [] { live_engines().mu.unlock(); },
                   [] {
                     live_engines().all.clear();
                     live_engines().mu.unlock();
                   });
    return n;
  }();
  return *l;
}
}  // namespace

void Engine::flush_all_held() {
  LiveEngines& l = live_engines();
  std::lock_guard lock(l.mu);
  for (Engine* e : l.all) {
    // Bounded: the lock's holder (a pass of another thread) flushes at its end anyway.
    bool locked = false;
    for (int i = 0; i < 1000 && !(locked = e->lock_.try_lock()); ++i) sched_yield();
    if (!locked) continue;
    e->flush_held();
    e->lock_.unlock();
  }
}

Engine::Engine(const net::Interface& iface, EngineOptions opts)
    : iface_(iface), arena_(kArenaBytes), mrs_(arena_), opts_(std::move(opts)),
      clock_(opts_.clock ? opts_.clock : &net::SystemClock::instance()),
      stats_((iface.ip.is_v4() ? "softrdma_" : "softrdma6_") + iface.ifname, opts_.stats_mode),  // as verbs names the device
      spin_ns_(opts_.spin_us * 1000ull) {
  placement_ = std::make_unique<Placement>(*this);
  srq_table_ = std::make_unique<SrqTable>(*this);
  protection_ = std::make_unique<WireProtection>(*this);
  rc_ = std::make_unique<RcPath>(*this);
  direct_path_ = std::make_unique<DirectPath>(*this, *rc_);
  datagram_ = std::make_unique<DatagramPath>(*this);
  raw_ = std::make_unique<RawPath>(*this);
  iwarp_ = std::make_unique<IwarpPath>(*this);
  paths_[0] = raw_.get();
  paths_[1] = iwarp_.get();
  paths_[2] = rc_.get();
  paths_[3] = direct_path_.get();
  paths_[4] = datagram_.get();
  if (!opts_.open_port) {
    opts_.open_port = [](const wire::IpAddress& ip, uint16_t port) -> std::unique_ptr<net::PacketPort> {
      return std::make_unique<net::UdpPort>(ip, port);
    };
    opts_.adopt_port = [](int fd) -> std::unique_ptr<net::PacketPort> {
      return std::make_unique<net::UdpPort>(net::UdpPort::Adopt{}, fd);
    };
  }
  doorbell_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (doorbell_fd_ < 0 || epoll_fd_ < 0) throw std::system_error(errno, std::generic_category(), "engine fds");
  quiet_epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  input_epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (quiet_epoll_fd_ < 0 || input_epoll_fd_ < 0) throw std::system_error(errno, std::generic_category(), "engine fds");
  ports_ = std::make_unique<RocePorts>(*this, opts_.open_port, opts_.adopt_port, opts_.take_roce_port, opts_.capture);
  {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = doorbell_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, doorbell_fd_, &ev);
  }
  {
    // While an application thread spins in poll_cq it drives the engine; the progress thread then
    // sleeps on the doorbell alone, so packets do not wake it on the application's core.
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = doorbell_fd_;
    epoll_ctl(quiet_epoll_fd_, EPOLL_CTL_ADD, doorbell_fd_, &ev);
  }
  if (opts_.link_monitor) start_link_monitor();
  sq_credits_ = std::make_unique<SqCredit[]>(core::DeviceLimits::kMaxQp);
  for (uint32_t i = core::DeviceLimits::kMaxQp; i-- > 0;) free_credits_.push_back(i);
  ports_->try_take_roce_port(0);
  if (opts_.direct) {
    try {
      direct_ = std::make_unique<DirectEndpoint>(arena_, mrs_, iface_.ip.key(), ports_->port(), doorbell_fd_,
                                                 &stats_.device(), opts_.direct_peers);
    } catch (const std::system_error&) {
      direct_.reset();  // this context is reached by packets only
      ++stats_.device().direct_unavailable;
    }
  }
  // The progress thread takes none of the application's signals (SIGALRM timers, SIGINT handlers):
  // they must reach the application's own threads. It inherits the mask it is created with.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  if (opts_.progress_thread) thread_ = std::thread([this] { progress_loop(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  // Last: an engine whose construction threw is never in the list.
  LiveEngines& l = live_engines();
  std::lock_guard lock(l.mu);
  l.all.push_back(this);
}

Engine::~Engine() {
  {
    LiveEngines& l = live_engines();
    std::lock_guard lock(l.mu);
    l.all.erase(std::remove(l.all.begin(), l.all.end(), this), l.all.end());
  }
  if (opts_.dump_counters) {
    // A post-mortem for debugging (docs/debugging.md): what this context's engine saw.
    // Appended piece by piece: operator+ on std::string draws GCC 12 -Wrestrict false positives at -O3.
    std::string line = "softrdma ";
    line.append(iface_.ifname).append(":");
    const auto& names = core::counter_names();
    const uint64_t* v = core::counter_values(stats_.device());
    for (size_t i = 0; i < names.size(); ++i)
      if (v[i]) line.append(" ").append(names[i]).append(" ").append(std::to_string(v[i]));
    fprintf(stderr, "%s\n", line.c_str());
  }
  stop_.store(true);
  doorbell();
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(doorbell_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(lock_);
  flush_held();  // the ACKs the application's last poll held: its peers' last messages complete
  for (Qp* qp : qp_list_) {
    path_of(*qp).release(*qp);  // an iWARP QP's socket is closed with it
    net::Registry::instance().release_qpn(qp->qpn);
    arena_.release(qp->rq.slots, qp->rq_bytes);
    delete qp;
  }
  srq_table_.reset();  // its rings are in the arena
  ports_->stop_watching();
  close(doorbell_fd_);
  close(epoll_fd_);
  close(quiet_epoll_fd_);
  close(input_epoll_fd_);
}

core::Counters Engine::counters() {
  std::lock_guard lock(lock_);
  return stats_.device();
}

void Engine::doorbell(bool rouse_quiet) {
  work_hint_.fetch_add(1, std::memory_order_release);
  if (sleeping_.load(std::memory_order_seq_cst) || (rouse_quiet && quiet_.load(std::memory_order_seq_cst))) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(doorbell_fd_, &one, sizeof one);
  }
}

void Engine::progress_loop() {
  uint64_t idle_since = now();
  uint64_t load_checked_ns = 0;
  bool spin_allowed = true;
  bool unrung = false;  // the last sleep ended without a doorbell (a timeout, a packet, the link)
  while (!stop_.load(std::memory_order_acquire)) {
    bool did;
    uint64_t unrung_events = 0;
    {
      std::lock_guard lock(lock_);
      if (unrung && direct_) {
        // A direct message for an armed CQ comes with a doorbell, or is placed by the arm itself
        // (arm_cq): one whose event only a wake-up without a doorbell raises may be a lost wake-up.
        const uint64_t events = events_raised_;
        direct_path_->receive_inboxes(qp_list_);
        unrung_events = events_raised_ - events;
      }
      unrung = false;
      did = progress_once();
    }
    // The initiator publishes, then rings: a wake-up for something else (a timer, a packet) between
    // the two finds the message first. Lost only when no ring follows, even long after (an initiator
    // preempted between the two on a loaded machine rings within its next time slice).
    if (unrung_events) {
      pollfd rung{doorbell_fd_, POLLIN, 0};
      if (poll(&rung, 1, kLateRingWaitMs) == 0)
        count(nullptr, &core::Counters::direct_late_events, unrung_events);
    }
    uint64_t t = now();
    check_link(t, false);
    if (app_polling_.load(std::memory_order_acquire) && !serves_passive(t)) {
      // Run to completion: an application thread spins in poll_cq and does the engine's work itself
      // (docs/architecture.md). Stay off its core until it stops or a timer is due. Not in a context that serves
      // one-sided requests: its application may wait on memory for the next WRITE as soon as a poll
      // returns, and only this thread can place it.
      quiet_sleep();
      idle_since = now();
      continue;
    }
    if (did) {
      idle_since = t;
      continue;
    }
    if (t - idle_since < spin_ns_) {
      // Re-judged every 2 ms of spinning: the load of a 2-core machine changes fast.
      if (t - load_checked_ns >= 2000000) {
        load_checked_ns = t;
        spin_allowed = !cpus_oversubscribed();
      }
      if (spin_allowed) {
        sched_yield();
        continue;
      }
    }
    sleeping_.store(true, std::memory_order_seq_cst);
    uint64_t deadline;
    {
      std::lock_guard lock(lock_);
      did = progress_once();
      deadline = next_deadline_ns();
      const uint64_t roce_try = ports_->next_roce_try();
      if (roce_try && (!deadline || roce_try < deadline)) deadline = roce_try;
    }
    if (!did) {
      epoll_event evs[4];
      t = now();
      int nev;
      if (deadline) {
        uint64_t wait = deadline > t ? deadline - t : 0;
        timespec ts{static_cast<time_t>(wait / 1000000000ull), static_cast<long>(wait % 1000000000ull)};
        nev = epoll_pwait2(epoll_fd_, evs, 4, &ts, nullptr);
      } else {
        nev = epoll_pwait2(epoll_fd_, evs, 4, nullptr, nullptr);
      }
      for (int i = 0; i < nev; ++i) {
        if (link_ && evs[i].data.fd == link_->fd()) check_link(now(), true);
        if (evs[i].data.fd != doorbell_fd_) {
          std::lock_guard lock(lock_);  // the ports' service sockets (liveness, 4791's offer)
          ports_->serve(evs[i].data.fd);
        }
      }
      uint64_t v;
      unrung = read(doorbell_fd_, &v, sizeof v) != sizeof v;
    }
    sleeping_.store(false, std::memory_order_release);
    idle_since = now();
  }
}

void Engine::quiet_sleep() {
  uint64_t deadline;
  const uint64_t polls = app_polls_.load(std::memory_order_relaxed);
  {
    std::lock_guard lock(lock_);
    deadline = next_deadline_ns();
  }
  quiet_.store(true, std::memory_order_seq_cst);
  // Announced before the sleep: a post that finds the lock taken rouses a quiet thread (doorbell).
  if (app_polling_.load(std::memory_order_seq_cst)) {
    // At most kQuietCheckNs, then look whether the application still polls (it may have stopped without
    // a poll that found anything: a thread gone elsewhere, or gone altogether). While a channel's waiter
    // sleeps on the sockets (deep_quiet_), until a timer or the last waiter wakes this thread.
    const uint64_t t = now();
    bool deep = deep_quiet_.load(std::memory_order_seq_cst);
    if (deep && waiters_.load(std::memory_order_seq_cst) == 0) {
      // Left from an earlier quiet spell whose waiter has woken since: its doorbell may have been read by
      // a pass of the loop above (while the context served one-sided requests), and a waiter that waits
      // on the pipe alone (it does not drive) never rings. Only a waiter asleep on the sockets now
      // keeps this thread off them (rping's client hung with a READ in its socket).
      deep_quiet_.store(false, std::memory_order_relaxed);
      deep = false;
    }
    uint64_t wait = deep ? 0 : kQuietCheckNs;
    if (deadline) wait = std::min(wait ? wait : UINT64_MAX, deadline > t ? deadline - t : 1);
    timespec ts{static_cast<time_t>(wait / 1000000000ull), static_cast<long>(wait % 1000000000ull)};
    epoll_event ev;
    if (epoll_pwait2(quiet_epoll_fd_, &ev, 1, wait ? &ts : nullptr, nullptr) > 0) {
      uint64_t v;
      [[maybe_unused]] ssize_t n = read(doorbell_fd_, &v, sizeof v);
    }
    if (app_polls_.load(std::memory_order_relaxed) != polls) {
      deep_quiet_.store(false, std::memory_order_relaxed);
    } else {
      // No poll for a while: a waiter asleep on the sockets keeps this thread off them (and the
      // last one to wake rouses it, waiter_sleeps); otherwise the application stopped driving.
      deep_quiet_.store(true, std::memory_order_seq_cst);
      if (waiters_.load(std::memory_order_seq_cst) == 0) {
        deep_quiet_.store(false, std::memory_order_relaxed);
        app_polling_.store(false, std::memory_order_relaxed);
      }
    }
  }
  quiet_.store(false, std::memory_order_release);
  std::lock_guard lock(lock_);
  progress_once();  // timers, and whatever rang
}

bool Engine::progress_once(bool may_hold) {
  bool did = false;
  const uint64_t cqes = cqes_posted_, acks = acks_queued_, others = others_queued_;
  // Requests queued before this pass (pipelined posts wait for the next flush) are never held: what a
  // hold defers must be this pass's ACKs alone, or the next post's requests would overtake them.
  const bool queue_empty = may_hold && ports_->queued() == 0;
  // What the last pass held was not taken by an answer: this application does not answer (a stream's
  // receiver), and holding would only delay its peer's completions, until it posts a send again.
  if (held_) answers_ = false;
  // Placing direct messages is not work that keeps the progress thread spinning: the application's
  // own polls place them, and the thread would only take their core.
  if (direct_) direct_path_->receive_inboxes(qp_list_);
  if (ports_->receive(app_pass_)) did = true;
  const uint64_t now = this->now();
  // The paths' own streams and ports (raw frames, iWARP's TCP streams), as the ports' datagrams above.
  for (Path* p : paths_)
    if (p->receiving())
      for (Qp* qp : qp_list_)
        if (&path_of(*qp) == p && p->receive(*qp)) did = true;
  for (Qp* qp : qp_list_) {
    if (qp->state.load(std::memory_order_relaxed) == QpState::Err) {
      if (qp->sq.count() || qp->rq.count() || qp->resp.recv_active || (qp->srq && !qp->resp.last_wqe_reached)) {
        flush_queues(*qp);
        did = true;
      }
      continue;
    }
    Path& p = path_of(*qp);
    p.timers(*qp, now);
    if (p.transmit(*qp, now)) did = true;
  }
  batch_done();
  // Only ACKs are held (requests, responses and retransmissions leave at once), and only while the
  // progress thread is quiet with its periodic check: that check flushes them within kQuietCheckNs if
  // the application does not come back first.
  const bool only_acks = acks_queued_ != acks && others_queued_ == others;
  if (queue_empty && answers_ && !held_ && cqes_posted_ != cqes && only_acks && quiet_.load(std::memory_order_seq_cst) &&
      !deep_quiet_.load(std::memory_order_relaxed)) {
    // A polling application is about to see completions, and most likely answers them at once: the
    // ACKs of what it is about to see leave with that answer in one system call. Never twice in a
    // row: a receiver that only polls (a stream of SENDs) has its ACKs sent by every second pass.
    held_ = true;
    count(nullptr, &core::Counters::acks_held);
    ports_->defer_queued();  // the answer leaves first: its peer waits for it, not for the ACKs
  } else {
    ports_->flush();
    held_ = false;
  }
  return did;
}

void Engine::flush_held() {
  if (!held_) return;
  ports_->flush();
  held_ = false;
}

bool Engine::step() {
  std::lock_guard lock(lock_);
  return progress_once();
}

uint64_t Engine::next_deadline() {
  std::lock_guard lock(lock_);
  return next_deadline_ns();
}

void Engine::deliver(Qp& qp, wire::Packet& pkt, const Arrival& from) {
  // From here on the packet is this QP's: count it in the QP's set too.
  if (qp.stats) {
    ++qp.stats->rx_packets;
    qp.stats->rx_bytes += from.len;
  }
  // An opcode of another transport service than the QP's (IBTA 9.6.1.1: the opcode's high bits).
  wire::QpClass want = qp.cfg.type == QpType::Ud   ? wire::QpClass::UD
                       : qp.cfg.type == QpType::Uc ? wire::QpClass::UC
                       : qp.cfg.xrc != XrcRole::None ? wire::QpClass::XRC
                                                   : wire::QpClass::RC;
  if (wire::opcode_info(pkt.bth.opcode).qp_class != want) {
    count(&qp, &core::Counters::drop_bad_opcode);
    return;
  }
  // A connected QP takes packets from its peer's address only (the header validation IBTA asks of
  // connected services; kernel rxe compares the IP source with the QP's path likewise). The port is
  // not checked: RoCE senders vary it for entropy. This stops off-path injection from any other
  // address; a forged source still gets through (plain RoCEv2 has no source authentication).
  if ((qp.cfg.type == QpType::Rc || qp.cfg.type == QpType::Uc) && qp.dest_ip.is_set() &&
      from.peer_ip != qp.dest_ip) {
    count(&qp, &core::Counters::drop_src_addr);
    return;
  }
  // A request by packets comes after whatever its requester left in the inbox before it.
  if (qp.direct.inbox) direct_path_->receive_inbox(qp);
  path_of(qp).deliver(qp, pkt, from);
}

Path& Engine::path_of(const Qp& qp) const {
  if (Path* p = qp.on_path()) return *p;
  switch (qp.cfg.type) {
    case QpType::Ud:
    case QpType::Uc:
      return *datagram_;
    case QpType::Raw:
      return *raw_;
    default:
      return *rc_;
  }
}

void PathServices::place_inbox(Qp& qp) {
  if (qp.direct.inbox) e_.direct_path_->receive_inbox(qp);
}

// Every socket and stream goes into both sets: the progress thread's and the one a completion
// channel's waiter sleeps on (Engine::input_fd).
int PathServices::watch(int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(e_.epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) return -1;
  return epoll_ctl(e_.input_epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
}

void PathServices::rewatch(int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  epoll_ctl(e_.epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
  epoll_ctl(e_.input_epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
}

void PathServices::unwatch(int fd) {
  epoll_ctl(e_.epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  epoll_ctl(e_.input_epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
}

void Engine::post_cqe(core::CompletionQueue* cq, const core::Cqe& cqe, bool solicited) {
  ++cqes_posted_;
  if (cq->push(cqe, solicited)) return;
  // Overrun (IBTA 11.4.2.1): the CQ is in error and so is every QP that completes into it.
  for (Qp* q : qp_list_)
    if ((q->cfg.send_cq == cq || q->cfg.recv_cq == cq) && q->state.load() != QpState::Err) move_to_error(*q);
}

void Engine::move_to_error(Qp& qp) {
  // Flushing happens at the top of the next progress pass, never in the middle of the requester's or
  // responder's walk over the queues.
  qp.state.store(QpState::Err, std::memory_order_release);
  if (direct_) direct_->qp_changed(qp);
  path_of(qp).error(qp);
}

void Engine::flush_queues(Qp& qp) {
  // Messages an initiator left before the error are received, as an HCA did before it failed.
  direct_path_->receive_inbox(qp);
  for (uint64_t i = qp.sq.tail.load(); i != qp.sq.head.load(std::memory_order_acquire); ++i) {
    SqEntry& e = qp.sq.at(i);
    if (srq_table_->tm_sq_done(qp, e, i, WcStatus::WrFlushErr)) {
      qp.sq.tail.store(i + 1, std::memory_order_release);
      continue;
    }
    core::Cqe c = wqe_cqe(qp.qpn, e.wqe.wr_id, WcStatus::WrFlushErr, core::WcOpcode{});
    tag_sq_cqe(qp, c, i);
    qp.sq.tail.store(i + 1, std::memory_order_release);
    post_cqe(qp.cfg.send_cq, c, false);
  }
  qp.req.send_index = qp.sq.tail.load();
  qp.req.send_offset_pkts = 0;
  qp.req.reads_outstanding = 0;
  placement_->give_back_srq_claim(qp);
  if (qp.resp.srq_wqe_held) {
    // The SRQ WQE this QP had taken is its own now; the SRQ's other WQEs are not flushed.
    qp.resp.srq_wqe_held = false;
    const core::Cqe c = wqe_cqe(qp.qpn, qp.resp.srq_wqe.wr_id, WcStatus::WrFlushErr, core::WcOpcode::Recv);
    post_cqe(receive_cq(qp), c, false);
  }
  for (uint64_t i = qp.rq.tail.load(); i != qp.rq.head.load(std::memory_order_acquire); ++i) {
    const core::Cqe c = wqe_cqe(qp.qpn, qp.rq.at(i).wr_id, WcStatus::WrFlushErr, core::WcOpcode::Recv);
    qp.rq.tail.store(i + 1, std::memory_order_release);
    post_cqe(qp.cfg.recv_cq, c, false);
  }
  if (direct_) direct_->publish_tails(qp);
  qp.resp.recv_active = false;
  placement_->report_last_wqe(qp);
  path_of(qp).flush(qp);
}

uint64_t Engine::next_deadline_ns() {
  uint64_t d = 0;
  for (Qp* qp : qp_list_) {
    const uint64_t t = path_of(*qp).next_deadline(*qp);
    if (t && (!d || t < d)) d = t;
  }
  return d;
}

bool Engine::register_mr(core::MrRegion& region) {
  std::lock_guard lock(lock_);
  // Made shareable before it is published, while our progress thread is held off the heap pages that
  // move (direct_share.h).
  const bool remote_write = region.access & (core::kRemoteWrite | core::kRemoteAtomic);
  // On-demand regions are not moved or pinned: intra-host peers reach them by copies the kernel checks
  // (process_vm_writev/readv), or by packets.
  if (direct_ && !(region.access & core::kOnDemand))
    region.share_id = ShareTable::instance().acquire(region.addr, region.length, remote_write);
  if (mrs_.add(region)) return true;
  ShareTable::instance().release(region.share_id, remote_write);
  region.share_id = 0;
  return false;
}

bool Engine::lookup_mr(uint32_t lkey, core::MrRegion* out) {
  std::lock_guard lock(lock_);
  return mrs_.lookup_local(lkey, out);
}

int Engine::deregister_mr(const core::MrRegion& region) {
  std::lock_guard lock(lock_);
  if (mrs_.has_bound_windows(region.lkey)) return EBUSY;
  mrs_.remove(region);
  if (direct_) {
    // No intra-host peer is still copying with the removed key when we return (direct.cpp).
    direct_->wait_copies();
    ShareTable::instance().release(region.share_id, region.access & (core::kRemoteWrite | core::kRemoteAtomic));
  }
  forget_pointers_into(region);
  return 0;
}

void Engine::forget_pointers_into(const core::MrRegion& region) {
  // The application may unmap the memory as soon as deregistration returns: forget every pointer
  // into it that an operation in flight still holds, so a late packet finds an error instead of freed
  // memory. Local SGEs name their MR by lkey: one resolved through another MR of the same pages stays
  // valid (MR caches such as libfabric's register a larger range and drop the smaller one while it is
  // in use).
  // Addresses as integers: an implicit ODP region starts at 0 and spans the address space, where
  // pointer arithmetic would be undefined.
  const uint64_t lo = region.addr;
  const uint64_t len = region.length;
  auto inside = [&](const uint8_t* p) { return p && reinterpret_cast<uintptr_t>(p) - lo < len; };
  for (Qp* qp : qp_list_) {
    path_of(*qp).forget_pointers_into(*qp, lo, len);
    if (qp->resp.recv_active) {
      const RecvWqe& w = placement_->active_recv_wqe(*qp);
      for (uint32_t i = 0; i < w.num_sge; ++i)
        if (w.sge[i].lkey == region.lkey && inside(qp->resp.recv_host[i])) qp->resp.recv_host[i] = nullptr;
    }
    for (uint64_t i = qp->sq.tail.load(); i < qp->sq.head.load(std::memory_order_acquire); ++i) {
      SqEntry& e = qp->sq.at(i);
      if (!e.started || (e.wqe.flags & kInline)) continue;
      for (uint32_t k = 0; k < e.wqe.num_sge; ++k) {
        if (e.wqe.sge[k].lkey != region.lkey || !inside(e.host[k])) continue;
        e.host[k] = nullptr;
        e.status = WcStatus::LocProtErr;
      }
    }
  }
}

int Engine::reregister_mr(core::MrRegion& region, const core::MrRegion& wanted, bool translation) {
  // On-demand regions take no share and are checked page by page: not re-registered (verbs refuses).
  if ((region.access | wanted.access) & core::kOnDemand) return EOPNOTSUPP;
  std::lock_guard lock(lock_);
  if (mrs_.has_bound_windows(region.lkey)) return EBUSY;
  core::MrRegion next = wanted;
  next.lkey = region.lkey;
  next.rkey = region.rkey;
  next.share_id = region.share_id;
  const uint32_t peer_writes = core::kRemoteWrite | core::kRemoteAtomic;
  const bool was_writable = region.access & peer_writes, writable = next.access & peer_writes;
  // The intra-host share follows the pages and whether peers may write them: the new one is taken
  // before the old one goes, so pages that stay in the region are not moved back and forth.
  const bool new_share = direct_ && (translation || was_writable != writable);
  if (new_share) next.share_id = ShareTable::instance().acquire(next.addr, next.length, writable);
  mrs_.update(next);
  if (direct_) {
    // No intra-host peer is still copying under the old translation or rights when we return.
    direct_->wait_copies();
    if (new_share) ShareTable::instance().release(region.share_id, was_writable);
  }
  if (translation) forget_pointers_into(region);
  region = next;
  return 0;
}

bool Engine::alloc_mw(core::MwType type, uint32_t pd, uint32_t* handle, uint32_t* rkey) {
  std::lock_guard lock(lock_);
  return mrs_.alloc_window(type, pd, handle, rkey);
}

void Engine::dealloc_mw(uint32_t handle) {
  std::lock_guard lock(lock_);
  mrs_.dealloc_window(handle);
}

std::unique_ptr<core::CompletionQueue> Engine::create_cq(uint32_t entries,
                                                         core::CompletionQueue::EventFn on_completion) {
  // With the direct path its arm word lives in the area peers may write, not in the arena they only read.
  auto cq = std::make_unique<core::CompletionQueue>(arena_, entries, direct_ ? direct_->writable_area() : nullptr);
  // Only a CQ with a completion channel gets a notify function (CompletionQueue::notifies()).
  if (on_completion)
    on_completion = [this, raise = std::move(on_completion)](core::CompletionQueue& c, bool woken) {
      ++events_raised_;
      raise(c, woken);
    };
  cq->set_notify(std::move(on_completion), [this](core::CompletionQueue& c) {
    async_events_.push(AsyncEvent{AsyncEventType::CqErr, nullptr, &c});
  });
  return cq;
}

int Engine::resize_cq(core::CompletionQueue* cq, uint32_t entries) {
  // Every producer of this CQ's entries holds the engine's lock: the progress thread, a caller's
  // post or poll, and the placing of what intra-host peers left in the inboxes (peers never write
  // the ring themselves).
  std::lock_guard lock(lock_);
  return cq->resize(entries);
}

void Engine::destroy_cq(core::CompletionQueue* cq) {
  std::lock_guard lock(lock_);
  async_events_.discard_if([cq](const AsyncEvent& e) { return e.cq == cq; });
}

Qp* Engine::create_qp(const QpConfig& cfg) {
  using L = core::DeviceLimits;
  if (cfg.max_send_wr > L::kMaxQpWr || cfg.max_recv_wr > L::kMaxQpWr || cfg.max_send_sge > L::kMaxSge ||
      cfg.max_recv_sge > L::kMaxSge || cfg.max_inline > L::kMaxInline) {
    errno = EINVAL;
    return nullptr;
  }
  auto qp = std::make_unique<Qp>();
  qp->cfg = cfg;
  // A tag-matching SRQ takes RC QPs only (IBV_TM_CAP_RC).
  if (cfg.srq && cfg.srq->tm && cfg.type != QpType::Rc) {
    errno = EINVAL;
    return nullptr;
  }
  uint32_t sq_depth = std::max<uint32_t>(cfg.max_send_wr, 1);
  // On a tag-matching SRQ the engine queues rendezvous READs and FINs too: room for them beyond max_wr
  // (in its own storage: a parent domain's ring is sized for max_wr alone).
  const bool tm_sq = cfg.srq && cfg.srq->tm;
  if (cfg.sq_ring && !tm_sq) {
    static_assert(std::is_trivially_destructible_v<SqEntry>, "the creator frees the ring without destructors");
    auto* ring = static_cast<SqEntry*>(cfg.sq_ring);
    for (uint32_t i = 0; i < WorkQueue<SqEntry>::capacity_for(sq_depth); ++i) new (&ring[i]) SqEntry();
    qp->sq.init(ring, sq_depth);
  } else {
    uint32_t sq_ring = sq_depth + (tm_sq ? tm::kSqSlots : 0);
    qp->sq_storage.resize(WorkQueue<SqEntry>::capacity_for(sq_ring));
    qp->sq.init(qp->sq_storage.data(), sq_ring);
    qp->sq.max_wr = sq_depth;
  }
  if (!placement_->alloc_recv_ring(qp->rq, cfg.max_recv_wr, &qp->rq_bytes)) return nullptr;
  std::lock_guard lock(lock_);
  if (qps_.size() >= L::kMaxQp) {
    arena_.release(qp->rq.slots, qp->rq_bytes);
    errno = ENOMEM;
    return nullptr;
  }
  if (cfg.type == QpType::Raw) {
    if (int err = raw_->join(*qp)) {
      arena_.release(qp->rq.slots, qp->rq_bytes);
      errno = err;
      return nullptr;
    }
  }
  qp->qpn = net::Registry::instance().allocate_qpn(iface_.ip, ports_->port());
  if (qp->qpn == 0) {
    arena_.release(qp->rq.slots, qp->rq_bytes);
    errno = ENOSPC;
    return nullptr;
  }
  qp->src_port = static_cast<uint16_t>(0xC000 | (qp->qpn & 0x3FFF));
  qp->sq_credit_slot = free_credits_.back();  // qps_ holds fewer than kMaxQp: one is free
  free_credits_.pop_back();
  qp->sq_credit = &sq_credits_[qp->sq_credit_slot];
  qp->sq_credit->renew();
  if (cfg.ud_mtu) qp->mtu = cfg.ud_mtu;
  if (cfg.srq) {
    qp->srq = cfg.srq;
    qp->shared_rq = &cfg.srq->rq;
    ++cfg.srq->qp_refs;
  }
  qp->stats = stats_.attach_qp(qp->qpn);
  if (direct_) direct_->qp_created(*qp);
  Qp* raw = qp.release();
  qps_[raw->qpn] = raw;
  qp_list_.push_back(raw);
  return raw;
}

void Engine::destroy_qp(Qp* qp) {
  {
    std::lock_guard lock(lock_);
    flush_held();  // an ACK the application's last poll held for its answer
    qps_.erase(qp->qpn);
    qp_list_.erase(std::remove(qp_list_.begin(), qp_list_.end(), qp), qp_list_.end());
    ports_->forget_qp(qp);  // a destroyed QP leaves its multicast groups
    path_of(*qp).release(*qp);  // an iWARP QP's socket is closed with it
    mrs_.unbind_windows_of_qp(qp->qpn);  // before its QPN can be handed out again
    srq_table_->tm_drop_sq(*qp);
    net::Registry::instance().release_qpn(qp->qpn);
    stats_.detach_qp(qp->qpn);
    set_packet_peer(*qp, false);
    if (direct_) {
      direct_->qp_destroyed(*qp);
      direct_path_->receive_inbox(*qp);
      direct_->release_inbox(*qp);
    }
    placement_->give_back_srq_claim(*qp);
    qp->sq_credit->renew();  // its CQEs still in a CQ give nothing back to the slot's next QP
    free_credits_.push_back(qp->sq_credit_slot);
    arena_.release(qp->rq.slots, qp->rq_bytes);
    if (qp->cfg.srq) --qp->cfg.srq->qp_refs;  // an XRC target's srq is only the last one it delivered into
  }
  async_events_.discard_if([qp](const AsyncEvent& e) { return e.qp == qp; });
  delete qp;
}

namespace {
void reset_transport_state(Qp& qp) {
  qp.sq.head.store(0);
  qp.sq.tail.store(0);
  qp.sq_credit->renew();
  {
    std::lock_guard producer(qp.sq.producer_lock);
    qp.tm_sq_internal.clear();
  }
  qp.rq.head.store(0);
  qp.rq.tail.store(0);
  qp.req = {};
  qp.comp = {};
  // The retry budgets start full, from the attributes (which RESET keeps).
  qp.comp.retries_left = qp.retry_cnt;
  qp.comp.rnr_retries_left = qp.rnr_retry;
  qp.resp = {};
  qp.resp.replay.assign(qp.max_dest_rd_atomic, ReplayEntry{});
  qp.access_flags = 0;
}
}  // namespace

int Engine::modify_qp(Qp* qp, const QpModify& m) {
  {
    std::lock_guard lock(lock_);
    flush_held();  // before a move to ERR or RESET (rdma_disconnect) ends the connection
    if (m.mask & kModAccessFlags) qp->access_flags = m.access_flags;
    if (m.mask & kModPathMtu) qp->mtu = m.mtu_bytes;
    if (m.mask & kModDestQpn) {
      qp->dest_qpn = m.dest_qpn;
      stats_.set_dest(qp->qpn, m.dest_qpn);
    }
    if (m.mask & kModAv) qp->dest_ip = m.dest_ip;
    if (m.mask & kModQkey) qp->qkey = m.qkey;
    if (m.mask & kModRqPsn) qp->resp.epsn = m.rq_psn;
    if (m.mask & kModSqPsn) {
      qp->req.next_psn = m.sq_psn;
      qp->comp.acked_psn = m.sq_psn;
    }
    if (m.mask & kModTimeout) qp->timeout = m.timeout;
    if (m.mask & kModRetryCnt) qp->retry_cnt = qp->comp.retries_left = m.retry_cnt;
    if (m.mask & kModRnrRetry) qp->rnr_retry = qp->comp.rnr_retries_left = m.rnr_retry;
    if (m.mask & kModMinRnrTimer) qp->min_rnr_timer = m.min_rnr_timer;
    if (m.mask & kModMaxQpRdAtomic) qp->max_rd_atomic = std::max<uint32_t>(m.max_rd_atomic, 1);
    if (m.mask & kModMaxDestRdAtomic) {
      qp->max_dest_rd_atomic = std::max<uint32_t>(m.max_dest_rd_atomic, 1);
      qp->resp.replay.assign(qp->max_dest_rd_atomic, ReplayEntry{});
      qp->resp.replay_next = 0;
    }
    if (qp->resp.replay.empty()) qp->resp.replay.assign(qp->max_dest_rd_atomic, ReplayEntry{});
    if (m.mask & kModState) {
      switch (m.state) {
        case QpState::Reset:
          path_of(*qp).reset(*qp);  // an iWARP connection ends; the QP may connect again
          set_packet_peer(*qp, false);
          srq_table_->tm_drop_sq(*qp);
          placement_->give_back_srq_claim(*qp);
          reset_transport_state(*qp);
          WireProtection::forget_keys(*qp);
          // Its completions not yet polled go too (IBTA allows either; mlx4/mlx5 clean them, and
          // rdma-core's tests count on it: a QP recovered through RESET must not return the flush
          // errors of its previous life). Receive CQEs of an SRQ's WQEs stay: those WQEs were the
          // SRQ's, and the CQE is all that is left of them.
          if (qp->cfg.send_cq) qp->cfg.send_cq->discard_qp(qp->qpn, qp->srq != nullptr);
          if (qp->cfg.recv_cq && qp->cfg.recv_cq != qp->cfg.send_cq)
            qp->cfg.recv_cq->discard_qp(qp->qpn, qp->srq != nullptr);
          break;
        case QpState::Rtr:
          if (qp->cfg.type != QpType::Raw) {  // a raw QP has no peer: frames carry their own addresses
            ports_->resolve_destination(*qp);
            direct_path_->join(*qp);
            if (!protection_->derive_keys(*qp)) return ENOMEM;  // the QP stays where it was
          }
          break;
        case QpState::Err:
          move_to_error(*qp);
          break;
        default:
          break;
      }
      if (m.state != QpState::Err) qp->state.store(m.state, std::memory_order_release);
      if (direct_) {
        direct_->qp_changed(*qp);
        if (qp->direct.peer || qp->direct.retry_ns) direct_active_.store(true, std::memory_order_relaxed);
      }
      // Its SENDs come by packets unless a direct peer has an inbox to leave them in (none on a
      // tag-matching SRQ, or without room: direct-path.md).
      if (m.state == QpState::Rtr)
        set_packet_peer(*qp, qp->on_path() != direct_path_.get() || !qp->direct.inbox);
    } else if ((m.mask & kModAccessFlags) && direct_) {
      // The flags alone (RTS to RTS): initiators and the server thread check the new ones from now on.
      direct_->qp_access_changed(*qp);
    }
  }
  // A quiet progress thread too: the flush of a QP moved to error needs a pass, and a completion
  // channel's waiter, who does the passes meanwhile, may sleep on its sockets without a timer due
  // (rping's server joined its CQ thread forever, waiting for the flush's event after rdma_disconnect).
  doorbell(true);
  return 0;
}

bool Engine::peer_gone(uint32_t qpn) {
  std::lock_guard lock(lock_);
  auto it = qps_.find(qpn);
  if (it == qps_.end()) return false;
  Qp* qp = it->second;
  const QpState st = qp->state.load(std::memory_order_relaxed);
  if (qp->cfg.type != QpType::Rc || (st != QpState::Rts && st != QpState::Sqd)) return false;
  // Only Dead is used: the age bound and the query window matter for Paused alone.
  return ports_->peer_liveness(*qp, 250'000'000, 0, 0) == net::Liveness::Verdict::Dead;
}

int Engine::post_send(Qp* qp, const SendWqe* wqes, int n, int* bad, bool whole_batch) {
  QpState st = qp->state.load(std::memory_order_acquire);
  // An XRC target has no send queue.
  if (st == QpState::Reset || st == QpState::Init || st == QpState::Rtr || qp->cfg.xrc == XrcRole::Recv) {
    *bad = 0;
    return EINVAL;
  }
  int rc = 0;
  {
    std::lock_guard lock(qp->sq.producer_lock);
    uint64_t head = qp->sq.head.load(std::memory_order_relaxed);
    const Path& path = path_of(*qp);
    auto is_bad = [qp, &path](const SendWqe& w) {
      return w.num_sge > qp->cfg.max_send_sge || ((w.flags & kInline) && w.length > qp->cfg.max_inline) ||
             !path.carries(*qp, w);
    };
    if (whole_batch) {
      // Polling only frees slots, so room found now is still there below.
      uint64_t used = SrqTable::tm_app_sq_used(*qp, head);
      uint64_t room = used >= qp->sq.max_wr ? 0 : qp->sq.max_wr - used;
      for (int i = 0; i < n; ++i) {
        if (is_bad(wqes[i]) || static_cast<uint64_t>(i) >= room) {
          *bad = i;
          return is_bad(wqes[i]) ? EINVAL : ENOMEM;
        }
      }
    }
    for (int i = 0; i < n; ++i) {
      const SendWqe& w = wqes[i];
      bool bad_wqe = is_bad(w);
      // A slot is free once its completion (or a later one) was polled, whatever path completed it.
      if (bad_wqe || SrqTable::tm_app_sq_used(*qp, head) >= qp->sq.max_wr) {
        *bad = i;
        rc = bad_wqe ? EINVAL : ENOMEM;
        break;
      }
      SqEntry& e = qp->sq.at(head);
      // Copy only what the WQE uses: SGE array and inline data are large.
      std::memcpy(static_cast<void*>(&e.wqe), &w, offsetof(SendWqe, sge));
      std::memcpy(e.wqe.sge, w.sge, sizeof(Sge) * w.num_sge);
      if (w.flags & kInline) std::memcpy(e.wqe.inline_data, w.inline_data, w.length);
      e.started = false;
      e.acked = false;
      e.status = WcStatus::Success;
      e.read_received = 0;
      e.reissued_at = ~0ull;
      ++head;
    }
    qp->sq.head.store(head, std::memory_order_release);
  }
  // Send from the caller's thread when the engine is free: no wake-up on the latency path. With an
  // intra-host peer the WQE most likely completes right here, while handing it to the progress thread
  // would keep that thread spinning on the application's core.
  if (lock_for_caller()) {
    // No time passed: the requester reads the clock only if it arms a timer (a post must not pay for it).
    // With packets of this QP already unacknowledged, the new ones wait in the port for the next
    // flush (the next poll, or the progress thread, which the doorbell below rouses): they then leave
    // together, segmented, in one system call. A lone request leaves at once.
    const bool pipelined = qp->cfg.type == QpType::Rc && qp->req.next_psn != qp->comp.acked_psn;
    if (qp->state.load() == QpState::Rts) path_of(*qp).transmit(*qp, 0);
    answers_ = true;
    if (held_) {
      count(nullptr, &core::Counters::acks_held_answered);
      flush_held();  // the ACKs a poll left for this answer leave with it (after it: defer_queued)
    } else if (!pipelined) {
      ports_->flush_own();
    }
    lock_.unlock();
    // Everything done here (the direct path completes at once): no need to wake the progress thread.
    if (qp->sq.count() == 0) return rc;
    // A completion channel's waiter asleep on the sockets took its timeout before this post armed the
    // retransmission timer, and the quiet progress thread sleeps on its behalf: rouse that one.
    doorbell(waiters_.load(std::memory_order_seq_cst) != 0);
    return rc;
  }
  // The lock's holder may be a completion channel's waiter about to sleep again without seeing this
  // post: a quiet progress thread must be roused too.
  doorbell(true);
  return rc;
}

int Engine::post_recv(Qp* qp, const RecvWqe* wqes, int n, int* bad) {
  // A QP attached to an SRQ has no receive queue of its own (ibv_post_recv(3)).
  if (qp->srq || qp->state.load(std::memory_order_acquire) == QpState::Reset) {
    *bad = 0;
    return EINVAL;
  }
  int rc = 0;
  {
    std::lock_guard lock(qp->rq.producer_lock);
    uint64_t head;
    rc = push_recv_wqes(qp->rq, wqes, n, qp->cfg.max_recv_sge, bad, &head);
    if (direct_) direct_->publish_rq_head(*qp, head);
  }
  if (qp->state.load() == QpState::Err) doorbell(true);  // flushed by the next pass (modify_qp)
  return rc;
}

void Engine::inject_datagram(const uint8_t* data, uint32_t len, const wire::IpAddress& peer_ip, uint16_t peer_port,
                             uint16_t local_port) {
  std::lock_guard lock(lock_);
  ports_->handle_packet(data, len, peer_ip, peer_port, local_port ? local_port : ports_->port());
  batch_done();
  ports_->flush_own();
}

void Engine::set_packet_peer(Qp& qp, bool on) {
  if (qp.packet_peer == on) return;
  qp.packet_peer = on;
  if (on)
    packet_qps_.fetch_add(1, std::memory_order_relaxed);
  else
    packet_qps_.fetch_sub(1, std::memory_order_relaxed);
}

bool Engine::lock_for_caller() {
  if (!direct_active_.load(std::memory_order_relaxed)) return lock_.try_lock();
  // The progress thread holds the lock for a pass at most; yielding lets it finish on a shared core.
  while (!lock_.try_lock()) sched_yield();
  return true;
}

void Engine::place_direct() {
  if (!direct_ || !direct_active_.load(std::memory_order_relaxed) || !lock_for_caller()) return;
  if (direct_path_->receive_inboxes(qp_list_)) count(nullptr, &core::Counters::direct_channel_wakes);
  lock_.unlock();
}

bool Engine::packet_peers() const {
  return !direct_active_.load(std::memory_order_relaxed) || packet_qps_.load(std::memory_order_relaxed) != 0;
}

void Engine::app_drives() {
  if (!opts_.progress_thread) return;
  app_polls_.fetch_add(1, std::memory_order_relaxed);
  if (!app_polling_.load(std::memory_order_relaxed)) app_polling_.store(true, std::memory_order_release);
}

bool Engine::waiter_arrives() {
  // A context whose progress thread never goes quiet (one-sided requests, direct peers) is served by
  // it: the waiter would only take its core. Without a progress thread, the waiter is the only one.
  // With direct peers only, their messages wake the waiter through the pipe and the progress thread
  // serves the rare packet; with peers by packets too, as without direct peers (poll_cq).
  const bool drives = packet_peers() && (!opts_.progress_thread || !serves_passive(now()));
  // The progress thread goes quiet, as for a spinning poller: from now on this thread does the work,
  // even when the event it came for is there already (it comes back for the next one).
  if (drives) app_drives();
  return drives;
}

bool Engine::waiter_pass(uint64_t* deadline_ns) {
  const bool drives = waiter_arrives();
  if (lock_for_caller()) {
    app_pass_ = true;
    progress_once();
    app_pass_ = false;
    if (drives) {
      const uint64_t d = next_deadline_ns();
      if (d && (!*deadline_ns || d < *deadline_ns)) *deadline_ns = d;
    }
    lock_.unlock();
  } else if (drives) {
    // The progress thread is in a pass: let it finish on a shared core, and look again soon.
    sched_yield();
    const uint64_t soon = now() + 20000;
    if (!*deadline_ns || soon < *deadline_ns) *deadline_ns = soon;
  }
  return drives;
}

void Engine::waiter_sleeps(bool asleep) {
  if (asleep) {
    waiters_.fetch_add(1, std::memory_order_seq_cst);
    return;
  }
  // The last waiter to wake rouses a progress thread that slept without checks on its behalf.
  if (waiters_.fetch_sub(1, std::memory_order_seq_cst) == 1 && deep_quiet_.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t w = write(doorbell_fd_, &one, sizeof one);
  }
}

void Engine::arm_cq(core::CompletionQueue* cq, bool solicited_only) {
  // Arming ends no run to completion: a thread that waits in ibv_get_cq_event drives the engine
  // itself (waiter_pass), and a quiet progress thread serves one that waits elsewhere within
  // kQuietCheckNs.
  cq->arm(solicited_only);
  if (!cq->notifies() || !direct_active_.load(std::memory_order_relaxed)) return;
  // An initiator that published before the arm found the CQ unarmed and woke nobody, and the poll that
  // follows the arm looks at the inboxes only when the ring is empty: with one CQ for send and receive
  // it holds the caller's own send CQE (qperf), and the message would wait for a timer. Placed now,
  // after the arm's fence, its CQE raises the event.
  if (!lock_for_caller()) return;
  for (Qp* qp : qp_list_)
    if (qp->direct.inbox && qp->cfg.recv_cq == cq) direct_path_->receive_inbox(*qp);
  lock_.unlock();
}

int Engine::poll_cq(core::CompletionQueue* cq, core::Cqe* out, int n) {
  int got = cq->poll(out, n);
  if (got > 0 && got < n && direct_active_.load(std::memory_order_relaxed) && lock_for_caller()) {
    // Room left: what intra-host initiators left in the inboxes completed at their side already (like
    // an acknowledged message), so it is returned with what the ring held, as an HCA's CQ would hold
    // it. Otherwise a poll that found its own send CQE missed them, and the application could learn of
    // the peer's disconnect (or destroy the QP) before seeing completions of data sent before it.
    const bool placed = direct_path_->receive_inboxes(qp_list_);
    lock_.unlock();
    if (placed) got += cq->poll(out + got, n - got);
  } else if (got == 0) {
    // With peers by packets (or no direct peer at all), the whole poll serves them: run to completion.
    const bool packets = packet_peers();
    if (lock_for_caller()) {
      // With a direct peer, an empty poll must see what intra-host initiators left (after
      // ibv_req_notify_cq an initiator may have found the CQ unarmed and woken nobody, direct.cpp). When
      // every peer is direct, only every 1024th one goes on to the sockets and timers (syscalls and clock
      // reads, ~1 us): the progress thread handles the rare packet, and a spinning poller must see a
      // direct message at once. With peers by packets too (UCX connects an MPI rank to itself as well as
      // to other hosts), every empty poll is a whole pass (whose first step is the inboxes) and serves
      // them, run to completion: left to the progress thread, each of their packets waited for its wake-up.
      // Packet peers quiet for a while (no packet or FPDU either way) beside direct ones: a pass on every
      // 64th empty poll, a few microseconds for the rare packet, while direct messages are seen at once.
      // Any packet counted since (the progress thread's too) brings back a pass on every poll.
      const core::Counters& dev = stats_.device();
      // True (and quiet no more) when packets or FPDUs moved since last looked at.
      auto packets_moved = [&] {
        const uint64_t a = dev.rx_packets + dev.tx_packets + dev.iw_rx_fpdus + dev.iw_tx_fpdus;
        if (a == packet_activity_) return false;
        packet_activity_ = a;
        quiet_passes_ = 0;
        return true;
      };
      const bool mixed = packets && direct_active_.load(std::memory_order_relaxed);
      if (mixed) packets_moved();
      const bool every_poll = packets && (!mixed || quiet_passes_ < kQuietPasses);
      if (every_poll && cq != pass_cq_ && now() - pass_end_ns_ < kOtherCqPassGapNs) {
        // Another CQ's poll ran a pass just now (this one sees what it placed): the sockets wait for the
        // next round, and what that pass held waits for the application's answer.
        count(nullptr, &core::Counters::poll_passes_skipped);
      } else if (every_poll ||
          (!direct_path_->receive_inboxes(qp_list_) && (++empty_polls_ & (packets ? 63 : 1023)) == 0)) {
        const uint64_t rx = dev.rx_packets;
        app_pass_ = true;
        progress_once(opts_.progress_thread);
        app_pass_ = false;
        pass_cq_ = cq;
        pass_end_ns_ = now();
        count(nullptr, &core::Counters::poll_passes);
        count(nullptr, &core::Counters::poll_rx_packets, dev.rx_packets - rx);
        if (mixed && !packets_moved() && quiet_passes_ < kQuietPasses) ++quiet_passes_;
      }
      lock_.unlock();
      got = cq->poll(out, n);
    } else if (opts_.progress_thread && serves_passive(now())) {
      // The progress thread is in a pass (it holds the lock) and stays awake for a context that serves
      // one-sided requests: on a shared core, spinning here only takes the time that pass needs.
      sched_yield();
    }
    // Run to completion even when this poll found the lock taken: the progress thread holds it for a
    // pass, and seeing a poller it goes quiet, so the next polls find it free (were this poll not
    // counted, a progress thread woken by every post would keep the lock busy for good).
    if (got == 0 && packets) app_drives();
  }
  // A poll that returns completions does not end run to completion: the application may go off to do
  // something else, and then the quiet progress thread serves the engine again within kQuietCheckNs (no
  // poll counted meanwhile); were it ended here, a progress thread that woke just then would go back to
  // the sockets and compete with the poller for every packet after.
  // Send-queue slots are the application's again once their completions are polled.
  for (int i = 0; i < got; ++i)
    if (uint32_t ref = out[i].sq_ref)
      sq_credits_[(ref & 0xFFFF) - 1].give_back(ref >> 16, out[i].sq_index);
  return got;
}

}  // namespace softrdma::transport
