// The verbs side of iWARP QPs (docs/iwarp.md): the rules an RNIC's QPs follow (as siw's), and
// softrdma_iwarp_attach (private_abi.h), by which librdmacm hands a QP its TCP connection once the MPA
// exchange is done: to the engine's iWARP data path, or, when the peer is a softrdma QP of this host,
// to the RC machinery so that the intra-host direct path runs as for RoCE.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "config/config.h"
#include "core/limits.h"
#include "net/interfaces.h"  // wire::IpAddress, as the devices carry it
#include "verbs/private_abi.h"
#include "verbs/qp_state.h"
#include "verbs/soft_objects.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace softrdma::verbs {

// RDMAP carries SEND (with invalidate), RDMA WRITE and RDMA READ: no immediate data, no atomics (RFC
// 7306 is not offered), no memory-window WRs; a READ's sink is one SGE (max_sge_rd 1). EINVAL as siw.
int iwarp_check_send(const transport::SendWqe& w) {
  using transport::WrOp;
  switch (w.op) {
    case WrOp::Send:
    case WrOp::SendInv:
    case WrOp::Write: return 0;
    case WrOp::Read: return w.num_sge > 1 ? EINVAL : 0;
    default: return EINVAL;
  }
}

// An iWARP QP reaches RTR/RTS only through its connection (the iWARP CM moves it, siw refuses RTS
// without a socket); the IB path attributes mean nothing on it and would redirect a connected QP.
int iwarp_check_modify(ibv_qp_state cur, ibv_qp_state next, int mask) {
  if (next == IBV_QPS_RTR && cur != IBV_QPS_RTR) return EINVAL;
  if (next == IBV_QPS_RTS && cur != IBV_QPS_RTS) return EINVAL;
  constexpr int kIbPath = IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_SQ_PSN | IBV_QP_PATH_MIG_STATE | IBV_QP_QKEY;
  return (mask & kIbPath) ? EINVAL : 0;
}

}  // namespace softrdma::verbs

namespace {

// The table's one definition, which the engine's contexts and librdmacm follow too (off under
// SOFTRDMA_IMPAIR).
bool direct_disabled() { return !config::parse().direct; }

// The peer is a softrdma QP of this host: RTR then RTS exactly as a RoCE QP towards it (PSNs 0; IRD
// and ORD as the READ depths), so the engine finds it in the registry and takes the direct path.
// iWARP has no RNR: a receive not yet posted is retried for ever (rnr_retry 7), RC's semantics.
int attach_direct(ibv_qp* qp, const softrdma_iwarp_conn& c, const wire::IpAddress& peer_ip) {
  const uint32_t kMax = core::DeviceLimits::kMaxQpRdAtom;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = iwarp_rc_path_mtu(qp->context);
  a.dest_qp_num = c.peer_qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = static_cast<uint8_t>(std::min(c.ird, kMax));
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.sgid_index = 0;
  std::memcpy(a.ah_attr.grh.dgid.raw, peer_ip.bytes.data(), 16);  // the peer's address as a RoCE GID
  int rc = modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER, true);
  if (rc) return rc;
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTS;
  r.sq_psn = 0;
  r.timeout = 14;
  r.retry_cnt = 7;
  r.rnr_retry = 7;
  r.max_rd_atomic = static_cast<uint8_t>(std::min(c.ord, kMax));
  rc = modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_MAX_QP_RD_ATOMIC, true);
  if (rc) {
    ibv_qp_attr e{};
    e.qp_state = IBV_QPS_ERR;
    modify_qp(qp, &e, IBV_QP_STATE, true);
  }
  return rc;
}

// The connection's FPDUs run in the engine (iw-transport's Engine::iwarp_attach), which owns fd.
int attach_tcp(ibv_qp* qp, const softrdma_iwarp_conn& c, int fd) {
  SoftQp* q = to_qp(qp);
  transport::IwarpAttach a;
  a.fd = fd;
  a.crc = (c.flags & SOFTRDMA_IW_CRC) != 0;
  a.markers_rx = (c.flags & SOFTRDMA_IW_MARKERS_RX) != 0;
  a.markers_tx = (c.flags & SOFTRDMA_IW_MARKERS_TX) != 0;
  a.await_grace = (c.flags & SOFTRDMA_IW_AWAIT_GRACE) != 0;
  a.rtr_hold = (c.flags & SOFTRDMA_IW_RTR_HOLD) != 0;
  switch (c.rtr) {
    case SOFTRDMA_IW_RTR_SEND_WRITE: a.rtr = transport::IwarpRtr::SendWrite; break;
    case SOFTRDMA_IW_RTR_SEND_READ: a.rtr = transport::IwarpRtr::SendRead; break;
    case SOFTRDMA_IW_RTR_SEND_SEND: a.rtr = transport::IwarpRtr::SendSend; break;
    case SOFTRDMA_IW_RTR_AWAIT: a.rtr = transport::IwarpRtr::Await; break;
    case SOFTRDMA_IW_RTR_AWAIT_WRITE: a.rtr = transport::IwarpRtr::AwaitWrite; break;
    case SOFTRDMA_IW_RTR_AWAIT_READ: a.rtr = transport::IwarpRtr::AwaitRead; break;
    case SOFTRDMA_IW_RTR_AWAIT_SEND: a.rtr = transport::IwarpRtr::AwaitSend; break;
    default: a.rtr = transport::IwarpRtr::None; break;
  }
  a.ird = c.ird;
  a.ord = c.ord;
  if (int rc = engine_of(qp->context).iwarp_attach(q->tqp, a)) return rc;
  ibv_qp_attr& s = q->attr;
  s.qp_state = IBV_QPS_RTS;
  s.path_mtu = iwarp_rc_path_mtu(qp->context);
  s.max_dest_rd_atomic = static_cast<uint8_t>(std::min(c.ird, 255u));
  s.max_rd_atomic = static_cast<uint8_t>(std::min(c.ord, 255u));
  qp->state = IBV_QPS_RTS;
  return 0;
}

}  // namespace

SOFTRDMA_EXPORT int softrdma_iwarp_attach(ibv_qp* qp, const softrdma_iwarp_conn* conn) {
  if (!qp || !conn || conn->fd < 0) return EINVAL;
  SoftQp* q = to_qp(qp);
  if (!is_iwarp(qp->context) || qp->qp_type != IBV_QPT_RC || q->xrcd || q->iw_fd >= 0) return EINVAL;
  if (to_ibv(q->tqp->state.load()) != IBV_QPS_INIT) return EINVAL;
  if (conn->rtr > SOFTRDMA_IW_RTR_AWAIT_SEND) return EINVAL;
  if (conn->flags &
      ~uint32_t{SOFTRDMA_IW_CRC | SOFTRDMA_IW_MARKERS_RX | SOFTRDMA_IW_MARKERS_TX | SOFTRDMA_IW_AWAIT_GRACE |
                  SOFTRDMA_IW_RTR_HOLD})
    return EINVAL;
  // A connected stream socket of either family: its peer address names the other end.
  sockaddr_storage peer{};
  socklen_t len = sizeof peer;
  int type = 0;
  socklen_t tlen = sizeof type;
  if (getsockopt(conn->fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0) return errno == ENOTSOCK ? EINVAL : errno;
  if (type != SOCK_STREAM) return EINVAL;
  if (getpeername(conn->fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0)
    return errno == ENOTCONN ? ENOTCONN : EINVAL;
  wire::IpAddress peer_ip;
  if (!wire::from_sockaddr(reinterpret_cast<const sockaddr*>(&peer), &peer_ip)) return EINVAL;
  // Any loopback address, ::1 included, is the loopback device's, whose address is 127.0.0.1: the
  // direct path finds the peer's context by that address.
  if (peer_ip.is_loopback()) peer_ip = wire::IpAddress::v4(htonl(INADDR_LOOPBACK));
  if (conn->peer_qpn > 0xFFFFFF) return EINVAL;  // a QPN has 24 bits, whichever path is taken
  const int fd = fcntl(conn->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return errno;
  if (conn->peer_qpn != 0 && !direct_disabled()) {
    int rc = attach_direct(qp, *conn, peer_ip);
    if (rc) {
      close(fd);
      return rc;
    }
    q->iw_fd = fd;  // carries nothing now but the close; kept until the QP goes
    return 0;
  }
  return attach_tcp(qp, *conn, fd);
}

// The IPv4 address (network order) a device of ours is bound to. An iWARP
// device's GID holds its MAC, so librdmacm finds its device by this instead.
SOFTRDMA_EXPORT uint32_t softrdma_device_ipv4(ibv_device* dev) {
  return dev ? reinterpret_cast<SoftDevice*>(dev)->iface.ip.v4_be() : 0;  // as ibv_get_device_index
}

SOFTRDMA_EXPORT int softrdma_device_ip(ibv_device* dev, uint8_t out[16]) {
  if (!dev || !out) return EINVAL;
  std::memcpy(out, reinterpret_cast<SoftDevice*>(dev)->iface.ip.bytes.data(), 16);
  return 0;
}
