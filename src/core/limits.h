// The limits a softrdma device reports through ibv_query_device(_ex) / ibv_query_port. Each one is a
// real bound of this implementation and is enforced where the object is created or used.
#pragma once
#include <cstdint>

#include "core/mr.h"

namespace softrdma::core {

struct DeviceLimits {
  static constexpr uint32_t kMaxQp = 16384;
  static constexpr uint32_t kMaxQpWr = 16384;       // per send and per receive queue
  static constexpr uint32_t kMaxSge = 32;           // per WQE, send and receive
  static constexpr uint32_t kMaxInline = 256;       // bytes of IBV_SEND_INLINE data
  static constexpr uint32_t kMaxCq = 16384;
  static constexpr uint32_t kMaxCqe = 1u << 20;
  static constexpr uint32_t kMaxMr = MrTable::kMaxMr;
  static constexpr uint64_t kMaxMrSize = 1ull << 40;
  static constexpr uint32_t kMaxPd = 16384;
  static constexpr uint32_t kMaxSrq = 16384;
  static constexpr uint32_t kMaxSrqWr = 16384;      // receive WQEs of one shared receive queue
  static constexpr uint32_t kMaxSrqSge = kMaxSge;
  static constexpr uint32_t kMaxQpRdAtom = 128;     // max_qp_rd_atom == max_qp_init_rd_atom
  static constexpr uint32_t kMaxMsgSize = 1u << 30; // 1 GiB: at MTU 256 that is 2^22 PSNs, a quarter of the PSN space
  static constexpr uint32_t kMaxCompChannelsPerCtx = 1024;
  // Multicast: each group a context joins is one UDP socket (its own copy of every datagram).
  static constexpr uint32_t kMaxMcastGrp = 256;      // groups per context
  static constexpr uint32_t kMaxMcastQpAttach = 64;  // QPs attached to one group
  static constexpr uint32_t kVendorId = 0xFFFFFF;   // as Linux Soft-RoCE: no IEEE OUI of our own
  static constexpr uint32_t kVendorPartId = 0;
  static constexpr uint32_t kHwVer = 0;
};

// Path MTU encoding of IBTA (enum ibv_mtu): 1 = 256 ... 5 = 4096.
constexpr uint32_t mtu_bytes(int mtu_enum) { return mtu_enum >= 1 && mtu_enum <= 5 ? 128u << mtu_enum : 0; }

}  // namespace softrdma::core
