// Cross-user attacks on softrdma's host-local files: the QPN registry, the iWARP tuple table and the
// stats pages (docs/security.md). The attacker is this test binary run again as uid 61234 through
// `setpriv --reuid=61234 --regid=61234 --clear-groups` (one action per process, chosen by
// $SOFTRDMA_ATTACK); a bystander of a third uid (61235) does the lookups a third user's process would.
// The victim is this process (root). Needs root and setpriv; skips otherwise.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config/config.h"
#include "core/stats.h"
#include "net/registry.h"
#include "net/tuple_table.h"
#include "net/user_files.h"

extern char** environ;

namespace softrdma::hostile_test {
namespace {

constexpr uid_t kAttacker = 61234;
constexpr uid_t kBystander = 61235;
const uint32_t kLo = htonl(INADDR_LOOPBACK);

// The registry's file layout (src/net/registry.cpp), which an attacker writing its own file knows.
constexpr size_t kRegHeader = 64;
constexpr size_t kRegSlot = 32;
constexpr uint64_t kRegMagic = 0x474552414d445253ull;
constexpr uint64_t kRegVersion = 2;
constexpr size_t kRegLength = kRegHeader + kRegSlot * net::Registry::kCapacity;
uint64_t live_tag(uint32_t qpn, uint64_t gen, int32_t pid) {
  return qpn | (2ull << 24) | (gen << 26) | (static_cast<uint64_t>(static_cast<uint32_t>(pid)) << 32);
}

// ---- the attacker's side: one action, results as "R key value" lines, then READY; exits at EOF ----

void put(const std::string& k, long long v) { std::printf("R %s %lld\n", k.c_str(), v); }

int open_errno(const std::string& path, int flags) {
  int fd = open(path.c_str(), flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return errno;
  close(fd);
  return 0;
}

// Writes a live registry entry straight into the file at path (mapped read-write).
bool forge_entry(const std::string& path, uint32_t qpn, uint16_t port, int32_t pid, uint64_t start,
                 uint64_t claim_ns) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  void* m = mmap(nullptr, kRegLength, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return false;
  auto* slot = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(m) + kRegHeader + kRegSlot * (qpn & 0xFFFF));
  slot[1] = (static_cast<uint64_t>(kLo) << 32) | port;
  slot[2] = claim_ns;
  slot[3] = start;
  __atomic_store_n(&slot[0], live_tag(qpn, 5, pid), __ATOMIC_RELEASE);
  munmap(m, kRegLength);
  return true;
}

// A whole registry file of our own under someone else's name, valid in every other respect.
int plant_registry_file(const std::string& path, uint32_t qpn, uint16_t port) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  if (ftruncate(fd, kRegLength) != 0) return errno;
  uint64_t hdr[3] = {kRegMagic, kRegVersion, kRegLength};
  if (pwrite(fd, hdr, sizeof hdr, 0) != sizeof hdr) return errno;
  close(fd);
  if (qpn) forge_entry(path, qpn, port, getpid(), net::own_start_ticks(), net::own_start_ticks() * net::tick_ns());
  return 0;
}

std::vector<std::string> split(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

void wait_for_eof() {
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
}

int act(const std::vector<std::string>& a) {
  const std::string& what = a.at(0);
  if (what == "open") {  // PATH
    put("rdwr", open_errno(a[1], O_RDWR));
    put("rdonly", open_errno(a[1], O_RDONLY));
  } else if (what == "plant") {  // PATH QPN PORT
    put("errno", plant_registry_file(a[1], std::stoul(a[2]), std::stoul(a[3])));
  } else if (what == "symlink") {  // LINK TARGET
    put("errno", symlink(a[2].c_str(), a[1].c_str()) == 0 ? 0 : errno);
  } else if (what == "claim") {  // BASE QPN PORT MODE [PID]: a live entry in our own file
    net::Registry r(a[1]);
    const uint32_t qpn = std::stoul(a[2]);
    const uint64_t start = net::own_start_ticks();
    int32_t pid = getpid();
    uint64_t claim = start * net::tick_ns();  // the earliest claim time a process can prove
    if (a[4] == "before_start") claim = 0;
    if (a[4] == "other_pid") pid = std::stoi(a[5]);
    put("forged", forge_entry(r.own_path(), qpn, std::stoul(a[3]), pid, start, claim));
  } else if (what == "alloc") {  // BASE PORT
    net::Registry r(a[1]);
    put("qpn", r.allocate_qpn(wire::IpAddress::v4(kLo), std::stoul(a[2])));
  } else if (what == "lookup") {  // BASE QPN
    net::Registry r(a[1]);
    auto ep = r.lookup(std::stoul(a[2]));
    put("found", ep.has_value());
    put("port", ep ? ep->port : 0);
    put("conflicts", static_cast<long long>(r.stats().conflicts));
    put("refused", static_cast<long long>(r.stats().refused));
    put("files_refused", static_cast<long long>(r.stats().files_refused));
  } else if (what == "stats") {  // PATH VICTIM_PID
    put("rdonly", open_errno(a[1], O_RDONLY));
    long long seen = 0;
    for (const auto& s : core::StatsPage::read_all()) seen += s.pid == std::stoi(a[2]);
    put("seen", seen);
  } else if (what == "tuple_forge") {  // BASE LIP RIP LPORT RPORT QPN (network order numbers)
    net::TupleTable t(a[1]);
    net::TcpTuple x{static_cast<uint32_t>(std::stoul(a[2])), static_cast<uint32_t>(std::stoul(a[3])),
                    static_cast<uint16_t>(std::stoul(a[4])), static_cast<uint16_t>(std::stoul(a[5]))};
    put("published", t.publish(x, std::stoul(a[6])));
  } else if (what == "tuple_connect") {  // BASE PORT QPN: a connection of our own, published honestly
    net::TupleTable t(a[1]);
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = kLo;
    to.sin_port = htons(static_cast<uint16_t>(std::stoul(a[2])));
    if (connect(s, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) return 2;
    sockaddr_in l{};
    socklen_t ll = sizeof l;
    getsockname(s, reinterpret_cast<sockaddr*>(&l), &ll);
    put("published", t.publish({l.sin_addr.s_addr, kLo, l.sin_port, to.sin_port}, std::stoul(a[3])));
    put("local_port", ntohs(l.sin_port));
    std::printf("READY\n");
    wait_for_eof();
    close(s);
    return 0;
  } else {
    return 2;
  }
  std::printf("READY\n");
  wait_for_eof();
  return 0;
}

// The attacker's entry point: a test that runs only when asked for by name.
TEST(RegistryAttacker, DISABLED_Act) {
  const char* cmd = std::getenv("SOFTRDMA_ATTACK");
  if (!cmd) GTEST_SKIP();
  std::exit(act(split(cmd)));
}

// ---- the victim's side ----

bool have_setpriv() { return access("/usr/bin/setpriv", X_OK) == 0 || access("/bin/setpriv", X_OK) == 0; }

// One attacker (or bystander) process; its results once it printed READY. Exits when destroyed.
class Other {
 public:
  Other(uid_t uid, const std::string& cmd) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    int out[2], in[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(in, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::string ru = "--reuid=" + std::to_string(uid), rg = "--regid=" + std::to_string(uid);
    std::vector<std::string> args = {"setpriv", ru, rg, "--clear-groups", "--", exe,
                                     "--gtest_filter=RegistryAttacker.DISABLED_Act",
                                     "--gtest_also_run_disabled_tests"};
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "SOFTRDMA_ATTACK=", 16) != 0 && std::strncmp(*e, "GTEST_", 6) != 0) env.push_back(*e);
    env.push_back("SOFTRDMA_ATTACK=" + cmd);
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    int rc = posix_spawnp(&pid_, "setpriv", &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    close(in[0]);
    to_child_ = in[1];
    if (rc != 0) {
      pid_ = -1;
      close(out[0]);
      return;
    }
    FILE* f = fdopen(out[0], "r");
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, "READY", 5) == 0) {
        ready_ = true;
        break;
      }
      char key[64];
      long long v;
      if (std::sscanf(line, "R %63s %lld", key, &v) == 2) results_[key] = v;
    }
    out_ = f;  // kept open: the child may still write gtest's lines
  }
  ~Other() {
    if (to_child_ >= 0) close(to_child_);
    if (pid_ > 0) {
      int st;
      waitpid(pid_, &st, 0);
    }
    if (out_) std::fclose(out_);
  }
  bool ready() const { return ready_; }
  long long operator[](const std::string& k) const {
    auto it = results_.find(k);
    return it == results_.end() ? -1 : it->second;
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1;
  FILE* out_ = nullptr;
  bool ready_ = false;
  std::map<std::string, long long> results_;
};

class RegistryAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (the attacker runs as uid 61234)";
    if (!have_setpriv()) GTEST_SKIP() << "needs setpriv (util-linux)";
    static std::atomic<int> n{0};
    base_ = "/dev/shm/softrdma-hostile-reg-" + std::to_string(getpid()) + "-" + std::to_string(n++);
    clean();
  }
  void TearDown() override { clean(); }
  void clean() const {
    if (base_.empty()) return;
    for (uid_t u : {uid_t(0), kAttacker, kBystander})
      for (int k = 0; k < net::UserFiles::kMaxSuffix; ++k)
        unlink(own(u, k).c_str());
    unlink((base_ + "-target").c_str());
  }
  // Appended piece by piece: operator+ on std::string draws GCC 12 -Wrestrict false positives at -O3.
  std::string own(uid_t u, int k = 0) const {
    std::string p = base_;
    p.append("-u").append(std::to_string(u));
    if (k) p.append(".").append(std::to_string(k));
    return p;
  }
  std::string base_;
};

TEST_F(RegistryAttack, VictimFileIsReadOnlyForOthers) {
  net::Registry r(base_);
  ASSERT_EQ(r.own_path(), own(0));
  struct stat st{};
  ASSERT_EQ(stat(own(0).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  Other a(kAttacker, "open " + own(0));
  ASSERT_TRUE(a.ready());
  EXPECT_EQ(a["rdwr"], EACCES);  // cannot rewrite who owns the victim's QPNs
  EXPECT_EQ(a["rdonly"], 0);     // but may read them: lookups work across users
}

TEST_F(RegistryAttack, CrossUserLookupAndUniqueness) {
  net::Registry r(base_);
  const uint32_t mine = r.allocate_qpn(wire::IpAddress::v4(kLo), 1111);
  ASSERT_NE(mine, 0u);
  Other a(kAttacker, "alloc " + base_ + " 2222");
  ASSERT_TRUE(a.ready());
  const uint32_t theirs = static_cast<uint32_t>(a["qpn"]);
  ASSERT_NE(theirs, 0u);
  EXPECT_NE(theirs, mine);
  auto ep = r.lookup(theirs);  // a process of another user is found: cross-user RC keeps working
  ASSERT_TRUE(ep);
  EXPECT_EQ(ep->port, 2222);
  Other b(kBystander, "lookup " + base_ + " " + std::to_string(mine));
  ASSERT_TRUE(b.ready());
  EXPECT_EQ(b["found"], 1);
  EXPECT_EQ(b["port"], 1111);
  EXPECT_EQ(b["conflicts"], 0);
}

// The attacker claims the victim's live QPN in its own file: a bystander's lookup still finds the
// victim, whether the forged entry is dated at the attacker's start, before it, or names another pid.
TEST_F(RegistryAttack, LiveQpnCannotBeClaimedByAnotherUser) {
  net::Registry r(base_);
  const uint32_t q = r.allocate_qpn(wire::IpAddress::v4(kLo), 1111);
  ASSERT_NE(q, 0u);
  const std::string qs = std::to_string(q);
  struct Case {
    std::string mode;
    long long conflicts, refused;
  };
  for (const Case& c : {Case{"at_start", 1, 0}, Case{"before_start", 0, 1},
                        Case{"other_pid " + std::to_string(getpid()), 0, 1}}) {
    SCOPED_TRACE(c.mode);
    Other a(kAttacker, "claim " + base_ + " " + qs + " 6666 " + c.mode);
    ASSERT_TRUE(a.ready());
    ASSERT_EQ(a["forged"], 1);
    Other b(kBystander, "lookup " + base_ + " " + qs);
    ASSERT_TRUE(b.ready());
    EXPECT_EQ(b["found"], 1);
    EXPECT_EQ(b["port"], 1111) << "the attacker took the victim's QPN";
    EXPECT_EQ(b["conflicts"], c.conflicts);
    EXPECT_EQ(b["refused"], c.refused);
    auto ep = r.lookup(q);
    ASSERT_TRUE(ep);
    EXPECT_EQ(ep->port, 1111);
  }
}

// A file under the victim's uid's name but owned by the attacker is ignored by readers; planted
// before the victim's first open, it and a planted symlink only push the victim to its next name.
TEST_F(RegistryAttack, ForgedFilesAndSymlinksUnderTheVictimsName) {
  const uint32_t forged_qpn = 0x4A0123;
  // Stays alive to the end, so its forged entry names a live process of the attacker's.
  Other planter(kAttacker, "plant " + own(0) + " " + std::to_string(forged_qpn) + " 6666");
  ASSERT_TRUE(planter.ready());
  ASSERT_EQ(planter["errno"], 0);
  {
    int fd = open((base_ + "-target").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
    ASSERT_GE(fd, 0);
    close(fd);
    ASSERT_EQ(chown((base_ + "-target").c_str(), kAttacker, kAttacker), 0);
    Other a(kAttacker, "symlink " + own(0, 1) + " " + base_ + "-target");
    ASSERT_TRUE(a.ready());
    ASSERT_EQ(a["errno"], 0);
  }
  net::Registry r(base_);
  EXPECT_EQ(r.own_path(), own(0, 2));  // u0 is the attacker's file, u0.1 the attacker's link
  EXPECT_GE(r.stats().files_refused, 2u);
  struct stat st{};
  ASSERT_EQ(stat((base_ + "-target").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "the victim wrote through the planted symlink";
  EXPECT_FALSE(r.lookup(forged_qpn)) << "an entry from a file whose owner is not the uid in its name";
  const uint32_t q = r.allocate_qpn(wire::IpAddress::v4(kLo), 1111);
  ASSERT_NE(q, 0u);
  Other b(kBystander, "lookup " + base_ + " " + std::to_string(q));
  ASSERT_TRUE(b.ready());
  EXPECT_EQ(b["found"], 1);
  EXPECT_EQ(b["port"], 1111);
  EXPECT_GE(b["files_refused"], 1);
  Other c(kBystander, "lookup " + base_ + " " + std::to_string(forged_qpn));
  ASSERT_TRUE(c.ready());
  EXPECT_EQ(c["found"], 0);
}

TEST_F(RegistryAttack, StatsPageIsOwnerOnly) {
  core::StatsPage page("hostile", config::Settings{});  // SOFTRDMA_STATS_MODE unset: the default
  ASSERT_FALSE(page.path().empty());
  struct stat st{};
  ASSERT_EQ(stat(page.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  Other a(kAttacker, "stats " + page.path() + " " + std::to_string(getpid()));
  ASSERT_TRUE(a.ready());
  EXPECT_EQ(a["rdonly"], EACCES);
  EXPECT_EQ(a["seen"], 0);
  bool root_sees = false;
  for (const auto& s : core::StatsPage::read_all()) root_sees |= s.pid == getpid() && s.device == "hostile";
  EXPECT_TRUE(root_sees);

  config::Settings widened;
  widened.stats_mode = 0666;  // SOFTRDMA_STATS_MODE=0666: widened, but never writable by others
  core::StatsPage wide("hostile-wide", widened);
  ASSERT_EQ(stat(wide.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  Other b(kAttacker, "open " + wide.path());
  ASSERT_TRUE(b.ready());
  EXPECT_EQ(b["rdonly"], 0);
  EXPECT_EQ(b["rdwr"], EACCES);
}

// The attacker publishes the victim connection's tuple with a QPN of its own: the victim's lookup
// refuses it (the TCP socket is not the attacker's). A connection the attacker really owns is found.
TEST_F(RegistryAttack, TupleTableForgeryIsRefused) {
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = kLo;
  ASSERT_EQ(bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(ls, 4), 0);
  socklen_t al = sizeof addr;
  getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &al);
  int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  int s = accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(s, 0);
  sockaddr_in cl{};
  socklen_t cll = sizeof cl;
  getsockname(c, reinterpret_cast<sockaddr*>(&cl), &cll);
  // The client's view of its connection; the server's entry is its reverse.
  const net::TcpTuple client{kLo, kLo, cl.sin_port, addr.sin_port};
  const net::TcpTuple server = client.reversed();

  net::TupleTable t(base_);
  {
    Other a(kAttacker, "tuple_forge " + base_ + " " + std::to_string(server.local_ip_be) + " " +
                           std::to_string(server.remote_ip_be) + " " + std::to_string(server.local_port_be) +
                           " " + std::to_string(server.remote_port_be) + " " + std::to_string(0xABCDEF));
    ASSERT_TRUE(a.ready());
    ASSERT_EQ(a["published"], 1);
    EXPECT_FALSE(t.lookup(server)) << "paired the victim's connection with the attacker's QPN";
    EXPECT_EQ(t.refused(), 1u);
    ASSERT_TRUE(t.publish(server, 0x123456));  // the real server end
    ASSERT_TRUE(t.lookup(server));
    EXPECT_EQ(*t.lookup(server), 0x123456u);
  }
  {
    Other a(kAttacker, "tuple_connect " + base_ + " " + std::to_string(ntohs(addr.sin_port)) + " " +
                           std::to_string(0x222222));
    ASSERT_TRUE(a.ready());
    ASSERT_EQ(a["published"], 1);
    int s2 = accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(s2, 0);
    const net::TcpTuple theirs{kLo, kLo, htons(static_cast<uint16_t>(a["local_port"])), addr.sin_port};
    auto q = t.lookup(theirs);  // cross-user discovery still works for the socket's owner
    ASSERT_TRUE(q);
    EXPECT_EQ(*q, 0x222222u);
    close(s2);
  }
  for (int fd : {s, c, ls}) close(fd);
  for (uid_t u : {uid_t(0), kAttacker}) unlink((base_ + "-u" + std::to_string(u)).c_str());
}

}  // namespace
}  // namespace softrdma::hostile_test
