#include "interlace/device/signal_pad.h"

namespace interlace {

const char* op_name(OpId op) {
  switch (op) {
    case OpId::kAllGather: return "all_gather";
    default: return "unknown op";
  }
}

const char* flag_name(FlagId flag) {
  switch (flag) {
    case FlagId::kReady: return "ready";
    case FlagId::kDone: return "done";
    default: return "unknown flag";
  }
}

}  // namespace interlace
