#include "interlace/runtime/signature_cache.h"

#include <string>

#include "gtest/gtest.h"

namespace interlace {
namespace {

TEST(SignatureCache, IsBoundedAndKeepsTheMostRecentlyUsed) {
  SignatureCache cache(3);
  for (const char* s : {"a", "b", "c"}) cache.add(s);
  EXPECT_TRUE(cache.touch("a"));  // a is now the most recent; b the least
  cache.add("d");
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_FALSE(cache.touch("b"));
  EXPECT_TRUE(cache.touch("a"));
  EXPECT_TRUE(cache.touch("c"));
  EXPECT_TRUE(cache.touch("d"));
  for (int i = 0; i < 10000; ++i) cache.add("call " + std::to_string(i));
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_TRUE(cache.touch("call 9999"));
  EXPECT_FALSE(cache.touch("call 0"));
}

TEST(SignatureCache, AddingAKnownSignatureDoesNotDuplicateIt) {
  SignatureCache cache(2);
  cache.add("x");
  cache.add("x");
  cache.add("y");
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_TRUE(cache.touch("x"));
  EXPECT_TRUE(cache.touch("y"));
}

}  // namespace
}  // namespace interlace
