// Counters of one device context, in a shared-memory file so `softrdma stat` can read them live
// from another process (in the spirit of `rdma statistic`). Written only by the owning engine
// under its lock; readers take a racy snapshot, which is fine for monotonic counters.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace softrdma::core {

// One set of counters, kept for the device and for each QP. Fields that happen before a packet is
// matched to a QP (malformed, ICRC, P_Key, unknown QP) stay zero in a QP's set.
// Wire protection (transport/protect.cpp, cm): auth_ok packets whose tag verified; auth_fail tag or
// trailer wrong (forged, tampered, unprotected); auth_replay verified but its counter seen before;
// auth_cm_reject connections refused for a protection mismatch (mode, operator key, MAC).
#define SOFTRDMA_COUNTERS(X)                                                                   \
  X(rx_packets) X(rx_bytes) X(tx_packets) X(tx_bytes) X(retransmits) X(timeouts) X(duplicates)  \
  X(out_of_sequence) X(naks_sent_seq) X(naks_sent_inv_req) X(naks_sent_rem_access)              \
  X(naks_sent_rem_op) X(rnr_naks_sent) X(naks_rcvd_seq) X(naks_rcvd_inv_req)                    \
  X(naks_rcvd_rem_access) X(naks_rcvd_rem_op) X(rnr_naks_rcvd) X(retry_exceeded)                \
  X(rnr_retry_exceeded) X(drop_malformed) X(drop_icrc) X(drop_pkey) X(drop_unknown_qp)          \
  X(drop_bad_opcode) X(drop_bad_state) X(drop_stale_response) X(forwarded)                     \
  X(ud_drop_qkey) X(ud_drop_no_recv) X(ud_send_over_mtu) X(uc_msg_dropped)                                              \
  X(direct_ops) X(direct_bytes) X(direct_fallbacks) X(direct_late_events) X(direct_channel_wakes) X(icrc_solved_ip_id) X(drop_icrc_ip_id) \
  X(icrc_moved_segment) X(peer_port_learned) X(xrc_bad_srqn) X(raw_drop_no_recv) X(raw_drop_filtered)  \
  X(raw_drop_bad_state) X(raw_send_errors) X(tm_expected) X(tm_unexpected) X(tm_rendezvous) X(tm_no_header) \
  SOFTRDMA_IWARP_COUNTERS(X)                                                                  \
  X(drop_src_addr) /* RC/UC packet from an IPv4 source other than the QP's peer (forged or stray) */ \
  X(auth_ok) X(auth_fail) X(auth_replay) X(auth_cm_reject)                                   \
  X(direct_refused) /* local direct-path clients refused: wrong user (SOFTRDMA_DIRECT_PEERS) or no QP connection */ \
  X(direct_bad_inbox) /* inbox entries a connected direct peer wrote that fail their checks (dropped, QP to error) */ \
  X(poll_passes) /* progress passes that empty ibv_poll_cq calls ran in the application's thread (run to completion) */ \
  X(poll_rx_packets) /* packets those passes received, of rx_packets (the rest: the progress thread, posts) */ \
  X(poll_passes_skipped) /* empty polls of one CQ right after another CQ's pass: no pass of their own (engine.h) */ \
  X(acks_held) /* passes of a polling application whose ACKs waited for its answer (engine.h, held_) */ \
  X(acks_held_answered) /* of those, the ones an answer took (its post sent them, after it) */ \
  X(peer_paused) /* retry budgets refilled past retry_cnt: the peer's kernel vouched for its process (reliability.md) */ \
  X(peer_gone) /* requests failed at once: the peer's kernel said its process is gone (refused, reset, closed) */ \
  X(direct_unavailable) /* direct-path set-ups that failed: this context's endpoint, or a connection to a peer's (packets instead) */ \
  X(roce_port_shared) /* this context took the host's UDP 4791 socket from another process's offer (net/port_share.h) */ \
  X(roce_stand_in) /* this context began reading 4791 for a holder that did not (stopped, starved or gone) */ \
  X(cm_dreq_rcvd) /* rdma_cm connections the peer ended with a DREQ (DISCONNECTED; the device's count only) */ \
  X(cm_peer_gone) /* rdma_cm connections ended with no DREQ: the peer's process was found gone (device only) */

// iWARP (transport/iwarp_*.cpp): FPDUs each way, and every refused input by the reason its
// Terminate names (RFC 5040 §4.8, RFC 5041 §7, RFC 5044 §8).
//   iw_tx_fpdus/iw_rx_fpdus  FPDUs written to / parsed from the QP's TCP stream
//   iw_bad_crc        MPA CRC mismatch                 iw_bad_framing   ULPDU length or marker wrong
//   iw_bad_header     DDP/RDMAP version, opcode, tagged flag or a short header
//   iw_bad_qn         untagged queue number unknown or wrong for the opcode
//   iw_bad_msn        MSN out of order                 iw_bad_mo        MO not where the message stands
//   iw_no_recv        SEND with no receive WQE posted  iw_msg_too_long  SEND longer than its receive WQE
//   iw_bad_stag       STag unknown, wrong PD or access iw_bad_bounds    TO/length outside the region
//   iw_ird_exceeded   READ request beyond IRD          iw_bad_response  READ response matching no READ
//   iw_cannot_invalidate  SEND with invalidate of an STag that cannot be invalidated
//   iw_local_error    receive WQE's own buffers failed their check (lkey, LOCAL_WRITE)
//   iw_bad_rtr        peer-to-peer: the first FPDU is not the zero-length RTR agreed (RFC 6581)
//   iw_terminate_sent / iw_terminate_rcvd   Terminate messages   iw_conn_lost  EOF or reset without one
#define SOFTRDMA_IWARP_COUNTERS(X)                                                            \
  X(iw_tx_fpdus) X(iw_rx_fpdus) X(iw_bad_crc) X(iw_bad_framing) X(iw_bad_header) X(iw_bad_qn)   \
  X(iw_bad_msn) X(iw_bad_mo) X(iw_no_recv) X(iw_msg_too_long) X(iw_bad_stag) X(iw_bad_bounds)  \
  X(iw_ird_exceeded) X(iw_bad_response) X(iw_cannot_invalidate) X(iw_local_error) X(iw_bad_rtr) \
  X(iw_terminate_sent) X(iw_terminate_rcvd) X(iw_conn_lost)

struct Counters {
#define SOFTRDMA_FIELD(name) uint64_t name;
  SOFTRDMA_COUNTERS(SOFTRDMA_FIELD)
#undef SOFTRDMA_FIELD
};
// Names in field order, for printing.
const std::vector<const char*>& counter_names();
inline const uint64_t* counter_values(const Counters& c) { return reinterpret_cast<const uint64_t*>(&c); }

struct QpStatsSlot {
  uint32_t qpn;  // 0: free slot
  uint32_t dest_qpn;
  Counters counters;
};

class StatsPage {
 public:
  static constexpr uint32_t kMagic = 0x53524453;  // "SRDS"
  // Bumped whenever Counters or the page layout changes; readers skip other versions.
  static constexpr uint32_t kVersion = 12;
  static constexpr uint32_t kQpSlots = 1024;       // QPs beyond this count only in the device set

  // Creates /dev/shm/softrdma-stats-<pid>-<n>, mode 0600 (owner and root only; SOFTRDMA_STATS_MODE, in
  // octal, widens it to at most 0644); falls back to private memory if that fails. settings: from the
  // environment when the page is created unless given.
  explicit StatsPage(const std::string& device, const config::Settings& settings = config::parse())
      : StatsPage(device, settings.stats_mode) {}
  // mode: SOFTRDMA_STATS_MODE's value (nullopt: owner only).
  StatsPage(const std::string& device, std::optional<uint32_t> mode);
  ~StatsPage();
  StatsPage(const StatsPage&) = delete;
  StatsPage& operator=(const StatsPage&) = delete;

  Counters& device() { return page_->device; }
  // A zeroed slot for a new QP, or nullptr when all are taken.
  Counters* attach_qp(uint32_t qpn);
  void set_dest(uint32_t qpn, uint32_t dest_qpn);
  void detach_qp(uint32_t qpn);
  const std::string& path() const { return path_; }

  // What `softrdma stat` shows: every live context's counters on this host.
  struct Snapshot {
    pid_t pid;
    std::string device;
    Counters device_counters;
    std::vector<QpStatsSlot> qps;
  };
  static std::vector<Snapshot> read_all();
  static size_t page_size();  // a whole page file's size (tests make hostile ones)

 private:
  struct Page {
    uint32_t magic;
    uint32_t version;
    int32_t pid;
    char device_name[64];
    Counters device;
    QpStatsSlot qps[kQpSlots];
  };
  Page* page_ = nullptr;
  bool shared_ = false;
  std::string path_;
};

}  // namespace softrdma::core
