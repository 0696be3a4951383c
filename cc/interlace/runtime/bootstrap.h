// TCP rendezvous of the processes of one job, with a per-job shared secret.
//
// Rank 0 listens on master_port; every other rank connects and says who it is. Rank 0 is then the
// hub of a star: all_gather sends each rank's blob to rank 0, which returns the concatenation.
// Every step has a deadline, and every failure (master unreachable, wrong secret, duplicate rank,
// world-size mismatch, a peer that dies) raises an interlace::Error saying which rank and why.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "interlace/runtime/socket.h"

namespace interlace {

struct BootstrapOptions {
  int rank = -1;
  int world_size = -1;
  std::string master_addr;
  int master_port = 0;
  // Ranks of one job must share it. It keeps processes of other jobs (a stale run on the same port)
  // out of the rendezvous; it is compared as a 64-bit hash, not a cryptographic proof.
  std::string secret;
  double timeout_s = 60.0;
};

class Bootstrap {
 public:
  // Blocks until all ranks have joined, or raises.
  explicit Bootstrap(const BootstrapOptions& options);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const BootstrapOptions& options() const { return options_; }

  // Returns every rank's blob, indexed by rank. Blobs may differ in size.
  std::vector<std::string> all_gather(const std::string& mine);
  void barrier();

 private:
  void rendezvous_as_root();
  void rendezvous_as_peer();
  // Root only: tells every joined peer why the job stops, then raises with the same text.
  [[noreturn]] void abort_all(const std::string& why);

  BootstrapOptions options_;
  Socket to_root_;              // peers: connection to rank 0
  std::vector<Socket> peers_;   // root: connection to each rank (index 0 unused)
  bool broken_ = false;         // a failed collective leaves the bootstrap unusable
};

// Hash used to compare secrets (FNV-1a, 64 bit).
uint64_t secret_hash(const std::string& secret);

}  // namespace interlace
