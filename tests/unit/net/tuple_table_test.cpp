// The direct path's TCP 4-tuple table (net/tuple_table.h): publish, reverse lookup, removal, other
// processes' entries, dead owners.
#include "net/tuple_table.h"
#include "net/user_files.h"

#include <arpa/inet.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include <gtest/gtest.h>

#include "user_files_fixture.h"

namespace softrdma::net {
namespace {

class TupleTableTest : public UserFilesTest {
 protected:
  TupleTableTest() : UserFilesTest("softrdma-unit-tuples-") {}
};

const TcpTuple kA{htonl(0x7F000001), htonl(0x7F000001), htons(40000), htons(5000)};

TEST_F(TupleTableTest, PublishedTupleIsFoundFromTheOtherEnd) {
  TupleTable t(path_);
  EXPECT_FALSE(t.lookup(kA).has_value());
  ASSERT_TRUE(t.publish(kA, 0x123456));
  ASSERT_TRUE(t.lookup(kA).has_value());
  EXPECT_EQ(*t.lookup(kA), 0x123456u);
  EXPECT_FALSE(t.lookup(kA.reversed()).has_value());  // the other direction is the peer's entry
  ASSERT_TRUE(t.publish(kA.reversed(), 0x654321));
  EXPECT_EQ(*t.lookup(kA.reversed()), 0x654321u);
  TcpTuple other = kA;
  other.local_port_be = htons(40001);
  EXPECT_FALSE(t.lookup(other).has_value());
  t.remove(kA);
  EXPECT_FALSE(t.lookup(kA).has_value());
  EXPECT_EQ(*t.lookup(kA.reversed()), 0x654321u);
}

TEST_F(TupleTableTest, AnotherProcessSeesTheEntryUntilItsOwnerDies) {
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  pid_t pid = fork();
  if (pid == 0) {
    TupleTable t(path_);
    char c = t.publish(kA, 77) ? 'y' : 'n';
    (void)!write(ready[1], &c, 1);
    (void)!read(done[0], &c, 1);
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  TupleTable t(path_);
  ASSERT_TRUE(t.lookup(kA).has_value());
  EXPECT_EQ(*t.lookup(kA), 77u);
  t.remove(kA);  // not ours: stays
  EXPECT_TRUE(t.lookup(kA).has_value());
  (void)!write(done[1], "x", 1);
  int st;
  waitpid(pid, &st, 0);
  EXPECT_FALSE(t.lookup(kA).has_value());  // its owner is gone
  EXPECT_TRUE(t.publish(kA, 78));           // and the slot is taken over
  EXPECT_EQ(*t.lookup(kA), 78u);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);
}

TEST_F(TupleTableTest, ManyTuplesEachFoundWithItsQpn) {
  TupleTable t(path_);
  int ok = 0;
  // Many tuples: all fit (64-slot probe windows in 4096 slots), each found with its own QPN.
  for (uint16_t p = 1; p <= 1000; ++p) {
    TcpTuple x = kA;
    x.local_port_be = htons(p);
    ok += t.publish(x, p);
  }
  EXPECT_EQ(ok, 1000);
  for (uint16_t p = 1; p <= 1000; ++p) {
    TcpTuple x = kA;
    x.local_port_be = htons(p);
    ASSERT_TRUE(t.lookup(x).has_value());
    EXPECT_EQ(*t.lookup(x), p);
  }
}

}  // namespace
}  // namespace softrdma::net
