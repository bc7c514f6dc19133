// The CM's answers for connections no process here owns (cm.h, answer_unowned): what the 4791 holder
// (transport/gsi.cpp) sends in place of a process that is gone or a service nobody listens on.
#include "cm/cm.h"

namespace softrdma::cm {

bool answer_unowned(const uint8_t* mad, uint8_t* out) {
  wire::MadHeader h;
  if (!wire::decode_mad_header(mad, wire::kMadLen, h)) return false;
  wire::MadHeader rh;
  rh.tid = h.tid;
  switch (static_cast<wire::CmAttr>(h.attr_id)) {
    case wire::CmAttr::Req: {
      wire::CmReq req;
      wire::decode_req(mad, req);
      wire::CmRej rej;
      rej.remote_comm_id = req.local_comm_id;
      rej.message_rejected = wire::kMsgReq;
      rej.reason = wire::kRejInvalidServiceId;
      rh.attr_id = static_cast<uint16_t>(wire::CmAttr::Rej);
      wire::encode_rej(rh, rej, out);
      return true;
    }
    case wire::CmAttr::SidrReq: {
      wire::CmSidrReq req;
      wire::decode_sidr_req(mad, req);
      wire::CmSidrRep rep;
      rep.request_id = req.request_id;
      rep.status = 1;  // service ID not supported
      rep.service_id = req.service_id;
      rh.attr_id = static_cast<uint16_t>(wire::CmAttr::SidrRep);
      wire::encode_sidr_rep(rh, rep, out);
      return true;
    }
    case wire::CmAttr::Dreq: {
      // A DREQ for a connection nobody here knows (its owner died): IBTA 12.6.10 answers with a DREP.
      wire::CmSimple dreq;
      wire::decode_simple(mad, h.attr_id, dreq);
      wire::CmSimple drep;
      drep.local_comm_id = dreq.remote_comm_id;
      drep.remote_comm_id = dreq.local_comm_id;
      rh.attr_id = static_cast<uint16_t>(wire::CmAttr::Drep);
      wire::encode_simple(rh, drep, out);
      return true;
    }
    case wire::CmAttr::Rep:
    case wire::CmAttr::Rtu: {
      wire::CmRej rej;
      if (h.attr_id == static_cast<uint16_t>(wire::CmAttr::Rep)) {
        wire::CmRep rep;
        wire::decode_rep(mad, rep);
        rej.remote_comm_id = rep.local_comm_id;
        rej.message_rejected = wire::kMsgRep;
      } else {
        wire::CmSimple rtu;
        wire::decode_simple(mad, h.attr_id, rtu);
        rej.remote_comm_id = rtu.local_comm_id;
        rej.message_rejected = wire::kMsgOther;
      }
      rej.local_comm_id = wire::cm_destination_comm_id(mad, h.attr_id);
      rej.reason = wire::kRejInvalidCommId;
      rh.attr_id = static_cast<uint16_t>(wire::CmAttr::Rej);
      wire::encode_rej(rh, rej, out);
      return true;
    }
    default:
      return false;
  }
}

}  // namespace softrdma::cm
