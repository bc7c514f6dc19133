// Admission to the direct path (direct_gate.h): the peer policy, the credentials of a socket's other
// end, and the private table of our QP connections that every request of a client is checked against.
#include "transport/direct_gate.h"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "net/registry.h"

namespace softrdma::transport {

bool DirectGate::credentials_pass(int fd, int32_t* pid) const {
  ucred cred{};
  socklen_t cl = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.pid <= 0) return false;
  *pid = cred.pid;
  // Root could ptrace us anyway; our own user is who the memory belongs to.
  if (policy_ == PeerPolicy::Any || cred.uid == 0 || cred.uid == geteuid()) return true;
  if (policy_ != PeerPolicy::Group) return false;
  const gid_t ours = getegid();
  if (cred.gid == ours) return true;
  // A member of our primary group by /etc/group (its own primary group may be another).
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* pwp = nullptr;
  group gr{};
  group* grp = nullptr;
  std::vector<char> gbuf(65536);
  if (getpwuid_r(cred.uid, &pw, buf.data(), buf.size(), &pwp) != 0 || !pwp) return false;
  if (getgrgid_r(ours, &gr, gbuf.data(), gbuf.size(), &grp) != 0 || !grp) return false;
  for (char** m = grp->gr_mem; m && *m; ++m)
    if (strcmp(*m, pwp->pw_name) == 0) return true;
  return false;
}

void DirectGate::publish(uint32_t desc, const Qp& qp) {
  std::lock_guard lock(mu_);
  Entry& g = table_[desc];
  g.qpn = qp.qpn;
  g.dest_qpn = qp.cfg.type == QpType::Rc ? qp.dest_qpn : 0;
  g.state = static_cast<uint32_t>(qp.state.load(std::memory_order_relaxed));
  g.pd = qp.cfg.pd;
  g.access = qp.access_flags;
  g.peer_pid = qp.cfg.type == QpType::Rc ? qp.direct.retry_pid : 0;
}

void DirectGate::clear(uint32_t desc) {
  std::lock_guard lock(mu_);
  table_[desc] = Entry{};
}

int DirectGate::admit(Conns& conns, int32_t pid, uint32_t target_qpn, uint32_t initiator_qpn, uint32_t* desc) {
  if (!target_qpn || !initiator_qpn) return EPERM;
  uint32_t i = 0;
  Entry g{};
  {
    std::lock_guard lock(mu_);
    for (; i < DirectShared::kQps; ++i)
      if (table_[i].qpn == target_qpn) break;
    if (i == DirectShared::kQps) return EPERM;
    g = table_[i];
  }
  const auto st = static_cast<QpState>(g.state);
  const bool live = st == QpState::Rtr || st == QpState::Rts || st == QpState::Sqd;
  // Not yet in RTR: its peer may still be on its way to it (either side may reach RTR first).
  if (st == QpState::Reset || st == QpState::Init) return EAGAIN;
  if (!live || g.dest_qpn != initiator_qpn) return EPERM;
  // The client must be the process that owns the initiator QPN, not merely one that knows it: the
  // process our QP found its peer in at RTR (none when its peer is on another host, whatever the registry
  // says of that QPN now), and still the registry's owner of it.
  if (!g.peer_pid || g.peer_pid != pid) return EPERM;
  auto ep = net::Registry::instance().lookup(initiator_qpn);
  if (!ep || ep->pid != pid) return EPERM;
  bool known = false;
  for (Conn& k : conns)
    if (k.desc == i) {
      k = {i, target_qpn, initiator_qpn};  // a reused descriptor: the new connection replaces the old
      known = true;
    }
  if (!known) conns.push_back({i, target_qpn, initiator_qpn});
  *desc = i;
  return 0;
}

bool DirectGate::still_connected(const Conn& k) const {
  const Entry& g = table_[k.desc];
  const auto st = static_cast<QpState>(g.state);
  return g.qpn == k.qpn && g.dest_qpn == k.peer_qpn &&
         (st == QpState::Rtr || st == QpState::Rts || st == QpState::Sqd);
}

bool DirectGate::connected_desc(const Conns& conns, uint32_t target_qpn, uint32_t* desc) {
  std::lock_guard lock(mu_);
  for (const Conn& k : conns)
    if (k.qpn == target_qpn && still_connected(k)) {
      *desc = k.desc;
      return true;
    }
  return false;
}

DirectGate::MapRights DirectGate::map_rights(const Conns& conns, const core::MrRegion& r, uint32_t need) {
  constexpr uint32_t kWriteBits = core::kRemoteWrite | core::kRemoteAtomic;
  MapRights m;
  std::lock_guard lock(mu_);
  for (const Conn& k : conns) {
    if (!still_connected(k) || table_[k.desc].pd != r.pd) continue;
    // One right asked for, granted by both the QP and the MR (not one bit by each).
    if (table_[k.desc].access & r.access & need) m.allowed = true;
    if (table_[k.desc].access & r.access & kWriteBits) m.may_write = true;
  }
  return m;
}

}  // namespace softrdma::transport
