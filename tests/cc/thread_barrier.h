// A reusable barrier for the CPU tests' rank threads (C++17 has no std::barrier): the protocol
// simulations meet at it where the GPU's op handshake would make ranks wait for each other.
#pragma once

#include <condition_variable>
#include <mutex>

namespace interlace {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int round = round_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
  }

 private:
  const int n_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0, round_ = 0;
};

}  // namespace interlace
