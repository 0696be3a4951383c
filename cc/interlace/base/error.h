// One error type for the whole library. It carries where it was raised and why; the Python
// binding turns it into interlace.Error. Library code never exits the process.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace interlace {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
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
