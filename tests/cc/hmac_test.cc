// SHA-256 against the FIPS 180-2 examples, HMAC-SHA256 against RFC 4231's test cases.
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "interlace/runtime/hmac.h"

namespace interlace {
namespace {

std::string hex(const Digest& d, size_t bytes = 32) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    out += digits[d[i] >> 4];
    out += digits[d[i] & 15];
  }
  return out;
}

TEST(Sha256, Fips180Examples) {
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // 448 bits: the padding needs a second block.
  EXPECT_EQ(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(sha256("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                       "mnopqrstnopqrstu")),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(hex(sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PiecewiseUpdatesMatchOneShot) {
  std::string data;
  for (int i = 0; i < 1000; ++i) data += static_cast<char>(i * 7 + 3);
  for (size_t piece : {1, 3, 63, 64, 65, 500}) {
    Sha256 h;
    for (size_t pos = 0; pos < data.size(); pos += piece) h.update(data.data() + pos, std::min(piece, data.size() - pos));
    EXPECT_EQ(h.finish(), sha256(data)) << "pieces of " << piece;
  }
}

TEST(HmacSha256, Rfc4231TestCases) {
  const std::string key_aa(131, '\xaa');
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += static_cast<char>(i);
  EXPECT_EQ(hex(hmac_sha256(key4, std::string(50, '\xcd'))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0c'), "Test With Truncation"), 16), "a3b6167473100ee06e0c796c2955552b");
  // Keys longer than a block are hashed first.
  EXPECT_EQ(hex(hmac_sha256(key_aa, "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(hex(hmac_sha256(key_aa, "This is a test using a larger than block-size key and a larger than block-size "
                                    "data. The key needs to be hashed before being used by the HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(HmacSha256, ConstantTimeComparison) {
  Digest a = sha256("a");
  Digest b = a;
  EXPECT_TRUE(equal_in_constant_time(a.data(), b.data(), a.size()));
  b[31] ^= 1;
  EXPECT_FALSE(equal_in_constant_time(a.data(), b.data(), a.size()));
  b = a;
  b[0] ^= 0x80;
  EXPECT_FALSE(equal_in_constant_time(a.data(), b.data(), a.size()));
  EXPECT_TRUE(equal_in_constant_time(a.data(), b.data(), 0));
}

TEST(HmacSha256, RandomBytesDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    Digest d{};
    fill_random(d.data(), d.size());
    seen.insert(hex(d));
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(seen.count(hex(Digest{})), 0u);
}

}  // namespace
}  // namespace interlace
