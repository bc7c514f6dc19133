// The iWARP path (docs/iwarp.md): RC QPs attached to a connected TCP socket (Engine::iwarp_attach)
// send and receive DDP/RDMAP over MPA on it. IwarpPath is the path object (path.h); IwarpState is
// its state of one QP, which the QP holds from the attach until reset or destroy. The requester,
// READ responses and the end of a connection are in iwarp_qp.cpp, the receive side in
// iwarp_responder.cpp.
#pragma once
#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "transport/iwarp.h"
#include "transport/path.h"
#include "transport/qp.h"
#include "wire/iwarp.h"

namespace softrdma::transport {

// The QP's TCP connection, its MPA framing in each direction, the FPDUs being written, the receive
// buffer, the MSN of each untagged queue (RFC 5040 §5.1: QN 0 SEND, 1 READ request, 2 Terminate) and
// the READs outstanding either way.
struct IwarpTx {
  // One FPDU: its DDP/RDMAP header (and READ request or Terminate body), the MPA pieces around it
  // (scratch), and iov, which points into these, the SQ entry's inline data, or registered memory.
  uint8_t hdr[wire::iwarp::kMaxHeaderLen + wire::iwarp::kMaxTerminateLen] = {};
  std::vector<uint8_t> scratch;
  std::vector<iovec> iov;
  std::vector<uint8_t> owned;     // the unsent bytes, copied out (see IwarpPath::iwarp_own_tx)
  size_t len = 0, sent = 0;
  bool completes = false;         // the last FPDU of a SEND or WRITE: its WQE is done when sent
  bool ends_read = false;         // the last READ response to a peer's request: IRD counts it until sent
  uint64_t sq_index = 0;
};
struct IwarpRead {                // a READ request we sent, awaiting its response (in order)
  uint64_t sq_index = 0;
  bool rtr = false;               // the zero-length READ of the RTR: completes nothing
  uint64_t placed = 0;
};
struct IwarpReadJob {             // a READ request the peer sent: its response being streamed
  uint32_t sink_stag = 0;
  uint64_t sink_to = 0;
  const uint8_t* src = nullptr;
  uint64_t remaining = 0;
};
struct IwarpState final : PathState {
  int fd = -1;
  bool crc = false, markers_rx = false, markers_tx = false;
  uint32_t ird = 1, ord = 1;
  bool hold_tx = false;           // RTR Await: nothing is sent before the first FPDU arrives
  uint64_t hold_until_ns = 0;     // ... or before this (IwarpAttach::await_grace), if set
  IwarpRtr rtr_expected = IwarpRtr::None;  // AwaitWrite/Read/Send: what the first FPDU must be
  uint64_t tx_hold_until_ns = 0;  // nothing is written to the socket before this (IwarpAttach::rtr_hold)
  uint64_t attached_ns = 0;
  uint8_t kicks_sent = 0;         // zero-length WRITEs after a held RTR (kIwarpRtrKickNs)
  bool kicks = false;             // ... still to come while the peer has sent nothing
  bool closing = false;           // in error: the Terminate (if any) goes out, then shutdown
  bool shut = false;              // the socket is shut down and out of the epoll set
  bool want_out = false;          // EPOLLOUT registered (the socket's send buffer was full)
  std::optional<wire::iwarp::FpduSender> tx_framer;
  std::optional<wire::iwarp::FpduReceiver> rx_framer;
  std::deque<IwarpTx> tx;         // FPDUs framed, in stream order (the front may be partly sent)
  uint64_t send_offset = 0;       // bytes of sq[req.send_index] already framed
  uint32_t tx_msn[3] = {1, 1, 1}; // next MSN per untagged queue
  uint32_t rx_msn[3] = {1, 1, 1}; // expected MSN per untagged queue
  std::deque<IwarpRead> reads;    // READs we have outstanding (<= ord)
  std::deque<IwarpReadJob> read_jobs;  // READ responses we owe (<= ird)
  std::vector<uint8_t> rx;        // bytes received, not yet parsed (an FPDU split across reads)
  size_t rx_len = 0;
  std::vector<uint8_t> demarked;  // a ULPDU with the peer's markers taken out
};

// The QP's iWARP state, or nullptr when it is not attached (for tests and diagnostics).
IwarpState* iwarp_state(Qp& qp);

class IwarpPath final : public Path, private PathServices {
 public:
  explicit IwarpPath(Engine& e) : PathServices(e) {}

  // Moves an RC QP in INIT to RTS over a.fd (the caller closes it on failure). 0 or an errno.
  int attach(Qp* qp, const IwarpAttach& a);

  // The operations an iWARP QP carries (as siw: SEND, SEND with invalidate, RDMA WRITE, RDMA READ
  // into one SGE, Local Invalidate; and the local Bind MW); post_send refuses the rest with EINVAL.
  bool carries(const Qp& qp, const SendWqe& w) const override;
  bool transmit(Qp& qp, uint64_t) override { return iwarp_transmit(qp); }
  // A RoCE packet for this QP: not its wire.
  void deliver(Qp& qp, wire::Packet&, const Arrival&) override {
    count(&qp, &core::Counters::drop_bad_opcode);
  }
  bool receiving() const override { return qps_ != 0; }
  // One pass over a QP's socket: receive and parse, then write what is owed; true when anything moved.
  bool receive(Qp& qp) override;
  uint64_t next_deadline(const Qp& qp) const override;
  void error(Qp& qp) override { iwarp_stop(qp); }
  void flush(Qp&) override {}
  // FPDUs queued for the socket keep their bytes; a READ response still to be streamed out of the
  // region is refused as if its STag had gone (RFC 5040 §4.8).
  void forget_pointers_into(Qp& qp, uint64_t lo, uint64_t len) override;
  void reset(Qp& qp) override { release(qp); }  // the connection ends; the QP may be connected again
  // The socket is closed, the state forgotten, the QP off the path.
  void release(Qp& qp) override;

 private:
  static IwarpState& state(Qp& qp) { return static_cast<IwarpState&>(*qp.path_state); }
  static const IwarpState& state(const Qp& qp) { return static_cast<const IwarpState&>(*qp.path_state); }
  // When the next zero-length WRITE after a held RTR is due (kIwarpRtrKickNs; valid while s.kicks).
  static uint64_t iwarp_kick_due(const IwarpState& s) { return s.attached_ns + kIwarpRtrKickNs[s.kicks_sent]; }
  static bool iwarp_carries(const SendWqe& w);
  bool iwarp_receive(Qp& qp);
  // One ULPDU as the FPDU receiver found it; false when it failed the QP (a Terminate is queued).
  bool iwarp_deliver(Qp& qp, const uint8_t* ulpdu, size_t len);
  void iwarp_deliver_send(Qp& qp, const wire::iwarp::DdpHeader& h, const uint8_t* hdr, size_t hdr_len,
                          const uint8_t* payload, size_t plen, size_t ulpdu_len);
  void iwarp_deliver_read_request(Qp& qp, const wire::iwarp::DdpHeader& h, const uint8_t* hdr, size_t hdr_len,
                                  const uint8_t* payload, size_t plen, size_t ulpdu_len);
  void iwarp_deliver_read_response(Qp& qp, const wire::iwarp::DdpHeader& h, const uint8_t* hdr, size_t hdr_len,
                                   const uint8_t* payload, size_t plen, size_t ulpdu_len);
  void iwarp_deliver_terminate(Qp& qp, const uint8_t* payload, size_t plen);
  // Requester and READ responses: frames what is due into the state's tx, then writes it; true when it did.
  bool iwarp_transmit(Qp& qp);
  bool iwarp_requester_fill(Qp& qp);
  // The READ request of the WQE at the send index (RFC 5040 §4.4), which joins the outstanding READs.
  void iwarp_read_request(Qp& qp, const SendWqe& w);
  bool iwarp_read_response_fill(Qp& qp);
  // Frames one ULPDU (the header bytes, then payload[0..n)) onto the QP's transmit queue; completes:
  // the SQ entry at sq_index is done once the FPDU's last byte is in the socket.
  void iwarp_queue(Qp& qp, const uint8_t* hdr, size_t hdr_len, const iovec* payload, int n,
                   bool completes = false, uint64_t sq_index = 0);
  // EOF or reset on the socket (no Terminate): the QP to error, nothing more is sent.
  void iwarp_conn_lost(Qp& qp, bool reset);
  // Refused input (RFC 5040 §4.8): one Terminate naming layer/etype/ecode with the offending
  // headers, the counter, the receive WQE in progress completed with recv_status (Success: flushed),
  // the async event, and the QP to error; the socket is shut down once the Terminate is written.
  struct IwarpFault {
    wire::iwarp::TermLayer layer;
    uint8_t etype, ecode;
    uint64_t core::Counters::*counter;
    AsyncEventType event;
    WcStatus recv_status = WcStatus::Success;
  };
  // ddp: the offending DDP header (ddp_len bytes, 0: none), rdmap: a READ request's header.
  void iwarp_refuse(Qp& qp, const IwarpFault& f, const uint8_t* ddp = nullptr, size_t ddp_len = 0,
                    size_t ulpdu_len = 0, const uint8_t* rdmap = nullptr, size_t rdmap_len = 0);
  // The unsent bytes of every queued FPDU copied into the FPDU itself: nothing it points to (SQ
  // slots, registered memory) is needed any more.
  static void iwarp_own_tx(Qp& qp);
  void iwarp_stop(Qp& qp);     // QP to error: what is queued (and a Terminate) goes out, then shutdown

  uint32_t qps_ = 0;  // attached QPs (progress passes look at their sockets)
};

}  // namespace softrdma::transport
