// The initiator side of the direct path (docs/direct-path.md): a DirectPeer is our view of one target
// context (its server's socket, its arena and writable area mapped here, its registered memory mapped
// per share, lazily); a DirectInitiator keeps one per target context, attaches our RC QPs to them
// (direct_connect.cpp: connecting, checking that the server is the target QP's owner, kMap) and executes
// their WQEs on the target's memory (direct_execute.cpp: the data path).
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/mr.h"
#include "transport/direct_gate.h"
#include "transport/direct_layout.h"
#include "transport/qp.h"

namespace softrdma::transport {

// An initiator's view of one target context: its arena mapped here, our busy slot in it, and the
// target's registered memory mapped lazily, per share.
class DirectPeer {
 public:
  struct Mapping {
    uint64_t id, base, length;
    uint8_t* local;
    bool writable;
  };
  int sock = -1;
  int32_t pid = 0;
  const uint8_t* arena = nullptr;  // mapped read-only
  size_t arena_size = 0;
  uint8_t* rw = nullptr;  // the target's writable area: our busy slot, inboxes, CQ arm words
  size_t rw_size = 0;
  DirectPeerSlot* slots = nullptr;
  const DirectShared* shared = nullptr;
  const void* key_table = nullptr;
  const std::atomic<uint64_t>* key_seq = nullptr;
  uint32_t slot = 0;
  bool dead = false;
  bool vm_denied = false;  // process_vm_writev/readv refused (ptrace rules): unshared memory by packets
  uint64_t checked_ns = 0;
  std::vector<Mapping> maps;
  // The last rkey found, valid while the target's key table sequence number is still cached_seq (every
  // change of the table moves it; odd never matches), and the index of its mapping in maps.
  uint64_t cached_seq = 1;
  uint32_t cached_rkey = 0;
  core::MrRegion cached_region{};
  size_t cached_map = ~size_t{0};
  // The same for the last lkey of a receive WQE (odd cached_local_seq: nothing cached).
  uint64_t cached_local_seq = 1;
  core::MrRegion cached_local{};

  ~DirectPeer() {
    for (Mapping& m : maps) munmap(m.local, m.length);
    if (arena) munmap(const_cast<uint8_t*>(arena), arena_size);
    if (rw) munmap(rw, rw_size);
    if (sock >= 0) close(sock);  // the target frees our slot
  }

  // The share's mapping here, if it is mapped (with write access when asked); the last one found first.
  const Mapping* mapped(uint64_t id, bool writable) {
    auto fits = [&](const Mapping& x) { return x.id == id && (x.writable || !writable); };
    if (cached_map < maps.size() && fits(maps[cached_map])) return &maps[cached_map];
    for (size_t i = 0; i < maps.size(); ++i)
      if (fits(maps[i])) {
        cached_map = i;
        return &maps[i];
      }
    return nullptr;
  }

  // The same, mapped now if it is not: the target's server is asked for the fd of the share that
  // rkey lies in (it checks the key grants that access, in the PD of a QP connected to us).
  const Mapping* mapping(uint64_t id, uint32_t rkey, bool writable);
};

enum class DirectResult { Done, Fallback };

// The completion event an initiator raises for the message it just left in a target QP's inbox
// (direct_execute.cpp, wake_if_armed): takes the receive CQ's arm (core::CompletionQueue::kClaimed)
// if that message raises the event, and returns the arm it took (then the caller writes the event's
// byte), else kUnarmed. sent: the inbox's head after the message; tails: the QP's DirectQpDesc::tails,
// whose high half counts the messages the target placed. An arm made after the message was placed
// (the application armed again after polling its CQE) is not taken: no CQE of that message is left to
// raise the event, and the byte would have none behind it -- a waiter woken by it would sleep on.
int claim_event(std::atomic<int>& arm, const std::atomic<uint64_t>& tails, uint32_t sent, bool solicited);

class DirectInitiator {
 public:
  // gate: our policy, which a target's server must pass too; refusals are counted there.
  explicit DirectInitiator(DirectGate& gate) : gate_(gate) {}
  DirectInitiator(const DirectInitiator&) = delete;
  DirectInitiator& operator=(const DirectInitiator&) = delete;

  // (Under the engine lock.) Connects qp to its peer (dest_qpn at dest_ip owned by the process pid
  // at port), or drops the connection when the peer is not another context on this host that serves
  // the direct path.
  void attach(Qp& qp, int32_t pid, uint16_t port);
  void detach(Qp& qp);
  // Executes a WQE of qp on its peer (direct_execute.cpp; DirectEndpoint::execute says what).
  DirectResult execute(Qp& qp, SqEntry& e, uint64_t now);

 private:
  // The initiator's half of attach (a connection, the peer QP's descriptor); EAGAIN: try again later.
  int connect_peer(Qp& qp);
  // A new connection to the target context that owns qp's peer, mapped and checked; 0 or an errno.
  int open_peer(const Qp& qp, int32_t pid, uint16_t port, std::shared_ptr<DirectPeer>* out);
  // qp's peer, connected again first if its server said EAGAIN and a retry is due; now: 0 until read.
  DirectPeer* reconnect_if_due(Qp& qp, uint64_t& now);
  // False when the target process has gone (looked at once a millisecond): the peer is then dead.
  static bool peer_alive(DirectPeer& peer, uint64_t now);
  // For a poster's thread, which passes no time (now 0): much cheaper than the precise clock.
  static uint64_t coarse_now_ns();

  DirectGate& gate_;
  std::unordered_map<uint64_t, std::shared_ptr<DirectPeer>> peers_;  // by (ip << 16 | port)
};

}  // namespace softrdma::transport
