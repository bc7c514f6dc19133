// rdma_cm with wire protection (cm/protect.h, docs/security.md): two processes, each with its own
// SOFTRDMA_WIRE_PROTECT / SOFTRDMA_AUTH_KEY (the configuration is per process), SOFTRDMA_DIRECT=0 so
// that packets flow. Both protected alike: the application's private data arrives intact both ways,
// a WRITE and a SEND are verified byte for byte. Mode, key or protection on one side only: the passive
// side refuses, the active side gets RDMA_CM_EVENT_REJECTED with status 0x5EC0 and the reason text,
// and the passive application never sees a CONNECT_REQUEST.
// Each process is this binary again, running WireProtectRole.Run with WIRE_ROLE set.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cm_helpers.h"

using namespace softrdma::cm_test;

namespace {

constexpr char kKey1[] = "00112233445566778899aabbccddeeff";
constexpr char kKey2[] = "00112233445566778899aabbccddeefe";
constexpr size_t kLen = 64 << 10;
constexpr char kReqData[] = "ABC";  // 4 bytes with its NUL: all a protected REQ leaves the application
struct Remote {
  uint64_t addr;
  uint32_t rkey;
  char tag[20];
};

void out(const char* path, const std::string& line) {
  std::ofstream f(path, std::ios::app);
  f << line << "\n";
}

uint8_t pattern(size_t i) { return static_cast<uint8_t>(i * 131 + (i >> 8) + 7); }

bool stop_requested(const char* path) { return access((std::string(path) + ".stop").c_str(), F_OK) == 0; }

// The passive process: listens, reports its port, then either serves one connection or reports that
// no connection request came before the parent says stop.
void server(const char* path) {
  Listener L;
  if (!L.port) return out(path, "listen failed");
  out(path, "port " + std::to_string(L.port));
  rdma_cm_event* ev = nullptr;
  while (!ev && !stop_requested(path)) ev = next_event(L.ch, 100);
  if (!ev) return out(path, "noreq");
  if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) return out(path, "event " + name(ev));
  if (ev->param.conn.private_data_len < sizeof kReqData ||
      memcmp(ev->param.conn.private_data, kReqData, sizeof kReqData) != 0)
    return out(path, "bad req private data");
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  Side ss;
  if (!ss.setup(child, 2 * kLen)) return out(path, "setup failed");
  ibv_sge rs = ss.sge(kLen, 8192);
  ibv_recv_wr rwr{};
  rwr.wr_id = 7;
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  ibv_recv_wr* bad_r = nullptr;
  if (ibv_post_recv(child->qp, &rwr, &bad_r)) return out(path, "post_recv failed");
  Remote rem{reinterpret_cast<uint64_t>(ss.buf.data()), ss.mr->rkey, "server-remote-tag"};
  rdma_conn_param ap = conn_param(&rem, sizeof rem, 1, 1, 0, 7);
  if (rdma_accept(child, &ap)) return out(path, "accept failed");
  ev = next_event(L.ch);
  if (!ev || ev->event != RDMA_CM_EVENT_ESTABLISHED) return out(path, "no established: " + name(ev));
  rdma_ack_cm_event(ev);
  // The client WRITEs kLen bytes, then SENDs 8192: the SEND's completion means the WRITE is placed.
  ibv_wc wc = ss.poll_one();
  if (wc.status != IBV_WC_SUCCESS || wc.byte_len != 8192) return out(path, "recv status " + std::to_string(wc.status));
  for (size_t i = 0; i < kLen; ++i)
    if (ss.buf[i] != pattern(i)) return out(path, "write byte " + std::to_string(i) + " wrong");
  for (size_t i = 0; i < 8192; ++i)
    if (ss.buf[kLen + i] != pattern(i + 5)) return out(path, "send byte " + std::to_string(i) + " wrong");
  out(path, "ok");
  if (getenv("WIRE_HOLD")) sleep(static_cast<unsigned>(atoi(getenv("WIRE_HOLD"))));  // for a look with `softrdma stat`
  ev = next_event(L.ch);  // the client disconnects
  if (ev) rdma_ack_cm_event(ev);
  ss.release();
  rdma_destroy_id(child);
}

void client(const char* path, uint16_t port) {
  Client C;
  if (!C.resolve(port)) return out(path, "resolve failed");
  Side cs;
  if (!cs.setup(C.id, kLen + 8192)) return out(path, "setup failed");
  rdma_conn_param cp = conn_param(kReqData, sizeof kReqData, 1, 1, 7, 7);
  if (rdma_connect(C.id, &cp)) return out(path, "connect failed errno " + std::to_string(errno));
  rdma_cm_event* ev = next_event(C.ch);
  if (!ev) return out(path, "no event");
  if (ev->event == RDMA_CM_EVENT_REJECTED) {
    std::string text;
    if (ev->param.conn.private_data && ev->param.conn.private_data_len)
      text.assign(static_cast<const char*>(ev->param.conn.private_data),
                  strnlen(static_cast<const char*>(ev->param.conn.private_data), ev->param.conn.private_data_len));
    out(path, "rejected " + std::to_string(ev->status) + " " + text);
    rdma_ack_cm_event(ev);
    return;
  }
  if (ev->event != RDMA_CM_EVENT_ESTABLISHED) return out(path, "event " + name(ev));
  Remote got{};
  if (ev->param.conn.private_data_len < sizeof got) return out(path, "short rep private data");
  memcpy(&got, ev->param.conn.private_data, sizeof got);
  rdma_ack_cm_event(ev);
  if (strcmp(got.tag, "server-remote-tag") != 0) return out(path, "rep private data wrong");
  for (size_t i = 0; i < kLen; ++i) cs.buf[i] = pattern(i);
  for (size_t i = 0; i < 8192; ++i) cs.buf[kLen + i] = pattern(i + 5);
  ibv_sge s = cs.sge(0, kLen);
  ibv_send_wr w{};
  w.wr_id = 1;
  w.sg_list = &s;
  w.num_sge = 1;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.wr.rdma.remote_addr = got.addr;
  w.wr.rdma.rkey = got.rkey;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(C.id->qp, &w, &bad)) return out(path, "post write failed");
  ibv_sge s2 = cs.sge(kLen, 8192);
  ibv_send_wr w2{};
  w2.wr_id = 2;
  w2.sg_list = &s2;
  w2.num_sge = 1;
  w2.opcode = IBV_WR_SEND;
  w2.send_flags = IBV_SEND_SIGNALED;
  if (ibv_post_send(C.id->qp, &w2, &bad)) return out(path, "post send failed");
  ibv_wc wc = cs.poll_one();
  if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 2) return out(path, "send status " + std::to_string(wc.status));
  out(path, "ok");
  rdma_disconnect(C.id);
  ev = next_event(C.ch);
  if (ev) rdma_ack_cm_event(ev);
}

struct Config {
  const char* mode;  // nullptr: unprotected
  const char* key;
  const char* key_file = nullptr;  // SOFTRDMA_AUTH_KEY_FILE instead
};

pid_t spawn(const char* role, const std::string& path, const Config& c, uint16_t port = 0) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("WIRE_ROLE", role, 1);
    setenv("WIRE_OUT", path.c_str(), 1);
    setenv("WIRE_PORT", std::to_string(port).c_str(), 1);
    setenv("SOFTRDMA_DIRECT", "0", 1);
    if (c.key_file) setenv("SOFTRDMA_AUTH_KEY_FILE", c.key_file, 1); else unsetenv("SOFTRDMA_AUTH_KEY_FILE");
    if (c.mode) setenv("SOFTRDMA_WIRE_PROTECT", c.mode, 1); else unsetenv("SOFTRDMA_WIRE_PROTECT");
    if (c.key) setenv("SOFTRDMA_AUTH_KEY", c.key, 1); else unsetenv("SOFTRDMA_AUTH_KEY");
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    execl("/proc/self/exe", "wire_protect_role", "--gtest_filter=WireProtectRole.Run", static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

std::vector<std::string> lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> v;
  for (std::string l; std::getline(f, l);) v.push_back(l);
  return v;
}

// Runs a server with s and a client with c; returns each one's last line.
std::pair<std::string, std::string> run_pair(const Config& s, const Config& c) {
  char dir[] = "/tmp/wire_protect_XXXXXX";
  if (!mkdtemp(dir)) return {"mkdtemp", ""};
  const std::string sp = std::string(dir) + "/server", cp = std::string(dir) + "/client";
  pid_t sv = spawn("server", sp, s);
  uint16_t port = 0;
  for (int i = 0; i < 2000 && !port; ++i) {
    for (const std::string& l : lines(sp))
      if (l.rfind("port ", 0) == 0) port = static_cast<uint16_t>(std::stoi(l.substr(5)));
    if (!port) usleep(10000);
  }
  if (!port) {
    kill(sv, SIGKILL);
    waitpid(sv, nullptr, 0);
    return {"server gave no port", ""};
  }
  pid_t cl = spawn("client", cp, c, port);
  int st = 0;
  waitpid(cl, &st, 0);
  std::ofstream(sp + ".stop") << "stop\n";
  waitpid(sv, &st, 0);
  auto sl = lines(sp), cll = lines(cp);
  return {sl.empty() ? "" : sl.back(), cll.empty() ? "" : cll.back()};
}

}  // namespace

TEST(WireProtectRole, Run) {
  const char* role = getenv("WIRE_ROLE");
  if (!role) GTEST_SKIP() << "a process of the WireProtect cases, started by them";
  const char* path = getenv("WIRE_OUT");
  if (!strcmp(role, "server")) server(path);
  else client(path, static_cast<uint16_t>(atoi(getenv("WIRE_PORT"))));
}

TEST(WireProtect, BothAuthDeliverEveryByte) {
  auto [s, c] = run_pair({"auth", kKey1}, {"auth", kKey1});
  EXPECT_EQ(s, "ok");
  EXPECT_EQ(c, "ok");
}

TEST(WireProtect, BothEncryptDeliverEveryByte) {
  auto [s, c] = run_pair({"encrypt", kKey1}, {"encrypt", kKey1});
  EXPECT_EQ(s, "ok");
  EXPECT_EQ(c, "ok");
}

TEST(WireProtect, OperatorKeyFromAFile) {
  char path[] = "/tmp/wire_key_XXXXXX";
  int fd = mkstemp(path);  // mode 0600, as the key file must have
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, kKey1, sizeof kKey1 - 1), static_cast<ssize_t>(sizeof kKey1 - 1));
  close(fd);
  auto [s, c] = run_pair({"encrypt", nullptr, path}, {"encrypt", kKey1});
  unlink(path);
  EXPECT_EQ(s, "ok");
  EXPECT_EQ(c, "ok");
}

const std::string kRejected = "rejected 24256 softrdma: wire protection mismatch";

TEST(WireProtect, OtherOperatorKeyIsRejected) {
  auto [s, c] = run_pair({"auth", kKey1}, {"auth", kKey2});
  EXPECT_EQ(s, "noreq");
  EXPECT_EQ(c, kRejected);
}

TEST(WireProtect, OtherModeIsRejected) {
  auto [s, c] = run_pair({"encrypt", kKey1}, {"auth", kKey1});
  EXPECT_EQ(s, "noreq");
  EXPECT_EQ(c, kRejected);
}

TEST(WireProtect, UnprotectedClientIsRejected) {
  auto [s, c] = run_pair({"auth", kKey1}, {nullptr, nullptr});
  EXPECT_EQ(s, "noreq");
  EXPECT_EQ(c, kRejected);
}

TEST(WireProtect, UnprotectedServerRejectsAProtectedClient) {
  auto [s, c] = run_pair({nullptr, nullptr}, {"encrypt", kKey1});
  EXPECT_EQ(s, "noreq");
  EXPECT_EQ(c, kRejected);
}

TEST(WireProtect, PrivateDataBeyondWhatProtectionLeavesIsRefused) {
  // The REQ's 56 application bytes less the 52-byte block: 4 (checked in the client role's REQ);
  // one more is EINVAL, in a process of its own.
  char dir[] = "/tmp/wire_protect_XXXXXX";
  ASSERT_TRUE(mkdtemp(dir));
  pid_t pid = fork();
  if (pid == 0) {
    setenv("SOFTRDMA_WIRE_PROTECT", "auth", 1);
    setenv("SOFTRDMA_AUTH_KEY", kKey1, 1);
    setenv("SOFTRDMA_DIRECT", "0", 1);
    setenv("WIRE_ROLE", "client", 1);
    setenv("WIRE_OUT", (std::string(dir) + "/x").c_str(), 1);
    setenv("WIRE_BIG_PDATA", "1", 1);
    setenv("WIRE_PORT", "1", 1);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    execl("/proc/self/exe", "wire_protect_role", "--gtest_filter=WireProtectRole.Big", static_cast<char*>(nullptr));
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  auto l = lines(std::string(dir) + "/x");
  ASSERT_FALSE(l.empty());
  EXPECT_EQ(l.back(), "einval");
}

TEST(WireProtectRole, Big) {
  if (!getenv("WIRE_BIG_PDATA")) GTEST_SKIP() << "started by WireProtect.PrivateDataBeyondWhatProtectionLeavesIsRefused";
  const char* path = getenv("WIRE_OUT");
  Listener L;
  Client C;
  if (!C.resolve(L.port)) return out(path, "resolve failed");
  Side cs;
  if (!cs.setup(C.id, 4096)) return out(path, "setup failed");
  char pd[5] = "ABCD";
  rdma_conn_param cp{};
  cp.private_data = pd;
  cp.private_data_len = 5;
  cp.retry_count = 7;
  const int rc = rdma_connect(C.id, &cp);
  out(path, rc == -1 && errno == EINVAL ? "einval" : "rc " + std::to_string(rc) + " errno " + std::to_string(errno));
}
