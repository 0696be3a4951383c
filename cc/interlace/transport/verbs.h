// The few RDMA verbs the network backends use, as an interface: the real one (IbvVerbs in
// ibv_verbs.h: libibverbs, with efadv for EFA, loaded at run time where present) and the fake one of
// the CPU tests (tests/cc/verbs_backend_test.cc) implement it, so the posting logic is tested
// without NICs.
#pragma once

#include <cstdint>
#include <string>

namespace interlace {

// One work request on the queue pair to `peer`. Offsets are into the registered heaps (this rank's
// for the local side, the peer's for the remote side).
struct VerbsWork {
  enum Op { kWrite, kWriteWithImm, kFetchAdd } op;
  int peer;
  uint64_t local_offset;
  uint64_t remote_offset;
  uint64_t bytes;   // kWrite, kWriteWithImm
  uint64_t add;     // kFetchAdd: added to the 8-byte word at remote_offset
  uint32_t imm;     // kWriteWithImm: arrives with the receiver's completion
  bool fence;       // start only after the earlier work on this queue pair has completed
  bool signaled;    // produce a send completion
  uint64_t id;
};

struct VerbsCompletion {
  enum Kind { kSend, kReceive } kind;
  uint64_t id;         // kSend: the work's id
  int peer;            // kSend: where the work went; kReceive: where the write came from
  uint32_t imm;        // kReceive
  bool ok;
  std::string status;  // why it failed (the verbs status), if !ok
};

class Verbs {
 public:
  virtual ~Verbs() = default;
  // Room left in the send queue to `peer` (posting more than that fails).
  virtual int send_room(int peer) const = 0;
  virtual void post(const VerbsWork& work) = 0;
  // Receive slots for incoming writes with immediate data, kept topped up by the backend.
  virtual void post_receives(int count) = 0;
  virtual int poll(VerbsCompletion* out, int max) = 0;
};

}  // namespace interlace
