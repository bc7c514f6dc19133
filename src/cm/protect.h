// Key agreement for wire-protected RoCEv2 connections (docs/security.md, "Wire protection"): with
// SOFTRDMA_WIRE_PROTECT=auth|encrypt and an operator key (SOFTRDMA_AUTH_KEY_FILE, or SOFTRDMA_AUTH_KEY
// in hex), the REQ and the REP each carry, first in the consumer's private data, a block
//   'S' 'W' | version 2 | mode | X25519 public share (32) | MAC (16)
// (version 2: the packet format of wire/protect.h with TVer 1 and no ICRC; a block of another version
// is a mismatch, refused like another mode).
// REQ MAC = HMAC-SHA256(operator key, "REQ" | mode | share_a | qpn_a | psn_a), truncated to 16 bytes;
// REP MAC = HMAC-SHA256(operator key, "REP" | mode | share_a | share_b | qpn_a | qpn_b | psn_a | psn_b).
// Both sides then derive the connection's secret, HKDF-SHA256(salt = operator key, ikm = X25519 shared
// secret, info = the REP transcript), which the QP gets before RTR (transport/protect.cpp derives the
// per-direction keys from it). psn_a is the REQ's starting PSN, psn_b the REP's; qpn_a/b their QPNs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace softrdma::cm {

inline constexpr size_t kProtectShareLen = 32, kProtectMacLen = 16;
inline constexpr uint8_t kProtectBlockVersion = 2;
inline constexpr size_t kProtectBlockLen = 4 + kProtectShareLen + kProtectMacLen;  // 52
inline constexpr size_t kWireSecretLen = 16;  // AES-128-GCM per direction
// The REJ reason a side gives when the other's protection does not match its own (mode, operator key,
// MAC, or one side unprotected): outside IBTA's reasons (0..33), so RDMA_CM_EVENT_REJECTED's status
// tells it apart. The REJ's private data carries kProtectRejText.
inline constexpr uint16_t kRejWireProtection = 0x5EC0;
inline constexpr char kProtectRejText[] = "softrdma: wire protection mismatch";

struct WireConfig {
  uint8_t mode = 0;          // 0 off, 1 auth, 2 encrypt (wire::Protection)
  std::vector<uint8_t> key;  // the operator key (at least 16 bytes)
  std::string error;         // set when the environment asks for protection but is unusable
  bool on() const { return mode != 0; }
};
// From the values of SOFTRDMA_WIRE_PROTECT, SOFTRDMA_AUTH_KEY (hex) and SOFTRDMA_AUTH_KEY_FILE (hex
// text or raw bytes); nullptr: unset. The key file wins over the hex variable.
WireConfig parse_wire_config(const char* mode, const char* key_hex, const char* key_file);
const WireConfig& wire_config();  // the process's, read once

struct Share {
  uint8_t priv[32];
  uint8_t pub[kProtectShareLen];
};
bool make_share(Share* out);

struct Block {
  uint8_t version = kProtectBlockVersion;  // 1: an older softrdma's (format 1), refused as a mismatch
  uint8_t mode;
  uint8_t share[kProtectShareLen];
  uint8_t mac[kProtectMacLen];
};
void encode_block(const Block& b, uint8_t* out);
// False when out holds no block (magic differs, or a version no softrdma wrote). A block of version 1
// is parsed (a mismatch to refuse, not private data to pass on).
bool parse_block(const uint8_t* in, Block* out);

struct Transcript {
  uint8_t mode = 0;
  uint8_t share_a[kProtectShareLen] = {}, share_b[kProtectShareLen] = {};
  uint32_t qpn_a = 0, qpn_b = 0, psn_a = 0, psn_b = 0;
};
void req_mac(const std::vector<uint8_t>& key, const Transcript& t, uint8_t* mac);
void rep_mac(const std::vector<uint8_t>& key, const Transcript& t, uint8_t* mac);
bool mac_equal(const uint8_t* a, const uint8_t* b);  // constant time
// The connection's secret (kWireSecretLen bytes) from our private share and the peer's public one.
bool derive_secret(const std::vector<uint8_t>& key, const uint8_t* my_priv, const uint8_t* peer_pub,
                   const Transcript& t, uint8_t* secret);

}  // namespace softrdma::cm
