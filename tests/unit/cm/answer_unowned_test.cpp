// cm::answer_unowned: what the 4791 holder sends for a MAD no live process here takes.
#include <gtest/gtest.h>

#include "cm/cm.h"
#include "wire/cm_mad.h"

namespace softrdma::cm {
namespace {

wire::MadHeader header(wire::CmAttr attr, uint64_t tid) {
  wire::MadHeader h;
  h.attr_id = static_cast<uint16_t>(attr);
  h.tid = tid;
  return h;
}

TEST(AnswerUnowned, ReqGetsRejInvalidServiceId) {
  wire::CmReq req;
  req.local_comm_id = 0x11223344;
  req.service_id = wire::ip_service_id(0x0106, 7471);
  uint8_t mad[wire::kMadLen], out[wire::kMadLen];
  wire::encode_req(header(wire::CmAttr::Req, 77), req, mad);
  ASSERT_TRUE(answer_unowned(mad, out));
  wire::MadHeader h;
  ASSERT_TRUE(wire::decode_mad_header(out, wire::kMadLen, h));
  EXPECT_EQ(h.attr_id, static_cast<uint16_t>(wire::CmAttr::Rej));
  EXPECT_EQ(h.tid, 77u);
  wire::CmRej rej;
  wire::decode_rej(out, rej);
  EXPECT_EQ(rej.remote_comm_id, 0x11223344u);
  EXPECT_EQ(rej.local_comm_id, 0u);
  EXPECT_EQ(rej.message_rejected, wire::kMsgReq);
  EXPECT_EQ(rej.reason, wire::kRejInvalidServiceId);
}

TEST(AnswerUnowned, SidrReqGetsServiceIdNotSupported) {
  wire::CmSidrReq req;
  req.request_id = 0xABCD;
  req.service_id = wire::ip_service_id(0x0111, 7174);
  uint8_t mad[wire::kMadLen], out[wire::kMadLen];
  wire::encode_sidr_req(header(wire::CmAttr::SidrReq, 5), req, mad);
  ASSERT_TRUE(answer_unowned(mad, out));
  wire::MadHeader h;
  ASSERT_TRUE(wire::decode_mad_header(out, wire::kMadLen, h));
  EXPECT_EQ(h.attr_id, static_cast<uint16_t>(wire::CmAttr::SidrRep));
  wire::CmSidrRep rep;
  wire::decode_sidr_rep(out, rep);
  EXPECT_EQ(rep.request_id, 0xABCDu);
  EXPECT_EQ(rep.status, 1);
  EXPECT_EQ(rep.service_id, req.service_id);
  EXPECT_EQ(rep.qpn, 0u);
}

TEST(AnswerUnowned, DreqGetsDrepWithCommIdsSwapped) {
  wire::CmSimple dreq;
  dreq.local_comm_id = 1;
  dreq.remote_comm_id = 2;
  uint8_t mad[wire::kMadLen], out[wire::kMadLen];
  wire::encode_simple(header(wire::CmAttr::Dreq, 9), dreq, mad);
  ASSERT_TRUE(answer_unowned(mad, out));
  wire::MadHeader h;
  ASSERT_TRUE(wire::decode_mad_header(out, wire::kMadLen, h));
  EXPECT_EQ(h.attr_id, static_cast<uint16_t>(wire::CmAttr::Drep));
  EXPECT_EQ(h.tid, 9u);
  wire::CmSimple drep;
  wire::decode_simple(out, h.attr_id, drep);
  EXPECT_EQ(drep.local_comm_id, 2u);
  EXPECT_EQ(drep.remote_comm_id, 1u);
}

TEST(AnswerUnowned, RepAndRtuGetRejInvalidCommId) {
  uint8_t mad[wire::kMadLen], out[wire::kMadLen];
  wire::CmRep rep;
  rep.local_comm_id = 10;
  rep.remote_comm_id = 20;
  wire::encode_rep(header(wire::CmAttr::Rep, 3), rep, mad);
  ASSERT_TRUE(answer_unowned(mad, out));
  wire::CmRej rej;
  wire::decode_rej(out, rej);
  EXPECT_EQ(rej.local_comm_id, 20u);  // the dead receiver's comm ID
  EXPECT_EQ(rej.remote_comm_id, 10u);
  EXPECT_EQ(rej.message_rejected, wire::kMsgRep);
  EXPECT_EQ(rej.reason, wire::kRejInvalidCommId);

  wire::CmSimple rtu;
  rtu.local_comm_id = 30;
  rtu.remote_comm_id = 40;
  wire::encode_simple(header(wire::CmAttr::Rtu, 4), rtu, mad);
  ASSERT_TRUE(answer_unowned(mad, out));
  wire::decode_rej(out, rej);
  EXPECT_EQ(rej.local_comm_id, 40u);
  EXPECT_EQ(rej.remote_comm_id, 30u);
  EXPECT_EQ(rej.message_rejected, wire::kMsgOther);
  EXPECT_EQ(rej.reason, wire::kRejInvalidCommId);
}

TEST(AnswerUnowned, OthersGetNoAnswer) {
  uint8_t mad[wire::kMadLen], out[wire::kMadLen];
  wire::CmMra mra;
  wire::encode_mra(header(wire::CmAttr::Mra, 1), mra, mad);
  EXPECT_FALSE(answer_unowned(mad, out));
  wire::CmRej rej;
  wire::encode_rej(header(wire::CmAttr::Rej, 1), rej, mad);
  EXPECT_FALSE(answer_unowned(mad, out));
  wire::CmSimple drep;
  wire::encode_simple(header(wire::CmAttr::Drep, 1), drep, mad);
  EXPECT_FALSE(answer_unowned(mad, out));
  mad[1] = 0x04;  // not the CM management class
  EXPECT_FALSE(answer_unowned(mad, out));
}

}  // namespace
}  // namespace softrdma::cm
