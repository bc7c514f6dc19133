// IBTA CM MADs (vol. 1 ch. 12 messages in the ch. 13 MAD format) and the RoCEv2 datagrams that carry
// them to QP1 (GSI), plus the rdma_cm IP private-data header. Pure functions: no I/O, no allocation.
// Field positions follow IBTA's tables: a field at (byte, bit) starts at that bit counted from the most
// significant bit of the byte and runs toward less significant bits, big-endian across bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "wire/ip_address.h"
#include "wire/opcode.h"  // kUdSendOnly

namespace softrdma::wire {

inline constexpr size_t kMadLen = 256;
inline constexpr size_t kMadHeaderLen = 24;
inline constexpr size_t kCmDataLen = kMadLen - kMadHeaderLen;  // 232
inline constexpr uint8_t kMgmtClassCm = 0x07;
inline constexpr uint8_t kCmClassVersion = 2;
inline constexpr uint8_t kMadMethodSend = 0x03;
inline constexpr uint32_t kGsiQkey = 0x80010000;
inline constexpr uint32_t kGsiQpn = 1;
// BTH + DETH + MAD + ICRC.
inline constexpr size_t kGsiPacketLen = 12 + 8 + kMadLen + 4;

enum class CmAttr : uint16_t {
  Req = 0x0010, Mra = 0x0011, Rej = 0x0012, Rep = 0x0013, Rtu = 0x0014, Dreq = 0x0015, Drep = 0x0016,
  SidrReq = 0x0017, SidrRep = 0x0018,
};

// Private data sizes per message (IBTA tables 106-120).
inline constexpr size_t kReqPrivateLen = 92, kRepPrivateLen = 196, kRejPrivateLen = 148, kRtuPrivateLen = 224,
                        kDreqPrivateLen = 220, kDrepPrivateLen = 224, kMraPrivateLen = 222,
                        kSidrReqPrivateLen = 216, kSidrRepPrivateLen = 136;

// REJ reasons (IBTA table 109) that rdma_cm peers produce.
enum CmRejReason : uint16_t {
  kRejNoQp = 1, kRejTimeout = 4, kRejInvalidCommId = 6, kRejInvalidServiceId = 8, kRejStaleConn = 10,
  kRejConsumerDefined = 28,
};
// REJ/MRA "message rejected/MRAed" codes.
enum : uint8_t { kMsgReq = 0, kMsgRep = 1, kMsgOther = 2 };

struct MadHeader {
  uint8_t base_version = 1;
  uint8_t mgmt_class = kMgmtClassCm;
  uint8_t class_version = kCmClassVersion;
  uint8_t method = kMadMethodSend;
  uint16_t status = 0;
  uint16_t class_specific = 0;
  uint64_t tid = 0;
  uint16_t attr_id = 0;
  uint32_t attr_mod = 0;
};

struct CmPath {
  uint16_t local_lid = 0xFFFF, remote_lid = 0xFFFF;  // RoCE has no LIDs: the permissive LID
  uint8_t local_gid[16] = {}, remote_gid[16] = {};
  uint32_t flow_label = 0;
  uint8_t packet_rate = 0, traffic_class = 0, hop_limit = 0, sl = 0;
  bool subnet_local = false;
  uint8_t local_ack_timeout = 0;
};

struct CmReq {
  uint32_t local_comm_id = 0;
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;  // network order, as ibv_device_attr.node_guid
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;
  uint8_t responder_resources = 0, initiator_depth = 0;
  uint8_t remote_cm_response_timeout = 0;
  uint8_t transport_service_type = 0;  // 0 RC, 1 UC, 3 XRC-ext
  bool e2e_flow_control = false;
  uint32_t starting_psn = 0;
  uint8_t local_cm_response_timeout = 0;
  uint8_t retry_count = 0;
  uint16_t pkey = 0xFFFF;
  uint8_t path_mtu = 0;  // enum ibv_mtu
  uint8_t rnr_retry_count = 0;
  uint8_t max_cm_retries = 0;
  bool srq = false;
  CmPath primary;
  uint8_t private_data[kReqPrivateLen] = {};
};

struct CmRep {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;
  uint32_t starting_psn = 0;
  uint8_t responder_resources = 0, initiator_depth = 0;
  uint8_t target_ack_delay = 0;
  uint8_t failover_accepted = 0;
  bool e2e_flow_control = false;
  uint8_t rnr_retry_count = 0;
  bool srq = false;
  uint64_t local_ca_guid = 0;  // network order
  uint8_t private_data[kRepPrivateLen] = {};
};

struct CmRej {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t message_rejected = kMsgReq;
  uint8_t ari_length = 0;
  uint16_t reason = 0;
  uint8_t ari[72] = {};
  uint8_t private_data[kRejPrivateLen] = {};
};

struct CmMra {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t message_mraed = kMsgReq;
  uint8_t service_timeout = 0;
  uint8_t private_data[kMraPrivateLen] = {};
};

// RTU, DREQ and DREP: comm IDs and private data (DREQ also names the remote QPN).
struct CmSimple {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint32_t remote_qpn = 0;  // DREQ only
  uint8_t private_data[kDreqPrivateLen + 4] = {};  // the largest of the three (224)
};

struct CmSidrReq {
  uint32_t request_id = 0;
  uint16_t pkey = 0xFFFF;
  uint64_t service_id = 0;
  uint8_t private_data[kSidrReqPrivateLen] = {};
};

struct CmSidrRep {
  uint32_t request_id = 0;
  uint8_t status = 0;  // 0 = valid QP
  uint32_t qpn = 0;
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  uint8_t private_data[kSidrRepPrivateLen] = {};
};

// Every encoder writes the whole 256-byte MAD (header included; reserved bytes zero).
void encode_mad_header(const MadHeader& h, uint8_t* mad);
bool decode_mad_header(const uint8_t* mad, size_t len, MadHeader& h);  // false: not a CM MAD
void encode_req(const MadHeader& h, const CmReq& m, uint8_t* mad);
void encode_rep(const MadHeader& h, const CmRep& m, uint8_t* mad);
void encode_rej(const MadHeader& h, const CmRej& m, uint8_t* mad);
void encode_mra(const MadHeader& h, const CmMra& m, uint8_t* mad);
void encode_simple(const MadHeader& h, const CmSimple& m, uint8_t* mad);  // h.attr_id picks RTU/DREQ/DREP
void encode_sidr_req(const MadHeader& h, const CmSidrReq& m, uint8_t* mad);
void encode_sidr_rep(const MadHeader& h, const CmSidrRep& m, uint8_t* mad);
void decode_req(const uint8_t* mad, CmReq& m);
void decode_rep(const uint8_t* mad, CmRep& m);
void decode_rej(const uint8_t* mad, CmRej& m);
void decode_mra(const uint8_t* mad, CmMra& m);
void decode_simple(const uint8_t* mad, uint16_t attr_id, CmSimple& m);
void decode_sidr_req(const uint8_t* mad, CmSidrReq& m);
void decode_sidr_rep(const uint8_t* mad, CmSidrRep& m);

// The comm ID a message is addressed to at its receiver: REQ/SIDR_REQ have none (0, routed by service ID),
// SIDR_REP names the request ID, the others the "remote comm ID".
uint32_t cm_destination_comm_id(const uint8_t* mad, uint16_t attr_id);
uint64_t cm_service_id(const uint8_t* mad, uint16_t attr_id);  // REQ / SIDR_REQ, else 0

// IP-based CM service IDs (IBTA Annex A11): 0x0000000001 | port space (16) | port (16).
inline constexpr uint64_t kIpServiceIdBase = 0x0000000001000000ull;
inline constexpr uint64_t ip_service_id(uint16_t port_space, uint16_t port) {
  return kIpServiceIdBase | (uint64_t{port_space} << 16) | port;
}
inline constexpr bool is_ip_service_id(uint64_t sid) { return (sid & 0xFFFFFFFFFF000000ull) == kIpServiceIdBase; }

// The rdma_cm IP header at the start of REQ and SIDR_REQ private data (Annex A11): version 0, IP version
// in the upper nibble, the active side's port, then source and destination addresses (16 bytes each;
// IPv4 in the last 4 of them, the rest zero). The version follows the addresses' family.
inline constexpr size_t kCmaHeaderLen = 36;
struct CmaIpHeader {
  uint8_t ip_version = 4;
  uint16_t src_port = 0;
  IpAddress src_ip, dst_ip;
};
void encode_cma_header(const CmaIpHeader& h, uint8_t* out);
bool decode_cma_header(const uint8_t* in, CmaIpHeader& h);  // false: not version 0 / IPv4 or IPv6

// A RoCEv2 UD SEND_ONLY from QP1 to QP1 (BTH, DETH with the GSI Q_Key, the MAD, ICRC computed over the
// given addresses). out must hold kGsiPacketLen bytes; returns kGsiPacketLen.
size_t build_gsi_packet(const IpAddress& src_ip, const IpAddress& dst_ip, uint16_t src_port, uint16_t dst_port,
                        uint32_t psn, const uint8_t* mad, uint8_t* out);
// Checks the transport framing of a GSI datagram (not the ICRC): opcode, QP1, Q_Key, a full MAD.
// Returns the MAD or nullptr.
const uint8_t* gsi_mad(const uint8_t* pkt, size_t len);

}  // namespace softrdma::wire
