// Writes the seed corpora of the fuzz targets: valid RoCEv2 packets built with wire::write_headers for
// every RC opcode (plus a few UC/UD ones), and, for fuzz_responder, short conversations in its input
// format (see fuzz_responder.cpp) that reach each responder and completer path; for fuzz_iwarp, FPDU
// streams in each CRC/marker setting, MPA frames, and lone headers and bodies.
//   make_corpus <dir>   -> <dir>/fuzz_parser/*, <dir>/fuzz_responder/*, <dir>/fuzz_iwarp/*
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/iwarp.h"
#include "wire/opcode.h"
#include "wire/psn.h"

using namespace softrdma::wire;
using Bytes = std::vector<uint8_t>;

namespace {

struct Fields {
  uint32_t psn = 0;
  uint64_t va = 0;
  uint32_t rkey = 0x1234;
  uint32_t dma_len = 0;
  uint8_t syndrome = 0x1F;  // ACK, no credit information
  uint64_t swap_add = 1, compare = 0;
  bool ack_req = true;
};

// One packet: headers, payload (a byte pattern), pad and an ICRC over fixed addresses.
Bytes packet(uint8_t opcode, uint32_t payload_len, const Fields& f) {
  Packet p{};
  p.bth.opcode = opcode;
  p.bth.pkey = kDefaultPkey;
  p.bth.dest_qp = 0x000102;
  p.bth.psn = f.psn & kPsnMask;
  p.bth.ack_req = f.ack_req;
  p.bth.pad_count = pad_for(payload_len);
  p.reth = {f.va, f.rkey, f.dma_len};
  p.atomic = {f.va, f.rkey, f.swap_add, f.compare};
  p.aeth = {f.syndrome, 1};
  p.atomic_ack_orig = 0x1122334455667788ull;
  p.imm_data_be = 0xDDCCBBAA;
  p.ieth_rkey = 0x5678;
  p.deth = {0x11111111, 0x000203};
  Bytes b(kBthLen + kAtomicEthLen + kRethLen + 16);
  size_t n = write_headers(p, b.data());
  b.resize(n);
  for (uint32_t i = 0; i < payload_len; ++i) b.push_back(static_cast<uint8_t>(i * 13 + 7));
  b.resize(b.size() + p.bth.pad_count + kIcrcLen, 0);
  UdpAddr addr{IpAddress::v4(0x0100007F), IpAddress::v4(0x0100007F), 49152, kRoceUdpPort};
  append_icrc(addr, b.data(), b.size() - kIcrcLen);
  return b;
}

// fuzz_responder framing: [ctl][len_hi][len_lo][bytes]. ctl 0x04: patch dest QP, PSN, P_Key, rkey/VA
// and ICRC, so the packet reaches the transport. The PSN's low nibble is 4 + the offset from the
// expected PSN (requests) or from the oldest unacknowledged PSN (responses).
void frame(Bytes& out, const Bytes& pkt, uint8_t ctl = 0x04) {
  out.push_back(ctl);
  out.push_back(static_cast<uint8_t>(pkt.size() >> 8));
  out.push_back(static_cast<uint8_t>(pkt.size()));
  out.insert(out.end(), pkt.begin(), pkt.end());
}

void write_file(const std::filesystem::path& dir, const std::string& name, const Bytes& b) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(b.data()),
                                                   static_cast<std::streamsize>(b.size()));
}

Fields at(int32_t off, uint32_t dma_len = 0, uint64_t va = 0) {
  Fields f;
  f.psn = static_cast<uint32_t>(4 + off);
  f.dma_len = dma_len;
  f.va = va;
  return f;
}

// An iWARP stream: SEND, WRITE crossing a marker, READ request, READ response, Terminate.
Bytes iwarp_stream(bool crc, bool markers) {
  namespace iw = iwarp;
  iw::FpduSender tx(crc, markers);
  Bytes out;
  auto fpdu = [&](const iw::DdpHeader& h, const Bytes& body) {
    uint8_t hdr[iw::kMaxHeaderLen];
    const size_t hl = iw::encode_header(h, hdr);
    iovec in[2] = {{hdr, hl}, {const_cast<uint8_t*>(body.data()), body.size()}};
    Bytes scratch(iw::FpduSender::scratch_len(hl + body.size()));
    iovec pieces[64];
    const int n = tx.frame(in, 2, scratch.data(), pieces, 64);
    for (int i = 0; i < n; ++i) {
      const auto* p = static_cast<const uint8_t*>(pieces[i].iov_base);
      out.insert(out.end(), p, p + pieces[i].iov_len);
    }
  };
  iw::DdpHeader send;
  send.last = true;
  send.opcode = iw::Opcode::Send;
  send.msn = 1;
  fpdu(send, Bytes(37, 0x5a));
  iw::DdpHeader write;
  write.tagged = write.last = true;
  write.opcode = iw::Opcode::Write;
  write.stag = 0x1234;
  write.to = 0x40001000;
  fpdu(write, Bytes(700, 0xa5));
  iw::DdpHeader rreq;
  rreq.last = true;
  rreq.opcode = iw::Opcode::ReadRequest;
  rreq.qn = iw::kQnReadRequest;
  rreq.msn = 1;
  iw::ReadRequest r{0x5678, 0x2000, 100, 0x1234, 0x40001000};
  Bytes body(iw::kReadRequestLen);
  iw::encode_read_request(r, body.data());
  fpdu(rreq, body);
  iw::DdpHeader rresp = write;
  rresp.opcode = iw::Opcode::ReadResponse;
  rresp.stag = 0x5678;
  fpdu(rresp, Bytes(100, 0x3c));
  iw::DdpHeader term;
  term.last = true;
  term.opcode = iw::Opcode::Terminate;
  term.qn = iw::kQnTerminate;
  term.msn = 1;
  uint8_t copied[iw::kUntaggedHeaderLen];
  iw::encode_header(send, copied);
  iw::Terminate t;
  t.layer = iw::TermLayer::Ddp;
  t.etype = iw::term::kDdpUntagged;
  t.ecode = iw::term::kUtInvalidMsnRange;
  t.has_segment_len = true;
  t.segment_len = 37;
  t.ddp_header = copied;
  t.ddp_header_len = sizeof copied;
  Bytes tb(iw::kMaxTerminateLen);
  tb.resize(iw::encode_terminate(t, tb.data()));
  fpdu(term, tb);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];

  // fuzz_parser: one valid packet per opcode.
  const std::filesystem::path pdir = root / "fuzz_parser";
  for (unsigned op = 0; op < 256; ++op) {
    const OpcodeInfo& info = opcode_info(static_cast<uint8_t>(op));
    if (!info.valid) continue;
    if (info.qp_class != QpClass::RC && op != kUcSendOnly && op != kUcWriteOnly && op != kUdSendOnlyImm) continue;
    Fields f;
    f.psn = 0xABCDEF;
    f.va = 0x40001000;
    f.dma_len = 37;
    write_file(pdir, info.name, packet(static_cast<uint8_t>(op), info.has_payload ? 37 : 0, f));
  }

  const std::filesystem::path rdir = root / "fuzz_responder";
  // Header bytes: post flags (bits 5..7 = receive WQEs), config (0: MTU 1024, PSNs 0x100/0x200).
  auto conv = [](uint8_t post, uint8_t cfg) { return Bytes{post, cfg}; };
  const uint8_t rq4 = 4 << 5;
  Bytes b;

  b = conv(rq4, 0);
  frame(b, packet(kRcSendOnly, 100, at(0)));
  frame(b, packet(kRcSendOnlyImm, 0, at(0)));
  frame(b, packet(kRcSendOnlyInv, 3, at(0)));
  write_file(rdir, "send_only", b);

  b = conv(rq4, 0);
  frame(b, packet(kRcSendFirst, 1024, at(0)));
  frame(b, packet(kRcSendMiddle, 1024, at(0)));
  frame(b, packet(kRcSendLast, 200, at(0)));
  frame(b, packet(kRcSendFirst, 1024, at(0)));
  frame(b, packet(kRcSendLastImm, 1, at(0)));
  frame(b, packet(kRcSendFirst, 1024, at(0)));
  frame(b, packet(kRcSendLastInv, 2, at(0)));
  write_file(rdir, "send_multi", b);

  b = conv(0, 0);  // no receive WQE: RNR NAK
  frame(b, packet(kRcSendOnly, 10, at(0)));
  write_file(rdir, "send_rnr", b);

  b = conv(7 << 5, 0);  // WQE #5 has a bad lkey, #6 is too small
  for (int i = 0; i < 7; ++i) frame(b, packet(kRcSendOnly, 100, at(0)));
  write_file(rdir, "send_bad_wqes", b);

  b = conv(rq4, 0);
  frame(b, packet(kRcWriteOnly, 512, at(0, 512, 0x100)));
  frame(b, packet(kRcWriteFirst, 1024, at(0, 2500, 0x2000)));
  frame(b, packet(kRcWriteMiddle, 1024, at(0)));
  frame(b, packet(kRcWriteLast, 452, at(0)));
  frame(b, packet(kRcWriteOnlyImm, 8, at(0, 8, 0xFFF8)));
  frame(b, packet(kRcWriteFirst, 1024, at(0, 1030, 0x3000)));
  frame(b, packet(kRcWriteLastImm, 6, at(0)));
  frame(b, packet(kRcWriteOnly, 0, at(0, 0, 0x10000)));
  write_file(rdir, "write", b);

  b = conv(rq4, 0);
  frame(b, packet(kRcWriteOnly, 16, at(0, 16, 0xFFF8)));  // runs past the end of the MR
  write_file(rdir, "write_out_of_range", b);

  b = conv(rq4, 8);  // the QP grants REMOTE_READ only
  frame(b, packet(kRcWriteOnly, 16, at(0, 16, 0x40)));
  write_file(rdir, "write_no_access", b);

  b = conv(rq4, 0);
  frame(b, packet(kRcReadRequest, 0, at(0, 3000, 0x100)));
  frame(b, packet(kRcReadRequest, 0, at(-3, 3000, 0x100)));  // duplicate: regenerated
  frame(b, packet(kRcReadRequest, 0, at(0, 0, 0x200)));
  write_file(rdir, "read", b);

  b = conv(rq4, 0);
  frame(b, packet(kRcCompareSwap, 0, at(0, 0, 0x40)));
  frame(b, packet(kRcFetchAdd, 0, at(0, 0, 0x48)));
  frame(b, packet(kRcFetchAdd, 0, at(-1, 0, 0x48)));  // duplicate: replayed, not re-executed
  write_file(rdir, "atomic", b);

  b = conv(rq4, 0);
  frame(b, packet(kRcSendOnly, 8, at(0)));
  frame(b, packet(kRcSendOnly, 8, at(-1)));  // duplicate: re-ACK
  frame(b, packet(kRcSendOnly, 8, at(2)));   // gap: PSN sequence NAK
  frame(b, packet(kRcSendMiddle, 8, at(0)));  // MIDDLE without FIRST: invalid request
  frame(b, packet(kRcSendOnly, 8, at(0)));    // after the QP is brought up again
  write_file(rdir, "sequence_errors", b);

  // Completer: every WQE kind posted (READ 2500 B = 3 PSNs, FETCH_ADD, CMP_SWAP, SEND, WRITE 2 PSNs).
  b = conv(0x1F | rq4, 0);
  frame(b, packet(kRcReadResponseFirst, 1024, at(0)));
  frame(b, packet(kRcReadResponseMiddle, 1024, at(1)));
  frame(b, packet(kRcReadResponseLast, 452, at(1)));
  frame(b, packet(kRcAtomicAck, 0, at(1)));
  frame(b, packet(kRcAtomicAck, 0, at(1)));
  frame(b, packet(kRcAck, 0, at(2)));
  write_file(rdir, "completer_all", b);

  b = conv(0x19, 0);  // READ, SEND, WRITE
  Fields rnr = at(3);
  rnr.syndrome = aeth_rnr_nak(1);
  frame(b, packet(kRcAck, 0, rnr));
  Fields seq = at(3);
  seq.syndrome = aeth_nak(kNakPsnSeqErr);
  frame(b, packet(kRcAck, 0, seq));
  Fields acc = at(3);
  acc.syndrome = aeth_nak(kNakRemoteAccess);
  frame(b, packet(kRcAck, 0, acc));
  write_file(rdir, "completer_naks", b);

  b = conv(0x01, 0);
  frame(b, packet(kRcReadResponseOnly, 1024, at(0)));  // ONLY but 2500 B asked: BadRespErr
  write_file(rdir, "completer_bad_response", b);

  b = conv(rq4 | 0x01, 1);  // PSNs across the 24-bit wrap
  frame(b, packet(kRcSendFirst, 1024, at(0)));
  frame(b, packet(kRcSendMiddle, 1024, at(0)));
  frame(b, packet(kRcSendLast, 10, at(0)));
  frame(b, packet(kRcWriteOnly, 4, at(0, 4, 0x80)));
  frame(b, packet(kRcReadResponseFirst, 1024, at(0)));
  frame(b, packet(kRcReadResponseMiddle, 1024, at(1)));
  frame(b, packet(kRcReadResponseLast, 452, at(1)));
  write_file(rdir, "psn_wrap", b);

  b = conv(rq4, 2);  // MTU 256
  frame(b, packet(kRcSendFirst, 256, at(0)));
  frame(b, packet(kRcSendLast, 256, at(0)));
  frame(b, packet(kRcReadRequest, 0, at(0, 1000, 0)));
  write_file(rdir, "mtu256", b);

  // Deregistration with operations in flight (ctl bit6: deregister + poison before the packet).
  b = conv(rq4, 0);
  frame(b, packet(kRcReadRequest, 0, at(0, 3000, 0x100)));  // responses still streaming
  frame(b, packet(kRcWriteFirst, 1024, at(0, 2048, 0x2000)));
  frame(b, packet(kRcWriteLast, 1024, at(0)), 0x04 | 0x40);  // its target is gone
  write_file(rdir, "dereg_write_read", b);

  b = conv(rq4, 0);
  frame(b, packet(kRcSendFirst, 1024, at(0)));
  frame(b, packet(kRcSendLast, 10, at(0)), 0x04 | 0x40);  // the receive buffer is gone
  write_file(rdir, "dereg_send", b);

  b = conv(0x07, 0);  // READ, FETCH_ADD, CMP_SWAP posted; their result buffers go away
  frame(b, packet(kRcReadResponseFirst, 1024, at(0)), 0x04 | 0x40);
  frame(b, packet(kRcReadResponseMiddle, 1024, at(1)));
  frame(b, packet(kRcAtomicAck, 0, at(3)), 0x04 | 0x80);
  write_file(rdir, "dereg_completer", b);

  const std::filesystem::path idir = root / "fuzz_iwarp";
  for (int opts = 0; opts < 4; ++opts) {
    const bool crc = opts & 1, markers = opts & 2;
    write_file(idir, std::string("stream") + (crc ? "_crc" : "") + (markers ? "_markers" : ""),
               iwarp_stream(crc, markers));
  }
  {
    iwarp::MpaFrame f;
    f.enhanced = f.peer_to_peer = f.rtr_write = f.rtr_read = true;
    f.ird = f.ord = 16;
    const Bytes pd = {'p', 'r', 'i', 'v'};
    f.private_data = pd.data();
    f.private_data_len = static_cast<uint16_t>(pd.size());
    Bytes m(iwarp::kMpaHeaderLen + iwarp::kMpaEnhancedLen + pd.size());
    iwarp::encode_mpa(f, m.data());
    write_file(idir, "mpa_request", m);
    f.reply = f.crc = true;
    f.rtr_read = false;
    iwarp::encode_mpa(f, m.data());
    write_file(idir, "mpa_reply", m);
    iwarp::MpaFrame r;
    r.reply = r.reject = true;
    r.revision = 1;
    m.resize(iwarp::kMpaHeaderLen);
    iwarp::encode_mpa(r, m.data());
    write_file(idir, "mpa_reject_v1", m);
  }
  {
    // A lone Terminate body with every header, and a lone READ request body.
    uint8_t hdr[iwarp::kUntaggedHeaderLen] = {0x41, 0x41};
    uint8_t rr[iwarp::kReadRequestLen] = {};
    iwarp::Terminate t;
    t.layer = iwarp::TermLayer::Rdmap;
    t.etype = iwarp::term::kRdmapRemoteProtection;
    t.ecode = iwarp::term::kBaseBounds;
    t.has_segment_len = true;
    t.ddp_header = hdr;
    t.ddp_header_len = sizeof hdr;
    t.rdmap_header = rr;
    t.rdmap_header_len = sizeof rr;
    Bytes tb(iwarp::kMaxTerminateLen);
    tb.resize(iwarp::encode_terminate(t, tb.data()));
    write_file(idir, "terminate_body", tb);
    write_file(idir, "read_request_body", Bytes(rr, rr + sizeof rr));
  }
  return 0;
}
