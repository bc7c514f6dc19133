// AES-GCM packet protection (protect.h) over OpenSSL's EVP interface, HKDF key derivation, and the
// anti-replay window.
#include "wire/protect.h"

#include <openssl/evp.h>
#include <openssl/kdf.h>

#include <cstring>

namespace softrdma::wire {

const char* protection_name(Protection p) {
  switch (p) {
    case Protection::Off: return "off";
    case Protection::Auth: return "auth";
    case Protection::Encrypt: return "encrypt";
  }
  return "?";
}

namespace {
void put_be64(uint8_t* p, uint64_t v) {
  for (int i = 7; i >= 0; --i, v >>= 8) p[i] = static_cast<uint8_t>(v);
}
uint64_t get_be64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | p[i];
  return v;
}
void put_be32(uint8_t* p, uint32_t v) {
  for (int i = 3; i >= 0; --i, v >>= 8) p[i] = static_cast<uint8_t>(v);
}
}  // namespace

void write_trailer(const ProtectTrailer& t, uint8_t* buf) {
  put_be64(buf, t.counter);
  std::memcpy(buf + kProtectCounterLen, t.tag, kProtectTagLen);
}

ProtectTrailer parse_trailer(const uint8_t* buf) {
  ProtectTrailer t;
  t.counter = get_be64(buf);
  std::memcpy(t.tag, buf + kProtectCounterLen, kProtectTagLen);
  return t;
}

bool derive_direction_key(const uint8_t* secret, size_t secret_len, Protection mode, uint32_t src_ip_be,
                          uint32_t src_qpn, uint32_t dst_ip_be, uint32_t dst_qpn, DirectionKey* out) {
  if ((secret_len != 16 && secret_len != 32) || mode == Protection::Off) return false;
  // info: a label, the mode, then the sending end and the receiving end.
  uint8_t info[16 + 1 + 16];
  std::memcpy(info, "softrdma wire v1", 16);
  info[16] = static_cast<uint8_t>(mode);
  std::memcpy(info + 17, &src_ip_be, 4);
  put_be32(info + 21, src_qpn);
  std::memcpy(info + 25, &dst_ip_be, 4);
  put_be32(info + 29, dst_qpn);
  uint8_t okm[32 + 4];
  const size_t okm_len = secret_len + 4;
  EVP_PKEY_CTX* pctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  bool ok = pctx && EVP_PKEY_derive_init(pctx) > 0 && EVP_PKEY_CTX_set_hkdf_md(pctx, EVP_sha256()) > 0 &&
            EVP_PKEY_CTX_set1_hkdf_key(pctx, secret, static_cast<int>(secret_len)) > 0 &&
            EVP_PKEY_CTX_add1_hkdf_info(pctx, info, sizeof info) > 0;
  size_t len = okm_len;
  ok = ok && EVP_PKEY_derive(pctx, okm, &len) > 0 && len == okm_len;
  EVP_PKEY_CTX_free(pctx);
  if (!ok) return false;
  std::memcpy(out->key, okm, secret_len);
  out->key_len = static_cast<uint8_t>(secret_len);
  std::memcpy(out->salt, okm + secret_len, 4);
  return true;
}

PacketCipher::~PacketCipher() { EVP_CIPHER_CTX_free(ctx_); }

bool PacketCipher::init(Protection mode, const DirectionKey& key, bool encrypt_side) {
  EVP_CIPHER_CTX_free(ctx_);
  ctx_ = nullptr;
  if (mode == Protection::Off || (key.key_len != 16 && key.key_len != 32)) return false;
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  if (!c) return false;
  const EVP_CIPHER* cipher = key.key_len == 16 ? EVP_aes_128_gcm() : EVP_aes_256_gcm();
  // The key schedule is set up once; each packet sets only its nonce.
  const int ok = encrypt_side ? EVP_EncryptInit_ex(c, cipher, nullptr, key.key, nullptr)
                              : EVP_DecryptInit_ex(c, cipher, nullptr, key.key, nullptr);
  if (ok != 1) {
    EVP_CIPHER_CTX_free(c);
    return false;
  }
  ctx_ = c;
  mode_ = mode;
  std::memcpy(salt_, key.salt, 4);
  return true;
}

bool PacketCipher::aad(const uint8_t* pkt, size_t hdr_len, const uint8_t* counter_be) {
  int n = 0;
  const uint8_t zero = 0;
  return EVP_CipherUpdate(ctx_, nullptr, &n, counter_be, kProtectCounterLen) == 1 &&
         EVP_CipherUpdate(ctx_, nullptr, &n, pkt, 4) == 1 && EVP_CipherUpdate(ctx_, nullptr, &n, &zero, 1) == 1 &&
         EVP_CipherUpdate(ctx_, nullptr, &n, pkt + 5, static_cast<int>(hdr_len - 5)) == 1;
}

bool PacketCipher::seal(uint8_t* pkt, size_t hdr_len, size_t body_len, uint64_t counter) {
  if (!ctx_ || hdr_len < 12) return false;
  uint8_t* trailer = pkt + hdr_len + body_len;
  put_be64(trailer, counter);
  uint8_t iv[12];
  std::memcpy(iv, salt_, 4);
  std::memcpy(iv + 4, trailer, 8);
  int n = 0;
  if (EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv) != 1 || !aad(pkt, hdr_len, trailer)) return false;
  uint8_t* body = pkt + hdr_len;
  if (body_len) {
    const bool ok = mode_ == Protection::Auth
                        ? EVP_EncryptUpdate(ctx_, nullptr, &n, body, static_cast<int>(body_len)) == 1
                        : EVP_EncryptUpdate(ctx_, body, &n, body, static_cast<int>(body_len)) == 1;
    if (!ok) return false;
  }
  uint8_t sink[16];  // GCM's final step writes no bytes
  return EVP_EncryptFinal_ex(ctx_, sink, &n) == 1 &&
         EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kProtectTagLen, trailer + kProtectCounterLen) == 1;
}

bool PacketCipher::open(const uint8_t* pkt, size_t hdr_len, size_t body_len, uint8_t* out_body, uint64_t* counter) {
  if (!ctx_ || hdr_len < 12) return false;
  const uint8_t* trailer = pkt + hdr_len + body_len;
  uint8_t iv[12];
  std::memcpy(iv, salt_, 4);
  std::memcpy(iv + 4, trailer, 8);
  uint8_t tag[kProtectTagLen];
  std::memcpy(tag, trailer + kProtectCounterLen, kProtectTagLen);
  int n = 0;
  if (EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv) != 1 || !aad(pkt, hdr_len, trailer)) return false;
  const uint8_t* body = pkt + hdr_len;
  if (body_len) {
    const bool ok = mode_ == Protection::Auth
                        ? EVP_DecryptUpdate(ctx_, nullptr, &n, body, static_cast<int>(body_len)) == 1
                        : EVP_DecryptUpdate(ctx_, out_body, &n, body, static_cast<int>(body_len)) == 1;
    if (!ok) return false;
  }
  uint8_t sink[16];
  if (EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, kProtectTagLen, tag) != 1 ||
      EVP_DecryptFinal_ex(ctx_, sink, &n) != 1)
    return false;
  *counter = get_be64(trailer);
  return true;
}

bool ReplayWindow::fresh(uint64_t c) const {
  if (!any_ || c > highest_) return true;
  if (highest_ - c >= kSize) return false;
  return !seen(c);
}

void ReplayWindow::accept(uint64_t c) {
  if (!any_ || c > highest_) {
    // Bits of the counters the window slides over are forgotten.
    if (!any_ || c - highest_ >= kSize) {
      std::memset(bits_, 0, sizeof bits_);
    } else {
      for (uint64_t x = highest_ + 1; x <= c; ++x) bits_[(x / 64) % (kSize / 64)] &= ~(uint64_t{1} << (x % 64));
    }
    highest_ = c;
    any_ = true;
  }
  bits_[(c / 64) % (kSize / 64)] |= uint64_t{1} << (c % 64);
}

}  // namespace softrdma::wire
