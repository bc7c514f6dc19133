// Wire protection of RoCE RC and UC QPs' packets (protect.cpp; wire/protect.h, docs/security.md): the
// connection secret installed per QP, the direction keys derived from it at RTR, and the receive-side
// check of a protected packet. The send side seals in RocePorts::send_packet_to with the QP's tx key.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/path.h"
#include "transport/qp.h"
#include "wire/protect.h"

namespace softrdma::transport {

class WireProtection : PathServices {
 public:
  explicit WireProtection(Engine& e) : PathServices(e) {}
  // Installs the connection secret (16 or 32 bytes) an RC or UC QP in RESET or INIT protects its
  // packets with from RTR on (mode Off: none); takes the engine lock. 0, or EINVAL (length, mode,
  // state, QP type: UD, XRC, raw and iWARP QPs carry no protection).
  int set_wire_key(Qp* qp, wire::Protection mode, const uint8_t* secret, size_t len);
  // The CM refused a connection of this device for a protection mismatch (auth_cm_reject).
  void count_wire_reject();

  // Under the engine lock. At RTR, the direction keys from the secret (false: none could be set up);
  // on RESET, all forgotten. open verifies a packet of a protected QP (which has no ICRC: the tag
  // covers it), counts the verdict, and on success points data/len at the packet without its trailer,
  // decrypted.
  bool derive_keys(Qp& qp);
  static void forget_keys(Qp& qp);
  bool open(Qp& qp, const uint8_t*& data, uint32_t& len);

 private:
  std::vector<uint8_t> open_buf_;  // decrypted packets (Encrypt mode), one at a time
};

}  // namespace softrdma::transport
