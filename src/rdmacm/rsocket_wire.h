// rdma-core's rsocket wire protocol (librdmacm/rsocket.c, protocol version 1), as an rsocket of
// rdma-core's librdmacm expects it from its peer: the connection private data, the immediate data
// of each RDMA WRITE WITH IMMEDIATE, the SGL entries that grant receive buffer space, the iomap
// entries, and the datagram header. Layouts and values only; src/rdmacm/rsocket.cpp runs them.
#pragma once
#include <cstdint>

namespace softrdma::rsock {

inline constexpr uint8_t kVersion = 1;

// The immediate data: bits 31..29 the operation, bits 28..0 its argument (a DATA's length, the new
// credit limit of an SGL update, an IOMAP_SGL's index, a CTRL's code).
enum Op : uint32_t {
  kOpData = 0,
  kOpWrite = 2,  // riowrite: never on the wire, only the local completion's tag
  kOpSgl = 4,
  kOpIomapSgl = 6,
  kOpCtrl = 7,
};
enum Ctrl : uint32_t { kCtrlDisconnect = 0, kCtrlKeepalive = 1, kCtrlShutdown = 2 };

inline constexpr uint32_t kMsgDataMask = 0x1FFFFFFF;
constexpr uint32_t msg(uint32_t op, uint32_t data) { return op << 29 | (data & kMsgDataMask); }
constexpr uint32_t msg_op(uint32_t m) { return m >> 29; }
constexpr uint32_t msg_data(uint32_t m) { return m & kMsgDataMask; }

// A buffer the peer may write: written by RDMA WRITE into the peer's target SGL (two entries, used
// in turn) in the writer's byte order (kConnFlagNet tells the reader when to swap).
struct Sge {
  uint64_t addr;
  uint32_t key;
  uint32_t length;
};
static_assert(sizeof(Sge) == 16);

// One riomap'd region, written into the peer's iomap table (after its two SGL entries).
struct Iomap {
  uint64_t offset;
  Sge sge;
};
static_assert(sizeof(Iomap) == 24);

inline constexpr uint8_t kConnFlagNet = 1 << 0;    // the sender is big-endian
inline constexpr uint8_t kConnFlagIomap = 1 << 1;  // target_iomap_size is meaningful

// The REQ's and the REP's private data (AF_INET/AF_INET6: at offset 0). Multi-byte fields big-endian.
struct ConnData {
  uint8_t version;
  uint8_t flags;
  uint16_t credits_be;  // the sender's receive queue size: messages the peer may send before an SGL update
  uint8_t reserved[3];
  uint8_t target_iomap_size;  // scaled (scale_of)
  Sge target_sgl;             // where the peer writes SGL updates; length = entries (2)
  Sge data_buf;               // the first half of the sender's receive buffer
};
static_assert(sizeof(ConnData) == 40);

inline constexpr uint32_t kSglSize = 2;  // entries of the target SGL

// An 8-bit scaled size: values up to 128 as they are, larger ones as 128 | (value >> 8).
constexpr int scale_of(int value, int bits) {
  return value <= (1 << (bits - 1)) ? value : (1 << (bits - 1)) | (value >> bits);
}
constexpr int value_of(int scale, int bits) {
  return scale <= (1 << (bits - 1)) ? scale : (scale & ~(1 << (bits - 1))) << bits;
}

// Datagram rsockets: each UD message (a SEND with Q_Key RDMA_UDP_QKEY) starts with this header,
// the address and UDP port of the sender's rsocket.
struct DgramHeader {
  uint8_t version;  // 4 or 6
  uint8_t length;   // 8 or 24
  uint16_t port_be;
  union {
    uint32_t ipv4;
    struct {
      uint32_t flowinfo;
      uint8_t addr[16];
    } ipv6;
  } addr;
};
static_assert(sizeof(DgramHeader) == 24);
inline constexpr uint8_t kDgramIpv4HdrLen = 8;
inline constexpr uint8_t kDgramIpv6HdrLen = 24;
inline constexpr uint32_t kDgramMsgSize = 2048;  // a UD message slot: header and payload

// Datagram rsockets reach a peer over its UDP socket until they know its QP: the first message
// (op kOpData, the payload follows) or the answer to one (op kOpCtrl, no payload) carries this
// header, which names the sender's UD QP and the address it sends from.
struct UdpHeader {
  uint32_t tag_be;  // kUdpTag
  uint8_t version;  // 4 or 6
  uint8_t op;
  uint8_t length;  // kUdpIpv4HdrLen or kUdpIpv6HdrLen
  uint8_t reserved;
  uint32_t qpn_be;  // low 24 bits
  union {
    uint32_t ipv4;
    uint8_t ipv6[16];
  } addr;
};
static_assert(sizeof(UdpHeader) == 28);
inline constexpr uint32_t kUdpTag = 0x55555555;
inline constexpr uint8_t kUdpIpv4HdrLen = 16;
inline constexpr uint8_t kUdpIpv6HdrLen = 28;

}  // namespace softrdma::rsock
