// The iWARP data path of one RC QP over a connected TCP socket (docs/iwarp.md): what the verbs layer
// hands the engine once librdmacm has run TCP connect/accept and the MPA exchange.
#pragma once
#include <cstdint>

namespace softrdma::transport {

// The first-FPDU rule after the MPA exchange (RFC 5044 §7.1.5, RFC 6581).
enum class IwarpRtr : uint8_t {
  None,       // initiator without peer-to-peer: the ULP sends first
  SendWrite,  // initiator: a zero-length RDMA WRITE goes first
  SendRead,   // initiator: a zero-length RDMA READ goes first (its zero-length response is consumed)
  SendSend,   // initiator: a zero-length SEND goes first (it consumes no receive WQE at the peer)
  Await,      // responder, no RTR agreed: nothing is sent until the ULP's first FPDU has arrived
  // Responder with peer-to-peer: nothing is sent until the first FPDU, which must be the agreed
  // zero-length WRITE, READ or SEND; any other is refused with No Matching RTR (RFC 6581 §5).
  AwaitWrite,
  AwaitRead,
  AwaitSend,
};
inline constexpr bool iwarp_awaits(IwarpRtr r) { return r >= IwarpRtr::Await; }

inline constexpr uint64_t kIwarpAwaitGraceNs = 50'000'000;  // 50 ms
inline constexpr uint64_t kIwarpRtrHoldNs = 10'000'000;     // 10 ms
// After a held RTR, while the peer has sent nothing: a zero-length RDMA WRITE (a no-op, RFC 5040) at
// these times after the attach, in case our first bytes still came before siw read its socket.
inline constexpr uint64_t kIwarpRtrKickNs[] = {100'000'000, 400'000'000, 1'500'000'000};

struct IwarpAttach {
  int fd = -1;              // connected TCP socket; the engine owns (and closes) it from now on
  bool crc = false;         // MPA CRC in both directions
  bool markers_rx = false;  // the peer inserts markers in what we receive
  bool markers_tx = false;  // we insert markers in what we send
  IwarpRtr rtr = IwarpRtr::None;
  // Await from an initiator without peer-to-peer: start sending after kIwarpAwaitGraceNs even if no
  // FPDU came. RFC 5044 says wait, but siw as a responder does not, so applications whose server
  // sends first (ucmatose, ib_write_lat) work between siw hosts and would wait for ever here; the
  // grace lets the initiator take our MPA reply first (siw fails on bytes read along with it).
  bool await_grace = false;
  // An initiator's RTR (and all that follows it) leaves kIwarpRtrHoldNs after the MPA reply came.
  // siw (Linux 6.1) as a responder sends its MPA reply and only then installs the socket callback
  // that reads the RTR: bytes that arrive in between wait unread until more data comes, and when the
  // RTR and the ULP's first message both came too early the connection hangs, then trips a kernel
  // BUG in iw_cm (cm_close_handler) when it is torn down half-established (tests/interop/iwarp.sh).
  bool rtr_hold = false;  // ... and kIwarpRtrKickNs apply
  uint32_t ird = 0, ord = 0;  // inbound / outbound READ depth
};

}  // namespace softrdma::transport
