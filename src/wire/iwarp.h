// iWARP on the wire, as pure functions over byte buffers: MPA request/reply frames (RFC 5044 §7.1 with
// RFC 6581's enhanced connection setup), MPA framing of FPDUs (length, pad, CRC32c, markers; RFC 5044
// §4-5), and the DDP (RFC 5041) and RDMAP (RFC 5040) headers, READ request and Terminate messages that
// an FPDU's ULPDU carries (docs/iwarp.md). No I/O and no state beyond one connection's stream offsets.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace softrdma::wire::iwarp {

// ---- MPA request/reply frames --------------------------------------------------------------------
inline constexpr size_t kMpaKeyLen = 16;
inline constexpr size_t kMpaHeaderLen = 20;          // key, flags + revision, private data length
inline constexpr size_t kMpaEnhancedLen = 4;         // RFC 6581 IRD/ORD word pair, ahead of the ULP's data
inline constexpr size_t kMpaMaxPrivateData = 512;    // RFC 5044 §7.1.3 (ULP data + enhanced data)
inline constexpr uint16_t kMpaMaxIrdOrd = 0x3fff;

struct MpaFrame {
  bool reply = false;    // "MPA ID Rep Frame" (else "MPA ID Req Frame")
  bool markers = false;  // M: the sender wants markers in what it receives
  bool crc = false;      // C
  bool reject = false;   // R (replies only)
  uint8_t revision = 2;
  // RFC 6581 (revision 2 with the enhanced flag): the IRD/ORD words lead the private data.
  bool enhanced = false;
  bool peer_to_peer = false;       // P (IRD word)
  bool rtr_send = false;           // zero-length SEND RTR offered/chosen (IRD word)
  bool rtr_write = false;          // zero-length RDMA WRITE RTR (ORD word)
  bool rtr_read = false;           // zero-length RDMA READ RTR (ORD word)
  uint16_t ird = 0, ord = 0;       // 14 bits each
  const uint8_t* private_data = nullptr;  // the ULP's private data (after the enhanced words)
  uint16_t private_data_len = 0;
};

// The whole frame's length given its first kMpaHeaderLen bytes (0: not an MPA frame: bad key, or a
// private data length over kMpaMaxPrivateData).
size_t mpa_frame_len(const uint8_t* hdr);
// Writes f (header, enhanced words when f.enhanced, private data); out has room for
// kMpaHeaderLen + kMpaEnhancedLen + f.private_data_len. Returns the length written.
size_t encode_mpa(const MpaFrame& f, uint8_t* out);
// Parses a complete frame of mpa_frame_len() bytes; f.private_data points into buf. False when
// malformed (wrong key for `reply`, length mismatch, enhanced flag with fewer than 4 bytes of data).
bool parse_mpa(const uint8_t* buf, size_t len, bool reply, MpaFrame& f);

// ---- DDP/RDMAP headers ----------------------------------------------------------------------------
enum class Opcode : uint8_t {
  Write = 0, ReadRequest = 1, ReadResponse = 2, Send = 3, SendInvalidate = 4, SendSolicited = 5,
  SendSolicitedInvalidate = 6, Terminate = 7,
};
// Untagged queue numbers (RFC 5040 §5.1).
inline constexpr uint32_t kQnSend = 0, kQnReadRequest = 1, kQnTerminate = 2;
inline constexpr size_t kTaggedHeaderLen = 14;    // control(2) STag(4) TO(8)
inline constexpr size_t kUntaggedHeaderLen = 18;  // control(2) RsvdULP(4) QN(4) MSN(4) MO(4)
inline constexpr size_t kReadRequestLen = 28;     // sink STag, sink TO, size, source STag, source TO
inline constexpr size_t kMaxHeaderLen = kUntaggedHeaderLen + kReadRequestLen;

// The DDP and RDMAP control fields and the tagged or untagged DDP header (tagged: WRITE and READ
// response; untagged: the rest).
struct DdpHeader {
  bool tagged = false;
  bool last = false;     // L: the message's last segment
  uint8_t ddp_version = 1, rdmap_version = 1;
  Opcode opcode = Opcode::Send;
  uint32_t stag = 0;     // tagged
  uint64_t to = 0;       // tagged
  uint32_t rsvd_ulp = 0; // untagged: for SEND with invalidate, the STag to invalidate
  uint32_t qn = 0, msn = 0, mo = 0;  // untagged
};
struct ReadRequest {
  uint32_t sink_stag = 0;
  uint64_t sink_to = 0;
  uint32_t size = 0;
  uint32_t src_stag = 0;
  uint64_t src_to = 0;
};

// Terminate (RFC 5040 §4.8): layer, error type and code, and copies of the offending headers.
enum class TermLayer : uint8_t { Rdmap = 0, Ddp = 1, Llp = 2 };
struct Terminate {
  TermLayer layer = TermLayer::Rdmap;
  uint8_t etype = 0, ecode = 0;
  bool has_segment_len = false;  // M
  uint16_t segment_len = 0;
  const uint8_t* ddp_header = nullptr;  // D: the terminated DDP segment's header (tagged or untagged)
  size_t ddp_header_len = 0;
  const uint8_t* rdmap_header = nullptr;  // R: the terminated RDMAP header (a READ request's 28 bytes)
  size_t rdmap_header_len = 0;
};
inline constexpr size_t kMaxTerminateLen = 4 + 2 + kUntaggedHeaderLen + kReadRequestLen + 2;

// Terminate error types and codes (RFC 5040 §4.8, RFC 5041 §7.2, RFC 5044 §8 and RFC 6581 §7; the
// values siw uses).
namespace term {
// RDMAP layer: error types, then codes.
inline constexpr uint8_t kRdmapCatastrophic = 0, kRdmapRemoteProtection = 1, kRdmapRemoteOperation = 2;
inline constexpr uint8_t kInvalidStag = 0x00, kBaseBounds = 0x01, kAccessRights = 0x02, kStagNotAssoc = 0x03,
                         kToWrap = 0x04, kRdmapVersion = 0x05, kUnexpectedOpcode = 0x06,
                         kCatastrophicStream = 0x07, kCatastrophicGlobal = 0x08, kCannotInvalidate = 0x09,
                         kUnspecified = 0xff;
// DDP layer: error types, then the tagged (T) and untagged (UT) codes.
inline constexpr uint8_t kDdpCatastrophic = 0, kDdpTagged = 1, kDdpUntagged = 2;
inline constexpr uint8_t kTInvalidStag = 0x00, kTBaseBounds = 0x01, kTStagNotAssoc = 0x02, kTToWrap = 0x03,
                         kTDdpVersion = 0x04;
inline constexpr uint8_t kUtInvalidQn = 0x01, kUtInvalidMsnNoBuffer = 0x02, kUtInvalidMsnRange = 0x03,
                         kUtInvalidMo = 0x04, kUtMessageTooLong = 0x05, kUtDdpVersion = 0x06;
// LLP (MPA) layer: error type 0, codes.
inline constexpr uint8_t kLlpMpa = 0;
inline constexpr uint8_t kTcpLost = 0x01, kBadCrc = 0x02, kFpduStart = 0x03, kInvalidReqRep = 0x04,
                         kLocalCatastrophic = 0x05, kInsufficientIrd = 0x06, kNoMatchingRtr = 0x07;
}  // namespace term

// Why a ULPDU was refused: where the Terminate that answers it comes from.
struct ParseError {
  TermLayer layer;
  uint8_t etype, ecode;
};

// Writes h's header (kTaggedHeaderLen or kUntaggedHeaderLen bytes). Returns the length.
size_t encode_header(const DdpHeader& h, uint8_t* out);
size_t encode_read_request(const ReadRequest& r, uint8_t* out);  // kReadRequestLen bytes
// Writes a Terminate's body (what follows its untagged header). Returns the length.
size_t encode_terminate(const Terminate& t, uint8_t* out);
// Parses the header at the start of a ULPDU (len bytes): the header's length (kTaggedHeaderLen or
// kUntaggedHeaderLen; a READ request's 28 bytes follow it), or 0 with err set (DDP version, RDMAP
// version, reserved opcode, tagged flag against opcode, ULPDU shorter than its header or a READ
// request shorter than header + kReadRequestLen). Reserved bits are ignored, as RFC 5041 asks.
size_t parse_header(const uint8_t* ulpdu, size_t len, DdpHeader& h, ParseError& err);
// A READ request's body: exactly kReadRequestLen bytes.
bool parse_read_request(const uint8_t* p, size_t len, ReadRequest& r);
// A Terminate's body (what follows its untagged header); t's header pointers point into p. False when
// shorter than its Hdrct bits say (D: 2 octets of DDP segment length, then the DDP header, 14 or 18
// octets by its T bit; R: a READ request's 28 octets, which may be absent at the very end, as siw
// sends R for a SEND). M only says the segment length is valid; encode_terminate writes segment_len
// whenever there is a DDP header. Octets after what the bits name are ignored (a pad).
bool parse_terminate(const uint8_t* p, size_t len, Terminate& t);

// ---- MPA framing ----------------------------------------------------------------------------------
// CRC32c (RFC 3720's iSCSI CRC) of len octets, continuing from crc (0 to start): the value whose
// least significant octet goes first on the wire.
uint32_t mpa_crc32c(const uint8_t* p, size_t len, uint32_t crc = 0);

inline constexpr size_t kMarkerInterval = 512;
inline constexpr size_t kMaxUlpduLen = 0xffff;
inline constexpr int kFrameIov = 6;  // most pieces frame() adds around a ULPDU without markers

// One direction of one connection's framing: the stream offset (markers sit at fixed positions of
// the TCP stream counted from the first octet after the MPA frames) and the negotiated options.
class FpduSender {
 public:
  FpduSender(bool crc, bool markers) : crc_(crc), markers_(markers) {}
  // The largest ULPDU (header + payload) whose FPDU, markers included, fits in fpdu_room octets.
  size_t max_ulpdu(size_t fpdu_room) const;
  // Frames one ULPDU given as pieces (ulpdu[0..n)): fills out[0..) with the FPDU's pieces, which
  // point into ulpdu's buffers and into scratch (length prefix, markers, pad and CRC; scratch holds
  // scratch_len() bytes and must live until the FPDU is sent). Returns the number of pieces, or -1
  // when out_max is too small or the ULPDU too long (over kMaxUlpduLen, or with markers past what
  // max_ulpdu(kMaxUlpduLen + 1024) allows); -1 changes nothing. Advances the stream offset by the
  // FPDU's length. Without markers the pieces are: length prefix, ulpdu's non-empty pieces, pad+CRC.
  int frame(const iovec* ulpdu, int n, uint8_t* scratch, iovec* out, int out_max);
  static size_t scratch_len(size_t ulpdu_len);
  uint64_t offset() const { return offset_; }

 private:
  bool crc_, markers_;
  uint64_t offset_ = 0;
};

// The receiving direction: finds FPDUs in the bytes as they arrive.
class FpduReceiver {
 public:
  FpduReceiver(bool crc, bool markers) : crc_(crc), markers_(markers) {}
  enum class Status : uint8_t { Ok, NeedMore, BadLength, BadCrc, BadMarker };
  struct Fpdu {
    const uint8_t* ulpdu = nullptr;  // the ULPDU, without markers (in buf, or in demarked)
    size_t ulpdu_len = 0;
    size_t consumed = 0;             // stream octets the FPDU took (markers, pad and CRC included)
  };
  // Looks for one complete FPDU at the start of buf (len octets from the current stream offset).
  // With markers, the ULPDU is copied without them into demarked (kMaxUlpduLen octets). Ok advances
  // the stream offset by f.consumed; any other status leaves it.
  Status next(const uint8_t* buf, size_t len, uint8_t* demarked, Fpdu& f);
  // The Terminate that answers a refused FPDU (BadLength, BadCrc, BadMarker): LLP layer, MPA.
  static ParseError error(Status s);
  uint64_t offset() const { return offset_; }

 private:
  bool crc_, markers_;
  uint64_t offset_ = 0;
};

}  // namespace softrdma::wire::iwarp
