#include "net/registry.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "user_files_fixture.h"

#include "config/config.h"
#include "net/user_files.h"

namespace softrdma::net {
namespace {

const wire::IpAddress kLo = wire::IpAddress::v4(htonl(INADDR_LOOPBACK));

// Each test gets its own registry file, so tests neither see host state nor each other.
class RegistryTest : public UserFilesTest {
 protected:
  RegistryTest() : UserFilesTest("softrdma-unit-registry-") {}
};

bool valid_qpn(uint32_t q) { return q > 1 && q < 0xFFFFFF; }

// Runs body in a forked child and returns its exit status (body's return value).
template <typename F>
int in_child(F body) {
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 255;
}

void write_all(int fd, const void* p, size_t n) {
  ASSERT_EQ(write(fd, p, n), static_cast<ssize_t>(n));
}
void read_all(int fd, void* p, size_t n) {
  ASSERT_EQ(read(fd, p, n), static_cast<ssize_t>(n));
}

// An IPv6 context is named by its address's key: the same for the same address, never an IPv4
// unicast address (0.0.0.0/8), and another for another address.
TEST_F(RegistryTest, Ipv6ContextIsNamedByItsAddressKey) {
  Registry r(path_);
  wire::IpAddress a, b;
  ASSERT_TRUE(wire::parse("fd00::1", &a));
  ASSERT_TRUE(wire::parse("fd00::2", &b));
  uint32_t q = r.allocate_qpn(a, 5001);
  ASSERT_TRUE(valid_qpn(q));
  auto ep = r.lookup(q);
  ASSERT_TRUE(ep);
  EXPECT_EQ(ep->ip_key, a.key());
  EXPECT_NE(ep->ip_key, b.key());
  EXPECT_EQ(reinterpret_cast<const uint8_t*>(&ep->ip_key)[0], 0) << "in 0.0.0.0/8";
  EXPECT_NE(ep->ip_key, 0u);
  r.release_qpn(q);
}

TEST_F(RegistryTest, AllocateLookupRelease) {
  Registry r(path_);
  uint32_t q = r.allocate_qpn(kLo, 5000);
  ASSERT_TRUE(valid_qpn(q));
  auto ep = r.lookup(q);
  ASSERT_TRUE(ep);
  EXPECT_EQ(ep->ip_key, kLo.key());
  EXPECT_EQ(ep->port, 5000);
  EXPECT_EQ(ep->pid, getpid());
  EXPECT_FALSE(r.lookup(q ^ 0x10000));  // same slot, different QPN
  EXPECT_FALSE(r.lookup(0x1000000 | q));  // not a 24-bit QPN
  r.release_qpn(q);
  EXPECT_FALSE(r.lookup(q));
  r.release_qpn(q);  // twice is harmless
  EXPECT_TRUE(r.entries().empty());
}

TEST_F(RegistryTest, ManyAllocationsAreUniqueRandomAndNeverReserved) {
  Registry r(path_);
  constexpr int kN = 20000;
  std::set<uint32_t> seen;
  std::vector<uint32_t> order;
  for (int i = 0; i < kN; ++i) {
    uint32_t q = r.allocate_qpn(kLo, static_cast<uint16_t>(i));
    ASSERT_TRUE(valid_qpn(q)) << q;
    ASSERT_TRUE(seen.insert(q).second) << "duplicate QPN " << q;
    order.push_back(q);
  }
  int sequential = 0;
  for (size_t i = 1; i < order.size(); ++i) sequential += order[i] == order[i - 1] + 1;
  EXPECT_LT(sequential, kN / 100);
  EXPECT_GT(*seen.rbegin() - *seen.begin(), 1u << 23);  // spread over the 24-bit space
  for (int i = 0; i < kN; ++i) {
    auto ep = r.lookup(order[i]);
    ASSERT_TRUE(ep);
    EXPECT_EQ(ep->port, static_cast<uint16_t>(i));
  }
  auto all = r.entries();
  ASSERT_EQ(all.size(), static_cast<size_t>(kN));
  for (size_t i = 1; i < all.size(); ++i) EXPECT_LT(all[i - 1].first, all[i].first);
  for (uint32_t q : order) r.release_qpn(q);
  EXPECT_TRUE(r.entries().empty());
}

TEST_F(RegistryTest, ConcurrentThreadsGetDistinctQpns) {
  Registry r(path_);
  constexpr int kThreads = 4, kEach = 3000;
  std::vector<std::vector<uint32_t>> got(kThreads);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) got[t].push_back(r.allocate_qpn(kLo, static_cast<uint16_t>(t)));
    });
  }
  for (auto& t : ts) t.join();
  std::set<uint32_t> all;
  for (int t = 0; t < kThreads; ++t) {
    for (uint32_t q : got[t]) {
      ASSERT_TRUE(valid_qpn(q));
      ASSERT_TRUE(all.insert(q).second);
      EXPECT_EQ(r.lookup(q)->port, t);
    }
  }
}

TEST_F(RegistryTest, TwoMappingsShareState) {
  Registry a(path_);
  Registry b(path_);
  uint32_t q = a.allocate_qpn(kLo, 7);
  ASSERT_TRUE(b.lookup(q));
  EXPECT_EQ(b.lookup(q)->port, 7);
  b.release_qpn(q);  // same pid: allowed
  EXPECT_FALSE(a.lookup(q));
}

TEST_F(RegistryTest, CrossProcessVisibility) {
  Registry r(path_);
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const uint32_t ip = htonl(0x0a000001);
  pid_t child = fork();
  if (child == 0) {
    Registry own(path_);  // a fresh open, as an unrelated process would do
    uint32_t q = own.allocate_qpn(wire::IpAddress::v4(ip), 4791);
    if (write(to_parent[1], &q, sizeof(q)) != sizeof(q)) _exit(2);
    char go;
    if (read(to_child[0], &go, 1) != 1) _exit(3);
    own.release_qpn(q);
    _exit(0);
  }
  uint32_t q = 0;
  read_all(to_parent[0], &q, sizeof(q));
  ASSERT_TRUE(valid_qpn(q));
  auto ep = r.lookup(q);
  ASSERT_TRUE(ep);
  EXPECT_EQ(ep->pid, child);
  EXPECT_EQ(ep->ip_key, ip);
  EXPECT_EQ(ep->port, 4791);
  r.release_qpn(q);  // not ours: must be ignored
  EXPECT_TRUE(r.lookup(q));
  EXPECT_EQ(r.reclaim_dead(), 0u);  // the child is alive
  write_all(to_child[1], "g", 1);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(r.lookup(q));  // the child released it
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) close(fd);
}

TEST_F(RegistryTest, DeadProcessEntriesAreReclaimed) {
  Registry r(path_);
  uint32_t mine = r.allocate_qpn(kLo, 1);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  int rc = in_child([&] {
    uint32_t qs[3];
    for (auto& q : qs) q = r.allocate_qpn(kLo, 2);  // the inherited mapping works in the child too
    if (write(fds[1], qs, sizeof(qs)) != sizeof(qs)) return 2;
    return 0;  // exits without releasing
  });
  ASSERT_EQ(rc, 0);
  uint32_t qs[3];
  read_all(fds[0], qs, sizeof(qs));
  for (uint32_t q : qs) ASSERT_TRUE(r.lookup(q)) << "entries stay until reclaimed";
  EXPECT_EQ(r.reclaim_dead(), 3u);
  for (uint32_t q : qs) EXPECT_FALSE(r.lookup(q));
  EXPECT_TRUE(r.lookup(mine));  // a live owner's entry survives
  EXPECT_EQ(r.reclaim_dead(), 0u);
  close(fds[0]);
  close(fds[1]);
}

TEST_F(RegistryTest, FullRegistryReturnsZeroAndReusesDeadEntries) {
  Registry r(path_);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  int rc = in_child([&] {
    uint32_t n = 0;
    while (r.allocate_qpn(kLo, 9) != 0) ++n;
    if (write(fds[1], &n, sizeof(n)) != sizeof(n)) return 2;
    // Full, and every entry is ours (alive): nothing to take.
    return r.allocate_qpn(kLo, 9) == 0 ? 0 : 3;
  });
  ASSERT_EQ(rc, 0);
  uint32_t n = 0;
  read_all(fds[0], &n, sizeof(n));
  EXPECT_EQ(n, Registry::kCapacity);
  // The owner is dead now: allocation takes one of its slots.
  uint32_t q = r.allocate_qpn(kLo, 10);
  ASSERT_TRUE(valid_qpn(q));
  EXPECT_EQ(r.lookup(q)->pid, getpid());
  EXPECT_EQ(r.reclaim_dead(), Registry::kCapacity - 1);
  EXPECT_EQ(r.entries().size(), 1u);
  close(fds[0]);
  close(fds[1]);
}

TEST_F(RegistryTest, ChildCannotReleaseParentsEntry) {
  Registry r(path_);
  uint32_t q = r.allocate_qpn(kLo, 77);
  int rc = in_child([&] {
    r.release_qpn(q);
    if (r.reclaim_dead() != 0) return 4;  // the parent is alive
    auto ep = r.lookup(q);
    return ep && ep->pid == getppid() ? 0 : 5;
  });
  EXPECT_EQ(rc, 0);
  auto ep = r.lookup(q);
  ASSERT_TRUE(ep);
  EXPECT_EQ(ep->pid, getpid());
  EXPECT_EQ(ep->port, 77);
}

TEST_F(RegistryTest, ConcurrentCreationByManyProcesses) {
  constexpr int kProcs = 6, kEach = 200;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      Registry own(path_);  // all children race to create and initialise the file
      for (int i = 0; i < kEach; ++i) {
        uint32_t q = own.allocate_qpn(kLo, static_cast<uint16_t>(p));
        if (write(fds[1], &q, sizeof(q)) != sizeof(q)) _exit(2);
      }
      _exit(0);
    }
    kids.push_back(pid);
  }
  std::set<uint32_t> all;
  for (int i = 0; i < kProcs * kEach; ++i) {
    uint32_t q = 0;
    read_all(fds[0], &q, sizeof(q));
    ASSERT_TRUE(valid_qpn(q));
    EXPECT_TRUE(all.insert(q).second) << "duplicate QPN across processes";
  }
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  Registry r(path_);
  EXPECT_EQ(r.entries().size(), static_cast<size_t>(kProcs * kEach));
  EXPECT_EQ(r.reclaim_dead(), static_cast<size_t>(kProcs * kEach));
  close(fds[0]);
  close(fds[1]);
}

TEST_F(RegistryTest, IncompatibleFileIsRejected) {
  {
    Registry r(path_);
  }
  int fd = open(own_file().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint32_t bad_version = 999;
  ASSERT_EQ(pwrite(fd, &bad_version, sizeof(bad_version), 8), 4);  // version follows the 8-byte magic
  close(fd);
  EXPECT_THROW(Registry r(path_), std::runtime_error);
}

// SOFTRDMA_REGISTRY as the process's setting (config::set_option, over the environment; that the
// environment reaches the table is config_test's).
TEST_F(RegistryTest, InstanceHonoursSoftrdmaRegistry) {
  ASSERT_TRUE(config::set_option("SOFTRDMA_REGISTRY", ""));  // the default, whatever the environment says
  EXPECT_EQ(Registry::default_path(), "/dev/shm/softrdma-registry-" + std::to_string(netns_inode()));
  ASSERT_TRUE(config::set_option("SOFTRDMA_REGISTRY", path_.substr(std::string("/dev/shm/").size()).c_str()));
  EXPECT_EQ(Registry::default_path(), path_);
  ASSERT_TRUE(config::set_option("SOFTRDMA_REGISTRY", path_.c_str()));
  EXPECT_EQ(Registry::default_path(), path_);
  Registry& inst = Registry::instance();  // the only test that opens the singleton
  EXPECT_EQ(inst.path(), path_);
  EXPECT_EQ(&inst, &Registry::instance());
  uint32_t q = inst.allocate_qpn(kLo, 3);
  EXPECT_TRUE(Registry(path_).lookup(q));
  inst.release_qpn(q);
  config::set_option("SOFTRDMA_REGISTRY", nullptr);
}

// ---- per-user files (net/user_files.h): what a reader accepts as another user's file ----

TEST(UserFilesNames, OnlyBaseDashUidWithAnOptionalSmallSuffix) {
  EXPECT_EQ(UserFiles::uid_of_name("reg", "reg-u0"), 0);
  EXPECT_EQ(UserFiles::uid_of_name("reg", "reg-u61234"), 61234);
  EXPECT_EQ(UserFiles::uid_of_name("reg", "reg-u12.3"), 12);
  EXPECT_EQ(UserFiles::uid_of_name("reg", "reg-u12.15"), 12);
  EXPECT_EQ(UserFiles::uid_of_name("reg", "reg-u12.16"), -1);  // beyond kMaxSuffix
  EXPECT_EQ(UserFiles::uid_of_name("reg", "reg-u12.0"), -1);
  EXPECT_EQ(UserFiles::uid_of_name("reg", "reg-u12."), -1);
  EXPECT_EQ(UserFiles::uid_of_name("reg", "reg-u"), -1);
  EXPECT_EQ(UserFiles::uid_of_name("reg", "reg-u12x"), -1);
  EXPECT_EQ(UserFiles::uid_of_name("reg", "reg-u-1"), -1);
  EXPECT_EQ(UserFiles::uid_of_name("reg", "reg-u4294967295"), -1);
  EXPECT_EQ(UserFiles::uid_of_name("reg", "regx-u1"), -1);
  EXPECT_EQ(UserFiles::uid_of_name("reg", "reg-1"), -1);
}

TEST(ProcessFacts, KernelFactsOfThisProcessAndOfNone) {
  ProcessFacts f{};
  ASSERT_TRUE(process_facts(getpid(), &f));
  EXPECT_EQ(f.euid, geteuid());
  EXPECT_EQ(f.ruid, getuid());
  EXPECT_EQ(f.start_ticks, own_start_ticks());
  EXPECT_GT(f.start_ticks, 0u);
  EXPECT_LE(f.start_ticks * tick_ns(), boottime_ns());  // started before now
  pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(process_facts(child, &f));  // reaped: gone
  EXPECT_FALSE(process_facts(0, &f));
  EXPECT_FALSE(process_facts(-5, &f));
}

// The registry file layout (src/net/registry.cpp), written by hand as another process would.
constexpr size_t kHdr = 64, kSlot = 32, kLen = kHdr + kSlot * Registry::kCapacity;
void write_file(const std::string& path, mode_t mode, uint32_t qpn, uint16_t port, int32_t pid, uint64_t start) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(fchmod(fd, mode), 0);
  ASSERT_EQ(ftruncate(fd, kLen), 0);
  uint64_t slot[4] = {qpn | (2ull << 24) | (1ull << 26) | (static_cast<uint64_t>(pid) << 32),
                      (static_cast<uint64_t>(kLo.key()) << 32) | port, start * tick_ns() + 1, start};
  ASSERT_EQ(pwrite(fd, slot, sizeof slot, kHdr + kSlot * (qpn & 0xFFFF)), static_cast<ssize_t>(sizeof slot));
  uint64_t hdr[3] = {0x474552414d445253ull, 2, kLen};
  ASSERT_EQ(pwrite(fd, hdr, sizeof hdr, 0), static_cast<ssize_t>(sizeof hdr));
  close(fd);
}

// A second file of our own uid (the .1 name) is another file like any other user's: a valid one is
// read; one writable by others, or one under another uid's name, is not.
TEST_F(RegistryTest, OtherFilesCountOnlyWhenOwnerModeAndProcessCheckOut) {
  Registry r(path_);
  ASSERT_EQ(r.own_path(), own_file());
  const uint32_t q = 0x3A0777;
  write_file(own_file() + ".1", 0644, q, 4321, getpid(), own_start_ticks());
  {
    Registry reader(path_);
    auto ep = reader.lookup(q);
    ASSERT_TRUE(ep) << "a valid file of the right owner is read";
    EXPECT_EQ(ep->port, 4321);
    EXPECT_EQ(ep->pid, getpid());
  }
  ASSERT_EQ(chmod((own_file() + ".1").c_str(), 0666), 0);
  {
    Registry reader(path_);
    EXPECT_FALSE(reader.lookup(q)) << "a file others may write is no one's word";
    EXPECT_GE(reader.stats().files_refused, 1u);
  }
  unlink((own_file() + ".1").c_str());
  const std::string foreign = path_ + "-u" + std::to_string(geteuid() + 4242);
  write_file(foreign, 0644, q, 4321, getpid(), own_start_ticks());
  {
    Registry reader(path_);
    EXPECT_FALSE(reader.lookup(q)) << "a file named for a uid that does not own it";
    EXPECT_GE(reader.stats().files_refused, 1u);
  }
  unlink(foreign.c_str());
  // Right file, but the entry's start time is not its pid's: a recycled pid, or a forgery.
  write_file(own_file() + ".1", 0644, q, 4321, getpid(), own_start_ticks() + 7);
  {
    Registry reader(path_);
    EXPECT_FALSE(reader.lookup(q));
    EXPECT_EQ(reader.stats().refused, 1u);
  }
  unlink((own_file() + ".1").c_str());
  // A symlink under another name, to our own file: refused, not followed.
  ASSERT_EQ(symlink(own_file().c_str(), (own_file() + ".2").c_str()), 0);
  uint32_t mine = r.allocate_qpn(kLo, 99);
  {
    Registry reader(path_);
    EXPECT_TRUE(reader.lookup(mine));  // through its own file
    EXPECT_GE(reader.stats().files_refused, 1u);
  }
  unlink((own_file() + ".2").c_str());
}

// Allocation never hands out a QPN that another file holds for a live process.
TEST_F(RegistryTest, AllocationAvoidsQpnsOfOtherFiles) {
  // Another file holding, for this live process, every QPN of slots 0..0xFFFE but one upper byte each:
  // the allocator must keep off those exact QPNs.
  {
    int fd = open((own_file() + ".1").c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fchmod(fd, 0644), 0);
    ASSERT_EQ(ftruncate(fd, kLen), 0);
    void* m = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(m, MAP_FAILED);
    auto* w = static_cast<uint64_t*>(m);
    w[0] = 0x474552414d445253ull;
    w[1] = 2;
    w[2] = kLen;
    for (uint32_t i = 0; i < Registry::kCapacity; ++i) {
      uint64_t* slot = w + (kHdr + kSlot * i) / 8;
      uint32_t qpn = (0x55u << 16) | i;  // upper byte 0x55 everywhere
      slot[0] = qpn | (2ull << 24) | (1ull << 26) | (static_cast<uint64_t>(getpid()) << 32);
      slot[1] = (static_cast<uint64_t>(kLo.key()) << 32) | 7;
      slot[2] = own_start_ticks() * tick_ns() + 1;
      slot[3] = own_start_ticks();
    }
    munmap(m, kLen);
    close(fd);
  }
  Registry r(path_);
  for (int i = 0; i < 20000; ++i) {
    uint32_t q = r.allocate_qpn(kLo, 1);
    ASSERT_NE(q, 0u);
    ASSERT_NE(q >> 16, 0x55u) << "handed out QPN " << q << ", which another file holds";
  }
  unlink((own_file() + ".1").c_str());
}

TEST_F(RegistryTest, OwnFileIsExactly0644WhateverTheUmask) {
  mode_t old = umask(077);
  {
    Registry r(path_);
  }
  umask(old);
  struct stat st{};
  ASSERT_EQ(stat(own_file().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  EXPECT_EQ(st.st_uid, geteuid());
}

TEST_F(RegistryTest, SymlinkUnderOwnNameIsNotFollowed) {
  const std::string target = path_ + "-target";
  int fd = open(target.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_EQ(symlink(target.c_str(), own_file().c_str()), 0);
  {
    Registry r(path_);
    EXPECT_EQ(r.own_path(), own_file() + ".1");
    EXPECT_NE(r.allocate_qpn(kLo, 1), 0u);
  }
  struct stat st{};
  ASSERT_EQ(stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
  unlink(target.c_str());
}

// The registry's lock is taken around fork(): a child forked while another thread was in a lookup
// must not find it held forever.
TEST_F(RegistryTest, ForkDuringLookupsLeavesTheChildUsable) {
  Registry r(path_);
  const uint32_t q = r.allocate_qpn(kLo, 5);
  std::atomic<bool> stop{false};
  std::thread t([&] {
    while (!stop.load()) (void)r.lookup(q ^ 0x20000);  // misses take the lock
  });
  for (int i = 0; i < 50; ++i) {
    int rc = in_child([&] {
      alarm(20);  // a deadlocked child dies of SIGALRM instead of hanging the test
      bool ok = !r.lookup(q ^ 0x20000) && r.lookup(q) && r.allocate_qpn(kLo, 6) != 0;
      return ok ? 0 : 1;
    });
    ASSERT_EQ(rc, 0) << "child " << i;
  }
  stop = true;
  t.join();
}

// Another file's owner truncates it under a reader that holds it: no SIGBUS (others' files are read,
// never mapped), its entries are gone, and allocation goes on.
TEST_F(RegistryTest, OtherFileTruncatedUnderAReader) {
  Registry r(path_);
  const uint32_t q = 0x2B0555;
  write_file(own_file() + ".1", 0644, q, 4321, getpid(), own_start_ticks());
  Registry reader(path_);
  ASSERT_TRUE(reader.lookup(q));
  ASSERT_EQ(truncate((own_file() + ".1").c_str(), 100), 0);
  EXPECT_FALSE(reader.lookup(q ^ 0x10000));  // not cached: the slot is read again, short
  for (int i = 0; i < 1000; ++i) ASSERT_NE(reader.allocate_qpn(kLo, 1), 0u);
  EXPECT_EQ(reader.entries().size(), 1000u);
}

}  // namespace
}  // namespace softrdma::net
