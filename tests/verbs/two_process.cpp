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
