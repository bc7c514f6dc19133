// Key agreement of wire-protected connections (cm/protect.h): the environment's configuration, the
// block's byte layout, both sides deriving the same secret, and what a changed transcript does.
#include "cm/protect.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace softrdma::cm {
namespace {

const std::vector<uint8_t> kKey(32, 0x42);

TEST(WireConfig, OffUnlessAskedAndNeverSilentlyPlain) {
  EXPECT_FALSE(parse_wire_config(nullptr, "00112233445566778899aabbccddeeff", nullptr).on());
  EXPECT_FALSE(parse_wire_config("off", nullptr, nullptr).on());
  WireConfig c = parse_wire_config("encrypt", "00112233445566778899AABBCCDDEEFF", nullptr);
  EXPECT_EQ(c.mode, 2);
  EXPECT_TRUE(c.error.empty());
  ASSERT_EQ(c.key.size(), 16u);
  EXPECT_EQ(c.key[15], 0xFF);
  for (auto [mode, hex] : {std::pair{"auth", (const char*)nullptr}, {"auth", "0011"}, {"auth", "zz"}, {"maybe", "00112233445566778899aabbccddeeff"}}) {
    WireConfig bad = parse_wire_config(mode, hex, nullptr);
    EXPECT_TRUE(bad.on()) << mode;
    EXPECT_FALSE(bad.error.empty()) << mode << " " << (hex ? hex : "-");
  }
  char path[] = "/tmp/wire_key_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "000102030405060708090a0b0c0d0e0f1011\n", 37), 37);
  close(fd);
  c = parse_wire_config("auth", "ffff", path);  // the file wins
  EXPECT_TRUE(c.error.empty());
  ASSERT_EQ(c.key.size(), 18u);
  EXPECT_EQ(c.key[17], 0x11);
  ASSERT_EQ(0, chmod(path, 0640));  // readable by the group: refused
  c = parse_wire_config("auth", nullptr, path);
  EXPECT_TRUE(c.on());
  EXPECT_NE(c.error.find("chmod 600"), std::string::npos) << c.error;
  unlink(path);
  EXPECT_FALSE(parse_wire_config("auth", nullptr, "/nonexistent/key").error.empty());
}

TEST(WireBlock, Layout) {
  Block b{};
  b.mode = 2;
  for (int i = 0; i < 32; ++i) b.share[i] = static_cast<uint8_t>(i);
  for (int i = 0; i < 16; ++i) b.mac[i] = static_cast<uint8_t>(0x80 + i);
  uint8_t buf[kProtectBlockLen];
  encode_block(b, buf);
  EXPECT_EQ(kProtectBlockLen, 52u);
  EXPECT_EQ(buf[0], 'S');
  EXPECT_EQ(buf[1], 'W');
  EXPECT_EQ(buf[2], 2) << "version 2: packets with TVer 1 and no ICRC";
  EXPECT_EQ(buf[3], 2);
  EXPECT_EQ(buf[4], 0);
  EXPECT_EQ(buf[35], 31);
  EXPECT_EQ(buf[36], 0x80);
  EXPECT_EQ(buf[51], 0x8F);
  Block back{};
  ASSERT_TRUE(parse_block(buf, &back));
  EXPECT_EQ(0, std::memcmp(&back, &b, sizeof b));
  buf[2] = 1;  // an older softrdma's block: parsed, so that it is refused as a mismatch
  ASSERT_TRUE(parse_block(buf, &back));
  EXPECT_EQ(back.version, 1);
  buf[2] = 3;  // a version no softrdma wrote: not a block
  EXPECT_FALSE(parse_block(buf, &back));
  uint8_t zeros[kProtectBlockLen] = {};
  EXPECT_FALSE(parse_block(zeros, &back));
}

TEST(WireAgreement, BothSidesDeriveOneSecretBoundToTheTranscript) {
  Share a, b;
  ASSERT_TRUE(make_share(&a));
  ASSERT_TRUE(make_share(&b));
  EXPECT_NE(0, std::memcmp(a.pub, b.pub, 32));
  Transcript t;
  t.mode = 1;
  std::memcpy(t.share_a, a.pub, 32);
  std::memcpy(t.share_b, b.pub, 32);
  t.qpn_a = 0x11;
  t.qpn_b = 0x22;
  t.psn_a = 0x123;
  t.psn_b = 0x456;
  uint8_t sa[kWireSecretLen], sb[kWireSecretLen];
  ASSERT_TRUE(derive_secret(kKey, a.priv, b.pub, t, sa));
  ASSERT_TRUE(derive_secret(kKey, b.priv, a.pub, t, sb));
  EXPECT_EQ(0, std::memcmp(sa, sb, kWireSecretLen));
  // Another operator key, or any transcript field changed: another secret and another MAC.
  uint8_t other[kWireSecretLen];
  ASSERT_TRUE(derive_secret(std::vector<uint8_t>(32, 0x43), a.priv, b.pub, t, other));
  EXPECT_NE(0, std::memcmp(sa, other, kWireSecretLen));
  uint8_t m1[kProtectMacLen], m2[kProtectMacLen];
  rep_mac(kKey, t, m1);
  for (int f = 0; f < 5; ++f) {
    Transcript u = t;
    if (f == 0) u.mode = 2;
    if (f == 1) u.qpn_b ^= 1;
    if (f == 2) u.psn_a ^= 1;
    if (f == 3) u.share_b[7] ^= 1;
    if (f == 4) u.psn_b ^= 0x800000;
    rep_mac(kKey, u, m2);
    EXPECT_FALSE(mac_equal(m1, m2)) << f;
    ASSERT_TRUE(derive_secret(kKey, a.priv, b.pub, u, other));
    EXPECT_NE(0, std::memcmp(sa, other, kWireSecretLen)) << f;
  }
  rep_mac(kKey, t, m2);
  EXPECT_TRUE(mac_equal(m1, m2));
  req_mac(kKey, t, m2);
  EXPECT_FALSE(mac_equal(m1, m2)) << "REQ and REP MACs are domain separated";
  Transcript r = t;
  r.qpn_b = 99;  // the REQ MAC covers only what the REQ knows
  uint8_t m3[kProtectMacLen];
  req_mac(kKey, r, m3);
  EXPECT_TRUE(mac_equal(m2, m3));
}

}  // namespace
}  // namespace softrdma::cm
