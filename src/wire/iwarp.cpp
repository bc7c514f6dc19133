// MPA, DDP and RDMAP encoding and parsing (wire/iwarp.h; RFC 5044, 6581, 5041, 5040). Every
// multi-octet field is big-endian except the MPA CRC, which goes out as iSCSI's does (RFC 3720
// §12.1: the CRC32c's least significant octet first).
#include "wire/iwarp.h"

#include "wire/bytes.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <cstring>

namespace softrdma::wire::iwarp {
namespace {

constexpr char kKeyReq[] = "MPA ID Req Frame";
constexpr char kKeyRep[] = "MPA ID Rep Frame";
static_assert(sizeof kKeyReq == kMpaKeyLen + 1 && sizeof kKeyRep == kMpaKeyLen + 1);
// The octet after the key: M, C, R and RFC 6581's enhanced flag (the first of Res); then Rev.
constexpr uint8_t kFlagM = 0x80, kFlagC = 0x40, kFlagR = 0x20, kFlagEnhanced = 0x10;
// RFC 6581 §5: the IRD word's P and zero-length SEND RTR bits, the ORD word's WRITE and READ RTR bits.
constexpr uint16_t kIrdP = 0x8000, kIrdRtrSend = 0x4000, kOrdRtrWrite = 0x8000, kOrdRtrRead = 0x4000;

// DDP control (RFC 5041 §4.2-4.3) and RDMAP control (RFC 5040 §4.2), the ULPDU's first two octets.
constexpr uint8_t kDdpT = 0x80, kDdpL = 0x40, kDdpDvMask = 0x03;
constexpr uint8_t kRdmapRvShift = 6, kRdmapOpMask = 0x0f;
// Terminate control's Hdrct bits (RFC 5040 §4.8), the top of its third octet.
constexpr uint8_t kTermM = 0x80, kTermD = 0x40, kTermR = 0x20;

constexpr size_t kLenPrefix = 2, kCrcLen = 4, kMarkerLen = 4;

using namespace be;

bool is_tagged(Opcode op) { return op == Opcode::Write || op == Opcode::ReadResponse; }

size_t pad_of(size_t ulpdu_len) { return (4 - (kLenPrefix + ulpdu_len) % 4) % 4; }

// An FPDU's geometry at stream offset `off`: markers sit at the stream positions that are multiples
// of kMarkerInterval (the first octet after the MPA frames is position 0, so the first FPDU starts
// with one); a marker exactly at an FPDU's end belongs to the next FPDU.
struct Geometry {
  size_t content = 0;   // length prefix + ULPDU + pad + CRC
  size_t total = 0;     // content + markers
  size_t first = 0;     // the first marker's position relative to the FPDU's start
  size_t markers = 0;
  size_t header = 0;    // where the length prefix sits (4 when a marker leads the FPDU)
};
Geometry geometry(uint64_t off, bool markers, size_t ulpdu_len) {
  Geometry g;
  g.content = kLenPrefix + ulpdu_len + pad_of(ulpdu_len) + kCrcLen;
  g.total = g.content;
  if (!markers) return g;
  g.first = static_cast<size_t>((kMarkerInterval - off % kMarkerInterval) % kMarkerInterval);
  while (g.first + kMarkerInterval * g.markers < g.content + kMarkerLen * g.markers) ++g.markers;
  g.total = g.content + kMarkerLen * g.markers;
  g.header = g.first == 0 ? kMarkerLen : 0;
  return g;
}
// FPDUPTR of the marker at FPDU-relative position r: the distance back to the length prefix, 0 for
// a marker that leads its FPDU (RFC 5044 §5: "the first MPA Marker has an FPDUPTR value of 0").
size_t fpduptr(const Geometry& g, size_t r) { return r == 0 ? 0 : r - g.header; }
// The largest FPDUPTR the FPDU needs (the last marker's), which must fit in 16 bits.
bool fpduptr_fits(const Geometry& g) {
  if (g.markers == 0) return true;
  return fpduptr(g, g.first + kMarkerInterval * (g.markers - 1)) <= 0xfffc;
}

}  // namespace

// ---- MPA request/reply frames --------------------------------------------------------------------

size_t mpa_frame_len(const uint8_t* hdr) {
  if (std::memcmp(hdr, kKeyReq, kMpaKeyLen) != 0 && std::memcmp(hdr, kKeyRep, kMpaKeyLen) != 0) return 0;
  const uint16_t pd = get16(hdr + 18);
  return pd > kMpaMaxPrivateData ? 0 : kMpaHeaderLen + pd;
}

size_t encode_mpa(const MpaFrame& f, uint8_t* out) {
  std::memcpy(out, f.reply ? kKeyRep : kKeyReq, kMpaKeyLen);
  out[16] = static_cast<uint8_t>((f.markers ? kFlagM : 0) | (f.crc ? kFlagC : 0) | (f.reject ? kFlagR : 0) |
                                 (f.enhanced ? kFlagEnhanced : 0));
  out[17] = f.revision;
  size_t off = kMpaHeaderLen;
  if (f.enhanced) {
    put16(out + off, static_cast<uint16_t>((f.ird & kMpaMaxIrdOrd) | (f.peer_to_peer ? kIrdP : 0) |
                                           (f.rtr_send ? kIrdRtrSend : 0)));
    put16(out + off + 2, static_cast<uint16_t>((f.ord & kMpaMaxIrdOrd) | (f.rtr_write ? kOrdRtrWrite : 0) |
                                               (f.rtr_read ? kOrdRtrRead : 0)));
    off += kMpaEnhancedLen;
  }
  if (f.private_data_len) std::memcpy(out + off, f.private_data, f.private_data_len);
  off += f.private_data_len;
  put16(out + 18, static_cast<uint16_t>(off - kMpaHeaderLen));
  return off;
}

bool parse_mpa(const uint8_t* buf, size_t len, bool reply, MpaFrame& f) {
  if (len < kMpaHeaderLen || std::memcmp(buf, reply ? kKeyRep : kKeyReq, kMpaKeyLen) != 0) return false;
  const uint16_t pd = get16(buf + 18);
  if (pd > kMpaMaxPrivateData || len != kMpaHeaderLen + pd) return false;
  f = MpaFrame{};
  f.reply = reply;
  f.markers = buf[16] & kFlagM;
  f.crc = buf[16] & kFlagC;
  f.reject = buf[16] & kFlagR;
  f.revision = buf[17];
  // The enhanced flag means something in revision 2 (RFC 6581 §5); elsewhere it is reserved.
  f.enhanced = (buf[16] & kFlagEnhanced) && f.revision == 2;
  const uint8_t* p = buf + kMpaHeaderLen;
  size_t n = pd;
  if (f.enhanced) {
    if (n < kMpaEnhancedLen) return false;
    const uint16_t ird = get16(p), ord = get16(p + 2);
    f.peer_to_peer = ird & kIrdP;
    f.rtr_send = ird & kIrdRtrSend;
    f.rtr_write = ord & kOrdRtrWrite;
    f.rtr_read = ord & kOrdRtrRead;
    f.ird = ird & kMpaMaxIrdOrd;
    f.ord = ord & kMpaMaxIrdOrd;
    p += kMpaEnhancedLen;
    n -= kMpaEnhancedLen;
  }
  f.private_data = n ? p : nullptr;
  f.private_data_len = static_cast<uint16_t>(n);
  return true;
}

// ---- DDP/RDMAP headers ----------------------------------------------------------------------------

size_t encode_header(const DdpHeader& h, uint8_t* out) {
  out[0] = static_cast<uint8_t>((h.tagged ? kDdpT : 0) | (h.last ? kDdpL : 0) | (h.ddp_version & kDdpDvMask));
  out[1] = static_cast<uint8_t>((h.rdmap_version & 0x03) << kRdmapRvShift |
                                (static_cast<uint8_t>(h.opcode) & kRdmapOpMask));
  if (h.tagged) {
    put32(out + 2, h.stag);
    put64(out + 6, h.to);
    return kTaggedHeaderLen;
  }
  put32(out + 2, h.rsvd_ulp);
  put32(out + 6, h.qn);
  put32(out + 10, h.msn);
  put32(out + 14, h.mo);
  return kUntaggedHeaderLen;
}

size_t encode_read_request(const ReadRequest& r, uint8_t* out) {
  put32(out, r.sink_stag);
  put64(out + 4, r.sink_to);
  put32(out + 12, r.size);
  put32(out + 16, r.src_stag);
  put64(out + 20, r.src_to);
  return kReadRequestLen;
}

// Terminate control (RFC 5040 §4.8): Layer(4) EType(4) | Error Code(8) | M D R, 13 reserved bits.
size_t encode_terminate(const Terminate& t, uint8_t* out) {
  out[0] = static_cast<uint8_t>((static_cast<uint8_t>(t.layer) & 0x0f) << 4 | (t.etype & 0x0f));
  out[1] = t.ecode;
  out[2] = static_cast<uint8_t>((t.has_segment_len ? kTermM : 0) | (t.ddp_header_len ? kTermD : 0) |
                                (t.rdmap_header_len ? kTermR : 0));
  out[3] = 0;
  size_t off = 4;
  // The DDP segment length travels with the terminated DDP header (M only says it is valid).
  if (t.ddp_header_len) {
    put16(out + off, t.segment_len);
    std::memcpy(out + off + 2, t.ddp_header, t.ddp_header_len);
    off += 2 + t.ddp_header_len;
  }
  if (t.rdmap_header_len) {
    std::memcpy(out + off, t.rdmap_header, t.rdmap_header_len);
    off += t.rdmap_header_len;
  }
  return off;
}

size_t parse_header(const uint8_t* ulpdu, size_t len, DdpHeader& h, ParseError& err) {
  // Too short to hold even the control fields: the FPDU's length cannot be right (siw answers a
  // ULPDU shorter than its header the same way).
  const ParseError short_ulpdu{TermLayer::Llp, term::kLlpMpa, term::kFpduStart};
  if (len < 2) {
    err = short_ulpdu;
    return 0;
  }
  h = DdpHeader{};
  h.tagged = ulpdu[0] & kDdpT;
  h.last = ulpdu[0] & kDdpL;
  h.ddp_version = ulpdu[0] & kDdpDvMask;
  h.rdmap_version = static_cast<uint8_t>(ulpdu[1] >> kRdmapRvShift);
  const uint8_t op = ulpdu[1] & kRdmapOpMask;
  h.opcode = static_cast<Opcode>(op);
  // In the order siw checks them: DDP version, RDMAP version, opcode.
  if (h.ddp_version != 1) {
    err = h.tagged ? ParseError{TermLayer::Ddp, term::kDdpTagged, term::kTDdpVersion}
                   : ParseError{TermLayer::Ddp, term::kDdpUntagged, term::kUtDdpVersion};
    return 0;
  }
  if (h.rdmap_version != 1) {
    err = {TermLayer::Rdmap, term::kRdmapRemoteOperation, term::kRdmapVersion};
    return 0;
  }
  if (op > static_cast<uint8_t>(Opcode::Terminate) || h.tagged != is_tagged(h.opcode)) {
    err = {TermLayer::Rdmap, term::kRdmapRemoteOperation, term::kUnexpectedOpcode};
    return 0;
  }
  const size_t hlen = h.tagged ? kTaggedHeaderLen : kUntaggedHeaderLen;
  if (len < hlen || (h.opcode == Opcode::ReadRequest && len < hlen + kReadRequestLen)) {
    err = short_ulpdu;
    return 0;
  }
  if (h.tagged) {
    h.stag = get32(ulpdu + 2);
    h.to = get64(ulpdu + 6);
  } else {
    h.rsvd_ulp = get32(ulpdu + 2);
    h.qn = get32(ulpdu + 6);
    h.msn = get32(ulpdu + 10);
    h.mo = get32(ulpdu + 14);
  }
  return hlen;
}

bool parse_read_request(const uint8_t* p, size_t len, ReadRequest& r) {
  if (len != kReadRequestLen) return false;
  r.sink_stag = get32(p);
  r.sink_to = get64(p + 4);
  r.size = get32(p + 12);
  r.src_stag = get32(p + 16);
  r.src_to = get64(p + 20);
  return true;
}

bool parse_terminate(const uint8_t* p, size_t len, Terminate& t) {
  if (len < 4) return false;
  t = Terminate{};
  t.layer = static_cast<TermLayer>(p[0] >> 4);
  t.etype = p[0] & 0x0f;
  t.ecode = p[1];
  const bool d = p[2] & kTermD, r = p[2] & kTermR;
  t.has_segment_len = p[2] & kTermM;
  size_t off = 4;
  if (d) {
    // The DDP segment length, then the header, whose length its T bit gives.
    if (len < off + 3) return false;
    const size_t hl = (p[off + 2] & kDdpT) ? kTaggedHeaderLen : kUntaggedHeaderLen;
    if (len < off + 2 + hl) return false;
    t.segment_len = get16(p + off);
    t.ddp_header = p + off + 2;
    t.ddp_header_len = hl;
    off += 2 + hl;
  }
  if (r && len > off) {
    if (len < off + kReadRequestLen) return false;
    t.rdmap_header = p + off;
    t.rdmap_header_len = kReadRequestLen;
  }
  return true;
}

// ---- MPA framing ----------------------------------------------------------------------------------

// ISA-L's crc32_iscsi neither inverts its input register nor its result; the standard CRC32c does both.
uint32_t mpa_crc32c(const uint8_t* p, size_t len, uint32_t crc) {
  uint32_t c = ~crc;
  for (constexpr size_t kChunk = size_t{1} << 30; len > 0;) {  // its length is an int
    const size_t n = std::min(len, kChunk);
    c = crc32_iscsi(const_cast<uint8_t*>(p), static_cast<int>(n), c);
    p += n;
    len -= n;
  }
  return ~c;
}

size_t FpduSender::max_ulpdu(size_t fpdu_room) const {
  // geometry() grows with the ULPDU's length: the largest that fits, by bisection.
  auto fits = [&](size_t l) {
    const Geometry g = geometry(offset_, markers_, l);
    return g.total <= fpdu_room && fpduptr_fits(g);
  };
  size_t lo = 0, hi = std::min(kMaxUlpduLen, fpdu_room);
  if (!fits(lo)) return 0;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

size_t FpduSender::scratch_len(size_t ulpdu_len) {
  // Length prefix (2, padded to 4), pad + CRC (at most 7, room for 8), then the markers: an FPDU of
  // T octets holds at most T / 512 + 1 of them, and T < content + 4 * markers.
  const size_t content = kLenPrefix + ulpdu_len + 3 + kCrcLen;
  return 4 + 8 + kMarkerLen * (content / (kMarkerInterval - kMarkerLen) + 2);
}

int FpduSender::frame(const iovec* ulpdu, int n, uint8_t* scratch, iovec* out, int out_max) {
  size_t ulen = 0;
  for (int i = 0; i < n; ++i) ulen += ulpdu[i].iov_len;
  if (ulen > kMaxUlpduLen) return -1;
  const Geometry g = geometry(offset_, markers_, ulen);
  if (!fpduptr_fits(g)) return -1;
  const size_t pad = pad_of(ulen);
  uint8_t* prefix = scratch;
  uint8_t* trailer = scratch + 4;  // pad, then CRC
  uint8_t* marks = scratch + 12;
  put16(prefix, static_cast<uint16_t>(ulen));
  std::memset(trailer, 0, pad + kCrcLen);

  // The content's pieces in stream order; markers go in at content positions first + 512k - 4k.
  int count = 0;
  size_t pos = 0;        // FPDU-relative stream position of the next octet
  size_t next_marker = g.markers ? g.first : SIZE_MAX;
  size_t marker_i = 0;
  bool ok = true;
  auto emit = [&](const uint8_t* base, size_t len) {
    while (len > 0 || pos == next_marker) {
      if (pos == next_marker) {
        if (count == out_max) {
          ok = false;
          return;
        }
        uint8_t* mk = marks + kMarkerLen * marker_i;
        put16(mk, 0);
        put16(mk + 2, static_cast<uint16_t>(fpduptr(g, pos)));
        out[count++] = {mk, kMarkerLen};
        pos += kMarkerLen;
        ++marker_i;
        next_marker = marker_i < g.markers ? g.first + kMarkerInterval * marker_i : SIZE_MAX;
        continue;
      }
      const size_t take = std::min(len, next_marker - pos);
      if (count == out_max) {
        ok = false;
        return;
      }
      out[count++] = {const_cast<uint8_t*>(base), take};
      base += take;
      len -= take;
      pos += take;
      if (len == 0) return;  // a marker right after this piece goes with the next one
    }
  };
  emit(prefix, kLenPrefix);
  for (int i = 0; i < n && ok; ++i)
    if (ulpdu[i].iov_len) emit(static_cast<const uint8_t*>(ulpdu[i].iov_base), ulpdu[i].iov_len);
  if (ok) emit(trailer, pad + kCrcLen);
  if (!ok || pos != g.total) return -1;

  if (crc_) {
    // Over everything but the CRC itself, markers included (RFC 5044 §4.4).
    uint32_t c = 0;
    size_t left = g.total - kCrcLen;
    for (int i = 0; i < count && left; ++i) {
      const size_t l = std::min(left, out[i].iov_len);
      c = mpa_crc32c(static_cast<const uint8_t*>(out[i].iov_base), l, c);
      left -= l;
    }
    uint8_t* crc = trailer + pad;
    crc[0] = static_cast<uint8_t>(c);
    crc[1] = static_cast<uint8_t>(c >> 8);
    crc[2] = static_cast<uint8_t>(c >> 16);
    crc[3] = static_cast<uint8_t>(c >> 24);
  }
  offset_ += g.total;
  return count;
}

ParseError FpduReceiver::error(Status s) {
  switch (s) {
    case Status::BadCrc:
      return {TermLayer::Llp, term::kLlpMpa, term::kBadCrc};
    default:
      // A length or marker that does not match: the FPDU did not start where it should.
      return {TermLayer::Llp, term::kLlpMpa, term::kFpduStart};
  }
}

FpduReceiver::Status FpduReceiver::next(const uint8_t* buf, size_t len, uint8_t* demarked, Fpdu& f) {
  // Markers that lie in buf are checked as soon as they are there, so that a stream that lost its
  // framing is refused without waiting for a length that means nothing.
  const size_t first = markers_ ? static_cast<size_t>((kMarkerInterval - offset_ % kMarkerInterval) % kMarkerInterval)
                                : SIZE_MAX;
  const size_t header = first == 0 ? kMarkerLen : 0;
  if (len < header + kLenPrefix) {
    if (first == 0 && len >= kMarkerLen && (get16(buf + 2) & ~3u) != 0) return Status::BadMarker;
    return Status::NeedMore;
  }
  const size_t ulen = get16(buf + header);
  if (ulen < 2) return Status::BadLength;  // not even the DDP and RDMAP control fields
  const Geometry g = geometry(offset_, markers_, ulen);
  for (size_t k = 0; k < g.markers; ++k) {
    const size_t r = g.first + kMarkerInterval * k;
    if (r + kMarkerLen > len) break;
    if ((get16(buf + r + 2) & ~3u) != fpduptr(g, r)) return Status::BadMarker;
  }
  if (len < g.total) return Status::NeedMore;

  if (crc_) {
    const uint32_t c = mpa_crc32c(buf, g.total - kCrcLen);
    const uint8_t* p = buf + g.total - kCrcLen;
    const uint32_t stored = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
    if (c != stored) return Status::BadCrc;
  }
  if (g.markers == 0) {
    f.ulpdu = buf + kLenPrefix;
  } else {
    // Copy the ULPDU's octets around the markers.
    size_t pos = header + kLenPrefix, copied = 0, k = header ? 1 : 0;
    while (copied < ulen) {
      const size_t mark = k < g.markers ? g.first + kMarkerInterval * k : SIZE_MAX;
      if (pos == mark) {
        pos += kMarkerLen;
        ++k;
        continue;
      }
      const size_t take = std::min(ulen - copied, mark - pos);
      std::memcpy(demarked + copied, buf + pos, take);
      copied += take;
      pos += take;
    }
    f.ulpdu = demarked;
  }
  f.ulpdu_len = ulen;
  f.consumed = g.total;
  offset_ += g.total;
  return Status::Ok;
}

}  // namespace softrdma::wire::iwarp
