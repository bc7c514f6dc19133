// Key agreement for wire-protected connections (protect.h): the operator key from the environment,
// X25519 shares, the REQ/REP MACs and the HKDF of the connection secret, over OpenSSL libcrypto.
#include "cm/protect.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "config/config.h"

namespace softrdma::cm {

namespace {
bool hex_decode(const char* s, size_t n, std::vector<uint8_t>* out) {
  while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) --n;
  if (n % 2) return false;
  out->clear();
  for (size_t i = 0; i < n; i += 2) {
    auto nib = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
    int hi = nib(s[i]), lo = nib(s[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<uint8_t>(hi << 4 | lo));
  }
  return true;
}
void put32(std::vector<uint8_t>& v, uint32_t x) {
  for (int i = 3; i >= 0; --i) v.push_back(static_cast<uint8_t>(x >> (8 * i)));
}
std::vector<uint8_t> transcript_bytes(const char* label, const Transcript& t, bool full) {
  std::vector<uint8_t> v(label, label + 3);
  v.push_back(t.mode);
  v.insert(v.end(), t.share_a, t.share_a + kProtectShareLen);
  if (full) v.insert(v.end(), t.share_b, t.share_b + kProtectShareLen);
  put32(v, t.qpn_a);
  if (full) put32(v, t.qpn_b);
  put32(v, t.psn_a);
  if (full) put32(v, t.psn_b);
  return v;
}
void mac_of(const std::vector<uint8_t>& key, const std::vector<uint8_t>& msg, uint8_t* mac) {
  uint8_t full[32];
  unsigned int len = sizeof full;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), msg.data(), msg.size(), full, &len);
  std::memcpy(mac, full, kProtectMacLen);
  OPENSSL_cleanse(full, sizeof full);
}
}  // namespace

WireConfig parse_wire_config(const char* mode, const char* key_hex, const char* key_file) {
  WireConfig c;
  if (!mode || !*mode || std::strcmp(mode, "off") == 0) return c;
  if (std::strcmp(mode, "auth") == 0) {
    c.mode = 1;
  } else if (std::strcmp(mode, "encrypt") == 0) {
    c.mode = 2;
  } else {
    c.mode = 1;  // asked for, so never silently plain
    c.error = "SOFTRDMA_WIRE_PROTECT must be auth, encrypt or off";
    return c;
  }
  if (key_file && *key_file) {
    int fd = open(key_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      c.error = "SOFTRDMA_AUTH_KEY_FILE cannot be read";
      return c;
    }
    // Like ssh with its private keys: a key others may read is no secret, so it is refused.
    struct stat st {};
    if (fstat(fd, &st) != 0 || (st.st_mode & 077) != 0) {
      close(fd);
      c.error = "SOFTRDMA_AUTH_KEY_FILE must not be accessible to group or others (chmod 600)";
      return c;
    }
    char buf[1024];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (n <= 0) {
      c.error = "SOFTRDMA_AUTH_KEY_FILE is empty";
      return c;
    }
    if (!hex_decode(buf, static_cast<size_t>(n), &c.key)) c.key.assign(buf, buf + n);  // raw bytes
    OPENSSL_cleanse(buf, sizeof buf);
  } else if (key_hex && *key_hex) {
    if (!hex_decode(key_hex, std::strlen(key_hex), &c.key)) {
      c.error = "SOFTRDMA_AUTH_KEY is not hex";
      return c;
    }
  } else {
    c.error = "SOFTRDMA_WIRE_PROTECT needs SOFTRDMA_AUTH_KEY_FILE or SOFTRDMA_AUTH_KEY";
    return c;
  }
  if (c.key.size() < 16) c.error = "the operator key must have at least 16 bytes";
  return c;
}

const WireConfig& wire_config() {
  static const WireConfig c = [] {
    const config::Settings s = config::parse();
    return parse_wire_config(s.wire_protect.c_str(), s.auth_key.c_str(), s.auth_key_file.c_str());
  }();
  return c;
}

bool make_share(Share* out) {
  EVP_PKEY_CTX* pctx = EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr);
  EVP_PKEY* key = nullptr;
  bool ok = pctx && EVP_PKEY_keygen_init(pctx) > 0 && EVP_PKEY_keygen(pctx, &key) > 0;
  size_t pl = sizeof out->priv, ql = sizeof out->pub;
  ok = ok && EVP_PKEY_get_raw_private_key(key, out->priv, &pl) > 0 && EVP_PKEY_get_raw_public_key(key, out->pub, &ql) > 0 &&
       pl == 32 && ql == 32;
  EVP_PKEY_free(key);
  EVP_PKEY_CTX_free(pctx);
  return ok;
}

void encode_block(const Block& b, uint8_t* out) {
  out[0] = 'S';
  out[1] = 'W';
  out[2] = b.version;
  out[3] = b.mode;
  std::memcpy(out + 4, b.share, kProtectShareLen);
  std::memcpy(out + 4 + kProtectShareLen, b.mac, kProtectMacLen);
}

bool parse_block(const uint8_t* in, Block* out) {
  if (in[0] != 'S' || in[1] != 'W' || (in[2] != 1 && in[2] != kProtectBlockVersion)) return false;
  out->version = in[2];
  out->mode = in[3];
  std::memcpy(out->share, in + 4, kProtectShareLen);
  std::memcpy(out->mac, in + 4 + kProtectShareLen, kProtectMacLen);
  return true;
}

void req_mac(const std::vector<uint8_t>& key, const Transcript& t, uint8_t* mac) {
  mac_of(key, transcript_bytes("REQ", t, false), mac);
}
void rep_mac(const std::vector<uint8_t>& key, const Transcript& t, uint8_t* mac) {
  mac_of(key, transcript_bytes("REP", t, true), mac);
}
bool mac_equal(const uint8_t* a, const uint8_t* b) { return CRYPTO_memcmp(a, b, kProtectMacLen) == 0; }

bool derive_secret(const std::vector<uint8_t>& key, const uint8_t* my_priv, const uint8_t* peer_pub,
                   const Transcript& t, uint8_t* secret) {
  EVP_PKEY* mine = EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, my_priv, 32);
  EVP_PKEY* peer = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer_pub, kProtectShareLen);
  EVP_PKEY_CTX* dctx = mine ? EVP_PKEY_CTX_new(mine, nullptr) : nullptr;
  uint8_t shared[32];
  size_t slen = sizeof shared;
  bool ok = mine && peer && dctx && EVP_PKEY_derive_init(dctx) > 0 && EVP_PKEY_derive_set_peer(dctx, peer) > 0 &&
            EVP_PKEY_derive(dctx, shared, &slen) > 0 && slen == 32;
  EVP_PKEY_CTX_free(dctx);
  EVP_PKEY_free(mine);
  EVP_PKEY_free(peer);
  if (!ok) return false;
  const std::vector<uint8_t> info = transcript_bytes("KEY", t, true);
  EVP_PKEY_CTX* h = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  size_t out_len = kWireSecretLen;
  ok = h && EVP_PKEY_derive_init(h) > 0 && EVP_PKEY_CTX_set_hkdf_md(h, EVP_sha256()) > 0 &&
       EVP_PKEY_CTX_set1_hkdf_salt(h, key.data(), static_cast<int>(key.size())) > 0 &&
       EVP_PKEY_CTX_set1_hkdf_key(h, shared, 32) > 0 &&
       EVP_PKEY_CTX_add1_hkdf_info(h, info.data(), static_cast<int>(info.size())) > 0 &&
       EVP_PKEY_derive(h, secret, &out_len) > 0 && out_len == kWireSecretLen;
  EVP_PKEY_CTX_free(h);
  OPENSSL_cleanse(shared, sizeof shared);
  return ok;
}

}  // namespace softrdma::cm
