// AES-GCM packet protection (protect.h) over the multi-buffer crypto library where the build has it,
// else OpenSSL's EVP interface; HKDF key derivation; the anti-replay window.
#include "wire/protect.h"

#include "wire/bytes.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>

#include <cstring>
#include <utility>

#ifdef SOFTRDMA_HAVE_IPSEC_MB
// Its header aligns the key data to 64 bytes only when LINUX is defined.
#define LINUX
#include <intel-ipsec-mb.h>
#undef LINUX
#endif

namespace softrdma::wire {

const char* protection_name(Protection p) {
  switch (p) {
    case Protection::Off: return "off";
    case Protection::Auth: return "auth";
    case Protection::Encrypt: return "encrypt";
  }
  return "?";
}

void write_trailer(const ProtectTrailer& t, uint8_t* buf) {
  be::put64(buf, t.counter);
  std::memcpy(buf + kProtectCounterLen, t.tag, kProtectTagLen);
}

ProtectTrailer parse_trailer(const uint8_t* buf) {
  ProtectTrailer t;
  t.counter = be::get64(buf);
  std::memcpy(t.tag, buf + kProtectCounterLen, kProtectTagLen);
  return t;
}

bool derive_direction_key(const uint8_t* secret, size_t secret_len, Protection mode, const IpAddress& src_ip,
                          uint32_t src_qpn, const IpAddress& dst_ip, uint32_t dst_qpn, DirectionKey* out) {
  if ((secret_len != 16 && secret_len != 32) || mode == Protection::Off) return false;
  // info: a label, the mode, then the sending end and the receiving end (address, QPN).
  uint8_t info[16 + 1 + 2 * (16 + 4)];
  std::memcpy(info, "softrdma wire v2", 16);  // format 2: TVer 1, no ICRC (protect.h)
  info[16] = static_cast<uint8_t>(mode);
  size_t at = 17;
  for (const auto& [ip, qpn] : {std::pair{&src_ip, src_qpn}, std::pair{&dst_ip, dst_qpn}}) {
    const size_t n = ip->is_v4() ? 4 : 16;
    std::memcpy(info + at, ip->bytes.data() + 16 - n, n);
    be::put32(info + at + n, qpn);
    at += n + 4;
  }
  uint8_t okm[32 + 4];
  const size_t okm_len = secret_len + 4;
  EVP_PKEY_CTX* pctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  bool ok = pctx && EVP_PKEY_derive_init(pctx) > 0 && EVP_PKEY_CTX_set_hkdf_md(pctx, EVP_sha256()) > 0 &&
            EVP_PKEY_CTX_set1_hkdf_key(pctx, secret, static_cast<int>(secret_len)) > 0 &&
            EVP_PKEY_CTX_add1_hkdf_info(pctx, info, static_cast<int>(at)) > 0;
  size_t len = okm_len;
  ok = ok && EVP_PKEY_derive(pctx, okm, &len) > 0 && len == okm_len;
  EVP_PKEY_CTX_free(pctx);
  if (!ok) return false;
  std::memcpy(out->key, okm, secret_len);
  out->key_len = static_cast<uint8_t>(secret_len);
  std::memcpy(out->salt, okm + secret_len, 4);
  return true;
}

// ---- The multi-buffer library (libIPSec_MB), when the build has it ----

#ifdef SOFTRDMA_HAVE_IPSEC_MB
// Its direct GCM calls take the key data and a per-call context; the manager only holds the function
// table of the code chosen for this CPU, so one serves every thread.
IMB_MGR* imb_manager() {
  static IMB_MGR* const m = []() -> IMB_MGR* {
    IMB_MGR* mgr = alloc_mb_mgr(0);
    if (!mgr) return nullptr;
    IMB_ARCH arch = IMB_ARCH_NONE;
    init_mb_mgr_auto(mgr, &arch);
    // Without AES-NI its code is slower than OpenSSL's: use that.
    if (imb_get_errno(mgr) != 0 || arch < IMB_ARCH_SSE) {
      free_mb_mgr(mgr);
      return nullptr;
    }
    return mgr;
  }();
  return m;
}

struct PacketCipher::Fast {
  gcm_key_data key;  // expanded AES key and GHASH key powers (64-byte aligned)
  bool aes256;
};
#else
struct PacketCipher::Fast {};
#endif

bool fast_gcm_available() {
#ifdef SOFTRDMA_HAVE_IPSEC_MB
  return imb_manager() != nullptr;
#else
  return false;
#endif
}

namespace {
// The AAD's fixed part, contiguous: the counter, then the headers with BTH byte 4 taken as 0.
constexpr size_t kMaxHeaders = 64;  // BTH and every extension header a packet can carry fit easily
size_t header_aad(const uint8_t* pkt, size_t hdr_len, const uint8_t* counter_be, uint8_t* out) {
  std::memcpy(out, counter_be, kProtectCounterLen);
  std::memcpy(out + kProtectCounterLen, pkt, hdr_len);
  out[kProtectCounterLen + 4] = 0;
  return kProtectCounterLen + hdr_len;
}
}  // namespace

PacketCipher::~PacketCipher() {
  EVP_CIPHER_CTX_free(ctx_);
  if (fast_) {
    OPENSSL_cleanse(fast_, sizeof *fast_);
    delete fast_;
  }
}

bool PacketCipher::init(Protection mode, const DirectionKey& key, bool encrypt_side, CipherImpl impl) {
  EVP_CIPHER_CTX_free(ctx_);
  ctx_ = nullptr;
  if (fast_) {
    OPENSSL_cleanse(fast_, sizeof *fast_);
    delete fast_;
    fast_ = nullptr;
  }
  if (mode == Protection::Off || (key.key_len != 16 && key.key_len != 32)) return false;
  mode_ = mode;
  std::memcpy(salt_, key.salt, 4);
#ifdef SOFTRDMA_HAVE_IPSEC_MB
  if (impl == CipherImpl::Best) {
    if (IMB_MGR* m = imb_manager()) {
      fast_ = new Fast;
      fast_->aes256 = key.key_len == 32;
      if (fast_->aes256) {
        IMB_AES256_GCM_PRE(m, key.key, &fast_->key);
      } else {
        IMB_AES128_GCM_PRE(m, key.key, &fast_->key);
      }
      return true;
    }
  }
#else
  (void)impl;
#endif
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
  return true;
}

bool PacketCipher::aad(const uint8_t* pkt, size_t hdr_len, const uint8_t* counter_be) {
  // One call: each EVP call costs a provider dispatch.
  uint8_t a[kProtectCounterLen + kMaxHeaders];
  const size_t n_aad = header_aad(pkt, hdr_len, counter_be, a);
  int n = 0;
  return EVP_CipherUpdate(ctx_, nullptr, &n, a, static_cast<int>(n_aad)) == 1;
}

bool PacketCipher::seal(uint8_t* pkt, size_t hdr_len, const uint8_t* payload, size_t len, size_t pad_len,
                        uint64_t counter) {
  if (!ready() || hdr_len < 12 || hdr_len > kMaxHeaders) return false;
  uint8_t* body = pkt + hdr_len;
  uint8_t* trailer = body + len + pad_len;
  be::put64(trailer, counter);
  if (pad_len) std::memset(body + len, 0, pad_len);
  if (fast_) return seal_fast(pkt, hdr_len, payload, len, pad_len, trailer);
  uint8_t iv[12];
  nonce(trailer, iv);
  int n = 0;
  if (EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv) != 1 || !aad(pkt, hdr_len, trailer)) return false;
  if (mode_ == Protection::Auth) {
    if (len && payload != body) std::memcpy(body, payload, len);
    if (len + pad_len && EVP_EncryptUpdate(ctx_, nullptr, &n, body, static_cast<int>(len + pad_len)) != 1)
      return false;
  } else {
    // Encrypted on its way from the payload's memory into the packet: no separate copy.
    if (len && EVP_EncryptUpdate(ctx_, body, &n, payload, static_cast<int>(len)) != 1) return false;
    if (pad_len && EVP_EncryptUpdate(ctx_, body + len, &n, body + len, static_cast<int>(pad_len)) != 1) return false;
  }
  uint8_t sink[16];  // GCM's final step writes no bytes
  return EVP_EncryptFinal_ex(ctx_, sink, &n) == 1 &&
         EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kProtectTagLen, trailer + kProtectCounterLen) == 1;
}

bool PacketCipher::open(const uint8_t* pkt, size_t hdr_len, size_t body_len, uint8_t* out_body, uint64_t* counter) {
  if (!ready() || hdr_len < 12 || hdr_len > kMaxHeaders) return false;
  const uint8_t* trailer = pkt + hdr_len + body_len;
  if (fast_) {
    if (!open_fast(pkt, hdr_len, body_len, out_body, trailer)) return false;
    *counter = be::get64(trailer);
    return true;
  }
  uint8_t iv[12];
  nonce(trailer, iv);
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
  *counter = be::get64(trailer);
  return true;
}

#ifdef SOFTRDMA_HAVE_IPSEC_MB
// Auth mode is GMAC: AES-GCM with all of it as AAD and no plaintext. Encrypt mode: the header part as
// AAD, payload and pad as plaintext. Both are the AES-GCM the OpenSSL path computes.
bool PacketCipher::seal_fast(uint8_t* pkt, size_t hdr_len, const uint8_t* payload, size_t len, size_t pad_len,
                             uint8_t* trailer) {
  IMB_MGR* m = imb_manager();
  uint8_t iv[12];
  nonce(trailer, iv);
  uint8_t a[kProtectCounterLen + kMaxHeaders];
  const size_t n_aad = header_aad(pkt, hdr_len, trailer, a);
  uint8_t* body = pkt + hdr_len;
  uint8_t* tag = trailer + kProtectCounterLen;
  gcm_context_data ctx;
  const gcm_key_data* k = &fast_->key;
  if (mode_ == Protection::Auth) {
    if (len && payload != body) std::memcpy(body, payload, len);
    if (fast_->aes256) {
      IMB_AES256_GMAC_INIT(m, k, &ctx, iv, sizeof iv);
      IMB_AES256_GMAC_UPDATE(m, k, &ctx, a, n_aad);
      if (len + pad_len) IMB_AES256_GMAC_UPDATE(m, k, &ctx, body, len + pad_len);
      IMB_AES256_GMAC_FINALIZE(m, k, &ctx, tag, kProtectTagLen);
    } else {
      IMB_AES128_GMAC_INIT(m, k, &ctx, iv, sizeof iv);
      IMB_AES128_GMAC_UPDATE(m, k, &ctx, a, n_aad);
      if (len + pad_len) IMB_AES128_GMAC_UPDATE(m, k, &ctx, body, len + pad_len);
      IMB_AES128_GMAC_FINALIZE(m, k, &ctx, tag, kProtectTagLen);
    }
  } else if (fast_->aes256) {
    IMB_AES256_GCM_INIT(m, k, &ctx, iv, a, n_aad);
    if (len) IMB_AES256_GCM_ENC_UPDATE(m, k, &ctx, body, payload, len);
    if (pad_len) IMB_AES256_GCM_ENC_UPDATE(m, k, &ctx, body + len, body + len, pad_len);
    IMB_AES256_GCM_ENC_FINALIZE(m, k, &ctx, tag, kProtectTagLen);
  } else {
    IMB_AES128_GCM_INIT(m, k, &ctx, iv, a, n_aad);
    if (len) IMB_AES128_GCM_ENC_UPDATE(m, k, &ctx, body, payload, len);
    if (pad_len) IMB_AES128_GCM_ENC_UPDATE(m, k, &ctx, body + len, body + len, pad_len);
    IMB_AES128_GCM_ENC_FINALIZE(m, k, &ctx, tag, kProtectTagLen);
  }
  return true;  // its direct calls fail only on null pointers or zero lengths, which are never passed
}

bool PacketCipher::open_fast(const uint8_t* pkt, size_t hdr_len, size_t body_len, uint8_t* out_body,
                             const uint8_t* trailer) {
  IMB_MGR* m = imb_manager();
  uint8_t iv[12];
  nonce(trailer, iv);
  uint8_t a[kProtectCounterLen + kMaxHeaders];
  const size_t n_aad = header_aad(pkt, hdr_len, trailer, a);
  const uint8_t* body = pkt + hdr_len;
  uint8_t tag[kProtectTagLen];
  gcm_context_data ctx;
  const gcm_key_data* k = &fast_->key;
  if (mode_ == Protection::Auth) {
    if (fast_->aes256) {
      IMB_AES256_GMAC_INIT(m, k, &ctx, iv, sizeof iv);
      IMB_AES256_GMAC_UPDATE(m, k, &ctx, a, n_aad);
      if (body_len) IMB_AES256_GMAC_UPDATE(m, k, &ctx, body, body_len);
      IMB_AES256_GMAC_FINALIZE(m, k, &ctx, tag, kProtectTagLen);
    } else {
      IMB_AES128_GMAC_INIT(m, k, &ctx, iv, sizeof iv);
      IMB_AES128_GMAC_UPDATE(m, k, &ctx, a, n_aad);
      if (body_len) IMB_AES128_GMAC_UPDATE(m, k, &ctx, body, body_len);
      IMB_AES128_GMAC_FINALIZE(m, k, &ctx, tag, kProtectTagLen);
    }
  } else if (fast_->aes256) {
    IMB_AES256_GCM_INIT(m, k, &ctx, iv, a, n_aad);
    if (body_len) IMB_AES256_GCM_DEC_UPDATE(m, k, &ctx, out_body, body, body_len);
    IMB_AES256_GCM_DEC_FINALIZE(m, k, &ctx, tag, kProtectTagLen);
  } else {
    IMB_AES128_GCM_INIT(m, k, &ctx, iv, a, n_aad);
    if (body_len) IMB_AES128_GCM_DEC_UPDATE(m, k, &ctx, out_body, body, body_len);
    IMB_AES128_GCM_DEC_FINALIZE(m, k, &ctx, tag, kProtectTagLen);
  }
  // The computed tag against the received one, in constant time.
  return CRYPTO_memcmp(tag, trailer + kProtectCounterLen, kProtectTagLen) == 0;
}
#else
bool PacketCipher::seal_fast(uint8_t*, size_t, const uint8_t*, size_t, size_t, uint8_t*) { return false; }
bool PacketCipher::open_fast(const uint8_t*, size_t, size_t, uint8_t*, const uint8_t*) { return false; }
#endif

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
