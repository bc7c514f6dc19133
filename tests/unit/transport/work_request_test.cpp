// The work-request table (transport/work_request.h) against IBTA table 38 and the verbs man pages:
// which operations each service carries, what each operation is, and that every request opcode it
// names is the wire opcode of that service, kind and packet position.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "transport/work_request.h"
#include "wire/opcode.h"

namespace softrdma::transport {
namespace {

constexpr WrOp kOps[] = {WrOp::Send,     WrOp::SendImm,     WrOp::SendInv,  WrOp::Write,  WrOp::WriteImm,
                         WrOp::Read,     WrOp::CompareSwap, WrOp::FetchAdd, WrOp::BindMw, WrOp::LocalInv,
                         WrOp::AtomicWrite};
constexpr QpType kTypes[] = {QpType::Rc, QpType::Uc, QpType::Ud};

bool is_send(WrOp op) { return op == WrOp::Send || op == WrOp::SendImm || op == WrOp::SendInv; }
bool is_write(WrOp op) { return op == WrOp::Write || op == WrOp::WriteImm; }

// Usable in constant expressions: the requester and the verbs layer may rely on that.
static_assert(work_request(WrOp::Read, QpType::Rc).opcodes.only == wire::kRcReadRequest);
static_assert(!work_request(WrOp::Read, QpType::Uc).allowed);

TEST(WorkRequest, RcCarriesEveryOperation) {
  for (WrOp op : kOps) EXPECT_TRUE(work_request(op, QpType::Rc).allowed) << int(op);
}

TEST(WorkRequest, UcHasNoReadAtomicOrSendWithInvalidate) {
  for (WrOp op : {WrOp::Read, WrOp::CompareSwap, WrOp::FetchAdd, WrOp::SendInv, WrOp::AtomicWrite})
    EXPECT_FALSE(work_request(op, QpType::Uc).allowed) << int(op);
  for (WrOp op : {WrOp::Send, WrOp::SendImm, WrOp::Write, WrOp::WriteImm, WrOp::BindMw, WrOp::LocalInv})
    EXPECT_TRUE(work_request(op, QpType::Uc).allowed) << int(op);
}

TEST(WorkRequest, UdCarriesOnlySendAndSendWithImmediateInOnePacket) {
  for (WrOp op : kOps)
    EXPECT_EQ(work_request(op, QpType::Ud).allowed, op == WrOp::Send || op == WrOp::SendImm) << int(op);
  const RequestOpcodes send = work_request(WrOp::Send, QpType::Ud).opcodes;
  EXPECT_EQ(send.only, wire::kUdSendOnly);
  EXPECT_EQ(work_request(WrOp::SendImm, QpType::Ud).opcodes.only, wire::kUdSendOnlyImm);
  EXPECT_EQ(send.first, kNoRequestOpcode);
  EXPECT_EQ(send.middle, kNoRequestOpcode);
  EXPECT_EQ(send.last, kNoRequestOpcode);
}

TEST(WorkRequest, WhatEachOperationIs) {
  for (QpType t : kTypes) {
    for (WrOp op : kOps) {
      const WorkRequest w = work_request(op, t);
      const bool atomic = op == WrOp::CompareSwap || op == WrOp::FetchAdd;
      EXPECT_EQ(w.consumes_receive, is_send(op) || op == WrOp::WriteImm) << int(op);
      EXPECT_EQ(w.read, op == WrOp::Read) << int(op);
      EXPECT_EQ(w.atomic, atomic) << int(op);
      EXPECT_EQ(w.atomic_write, op == WrOp::AtomicWrite) << int(op);
      EXPECT_EQ(w.read_or_atomic(), op == WrOp::Read || atomic || op == WrOp::AtomicWrite) << int(op);
      EXPECT_EQ(w.local, op == WrOp::BindMw || op == WrOp::LocalInv) << int(op);
      EXPECT_EQ(w.inline_data, is_send(op) || is_write(op)) << "ibv_post_send(3): SEND and RDMA WRITE";
      EXPECT_EQ(w.remote_access, is_write(op) || op == WrOp::AtomicWrite ? uint32_t{core::kRemoteWrite}
                                 : op == WrOp::Read ? uint32_t{core::kRemoteRead}
                                 : atomic           ? uint32_t{core::kRemoteAtomic}
                                                    : 0u)
          << int(op);
    }
  }
}

TEST(WorkRequest, CompletionOpcodes) {
  using W = core::WcOpcode;
  const std::pair<WrOp, W> expect[] = {
      {WrOp::Send, W::Send},         {WrOp::SendImm, W::Send},         {WrOp::SendInv, W::Send},
      {WrOp::Write, W::RdmaWrite},   {WrOp::WriteImm, W::RdmaWrite},   {WrOp::Read, W::RdmaRead},
      {WrOp::CompareSwap, W::CompSwap}, {WrOp::FetchAdd, W::FetchAdd}, {WrOp::BindMw, W::BindMw},
      {WrOp::LocalInv, W::LocalInv}, {WrOp::AtomicWrite, W::AtomicWrite}};
  for (QpType t : kTypes)
    for (auto [op, wc] : expect) EXPECT_EQ(work_request(op, t).completion, wc) << int(op);
}

// Every opcode the table names is valid, of the QP's class, of the operation's kind, at the named
// position, and carries the headers the operation needs there (IBTA table 38, 9.2-9.4).
TEST(WorkRequest, RequestOpcodesMatchTheWireTable) {
  for (QpType t : kTypes) {
    const wire::QpClass cls = t == QpType::Rc ? wire::QpClass::RC : t == QpType::Uc ? wire::QpClass::UC
                                                                                 : wire::QpClass::UD;
    for (WrOp op : kOps) {
      const WorkRequest w = work_request(op, t);
      const RequestOpcodes o = w.opcodes;
      if (!w.allowed || w.local) {
        for (uint8_t c : {o.first, o.middle, o.last, o.only}) EXPECT_EQ(c, kNoRequestOpcode) << int(op);
        continue;
      }
      const wire::OpKind kind = is_send(op)              ? wire::OpKind::Send
                                : is_write(op)           ? wire::OpKind::Write
                                : op == WrOp::Read       ? wire::OpKind::ReadRequest
                                : op == WrOp::FetchAdd   ? wire::OpKind::FetchAdd
                                : op == WrOp::AtomicWrite ? wire::OpKind::AtomicWrite
                                                         : wire::OpKind::CompareSwap;
      const bool segmented = (is_send(op) || is_write(op)) && t != QpType::Ud;
      struct Pos {
        uint8_t code;
        bool first, last;
      };
      std::vector<Pos> positions = {{o.only, true, true}};
      if (segmented) {
        positions.push_back({o.first, true, false});
        positions.push_back({o.middle, false, false});
        positions.push_back({o.last, false, true});
      } else if (t != QpType::Ud) {
        // One request packet (READ, ATOMIC): any position names it.
        EXPECT_TRUE(o.first == o.only && o.middle == o.only && o.last == o.only) << int(op);
      }
      for (const Pos& p : positions) {
        const wire::OpcodeInfo& info = wire::opcode_info(p.code);
        SCOPED_TRACE(std::string(info.name) + " for op " + std::to_string(int(op)));
        ASSERT_TRUE(info.valid);
        EXPECT_EQ(info.qp_class, cls);
        EXPECT_EQ(info.kind, kind);
        EXPECT_EQ(info.first, p.first);
        EXPECT_EQ(info.last, p.last);
        const bool imm = (op == WrOp::SendImm || op == WrOp::WriteImm) && p.last;
        EXPECT_EQ((info.headers & wire::kHdrImm) != 0, imm);
        EXPECT_EQ((info.headers & wire::kHdrIeth) != 0, op == WrOp::SendInv && p.last);
        EXPECT_EQ((info.headers & wire::kHdrReth) != 0,
                  (is_write(op) && p.first) || op == WrOp::Read || op == WrOp::AtomicWrite);
        EXPECT_EQ((info.headers & wire::kHdrAtomicEth) != 0, w.atomic);
        EXPECT_EQ((info.headers & wire::kHdrDeth) != 0, t == QpType::Ud);
      }
    }
  }
}

}  // namespace
}  // namespace softrdma::transport
