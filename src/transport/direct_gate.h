// Admission to the direct path (docs/security.md, "Local isolation"): who may talk to our server at all
// (SO_PEERCRED against SOFTRDMA_DIRECT_PEERS), which QP connections a client takes part in (our RC QP in
// RTR/RTS/SQD towards its QPN, whose peer was found in the client's process at RTR, and the registry's
// owner of that QPN), and which shares it may map. The server thread decides from a private table kept
// here under its own mutex, which the QP lifecycle hooks update under the engine lock; never from the
// arena, which peers can write. An initiator checks a server's credentials here too. Everything refused
// is counted (direct_refused).
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "config/config.h"
#include "core/mr.h"
#include "core/stats.h"
#include "transport/direct_layout.h"
#include "transport/qp.h"

namespace softrdma::transport {

class DirectGate {
 public:
  // Who may talk to our server at all (SOFTRDMA_DIRECT_PEERS, the context's option).
  using PeerPolicy = config::DirectPeers;

  // One QP connection a client proved: our QP's descriptor, its QPN and the client's QPN (a descriptor
  // reused by another QP is not that connection).
  struct Conn {
    uint32_t desc, qpn, peer_qpn;
  };
  using Conns = std::vector<Conn>;

  // counters: the context's device counters (direct_refused is added there atomically).
  DirectGate(core::Counters* counters, PeerPolicy policy) : counters_(counters), policy_(policy) {}
  DirectGate(const DirectGate&) = delete;
  DirectGate& operator=(const DirectGate&) = delete;

  // The process at the other end of the Unix socket fd passes our policy; its pid in *pid.
  bool credentials_pass(int fd, int32_t* pid) const;
  void refused() { __atomic_fetch_add(&counters_->direct_refused, 1, __ATOMIC_RELAXED); }
  // A connection to a peer's endpoint failed for another reason than its QP not being in RTR yet.
  void unavailable() { __atomic_fetch_add(&counters_->direct_unavailable, 1, __ATOMIC_RELAXED); }

  // Under the engine lock: what the server may rely on for the QP with descriptor desc; clear: nothing.
  void publish(uint32_t desc, const Qp& qp);
  void clear(uint32_t desc);

  // 0 and the descriptor when our QP target_qpn is connected to initiator_qpn, owned by the process pid
  // (the connection is then recorded in conns); EAGAIN while our QP is not yet in RTR; else EPERM.
  int admit(Conns& conns, int32_t pid, uint32_t target_qpn, uint32_t initiator_qpn, uint32_t* desc);
  // The descriptor of our QP target_qpn while it is still connected to the client of conns.
  bool connected_desc(const Conns& conns, uint32_t target_qpn, uint32_t* desc);
  // For a share of region r, asked with the rights need: allowed when a QP of conns still connected, in
  // r's PD, grants one right of need that r grants too (not one bit by each); may_write when such a QP
  // and r both grant a right to write (then the share's writable file may be given).
  struct MapRights {
    bool allowed = false, may_write = false;
  };
  MapRights map_rights(const Conns& conns, const core::MrRegion& r, uint32_t need);

 private:
  // What the server thread may rely on for one QP descriptor.
  struct Entry {
    uint32_t qpn = 0;  // 0: none
    uint32_t dest_qpn = 0;
    uint32_t state = 0;  // QpState
    uint32_t pd = 0;
    uint32_t access = 0;
    int32_t peer_pid = 0;  // the local process its peer QP belonged to at RTR (0: none here)
  };
  // Under mu_: the descriptor still holds that connection, live.
  bool still_connected(const Conn& k) const;

  core::Counters* counters_;
  PeerPolicy policy_;
  std::mutex mu_;
  Entry table_[DirectShared::kQps];
};

}  // namespace softrdma::transport
