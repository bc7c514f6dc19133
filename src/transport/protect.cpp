// Wire protection of a QP's packets (protect.h, wire/protect.h, docs/security.md): the secret an
// application or librdmacm installs, the direction keys derived from it at RTR, and the receive-side
// check: tag, then replay window, before the packet is parsed. The send side seals in
// RocePorts::send_packet_to.
#include "transport/protect.h"

#include <openssl/crypto.h>

#include <cerrno>
#include <cstring>

#include "transport/engine.h"
#include "wire/headers.h"
#include "wire/opcode.h"

namespace softrdma::transport {

int WireProtection::set_wire_key(Qp* qp, wire::Protection mode, const uint8_t* secret, size_t len) {
  if (mode != wire::Protection::Off && mode != wire::Protection::Auth && mode != wire::Protection::Encrypt)
    return EINVAL;
  if (mode != wire::Protection::Off && (!secret || (len != 16 && len != 32))) return EINVAL;
  std::lock_guard lock(engine_lock());
  if (qp->cfg.type != QpType::Rc && qp->cfg.type != QpType::Uc) return EINVAL;
  if (qp->cfg.xrc != XrcRole::None || qp->on_path()) return EINVAL;  // iWARP
  const QpState st = qp->state.load(std::memory_order_relaxed);
  if (st != QpState::Reset && st != QpState::Init) return EINVAL;
  forget_keys(*qp);
  if (mode == wire::Protection::Off) return 0;
  qp->prot = std::make_unique<Qp::WireProtect>();
  qp->prot->mode = mode;
  std::memcpy(qp->prot->secret, secret, len);
  qp->prot->secret_len = static_cast<uint8_t>(len);
  return 0;
}

void WireProtection::count_wire_reject() {
  std::lock_guard lock(engine_lock());
  count(nullptr, &core::Counters::auth_cm_reject);
}

bool WireProtection::derive_keys(Qp& qp) {
  if (!qp.prot || qp.prot->tx) return true;
  wire::DirectionKey out{}, in{};
  auto tx = std::make_unique<wire::PacketCipher>();
  auto rx = std::make_unique<wire::PacketCipher>();
  const bool ok =
      wire::derive_direction_key(qp.prot->secret, qp.prot->secret_len, qp.prot->mode, iface().ip, qp.qpn,
                                 qp.dest_ip, qp.dest_qpn, &out) &&
      wire::derive_direction_key(qp.prot->secret, qp.prot->secret_len, qp.prot->mode, qp.dest_ip, qp.dest_qpn,
                                 iface().ip, qp.qpn, &in) &&
      tx->init(qp.prot->mode, out, true) && rx->init(qp.prot->mode, in, false);
  OPENSSL_cleanse(&out, sizeof out);
  OPENSSL_cleanse(&in, sizeof in);
  if (!ok) return false;
  qp.prot->tx = std::move(tx);
  qp.prot->rx = std::move(rx);
  qp.prot->tx_counter = 0;
  qp.prot->replay = {};
  return true;
}

void WireProtection::forget_keys(Qp& qp) {
  if (!qp.prot) return;
  OPENSSL_cleanse(qp.prot->secret, sizeof qp.prot->secret);
  qp.prot.reset();
}

bool WireProtection::open(Qp& qp, const uint8_t*& data, uint32_t& len) {
  const wire::OpcodeInfo& info = wire::opcode_info(data[0]);
  const uint32_t hdr = info.header_len;
  if (!info.valid || len < hdr + wire::kProtectTrailerLen + wire::kIcrcLen) {
    count(&qp, &core::Counters::auth_fail);
    return false;
  }
  const uint32_t body = len - hdr - static_cast<uint32_t>(wire::kProtectTrailerLen) - wire::kIcrcLen;
  uint64_t counter = 0;
  const bool encrypted = qp.prot->rx->mode() == wire::Protection::Encrypt;
  uint8_t* out = nullptr;
  if (encrypted) {
    if (open_buf_.size() < len) open_buf_.resize(len);
    out = open_buf_.data();
    std::memcpy(out, data, hdr);
  }
  if (!qp.prot->rx->open(data, hdr, body, encrypted ? out + hdr : nullptr, &counter)) {
    count(&qp, &core::Counters::auth_fail);
    return false;
  }
  // A genuine packet seen before (captured and sent again): its PSN may well be acceptable, its
  // counter is not.
  if (!qp.prot->replay.fresh(counter)) {
    count(&qp, &core::Counters::auth_replay);
    return false;
  }
  qp.prot->replay.accept(counter);
  count(&qp, &core::Counters::auth_ok);
  if (encrypted) {
    std::memset(out + hdr + body, 0, wire::kIcrcLen);  // parse_packet reads no ICRC, but wants its room
    data = out;
  }
  len = hdr + body + wire::kIcrcLen;
  return true;
}

}  // namespace softrdma::transport
