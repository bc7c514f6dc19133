// wire/iwarp: MPA frames, DDP/RDMAP headers, READ request, Terminate and the FPDU framing, checked
// against hand-written RFC byte layouts and against an independent model of the marked stream.
#include "wire/iwarp.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace softrdma::wire::iwarp {
namespace {

using Bytes = std::vector<uint8_t>;

// A bitwise CRC32c (reflected polynomial 0x82F63B78), independent of ISA-L.
uint32_t ref_crc32c(const uint8_t* p, size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1)));
  }
  return ~crc;
}

// ---- CRC ------------------------------------------------------------------------------------------

// RFC 3720 appendix B.4 (the CRC32c MPA uses, RFC 5044 §4.4): the octets as sent.
TEST(IwarpCrc, Rfc3720Vectors) {
  Bytes zeros(32, 0), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i), dec[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(mpa_crc32c(zeros.data(), 32), 0x8a9136aau);  // sent aa 36 91 8a
  EXPECT_EQ(mpa_crc32c(ones.data(), 32), 0x62a8ab43u);   // sent 43 ab a8 62
  EXPECT_EQ(mpa_crc32c(inc.data(), 32), 0x46dd794eu);    // sent 4e 79 dd 46
  EXPECT_EQ(mpa_crc32c(dec.data(), 32), 0x113fdb5cu);    // sent 5c db 3f 11
  EXPECT_EQ(mpa_crc32c(reinterpret_cast<const uint8_t*>("123456789"), 9), 0xe3069283u);
  // Chaining over pieces gives the whole's CRC.
  EXPECT_EQ(mpa_crc32c(inc.data() + 7, 25, mpa_crc32c(inc.data(), 7)), 0x46dd794eu);
  EXPECT_EQ(ref_crc32c(inc.data(), 32), 0x46dd794eu);
}

// ---- MPA frames -----------------------------------------------------------------------------------

// RFC 5044 §7.1 + RFC 6581 §5: key, M C R E|Res, Rev, PD_Length, then IRD and ORD words.
const uint8_t kEnhancedReq[] = {
    'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R', 'e', 'q', ' ', 'F', 'r', 'a', 'm', 'e',
    0x50,        // C, enhanced
    0x02,        // revision 2
    0x00, 0x07,  // PD_Length: 4 enhanced + 3 ULP
    0x80, 0x10,  // P, IRD 16
    0x40, 0x08,  // READ RTR, ORD 8
    'a', 'b', 'c',
};

TEST(IwarpMpa, RequestFieldsAtRfcPositions) {
  ASSERT_EQ(mpa_frame_len(kEnhancedReq), sizeof kEnhancedReq);
  MpaFrame f;
  ASSERT_TRUE(parse_mpa(kEnhancedReq, sizeof kEnhancedReq, false, f));
  EXPECT_FALSE(f.reply);
  EXPECT_FALSE(f.markers);
  EXPECT_TRUE(f.crc);
  EXPECT_FALSE(f.reject);
  EXPECT_EQ(f.revision, 2);
  EXPECT_TRUE(f.enhanced);
  EXPECT_TRUE(f.peer_to_peer);
  EXPECT_FALSE(f.rtr_send);
  EXPECT_FALSE(f.rtr_write);
  EXPECT_TRUE(f.rtr_read);
  EXPECT_EQ(f.ird, 16);
  EXPECT_EQ(f.ord, 8);
  ASSERT_EQ(f.private_data_len, 3);
  EXPECT_EQ(f.private_data, kEnhancedReq + 24);
  EXPECT_FALSE(parse_mpa(kEnhancedReq, sizeof kEnhancedReq, true, f)) << "a request is no reply";

  uint8_t out[kMpaHeaderLen + kMpaEnhancedLen + kMpaMaxPrivateData];
  MpaFrame g;
  g.crc = true;
  g.enhanced = true;
  g.peer_to_peer = true;
  g.rtr_read = true;
  g.ird = 16;
  g.ord = 8;
  g.private_data = reinterpret_cast<const uint8_t*>("abc");
  g.private_data_len = 3;
  ASSERT_EQ(encode_mpa(g, out), sizeof kEnhancedReq);
  EXPECT_EQ(0, std::memcmp(out, kEnhancedReq, sizeof kEnhancedReq));
}

TEST(IwarpMpa, ReplyFlagsAndRtrBits) {
  const uint8_t rep[] = {'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R', 'e', 'p', ' ', 'F', 'r', 'a', 'm', 'e',
                         0xb0, 0x02, 0x00, 0x04,  // M, R, enhanced; rev 2; PD 4
                         0x7f, 0xff, 0xbf, 0xff};  // SEND RTR + IRD 0x3fff; WRITE RTR + ORD 0x3fff
  MpaFrame f;
  ASSERT_TRUE(parse_mpa(rep, sizeof rep, true, f));
  EXPECT_TRUE(f.reply && f.markers && f.reject && !f.crc && f.enhanced);
  EXPECT_TRUE(!f.peer_to_peer && f.rtr_send && f.rtr_write && !f.rtr_read);
  EXPECT_EQ(f.ird, kMpaMaxIrdOrd);
  EXPECT_EQ(f.ord, kMpaMaxIrdOrd);
  EXPECT_EQ(f.private_data, nullptr);
  EXPECT_EQ(f.private_data_len, 0);
  uint8_t out[64];
  ASSERT_EQ(encode_mpa(f, out), sizeof rep);
  EXPECT_EQ(0, std::memcmp(out, rep, sizeof rep));
}

TEST(IwarpMpa, RoundTripsEveryFlagAndLength) {
  Bytes pd(kMpaMaxPrivateData);
  for (size_t i = 0; i < pd.size(); ++i) pd[i] = static_cast<uint8_t>(i * 7);
  uint8_t out[kMpaHeaderLen + kMpaMaxPrivateData];
  for (int bits = 0; bits < 256; ++bits) {
    MpaFrame f;
    f.reply = bits & 1;
    f.markers = bits & 2;
    f.crc = bits & 4;
    f.reject = bits & 8;
    f.enhanced = bits & 16;
    f.revision = f.enhanced ? 2 : 1;
    if (f.enhanced) {
      f.peer_to_peer = bits & 32;
      f.rtr_send = bits & 64;
      f.rtr_write = bits & 128;
      f.rtr_read = bits & 32;
      f.ird = static_cast<uint16_t>(bits * 61 & kMpaMaxIrdOrd);
      f.ord = static_cast<uint16_t>(bits * 4099 & kMpaMaxIrdOrd);
    }
    const size_t room = kMpaMaxPrivateData - (f.enhanced ? kMpaEnhancedLen : 0);
    f.private_data_len = static_cast<uint16_t>(bits * 3 % (room + 1));
    f.private_data = f.private_data_len ? pd.data() : nullptr;
    const size_t n = encode_mpa(f, out);
    ASSERT_EQ(mpa_frame_len(out), n);
    MpaFrame g;
    ASSERT_TRUE(parse_mpa(out, n, f.reply, g)) << bits;
    EXPECT_EQ(g.reply, f.reply);
    EXPECT_EQ(g.markers, f.markers);
    EXPECT_EQ(g.crc, f.crc);
    EXPECT_EQ(g.reject, f.reject);
    EXPECT_EQ(g.revision, f.revision);
    EXPECT_EQ(g.enhanced, f.enhanced);
    EXPECT_EQ(g.peer_to_peer, f.peer_to_peer);
    EXPECT_EQ(g.rtr_send, f.rtr_send);
    EXPECT_EQ(g.rtr_write, f.rtr_write);
    EXPECT_EQ(g.rtr_read, f.rtr_read);
    EXPECT_EQ(g.ird, f.ird);
    EXPECT_EQ(g.ord, f.ord);
    ASSERT_EQ(g.private_data_len, f.private_data_len);
    if (g.private_data_len) {
      EXPECT_EQ(0, std::memcmp(g.private_data, pd.data(), g.private_data_len));
    }
  }
}

TEST(IwarpMpa, MalformedFrames) {
  Bytes f(kEnhancedReq, kEnhancedReq + sizeof kEnhancedReq);
  MpaFrame m;
  // Wrong key.
  Bytes bad = f;
  bad[3] = '-';
  EXPECT_EQ(mpa_frame_len(bad.data()), 0u);
  EXPECT_FALSE(parse_mpa(bad.data(), bad.size(), false, m));
  // Length mismatch either way, and short of a header.
  EXPECT_FALSE(parse_mpa(f.data(), f.size() - 1, false, m));
  Bytes longer = f;
  longer.push_back(0);
  EXPECT_FALSE(parse_mpa(longer.data(), longer.size(), false, m));
  EXPECT_FALSE(parse_mpa(f.data(), kMpaHeaderLen - 1, false, m));
  // PD_Length over 512.
  Bytes big(kMpaHeaderLen + 513, 0);
  std::memcpy(big.data(), f.data(), kMpaHeaderLen);
  big[18] = 0x02;
  big[19] = 0x01;
  EXPECT_EQ(mpa_frame_len(big.data()), 0u);
  EXPECT_FALSE(parse_mpa(big.data(), big.size(), false, m));
  big[19] = 0x00;  // exactly 512 is fine
  EXPECT_EQ(mpa_frame_len(big.data()), kMpaHeaderLen + 512);
  EXPECT_TRUE(parse_mpa(big.data(), kMpaHeaderLen + 512, false, m));
  // Enhanced with fewer than 4 octets of private data.
  Bytes shortpd(f.begin(), f.begin() + kMpaHeaderLen + 3);
  shortpd[19] = 3;
  EXPECT_FALSE(parse_mpa(shortpd.data(), shortpd.size(), false, m));
  // Revision 1: the enhanced bit is reserved there, the private data is the ULP's.
  Bytes rev1 = f;
  rev1[17] = 1;
  ASSERT_TRUE(parse_mpa(rev1.data(), rev1.size(), false, m));
  EXPECT_FALSE(m.enhanced);
  EXPECT_EQ(m.private_data_len, 7);
}

// ---- DDP/RDMAP headers ----------------------------------------------------------------------------

// RFC 5041 §4.2 (tagged) + RFC 5040 §4.3: T L Rsvd DV | RV Rsvd Opcode | STag | TO.
const uint8_t kWriteHdr[] = {0xc1, 0x40, 0x11, 0x22, 0x33, 0x44, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08};
// RFC 5041 §4.3 (untagged): control, RsvdULP (the STag to invalidate), QN, MSN, MO.
const uint8_t kSendInvHdr[] = {0x01, 0x44, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x00, 0x00, 0x00,
                               0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x10, 0x00};

TEST(IwarpHeader, TaggedFieldsAtRfcPositions) {
  DdpHeader h;
  ParseError e{};
  ASSERT_EQ(parse_header(kWriteHdr, sizeof kWriteHdr, h, e), kTaggedHeaderLen);
  EXPECT_TRUE(h.tagged && h.last);
  EXPECT_EQ(h.ddp_version, 1);
  EXPECT_EQ(h.rdmap_version, 1);
  EXPECT_EQ(h.opcode, Opcode::Write);
  EXPECT_EQ(h.stag, 0x11223344u);
  EXPECT_EQ(h.to, 0x0102030405060708u);
  uint8_t out[kMaxHeaderLen];
  ASSERT_EQ(encode_header(h, out), kTaggedHeaderLen);
  EXPECT_EQ(0, std::memcmp(out, kWriteHdr, sizeof kWriteHdr));
}

TEST(IwarpHeader, UntaggedFieldsAtRfcPositions) {
  DdpHeader h;
  ParseError e{};
  ASSERT_EQ(parse_header(kSendInvHdr, sizeof kSendInvHdr, h, e), kUntaggedHeaderLen);
  EXPECT_TRUE(!h.tagged && !h.last);
  EXPECT_EQ(h.opcode, Opcode::SendInvalidate);
  EXPECT_EQ(h.rsvd_ulp, 0xdeadbeefu);
  EXPECT_EQ(h.qn, kQnSend);
  EXPECT_EQ(h.msn, 5u);
  EXPECT_EQ(h.mo, 0x1000u);
  uint8_t out[kMaxHeaderLen];
  ASSERT_EQ(encode_header(h, out), kUntaggedHeaderLen);
  EXPECT_EQ(0, std::memcmp(out, kSendInvHdr, sizeof kSendInvHdr));
}

TEST(IwarpHeader, RoundTripsEveryOpcode) {
  for (int op = 0; op <= 7; ++op) {
    for (int last = 0; last < 2; ++last) {
      DdpHeader h;
      h.opcode = static_cast<Opcode>(op);
      h.tagged = h.opcode == Opcode::Write || h.opcode == Opcode::ReadResponse;
      h.last = last;
      h.stag = 0x9abcdef0u + op;
      h.to = 0xfedcba9876543210u - op;
      if (!h.tagged) {
        h.stag = 0;
        h.to = 0;
        h.rsvd_ulp = 0x01020304u * op;
        h.qn = op == 1 ? kQnReadRequest : op == 7 ? kQnTerminate : kQnSend;
        h.msn = 0xffffffffu - op;
        h.mo = 0x80000000u + op;
      }
      uint8_t buf[kMaxHeaderLen] = {};
      const size_t n = encode_header(h, buf);
      EXPECT_EQ(n, h.tagged ? kTaggedHeaderLen : kUntaggedHeaderLen);
      DdpHeader g;
      ParseError e{};
      ASSERT_EQ(parse_header(buf, sizeof buf, g, e), n) << op;
      EXPECT_EQ(g.tagged, h.tagged);
      EXPECT_EQ(g.last, h.last);
      EXPECT_EQ(g.opcode, h.opcode);
      EXPECT_EQ(g.stag, h.stag);
      EXPECT_EQ(g.to, h.to);
      EXPECT_EQ(g.rsvd_ulp, h.rsvd_ulp);
      EXPECT_EQ(g.qn, h.qn);
      EXPECT_EQ(g.msn, h.msn);
      EXPECT_EQ(g.mo, h.mo);
    }
  }
}

void expect_error(const Bytes& b, TermLayer layer, uint8_t etype, uint8_t ecode, const char* what) {
  DdpHeader h;
  ParseError e{TermLayer::Rdmap, 0xee, 0xee};
  EXPECT_EQ(parse_header(b.data(), b.size(), h, e), 0u) << what;
  EXPECT_EQ(e.layer, layer) << what;
  EXPECT_EQ(e.etype, etype) << what;
  EXPECT_EQ(e.ecode, ecode) << what;
}

TEST(IwarpHeader, MalformedHeadersAndTheirTerminateCodes) {
  const Bytes write(kWriteHdr, kWriteHdr + sizeof kWriteHdr);
  const Bytes send(kSendInvHdr, kSendInvHdr + sizeof kSendInvHdr);
  Bytes b = write;
  b[0] = 0xc0;  // DV 0, tagged
  expect_error(b, TermLayer::Ddp, term::kDdpTagged, term::kTDdpVersion, "tagged DDP version");
  b = send;
  b[0] = 0x02;  // DV 2, untagged
  expect_error(b, TermLayer::Ddp, term::kDdpUntagged, term::kUtDdpVersion, "untagged DDP version");
  b = send;
  b[1] = 0x84;  // RV 2
  expect_error(b, TermLayer::Rdmap, term::kRdmapRemoteOperation, term::kRdmapVersion, "RDMAP version");
  for (uint8_t op = 8; op < 16; ++op) {
    b = send;
    b[1] = static_cast<uint8_t>(0x40 | op);
    expect_error(b, TermLayer::Rdmap, term::kRdmapRemoteOperation, term::kUnexpectedOpcode, "reserved opcode");
  }
  b = send;
  b[0] |= 0x80;  // a tagged SEND
  expect_error(b, TermLayer::Rdmap, term::kRdmapRemoteOperation, term::kUnexpectedOpcode, "tagged SEND");
  b = write;
  b[0] &= 0x7f;  // an untagged WRITE
  b.resize(kUntaggedHeaderLen);
  expect_error(b, TermLayer::Rdmap, term::kRdmapRemoteOperation, term::kUnexpectedOpcode, "untagged WRITE");
  // Short ULPDUs: the FPDU's length cannot be right.
  for (size_t n = 0; n < kTaggedHeaderLen; ++n)
    expect_error(Bytes(write.begin(), write.begin() + n), TermLayer::Llp, term::kLlpMpa, term::kFpduStart, "short tagged");
  for (size_t n = 2; n < kUntaggedHeaderLen; ++n)
    expect_error(Bytes(send.begin(), send.begin() + n), TermLayer::Llp, term::kLlpMpa, term::kFpduStart, "short untagged");
  b = send;
  b[1] = 0x41;  // READ request: 18 + 28 octets at least
  b.resize(kUntaggedHeaderLen + kReadRequestLen - 1);
  expect_error(b, TermLayer::Llp, term::kLlpMpa, term::kFpduStart, "short READ request");
  b.push_back(0);
  DdpHeader h;
  ParseError e{};
  EXPECT_EQ(parse_header(b.data(), b.size(), h, e), kUntaggedHeaderLen);
  // Reserved bits are not checked on receive (RFC 5041 §4.2, RFC 5040 §4.2).
  b = write;
  b[0] |= 0x3c;
  b[1] |= 0x30;
  EXPECT_EQ(parse_header(b.data(), b.size(), h, e), kTaggedHeaderLen);
  EXPECT_EQ(h.opcode, Opcode::Write);
}

// RFC 5040 §4.4: sink STag, sink TO, RDMA read message size, source STag, source TO.
TEST(IwarpReadRequest, FieldsAtRfcPositionsAndLength) {
  const uint8_t body[] = {0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x01,
                          0x00, 0x00, 0xab, 0xcd, 0xef, 0x01, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04};
  static_assert(sizeof body == kReadRequestLen);
  ReadRequest r;
  ASSERT_TRUE(parse_read_request(body, sizeof body, r));
  EXPECT_EQ(r.sink_stag, 0x1234u);
  EXPECT_EQ(r.sink_to, 0x00007f0000001000u);
  EXPECT_EQ(r.size, 0x00010000u);
  EXPECT_EQ(r.src_stag, 0xabcdef01u);
  EXPECT_EQ(r.src_to, 0x8000000000000004u);
  uint8_t out[kReadRequestLen];
  ASSERT_EQ(encode_read_request(r, out), kReadRequestLen);
  EXPECT_EQ(0, std::memcmp(out, body, sizeof body));
  EXPECT_FALSE(parse_read_request(body, sizeof body - 1, r));
  uint8_t longer[kReadRequestLen + 1] = {};
  EXPECT_FALSE(parse_read_request(longer, sizeof longer, r));
}

// RFC 5040 §4.8: Layer EType | Error Code | M D R + reserved, DDP segment length, the headers.
TEST(IwarpTerminate, FieldsAtRfcPositions) {
  Bytes body = {0x12, 0x03, 0xe0, 0x00,  // layer DDP, etype 2 (untagged), ecode 3; M D R
                0x01, 0x00};             // DDP segment length 256
  body.insert(body.end(), kSendInvHdr, kSendInvHdr + sizeof kSendInvHdr);
  body[6 + 1] = 0x41;  // the terminated header: a READ request
  Bytes rr(kReadRequestLen);
  for (size_t i = 0; i < rr.size(); ++i) rr[i] = static_cast<uint8_t>(0xa0 + i);
  body.insert(body.end(), rr.begin(), rr.end());
  Terminate t;
  ASSERT_TRUE(parse_terminate(body.data(), body.size(), t));
  EXPECT_EQ(t.layer, TermLayer::Ddp);
  EXPECT_EQ(t.etype, term::kDdpUntagged);
  EXPECT_EQ(t.ecode, term::kUtInvalidMsnRange);
  EXPECT_TRUE(t.has_segment_len);
  EXPECT_EQ(t.segment_len, 256);
  EXPECT_EQ(t.ddp_header, body.data() + 6);
  EXPECT_EQ(t.ddp_header_len, kUntaggedHeaderLen);
  EXPECT_EQ(t.rdmap_header, body.data() + 6 + kUntaggedHeaderLen);
  EXPECT_EQ(t.rdmap_header_len, kReadRequestLen);
  uint8_t out[kMaxTerminateLen];
  ASSERT_EQ(encode_terminate(t, out), body.size());
  EXPECT_EQ(0, std::memcmp(out, body.data(), body.size()));
  ASSERT_LE(body.size(), kMaxTerminateLen);
}

TEST(IwarpTerminate, RoundTripsAndShortBodies) {
  uint8_t hdr[kUntaggedHeaderLen];
  std::memcpy(hdr, kWriteHdr, kTaggedHeaderLen);  // a tagged header: 14 octets
  uint8_t rr[kReadRequestLen] = {1, 2, 3};
  for (int bits = 0; bits < 8; ++bits) {
    Terminate t;
    t.layer = static_cast<TermLayer>(bits % 3);
    t.etype = static_cast<uint8_t>(bits + 3);
    t.ecode = static_cast<uint8_t>(0xf0 | bits);
    t.has_segment_len = bits & 1;  // M alone: the flag, with no field
    if (bits & 2) t.ddp_header = hdr, t.ddp_header_len = kTaggedHeaderLen, t.segment_len = 0xbeef;
    if (bits & 4) t.rdmap_header = rr, t.rdmap_header_len = kReadRequestLen;
    uint8_t out[kMaxTerminateLen];
    const size_t n = encode_terminate(t, out);
    Terminate g;
    ASSERT_TRUE(parse_terminate(out, n, g)) << bits;
    EXPECT_EQ(g.layer, t.layer);
    EXPECT_EQ(g.etype, t.etype);
    EXPECT_EQ(g.ecode, t.ecode);
    EXPECT_EQ(g.has_segment_len, t.has_segment_len);
    EXPECT_EQ(g.segment_len, t.segment_len);
    ASSERT_EQ(g.ddp_header_len, t.ddp_header_len);
    ASSERT_EQ(g.rdmap_header_len, t.rdmap_header_len);
    if (g.ddp_header_len) {
      EXPECT_EQ(0, std::memcmp(g.ddp_header, hdr, kTaggedHeaderLen));
    }
    if (g.rdmap_header_len) {
      EXPECT_EQ(0, std::memcmp(g.rdmap_header, rr, kReadRequestLen));
    }
    // Every shorter body is refused, except where only the optional R header is cut entirely.
    for (size_t m = 0; m < n; ++m) {
      const bool r_cut_whole = (bits & 4) && m == n - kReadRequestLen;
      EXPECT_EQ(parse_terminate(out, m, g), r_cut_whole) << bits << " at " << m;
    }
  }
}

// siw sets M, D and R on a SEND's RDMAP protection error but sends only the DDP header.
TEST(IwarpTerminate, SiwStyleRWithoutReadRequest) {
  Bytes body = {0x01, 0x00, 0xe0, 0x00, 0x00, 0x00};
  body.insert(body.end(), kSendInvHdr, kSendInvHdr + sizeof kSendInvHdr);
  Terminate t;
  ASSERT_TRUE(parse_terminate(body.data(), body.size(), t));
  EXPECT_EQ(t.layer, TermLayer::Rdmap);
  EXPECT_EQ(t.etype, term::kRdmapRemoteProtection);
  EXPECT_EQ(t.ecode, term::kInvalidStag);
  EXPECT_EQ(t.ddp_header_len, kUntaggedHeaderLen);
  EXPECT_EQ(t.rdmap_header, nullptr);
  EXPECT_EQ(t.rdmap_header_len, 0u);
  // With part of a READ request after it, it is malformed.
  body.resize(body.size() + 10, 0);
  EXPECT_FALSE(parse_terminate(body.data(), body.size(), t));
}

// ---- FPDU framing ---------------------------------------------------------------------------------

// The independent model: the FPDU's content octet by octet into the stream, a marker before any
// octet that lands on a multiple of 512, the CRC over the FPDU's stream octets, markers included.
struct ModelStream {
  bool crc, markers;
  Bytes s;
  void fpdu(const Bytes& ulpdu) {
    const size_t start = s.size();
    size_t header = SIZE_MAX;
    Bytes content = {static_cast<uint8_t>(ulpdu.size() >> 8), static_cast<uint8_t>(ulpdu.size())};
    content.insert(content.end(), ulpdu.begin(), ulpdu.end());
    while ((content.size()) % 4) content.push_back(0);
    auto put = [&](uint8_t b) {
      if (markers && s.size() % 512 == 0) {
        const size_t ptr = s.size() == start ? 0 : s.size() - header;
        s.insert(s.end(), {0, 0, static_cast<uint8_t>(ptr >> 8), static_cast<uint8_t>(ptr)});
      }
      if (header == SIZE_MAX) header = s.size();
      s.push_back(b);
    };
    for (uint8_t b : content) put(b);
    // The CRC's octets come after any marker due before them.
    if (markers && s.size() % 512 == 0) {
      const size_t ptr = s.size() - header;
      s.insert(s.end(), {0, 0, static_cast<uint8_t>(ptr >> 8), static_cast<uint8_t>(ptr)});
    }
    const uint32_t c = crc ? ref_crc32c(s.data() + start, s.size() - start) : 0;
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<uint8_t>(c >> (8 * i)));
  }
};

Bytes payload(size_t n, uint32_t seed) {
  Bytes b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  if (n >= 2) b[0] = 0x41, b[1] = 0x43;  // any first two octets will do; these look like a SEND
  return b;
}

// Frames ulpdu (cut into pieces of `piece` octets) and appends the FPDU to stream; checks that
// the payload pieces point into ulpdu.
void frame_into(FpduSender& tx, const Bytes& ulpdu, size_t piece, Bytes& stream) {
  std::vector<iovec> in;
  for (size_t off = 0; off < ulpdu.size(); off += piece)
    in.push_back({const_cast<uint8_t*>(ulpdu.data()) + off, std::min(piece, ulpdu.size() - off)});
  Bytes scratch(FpduSender::scratch_len(ulpdu.size()));
  std::vector<iovec> out(in.size() * 2 + 300);
  const uint64_t before = tx.offset();
  const int n = tx.frame(in.data(), static_cast<int>(in.size()), scratch.data(), out.data(), static_cast<int>(out.size()));
  ASSERT_GT(n, 0);
  size_t total = 0;
  for (int i = 0; i < n; ++i) {
    const auto* p = static_cast<const uint8_t*>(out[i].iov_base);
    const bool in_ulpdu = p >= ulpdu.data() && p + out[i].iov_len <= ulpdu.data() + ulpdu.size();
    const bool in_scratch = p >= scratch.data() && p + out[i].iov_len <= scratch.data() + scratch.size();
    ASSERT_TRUE(in_ulpdu || in_scratch) << "piece " << i << " points elsewhere";
    ASSERT_GT(out[i].iov_len, 0u);
    stream.insert(stream.end(), p, p + out[i].iov_len);
    total += out[i].iov_len;
  }
  EXPECT_EQ(tx.offset(), before + total);
}

TEST(IwarpFraming, LayoutWithoutMarkers) {
  // A 5-octet ULPDU: length 5, the octets, 1 octet of pad, the CRC (zero without CRC).
  const Bytes u = {0x41, 0x43, 0xaa, 0xbb, 0xcc};
  for (int crc = 0; crc < 2; ++crc) {
    FpduSender tx(crc, false);
    Bytes s;
    frame_into(tx, u, 2, s);
    Bytes expect = {0x00, 0x05, 0x41, 0x43, 0xaa, 0xbb, 0xcc, 0x00};
    const uint32_t c = crc ? ref_crc32c(expect.data(), expect.size()) : 0;
    for (int i = 0; i < 4; ++i) expect.push_back(static_cast<uint8_t>(c >> (8 * i)));
    EXPECT_EQ(s, expect);
  }
  // Pieces: prefix, the caller's non-empty pieces (not copied), pad + CRC.
  FpduSender tx(true, false);
  uint8_t a[3] = {1, 2, 3}, b[4] = {4, 5, 6, 7};
  iovec in[3] = {{a, 3}, {nullptr, 0}, {b, 4}};
  Bytes scratch(FpduSender::scratch_len(7));
  iovec out[kFrameIov + 3];
  ASSERT_EQ(tx.frame(in, 3, scratch.data(), out, kFrameIov + 3), 4);
  EXPECT_EQ(out[1].iov_base, a);
  EXPECT_EQ(out[2].iov_base, b);
  EXPECT_EQ(out[3].iov_len, 3u + 4u);  // 2 + 7 octets: 3 of pad
  EXPECT_EQ(tx.offset(), 2u + 7 + 3 + 4);
  // Too few pieces: -1 and nothing moved.
  EXPECT_EQ(tx.frame(in, 3, scratch.data(), out, 3), -1);
  EXPECT_EQ(tx.offset(), 16u);
  // Too long.
  Bytes huge(kMaxUlpduLen + 1);
  iovec h = {huge.data(), huge.size()};
  Bytes hs(FpduSender::scratch_len(huge.size()));
  EXPECT_EQ(tx.frame(&h, 1, hs.data(), out, kFrameIov + 3), -1);
  EXPECT_EQ(tx.offset(), 16u);
}

// Every ULPDU length across several marker intervals, in both CRC settings, against the model.
TEST(IwarpFraming, MatchesModelStream) {
  for (int opts = 0; opts < 4; ++opts) {
    const bool crc = opts & 1, markers = opts & 2;
    FpduSender tx(crc, markers);
    ModelStream model{crc, markers, {}};
    Bytes s;
    uint32_t seed = 1;
    for (size_t len = 2; len < 1600; len += 1 + len / 16) {
      const Bytes u = payload(len, seed++);
      frame_into(tx, u, 1 + len % 97, s);
      model.fpdu(u);
      ASSERT_EQ(s.size(), model.s.size()) << "opts " << opts << " len " << len;
    }
    ASSERT_EQ(s, model.s) << "opts " << opts;
    EXPECT_EQ(tx.offset(), s.size());
    if (markers) {
      // Every 512th octet holds a marker whose FPDUPTR is 4-aligned.
      for (size_t p = 0; p + 4 <= s.size(); p += 512) {
        EXPECT_EQ(s[p], 0);
        EXPECT_EQ(s[p + 1], 0);
        EXPECT_EQ(s[p + 3] & 3, 0);
      }
    }
  }
}

// Marker placement at each FPDU boundary case: a marker leading an FPDU, one right before the CRC,
// one right after an FPDU's CRC (which leads the next), one splitting the ULPDU.
TEST(IwarpFraming, MarkerAtFpduBoundaries) {
  FpduSender tx(true, true);
  Bytes s;
  // FPDU 1 at offset 0: a leading marker (FPDUPTR 0); 2 + 502 + 4 = 508 octets of content end at 512.
  frame_into(tx, payload(502, 1), 100, s);
  ASSERT_EQ(s.size(), 512u);
  EXPECT_EQ(Bytes(s.begin(), s.begin() + 4), (Bytes{0, 0, 0, 0}));
  EXPECT_EQ(s[4], 0x01);  // the length prefix after the marker: 502
  EXPECT_EQ(s[5], 0xf6);
  // FPDU 2 starts at 512: its marker leads it.
  frame_into(tx, payload(498, 2), 498, s);  // content 2 + 498 + 4 = 504, + marker = 508: ends at 1020
  ASSERT_EQ(s.size(), 1020u);
  EXPECT_EQ(Bytes(s.begin() + 512, s.begin() + 516), (Bytes{0, 0, 0, 0}));
  // FPDU 3 at 1020: 2 + 2 = 4 octets, then the marker at 1024 sits between them and the CRC.
  frame_into(tx, payload(2, 3), 2, s);
  ASSERT_EQ(s.size(), 1020u + 4 + 4 + 4);
  EXPECT_EQ(Bytes(s.begin() + 1024, s.begin() + 1028), (Bytes{0, 0, 0, 4}));
  // FPDU 4 at 1032: its ULPDU is split by the marker at 1536 (FPDUPTR 504).
  frame_into(tx, payload(1000, 4), 1000, s);
  EXPECT_EQ(Bytes(s.begin() + 1536, s.begin() + 1540), (Bytes{0, 0, 0x01, 0xf8}));

  FpduReceiver rx(true, true);
  Bytes dm(kMaxUlpduLen);
  size_t off = 0;
  const size_t lens[] = {502, 498, 2, 1000};
  for (int i = 0; i < 4; ++i) {
    FpduReceiver::Fpdu f;
    ASSERT_EQ(rx.next(s.data() + off, s.size() - off, dm.data(), f), FpduReceiver::Status::Ok) << i;
    EXPECT_EQ(f.ulpdu_len, lens[i]);
    EXPECT_EQ(Bytes(f.ulpdu, f.ulpdu + f.ulpdu_len), payload(lens[i], static_cast<uint32_t>(i + 1)));
    off += f.consumed;
  }
  EXPECT_EQ(off, s.size());
}

// The receiver, fed a stream cut at every offset (the first part, then the rest), finds every
// ULPDU; a part short of a whole FPDU is NeedMore and moves nothing.
TEST(IwarpFraming, ReceiverStreamCutAtEveryOffset) {
  for (int opts = 0; opts < 4; ++opts) {
    const bool crc = opts & 1, markers = opts & 2;
    FpduSender tx(crc, markers);
    Bytes s;
    std::vector<Bytes> sent;
    for (size_t len : {2, 3, 17, 509, 60, 1100, 4, 700}) {
      sent.push_back(payload(len, static_cast<uint32_t>(len)));
      frame_into(tx, sent.back(), 64, s);
    }
    Bytes dm(kMaxUlpduLen);
    for (size_t cut = 0; cut <= s.size(); ++cut) {
      FpduReceiver rx(crc, markers);
      Bytes have;  // what has arrived and is not yet consumed, as in a receive buffer
      size_t fed = 0, got = 0;
      auto drain = [&] {
        for (;;) {
          Bytes exact(have);  // exactly the bytes there, so a read past them is a heap overflow
          FpduReceiver::Fpdu f;
          const auto st = rx.next(exact.data(), exact.size(), dm.data(), f);
          if (st == FpduReceiver::Status::NeedMore) return;
          ASSERT_EQ(st, FpduReceiver::Status::Ok) << "cut " << cut;
          ASSERT_LT(got, sent.size());
          ASSERT_EQ(Bytes(f.ulpdu, f.ulpdu + f.ulpdu_len), sent[got]) << "cut " << cut;
          if (!markers) {
            EXPECT_EQ(f.ulpdu, exact.data() + 2) << "parsed in place";
          }
          ++got;
          have.erase(have.begin(), have.begin() + static_cast<long>(f.consumed));
        }
      };
      have.insert(have.end(), s.begin(), s.begin() + static_cast<long>(cut));
      fed = cut;
      drain();
      have.insert(have.end(), s.begin() + static_cast<long>(fed), s.end());
      drain();
      ASSERT_EQ(got, sent.size()) << "opts " << opts << " cut " << cut;
      EXPECT_EQ(rx.offset(), s.size());
      EXPECT_TRUE(have.empty());
    }
  }
}

TEST(IwarpFraming, ReceiverRefusesBadLengthCrcAndMarkers) {
  using S = FpduReceiver::Status;
  Bytes dm(kMaxUlpduLen);
  FpduReceiver::Fpdu f;
  // ULPDU_Length 0 and 1: not even the DDP control field.
  for (uint8_t l : {0, 1}) {
    for (int markers = 0; markers < 2; ++markers) {
      FpduReceiver rx(true, markers);
      Bytes b = markers ? Bytes{0, 0, 0, 0, 0, l, 0, 0} : Bytes{0, l, 0, 0};
      EXPECT_EQ(rx.next(b.data(), b.size(), dm.data(), f), S::BadLength);
      EXPECT_EQ(rx.offset(), 0u);
    }
  }
  // A wrong CRC: any octet changed, in the ULPDU, the pad, a marker's reserved field, the CRC.
  for (int markers = 0; markers < 2; ++markers) {
    FpduSender tx(true, markers);
    Bytes s;
    frame_into(tx, payload(601, 9), 601, s);
    for (size_t i = 0; i < s.size(); ++i) {
      if (markers && (i == 2 || i == 3 || i == 514 || i == 515)) continue;  // FPDUPTR: a marker error
      if (i == (markers ? 4u : 0u) || i == (markers ? 5u : 1u)) continue;  // the length: another FPDU
      Bytes b = s;
      b[i] ^= 0x10;
      FpduReceiver rx(true, markers);
      EXPECT_EQ(rx.next(b.data(), b.size(), dm.data(), f), S::BadCrc) << i;
      EXPECT_EQ(rx.offset(), 0u);
      // Without CRC the field is not checked, and the other octets only change the ULPDU.
      FpduReceiver nocrc(false, markers);
      EXPECT_EQ(nocrc.next(b.data(), b.size(), dm.data(), f), S::Ok) << i;
    }
    EXPECT_EQ(FpduReceiver::error(S::BadCrc).ecode, term::kBadCrc);
  }
  // A marker whose FPDUPTR is wrong: the leading one, and one inside, refused as soon as it is there.
  {
    FpduSender tx(false, true);
    Bytes s;
    frame_into(tx, payload(1000, 5), 1000, s);
    for (size_t at : {3u, 515u}) {
      Bytes b = s;
      b[at] ^= 0x04;
      FpduReceiver rx(false, true);
      EXPECT_EQ(rx.next(b.data(), b.size(), dm.data(), f), S::BadMarker) << at;
      EXPECT_EQ(rx.next(b.data(), at + 1, dm.data(), f), S::BadMarker) << "early " << at;
      EXPECT_EQ(rx.offset(), 0u);
    }
    // FPDUPTR's two low bits are ignored; the reserved field too.
    Bytes b = s;
    b[515] ^= 0x03;
    b[512] = 0xff;
    FpduReceiver rx(false, true);
    EXPECT_EQ(rx.next(b.data(), b.size(), dm.data(), f), S::Ok);
    EXPECT_EQ(FpduReceiver::error(S::BadMarker).layer, TermLayer::Llp);
    EXPECT_EQ(FpduReceiver::error(S::BadMarker).ecode, term::kFpduStart);
  }
  // A receiver that does not expect markers reads a leading marker as ULPDU_Length 0.
  {
    FpduSender tx(true, true);
    Bytes s;
    frame_into(tx, payload(40, 5), 40, s);
    FpduReceiver rx(true, false);
    EXPECT_EQ(rx.next(s.data(), s.size(), dm.data(), f), S::BadLength);
  }
  // An expected-markers receiver given an unmarked stream sees a wrong marker at once.
  {
    FpduSender tx(true, false);
    Bytes s;
    frame_into(tx, payload(40, 5), 40, s);
    FpduReceiver rx(true, true);
    EXPECT_EQ(rx.next(s.data(), s.size(), dm.data(), f), S::BadMarker);
  }
}

TEST(IwarpFraming, MaxUlpduFillsTheRoomExactly) {
  for (int markers = 0; markers < 2; ++markers) {
    FpduSender tx(true, markers);
    Bytes s;
    std::mt19937 rng(7);
    for (int i = 0; i < 60; ++i) {
      const size_t room = 16 + rng() % 3000;
      const size_t m = tx.max_ulpdu(room);
      ASSERT_GE(m, 2u);
      // m fits, m + 1 does not (framed on a copy of the sender, which the copy's offset shows).
      FpduSender probe = tx;
      Bytes t;
      frame_into(probe, payload(m + 1, 1), 512, t);
      EXPECT_GT(t.size(), room) << room;
      const uint64_t before = tx.offset();
      frame_into(tx, payload(m, static_cast<uint32_t>(i)), 300, s);
      EXPECT_LE(tx.offset() - before, room) << room;
    }
    // No room for even an empty FPDU.
    EXPECT_EQ(FpduSender(true, markers).max_ulpdu(5), 0u);
    // The largest: the 16-bit ULPDU_Length without markers; with markers, also the 16-bit FPDUPTR.
    FpduSender big(true, markers);
    const size_t m = big.max_ulpdu(1 << 20);
    if (!markers) {
      EXPECT_EQ(m, kMaxUlpduLen);
    } else {
      // At offset 0: 129 markers, the last one's FPDUPTR 128 * 512 - 4 = 65532 (the largest that fits).
      EXPECT_EQ(m, 65526u);
    }
    Bytes s2;
    frame_into(big, payload(m, 3), 4096, s2);
    FpduReceiver rx(true, markers);
    Bytes dm(kMaxUlpduLen);
    FpduReceiver::Fpdu f;
    ASSERT_EQ(rx.next(s2.data(), s2.size(), dm.data(), f), FpduReceiver::Status::Ok);
    EXPECT_EQ(f.ulpdu_len, m);
    if (markers) {
      FpduSender over(true, true);
      Bytes u(m + 1);
      iovec in = {u.data(), u.size()};
      Bytes sc(FpduSender::scratch_len(u.size()));
      std::vector<iovec> out(300);
      EXPECT_EQ(over.frame(&in, 1, sc.data(), out.data(), 300), -1) << "an FPDUPTR would not fit";
    }
  }
}

}  // namespace
}  // namespace softrdma::wire::iwarp
