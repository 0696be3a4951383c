// The RC and SRD backends against a fake fabric: host memory as heaps, a fake NIC per rank that
// executes one work request per step (in order per queue pair for RC, in any order for SRD), with
// bounded send queues, receive slots, and peers that die.
#include "interlace/transport/verbs_backend.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace interlace {
namespace {

class FakeFabric;

class FakeVerbs : public Verbs {
 public:
  FakeVerbs(FakeFabric& fabric, int rank, int send_depth) : fabric_(fabric), rank_(rank), depth_(send_depth) {}
  int send_room(int peer) const override { return depth_ - in_queue(peer); }
  void post(const VerbsWork& w) override;
  void post_receives(int count) override { receive_slots_ += count; }
  int poll(VerbsCompletion* out, int max) override {
    int n = 0;
    while (n < max && !completions_.empty()) {
      out[n++] = completions_.front();
      completions_.pop_front();
    }
    return n;
  }

  int in_queue(int peer) const {
    auto it = queued_.find(peer);
    return it == queued_.end() ? 0 : it->second;
  }

  FakeFabric& fabric_;
  int rank_;
  int depth_;
  // Work requests to a peer that hold a send-queue slot. As with real queue pairs, an unsignaled
  // request gives its slot back only when a later signaled one completes.
  std::map<int, int> queued_;
  std::map<int, int> unsignaled_done_;
  int receive_slots_ = 0;
  std::deque<VerbsCompletion> completions_;
};

class FakeFabric {
 public:
  enum class Order { kPerQueuePair, kAny };  // RC keeps each queue pair's order; SRD keeps none
  FakeFabric(int world, size_t heap_bytes, Order order, int send_depth) : order_(order), random_(3) {
    for (int r = 0; r < world; ++r) {
      memory_.emplace_back(heap_bytes, 0);
      nics_.emplace_back(*this, r, send_depth);
    }
  }
  char* heap(int r) { return memory_[r].data(); }
  FakeVerbs& nic(int r) { return nics_[r]; }
  void kill(int r) { dead_.push_back(r); }
  bool idle() const { return in_flight_.empty(); }

  void submit(int from, const VerbsWork& w) { in_flight_.push_back({from, w}); }

  // Executes one work request: the oldest (RC) or any (SRD).
  void step() {
    if (in_flight_.empty()) return;
    size_t pick = 0;
    if (order_ == Order::kAny) pick = std::uniform_int_distribution<size_t>(0, in_flight_.size() - 1)(random_);
    const auto [from, w] = in_flight_[pick];
    in_flight_.erase(in_flight_.begin() + pick);
    FakeVerbs& src = nics_[from];
    if (w.signaled) {
      src.queued_[w.peer] -= 1 + src.unsignaled_done_[w.peer];
      src.unsignaled_done_[w.peer] = 0;
    } else {
      src.unsignaled_done_[w.peer] += 1;
    }
    const bool dead = std::count(dead_.begin(), dead_.end(), w.peer) > 0;
    if (dead) {
      src.completions_.push_back({VerbsCompletion::kSend, w.id, w.peer, 0, false, "IBV_WC_RETRY_EXC_ERR"});
      return;
    }
    switch (w.op) {
      case VerbsWork::kWrite:
      case VerbsWork::kWriteWithImm:
        std::memcpy(heap(w.peer) + w.remote_offset, heap(from) + w.local_offset, w.bytes);
        break;
      case VerbsWork::kFetchAdd:
        *reinterpret_cast<uint64_t*>(heap(w.peer) + w.remote_offset) += w.add;
        break;
    }
    if (w.op == VerbsWork::kWriteWithImm) {
      FakeVerbs& dst = nics_[w.peer];
      if (dst.receive_slots_ == 0) {  // receiver not ready: the write fails on both sides
        src.completions_.push_back({VerbsCompletion::kSend, w.id, w.peer, 0, false, "IBV_WC_RNR_RETRY_EXC_ERR"});
        return;
      }
      dst.receive_slots_ -= 1;
      dst.completions_.push_back({VerbsCompletion::kReceive, 0, from, w.imm, true, ""});
    }
    if (w.signaled) src.completions_.push_back({VerbsCompletion::kSend, w.id, w.peer, 0, true, ""});
  }

 private:
  Order order_;
  std::mt19937_64 random_;
  std::vector<std::vector<char>> memory_;
  std::deque<FakeVerbs> nics_;
  std::vector<std::pair<int, VerbsWork>> in_flight_;
  std::vector<int> dead_;
};

void FakeVerbs::post(const VerbsWork& w) {
  ASSERT_LT(in_queue(w.peer), depth_) << "posted past the send queue";
  queued_[w.peer] += 1;
  fabric_.submit(rank_, w);
}

constexpr uint64_t kFlag = 0, kData = 64, kBytes = 40;

ProxyWrite write(int peer, uint64_t i) {
  return ProxyWrite{peer, kData + i * kBytes, kData + i * kBytes, kBytes, kFlag, 1};
}

uint64_t flag(FakeFabric& f, int rank) { return *reinterpret_cast<uint64_t*>(f.heap(rank) + kFlag); }

uint64_t landed(FakeFabric& f, int rank, uint64_t n) {
  uint64_t count = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const char* p = f.heap(rank) + kData + i * kBytes;
    count += std::all_of(p, p + kBytes, [&](char c) { return c == static_cast<char>(i % 200 + 1); });
  }
  return count;
}

void fill(FakeFabric& f, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) std::memset(f.heap(0) + kData + i * kBytes, static_cast<int>(i % 200 + 1), kBytes);
}

TEST(RcBackend, WritesLandBeforeTheirFlagAndFullQueuesPushBack) {
  constexpr uint64_t kN = 100;
  FakeFabric fabric(2, kData + kN * kBytes, FakeFabric::Order::kPerQueuePair, /*send_depth=*/4);
  fill(fabric, kN);
  RcBackend backend(0, fabric.nic(0));
  uint64_t posted = 0, refused = 0;
  while (posted < kN || !fabric.idle()) {
    if (posted < kN) {
      if (backend.post(write(1, posted))) {
        ++posted;
      } else {
        ++refused;  // two work requests per write, four slots: at most two writes in flight
      }
    }
    fabric.step();
    ASSERT_LE(flag(fabric, 1), landed(fabric, 1, kN)) << "a flag counted a write whose bytes had not landed";
    backend.progress();
  }
  EXPECT_GT(refused, 0u);
  EXPECT_EQ(flag(fabric, 1), kN);
  EXPECT_EQ(landed(fabric, 1, kN), kN);
  EXPECT_EQ(backend.failure(), "");
  EXPECT_EQ(backend.outstanding(), 0u);
}

TEST(RcBackend, CountsWritesOutUntilTheirAddCompletes) {
  FakeFabric fabric(2, 4096, FakeFabric::Order::kPerQueuePair, 8);
  RcBackend backend(0, fabric.nic(0));
  ASSERT_TRUE(backend.post(write(1, 0)));
  ASSERT_TRUE(backend.post(ProxyWrite{1, 0, 0, 0, kFlag, 1}));  // a flag alone: one work request
  EXPECT_EQ(backend.outstanding(), 2u);
  fabric.step();  // the first write's bytes: its add has not completed
  backend.progress();
  EXPECT_EQ(backend.outstanding(), 2u);
  fabric.step();
  backend.progress();
  EXPECT_EQ(backend.outstanding(), 1u);
  fabric.step();
  backend.progress();
  EXPECT_EQ(backend.outstanding(), 0u);
}

TEST(RcBackend, AFailedCompletionNamesThePeer) {
  FakeFabric fabric(3, 4096, FakeFabric::Order::kPerQueuePair, 8);
  RcBackend backend(0, fabric.nic(0));
  fabric.kill(2);
  ASSERT_TRUE(backend.post(write(1, 0)));
  ASSERT_TRUE(backend.post(write(2, 1)));
  for (int i = 0; i < 8; ++i) fabric.step();
  backend.progress();
  EXPECT_NE(backend.failure().find("to rank 2 failed (IBV_WC_RETRY_EXC_ERR)"), std::string::npos)
      << backend.failure();
}

TEST(SrdBackend, UnorderedWritesCountOnlyOnceTheirBytesHaveLanded) {
  constexpr uint64_t kN = 300;
  FakeFabric fabric(2, kData + kN * kBytes, FakeFabric::Order::kAny, /*send_depth=*/16);
  fill(fabric, kN);
  FakeFabric* f = &fabric;
  // The receiver's flags: rank 1's proxy adds into its heap once a write's completion arrives.
  SrdBackend sender(0, fabric.nic(0), [](uint64_t, uint64_t) { FAIL() << "rank 0 receives nothing"; }, 4);
  SrdBackend receiver(1, fabric.nic(1), [f](uint64_t offset, uint64_t add) {
    *reinterpret_cast<uint64_t*>(f->heap(1) + offset) += add;
  }, /*receive_slots=*/4);  // far fewer than the writes: the receiver must replenish them
  uint64_t posted = 0;
  while (posted < kN || !fabric.idle()) {
    if (posted < kN && sender.post(write(1, posted))) ++posted;
    fabric.step();
    receiver.progress();
    ASSERT_LE(flag(fabric, 1), landed(fabric, 1, kN)) << "a flag counted a write whose bytes had not landed";
    sender.progress();
  }
  receiver.progress();
  EXPECT_EQ(flag(fabric, 1), kN);
  EXPECT_EQ(landed(fabric, 1, kN), kN);
  EXPECT_EQ(sender.failure(), "");
  EXPECT_EQ(receiver.failure(), "");
  EXPECT_EQ(sender.outstanding(), 0u);
  EXPECT_EQ(receiver.outstanding(), 0u);  // what arrives is the peer's to wait for
}

TEST(SrdBackend, TheImmediateCarriesFlagAndAmountAndRefusesWhatDoesNotFit) {
  uint64_t offset = 0, add = 0;
  SrdBackend::decode(SrdBackend::encode(8 * 12345, 7), &offset, &add);
  EXPECT_EQ(offset, 8u * 12345);
  EXPECT_EQ(add, 7u);
  SrdBackend::decode(SrdBackend::encode(SrdBackend::kMaxFlagOffset - 8, SrdBackend::kMaxAdd), &offset, &add);
  EXPECT_EQ(offset, SrdBackend::kMaxFlagOffset - 8);
  EXPECT_EQ(add, SrdBackend::kMaxAdd);
  FakeFabric fabric(2, 4096, FakeFabric::Order::kAny, 4);
  SrdBackend backend(0, fabric.nic(0), [](uint64_t, uint64_t) {}, 4);
  EXPECT_TRUE(backend.post(ProxyWrite{1, 0, 0, 8, SrdBackend::kMaxFlagOffset, 1}));  // taken, then failure
  EXPECT_NE(backend.failure().find("cannot travel in SRD's 32-bit immediate"), std::string::npos)
      << backend.failure();
}

}  // namespace
}  // namespace interlace
