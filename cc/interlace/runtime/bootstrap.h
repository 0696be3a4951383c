// TCP rendezvous of the processes of one job, with a per-job shared secret.
//
// Rank 0 listens on master_addr:master_port (that address only); every other rank connects and
// proves it knows the secret. Rank 0 is then the hub of a star: all_gather sends each rank's blob to
// rank 0, which returns the concatenation. Every step has a deadline, and every failure (master
// unreachable, wrong secret, duplicate rank, world-size mismatch, a peer that dies) raises an
// interlace::Error saying which rank and why.
//
// Strangers. Rank 0 sends each new connection a fresh random nonce; the peer answers with its rank
// and world size and HMAC-SHA256(secret, nonce, those fields), and rank 0's welcome carries an HMAC
// of the peer's own nonce, so each side knows the other has the secret. A recorded hello is useless
// on a new connection (another nonce), and the secret never crosses the wire. Until a connection
// has proven itself rank 0 reads from it only a hello of the exact size, gives it a few seconds,
// serves it alongside all others, and on failure drops it and goes on: strangers, port scanners and
// idle sockets cannot stall, crash or bloat the rendezvous. The bootstrap authenticates ranks; it
// does not encrypt, and once joined a connection is trusted (an attacker on the path could still
// tamper with it).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "interlace/runtime/socket.h"

namespace interlace {

struct BootstrapOptions {
  int rank = -1;
  int world_size = -1;
  std::string master_addr;
  int master_port = 0;
  // Ranks of one job must share it; it keeps processes of other jobs and other users out of the
  // rendezvous. Required, and best a random string (INTERLACE_SECRET=$(openssl rand -hex 16)),
  // when master_addr is not a loopback address. On loopback it may be empty: then any process of
  // this host that finds the port can join the job as a missing rank, and read what ranks gather.
  std::string secret;
  // Set by resolve_bootstrap_options when `secret` is only the launcher's job id: that keeps two
  // jobs on one host apart, but anyone who can list jobs knows it, so off loopback it counts as no
  // secret.
  bool secret_is_job_id = false;
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

  // Returns every rank's blob, indexed by rank. Blobs may differ in size. Safe to call from several
  // threads (they take turns), but every rank must make its collectives in the same order.
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
  std::mutex mutex_;            // one collective at a time on these connections
  bool broken_ = false;         // a failed collective leaves the bootstrap unusable
};

}  // namespace interlace
