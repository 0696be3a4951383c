#include "interlace/base/error.h"

namespace interlace::detail {

void raise(const char* file, int line, const std::string& message) {
  const char* base = file;
  for (const char* p = file; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  throw Error(concat("interlace: ", message, " [", base, ":", line, "]"));
}

}  // namespace interlace::detail
