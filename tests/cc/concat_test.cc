// concat writes every value as std::ostream's << would: error messages and op signatures (compared
// across ranks) keep their text whatever path a type takes.
#include <cstdint>
#include <ios>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "interlace/base/error.h"

namespace interlace {
namespace {

template <typename... Args>
std::string streamed(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

enum class Color : int32_t { kRed = 3 };
std::ostream& operator<<(std::ostream& out, Color c) { return out << "color " << static_cast<int>(c); }

TEST(Concat, WritesWhatAStreamWrites) {
  const std::string s = "text";
  const std::string_view view = "view";
  const char* c_string = "c";
  EXPECT_EQ(detail::concat("gemm_ar(m=", int64_t{-7}, ", n=", uint64_t{18446744073709551615u}, ")"),
            streamed("gemm_ar(m=", int64_t{-7}, ", n=", uint64_t{18446744073709551615u}, ")"));
  EXPECT_EQ(detail::concat(true, false, 'x', s, view, c_string, std::numeric_limits<int32_t>::min()),
            streamed(true, false, 'x', s, view, c_string, std::numeric_limits<int32_t>::min()));
  EXPECT_EQ(detail::concat(0.125, 1e-7, 3.0f, Color::kRed, short{-2}, static_cast<unsigned char>('A')),
            streamed(0.125, 1e-7, 3.0f, Color::kRed, short{-2}, static_cast<unsigned char>('A')));
  EXPECT_EQ(detail::concat("0x", std::hex, 129, " ", static_cast<const void*>(&s)),
            streamed("0x", std::hex, 129, " ", static_cast<const void*>(&s)));  // a stream's state carries over
  EXPECT_EQ(detail::concat(), "");
}

}  // namespace
}  // namespace interlace
