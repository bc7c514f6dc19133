// The work-request table: for each send-queue operation (WrOp) on each transport service (QpType),
// whether the service carries it (IBTA table 38 and 10.8; ibv_post_send(3)), what the responder does
// with it, the completion opcode it reports, and the request packets it goes out as. The verbs layer,
// the requester, the completer and the direct path read their facts about an operation from here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <iterator>

#include "core/cq.h"
#include "core/mr.h"
#include "transport/qp.h"
#include "wire/opcode.h"

namespace softrdma::transport {

// No request packet: the operation is local, or the service does not carry it.
inline constexpr uint8_t kNoRequestOpcode = 0xFF;

// The BTH opcodes of a message's request packets by their position in it. READ and ATOMIC are a
// single request packet, whatever the length of their response.
struct RequestOpcodes {
  uint8_t first = kNoRequestOpcode, middle = kNoRequestOpcode, last = kNoRequestOpcode, only = kNoRequestOpcode;
  constexpr uint8_t at(bool is_first, bool is_last) const {
    return is_first ? (is_last ? only : first) : (is_last ? last : middle);
  }
};

struct WorkRequest {
  bool allowed = false;           // the service carries it
  bool consumes_receive = false;  // the message takes a receive WQE at the responder
  bool read = false;              // RDMA READ: response packets carry the data back
  bool atomic = false;            // CmpSwap, FetchAdd: 8 aligned bytes, the original value comes back
  bool local = false;             // Bind MW, Local Invalidate: executed in order, no packets, no PSN
  bool inline_data = false;       // may carry inline data (SEND and RDMA WRITE only)
  // ATOMIC WRITE (IBTA 1.5): 8 bytes of payload written atomically at an 8-byte aligned address; the
  // responder answers with a zero-length READ RESPONSE and keeps it in its replay cache like an ATOMIC.
  bool atomic_write = false;
  uint32_t remote_access = 0;     // the access right the responder checks on the target memory (0: none)
  core::WcOpcode completion = core::WcOpcode::Send;
  RequestOpcodes opcodes;         // on this service; none when not allowed or local
  // READ, ATOMIC and ATOMIC WRITE hold a responder resource each: at most max_rd_atomic may be
  // outstanding, and each completes only when its response (not an ACK) arrives.
  constexpr bool read_or_atomic() const { return read || atomic || atomic_write; }
};

namespace work_request_table {
using namespace wire;
struct Row {
  bool rc = false, uc = false, ud = false;  // services that carry it
  bool consumes_receive = false, read = false, atomic = false, local = false, inline_data = false;
  uint32_t remote_access = 0;
  core::WcOpcode completion = core::WcOpcode::Send;
  RequestOpcodes rc_opcodes{}, uc_opcodes{}, ud_opcodes{};
};
using W = core::WcOpcode;
inline constexpr RequestOpcodes single(uint8_t op) { return {op, op, op, op}; }
inline constexpr RequestOpcodes only(uint8_t op) { return {.only = op}; }
// Indexed by WrOp. UC carries SEND and RDMA WRITE only, with the RC codes in its class; UD carries
// SEND ONLY (with or without immediate) only.
inline constexpr Row kRows[] = {
    // Send
    {.rc = true, .uc = true, .ud = true, .consumes_receive = true, .inline_data = true, .completion = W::Send,
     .rc_opcodes = {kRcSendFirst, kRcSendMiddle, kRcSendLast, kRcSendOnly},
     .uc_opcodes = {kUcSendFirst, kUcSendMiddle, kUcSendLast, kUcSendOnly},
     .ud_opcodes = only(kUdSendOnly)},
    // SendImm
    {.rc = true, .uc = true, .ud = true, .consumes_receive = true, .inline_data = true, .completion = W::Send,
     .rc_opcodes = {kRcSendFirst, kRcSendMiddle, kRcSendLastImm, kRcSendOnlyImm},
     .uc_opcodes = {kUcSendFirst, kUcSendMiddle, kUcSendLastImm, kUcSendOnlyImm},
     .ud_opcodes = only(kUdSendOnlyImm)},
    // SendInv: RC only (no UC or UD opcode carries an IETH)
    {.rc = true, .consumes_receive = true, .inline_data = true, .completion = W::Send,
     .rc_opcodes = {kRcSendFirst, kRcSendMiddle, kRcSendLastInv, kRcSendOnlyInv}},
    // Write
    {.rc = true, .uc = true, .inline_data = true, .remote_access = core::kRemoteWrite, .completion = W::RdmaWrite,
     .rc_opcodes = {kRcWriteFirst, kRcWriteMiddle, kRcWriteLast, kRcWriteOnly},
     .uc_opcodes = {kUcWriteFirst, kUcWriteMiddle, kUcWriteLast, kUcWriteOnly}},
    // WriteImm: the immediate data completes a receive WQE
    {.rc = true, .uc = true, .consumes_receive = true, .inline_data = true, .remote_access = core::kRemoteWrite,
     .completion = W::RdmaWrite,
     .rc_opcodes = {kRcWriteFirst, kRcWriteMiddle, kRcWriteLastImm, kRcWriteOnlyImm},
     .uc_opcodes = {kUcWriteFirst, kUcWriteMiddle, kUcWriteLastImm, kUcWriteOnlyImm}},
    // Read: RC only
    {.rc = true, .read = true, .remote_access = core::kRemoteRead, .completion = W::RdmaRead,
     .rc_opcodes = single(kRcReadRequest)},
    // CompareSwap: RC only
    {.rc = true, .atomic = true, .remote_access = core::kRemoteAtomic, .completion = W::CompSwap,
     .rc_opcodes = single(kRcCompareSwap)},
    // FetchAdd: RC only
    {.rc = true, .atomic = true, .remote_access = core::kRemoteAtomic, .completion = W::FetchAdd,
     .rc_opcodes = single(kRcFetchAdd)},
    // BindMw: on the connected services (IBTA 10.6.7.2.x); UD QPs bind no type 2 windows
    {.rc = true, .uc = true, .local = true, .completion = W::BindMw},
    // LocalInv
    {.rc = true, .uc = true, .local = true, .completion = W::LocalInv},
    // AtomicWrite: RC only, one RC ATOMIC WRITE packet
    {.rc = true, .remote_access = core::kRemoteWrite, .completion = W::AtomicWrite,
     .rc_opcodes = single(kRcAtomicWrite)},
};
static_assert(std::size(kRows) == static_cast<size_t>(WrOp::AtomicWrite) + 1, "one row per WrOp, in order");
}  // namespace work_request_table

constexpr WorkRequest work_request(WrOp op, QpType type) {
  const work_request_table::Row& r = work_request_table::kRows[static_cast<size_t>(op)];
  WorkRequest w;
  // RAW_PACKET sends whole frames (IBV_WR_SEND) and nothing else; no request packets of ours.
  w.allowed = type == QpType::Raw ? op == WrOp::Send : type == QpType::Rc ? r.rc : type == QpType::Uc ? r.uc : r.ud;
  w.consumes_receive = r.consumes_receive;
  w.read = r.read;
  w.atomic = r.atomic;
  w.local = r.local;
  w.inline_data = r.inline_data;
  w.atomic_write = op == WrOp::AtomicWrite;  // the only one: no column of its own
  w.remote_access = r.remote_access;
  w.completion = r.completion;
  if (w.allowed && type != QpType::Raw)
    w.opcodes = type == QpType::Rc ? r.rc_opcodes : type == QpType::Uc ? r.uc_opcodes : r.ud_opcodes;
  return w;
}

}  // namespace softrdma::transport
