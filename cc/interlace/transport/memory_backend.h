// A proxy backend over host memory: every rank's "heap" is a buffer in this process. The CPU
// tests use it to run the whole proxy protocol without GPUs or NICs, with the delivery order of a
// network that does not keep it (kReversed, kShuffled: as EFA's SRD), a limit on writes in flight
// (backpressure), and ranks that die.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "interlace/transport/proxy_backend.h"

namespace interlace {

class MemoryBackend : public ProxyBackend {
 public:
  enum class Order { kInOrder, kReversed, kShuffled };

  // heaps[r]: rank r's heap. Writes are delivered by progress(), max_in_flight at a time at most.
  MemoryBackend(int my_rank, std::vector<char*> heaps, size_t max_in_flight, Order order, uint64_t seed = 1);

  bool post(const ProxyWrite& w) override;
  bool progress() override;
  std::string failure() const override;
  // None: its writes move only inside progress(), on the proxy's thread, so none is under way
  // once the proxy stops; those still queued (a held network's) are dropped with the backend.
  uint64_t outstanding() const override { return 0; }

  // From now on writes to `rank` fail, as if its node went down (callable from any thread).
  void kill(int rank);
  // While held, nothing is delivered and no room frees up: a stalled network (any thread).
  void hold(bool held) { held_ = held; }
  size_t most_in_flight() const { return most_in_flight_; }

 private:
  const int my_rank_;
  std::vector<char*> heaps_;
  const size_t max_in_flight_;
  const Order order_;
  std::mt19937_64 random_;
  std::deque<ProxyWrite> in_flight_;
  size_t most_in_flight_ = 0;
  std::atomic<bool> held_{false};
  mutable std::mutex mutex_;  // guards dead_ and failure_
  std::vector<bool> dead_;
  std::string failure_;
};

}  // namespace interlace
