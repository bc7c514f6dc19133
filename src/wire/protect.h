// Wire protection of RoCEv2 packets between softrdma peers (docs/security.md, "Wire protection"): an
// AES-GCM trailer after the payload (with its pad), the per-direction keys it uses, and the replay
// window over its packet counter. Plain RoCEv2 packets carry no trailer and are unchanged.
//
//   BTH (TVer 1) | ext headers | payload | pad | counter (8, big-endian) | tag (16) | 4 zero bytes
//
// Format 2: the BTH's transport header version is kProtectTver, so a RoCE stack that is not a protected
// softrdma QP drops the packet (IBTA: an unsupported TVer is dropped), and the 4 bytes in the ICRC's
// place are neither computed nor checked: the tag authenticates everything the ICRC covered that
// matters (the two ends' addresses and QPNs through the key; the headers and payload directly).
// Nonce (12 bytes): the direction key's 4-byte salt, then the counter. AAD: the counter, then the
// headers with BTH byte 4 (FECN, BECN, resv6: changed by the network) taken as 0, then, in Auth mode,
// the payload and pad. In Encrypt mode payload and pad are the plaintext. The headers bind opcode,
// TVer, destination QPN and PSN; the key binds the two ends, the direction and the format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "wire/ip_address.h"

struct evp_cipher_ctx_st;

namespace softrdma::wire {

enum class Protection : uint8_t { Off = 0, Auth = 1, Encrypt = 2 };
const char* protection_name(Protection p);

inline constexpr size_t kProtectCounterLen = 8;
inline constexpr size_t kProtectTagLen = 16;
inline constexpr size_t kProtectTrailerLen = kProtectCounterLen + kProtectTagLen;  // a multiple of 4
// The BTH transport header version of a protected packet (RoCEv2's is 0).
inline constexpr uint8_t kProtectTver = 1;
// True when the datagram at buf (len bytes) has a protected packet's BTH version.
inline bool protected_form(const uint8_t* buf, size_t len) { return len >= 12 && (buf[1] & 0xF) == kProtectTver; }

struct ProtectTrailer {
  uint64_t counter;
  uint8_t tag[kProtectTagLen];
};
// buf holds kProtectTrailerLen bytes.
void write_trailer(const ProtectTrailer& t, uint8_t* buf);
ProtectTrailer parse_trailer(const uint8_t* buf);

// One direction's key: 16 bytes (AES-128-GCM) or 32 (AES-256-GCM), and the nonce salt.
struct DirectionKey {
  uint8_t key[32];
  uint8_t key_len;
  uint8_t salt[4];
};

// The key of the direction from (src_ip, src_qpn) to (dst_ip, dst_qpn), by HKDF-SHA256 from the
// connection's secret (16 or 32 bytes; the key has its length) with the format, the mode and both ends
// in the info: the two directions of a connection, two modes, and two formats never share a key.
// False on a bad length.
// (IPv4 ends are 4 bytes of the info, IPv6 ones 16.)
bool derive_direction_key(const uint8_t* secret, size_t secret_len, Protection mode, const IpAddress& src_ip,
                          uint32_t src_qpn, const IpAddress& dst_ip, uint32_t dst_qpn, DirectionKey* out);

// Which AES-GCM implementation a PacketCipher uses. Best: Intel's multi-buffer crypto library
// (libIPSec_MB: VAES/VPCLMULQDQ, AVX2 or AES-NI code, chosen for the CPU) where the build found it and
// the CPU has AES-NI, else OpenSSL's EVP. Both compute the same AES-GCM; the tests check they agree.
enum class CipherImpl : uint8_t { Best, OpenSsl };
// True when Best means the multi-buffer library on this machine.
bool fast_gcm_available();

// An AES-GCM key schedule for one direction, set up once. Not copyable; one per direction per QP.
class PacketCipher {
 public:
  PacketCipher() = default;
  ~PacketCipher();
  PacketCipher(const PacketCipher&) = delete;
  PacketCipher& operator=(const PacketCipher&) = delete;

  // false when the key cannot be set up.
  bool init(Protection mode, const DirectionKey& key, bool encrypt_side, CipherImpl impl = CipherImpl::Best);
  bool ready() const { return ctx_ != nullptr || fast_ != nullptr; }
  Protection mode() const { return mode_; }
  const char* impl_name() const { return fast_ ? "ipsec-mb" : ctx_ ? "openssl" : "none"; }

  // Sender, one pass: pkt[0..hdr_len) are the headers; the payload's len bytes are read from payload
  // (pkt + hdr_len for in place; otherwise not overlapping the packet) and written to pkt + hdr_len,
  // encrypted in Encrypt mode, followed by pad_len zero bytes of pad (under the tag, encrypted too);
  // the trailer is written after them.
  bool seal(uint8_t* pkt, size_t hdr_len, const uint8_t* payload, size_t len, size_t pad_len, uint64_t counter);
  // The same with payload and pad (body_len bytes) already in place.
  bool seal(uint8_t* pkt, size_t hdr_len, size_t body_len, uint64_t counter) {
    return seal(pkt, hdr_len, pkt + hdr_len, body_len, 0, counter);
  }
  // Receiver: the same layout with the trailer after the body. The body's plaintext goes to out_body
  // (Encrypt mode; may be pkt + hdr_len); Auth mode writes nothing. False when the tag does not verify.
  bool open(const uint8_t* pkt, size_t hdr_len, size_t body_len, uint8_t* out_body, uint64_t* counter);

 private:
  struct Fast;
  bool aad(const uint8_t* pkt, size_t hdr_len, const uint8_t* counter_be);
  bool seal_fast(uint8_t* pkt, size_t hdr_len, const uint8_t* payload, size_t len, size_t pad_len, uint8_t* trailer);
  bool open_fast(const uint8_t* pkt, size_t hdr_len, size_t body_len, uint8_t* out_body, const uint8_t* trailer);
  evp_cipher_ctx_st* ctx_ = nullptr;  // OpenSSL
  Fast* fast_ = nullptr;              // the multi-buffer library's key data
  Protection mode_ = Protection::Off;
  uint8_t salt_[4] = {};
  // The AES-GCM nonce of a packet: the direction's salt, then the trailer's 8-byte counter.
  void nonce(const uint8_t* trailer, uint8_t iv[12]) const {
    std::memcpy(iv, salt_, 4);
    std::memcpy(iv + 4, trailer, 8);
  }
};

// Counters seen, within kSize of the highest: a counter is new once (IPsec-style anti-replay, RFC 4303
// §3.4.3). check() first, accept() once the tag verified.
class ReplayWindow {
 public:
  static constexpr uint64_t kSize = 1024;
  bool fresh(uint64_t counter) const;
  void accept(uint64_t counter);
  uint64_t highest() const { return highest_; }

 private:
  bool seen(uint64_t c) const { return bits_[(c / 64) % (kSize / 64)] >> (c % 64) & 1; }
  uint64_t highest_ = 0;
  bool any_ = false;
  uint64_t bits_[kSize / 64] = {};
};

}  // namespace softrdma::wire
