#include "wire/cm_mad.h"

#include <cstring>

#include "wire/headers.h"
#include "wire/icrc.h"

namespace softrdma::wire {
namespace {

// Byte-aligned big-endian field of n bytes.
void put_be(uint8_t* p, size_t n, uint64_t v) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * (n - 1 - i)));
}
uint64_t get_be(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}
// A field inside one byte: starts bit_off bits below the byte's MSB, width bits wide.
void put_bits(uint8_t* p, int bit_off, int width, uint32_t v) {
  const int shift = 8 - bit_off - width;
  const uint8_t mask = static_cast<uint8_t>(((1u << width) - 1) << shift);
  *p = static_cast<uint8_t>((*p & ~mask) | ((v << shift) & mask));
}
uint8_t get_bits(const uint8_t* p, int bit_off, int width) {
  return static_cast<uint8_t>((*p >> (8 - bit_off - width)) & ((1u << width) - 1));
}

uint8_t* cm(uint8_t* mad) { return mad + kMadHeaderLen; }
const uint8_t* cm(const uint8_t* mad) { return mad + kMadHeaderLen; }

void start(const MadHeader& h, uint8_t* mad) {
  std::memset(mad, 0, kMadLen);
  encode_mad_header(h, mad);
}

void encode_path(const CmPath& p, uint8_t* d) {  // d = first byte of the path (REQ offset 52)
  put_be(d + 0, 2, p.local_lid);
  put_be(d + 2, 2, p.remote_lid);
  std::memcpy(d + 4, p.local_gid, 16);
  std::memcpy(d + 20, p.remote_gid, 16);
  put_be(d + 36, 3, (uint64_t{p.flow_label} & 0xFFFFF) << 4);
  put_bits(d + 39, 2, 6, p.packet_rate);
  d[40] = p.traffic_class;
  d[41] = p.hop_limit;
  put_bits(d + 42, 0, 4, p.sl);
  put_bits(d + 42, 4, 1, p.subnet_local);
  put_bits(d + 43, 0, 5, p.local_ack_timeout);
}
void decode_path(const uint8_t* d, CmPath& p) {
  p.local_lid = static_cast<uint16_t>(get_be(d, 2));
  p.remote_lid = static_cast<uint16_t>(get_be(d + 2, 2));
  std::memcpy(p.local_gid, d + 4, 16);
  std::memcpy(p.remote_gid, d + 20, 16);
  p.flow_label = static_cast<uint32_t>(get_be(d + 36, 3) >> 4);
  p.packet_rate = get_bits(d + 39, 2, 6);
  p.traffic_class = d[40];
  p.hop_limit = d[41];
  p.sl = get_bits(d + 42, 0, 4);
  p.subnet_local = get_bits(d + 42, 4, 1);
  p.local_ack_timeout = get_bits(d + 43, 0, 5);
}

}  // namespace

void encode_mad_header(const MadHeader& h, uint8_t* mad) {
  mad[0] = h.base_version;
  mad[1] = h.mgmt_class;
  mad[2] = h.class_version;
  mad[3] = h.method;
  put_be(mad + 4, 2, h.status);
  put_be(mad + 6, 2, h.class_specific);
  put_be(mad + 8, 8, h.tid);
  put_be(mad + 16, 2, h.attr_id);
  put_be(mad + 18, 2, 0);
  put_be(mad + 20, 4, h.attr_mod);
}

bool decode_mad_header(const uint8_t* mad, size_t len, MadHeader& h) {
  if (len < kMadLen) return false;
  h.base_version = mad[0];
  h.mgmt_class = mad[1];
  h.class_version = mad[2];
  h.method = mad[3];
  h.status = static_cast<uint16_t>(get_be(mad + 4, 2));
  h.class_specific = static_cast<uint16_t>(get_be(mad + 6, 2));
  h.tid = get_be(mad + 8, 8);
  h.attr_id = static_cast<uint16_t>(get_be(mad + 16, 2));
  h.attr_mod = static_cast<uint32_t>(get_be(mad + 20, 4));
  return h.base_version == 1 && h.mgmt_class == kMgmtClassCm && h.class_version == kCmClassVersion;
}

void encode_req(const MadHeader& h, const CmReq& m, uint8_t* mad) {
  start(h, mad);
  uint8_t* d = cm(mad);
  put_be(d + 0, 4, m.local_comm_id);
  put_be(d + 8, 8, m.service_id);
  std::memcpy(d + 16, &m.local_ca_guid, 8);
  put_be(d + 28, 4, m.local_qkey);
  put_be(d + 32, 3, m.local_qpn);
  d[35] = m.responder_resources;
  d[39] = m.initiator_depth;
  put_bits(d + 43, 0, 5, m.remote_cm_response_timeout);
  put_bits(d + 43, 5, 2, m.transport_service_type);
  put_bits(d + 43, 7, 1, m.e2e_flow_control);
  put_be(d + 44, 3, m.starting_psn);
  put_bits(d + 47, 0, 5, m.local_cm_response_timeout);
  put_bits(d + 47, 5, 3, m.retry_count);
  put_be(d + 48, 2, m.pkey);
  put_bits(d + 50, 0, 4, m.path_mtu);
  put_bits(d + 50, 5, 3, m.rnr_retry_count);
  put_bits(d + 51, 0, 4, m.max_cm_retries);
  put_bits(d + 51, 4, 1, m.srq);
  encode_path(m.primary, d + 52);
  std::memcpy(d + 140, m.private_data, kReqPrivateLen);
}

void decode_req(const uint8_t* mad, CmReq& m) {
  const uint8_t* d = cm(mad);
  m.local_comm_id = static_cast<uint32_t>(get_be(d, 4));
  m.service_id = get_be(d + 8, 8);
  std::memcpy(&m.local_ca_guid, d + 16, 8);
  m.local_qkey = static_cast<uint32_t>(get_be(d + 28, 4));
  m.local_qpn = static_cast<uint32_t>(get_be(d + 32, 3));
  m.responder_resources = d[35];
  m.initiator_depth = d[39];
  m.remote_cm_response_timeout = get_bits(d + 43, 0, 5);
  m.transport_service_type = get_bits(d + 43, 5, 2);
  m.e2e_flow_control = get_bits(d + 43, 7, 1);
  m.starting_psn = static_cast<uint32_t>(get_be(d + 44, 3));
  m.local_cm_response_timeout = get_bits(d + 47, 0, 5);
  m.retry_count = get_bits(d + 47, 5, 3);
  m.pkey = static_cast<uint16_t>(get_be(d + 48, 2));
  m.path_mtu = get_bits(d + 50, 0, 4);
  m.rnr_retry_count = get_bits(d + 50, 5, 3);
  m.max_cm_retries = get_bits(d + 51, 0, 4);
  m.srq = get_bits(d + 51, 4, 1);
  decode_path(d + 52, m.primary);
  std::memcpy(m.private_data, d + 140, kReqPrivateLen);
}

void encode_rep(const MadHeader& h, const CmRep& m, uint8_t* mad) {
  start(h, mad);
  uint8_t* d = cm(mad);
  put_be(d + 0, 4, m.local_comm_id);
  put_be(d + 4, 4, m.remote_comm_id);
  put_be(d + 8, 4, m.local_qkey);
  put_be(d + 12, 3, m.local_qpn);
  put_be(d + 20, 3, m.starting_psn);
  d[24] = m.responder_resources;
  d[25] = m.initiator_depth;
  put_bits(d + 26, 0, 5, m.target_ack_delay);
  put_bits(d + 26, 5, 2, m.failover_accepted);
  put_bits(d + 26, 7, 1, m.e2e_flow_control);
  put_bits(d + 27, 0, 3, m.rnr_retry_count);
  put_bits(d + 27, 3, 1, m.srq);
  std::memcpy(d + 28, &m.local_ca_guid, 8);
  std::memcpy(d + 36, m.private_data, kRepPrivateLen);
}

void decode_rep(const uint8_t* mad, CmRep& m) {
  const uint8_t* d = cm(mad);
  m.local_comm_id = static_cast<uint32_t>(get_be(d, 4));
  m.remote_comm_id = static_cast<uint32_t>(get_be(d + 4, 4));
  m.local_qkey = static_cast<uint32_t>(get_be(d + 8, 4));
  m.local_qpn = static_cast<uint32_t>(get_be(d + 12, 3));
  m.starting_psn = static_cast<uint32_t>(get_be(d + 20, 3));
  m.responder_resources = d[24];
  m.initiator_depth = d[25];
  m.target_ack_delay = get_bits(d + 26, 0, 5);
  m.failover_accepted = get_bits(d + 26, 5, 2);
  m.e2e_flow_control = get_bits(d + 26, 7, 1);
  m.rnr_retry_count = get_bits(d + 27, 0, 3);
  m.srq = get_bits(d + 27, 3, 1);
  std::memcpy(&m.local_ca_guid, d + 28, 8);
  std::memcpy(m.private_data, d + 36, kRepPrivateLen);
}

void encode_rej(const MadHeader& h, const CmRej& m, uint8_t* mad) {
  start(h, mad);
  uint8_t* d = cm(mad);
  put_be(d + 0, 4, m.local_comm_id);
  put_be(d + 4, 4, m.remote_comm_id);
  put_bits(d + 8, 0, 2, m.message_rejected);
  put_bits(d + 9, 0, 7, m.ari_length);
  put_be(d + 10, 2, m.reason);
  std::memcpy(d + 12, m.ari, sizeof m.ari);
  std::memcpy(d + 84, m.private_data, kRejPrivateLen);
}

void decode_rej(const uint8_t* mad, CmRej& m) {
  const uint8_t* d = cm(mad);
  m.local_comm_id = static_cast<uint32_t>(get_be(d, 4));
  m.remote_comm_id = static_cast<uint32_t>(get_be(d + 4, 4));
  m.message_rejected = get_bits(d + 8, 0, 2);
  m.ari_length = get_bits(d + 9, 0, 7);
  m.reason = static_cast<uint16_t>(get_be(d + 10, 2));
  std::memcpy(m.ari, d + 12, sizeof m.ari);
  std::memcpy(m.private_data, d + 84, kRejPrivateLen);
}

void encode_mra(const MadHeader& h, const CmMra& m, uint8_t* mad) {
  start(h, mad);
  uint8_t* d = cm(mad);
  put_be(d + 0, 4, m.local_comm_id);
  put_be(d + 4, 4, m.remote_comm_id);
  put_bits(d + 8, 0, 2, m.message_mraed);
  put_bits(d + 9, 0, 5, m.service_timeout);
  std::memcpy(d + 10, m.private_data, kMraPrivateLen);
}

void decode_mra(const uint8_t* mad, CmMra& m) {
  const uint8_t* d = cm(mad);
  m.local_comm_id = static_cast<uint32_t>(get_be(d, 4));
  m.remote_comm_id = static_cast<uint32_t>(get_be(d + 4, 4));
  m.message_mraed = get_bits(d + 8, 0, 2);
  m.service_timeout = get_bits(d + 9, 0, 5);
  std::memcpy(m.private_data, d + 10, kMraPrivateLen);
}

void encode_simple(const MadHeader& h, const CmSimple& m, uint8_t* mad) {
  start(h, mad);
  uint8_t* d = cm(mad);
  put_be(d + 0, 4, m.local_comm_id);
  put_be(d + 4, 4, m.remote_comm_id);
  if (h.attr_id == static_cast<uint16_t>(CmAttr::Dreq)) {
    put_be(d + 8, 3, m.remote_qpn);
    std::memcpy(d + 12, m.private_data, kDreqPrivateLen);
  } else {
    std::memcpy(d + 8, m.private_data, kRtuPrivateLen);
  }
}

void decode_simple(const uint8_t* mad, uint16_t attr_id, CmSimple& m) {
  const uint8_t* d = cm(mad);
  m.local_comm_id = static_cast<uint32_t>(get_be(d, 4));
  m.remote_comm_id = static_cast<uint32_t>(get_be(d + 4, 4));
  if (attr_id == static_cast<uint16_t>(CmAttr::Dreq)) {
    m.remote_qpn = static_cast<uint32_t>(get_be(d + 8, 3));
    std::memcpy(m.private_data, d + 12, kDreqPrivateLen);
  } else {
    m.remote_qpn = 0;
    std::memcpy(m.private_data, d + 8, kRtuPrivateLen);
  }
}

void encode_sidr_req(const MadHeader& h, const CmSidrReq& m, uint8_t* mad) {
  start(h, mad);
  uint8_t* d = cm(mad);
  put_be(d + 0, 4, m.request_id);
  put_be(d + 4, 2, m.pkey);
  put_be(d + 8, 8, m.service_id);
  std::memcpy(d + 16, m.private_data, kSidrReqPrivateLen);
}

void decode_sidr_req(const uint8_t* mad, CmSidrReq& m) {
  const uint8_t* d = cm(mad);
  m.request_id = static_cast<uint32_t>(get_be(d, 4));
  m.pkey = static_cast<uint16_t>(get_be(d + 4, 2));
  m.service_id = get_be(d + 8, 8);
  std::memcpy(m.private_data, d + 16, kSidrReqPrivateLen);
}

void encode_sidr_rep(const MadHeader& h, const CmSidrRep& m, uint8_t* mad) {
  start(h, mad);
  uint8_t* d = cm(mad);
  put_be(d + 0, 4, m.request_id);
  d[4] = m.status;
  put_be(d + 8, 3, m.qpn);
  put_be(d + 12, 8, m.service_id);
  put_be(d + 20, 4, m.qkey);
  std::memcpy(d + 96, m.private_data, kSidrRepPrivateLen);
}

void decode_sidr_rep(const uint8_t* mad, CmSidrRep& m) {
  const uint8_t* d = cm(mad);
  m.request_id = static_cast<uint32_t>(get_be(d, 4));
  m.status = d[4];
  m.qpn = static_cast<uint32_t>(get_be(d + 8, 3));
  m.service_id = get_be(d + 12, 8);
  m.qkey = static_cast<uint32_t>(get_be(d + 20, 4));
  std::memcpy(m.private_data, d + 96, kSidrRepPrivateLen);
}

uint32_t cm_destination_comm_id(const uint8_t* mad, uint16_t attr_id) {
  const uint8_t* d = cm(mad);
  switch (static_cast<CmAttr>(attr_id)) {
    case CmAttr::Req:
    case CmAttr::SidrReq:
      return 0;
    case CmAttr::SidrRep:
      return static_cast<uint32_t>(get_be(d, 4));
    default:
      return static_cast<uint32_t>(get_be(d + 4, 4));
  }
}

uint64_t cm_service_id(const uint8_t* mad, uint16_t attr_id) {
  if (attr_id == static_cast<uint16_t>(CmAttr::Req) || attr_id == static_cast<uint16_t>(CmAttr::SidrReq))
    return get_be(cm(mad) + 8, 8);
  return 0;
}

void encode_cma_header(const CmaIpHeader& h, uint8_t* out) {
  std::memset(out, 0, kCmaHeaderLen);
  out[0] = 0;
  const bool v4 = h.src_ip.is_v4();
  out[1] = static_cast<uint8_t>((v4 ? 4 : 6) << 4);
  put_be(out + 2, 2, h.src_port);
  if (v4) {
    std::memcpy(out + 16, h.src_ip.bytes.data() + 12, 4);
    std::memcpy(out + 32, h.dst_ip.bytes.data() + 12, 4);
  } else {
    std::memcpy(out + 4, h.src_ip.bytes.data(), 16);
    std::memcpy(out + 20, h.dst_ip.bytes.data(), 16);
  }
}

bool decode_cma_header(const uint8_t* in, CmaIpHeader& h) {
  if (in[0] != 0) return false;
  h.ip_version = in[1] >> 4;
  h.src_port = static_cast<uint16_t>(get_be(in + 2, 2));
  if (h.ip_version == 4) {
    uint32_t src, dst;
    std::memcpy(&src, in + 16, 4);
    std::memcpy(&dst, in + 32, 4);
    h.src_ip = IpAddress::v4(src);
    h.dst_ip = IpAddress::v4(dst);
    return true;
  }
  if (h.ip_version != 6) return false;
  h.src_ip = IpAddress::from_bytes(in + 4);
  h.dst_ip = IpAddress::from_bytes(in + 20);
  return true;
}

size_t build_gsi_packet(const IpAddress& src_ip, const IpAddress& dst_ip, uint16_t src_port, uint16_t dst_port,
                        uint32_t psn, const uint8_t* mad, uint8_t* out) {
  Packet pkt{};
  pkt.bth.opcode = kUdSendOnly;
  pkt.bth.pkey = kDefaultPkey;
  pkt.bth.dest_qp = kGsiQpn;
  pkt.bth.psn = psn & 0xFFFFFF;
  pkt.deth.qkey = kGsiQkey;
  pkt.deth.src_qp = kGsiQpn;
  size_t n = write_headers(pkt, out);
  std::memcpy(out + n, mad, kMadLen);
  n += kMadLen;
  append_icrc(UdpAddr{src_ip, dst_ip, src_port, dst_port}, out, n);
  return n + kIcrcLen;
}

const uint8_t* gsi_mad(const uint8_t* buf, size_t len) {
  Packet pkt;
  if (parse_packet(buf, len, pkt) != ParseError::Ok) return nullptr;
  if (pkt.bth.opcode != kUdSendOnly || pkt.bth.dest_qp != kGsiQpn || pkt.deth.qkey != kGsiQkey ||
      pkt.payload_len < kMadLen)
    return nullptr;
  return pkt.payload;
}

}  // namespace softrdma::wire
