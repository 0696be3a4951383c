// For tests of argument checks: the message of the interlace::Error that f() raises, or "" if none.
#pragma once

#include <string>

#include "interlace/base/error.h"

namespace interlace {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace interlace
