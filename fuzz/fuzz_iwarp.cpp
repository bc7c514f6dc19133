// fuzz_iwarp: wire/iwarp's parsers on arbitrary bytes.
// Every input is read as
//  - a TCP stream after the MPA frames, by an FpduReceiver of each of the 4 CRC/marker settings:
//    each FPDU found must lie within the input, and framing its ULPDU again with an FpduSender of the
//    same setting must give an FPDU of the same length that the receiver finds again, equal; each
//    ULPDU's DDP/RDMAP header, READ request or Terminate goes through the checks below;
//  - a DDP/RDMAP header (parse_header), a READ request body, a Terminate body, and an MPA request
//    and reply frame: what parses is encoded again, which must give the same octets (less what the
//    parser ignores: reserved bits) and parse back equal.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wire/iwarp.h"

using namespace softrdma::wire::iwarp;

namespace {

[[noreturn]] void fail(const char* what) {
  __builtin_printf("fuzz_iwarp: property violated: %s\n", what);
  abort();
}
void check(bool ok, const char* what) {
  if (!ok) fail(what);
}

bool same(const DdpHeader& a, const DdpHeader& b) {
  return a.tagged == b.tagged && a.last == b.last && a.ddp_version == b.ddp_version &&
         a.rdmap_version == b.rdmap_version && a.opcode == b.opcode && a.stag == b.stag && a.to == b.to &&
         a.rsvd_ulp == b.rsvd_ulp && a.qn == b.qn && a.msn == b.msn && a.mo == b.mo;
}

void header(const uint8_t* p, size_t len) {
  DdpHeader h;
  ParseError e{};
  const size_t n = parse_header(p, len, h, e);
  if (n == 0) {
    check(static_cast<uint8_t>(e.layer) <= 2, "parse_header: error layer");
    return;
  }
  check(n == (h.tagged ? kTaggedHeaderLen : kUntaggedHeaderLen) && n <= len, "parse_header: length");
  uint8_t out[kMaxHeaderLen];
  check(encode_header(h, out) == n, "encode_header: length");
  // The reserved bits of the DDP and RDMAP control octets are not kept.
  check(out[0] == (p[0] & 0xc3) && out[1] == (p[1] & 0xcf) && std::memcmp(out + 2, p + 2, n - 2) == 0,
        "encode_header: octets");
  // A READ request's header parses only with its body after it.
  std::vector<uint8_t> rt(out, out + n);
  if (h.opcode == Opcode::ReadRequest) rt.insert(rt.end(), p + n, p + n + kReadRequestLen);
  DdpHeader g;
  check(parse_header(rt.data(), rt.size(), g, e) == n, "parse_header: round trip");
  check(same(h, g), "parse_header: round trip fields");
}

void read_request(const uint8_t* p, size_t len) {
  ReadRequest r;
  if (!parse_read_request(p, len, r)) {
    check(len != kReadRequestLen, "parse_read_request: refused 28 octets");
    return;
  }
  uint8_t out[kReadRequestLen];
  check(encode_read_request(r, out) == kReadRequestLen && std::memcmp(out, p, kReadRequestLen) == 0,
        "encode_read_request: octets");
}

void terminate(const uint8_t* p, size_t len) {
  Terminate t;
  if (!parse_terminate(p, len, t)) return;
  check(t.ddp_header_len == 0 || t.ddp_header_len == kTaggedHeaderLen || t.ddp_header_len == kUntaggedHeaderLen,
        "parse_terminate: DDP header length");
  check(t.rdmap_header_len == 0 || t.rdmap_header_len == kReadRequestLen, "parse_terminate: RDMAP header length");
  const size_t used = 4 + (t.ddp_header_len ? 2 + t.ddp_header_len : 0) + t.rdmap_header_len;
  check(used <= len && used <= kMaxTerminateLen, "parse_terminate: within the body");
  if (t.ddp_header_len) check(t.ddp_header >= p && t.ddp_header + t.ddp_header_len <= p + len, "ddp_header in p");
  if (t.rdmap_header_len) check(t.rdmap_header >= p && t.rdmap_header + t.rdmap_header_len <= p + len, "rdmap_header in p");
  uint8_t out[kMaxTerminateLen];
  const size_t n = encode_terminate(t, out);
  check(n == used, "encode_terminate: length");
  check(out[0] == p[0] && out[1] == p[1], "encode_terminate: layer, etype, ecode");
  check(std::memcmp(out + 4, p + 4, n - 4) == 0, "encode_terminate: the copied fields");
  Terminate g;
  check(parse_terminate(out, n, g), "parse_terminate: round trip");
  check(g.layer == t.layer && g.etype == t.etype && g.ecode == t.ecode && g.has_segment_len == t.has_segment_len &&
            g.segment_len == t.segment_len && g.ddp_header_len == t.ddp_header_len &&
            g.rdmap_header_len == t.rdmap_header_len,
        "parse_terminate: round trip fields");
}

void ulpdu(const uint8_t* p, size_t len) {
  header(p, len);
  DdpHeader h;
  ParseError e{};
  const size_t n = parse_header(p, len, h, e);
  if (n == 0) return;
  if (h.opcode == Opcode::ReadRequest) read_request(p + n, len - n);
  if (h.opcode == Opcode::Terminate) terminate(p + n, len - n);
}

void mpa(const uint8_t* p, size_t len, bool reply) {
  MpaFrame f;
  if (!parse_mpa(p, len, reply, f)) return;
  check(len >= kMpaHeaderLen && mpa_frame_len(p) == len, "parse_mpa: mpa_frame_len");
  check(f.private_data_len <= kMpaMaxPrivateData, "parse_mpa: private data length");
  if (f.private_data_len) check(f.private_data >= p && f.private_data + f.private_data_len <= p + len, "private data in p");
  std::vector<uint8_t> out(kMpaHeaderLen + kMpaEnhancedLen + kMpaMaxPrivateData);
  const size_t n = encode_mpa(f, out.data());
  check(n == len, "encode_mpa: length");
  // The flags octet's reserved bits (and the enhanced bit but in revision 2) are not kept.
  const uint8_t kept = f.revision == 2 ? 0xf0 : 0xe0;
  check(out[16] == (p[16] & kept), "encode_mpa: flags");
  out[16] = p[16];
  check(std::memcmp(out.data(), p, n) == 0, "encode_mpa: octets");
  MpaFrame g;
  check(parse_mpa(out.data(), n, reply, g), "parse_mpa: round trip");
  check(g.markers == f.markers && g.crc == f.crc && g.reject == f.reject && g.revision == f.revision &&
            g.enhanced == f.enhanced && g.peer_to_peer == f.peer_to_peer && g.rtr_send == f.rtr_send &&
            g.rtr_write == f.rtr_write && g.rtr_read == f.rtr_read && g.ird == f.ird && g.ord == f.ord &&
            g.private_data_len == f.private_data_len,
        "parse_mpa: round trip fields");
}

void stream(const std::vector<uint8_t>& in, bool crc, bool markers) {
  FpduReceiver rx(crc, markers);
  FpduSender tx(crc, markers);
  std::vector<uint8_t> dm(kMaxUlpduLen);
  std::vector<std::vector<uint8_t>> got;
  std::vector<uint8_t> canon;  // the input with each FPDU found replaced by the sender's framing
  size_t off = 0;
  for (;;) {
    FpduReceiver::Fpdu f;
    const auto st = rx.next(in.data() + off, in.size() - off, dm.data(), f);
    if (st != FpduReceiver::Status::Ok) {
      check(rx.offset() == off, "next: a refusal moved the offset");
      if (st != FpduReceiver::Status::NeedMore) check(FpduReceiver::error(st).layer == TermLayer::Llp, "error: layer");
      break;
    }
    check(f.consumed > 0 && f.consumed <= in.size() - off && f.consumed % 4 == 0, "next: consumed");
    check(f.ulpdu_len >= 2 && f.ulpdu_len <= kMaxUlpduLen && f.ulpdu_len < f.consumed, "next: ULPDU length");
    const bool in_buf = f.ulpdu >= in.data() + off && f.ulpdu + f.ulpdu_len <= in.data() + off + f.consumed;
    // In place, unless markers lay inside it (then in dm).
    check(in_buf || (markers && f.ulpdu == dm.data()), "next: where the ULPDU lies");
    check(rx.offset() == off + f.consumed, "next: offset");
    ulpdu(f.ulpdu, f.ulpdu_len);

    // Framed again at the same stream offset: an FPDU of the same length.
    iovec piece = {const_cast<uint8_t*>(f.ulpdu), f.ulpdu_len};
    std::vector<uint8_t> scratch(FpduSender::scratch_len(f.ulpdu_len));
    iovec out[kFrameIov + 2 * (kMaxUlpduLen / kMarkerInterval + 4)];
    const int n = tx.frame(&piece, 1, scratch.data(), out, static_cast<int>(sizeof out / sizeof out[0]));
    check(n > 0, "frame: refused what was received");
    const size_t before = canon.size();
    for (int i = 0; i < n; ++i) {
      const auto* b = static_cast<const uint8_t*>(out[i].iov_base);
      canon.insert(canon.end(), b, b + out[i].iov_len);
    }
    check(canon.size() - before == f.consumed && tx.offset() == rx.offset(), "frame: FPDU length");
    got.emplace_back(f.ulpdu, f.ulpdu + f.ulpdu_len);
    off += f.consumed;
  }
  // The canonical stream parses back to the same ULPDUs.
  FpduReceiver rx2(crc, markers);
  size_t o = 0;
  for (const auto& u : got) {
    FpduReceiver::Fpdu g;
    check(rx2.next(canon.data() + o, canon.size() - o, dm.data(), g) == FpduReceiver::Status::Ok, "round trip: next");
    check(g.ulpdu_len == u.size() && std::memcmp(g.ulpdu, u.data(), u.size()) == 0, "round trip: ULPDU");
    o += g.consumed;
  }
  check(o == canon.size(), "round trip: length");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A private copy of exactly size bytes, so ASan catches any read past the input.
  std::vector<uint8_t> buf(data, data + size);
  for (int opts = 0; opts < 4; ++opts) stream(buf, opts & 1, opts & 2);
  ulpdu(buf.data(), buf.size());
  read_request(buf.data(), buf.size());
  terminate(buf.data(), buf.size());
  mpa(buf.data(), buf.size(), false);
  mpa(buf.data(), buf.size(), true);
  if (size >= kMpaHeaderLen) {
    const size_t n = mpa_frame_len(buf.data());
    check(n == 0 || (n >= kMpaHeaderLen && n <= kMpaHeaderLen + kMpaMaxPrivateData), "mpa_frame_len");
  }
  return 0;
}
