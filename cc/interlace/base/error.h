// One error type for the whole library. It carries where it was raised and why; the Python
// binding turns it into interlace.Error. Library code never exits the process.
#pragma once

#include <charconv>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace interlace {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

// Integers, bools, chars and strings: what concat writes without a stream. Every op builds its
// signature with concat on every call: gemm_ar's took 0.6-0.9 us through a stream and a third of
// that without (a scratch benchmark of its arguments on the build machine's CPU).
template <typename T>
constexpr bool kPlainText = std::is_integral_v<T> || std::is_convertible_v<const T&, std::string_view>;

// One plain value onto out, as std::ostream's << writes it.
template <typename T>
void append(std::string& out, const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    out.push_back(v ? '1' : '0');
  } else if constexpr (std::is_same_v<T, char> || std::is_same_v<T, signed char> || std::is_same_v<T, unsigned char>) {
    out.push_back(static_cast<char>(v));
  } else if constexpr (std::is_integral_v<T>) {
    char text[24];
    out.append(text, std::to_chars(text, text + sizeof(text), v).ptr);
  } else {
    out.append(std::string_view(v));
  }
}

// The arguments' text, as one std::ostream would write them in turn (manipulators such as std::hex
// included: any argument that is not plain text sends the whole call through a stream).
template <typename... Args>
std::string concat(const Args&... args) {
  if constexpr ((kPlainText<Args> && ...)) {
    std::string out;
    out.reserve(128);  // a signature in one allocation
    (append(out, args), ...);
    return out;
  } else {
    std::ostringstream out;
    (out << ... << args);
    return out.str();
  }
}

[[noreturn]] void raise(const char* file, int line, const std::string& message);

}  // namespace detail
}  // namespace interlace

// IL_CHECK(cond, "message parts", value, ...): raises interlace::Error naming file and line.
#define IL_CHECK(cond, ...)                                                                \
  do {                                                                                     \
    if (!(cond)) ::interlace::detail::raise(__FILE__, __LINE__, ::interlace::detail::concat(__VA_ARGS__)); \
  } while (0)

#define IL_FAIL(...) ::interlace::detail::raise(__FILE__, __LINE__, ::interlace::detail::concat(__VA_ARGS__))
