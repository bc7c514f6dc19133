// CM MAD formats: field positions from IBTA vol. 1 tables 106-120 and the MAD header of ch. 13.
#include <gtest/gtest.h>

#include <cstring>

#include "wire/cm_mad.h"
#include "wire/icrc.h"

using namespace softrdma::wire;

namespace {
MadHeader hdr(CmAttr a) {
  MadHeader h;
  h.attr_id = static_cast<uint16_t>(a);
  h.tid = 0x0102030405060708ull;
  return h;
}
}  // namespace

TEST(CmMad, HeaderBytes) {
  uint8_t mad[kMadLen];
  CmSimple m;
  encode_simple(hdr(CmAttr::Rtu), m, mad);
  EXPECT_EQ(mad[0], 1);
  EXPECT_EQ(mad[1], 0x07);
  EXPECT_EQ(mad[2], 2);
  EXPECT_EQ(mad[3], 0x03);
  EXPECT_EQ(mad[8], 0x01);
  EXPECT_EQ(mad[15], 0x08);
  EXPECT_EQ(mad[16], 0x00);
  EXPECT_EQ(mad[17], 0x14);
  MadHeader back;
  ASSERT_TRUE(decode_mad_header(mad, sizeof mad, back));
  EXPECT_EQ(back.tid, 0x0102030405060708ull);
  EXPECT_EQ(back.attr_id, 0x14);
  EXPECT_FALSE(decode_mad_header(mad, kMadLen - 1, back));
  mad[1] = 0x01;  // subnet management class
  EXPECT_FALSE(decode_mad_header(mad, sizeof mad, back));
}

TEST(CmMad, ReqFieldPositionsAndRoundTrip) {
  CmReq r;
  r.local_comm_id = 0xA1B2C3D4;
  r.service_id = ip_service_id(0x0106, 7174);
  r.local_ca_guid = 0x1122334455667788ull;
  r.local_qpn = 0xABCDEF;
  r.responder_resources = 4;
  r.initiator_depth = 3;
  r.remote_cm_response_timeout = 20;
  r.starting_psn = 0x123456;
  r.local_cm_response_timeout = 20;
  r.retry_count = 7;
  r.path_mtu = 5;
  r.rnr_retry_count = 6;
  r.max_cm_retries = 15;
  r.srq = true;
  r.primary.local_gid[15] = 9;
  r.primary.remote_gid[15] = 10;
  r.primary.flow_label = 0xABCDE;
  r.primary.packet_rate = 0x2A;
  r.primary.hop_limit = 64;
  r.primary.sl = 3;
  r.primary.subnet_local = true;
  r.primary.local_ack_timeout = 18;
  for (size_t i = 0; i < kReqPrivateLen; ++i) r.private_data[i] = static_cast<uint8_t>(i + 1);
  uint8_t mad[kMadLen];
  encode_req(hdr(CmAttr::Req), r, mad);
  const uint8_t* d = mad + 24;
  EXPECT_EQ(d[0], 0xA1);
  EXPECT_EQ(d[3], 0xD4);
  // Service ID 0x0000000001060000 | port at byte 8.
  const uint8_t sid[8] = {0, 0, 0, 0, 0x01, 0x06, 0x1C, 0x06};
  EXPECT_EQ(std::memcmp(d + 8, sid, 8), 0);
  EXPECT_EQ(d[32], 0xAB);
  EXPECT_EQ(d[34], 0xEF);
  EXPECT_EQ(d[35], 4);
  EXPECT_EQ(d[39], 3);
  EXPECT_EQ(d[43], 20 << 3);  // RC (0), no flow control
  EXPECT_EQ(d[44], 0x12);
  EXPECT_EQ(d[46], 0x56);
  EXPECT_EQ(d[47], (20 << 3) | 7);
  EXPECT_EQ(d[48], 0xFF);
  EXPECT_EQ(d[50], (5 << 4) | 6);
  EXPECT_EQ(d[51], (15 << 4) | 0x08);
  EXPECT_EQ(d[52], 0xFF);  // permissive LIDs
  EXPECT_EQ(d[56 + 15], 9);
  EXPECT_EQ(d[72 + 15], 10);
  EXPECT_EQ(d[88], 0xAB);
  EXPECT_EQ(d[89], 0xCD);
  EXPECT_EQ(d[90], 0xE0);
  EXPECT_EQ(d[91], 0x2A);
  EXPECT_EQ(d[93], 64);
  EXPECT_EQ(d[94], (3 << 4) | 0x08);
  EXPECT_EQ(d[95], 18 << 3);
  EXPECT_EQ(d[140], 1);
  EXPECT_EQ(d[231], 92);
  CmReq back;
  decode_req(mad, back);
  EXPECT_EQ(back.local_comm_id, r.local_comm_id);
  EXPECT_EQ(back.service_id, r.service_id);
  EXPECT_EQ(back.local_ca_guid, r.local_ca_guid);
  EXPECT_EQ(back.local_qpn, r.local_qpn);
  EXPECT_EQ(back.starting_psn, r.starting_psn);
  EXPECT_EQ(back.retry_count, 7);
  EXPECT_EQ(back.rnr_retry_count, 6);
  EXPECT_EQ(back.path_mtu, 5);
  EXPECT_EQ(back.max_cm_retries, 15);
  EXPECT_TRUE(back.srq);
  EXPECT_EQ(back.primary.flow_label, 0xABCDEu);
  EXPECT_EQ(back.primary.sl, 3);
  EXPECT_EQ(back.primary.local_ack_timeout, 18);
  EXPECT_EQ(std::memcmp(back.private_data, r.private_data, kReqPrivateLen), 0);
  EXPECT_EQ(cm_service_id(mad, 0x10), r.service_id);
  EXPECT_EQ(cm_destination_comm_id(mad, 0x10), 0u);
}

TEST(CmMad, RepRejMraDreqPositions) {
  uint8_t mad[kMadLen];
  CmRep p;
  p.local_comm_id = 1;
  p.remote_comm_id = 0x55667788;
  p.local_qpn = 0x010203;
  p.starting_psn = 0x0A0B0C;
  p.responder_resources = 16;
  p.initiator_depth = 8;
  p.target_ack_delay = 15;
  p.rnr_retry_count = 7;
  p.srq = true;
  p.private_data[0] = 0x77;
  p.private_data[kRepPrivateLen - 1] = 0x78;
  encode_rep(hdr(CmAttr::Rep), p, mad);
  const uint8_t* d = mad + 24;
  EXPECT_EQ(d[7], 0x88);
  EXPECT_EQ(d[12], 0x01);
  EXPECT_EQ(d[20], 0x0A);
  EXPECT_EQ(d[24], 16);
  EXPECT_EQ(d[25], 8);
  EXPECT_EQ(d[26], 15 << 3);
  EXPECT_EQ(d[27], (7 << 5) | 0x10);
  EXPECT_EQ(d[36], 0x77);
  EXPECT_EQ(d[231], 0x78);
  EXPECT_EQ(cm_destination_comm_id(mad, 0x13), 0x55667788u);
  CmRep pb;
  decode_rep(mad, pb);
  EXPECT_EQ(pb.local_qpn, p.local_qpn);
  EXPECT_EQ(pb.starting_psn, p.starting_psn);
  EXPECT_EQ(pb.rnr_retry_count, 7);
  EXPECT_TRUE(pb.srq);

  CmRej j;
  j.local_comm_id = 2;
  j.remote_comm_id = 3;
  j.message_rejected = kMsgRep;
  j.reason = kRejConsumerDefined;
  j.private_data[0] = 0xEE;
  encode_rej(hdr(CmAttr::Rej), j, mad);
  EXPECT_EQ(d[8], 1 << 6);
  EXPECT_EQ(d[10], 0);
  EXPECT_EQ(d[11], 28);
  EXPECT_EQ(d[84], 0xEE);
  CmRej jb;
  decode_rej(mad, jb);
  EXPECT_EQ(jb.reason, 28);
  EXPECT_EQ(jb.message_rejected, kMsgRep);

  CmMra m;
  m.message_mraed = kMsgRep;
  m.service_timeout = 21;
  encode_mra(hdr(CmAttr::Mra), m, mad);
  EXPECT_EQ(d[8], 1 << 6);
  EXPECT_EQ(d[9], 21 << 3);

  CmSimple q;
  q.local_comm_id = 4;
  q.remote_comm_id = 5;
  q.remote_qpn = 0xFEDCBA;
  q.private_data[0] = 0x42;
  encode_simple(hdr(CmAttr::Dreq), q, mad);
  EXPECT_EQ(d[8], 0xFE);
  EXPECT_EQ(d[10], 0xBA);
  EXPECT_EQ(d[12], 0x42);
  CmSimple qb;
  decode_simple(mad, 0x15, qb);
  EXPECT_EQ(qb.remote_qpn, 0xFEDCBAu);
  EXPECT_EQ(qb.remote_comm_id, 5u);
}

TEST(CmMad, SidrPositions) {
  uint8_t mad[kMadLen];
  CmSidrRep s;
  s.request_id = 0x11223344;
  s.status = 1;
  s.qpn = 0x123456;
  s.service_id = ip_service_id(0x0111, 5000);
  s.qkey = 0x01234567;
  encode_sidr_rep(hdr(CmAttr::SidrRep), s, mad);
  const uint8_t* d = mad + 24;
  EXPECT_EQ(d[4], 1);
  EXPECT_EQ(d[8], 0x12);
  EXPECT_EQ(d[17], 0x11);
  EXPECT_EQ(d[20], 0x01);
  EXPECT_EQ(cm_destination_comm_id(mad, 0x18), 0x11223344u);
  CmSidrRep sb;
  decode_sidr_rep(mad, sb);
  EXPECT_EQ(sb.qkey, s.qkey);
  EXPECT_EQ(sb.service_id, s.service_id);
}

TEST(CmMad, CmaHeader) {
  CmaIpHeader h;
  h.src_port = 0x1234;
  h.src_ip = IpAddress::v4(0x0100007F);  // 127.0.0.1 in network order on a little-endian host
  h.dst_ip = IpAddress::v4(0x0200000A);
  uint8_t b[kCmaHeaderLen];
  encode_cma_header(h, b);
  EXPECT_EQ(b[0], 0);
  EXPECT_EQ(b[1], 0x40);
  EXPECT_EQ(b[2], 0x12);
  EXPECT_EQ(b[16], 127);
  EXPECT_EQ(b[19], 1);
  EXPECT_EQ(b[32], 10);
  EXPECT_EQ(b[35], 2);
  CmaIpHeader back;
  ASSERT_TRUE(decode_cma_header(b, back));
  EXPECT_EQ(back.src_port, 0x1234);
  EXPECT_EQ(back.dst_ip, h.dst_ip);
  EXPECT_EQ(back.src_ip, h.src_ip);
  b[1] = 0x50;  // neither IPv4 nor IPv6
  EXPECT_FALSE(decode_cma_header(b, back));
}

// IPv6 (librdmacm's cma_hdr): version 6 and the two whole addresses, source then destination.
TEST(CmMad, CmaHeaderIpv6) {
  CmaIpHeader h;
  h.src_port = 0x4321;
  ASSERT_TRUE(parse("fd00::1", &h.src_ip));
  ASSERT_TRUE(parse("fd00::2:3", &h.dst_ip));
  uint8_t b[kCmaHeaderLen];
  encode_cma_header(h, b);
  EXPECT_EQ(b[1], 0x60);
  EXPECT_EQ(b[4], 0xfd);
  EXPECT_EQ(b[19], 1);
  EXPECT_EQ(b[20], 0xfd);
  EXPECT_EQ(b[33], 2);
  EXPECT_EQ(b[35], 3);
  CmaIpHeader back;
  ASSERT_TRUE(decode_cma_header(b, back));
  EXPECT_EQ(back.ip_version, 6);
  EXPECT_EQ(back.src_ip, h.src_ip);
  EXPECT_EQ(back.dst_ip, h.dst_ip);
  EXPECT_EQ(back.src_port, 0x4321);
}

TEST(CmMad, GsiPacket) {
  uint8_t mad[kMadLen];
  encode_simple(hdr(CmAttr::Drep), CmSimple{}, mad);
  uint8_t pkt[kGsiPacketLen];
  ASSERT_EQ(build_gsi_packet(IpAddress::v4(0x0100007F), IpAddress::v4(0x0100007F), 50000, 4791, 7, mad, pkt), kGsiPacketLen);
  EXPECT_EQ(pkt[0], 0x64);
  EXPECT_EQ(pkt[7], 1);     // dest QP 1
  EXPECT_EQ(pkt[12], 0x80);  // Q_Key 0x80010000
  EXPECT_EQ(pkt[14], 0x00);
  EXPECT_EQ(pkt[19], 1);    // source QP 1
  const uint8_t* m = gsi_mad(pkt, sizeof pkt);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(std::memcmp(m, mad, kMadLen), 0);
  EXPECT_TRUE(check_icrc(UdpAddr{IpAddress::v4(0x0100007F), IpAddress::v4(0x0100007F), 50000, 4791}, pkt, sizeof pkt));
  pkt[12] = 0;  // wrong Q_Key
  EXPECT_EQ(gsi_mad(pkt, sizeof pkt), nullptr);
  EXPECT_EQ(gsi_mad(pkt, 100), nullptr);
}
