// Wire protection (wire/protect.h): the trailer's byte layout, the nonce and AAD as specified (checked
// against OpenSSL's AES-GCM directly), tamper detection over every byte, key separation, replay window.
#include "wire/protect.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <cstring>
#include <vector>

#include "wire/headers.h"

namespace softrdma::wire {
namespace {

constexpr uint8_t kSecret[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
const wire::IpAddress kIpA = wire::IpAddress::v4(0x0100000A), kIpB = wire::IpAddress::v4(0x0200000A);

DirectionKey key_ab(Protection mode, size_t len = 16) {
  uint8_t secret[32];
  for (size_t i = 0; i < 32; ++i) secret[i] = static_cast<uint8_t>(i * 7 + 1);
  DirectionKey k{};
  EXPECT_TRUE(derive_direction_key(len == 16 ? kSecret : secret, len, mode, kIpA, 0x11, kIpB, 0x22, &k));
  return k;
}

// An RDMA WRITE ONLY (BTH + RETH) with a 13-byte payload, its pad, and room for the trailer.
std::vector<uint8_t> write_packet(uint32_t psn = 0x123456) {
  Packet p{};
  p.bth.opcode = static_cast<uint8_t>(0x0A);  // RC RDMA WRITE Only
  p.bth.pkey = kDefaultPkey;
  p.bth.dest_qp = 0x22;
  p.bth.psn = psn;
  p.bth.pad_count = pad_for(13);
  p.reth = {0x1000, 0xABCD, 13};
  std::vector<uint8_t> buf(kBthLen + kRethLen + 16 + kProtectTrailerLen, 0);
  write_headers(p, buf.data());
  for (int i = 0; i < 13; ++i) buf[kBthLen + kRethLen + i] = static_cast<uint8_t>(0x40 + i);
  return buf;
}
constexpr size_t kHdr = kBthLen + kRethLen, kBody = 16;

TEST(Protect, TrailerLayoutIsCounterBigEndianThenTag) {
  ProtectTrailer t{};
  t.counter = 0x0102030405060708ull;
  for (int i = 0; i < 16; ++i) t.tag[i] = static_cast<uint8_t>(0xA0 + i);
  uint8_t buf[kProtectTrailerLen];
  write_trailer(t, buf);
  const uint8_t want[kProtectTrailerLen] = {1, 2, 3, 4, 5, 6, 7, 8, 0xA0, 0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7,
                                            0xA8, 0xA9, 0xAA, 0xAB, 0xAC, 0xAD, 0xAE, 0xAF};
  EXPECT_EQ(0, std::memcmp(buf, want, sizeof want));
  ProtectTrailer back = parse_trailer(buf);
  EXPECT_EQ(back.counter, t.counter);
  EXPECT_EQ(0, std::memcmp(back.tag, t.tag, 16));
  EXPECT_EQ(kProtectTrailerLen % 4, 0u);
}

// The tag is AES-GCM with nonce salt||counter and AAD counter||headers(byte 4 zeroed)[||body].
std::vector<uint8_t> reference_tag(const DirectionKey& k, Protection mode, const std::vector<uint8_t>& plain,
                                   uint64_t counter, std::vector<uint8_t>* cipher_body) {
  uint8_t ctr[8];
  for (int i = 0; i < 8; ++i) ctr[i] = static_cast<uint8_t>(counter >> (56 - 8 * i));
  std::vector<uint8_t> aad(ctr, ctr + 8);
  aad.insert(aad.end(), plain.begin(), plain.begin() + kHdr);
  aad[8 + 4] = 0;
  if (mode == Protection::Auth) aad.insert(aad.end(), plain.begin() + kHdr, plain.begin() + kHdr + kBody);
  uint8_t iv[12];
  std::memcpy(iv, k.salt, 4);
  std::memcpy(iv + 4, ctr, 8);
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  int n = 0;
  EXPECT_EQ(1, EVP_EncryptInit_ex(c, EVP_aes_128_gcm(), nullptr, k.key, iv));
  EXPECT_EQ(1, EVP_EncryptUpdate(c, nullptr, &n, aad.data(), static_cast<int>(aad.size())));
  cipher_body->assign(kBody, 0);
  if (mode == Protection::Encrypt) {
    EXPECT_EQ(1, EVP_EncryptUpdate(c, cipher_body->data(), &n, plain.data() + kHdr, kBody));
  }
  uint8_t sink[16];
  EXPECT_EQ(1, EVP_EncryptFinal_ex(c, sink, &n));
  std::vector<uint8_t> tag(16);
  EXPECT_EQ(1, EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag.data()));
  EVP_CIPHER_CTX_free(c);
  return tag;
}

class ProtectMode : public ::testing::TestWithParam<Protection> {};

TEST_P(ProtectMode, SealMatchesReferenceAndOpens) {
  const Protection mode = GetParam();
  const DirectionKey k = key_ab(mode);
  std::vector<uint8_t> pkt = write_packet();
  pkt[4] = 0xC0;  // FECN and BECN set: masked out of the AAD
  const std::vector<uint8_t> plain = pkt;
  PacketCipher tx, rx, ossl_rx;
  ASSERT_TRUE(tx.init(mode, k, true));
  ASSERT_TRUE(rx.init(mode, k, false));
  ASSERT_TRUE(ossl_rx.init(mode, k, false, CipherImpl::OpenSsl));
  ASSERT_TRUE(tx.seal(pkt.data(), kHdr, kBody, 0x1122334455667788ull));
  std::vector<uint8_t> ref_body;
  std::vector<uint8_t> tag = reference_tag(k, mode, plain, 0x1122334455667788ull, &ref_body);
  EXPECT_EQ(0, std::memcmp(pkt.data() + kHdr + kBody + 8, tag.data(), 16));
  EXPECT_EQ(0, std::memcmp(pkt.data(), plain.data(), kHdr)) << "headers stay in clear";
  if (mode == Protection::Auth) {
    EXPECT_EQ(0, std::memcmp(pkt.data() + kHdr, plain.data() + kHdr, kBody)) << "auth: payload in clear";
  } else {
    EXPECT_EQ(0, std::memcmp(pkt.data() + kHdr, ref_body.data(), kBody));
    EXPECT_NE(0, std::memcmp(pkt.data() + kHdr, plain.data() + kHdr, kBody)) << "encrypt: payload hidden";
  }
  pkt[4] = 0;  // the network cleared ECN bits: still verifies
  std::vector<uint8_t> out(kBody, 0xEE);
  uint64_t counter = 0;
  for (PacketCipher* r : {&rx, &ossl_rx}) {
    ASSERT_TRUE(r->open(pkt.data(), kHdr, kBody, out.data(), &counter)) << r->impl_name();
    EXPECT_EQ(counter, 0x1122334455667788ull);
    if (mode == Protection::Encrypt) {
      EXPECT_EQ(0, std::memcmp(out.data(), plain.data() + kHdr, kBody));
    }
  }
}

TEST_P(ProtectMode, EveryByteIsCovered) {
  const Protection mode = GetParam();
  const DirectionKey k = key_ab(mode);
  PacketCipher tx, rx;
  ASSERT_TRUE(tx.init(mode, k, true));
  ASSERT_TRUE(rx.init(mode, k, false));
  std::vector<uint8_t> pkt = write_packet();
  ASSERT_TRUE(tx.seal(pkt.data(), kHdr, kBody, 7));
  uint8_t out[kBody];
  uint64_t c = 0;
  for (size_t i = 0; i < pkt.size(); ++i) {
    if (i == 4) continue;  // FECN/BECN/resv6: masked, as in the ICRC
    for (uint8_t bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> bad = pkt;
      bad[i] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_FALSE(rx.open(bad.data(), kHdr, kBody, out, &c)) << "byte " << i << " bit " << int(bit);
    }
  }
  EXPECT_TRUE(rx.open(pkt.data(), kHdr, kBody, out, &c)) << "the context survives failures";
}

TEST_P(ProtectMode, OtherDirectionModeOrSecretDoesNotOpen) {
  const Protection mode = GetParam();
  const Protection other = mode == Protection::Auth ? Protection::Encrypt : Protection::Auth;
  PacketCipher tx;
  ASSERT_TRUE(tx.init(mode, key_ab(mode), true));
  std::vector<uint8_t> pkt = write_packet();
  ASSERT_TRUE(tx.seal(pkt.data(), kHdr, kBody, 1));
  DirectionKey back{}, moved{}, wrong_mode{}, other_secret{};
  ASSERT_TRUE(derive_direction_key(kSecret, 16, mode, kIpB, 0x22, kIpA, 0x11, &back));
  ASSERT_TRUE(derive_direction_key(kSecret, 16, mode, kIpA, 0x11, kIpB, 0x23, &moved));
  ASSERT_TRUE(derive_direction_key(kSecret, 16, other, kIpA, 0x11, kIpB, 0x22, &wrong_mode));
  uint8_t s2[16] = {};
  ASSERT_TRUE(derive_direction_key(s2, 16, mode, kIpA, 0x11, kIpB, 0x22, &other_secret));
  for (const DirectionKey* k : {&back, &moved, &wrong_mode, &other_secret}) {
    PacketCipher rx;
    ASSERT_TRUE(rx.init(mode, *k, false));
    uint8_t out[kBody];
    uint64_t c = 0;
    EXPECT_FALSE(rx.open(pkt.data(), kHdr, kBody, out, &c));
  }
}

TEST_P(ProtectMode, Aes256AndEmptyBody) {
  const Protection mode = GetParam();
  const DirectionKey k = key_ab(mode, 32);
  EXPECT_EQ(k.key_len, 32);
  PacketCipher tx, rx;
  ASSERT_TRUE(tx.init(mode, k, true));
  ASSERT_TRUE(rx.init(mode, k, false));
  uint8_t ack[kBthLen + kAethLen + kProtectTrailerLen] = {0x11, 0, 0xFF, 0xFF, 0, 0, 0, 0x22, 0, 0, 0, 5, 0, 0, 0, 1};
  ASSERT_TRUE(tx.seal(ack, kBthLen + kAethLen, 0, 99));
  uint64_t c = 0;
  EXPECT_TRUE(rx.open(ack, kBthLen + kAethLen, 0, nullptr, &c));
  EXPECT_EQ(c, 99u);
  ack[11] ^= 1;  // the PSN
  EXPECT_FALSE(rx.open(ack, kBthLen + kAethLen, 0, nullptr, &c));
}

INSTANTIATE_TEST_SUITE_P(Modes, ProtectMode, ::testing::Values(Protection::Auth, Protection::Encrypt),
                         [](const auto& info) { return std::string(protection_name(info.param)); });

// Both implementations (the multi-buffer library where built, and OpenSSL) compute the same AES-GCM:
// each opens what the other sealed, for every body length around the block and vector sizes, for
// AES-128 and AES-256, sealing in place and while copying the payload from elsewhere (with pad).
TEST_P(ProtectMode, ImplementationsAgreeAndSealWhileCopying) {
  const Protection mode = GetParam();
  if (!fast_gcm_available()) GTEST_SKIP() << "built without the multi-buffer library, or no AES-NI";
  for (size_t key_len : {16, 32}) {
    const DirectionKey k = key_ab(mode, key_len);
    PacketCipher fast_tx, fast_rx, ossl_tx, ossl_rx;
    ASSERT_TRUE(fast_tx.init(mode, k, true));
    ASSERT_TRUE(fast_rx.init(mode, k, false));
    ASSERT_TRUE(ossl_tx.init(mode, k, true, CipherImpl::OpenSsl));
    ASSERT_TRUE(ossl_rx.init(mode, k, false, CipherImpl::OpenSsl));
    EXPECT_STREQ(fast_tx.impl_name(), "ipsec-mb");
    EXPECT_STREQ(ossl_tx.impl_name(), "openssl");
    for (size_t len : {0, 1, 3, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1023, 4093, 4096}) {
      const size_t pad = pad_for(static_cast<uint32_t>(len));
      std::vector<uint8_t> payload(len);
      for (size_t i = 0; i < len; ++i) payload[i] = static_cast<uint8_t>(i * 31 + len);
      std::vector<uint8_t> a = write_packet(static_cast<uint32_t>(len));
      a.resize(kHdr + len + pad + kProtectTrailerLen, 0xEE);  // pad and trailer bytes start as junk
      std::vector<uint8_t> b = a;
      std::vector<uint8_t> in_place = a;
      if (len) std::memcpy(in_place.data() + kHdr, payload.data(), len);
      std::memset(in_place.data() + kHdr + len, 0, pad);
      ASSERT_TRUE(fast_tx.seal(a.data(), kHdr, payload.data(), len, pad, 42 + len));
      ASSERT_TRUE(ossl_tx.seal(b.data(), kHdr, payload.data(), len, pad, 42 + len));
      ASSERT_TRUE(ossl_tx.seal(in_place.data(), kHdr, len + pad, 42 + len));
      EXPECT_EQ(a, b) << "same packet from both, length " << len;
      EXPECT_EQ(a, in_place) << "copying and in place agree, length " << len;
      for (PacketCipher* rx : {&fast_rx, &ossl_rx}) {
        std::vector<uint8_t> out(len + pad + 1, 0xEE);
        uint64_t c = 0;
        ASSERT_TRUE(rx->open(a.data(), kHdr, len + pad, out.data(), &c)) << rx->impl_name() << " " << len;
        EXPECT_EQ(c, 42 + len);
        if (mode == Protection::Encrypt) {
          if (len) {
            EXPECT_EQ(0, std::memcmp(out.data(), payload.data(), len));
          }
          for (size_t i = 0; i < pad; ++i) EXPECT_EQ(out[len + i], 0);
        }
        if (len) {
          std::vector<uint8_t> bad = a;
          bad[kHdr + len / 2] ^= 0x10;
          EXPECT_FALSE(rx->open(bad.data(), kHdr, len + pad, out.data(), &c)) << rx->impl_name() << " " << len;
        }
        std::vector<uint8_t> bad_tag = a;
        bad_tag.back() ^= 1;
        EXPECT_FALSE(rx->open(bad_tag.data(), kHdr, len + pad, out.data(), &c)) << rx->impl_name() << " " << len;
      }
    }
  }
}

TEST(Protect, KeyDerivationRefusesBadInput) {
  DirectionKey k{};
  EXPECT_FALSE(derive_direction_key(kSecret, 15, Protection::Auth, kIpA, 1, kIpB, 2, &k));
  EXPECT_FALSE(derive_direction_key(kSecret, 16, Protection::Off, kIpA, 1, kIpB, 2, &k));
  PacketCipher c;
  k.key_len = 20;
  EXPECT_FALSE(c.init(Protection::Auth, k, true));
  EXPECT_FALSE(c.ready());
  uint8_t buf[64] = {};
  EXPECT_FALSE(c.seal(buf, 12, 0, 0));
}

TEST(ReplayWindow, EachCounterOnceWithinTheWindow) {
  ReplayWindow w;
  EXPECT_TRUE(w.fresh(5));
  w.accept(5);
  EXPECT_FALSE(w.fresh(5));
  EXPECT_TRUE(w.fresh(3)) << "reordered, not seen";
  w.accept(3);
  EXPECT_FALSE(w.fresh(3));
  EXPECT_TRUE(w.fresh(4));
  w.accept(2000);
  EXPECT_EQ(w.highest(), 2000u);
  EXPECT_FALSE(w.fresh(4)) << "older than the window: refused";
  EXPECT_FALSE(w.fresh(2000 - ReplayWindow::kSize));
  EXPECT_TRUE(w.fresh(2000 - ReplayWindow::kSize + 1));
  EXPECT_TRUE(w.fresh(1999));
  for (uint64_t c = 1001; c < 2000; c += 3) w.accept(c);
  for (uint64_t c = 1001; c < 2000; ++c) EXPECT_EQ(w.fresh(c), (c - 1001) % 3 != 0) << c;
  w.accept(2001);  // sliding by one forgets nothing inside the window
  EXPECT_FALSE(w.fresh(1004));
  EXPECT_FALSE(w.fresh(2001));
  EXPECT_TRUE(w.fresh(2002));
  w.accept(2001 + 5 * ReplayWindow::kSize);  // a jump past the whole window clears it
  EXPECT_FALSE(w.fresh(2001));
  EXPECT_TRUE(w.fresh(2001 + 5 * ReplayWindow::kSize - 1));
}

}  // namespace
}  // namespace softrdma::wire
