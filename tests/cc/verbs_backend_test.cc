// The RC and SRD backends against a fake fabric: host memory as heaps, a fake NIC per rank that
// executes one work request per step (in order per queue pair for RC, in any order for SRD), with
// bounded send queues, receive slots, and peers that die. Then the proxy's teardown over them,
// against a NIC whose completions come late or never.
#include "interlace/transport/verbs_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/transport/proxy.h"
#include "interlace/transport/proxy_fifo.h"

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

// ---- Teardown ----------------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;
constexpr uint64_t kSecond = 1000000000ull;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What a TardyNic saw, kept after it is destroyed.
struct NicLog {
  std::mutex mutex;
  uint64_t completions_due = 0;   // signaled work requests posted: one per write
  uint64_t completions_polled = 0;
  bool destroyed = false;
  uint64_t unpolled_when_destroyed = 0;
  uint64_t polled() {
    std::lock_guard<std::mutex> lock(mutex);
    return completions_polled;
  }
};

// A NIC whose completions come late: each signaled work request completes `delay` after it was
// posted, or never. The proxy's thread calls it while the test reads its log, so it locks. Its
// destruction stands for its queue pairs' (IbvVerbs::release).
class TardyNic : public Verbs {
 public:
  static constexpr Clock::duration kNever = Clock::duration::max();

  TardyNic(NicLog& log, Clock::duration delay) : log_(log), delay_(delay) {}
  ~TardyNic() override {
    std::lock_guard<std::mutex> lock(log_.mutex);
    log_.destroyed = true;
    log_.unpolled_when_destroyed = log_.completions_due - log_.completions_polled;
  }
  int send_room(int) const override { return 1 << 20; }
  void post(const VerbsWork& w) override {
    if (!w.signaled) return;  // an unsignaled write completes with the signaled request after it
    std::lock_guard<std::mutex> lock(log_.mutex);
    ++log_.completions_due;
    due_.emplace_back(w, delay_ == kNever ? Clock::time_point::max() : Clock::now() + delay_);
  }
  void post_receives(int) override {}
  int poll(VerbsCompletion* out, int max) override {
    std::lock_guard<std::mutex> lock(log_.mutex);
    int n = 0;
    while (n < max && !due_.empty() && due_.front().second <= Clock::now()) {
      const VerbsWork& w = due_.front().first;
      out[n++] = VerbsCompletion{VerbsCompletion::kSend, w.id, w.peer, 0, true, ""};
      due_.pop_front();
    }
    log_.completions_polled += n;
    return n;
  }

 private:
  NicLog& log_;
  const Clock::duration delay_;
  std::deque<std::pair<VerbsWork, Clock::time_point>> due_;  // in post order, so in due order
};

using MakeBackend = std::function<std::unique_ptr<ProxyBackend>(Verbs&)>;

std::unique_ptr<ProxyBackend> rc(Verbs& nic) { return std::make_unique<RcBackend>(0, nic); }
std::unique_ptr<ProxyBackend> srd(Verbs& nic) {
  return std::make_unique<SrdBackend>(0, nic, [](uint64_t, uint64_t) {}, 4);
}

// Rank 0's path to rank 1 as CrossNodeProxy owns it: the NIC, the backend over it, the proxy thread
// serving the FIFO into it. Members go in reverse: the proxy, the backend, then the NIC.
struct Path {
  Path(NicLog& log, Clock::duration delay, const MakeBackend& make)
      : nic(log, delay), backend(make(nic)), proxy(ProxyQueue{slots.data(), &consumed, kSlots}, *backend, 2,
                                                   [](const std::string& why) { ADD_FAILURE() << why; }) {}

  // Posts n writes (40 bytes and a flag each) as a kernel would, and waits until the proxy has
  // handed every one to the backend, so they are on the NIC.
  void post_writes(uint64_t n) {
    const ProxyFifo fifo{slots.data(), &claimed, &consumed, kSlots};
    for (uint64_t i = 0; i < n; ++i) {
      const ProxyRequest r{kData + i * kBytes, kData + i * kBytes, kBytes, kFlag, 1, 1, 0, 0};
      ASSERT_EQ(proxy_post(fifo, r, 10 * kSecond, [] { return false; }), PostResult::kPosted);
    }
    const auto start = Clock::now();
    while (proxy.taken() < n && seconds_since(start) < 10) std::this_thread::yield();
    ASSERT_EQ(proxy.taken(), n);
  }

  static constexpr uint32_t kSlots = 16;
  std::vector<ProxyRequest> slots = std::vector<ProxyRequest>(kSlots);
  uint64_t claimed = 0, consumed = 0;
  TardyNic nic;
  std::unique_ptr<ProxyBackend> backend;
  Proxy proxy;
};

// Completions 200 ms late: teardown waits for them, and the queue pairs go only after the last one
// has been polled. (Before teardown waited, it destroyed them with every write still out.)
TEST(ProxyTeardown, WaitsForLateCompletionsBeforeTheQueuePairsGo) {
  constexpr auto kLate = std::chrono::milliseconds(200);
  for (const auto& [name, make] : {std::pair<const char*, MakeBackend>{"rc", rc}, {"srd", srd}}) {
    SCOPED_TRACE(name);
    NicLog log;
    auto path = std::make_unique<Path>(log, kLate, make);
    path->post_writes(8);
    ASSERT_EQ(log.polled(), 0u) << "the completions came before teardown began: this tests nothing";
    const auto start = Clock::now();
    const uint64_t abandoned = path->proxy.stop();
    path.reset();
    EXPECT_EQ(abandoned, 0u);
    EXPECT_TRUE(log.destroyed);
    EXPECT_EQ(log.completions_due, 8u);
    EXPECT_EQ(log.unpolled_when_destroyed, 0u) << "queue pairs destroyed with writes still in flight";
    EXPECT_LT(seconds_since(start), std::chrono::duration<double>(Proxy::kTeardownWait).count())
        << "it waited out the bound instead of for the completions";
  }
}

// Completions that never come (a peer that stopped answering, a stuck NIC): teardown gives up at
// the bound, says how many writes it abandoned, and the queue pairs then go regardless.
TEST(ProxyTeardown, GivesUpOnCompletionsThatNeverComeAtTheBound) {
  NicLog log;
  auto path = std::make_unique<Path>(log, TardyNic::kNever, rc);
  path->post_writes(8);
  const auto start = Clock::now();
  const uint64_t abandoned = path->proxy.stop();
  const double waited = seconds_since(start);
  path.reset();
  const double bound = std::chrono::duration<double>(Proxy::kTeardownWait).count();
  EXPECT_EQ(abandoned, 8u);
  EXPECT_GE(waited, bound) << "it gave up before the bound";
  EXPECT_LT(waited, bound + 2.0) << "it overran the bound";
  EXPECT_TRUE(log.destroyed);
  EXPECT_EQ(log.unpolled_when_destroyed, 8u);
}

// A write still out counts as traffic (ProxyBackend::progress), so the proxy keeps polling for its
// completion without pause instead of sleeping between rounds; once it completes, nothing moves.
TEST(ProxyTeardown, ProgressReportsWritesStillOut) {
  for (const auto& [name, make] : {std::pair<const char*, MakeBackend>{"rc", rc}, {"srd", srd}}) {
    SCOPED_TRACE(name);
    NicLog log;
    TardyNic nic(log, std::chrono::milliseconds(100));
    std::unique_ptr<ProxyBackend> backend = make(nic);
    EXPECT_FALSE(backend->progress()) << "nothing posted, nothing moved";
    ASSERT_TRUE(backend->post(ProxyWrite{1, 0, 0, 8, kFlag, 1}));
    EXPECT_TRUE(backend->progress()) << "a write is out before its completion comes";
    const auto start = Clock::now();
    while (backend->outstanding() > 0 && seconds_since(start) < 10) backend->progress();
    EXPECT_EQ(backend->outstanding(), 0u);
    EXPECT_FALSE(backend->progress()) << "all completed: nothing to poll for";
  }
}

// After an abort no peer waits for the writes: teardown stops at once, whatever is still out.
TEST(ProxyTeardown, AfterAnAbortDoesNotWaitForWritesInFlight) {
  NicLog log;
  auto path = std::make_unique<Path>(log, TardyNic::kNever, rc);
  path->post_writes(8);
  const auto start = Clock::now();
  EXPECT_EQ(path->proxy.stop(/*settle=*/false), 8u);
  EXPECT_EQ(path->proxy.stop(), 8u) << "a second stop must change nothing";
  path.reset();
  EXPECT_LT(seconds_since(start), 0.25) << "against a bound of " << Proxy::kTeardownWait.count() << " ms";
}

// Nothing in flight: teardown adds no wait, whether writes went and completed or none ever went.
TEST(ProxyTeardown, WithNothingInFlightIsImmediate) {
  for (const uint64_t writes : {0, 8}) {
    SCOPED_TRACE(writes);
    NicLog log;
    auto path = std::make_unique<Path>(log, Clock::duration::zero(), rc);
    path->post_writes(writes);
    const auto polled = Clock::now();
    while (log.polled() < writes && seconds_since(polled) < 10) std::this_thread::yield();
    ASSERT_EQ(log.polled(), writes);
    const auto start = Clock::now();
    EXPECT_EQ(path->proxy.stop(), 0u);
    path.reset();
    EXPECT_LT(seconds_since(start), 0.25) << "against a bound of " << Proxy::kTeardownWait.count() << " ms";
    EXPECT_EQ(log.unpolled_when_destroyed, 0u);
  }
}

}  // namespace
}  // namespace interlace
