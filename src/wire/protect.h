// Wire protection of RoCEv2 packets between softrdma peers (docs/security.md, "Wire protection"): an
// AES-GCM trailer between the payload (with its pad) and the ICRC, the per-direction keys it uses, and
// the replay window over its packet counter. Plain RoCEv2 packets carry no trailer and are unchanged.
//
//   BTH | ext headers | payload | pad | counter (8, big-endian) | tag (16) | ICRC
//
// Nonce (12 bytes): the direction key's 4-byte salt, then the counter. AAD: the counter, then the
// headers with BTH byte 4 (FECN, BECN, resv6: changed by the network, masked by the ICRC too) taken as
// 0, then, in Auth mode, the payload and pad. In Encrypt mode payload and pad are the plaintext. The
// headers bind opcode, destination QPN and PSN; the key binds the two ends and the direction.
#pragma once

#include <cstddef>
#include <cstdint>

struct evp_cipher_ctx_st;

namespace softrdma::wire {

enum class Protection : uint8_t { Off = 0, Auth = 1, Encrypt = 2 };
const char* protection_name(Protection p);

inline constexpr size_t kProtectCounterLen = 8;
inline constexpr size_t kProtectTagLen = 16;
inline constexpr size_t kProtectTrailerLen = kProtectCounterLen + kProtectTagLen;  // a multiple of 4

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
// connection's secret (16 or 32 bytes; the key has its length) with the mode and both ends in the
// info: the two directions of a connection, and two modes, never share a key. False on a bad length.
bool derive_direction_key(const uint8_t* secret, size_t secret_len, Protection mode, uint32_t src_ip_be,
                          uint32_t src_qpn, uint32_t dst_ip_be, uint32_t dst_qpn, DirectionKey* out);

// An AES-GCM context holding one direction's key schedule. Not copyable; one per direction per QP.
class PacketCipher {
 public:
  PacketCipher() = default;
  ~PacketCipher();
  PacketCipher(const PacketCipher&) = delete;
  PacketCipher& operator=(const PacketCipher&) = delete;

  // false when OpenSSL cannot set the key up.
  bool init(Protection mode, const DirectionKey& key, bool encrypt_side);
  bool ready() const { return ctx_ != nullptr; }
  Protection mode() const { return mode_; }

  // Sender: pkt[0..hdr_len) are the headers, pkt[hdr_len..hdr_len+body_len) payload and pad (encrypted in
  // place in Encrypt mode); the trailer is written at pkt + hdr_len + body_len.
  bool seal(uint8_t* pkt, size_t hdr_len, size_t body_len, uint64_t counter);
  // Receiver: the same layout with the trailer after the body. The body's plaintext goes to out_body
  // (Encrypt mode; may be pkt + hdr_len); Auth mode writes nothing. False when the tag does not verify.
  bool open(const uint8_t* pkt, size_t hdr_len, size_t body_len, uint8_t* out_body, uint64_t* counter);

 private:
  bool aad(const uint8_t* pkt, size_t hdr_len, const uint8_t* counter_be);
  evp_cipher_ctx_st* ctx_ = nullptr;
  Protection mode_ = Protection::Off;
  uint8_t salt_[4] = {};
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
