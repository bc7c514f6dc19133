#include "two_process.h"

#include <fcntl.h>
#include <glob.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>

namespace softrdma::verbs_test {

bool read_full(int fd, void* p, size_t n, int timeout_s) {
  auto* c = static_cast<uint8_t*>(p);
  while (n) {
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, timeout_s * 1000) != 1) return false;
    ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= size_t(r);
  }
  return true;
}

bool write_full(int fd, const void* p, size_t n) {
  auto* c = static_cast<const uint8_t*>(p);
  while (n) {
    ssize_t r = write(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= size_t(r);
  }
  return true;
}

pid_t fork_target(int (*target_main)(int sock), int* sock) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    _exit(target_main(sv[1]));
  }
  close(sv[1]);
  if (pid < 0) {
    close(sv[0]);
    return -1;
  }
  *sock = sv[0];
  return pid;
}

bool reap_within(pid_t pid, int wait_s, int* st) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
  pid_t got = 0;
  while ((got = waitpid(pid, st, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) usleep(5000);
  if (got == pid) return true;
  kill(pid, SIGKILL);
  waitpid(pid, st, 0);
  return false;
}

uint64_t my_counter(uint64_t core::Counters::*field) {
  glob_t g{};
  std::string pat = "/dev/shm/softrdma-stats-" + std::to_string(getpid()) + "-*";
  uint64_t sum = 0;
  if (glob(pat.c_str(), 0, nullptr, &g) != 0) return 0;
  for (size_t i = 0; i < g.gl_pathc; ++i) {
    int fd = open(g.gl_pathv[i], O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    // magic, version, pid, device_name[64], then the device's Counters (8-byte aligned).
    constexpr size_t kCountersOff = 80;
    core::Counters c{};
    uint32_t head[2]{};
    if (pread(fd, head, sizeof head, 0) == sizeof head && head[0] == core::StatsPage::kMagic &&
        head[1] == core::StatsPage::kVersion && pread(fd, &c, sizeof c, kCountersOff) == sizeof c)
      sum += c.*field;
    close(fd);
  }
  globfree(&g);
  return sum;
}

void ForkedTarget::SetUp() {
  pid = fork_target(target_main_, &sock);
  ASSERT_GE(pid, 0) << "socketpair or fork: " << std::strerror(errno);
}

void ForkedTarget::TearDown() {
  const char x = 'x';
  stop_target(&x, 1);
}

void ForkedTarget::stop_target(const void* bye, size_t len) {
  if (pid <= 0) return;  // SetUp failed: no target
  write_full(sock, bye, len);
  close(sock);
  int st = 0;
  if (!reap_within(pid, reply_s_, &st)) {
    ADD_FAILURE() << "target did not exit";
    return;
  }
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "target failed at step " << WEXITSTATUS(st);
}

}  // namespace softrdma::verbs_test
