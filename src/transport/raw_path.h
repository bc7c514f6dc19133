// The raw-packet path (raw.cpp): RAW_PACKET QPs join it when they are created. RawPath is the path
// object (path.h): each send WQE is one whole Ethernet frame on the QP's AF_PACKET port, and the
// frames that the QP's flows match fill its receive WQEs, or those of the WQ its RSS table picks.
// RawState is its state of one QP: the port and the flows.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "net/frame_filter.h"
#include "net/raw_port.h"
#include "transport/path.h"
#include "transport/qp.h"
#include "transport/raw.h"

namespace softrdma::transport {

struct RawState final : PathState {
  std::unique_ptr<net::RawPort> port;
  std::vector<std::pair<uint32_t, net::FrameRule>> flows;  // (handle, rule)
  uint32_t next_flow = 1;
};

// Whether flows are still attached to the QP (ibv_destroy_qp waits for ibv_destroy_flow).
bool raw_has_flows(const Qp& qp);

class RawPath final : public Path, private PathServices {
 public:
  explicit RawPath(Engine& e) : PathServices(e) {}

  // A RAW_PACKET QP being created joins the path: its AF_PACKET port on the device's interface, which
  // needs CAP_NET_RAW. 0 or an errno (EPERM).
  int join(Qp& qp);
  // The verbs layer's RAW_PACKET calls (Engine::raw()); each takes the engine lock where it needs it.
  // Flow steering: the QP receives the frames some rule of its matches. 0 or an errno.
  int attach_flow(Qp& qp, const net::FrameRule& rule, uint32_t* handle);
  int detach_flow(Qp& qp, uint32_t handle);
  // Receive work queues for RSS QPs. create_wq returns nullptr (errno set) on failure; destroy_wq
  // needs the WQ to be in no indirection table any more (the verbs layer counts).
  Wq* create_wq(uint32_t pd, core::CompletionQueue* cq, uint32_t max_wr, uint32_t max_sge);
  int modify_wq(Wq& wq, WqState state);
  void destroy_wq(Wq* wq);
  int post_wq_recv(Wq& wq, const RecvWqe* wqes, int n, int* bad);

  bool carries(const Qp& qp, const SendWqe& w) const override;
  // Sends each WQE as one frame.
  bool transmit(Qp& qp, uint64_t now_ns) override;
  // A RoCE packet for this QP: not its wire.
  void deliver(Qp& qp, wire::Packet&, const Arrival&) override {
    count(&qp, &core::Counters::drop_bad_opcode);
  }
  bool receiving() const override { return rx_qps_ != 0; }
  // The frames the QP's port received.
  bool receive(Qp& qp) override;
  uint64_t next_deadline(const Qp&) const override { return 0; }
  void error(Qp&) override {}
  void flush(Qp&) override {}
  void forget_pointers_into(Qp&, uint64_t, uint64_t) override {}
  void reset(Qp&) override {}  // the port and the flows stay
  void release(Qp& qp) override;

 private:
  static RawState& state(Qp& qp) { return static_cast<RawState&>(*qp.path_state); }
  void raw_deliver(Qp& qp, const net::FrameView& f);
  // Places a frame into the next WQE of rq and completes it into cq as qp_num; false: none posted.
  bool raw_place(WorkQueue<RecvWqe>& rq, uint32_t pd, core::CompletionQueue* cq, uint32_t qp_num,
                 const net::FrameView& f, Qp* counted, WcStatus* status);
  void flush_wq(Wq& wq);

  std::vector<Wq*> wqs_;
  uint32_t next_wqn_ = 1;
  uint32_t rx_qps_ = 0;  // QPs with flows (progress passes look at their ports)
  std::vector<uint8_t> raw_buf_;
};

}  // namespace softrdma::transport
