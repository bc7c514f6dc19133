// A forking TCP echo server and its client with plain sockets, for rsockets' fork support under
// rdma-core's librspreload (rsocket(7): RDMAV_FORK_SAFE=1 on both sides). The connection is made over
// kernel TCP; the child that serves it moves it to an rsocket on its first recv, the client on its first
// send. The client echoes 8 MiB, compares, and says whether a kernel TCP connection to the server's
// port is still established (it must not be: the data went by rsockets).
//   fork_echo -s IP PORT    serve one connection in a forked child
//   fork_echo -c IP PORT    prints "echo ok <bytes>" and "kernel tcp: none|established"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr size_t kTotal = 8 << 20;
constexpr size_t kChunk = 64 << 10;

int serve(const sockaddr_in& a) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(l, reinterpret_cast<const sockaddr*>(&a), sizeof a) || listen(l, 4)) return perror("listen"), 1;
  int c = accept(l, nullptr, nullptr);
  if (c < 0) return perror("accept"), 1;
  pid_t child = fork();
  if (child < 0) return perror("fork"), 1;
  if (child == 0) {
    close(l);
    std::vector<char> b(kChunk);
    size_t sum = 0;
    for (ssize_t n; (n = recv(c, b.data(), b.size(), 0)) > 0; sum += static_cast<size_t>(n))
      for (ssize_t o = 0; o < n;) {
        ssize_t w = send(c, b.data() + o, static_cast<size_t>(n - o), 0);
        if (w <= 0) return perror("child send"), 1;
        o += w;
      }
    std::fprintf(stderr, "child echoed %zu\n", sum);
    close(c);
    return 0;
  }
  close(c);
  int st = 0;
  waitpid(child, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

// Whether /proc/net/tcp lists an established connection to remote port `port`.
bool kernel_tcp_established(uint16_t port) {
  std::ifstream f("/proc/net/tcp");
  std::string line;
  std::getline(f, line);
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string sl, local, remote, state;
    in >> sl >> local >> remote >> state;
    if (state == "01" && remote.size() > 5 && std::stoul(remote.substr(remote.size() - 4), nullptr, 16) == port)
      return true;
  }
  return false;
}

int client(const sockaddr_in& a) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(s, reinterpret_cast<const sockaddr*>(&a), sizeof a)) return perror("connect"), 1;
  std::vector<unsigned char> out(kTotal), in(kTotal);
  std::mt19937 rng(7);
  for (auto& b : out) b = static_cast<unsigned char>(rng());
  size_t sent = 0, got = 0;
  // At most two chunks unechoed: a client blocked in send while the echo it does not read fills the
  // buffers of both directions waits for good, over any stream (rsockets' are 128 KiB each way; this
  // deadlocked under ASan, where the child echoes slowly).
  auto may_send = [&] { return sent < kTotal && sent - got < kChunk; };
  while (got < kTotal) {
    if (may_send()) {
      ssize_t w = send(s, out.data() + sent, std::min(kChunk, kTotal - sent), 0);
      if (w <= 0) return perror("send"), 1;
      sent += static_cast<size_t>(w);
    }
    ssize_t r = recv(s, in.data() + got, kTotal - got, may_send() ? MSG_DONTWAIT : 0);
    if (r == 0) return std::fprintf(stderr, "end of stream after %zu bytes\n", got), 1;
    if (r > 0) got += static_cast<size_t>(r);
  }
  std::printf("%s %zu\n", out == in ? "echo ok" : "echo differs", got);
  std::printf("kernel tcp: %s\n", kernel_tcp_established(ntohs(a.sin_port)) ? "established" : "none");
  shutdown(s, SHUT_WR);
  close(s);
  return out == in ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || (std::strcmp(argv[1], "-s") && std::strcmp(argv[1], "-c")))
    return std::fprintf(stderr, "usage: fork_echo -s|-c IP PORT\n"), 2;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::atoi(argv[3])));
  if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) return std::fprintf(stderr, "bad address %s\n", argv[2]), 2;
  return argv[1][1] == 's' ? serve(a) : client(a);
}
