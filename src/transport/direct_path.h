// The intra-host direct path as a path object (path.h; docs/direct-path.md). An RC QP whose peer QP
// belongs to another softrdma context of this host joins it at RTR, when DirectEndpoint::attach
// connects it to that peer (or keeps asking), and leaves it at RESET. Its requester executes a WQE on
// the peer's memory itself when nothing is in flight before it, so order and fences hold trivially;
// everything else, and whatever the direct path cannot do exactly, goes by the RoCE RC path's packets,
// to which this path hands the QP's work (the RC roles keep its PSNs, timers and completions).
//
// Its receive side places what intra-host initiators left in a QP's inbox into the QP's receive WQEs
// (direct_path.cpp). That runs for every QP with an inbox, whichever path it sends on: a peer may
// reach this QP directly while this QP reaches the peer by packets.
#pragma once
#include <cstdint>
#include <vector>

#include "transport/direct_layout.h"
#include "transport/path.h"
#include "transport/qp.h"
#include "transport/rc_path.h"

namespace softrdma::transport {

class DirectPath final : public Path, PathServices {
 public:
  DirectPath(Engine& e, RcPath& rc) : PathServices(e), rc_(rc) {}

  // At RTR: the QP joins this path when its peer is another context of this host that serves the
  // direct path; otherwise it stays on the RC path.
  void join(Qp& qp);
  // The receive side: places what initiators left in the QP's inbox; true when anything was placed.
  bool receive_inbox(Qp& qp);
  bool receive_inboxes(const std::vector<Qp*>& qps);

  bool carries(const Qp& qp, const SendWqe& w) const override { return rc_.carries(qp, w); }
  bool transmit(Qp& qp, uint64_t now_ns) override;
  void deliver(Qp& qp, wire::Packet& pkt, const Arrival& from) override { rc_.deliver(qp, pkt, from); }
  void timers(Qp& qp, uint64_t now_ns) override { rc_.timers(qp, now_ns); }
  uint64_t next_deadline(const Qp& qp) const override { return rc_.next_deadline(qp); }
  void error(Qp& qp) override { rc_.error(qp); }
  void flush(Qp& qp) override { rc_.flush(qp); }
  void forget_pointers_into(Qp& qp, uint64_t lo, uint64_t len) override { rc_.forget_pointers_into(qp, lo, len); }
  void reset(Qp& qp) override;
  void release(Qp& qp) override;

 private:
  // transmit's step: the WQEs at the head of an idle SQ executed on the peer's memory, until one
  // cannot be; true when any was done.
  bool transmit_direct(Qp& qp, uint64_t now_ns);
  // A SEND of length bytes from the inbox entry slot (or the inbox's data ring) into w: the status of
  // place_message; the ring's bytes are consumed either way.
  WcStatus place_send(Qp& qp, const DirectInboxEntry& slot, const RecvWqe& w, uint32_t length);

  RcPath& rc_;
};

}  // namespace softrdma::transport
