#include "interlace/transport/verbs_backend.h"

#include "interlace/base/error.h"

namespace interlace {
using detail::concat;
namespace {

constexpr int kPollBatch = 64;

std::string failed_completion(int my_rank, const VerbsCompletion& c) {
  return concat("rank ", my_rank, "'s proxy: RDMA ", c.kind == VerbsCompletion::kSend ? "to" : "from", " rank ",
                c.peer, " failed (", c.status, "): that rank or the link to it is down");
}

// One write fewer out for each send completion. Saturating: after a failure an RC queue pair also
// reports the unsignaled write that failed and then flushes its add, two completions for one
// write; the count is then only an estimate, and teardown stops waiting on a failed backend anyway.
void retire(uint64_t& outstanding, const VerbsCompletion& c) {
  if (c.kind == VerbsCompletion::kSend && outstanding > 0) --outstanding;
}

}  // namespace

RcBackend::RcBackend(int my_rank, Verbs& verbs) : my_rank_(my_rank), verbs_(verbs) {}

bool RcBackend::post(const ProxyWrite& w) {
  const int needed = w.bytes > 0 ? 2 : 1;
  if (verbs_.send_room(w.peer) < needed) return false;
  if (w.bytes > 0) {
    // Unsignaled: the add that follows on the same queue pair completes only after it.
    verbs_.post(VerbsWork{VerbsWork::kWrite, w.peer, w.src_offset, w.dst_offset, w.bytes, 0, 0, false, false,
                          next_id_++});
  }
  verbs_.post(VerbsWork{VerbsWork::kFetchAdd, w.peer, 0, w.flag_offset, 0, w.add, 0, /*fence=*/true,
                        /*signaled=*/true, next_id_++});
  ++outstanding_;
  return true;
}

bool RcBackend::progress() {
  VerbsCompletion done[kPollBatch];
  const int n = verbs_.poll(done, kPollBatch);
  for (int i = 0; i < n; ++i) {
    retire(outstanding_, done[i]);
    if (!done[i].ok && failure_.empty()) failure_ = failed_completion(my_rank_, done[i]);
  }
  return n > 0 || outstanding_ > 0;  // writes out: keep polling for their completions
}

SrdBackend::SrdBackend(int my_rank, Verbs& verbs, FlagSink sink, int receive_slots)
    : my_rank_(my_rank), verbs_(verbs), sink_(std::move(sink)) {
  IL_CHECK(receive_slots > 0, "SrdBackend: receive_slots must be positive");
  verbs_.post_receives(receive_slots);
}

bool SrdBackend::post(const ProxyWrite& w) {
  if (w.flag_offset % 8 != 0 || w.flag_offset >= kMaxFlagOffset || w.add > kMaxAdd) {
    if (failure_.empty()) {
      failure_ = concat("rank ", my_rank_, "'s proxy: a flag at offset ", w.flag_offset, " with add ", w.add,
                        " cannot travel in SRD's 32-bit immediate (flags must lie 8-byte aligned in the first ",
                        kMaxFlagOffset, " bytes of the heap, adds be at most ", kMaxAdd, ")");
    }
    return true;  // taken and dropped: the group aborts on the failure
  }
  if (verbs_.send_room(w.peer) < 1) return false;
  // A zero-byte write still carries the immediate, so a signal alone travels the same way.
  verbs_.post(VerbsWork{VerbsWork::kWriteWithImm, w.peer, w.src_offset, w.dst_offset, w.bytes, 0,
                        encode(w.flag_offset, w.add), false, /*signaled=*/true, next_id_++});
  ++outstanding_;
  return true;
}

bool SrdBackend::progress() {
  VerbsCompletion done[kPollBatch];
  const int n = verbs_.poll(done, kPollBatch);
  int received = 0;
  for (int i = 0; i < n; ++i) {
    retire(outstanding_, done[i]);
    if (!done[i].ok) {
      if (failure_.empty()) failure_ = failed_completion(my_rank_, done[i]);
      continue;
    }
    if (done[i].kind == VerbsCompletion::kReceive) {
      uint64_t flag_offset, add;
      decode(done[i].imm, &flag_offset, &add);
      sink_(flag_offset, add);  // the bytes of this write have landed: now they may count
      ++received;
    }
  }
  if (received) verbs_.post_receives(received);  // each write with immediate used up a slot
  return n > 0 || outstanding_ > 0;  // writes out: keep polling for their completions
}

}  // namespace interlace
