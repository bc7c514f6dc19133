// A queue of events behind a pollable file descriptor, as the kernel gives rdma-core: one byte in a
// pipe per event, so poll()/epoll on fd() works, blocking reads block, and O_NONBLOCK set by the
// application on fd() gives EAGAIN. Used for completion channels and for async events.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <functional>
#include <mutex>
#include <system_error>

namespace softrdma::core {

template <typename Event>
class EventQueue {
 public:
  EventQueue() {
    if (pipe2(fds_, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
    // The write side must never block the progress engine.
    fcntl(fds_[1], F_SETFL, O_NONBLOCK);
  }
  ~EventQueue() {
    close(fds_[0]);
    close(fds_[1]);
  }
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  int fd() const { return fds_[0]; }
  // The write end: a byte written there ahead of its event (push(e, false) follows) makes pop() run
  // the empty-wake hook. Each event has exactly one byte, so a readable fd means an event is there or
  // on its way, as on the kernel's channel.
  int write_fd() const { return fds_[1]; }
  // Called (from pop, in the waiting thread) for a wake-up byte whose event is not queued yet: an
  // intra-host peer's, asking this process to place what it left (the placement pushes the event).
  void set_empty_wake(std::function<void()> fn) { on_empty_wake_ = std::move(fn); }

  // wake: write the event's wake-up byte; false when it was written for it already (write_fd()).
  void push(const Event& e, bool wake = true) {
    std::lock_guard lock(mutex_);
    events_.push_back(e);
    if (!wake) return;
    char b = 0;
    // A full pipe (64 Ki unread events) only loses the wake-up byte, not the event: pop() drains.
    [[maybe_unused]] ssize_t n = write(fds_[1], &b, 1);
  }

  // Blocks (unless fd() is O_NONBLOCK) until an event is queued. Returns 0, or -1 with errno. A signal
  // ends the wait with EINTR, as a read of the kernel's channel fd does: programs such as qperf stop
  // their ibv_get_cq_event loop from a SIGALRM handler.
  int pop(Event& out) {
    for (;;) {
      char b;
      ssize_t n = read(fds_[0], &b, 1);
      if (n < 0 && errno == EINTR) return -1;
      {
        std::lock_guard lock(mutex_);
        if (!events_.empty()) {
          out = events_.front();
          events_.pop_front();
          return 0;
        }
      }
      if (n < 0) return -1;
      if (n != 1 || !on_empty_wake_) continue;
      on_empty_wake_();
      std::lock_guard lock(mutex_);
      if (!events_.empty()) {
        out = events_.front();
        events_.pop_front();
        return 0;
      }
    }
  }

  // For a reader that sleeps elsewhere (a completion channel's epoll, verbs/mr_cq.cpp) and only takes
  // what is there: an event if one is queued (taking its wake-up byte through reader, a non-blocking
  // descriptor of fd()'s pipe), else false; as pop() for an early byte.
  bool try_pop(int reader, Event& out) {
    char b;
    const bool byte = read(reader, &b, 1) == 1;
    {
      std::lock_guard lock(mutex_);
      if (!events_.empty()) {
        out = events_.front();
        events_.pop_front();
        return true;
      }
    }
    if (!byte || !on_empty_wake_) return false;
    on_empty_wake_();
    std::lock_guard lock(mutex_);
    if (events_.empty()) return false;
    out = events_.front();
    events_.pop_front();
    return true;
  }

  // Removes queued events matching pred (their object is being destroyed).
  template <typename Pred>
  void discard_if(Pred pred) {
    std::lock_guard lock(mutex_);
    for (auto it = events_.begin(); it != events_.end();) it = pred(*it) ? events_.erase(it) : it + 1;
  }

 private:
  int fds_[2];
  std::mutex mutex_;
  std::deque<Event> events_;
  std::function<void()> on_empty_wake_;
};

}  // namespace softrdma::core
