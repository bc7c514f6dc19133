// Sharing a bound UDP socket among processes (net/port_share.h): an offer hands the very socket to a
// taker (one receive queue), only to the same user, and the reader lock has one holder at a time.
// Each test shares an ephemeral port of its own, so parallel tests never meet.
#include "net/port_share.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "net/udp_port.h"

namespace softrdma::net {
namespace {

const wire::IpAddress kLo = wire::IpAddress::v4(htonl(INADDR_LOOPBACK));

// Steps the taker, serving the offer between steps, as the two processes' engines would.
int take(PortShare& offer, PortShare::Taker& taker) {
  for (int i = 0; i < 10; ++i) {
    const int fd = taker.step();
    if (fd >= 0) return fd;
    offer.serve();
  }
  return -1;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 5000) == 1;  // generous: only keeps a broken build from hanging
}

TEST(PortShare, ATakerGetsTheVerySocketOffered) {
  UdpPort holder(kLo, 0);
  PortShare offer(holder.fd(), kLo, holder.port());
  ASSERT_GE(offer.listener(), 0);
  PortShare::Taker taker(kLo, holder.port());
  EXPECT_EQ(taker.step(), -1) << "the offer has not answered yet";
  EXPECT_TRUE(taker.waiting());
  const int fd = take(offer, taker);
  ASSERT_GE(fd, 0);
  UdpPort shared(UdpPort::Adopt{}, fd);
  EXPECT_EQ(shared.port(), holder.port());
  EXPECT_EQ(shared.ip(), kLo);

  // One receive queue: a datagram to the port is read through either, once.
  UdpPort sender(kLo, 0);
  const uint8_t msg[] = {1, 2, 3, 4, 5};
  sender.send(msg, sizeof msg, kLo, holder.port());
  sender.flush();
  ASSERT_TRUE(readable(shared.fd()));
  Datagram d[4];
  ASSERT_EQ(shared.receive(d, 4), 1u);
  EXPECT_EQ(std::vector<uint8_t>(d[0].data, d[0].data + d[0].len), std::vector<uint8_t>(msg, msg + sizeof msg));
  EXPECT_EQ(holder.receive(d, 4), 0u) << "taken from the shared queue already";

  // And it sends from the port: what the taker sends comes from holder.port().
  const uint8_t reply[] = {9, 8, 7};
  shared.send(reply, sizeof reply, kLo, sender.port());
  shared.flush();
  ASSERT_TRUE(readable(sender.fd()));
  ASSERT_EQ(sender.receive(d, 4), 1u);
  EXPECT_EQ(d[0].peer_port, holder.port());
}

TEST(PortShare, ATakerOfAPortNobodyOffersGetsNothing) {
  UdpPort unshared(kLo, 0);
  PortShare::Taker taker(kLo, unshared.port());
  EXPECT_EQ(taker.step(), -1);
  EXPECT_FALSE(taker.waiting()) << "no offer to wait for";
}

TEST(PortShare, TheSocketOutlivesTheProcessThatBoundIt) {
  uint16_t port;
  int fd;
  {
    UdpPort holder(kLo, 0);
    port = holder.port();
    PortShare offer(holder.fd(), kLo, port);
    PortShare::Taker taker(kLo, port);
    fd = take(offer, taker);
    ASSERT_GE(fd, 0);
  }  // the binder's socket and offer are closed: the port stays bound through the taker's duplicate
  UdpPort shared(UdpPort::Adopt{}, fd);
  EXPECT_TRUE(udp_port_bound(port));
  UdpPort sender(kLo, 0);
  const uint8_t msg[] = {42};
  sender.send(msg, 1, kLo, port);
  sender.flush();
  ASSERT_TRUE(readable(shared.fd()));
  Datagram d[2];
  EXPECT_EQ(shared.receive(d, 2), 1u);
}

TEST(PortShare, OneReaderLockHolderAtATime) {
  UdpPort holder(kLo, 0);
  auto first = std::make_unique<PortShare>(holder.fd(), kLo, holder.port());
  PortShare second(holder.fd(), kLo, holder.port());
  EXPECT_TRUE(first->lock_reader());
  EXPECT_TRUE(first->reader());
  EXPECT_FALSE(second.lock_reader()) << "held by the first";
  EXPECT_FALSE(second.reader());
  first.reset();  // its process ended, or it let go
  EXPECT_TRUE(second.lock_reader());
  second.release_reader();
  EXPECT_FALSE(second.reader());
}

TEST(PortShare, AForkedChildHoldsNeitherTheReaderLockNorTheOffer) {
  UdpPort holder(kLo, 0);
  auto parent = std::make_unique<PortShare>(holder.fd(), kLo, holder.port());
  ASSERT_TRUE(parent->lock_reader());
  ASSERT_GE(parent->listener(), 0);
  int go[2], up[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(up), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A worker that never uses softrdma: it lives on after its parent let go. (Its fork handlers have
    // run once fork returns here.)
    char c = 'u';
    if (write(up[1], &c, 1) != 1) _exit(2);
    _exit(read(go[0], &c, 1) == 1 ? 0 : 1);
  }
  char c;
  ASSERT_EQ(read(up[0], &c, 1), 1);
  parent.reset();  // the parent lets go (or dies) while the child runs
  PortShare::Taker taker(kLo, holder.port());
  EXPECT_LT(taker.step(), 0);
  EXPECT_FALSE(taker.waiting()) << "the child's copy of the offer still listens, and never answers";
  PortShare next(holder.fd(), kLo, holder.port());
  EXPECT_TRUE(next.lock_reader()) << "the child's copy of the reader lock still holds it";
  ASSERT_EQ(write(go[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (int fd : {go[0], go[1], up[0], up[1]}) close(fd);
}

TEST(PortShare, AnAdoptedSocketMustSegmentAsItsOwnerDoes) {
  UdpPort holder(kLo, 0);
  if (!holder.offload()) GTEST_SKIP() << "no UDP_GRO here";
  config::Settings no_gso = config::parse();
  no_gso.gso = false;  // this process says SOFTRDMA_GSO=0; the holder's socket segments
  const int fd = dup(holder.fd());
  ASSERT_GE(fd, 0);
  EXPECT_THROW(UdpPort(UdpPort::Adopt{}, fd, no_gso), std::system_error);
  EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "closed on refusal";
}

TEST(PortShare, AnotherUsersProcessIsNotGivenTheSocket) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  UdpPort holder(kLo, 0);
  PortShare offer(holder.fd(), kLo, holder.port());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // nobody: asks root's offer (by its name) while the parent serves it.
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(2);
    PortShare::Taker taker(kLo, holder.port(), 0);
    for (int i = 0; i < 200; ++i) {
      if (taker.step() >= 0) _exit(1);
      usleep(5000);
    }
    _exit(0);
  }
  int status = 0;
  while (waitpid(child, &status, WNOHANG) == 0) {
    offer.serve();
    usleep(1000);
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the other user got the socket; 2: could not change user";
}

}  // namespace
}  // namespace softrdma::net
