// The RoCE UD/UC path (path.h, datagram.cpp): the unreliable services over RoCEv2 packets through
// the engine's ports. UD and UC QPs join it when they are created. Nothing is retransmitted and
// nothing is acknowledged, so the path keeps no timers; the UC responder runs the RC responder's
// check stages (rc_path.h) with its own PSN rules and drop policy. Multicast groups are the engine's
// ports (Engine::attach_mcast).
#pragma once
#include <cstdint>

#include "transport/path.h"
#include "transport/qp.h"
#include "transport/rc_path.h"
#include "wire/headers.h"

namespace softrdma::transport {

class DatagramPath final : public Path, PathServices {
 public:
  explicit DatagramPath(Engine& e) : PathServices(e) {}

  bool carries(const Qp& qp, const SendWqe& w) const override;
  bool transmit(Qp& qp, uint64_t now_ns) override;
  void deliver(Qp& qp, wire::Packet& pkt, const Arrival& from) override;
  uint64_t next_deadline(const Qp&) const override { return 0; }
  void error(Qp&) override {}
  void flush(Qp&) override {}
  void forget_pointers_into(Qp&, uint64_t, uint64_t) override {}
  void reset(Qp&) override {}
  void release(Qp&) override {}

 private:
  void ud_send(Qp& qp, SqEntry& e);  // transmit's step: e's one UD datagram
  void datagram_receive(Qp& qp, const wire::Packet& pkt, const Arrival& from);
  void uc_receive(Qp& qp, const wire::Packet& pkt);
  void uc_refuse(Qp& qp, const Verdict& v, const wire::OpcodeInfo& info);
};

}  // namespace softrdma::transport
