// Test harness for the iWARP data path: engines without threads (fabric.h's hosts), RC QPs in INIT
// attached with Engine::iwarp_attach to the ends of a socketpair, stepped until a condition holds; and
// a raw socket end that writes crafted FPDUs at an attached QP and reads back what it sends.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "fabric.h"
#include "transport/iwarp_path.h"
#include "wire/iwarp.h"

namespace softrdma::transport::test {

namespace iw = wire::iwarp;

inline constexpr uint32_t kAllAccess = core::kLocalWrite | core::kRemoteWrite | core::kRemoteRead;

// An RC QP in INIT on h (its own CQs), ready for iwarp_attach.
inline void make_iw_end(End& e, Host& h, uint32_t access = kAllAccess, uint32_t max_wr = 64) {
  e.host = &h;
  e.pd = 1;
  e.scq = h.engine->create_cq(4 * max_wr, nullptr);
  e.rcq = h.engine->create_cq(4 * max_wr, nullptr);
  QpConfig c;
  c.type = QpType::Rc;
  c.pd = 1;
  c.send_cq = e.scq.get();
  c.recv_cq = e.rcq.get();
  c.max_send_wr = c.max_recv_wr = max_wr;
  c.max_send_sge = c.max_recv_sge = 4;
  c.max_inline = 64;
  e.qp = h.engine->create_qp(c);
  ASSERT_NE(e.qp, nullptr);
  QpModify m;
  m.mask = kModState | kModAccessFlags;
  m.state = QpState::Init;
  m.access_flags = access;
  e.engine().modify_qp(e.qp, m);
}

struct IwOptions {
  bool crc = false, markers = false;
  IwarpRtr rtr_a = IwarpRtr::None, rtr_b = IwarpRtr::None;
  uint32_t ird = 8, ord = 8;
};

// The responder's side of an initiator's RTR: what it awaits (Await when none is sent).
inline IwarpRtr awaiting(IwarpRtr sent) {
  switch (sent) {
    case IwarpRtr::SendWrite: return IwarpRtr::AwaitWrite;
    case IwarpRtr::SendRead: return IwarpRtr::AwaitRead;
    case IwarpRtr::SendSend: return IwarpRtr::AwaitSend;
    default: return IwarpRtr::Await;
  }
}

inline int attach(End& e, int fd, const IwOptions& o, IwarpRtr rtr) {
  IwarpAttach a;
  a.fd = fd;
  a.crc = o.crc;
  a.markers_rx = a.markers_tx = o.markers;
  a.rtr = rtr;
  a.ird = o.ird;
  a.ord = o.ord;
  return e.engine().iwarp_attach(e.qp, a);
}

// Two engines and one iWARP connection between them over a socketpair.
struct IwPair {
  Fabric f;
  End a, b;
  explicit IwPair(const IwOptions& o = {}, uint32_t access = kAllAccess) {
    Host& ha = f.add_host(wire::IpAddress::v4(0x0100000a));
    Host& hb = f.add_host(wire::IpAddress::v4(0x0200000a));
    make_iw_end(a, ha, access);
    make_iw_end(b, hb, access);
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    EXPECT_EQ(attach(a, sv[0], o, o.rtr_a), 0);
    EXPECT_EQ(attach(b, sv[1], o, o.rtr_b), 0);
  }
  ~IwPair() {
    destroy(a);
    destroy(b);
  }
  // Steps both engines until done() holds; false after max_rounds rounds without it.
  bool run(const std::function<bool()>& done, int max_rounds = 200000) {
    for (int i = 0; i < max_rounds; ++i) {
      if (done()) return true;
      a.engine().step();
      b.engine().step();
    }
    return done();
  }
};

// Collects CQEs of one CQ until n are there.
inline bool wait_cqes(IwPair& p, End& e, core::CompletionQueue& cq, size_t n, std::vector<core::Cqe>& out) {
  return p.run([&] {
    core::Cqe c[16];
    for (int k; (k = e.engine().poll_cq(&cq, c, 16)) > 0;) out.insert(out.end(), c, c + k);
    return out.size() >= n;
  });
}

// The raw end of a connection: writes FPDUs framed as a peer would (or broken on purpose), and
// parses what the QP sends back.
class RawPeer {
 public:
  RawPeer(bool crc, bool markers) : tx_(crc, markers), rx_(crc, markers) {}
  ~RawPeer() {
    if (fd >= 0) close(fd);
  }
  // Frames header + payload into bytes (not yet written).
  std::vector<uint8_t> frame(const std::vector<uint8_t>& ulpdu) {
    iovec in{const_cast<uint8_t*>(ulpdu.data()), ulpdu.size()};
    std::vector<uint8_t> scratch(iw::FpduSender::scratch_len(ulpdu.size()));
    std::vector<iovec> out(iw::kFrameIov + 8 + 2 * (ulpdu.size() / iw::kMarkerInterval + 2));
    int n = tx_.frame(&in, 1, scratch.data(), out.data(), static_cast<int>(out.size()));
    std::vector<uint8_t> bytes;
    for (int i = 0; i < n; ++i) {
      auto* p = static_cast<const uint8_t*>(out[i].iov_base);
      bytes.insert(bytes.end(), p, p + out[i].iov_len);
    }
    return bytes;
  }
  void write_bytes(const std::vector<uint8_t>& b) {
    ASSERT_EQ(::write(fd, b.data(), b.size()), static_cast<ssize_t>(b.size()));
  }
  void send_ulpdu(const std::vector<uint8_t>& ulpdu) { write_bytes(frame(ulpdu)); }
  // Reads what is there (non-blocking) and parses the FPDUs in it; eof set when the QP shut down.
  void read_all() {
    uint8_t buf[65536];
    for (;;) {
      ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0) {
        eof = true;
        break;
      }
      if (n < 0) break;
      in_.insert(in_.end(), buf, buf + n);
    }
    std::vector<uint8_t> demarked(iw::kMaxUlpduLen);
    size_t off = 0;
    for (;;) {
      iw::FpduReceiver::Fpdu f;
      if (rx_.next(in_.data() + off, in_.size() - off, demarked.data(), f) != iw::FpduReceiver::Status::Ok) break;
      ulpdus.emplace_back(f.ulpdu, f.ulpdu + f.ulpdu_len);
      off += f.consumed;
    }
    in_.erase(in_.begin(), in_.begin() + static_cast<long>(off));
  }
  int fd = -1;
  bool eof = false;
  std::vector<std::vector<uint8_t>> ulpdus;

 private:
  iw::FpduSender tx_;
  iw::FpduReceiver rx_;
  std::vector<uint8_t> in_;
};

// ULPDU builders.
inline std::vector<uint8_t> ulpdu(const iw::DdpHeader& h, const uint8_t* payload = nullptr, size_t len = 0) {
  std::vector<uint8_t> u(iw::kMaxHeaderLen);
  u.resize(iw::encode_header(h, u.data()));
  if (len) u.insert(u.end(), payload, payload + len);
  return u;
}
inline iw::DdpHeader send_hdr(uint32_t msn, uint32_t mo, bool last, iw::Opcode op = iw::Opcode::Send) {
  iw::DdpHeader h;
  h.opcode = op;
  h.qn = iw::kQnSend;
  h.msn = msn;
  h.mo = mo;
  h.last = last;
  return h;
}
inline iw::DdpHeader tagged_hdr(iw::Opcode op, uint32_t stag, uint64_t to, bool last = true) {
  iw::DdpHeader h;
  h.tagged = true;
  h.opcode = op;
  h.stag = stag;
  h.to = to;
  h.last = last;
  return h;
}
inline std::vector<uint8_t> read_request(uint32_t msn, const iw::ReadRequest& r) {
  iw::DdpHeader h;
  h.opcode = iw::Opcode::ReadRequest;
  h.qn = iw::kQnReadRequest;
  h.msn = msn;
  h.last = true;
  std::vector<uint8_t> u = ulpdu(h);
  uint8_t body[iw::kReadRequestLen];
  iw::encode_read_request(r, body);
  u.insert(u.end(), body, body + sizeof body);
  return u;
}

}  // namespace softrdma::transport::test
