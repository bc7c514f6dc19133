#include "net/udp_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include <gtest/gtest.h>

namespace softrdma::net {
namespace {

const wire::IpAddress kLo = wire::IpAddress::v4(htonl(INADDR_LOOPBACK));

// Byte i of datagram `seq` is a function of both, so misplaced or truncated data shows.
uint8_t pattern(uint32_t seq, uint32_t i) { return static_cast<uint8_t>(seq * 131 + i * 7 + (i >> 8)); }

std::vector<uint8_t> make_datagram(uint32_t seq, uint32_t len) {
  std::vector<uint8_t> d(len);
  for (uint32_t i = 0; i < len; ++i) d[i] = pattern(seq, i);
  if (len >= 4) std::memcpy(d.data(), &seq, 4);
  return d;
}

// Whether a received datagram came from the test's own sender; one that did not is a stray and is
// dropped with a note. Other tests run in parallel, and a softrdma process of theirs may still
// retransmit to a port its peer held before this test's port took that number (ephemeral reuse).
bool from_sender(const Datagram& d, uint16_t from) {
  if (from == 0 || (d.peer_port == from && d.peer_ip == kLo)) return true;
  std::fprintf(stderr, "stray datagram of %u bytes from port %u (expected %u), ignored\n", d.len, d.peer_port, from);
  return false;
}

// Collects `want` datagrams sent from port `from` (0: from anywhere), waiting on the socket between
// receives (not a timing assertion: the generous poll timeout only keeps a broken build from hanging).
std::vector<std::pair<std::vector<uint8_t>, Datagram>> receive_n(UdpPort& port, size_t want, uint16_t from) {
  std::vector<std::pair<std::vector<uint8_t>, Datagram>> got;
  Datagram batch[UdpPort::kBatch];
  while (got.size() < want) {
    pollfd p{port.fd(), POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) break;
    size_t n = port.receive(batch, UdpPort::kBatch);
    for (size_t i = 0; i < n; ++i)
      if (from_sender(batch[i], from)) got.emplace_back(std::vector<uint8_t>(batch[i].data, batch[i].data + batch[i].len), batch[i]);
  }
  return got;
}

TEST(UdpPort, BindsEphemeralPortWithDfAndPktinfo) {
  UdpPort p(kLo, 0);
  EXPECT_GE(p.fd(), 0);
  EXPECT_NE(p.port(), 0);
  EXPECT_EQ(p.ip(), kLo);
  int v = -1;
  socklen_t len = sizeof(v);
  ASSERT_EQ(getsockopt(p.fd(), IPPROTO_IP, IP_MTU_DISCOVER, &v, &len), 0);
  EXPECT_EQ(v, IP_PMTUDISC_DO);
  ASSERT_EQ(getsockopt(p.fd(), IPPROTO_IP, IP_PKTINFO, &v, &len), 0);
  EXPECT_EQ(v, 1);
  Datagram d[4];
  EXPECT_EQ(p.receive(d, 4), 0u);  // nothing pending: returns at once
}

TEST(UdpPort, BindConflictThrows) {
  UdpPort a(kLo, 0);
  EXPECT_THROW(UdpPort b(kLo, a.port()), std::system_error);
}

TEST(UdpPort, ExchangesBatchesOfVariousSizes) {
  UdpPort a(kLo, 0), b(kLo, 0);
  std::mt19937 rng(12345);
  const uint32_t fixed[] = {4, 5, 63, 64, 256, 1024, 1500, 2048, 4096, 4097, 8999, 9000};
  std::map<uint32_t, std::vector<uint8_t>> sent;
  uint64_t bytes = 0;
  uint32_t seq = 0;
  // Rounds of 16 keep each burst well inside any socket receive buffer the sysctls allow.
  for (int round = 0; round < 6; ++round) {
    std::vector<uint32_t> this_round;
    for (int k = 0; k < 16; ++k, ++seq) {
      uint32_t len = seq < std::size(fixed) ? fixed[seq] : 4 + rng() % 8997;
      auto d = make_datagram(seq, len);
      a.send(d.data(), len, kLo, b.port());
      bytes += len;
      sent[seq] = std::move(d);
      this_round.push_back(seq);
    }
    EXPECT_EQ(a.queued(), 16u);
    a.flush();
    EXPECT_EQ(a.queued(), 0u);
    auto got = receive_n(b, this_round.size(), a.port());
    ASSERT_EQ(got.size(), this_round.size());
    for (auto& [data, dg] : got) {
      ASSERT_GE(data.size(), 4u);
      uint32_t s;
      std::memcpy(&s, data.data(), 4);
      ASSERT_TRUE(sent.count(s)) << "unknown datagram " << s;
      EXPECT_EQ(data, sent[s]) << "datagram " << s;
      EXPECT_EQ(dg.peer_ip, kLo);
      EXPECT_EQ(dg.peer_port, a.port());
      EXPECT_EQ(dg.local_ip, kLo);
      sent.erase(s);
    }
  }
  EXPECT_TRUE(sent.empty());
  EXPECT_EQ(a.stats().tx_packets, seq);
  EXPECT_EQ(a.stats().tx_bytes, bytes);
  EXPECT_EQ(a.stats().tx_errors, 0u);
  EXPECT_EQ(b.stats().rx_packets, seq);
  EXPECT_EQ(b.stats().rx_bytes, bytes);

  // And back the other way: b answers a.
  auto reply = make_datagram(999, 9000);
  b.send(reply.data(), 9000, kLo, a.port());
  b.flush();
  auto back = receive_n(a, 1, b.port());
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].first, reply);
  EXPECT_EQ(back[0].second.peer_port, b.port());
}

TEST(UdpPort, FullBatchFlushesItself) {
  UdpPort a(kLo, 0), b(kLo, 0);
  constexpr uint32_t kCount = UdpPort::kBatch + 10;
  for (uint32_t s = 0; s < kCount; ++s) {
    auto d = make_datagram(s, 100);
    a.send(d.data(), 100, kLo, b.port());
  }
  EXPECT_EQ(a.queued(), 10u);  // the first kBatch went out on their own
  EXPECT_EQ(a.stats().tx_packets, UdpPort::kBatch);
  auto first = receive_n(b, UdpPort::kBatch, a.port());
  EXPECT_EQ(first.size(), UdpPort::kBatch);
  a.flush();
  auto rest = receive_n(b, 10, a.port());
  EXPECT_EQ(rest.size(), 10u);
  for (auto& [data, dg] : rest) EXPECT_EQ(data, make_datagram(*reinterpret_cast<const uint32_t*>(data.data()), 100));
}

TEST(UdpPort, ReceiveRespectsMax) {
  UdpPort a(kLo, 0), b(kLo, 0);
  for (uint32_t s = 0; s < 5; ++s) {
    auto d = make_datagram(s, 32);
    a.send(d.data(), 32, kLo, b.port());
  }
  a.flush();
  std::vector<Datagram> out(5);
  size_t total = 0;
  while (total < 5) {
    pollfd p{b.fd(), POLLIN, 0};
    ASSERT_GT(poll(&p, 1, 5000), 0);
    size_t n = b.receive(out.data(), 2);
    EXPECT_LE(n, 2u);
    total += n;
  }
  EXPECT_EQ(total, 5u);
}

TEST(UdpPort, RejectedDatagramIsCountedAndOthersStillGo) {
  UdpPort a(kLo, 0), b(kLo, 0);
  auto ok1 = make_datagram(1, 200);
  std::vector<uint8_t> too_big(UdpPort::kMaxDatagram, 0xAB);  // above the 65507-byte UDP maximum
  auto ok2 = make_datagram(2, 300);
  a.send(ok1.data(), 200, kLo, b.port());
  a.send(too_big.data(), UdpPort::kMaxDatagram, kLo, b.port());
  a.send(ok2.data(), 300, kLo, b.port());
  a.flush();
  EXPECT_EQ(a.stats().tx_errors, 1u);
  EXPECT_EQ(a.stats().tx_packets, 2u);
  auto got = receive_n(b, 2, a.port());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, ok1);
  EXPECT_EQ(got[1].first, ok2);
}

TEST(UdpPort, ReportsDestinationAddressWhenBoundToAny) {
  UdpPort any(wire::IpAddress::v4(htonl(INADDR_ANY)), 0), a(kLo, 0);
  const wire::IpAddress other = wire::IpAddress::v4(htonl(0x7f000002));  // 127.0.0.2 also reaches this host
  auto d = make_datagram(5, 64);
  a.send(d.data(), 64, other, any.port());
  a.flush();
  auto got = receive_n(any, 1, a.port());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, d);
  EXPECT_EQ(got[0].second.local_ip, other);
  EXPECT_EQ(got[0].second.peer_port, a.port());
}

TEST(UdpPort, BoundPortsAreSeenAndReleasedOnesAreNot) {
  uint16_t port = 0;
  {
    UdpPort p(kLo, 0);
    port = p.port();
    EXPECT_TRUE(udp_port_bound(port));
    UdpPort any(wire::IpAddress::v4(htonl(INADDR_ANY)), 0);
    EXPECT_TRUE(udp_port_bound(any.port()));
  }
  // Closed: no longer listed (an ephemeral port is not handed out again at once).
  EXPECT_FALSE(udp_port_bound(port));
}

// Segmentation offload on loopback (UDP_SEGMENT out, UDP_GRO in): lo keeps a segmented send whole, so a
// receiver with UDP_GRO gets the run back as one buffer, which the port splits into its datagrams with
// their segment indices. Skipped on a kernel without it.

// Queues one datagram with reserve/commit; returns the identification it was given.
uint16_t put(UdpPort& a, const std::vector<uint8_t>& d, uint16_t dst_port, bool coalesce = true) {
  uint16_t ip_id = 0xFFFF;
  uint8_t* p = a.reserve(static_cast<uint32_t>(d.size()), kLo, dst_port, coalesce, &ip_id);
  EXPECT_NE(p, nullptr);
  if (!p) return 0xFFFF;
  if (!d.empty()) std::memcpy(p, d.data(), d.size());
  a.commit();
  return ip_id;
}

#define SKIP_WITHOUT_OFFLOAD(port) \
  if (!(port).offload()) GTEST_SKIP() << "no UDP_SEGMENT/UDP_GRO here (or SOFTRDMA_GSO=0)"

TEST(UdpPortGso, ACoalescedRunArrivesAsItsSegments) {
  UdpPort a(kLo, 0), b(kLo, 0);
  SKIP_WITHOUT_OFFLOAD(a);
  ASSERT_TRUE(b.offload());
  for (uint32_t n : {2u, 9u, 64u}) {
    SCOPED_TRACE("run of " + std::to_string(n));
    std::vector<std::vector<uint8_t>> sent;
    uint64_t bytes = 0;
    for (uint32_t k = 0; k < n; ++k) {
      sent.push_back(make_datagram(1000 * n + k, k + 1 == n ? 333 : 1000));  // a short last one
      bytes += sent.back().size();
      EXPECT_EQ(put(a, sent.back(), b.port()), k) << "segment k carries identification k";
    }
    EXPECT_EQ(a.queued(), 1u) << "one message";
    const auto before = a.stats();
    a.flush();
    EXPECT_EQ(a.stats().tx_errors, before.tx_errors);
    EXPECT_EQ(a.stats().tx_packets - before.tx_packets, n);
    EXPECT_EQ(a.stats().tx_bytes - before.tx_bytes, bytes);
    auto got = receive_n(b, n, a.port());
    ASSERT_EQ(got.size(), n);
    for (uint32_t k = 0; k < n; ++k) {
      EXPECT_EQ(got[k].first, sent[k]) << "datagram " << k;
      EXPECT_EQ(got[k].second.segment, k) << "one GRO buffer: datagram " << k << " is its segment " << k;
      EXPECT_EQ(got[k].second.peer_port, a.port());
      EXPECT_EQ(got[k].second.local_ip, kLo);
    }
  }
  EXPECT_EQ(b.stats().rx_packets, 2u + 9u + 64u);
}

TEST(UdpPortGso, ASegmentedBufferIsSplitAcrossReceives) {
  UdpPort a(kLo, 0), b(kLo, 0);
  SKIP_WITHOUT_OFFLOAD(a);
  std::vector<std::vector<uint8_t>> sent;
  for (uint32_t k = 0; k < 7; ++k) put(a, sent.emplace_back(make_datagram(k, 500)), b.port());
  a.flush();
  std::vector<std::pair<std::vector<uint8_t>, uint32_t>> got;
  Datagram out[3];
  while (got.size() < 7) {
    const size_t n = b.receive(out, 3);  // what the last receive left of the buffer comes first
    EXPECT_LE(n, 3u);
    for (size_t i = 0; i < n; ++i)
      if (from_sender(out[i], a.port())) got.emplace_back(std::vector<uint8_t>(out[i].data, out[i].data + out[i].len), out[i].segment);
    pollfd p{b.fd(), POLLIN, 0};
    if (n == 0 && poll(&p, 1, 5000) <= 0) break;
  }
  ASSERT_EQ(got.size(), 7u);
  for (uint32_t k = 0; k < 7; ++k) {
    EXPECT_EQ(got[k].first, sent[k]);
    EXPECT_EQ(got[k].second, k);
  }
}

TEST(UdpPortGso, RunsToTwoPortsAreNotMerged) {
  UdpPort a(kLo, 0), b(kLo, 0), c(kLo, 0);
  SKIP_WITHOUT_OFFLOAD(a);
  // Alternating destinations: every datagram is a message of its own.
  std::vector<std::vector<uint8_t>> to_b, to_c;
  for (uint32_t k = 0; k < 4; ++k) {
    EXPECT_EQ(put(a, to_b.emplace_back(make_datagram(k, 800)), b.port()), 0u);
    EXPECT_EQ(put(a, to_c.emplace_back(make_datagram(100 + k, 800)), c.port()), 0u);
  }
  EXPECT_EQ(a.queued(), 8u);
  // Then a run to each.
  for (uint32_t k = 4; k < 7; ++k) EXPECT_EQ(put(a, to_b.emplace_back(make_datagram(k, 800)), b.port()), k - 4);
  for (uint32_t k = 4; k < 7; ++k) EXPECT_EQ(put(a, to_c.emplace_back(make_datagram(100 + k, 800)), c.port()), k - 4);
  EXPECT_EQ(a.queued(), 10u);
  a.flush();
  EXPECT_EQ(a.stats().tx_packets, 14u);
  for (auto [port, sent] : {std::pair{&b, &to_b}, std::pair{&c, &to_c}}) {
    auto got = receive_n(*port, sent->size(), a.port());
    ASSERT_EQ(got.size(), sent->size());
    for (uint32_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k].first, (*sent)[k]) << "at port " << port->port() << ", datagram " << k;
      EXPECT_EQ(got[k].second.segment, k < 4 ? 0u : k - 4) << "at port " << port->port() << ", datagram " << k;
    }
  }
  // Nothing more arrived at either: no datagram of one went to the other.
  Datagram d[4];
  EXPECT_EQ(b.receive(d, 4), 0u);
  EXPECT_EQ(c.receive(d, 4), 0u);
}

TEST(UdpPortGso, NonCoalescingDatagramsStayAlone) {
  UdpPort a(kLo, 0), b(kLo, 0);
  SKIP_WITHOUT_OFFLOAD(a);
  std::vector<std::vector<uint8_t>> sent;
  EXPECT_EQ(put(a, sent.emplace_back(make_datagram(0, 600)), b.port()), 0u);
  EXPECT_EQ(put(a, sent.emplace_back(make_datagram(1, 600)), b.port(), false), 0u) << "may not coalesce";
  EXPECT_EQ(put(a, sent.emplace_back(make_datagram(2, 600)), b.port()), 0u) << "nothing joins a lone one";
  EXPECT_EQ(put(a, sent.emplace_back(make_datagram(3, 600)), b.port()), 1u);
  sent.push_back(make_datagram(4, 600));
  a.send(sent.back().data(), 600, kLo, b.port());  // send(): never coalesced
  EXPECT_EQ(a.queued(), 4u);
  a.flush();
  auto got = receive_n(b, 5, a.port());
  ASSERT_EQ(got.size(), 5u);
  const uint32_t seg[] = {0, 0, 0, 1, 0};
  for (uint32_t k = 0; k < 5; ++k) {
    EXPECT_EQ(got[k].first, sent[k]) << k;
    EXPECT_EQ(got[k].second.segment, seg[k]) << k;
  }
}

TEST(UdpPortGso, AnEmptyDatagramIsNotLostInARun) {
  UdpPort a(kLo, 0), b(kLo, 0);
  SKIP_WITHOUT_OFFLOAD(a);
  const auto d0 = make_datagram(0, 100), d2 = make_datagram(2, 100);
  put(a, d0, b.port());
  put(a, {}, b.port());
  put(a, d2, b.port());
  a.flush();
  auto got = receive_n(b, 3, a.port());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].first, d0);
  EXPECT_TRUE(got[1].first.empty());
  EXPECT_EQ(got[2].first, d2);
}

TEST(UdpPortGso, SegmentIndicesSurviveReceiveImpairment) {
  // SOFTRDMA_IMPAIR on the receiving side (a burst far away: nothing is touched here) passes datagrams
  // through its own queue; each keeps the index it had in its buffer, which its ICRC covers.
  config::Settings impaired = config::parse();
  impaired.impair = "seed=1,rx_burst_at=1000000,rx_burst_len=1";
  UdpPort b(kLo, 0, impaired);
  UdpPort a(kLo, 0);
  SKIP_WITHOUT_OFFLOAD(a);
  ASSERT_NE(b.impairment(), nullptr);
  std::vector<std::vector<uint8_t>> sent;
  for (uint32_t k = 0; k < 6; ++k) put(a, sent.emplace_back(make_datagram(k, k == 5 ? 99 : 400)), b.port());
  a.flush();
  auto got = receive_n(b, 6, a.port());
  ASSERT_EQ(got.size(), 6u);
  for (uint32_t k = 0; k < 6; ++k) {
    EXPECT_EQ(got[k].first, sent[k]);
    EXPECT_EQ(got[k].second.segment, k);
  }
}

TEST(UdpPortGso, OffWithSoftrdmaGso0) {
  config::Settings no_gso = config::parse();
  no_gso.gso = false;  // SOFTRDMA_GSO=0
  UdpPort a(kLo, 0, no_gso);
  UdpPort b(kLo, 0);
  EXPECT_FALSE(a.offload());
  std::vector<std::vector<uint8_t>> sent;
  for (uint32_t k = 0; k < 5; ++k) EXPECT_EQ(put(a, sent.emplace_back(make_datagram(k, 700)), b.port()), 0u);
  EXPECT_EQ(a.queued(), 5u) << "one message each";
  a.flush();
  auto got = receive_n(b, 5, a.port());
  ASSERT_EQ(got.size(), 5u);
  for (uint32_t k = 0; k < 5; ++k) {
    EXPECT_EQ(got[k].first, sent[k]);
    EXPECT_EQ(got[k].second.segment, 0u);
  }
}

}  // namespace
// RoCEv2 over UDP/IPv6: a port bound to an IPv6 address (here ::1) exchanges datagrams, single and
// segmented, and reports both ends' IPv6 addresses (IPV6_PKTINFO for the local one).
TEST(UdpPort, ExchangesDatagramsOverIpv6) {
  wire::IpAddress lo6;
  ASSERT_TRUE(wire::parse("::1", &lo6));
  std::unique_ptr<UdpPort> a, b;
  try {
    a = std::make_unique<UdpPort>(lo6, 0);
    b = std::make_unique<UdpPort>(lo6, 0);
  } catch (const std::system_error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  EXPECT_EQ(a->ip(), lo6);
  std::vector<std::vector<uint8_t>> sent;
  for (uint32_t seq = 0; seq < 8; ++seq) {
    // Four of one length, then a shorter one: a segmented run where the port offers it.
    const uint32_t len = seq < 4 ? 1200 : seq == 4 ? 300 : 64 + seq;
    sent.push_back(make_datagram(seq, len));
    uint16_t ip_id = 0xFFFF;
    uint8_t* p = a->reserve(len, lo6, b->port(), seq < 5, &ip_id);
    ASSERT_NE(p, nullptr);
    std::memcpy(p, sent.back().data(), len);
    a->commit();
  }
  a->flush();
  std::map<uint32_t, std::vector<uint8_t>> got;
  Datagram batch[UdpPort::kBatch];
  while (got.size() < sent.size()) {
    pollfd p{b->fd(), POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) break;
    for (size_t i = 0, n = b->receive(batch, UdpPort::kBatch); i < n; ++i) {
      if (batch[i].peer_port != a->port()) continue;  // a stray of another test
      EXPECT_EQ(batch[i].peer_ip, lo6);
      EXPECT_EQ(batch[i].local_ip, lo6);
      uint32_t seq;
      std::memcpy(&seq, batch[i].data, 4);
      got[seq].assign(batch[i].data, batch[i].data + batch[i].len);
    }
  }
  ASSERT_EQ(got.size(), sent.size());
  for (uint32_t seq = 0; seq < sent.size(); ++seq) EXPECT_EQ(got[seq], sent[seq]) << "datagram " << seq;
  EXPECT_EQ(a->stats().tx_errors, 0u);
}

// Kernel rxe sends RoCEv2 over IPv6 with UDP checksum 0 (RFC 6935): an IPv6 port takes such a
// datagram, which a plain UDPv6 socket drops. Sent through a raw socket (needs CAP_NET_RAW).
TEST(UdpPort, TakesIpv6DatagramsWithoutUdpChecksum) {
  wire::IpAddress lo6;
  ASSERT_TRUE(wire::parse("::1", &lo6));
  std::unique_ptr<UdpPort> port;
  try {
    port = std::make_unique<UdpPort>(lo6, 0);
  } catch (const std::system_error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  int raw = socket(AF_INET6, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_UDP);
  if (raw < 0) GTEST_SKIP() << "no raw socket (CAP_NET_RAW): " << strerror(errno);
  uint8_t dgram[8 + 32] = {};
  const uint16_t src = 0xC123, dst = port->port(), len = sizeof dgram;
  dgram[0] = static_cast<uint8_t>(src >> 8);
  dgram[1] = static_cast<uint8_t>(src);
  dgram[2] = static_cast<uint8_t>(dst >> 8);
  dgram[3] = static_cast<uint8_t>(dst);
  dgram[4] = static_cast<uint8_t>(len >> 8);
  dgram[5] = static_cast<uint8_t>(len);  // checksum (bytes 6-7) stays 0
  for (int i = 8; i < len; ++i) dgram[i] = static_cast<uint8_t>(i * 3);
  sockaddr_storage to{};
  const socklen_t tl = wire::to_sockaddr(lo6, 0, &to);
  ASSERT_EQ(sendto(raw, dgram, len, 0, reinterpret_cast<sockaddr*>(&to), tl), static_cast<ssize_t>(len))
      << strerror(errno);
  close(raw);
  Datagram batch[UdpPort::kBatch];
  size_t got = 0;
  for (int tries = 0; tries < 50 && got == 0; ++tries) {
    pollfd p{port->fd(), POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    for (size_t i = 0, n = port->receive(batch, UdpPort::kBatch); i < n; ++i)
      if (batch[i].peer_port == src && batch[i].len == len - 8u) {
        EXPECT_EQ(std::memcmp(batch[i].data, dgram + 8, len - 8u), 0);
        ++got;
      }
  }
  EXPECT_EQ(got, 1u) << "the zero-checksum datagram was not delivered";
}

}  // namespace softrdma::net

