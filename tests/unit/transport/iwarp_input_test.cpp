// Hostile iWARP input: a raw socket end writes malformed or forbidden FPDUs at an attached QP (bad
// CRC, short ULPDU, bad STag, TO out of bounds, bad MSN, bad QN, bad MO, READ beyond IRD, bad opcode,
// SEND too long or without a receive, READ response for no READ, Terminate). Each gets exactly one
// Terminate back with the layer/type/code RFC 5040 §4.8 names (parsed here), is counted, moves the QP
// to ERROR with its WQEs flushed, ends the connection, and writes nothing outside a checked region.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "iwarp_harness.h"

namespace softrdma::transport::test {
namespace {

using L = iw::TermLayer;

class IwarpInput : public ::testing::TestWithParam<bool> {  // CRC on or off
 protected:
  void SetUp() override {
    host_ = &f_.add_host(wire::IpAddress::v4(0x0100000a));
    make_iw_end(e_, *host_);
    // Guard bytes on both sides of the target window: nothing may be written there.
    mem_ = register_region(e_.engine(), 1, 3 * 4096, kAllAccess);
    std::memset(mem_->data(), 0xA5, mem_->bytes.size());
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    raw_ = std::make_unique<RawPeer>(GetParam(), false);
    raw_->fd = sv[1];
    IwOptions o;
    o.crc = GetParam();
    o.ird = 1;
    ASSERT_EQ(attach(e_, sv[0], o, rtr_), 0);
    ASSERT_EQ(post(e_, recv_wqe(1, *mem_, 4096, 64)), 0);
    ASSERT_EQ(post(e_, recv_wqe(2, *mem_, 4096 + 64, 64)), 0);
    before_ = e_.engine().counters();
  }
  void TearDown() override { destroy(e_); }

  void step(int n = 50) {
    for (int i = 0; i < n; ++i) e_.engine().step();
  }
  uint64_t delta(uint64_t core::Counters::*c) { return e_.engine().counters().*c - before_.*c; }

  // Steps the engine and reads what the QP sent, which must be exactly one ULPDU; parses its DDP
  // header into h and sets hl to the header's length (0 when it does not parse).
  void read_one_ulpdu(iw::DdpHeader& h, size_t& hl) {
    step();
    raw_->read_all();
    ASSERT_EQ(raw_->ulpdus.size(), 1u);
    const auto& u = raw_->ulpdus[0];
    iw::ParseError err{};
    hl = iw::parse_header(u.data(), u.size(), h, err);
  }

  // After the refused input: one Terminate (the QP's only FPDU from then on), the counter, the QP in
  // ERROR, the receive WQEs flushed, the stream ended.
  void expect_terminated(L layer, uint8_t etype, uint8_t ecode, uint64_t core::Counters::*counter,
                         size_t flushed_recvs = 2) {
    iw::DdpHeader h;
    size_t hl = 0;
    ASSERT_NO_FATAL_FAILURE(read_one_ulpdu(h, hl));
    const auto& u = raw_->ulpdus[0];
    ASSERT_GT(hl, 0u);
    EXPECT_EQ(h.opcode, iw::Opcode::Terminate);
    EXPECT_EQ(h.qn, iw::kQnTerminate);
    EXPECT_EQ(h.msn, 1u);
    EXPECT_TRUE(h.last);
    iw::Terminate t;
    ASSERT_TRUE(iw::parse_terminate(u.data() + hl, u.size() - hl, t));
    EXPECT_EQ(t.layer, layer);
    EXPECT_EQ(t.etype, etype);
    EXPECT_EQ(t.ecode, ecode);
    terminate_ = t;
    EXPECT_TRUE(raw_->eof) << "the connection ends after the Terminate";
    EXPECT_EQ(e_.qp->state.load(), QpState::Err);
    EXPECT_EQ(delta(counter), 1u);
    EXPECT_EQ(delta(&core::Counters::iw_terminate_sent), 1u);
    std::vector<core::Cqe> rc = poll_all(e_, *e_.rcq);
    size_t flushes = 0;
    for (auto& c : rc) flushes += c.status == WcStatus::WrFlushErr;
    EXPECT_EQ(flushes, flushed_recvs);
    // Outside the one receive buffer a SEND may fill, every byte is as it was.
    for (size_t i = 0; i < mem_->bytes.size(); ++i) {
      if (i < 4096 || i >= 4096 + 128) {
        ASSERT_EQ(mem_->bytes[i], 0xA5) << "byte " << i;
      }
    }
  }

  IwarpRtr rtr_ = IwarpRtr::None;  // what the QP awaits first (IwarpRtrInput)
  Fabric f_;
  Host* host_ = nullptr;
  End e_;
  std::unique_ptr<Region> mem_;
  std::unique_ptr<RawPeer> raw_;
  core::Counters before_{};
  iw::Terminate terminate_{};
};

TEST_P(IwarpInput, GoodTrafficFirst) {
  // The fixture itself: a well-formed SEND and WRITE are accepted, nothing comes back.
  const uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  raw_->send_ulpdu(ulpdu(send_hdr(1, 0, true), data, 8));
  raw_->send_ulpdu(ulpdu(tagged_hdr(iw::Opcode::Write, mem_->mr.rkey, mem_->addr(4096 + 64)), data, 8));
  step();
  std::vector<core::Cqe> rc = poll_all(e_, *e_.rcq);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::Success);
  EXPECT_EQ(rc[0].byte_len, 8u);
  EXPECT_EQ(std::memcmp(mem_->data() + 4096, data, 8), 0);
  EXPECT_EQ(std::memcmp(mem_->data() + 4096 + 64, data, 8), 0);
  raw_->read_all();
  EXPECT_TRUE(raw_->ulpdus.empty());
  EXPECT_EQ(e_.qp->state.load(), QpState::Rts);
}

TEST_P(IwarpInput, BadCrc) {
  if (!GetParam()) GTEST_SKIP() << "no CRC negotiated";
  const uint8_t data[8] = {};
  auto bytes = raw_->frame(ulpdu(send_hdr(1, 0, true), data, 8));
  bytes.back() ^= 0x01;  // the CRC's last octet
  raw_->write_bytes(bytes);
  expect_terminated(L::Llp, 0, 0x02, &core::Counters::iw_bad_crc);
  EXPECT_EQ(mem_->bytes[4096], 0xA5);  // nothing placed from an FPDU that failed its CRC
}

TEST_P(IwarpInput, UlpduShorterThanItsHeader) {
  std::vector<uint8_t> u = ulpdu(send_hdr(1, 0, true));
  u.resize(6);
  raw_->send_ulpdu(u);
  iw::DdpHeader h;
  size_t hl = 0;
  ASSERT_NO_FATAL_FAILURE(read_one_ulpdu(h, hl));
  ASSERT_GT(hl, 0u);
  ASSERT_EQ(h.opcode, iw::Opcode::Terminate);
  iw::Terminate t;
  ASSERT_TRUE(iw::parse_terminate(raw_->ulpdus[0].data() + hl, raw_->ulpdus[0].size() - hl, t));
  // Six octets are no DDP header: the Terminate copies none (D clear), rather than a torn one.
  EXPECT_EQ(t.ddp_header_len, 0u);
  EXPECT_EQ(delta(&core::Counters::iw_bad_header), 1u);
  EXPECT_EQ(e_.qp->state.load(), QpState::Err);
  EXPECT_TRUE(raw_->eof);
}

TEST_P(IwarpInput, ReadResponseShorterThanTheRead) {
  // Our READ of 100 octets; the peer answers 60 with L set: the READ fails (BAD_RESP_ERR), the peer
  // gets a Terminate, and nothing is placed outside the sink (the fixture's window).
  ASSERT_EQ(post(e_, read_wqe(9, *mem_, 4096, 100, 0x5000, 0x77)), 0);
  step();
  raw_->read_all();
  ASSERT_EQ(raw_->ulpdus.size(), 1u);
  iw::DdpHeader rq;
  iw::ParseError err{};
  ASSERT_GT(iw::parse_header(raw_->ulpdus[0].data(), raw_->ulpdus[0].size(), rq, err), 0u);
  ASSERT_EQ(rq.opcode, iw::Opcode::ReadRequest);
  raw_->ulpdus.clear();
  std::vector<uint8_t> data(60, 0x3c);
  raw_->send_ulpdu(ulpdu(tagged_hdr(iw::Opcode::ReadResponse, mem_->mr.lkey, mem_->addr(4096)), data.data(),
                         data.size()));
  expect_terminated(L::Rdmap, 2, 0xff, &core::Counters::iw_bad_response);
  std::vector<core::Cqe> sc = poll_all(e_, *e_.scq);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].wr_id, 9u);
  EXPECT_EQ(sc[0].status, WcStatus::BadRespErr);
}

TEST_P(IwarpInput, WriteWithBadStag) {
  const uint8_t data[16] = {9};
  raw_->send_ulpdu(ulpdu(tagged_hdr(iw::Opcode::Write, mem_->mr.rkey ^ 0x100, mem_->addr(4096)), data, 16));
  expect_terminated(L::Ddp, 1, 0x00, &core::Counters::iw_bad_stag);
  // The Terminate copies the refused DDP header.
  ASSERT_EQ(terminate_.ddp_header_len, iw::kTaggedHeaderLen);
  iw::DdpHeader h;
  iw::ParseError err{};
  ASSERT_GT(iw::parse_header(terminate_.ddp_header, terminate_.ddp_header_len, h, err), 0u);
  EXPECT_EQ(h.stag, mem_->mr.rkey ^ 0x100);
  EXPECT_EQ(h.to, mem_->addr(4096));
  EXPECT_TRUE(terminate_.has_segment_len);
  EXPECT_EQ(terminate_.segment_len, iw::kTaggedHeaderLen + 16);
}

TEST_P(IwarpInput, WriteWithLkeyIsNoStag) {
  const uint8_t data[16] = {9};
  raw_->send_ulpdu(ulpdu(tagged_hdr(iw::Opcode::Write, mem_->mr.lkey, mem_->addr(4096)), data, 16));
  expect_terminated(L::Ddp, 1, 0x00, &core::Counters::iw_bad_stag);
}

TEST_P(IwarpInput, WriteBeyondTheRegion) {
  std::vector<uint8_t> data(200, 7);
  // Starts inside, ends 100 bytes past the end.
  raw_->send_ulpdu(ulpdu(tagged_hdr(iw::Opcode::Write, mem_->mr.rkey, mem_->addr(3 * 4096 - 100)), data.data(), 200));
  expect_terminated(L::Ddp, 1, 0x01, &core::Counters::iw_bad_bounds);
}

TEST_P(IwarpInput, WriteBeforeTheRegionAndTheWrap) {
  const uint8_t data[16] = {};
  raw_->send_ulpdu(ulpdu(tagged_hdr(iw::Opcode::Write, mem_->mr.rkey, ~uint64_t{0} - 7), data, 16));
  expect_terminated(L::Ddp, 1, 0x03, &core::Counters::iw_bad_bounds);
}

TEST_P(IwarpInput, SendWithBadMsn) {
  const uint8_t data[8] = {};
  raw_->send_ulpdu(ulpdu(send_hdr(2, 0, true), data, 8));  // MSN 1 expected
  expect_terminated(L::Ddp, 2, 0x03, &core::Counters::iw_bad_msn);
}

TEST_P(IwarpInput, SendOnUnknownQueue) {
  const uint8_t data[8] = {};
  iw::DdpHeader h = send_hdr(1, 0, true);
  h.qn = 5;
  raw_->send_ulpdu(ulpdu(h, data, 8));
  expect_terminated(L::Ddp, 2, 0x01, &core::Counters::iw_bad_qn);
}

TEST_P(IwarpInput, SendWithBadMo) {
  const uint8_t data[8] = {};
  raw_->send_ulpdu(ulpdu(send_hdr(1, 0, false), data, 8));
  raw_->send_ulpdu(ulpdu(send_hdr(1, 100, true), data, 8));  // MO 8 expected
  // The WQE the message had taken is flushed with the other.
  expect_terminated(L::Ddp, 2, 0x04, &core::Counters::iw_bad_mo, 2);
}

TEST_P(IwarpInput, SendTooLongForItsReceive) {
  std::vector<uint8_t> data(65, 3);  // the receive WQE holds 64
  raw_->send_ulpdu(ulpdu(send_hdr(1, 0, true), data.data(), data.size()));
  expect_terminated(L::Ddp, 2, 0x05, &core::Counters::iw_msg_too_long, 1);
}

TEST_P(IwarpInput, SendWithoutReceive) {
  const uint8_t data[8] = {};
  raw_->send_ulpdu(ulpdu(send_hdr(1, 0, true), data, 8));
  raw_->send_ulpdu(ulpdu(send_hdr(2, 0, true), data, 8));
  raw_->send_ulpdu(ulpdu(send_hdr(3, 0, true), data, 8));  // two were posted
  expect_terminated(L::Ddp, 2, 0x02, &core::Counters::iw_no_recv, 0);
}

TEST_P(IwarpInput, SendWithInvalidateOfAPlainMr) {
  const uint8_t data[8] = {};
  iw::DdpHeader h = send_hdr(1, 0, true, iw::Opcode::SendInvalidate);
  h.rsvd_ulp = mem_->mr.rkey;  // a region registered with ibv_reg_mr cannot be invalidated remotely
  raw_->send_ulpdu(ulpdu(h, data, 8));
  expect_terminated(L::Rdmap, 1, 0x09, &core::Counters::iw_cannot_invalidate, 1);
  // The region is still registered (nothing invalidated).
  core::MrRegion r;
  EXPECT_TRUE(e_.engine().lookup_mr(mem_->mr.lkey, &r));
}

TEST_P(IwarpInput, ReadBeyondIrd) {
  // IRD 1: two READ requests in one write, the first still owed when the second arrives.
  iw::ReadRequest r{0x1111, 0x2000, 4096, mem_->mr.rkey, mem_->addr(0)};
  auto a = raw_->frame(read_request(1, r));
  auto b = raw_->frame(read_request(2, r));
  a.insert(a.end(), b.begin(), b.end());
  raw_->write_bytes(a);
  // Both arrive in one read: the second is refused before the first one's response is framed, and
  // nothing follows the Terminate.
  expect_terminated(L::Rdmap, 2, 0x07, &core::Counters::iw_ird_exceeded);
  EXPECT_EQ(terminate_.rdmap_header_len, iw::kReadRequestLen);
  iw::ReadRequest copied;
  ASSERT_TRUE(iw::parse_read_request(terminate_.rdmap_header, terminate_.rdmap_header_len, copied));
  EXPECT_EQ(copied.src_stag, mem_->mr.rkey);
  EXPECT_EQ(copied.sink_stag, 0x1111u);
}

TEST_P(IwarpInput, ReadBeyondIrdWhileTheLastResponseIsUnsent) {
  // IRD 1: the first READ's response is framed, but the peer reads nothing, so the socket takes only
  // part of it; a READ request then is beyond IRD, though nothing is left to frame for the first.
  int small = 4096;
  ASSERT_EQ(setsockopt(transport::iwarp_state(*e_.qp)->fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
  iw::ReadRequest r{0x1111, 0x2000, 3 * 4096, mem_->mr.rkey, mem_->addr(0)};
  raw_->send_ulpdu(read_request(1, r));
  step();
  ASSERT_TRUE(transport::iwarp_state(*e_.qp)->read_jobs.empty());
  ASSERT_FALSE(transport::iwarp_state(*e_.qp)->tx.empty())
      << "the response must still be queued for this test to mean anything";
  raw_->send_ulpdu(read_request(2, r));
  for (int i = 0; i < 200 && !raw_->eof; ++i) {
    step(1);
    raw_->read_all();
  }
  ASSERT_TRUE(raw_->eof);
  ASSERT_EQ(raw_->ulpdus.size(), 2u);  // the whole first response, then the Terminate
  iw::DdpHeader h;
  iw::ParseError err{};
  ASSERT_EQ(iw::parse_header(raw_->ulpdus[0].data(), raw_->ulpdus[0].size(), h, err), iw::kTaggedHeaderLen);
  EXPECT_EQ(h.opcode, iw::Opcode::ReadResponse);
  EXPECT_TRUE(h.last);
  EXPECT_EQ(raw_->ulpdus[0].size() - iw::kTaggedHeaderLen, 3u * 4096);
  const size_t hl = iw::parse_header(raw_->ulpdus[1].data(), raw_->ulpdus[1].size(), h, err);
  ASSERT_GT(hl, 0u);
  ASSERT_EQ(h.opcode, iw::Opcode::Terminate);
  iw::Terminate t;
  ASSERT_TRUE(iw::parse_terminate(raw_->ulpdus[1].data() + hl, raw_->ulpdus[1].size() - hl, t));
  EXPECT_EQ(t.layer, L::Rdmap);
  EXPECT_EQ(t.etype, 2);
  EXPECT_EQ(t.ecode, 0x07);
  EXPECT_EQ(delta(&core::Counters::iw_ird_exceeded), 1u);
  EXPECT_EQ(e_.qp->state.load(), QpState::Err);
}

TEST_P(IwarpInput, ReadWithinIrdIsAnswered) {
  iw::ReadRequest r{0x1111, 0x2000, 100, mem_->mr.rkey, mem_->addr(5)};
  raw_->send_ulpdu(read_request(1, r));
  iw::DdpHeader h;
  size_t hl = 0;
  ASSERT_NO_FATAL_FAILURE(read_one_ulpdu(h, hl));
  const auto& u = raw_->ulpdus[0];
  ASSERT_EQ(hl, iw::kTaggedHeaderLen);
  EXPECT_EQ(h.opcode, iw::Opcode::ReadResponse);
  EXPECT_TRUE(h.last);
  EXPECT_EQ(h.stag, 0x1111u);
  EXPECT_EQ(h.to, 0x2000u);
  ASSERT_EQ(u.size() - hl, 100u);
  EXPECT_EQ(std::memcmp(u.data() + hl, mem_->data() + 5, 100), 0);
  EXPECT_EQ(e_.qp->state.load(), QpState::Rts);
}

TEST_P(IwarpInput, ReadOfForbiddenSource) {
  iw::ReadRequest r{0x1111, 0x2000, 64, mem_->mr.rkey, mem_->addr(3 * 4096 - 10)};
  raw_->send_ulpdu(read_request(1, r));
  expect_terminated(L::Rdmap, 1, 0x01, &core::Counters::iw_bad_bounds);
}

TEST_P(IwarpInput, BadOpcode) {
  std::vector<uint8_t> u = ulpdu(send_hdr(1, 0, true));
  u[1] = static_cast<uint8_t>((u[1] & 0xF0) | 0x0C);  // RDMAP opcode 12: reserved
  raw_->send_ulpdu(u);
  expect_terminated(L::Rdmap, 2, 0x06, &core::Counters::iw_bad_header);
}

TEST_P(IwarpInput, ReadResponseForNoRead) {
  const uint8_t data[8] = {};
  raw_->send_ulpdu(ulpdu(tagged_hdr(iw::Opcode::ReadResponse, mem_->mr.lkey, mem_->addr(4096)), data, 8));
  expect_terminated(L::Rdmap, 2, 0x06, &core::Counters::iw_bad_response);
}

TEST_P(IwarpInput, TerminateReceived) {
  // A READ of ours outstanding; the peer answers with a Terminate for a protection error.
  ASSERT_EQ(post(e_, read_wqe(9, *mem_, 0, 64, 0x5000, 0x77)), 0);
  step();
  raw_->read_all();
  ASSERT_EQ(raw_->ulpdus.size(), 1u);  // the READ request
  uint8_t body[iw::kMaxTerminateLen];
  iw::Terminate t;
  t.layer = L::Rdmap;
  t.etype = 1;
  t.ecode = 0x00;
  iw::DdpHeader h;
  h.opcode = iw::Opcode::Terminate;
  h.qn = iw::kQnTerminate;
  h.msn = 1;
  h.last = true;
  raw_->send_ulpdu(ulpdu(h, body, iw::encode_terminate(t, body)));
  step();
  std::vector<core::Cqe> sc = poll_all(e_, *e_.scq);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].wr_id, 9u);
  EXPECT_EQ(sc[0].status, WcStatus::RemAccessErr);
  EXPECT_EQ(e_.qp->state.load(), QpState::Err);
  EXPECT_EQ(delta(&core::Counters::iw_terminate_rcvd), 1u);
  EXPECT_EQ(delta(&core::Counters::iw_terminate_sent), 0u);  // never one Terminate for another
  bool fatal = false;
  e_.engine().async_events().discard_if([&](const AsyncEvent& ev) {
    fatal |= ev.type == AsyncEventType::QpFatal && ev.qp == e_.qp;
    return false;
  });
  EXPECT_TRUE(fatal);
  raw_->read_all();
  EXPECT_EQ(raw_->ulpdus.size(), 1u);
  EXPECT_TRUE(raw_->eof);
}

TEST_P(IwarpInput, RandomBytesNeverCrashOrWriteOutside) {
  std::mt19937 rng(GetParam() ? 11 : 12);
  // Enough bytes that some FPDU is complete (an MPA length is at most 65535): it must be refused.
  for (size_t total = 0; total < 200000 && e_.qp->state.load() != QpState::Err;) {
    std::vector<uint8_t> junk(1 + rng() % 3000);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    if (::write(raw_->fd, junk.data(), junk.size()) < 0) break;
    total += junk.size();
    step(5);
  }
  step();
  for (size_t i = 0; i < mem_->bytes.size(); ++i) {
    if (i < 4096 || i >= 4096 + 128) {
        ASSERT_EQ(mem_->bytes[i], 0xA5) << "byte " << i;
      }
  }
  EXPECT_EQ(e_.qp->state.load(), QpState::Err);
}

// Markers negotiated: a marker whose FPDUPTR does not point at the FPDU's start (the stream lost its
// framing) is refused with LLP / MPA / FPDU start, before anything of that FPDU is placed.
TEST(IwarpMarkers, BadMarker) {
  Fabric f;
  Host& h = f.add_host(wire::IpAddress::v4(0x0100000a));
  End e;
  make_iw_end(e, h);
  auto mem = register_region(e.engine(), 1, 4096, kAllAccess);
  std::memset(mem->data(), 0xA5, 4096);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  RawPeer raw(false, true);
  raw.fd = sv[1];
  IwOptions o;
  o.markers = true;
  ASSERT_EQ(attach(e, sv[0], o, IwarpRtr::None), 0);
  ASSERT_EQ(post(e, recv_wqe(1, *mem, 0, 2048)), 0);
  std::vector<uint8_t> data(1000, 0x11);
  auto bytes = raw.frame(ulpdu(send_hdr(1, 0, true), data.data(), data.size()));
  ASSERT_GT(bytes.size(), 520u);
  bytes[515] ^= 0x10;  // the FPDUPTR of the marker at stream offset 512
  raw.write_bytes(bytes);
  for (int i = 0; i < 50; ++i) e.engine().step();
  raw.read_all();
  ASSERT_EQ(raw.ulpdus.size(), 1u);
  iw::DdpHeader hd;
  iw::ParseError err{};
  const size_t hl = iw::parse_header(raw.ulpdus[0].data(), raw.ulpdus[0].size(), hd, err);
  ASSERT_GT(hl, 0u);
  ASSERT_EQ(hd.opcode, iw::Opcode::Terminate);
  iw::Terminate t;
  ASSERT_TRUE(iw::parse_terminate(raw.ulpdus[0].data() + hl, raw.ulpdus[0].size() - hl, t));
  EXPECT_EQ(t.layer, L::Llp);
  EXPECT_EQ(t.ecode, 0x03);
  EXPECT_EQ(e.engine().counters().iw_bad_framing, 1u);
  EXPECT_EQ(e.qp->state.load(), QpState::Err);
  EXPECT_TRUE(raw.eof);
  for (size_t i = 0; i < 4096; ++i) {
    ASSERT_EQ(mem->bytes[i], 0xA5) << "byte " << i;
  }
  destroy(e);
}

INSTANTIATE_TEST_SUITE_P(Crc, IwarpInput, ::testing::Bool(),
                         [](const auto& i) { return std::string(i.param ? "crc" : "nocrc"); });

// A responder that agreed a zero-length WRITE as the RTR (peer-to-peer, RFC 6581): its first FPDU
// must be exactly that; anything else gets the No Matching RTR Terminate (LLP / MPA / 0x07).
class IwarpRtrInput : public IwarpInput {
 protected:
  IwarpRtrInput() { rtr_ = IwarpRtr::AwaitWrite; }
};

TEST_P(IwarpRtrInput, AgreedRtrThenTraffic) {
  raw_->send_ulpdu(ulpdu(tagged_hdr(iw::Opcode::Write, 0, 0)));
  const uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  raw_->send_ulpdu(ulpdu(send_hdr(1, 0, true), data, 8));
  step();
  std::vector<core::Cqe> rc = poll_all(e_, *e_.rcq);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].wr_id, 1u);
  EXPECT_EQ(rc[0].byte_len, 8u);
  EXPECT_EQ(std::memcmp(mem_->data() + 4096, data, 8), 0);
  EXPECT_EQ(e_.qp->state.load(), QpState::Rts);
  EXPECT_EQ(delta(&core::Counters::iw_bad_rtr), 0u);
}

TEST_P(IwarpRtrInput, ZeroLengthSendInsteadOfTheAgreedWrite) {
  raw_->send_ulpdu(ulpdu(send_hdr(1, 0, true)));
  expect_terminated(L::Llp, 0, iw::term::kNoMatchingRtr, &core::Counters::iw_bad_rtr);
}

TEST_P(IwarpRtrInput, DataBeforeTheRtr) {
  const uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  raw_->send_ulpdu(ulpdu(send_hdr(1, 0, true), data, 8));
  expect_terminated(L::Llp, 0, iw::term::kNoMatchingRtr, &core::Counters::iw_bad_rtr);
}

TEST_P(IwarpRtrInput, WriteWithDataInsteadOfTheZeroLengthRtr) {
  const uint8_t data[16] = {};
  raw_->send_ulpdu(ulpdu(tagged_hdr(iw::Opcode::Write, mem_->mr.rkey, mem_->addr(4096)), data, 16));
  expect_terminated(L::Llp, 0, iw::term::kNoMatchingRtr, &core::Counters::iw_bad_rtr);
  for (size_t i = 4096; i < 4096 + 16; ++i) ASSERT_EQ(mem_->bytes[i], 0xA5) << "byte " << i;
}

INSTANTIATE_TEST_SUITE_P(Crc, IwarpRtrInput, ::testing::Bool(),
                         [](const auto& i) { return std::string(i.param ? "crc" : "nocrc"); });

}  // namespace
}  // namespace softrdma::transport::test
