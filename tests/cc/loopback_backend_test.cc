// The loopback backend with host memory standing in for the GPUs: a fake engine that runs one
// operation at a time, from writes picked at random (so writes land out of order, each one's add
// after its bytes), that can fail on cue; a fake clock for the rate limit; and the whole path
// through the FIFO and a Proxy thread, as tests/cc/proxy_test.cc does with MemoryBackend.
#include "interlace/transport/loopback_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/transport/proxy.h"
#include "interlace/transport/proxy_fifo.h"

namespace interlace {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kNumFlags = 4;   // flags at offsets 0, 8, 16, 24 of every heap
constexpr uint64_t kData = 64; // data after them
constexpr uint64_t kSecond = 1000000000ull;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class FakeEngine : public LoopbackEngine {
 public:
  // steps_per_query: operations run on each done() (the engine moving along while the proxy
  // polls it, for tests with a Proxy thread); 0: only step() runs them.
  explicit FakeEngine(uint64_t seed = 1, int steps_per_query = 0) : random_(seed), steps_per_query_(steps_per_query) {}

  void copy(char* dst, const char* src, uint64_t bytes) override { issue(Op{Op::kCopy, dst, src, bytes, nullptr, 0}); }
  void add(uint64_t* flag, uint64_t value) override { issue(Op{Op::kAdd, nullptr, nullptr, 0, flag, value}); }
  Ticket record() override {
    ++issued_;
    writes_.push_back(std::move(open_));
    open_ = {};
    if (!writes_.back().ops.empty()) pending_.push_back(static_cast<Ticket>(writes_.size() - 1));
    return static_cast<Ticket>(writes_.size() - 1);
  }
  bool done(Ticket t) override {
    for (int i = 0; i < steps_per_query_; ++i) step();
    if (t >= writes_.size()) {
      ADD_FAILURE() << "asked about ticket " << t << ", never handed out";
      return false;
    }
    Write& w = writes_[t];
    if (w.retired) ADD_FAILURE() << "asked about ticket " << t << " after it was retired";
    if (!failure_.empty() || w.next < w.ops.size()) return false;
    w.retired = true;
    completion_order_.push_back(t);
    return true;
  }
  std::string failure() const override { return failure_; }

  // Runs the next operation of a write chosen at random among those with some left; false when
  // none is left (or the engine has failed).
  bool step() {
    if (pending_.empty() || !failure_.empty()) return false;
    const size_t pick = std::uniform_int_distribution<size_t>(0, pending_.size() - 1)(random_);
    Write& w = writes_[pending_[pick]];
    if (ops_run_ == fail_at_) {
      failure_ = "injected fault: the copy engine stopped";
      return false;
    }
    ++ops_run_;
    const Op& op = w.ops[w.next++];
    if (op.kind == Op::kCopy) std::memcpy(op.dst, op.src, op.bytes);
    if (op.kind == Op::kAdd) __atomic_fetch_add(op.flag, op.value, __ATOMIC_RELEASE);
    if (w.next == w.ops.size()) {
      pending_[pick] = pending_.back();
      pending_.pop_back();
    }
    return true;
  }
  void run_all() {
    while (step()) {
    }
  }
  void fail_at(uint64_t op) { fail_at_ = op; }  // the op-th operation run (from 0) fails instead

  struct Op {
    enum Kind { kCopy, kAdd } kind;
    char* dst;
    const char* src;
    uint64_t bytes;
    uint64_t* flag;
    uint64_t value;
  };
  struct Write {
    std::vector<Op> ops;
    size_t next = 0;
    bool retired = false;
  };
  const std::vector<Write>& writes() const { return writes_; }
  const std::vector<Ticket>& completion_order() const { return completion_order_; }
  uint64_t issued() const { return issued_; }  // calls of copy, add and record

 private:
  void issue(const Op& op) {
    ++issued_;
    open_.ops.push_back(op);
  }

  std::mt19937_64 random_;
  const int steps_per_query_;
  Write open_;
  std::vector<Write> writes_;
  std::vector<Ticket> pending_;  // writes with operations left
  std::vector<Ticket> completion_order_;
  uint64_t issued_ = 0;
  uint64_t ops_run_ = 0;
  uint64_t fail_at_ = std::numeric_limits<uint64_t>::max();
  std::string failure_;
};

struct Heaps {
  Heaps(int world, uint64_t heap_bytes) : bytes(heap_bytes) {
    for (int r = 0; r < world; ++r) memory.emplace_back(heap_bytes, 0);
    for (auto& m : memory) base.push_back(m.data());
  }
  uint64_t flag(int rank, int f) const {
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(base[rank] + 8 * f), __ATOMIC_ACQUIRE);
  }

  uint64_t bytes;
  std::vector<std::vector<char>> memory;
  std::vector<char*> base;
};

char fill_of(size_t i) { return static_cast<char>(i % 251 + 1); }

// n writes from rank 0 to peers[i % peers.size()]: sizes cycle through `sizes` (0: a flag alone),
// packed one after another from kData (unaligned), flags cycling over kNumFlags with adds 1..3.
std::vector<ProxyWrite> plan_writes(size_t n, std::vector<int> peers, std::vector<uint64_t> sizes) {
  std::vector<ProxyWrite> plan;
  uint64_t offset = kData;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t bytes = sizes[i % sizes.size()];
    plan.push_back(ProxyWrite{peers[i % peers.size()], offset, offset, bytes, 8 * (i % kNumFlags), 1 + i % 3});
    offset += bytes;
  }
  return plan;
}

uint64_t heap_bytes_for(const std::vector<ProxyWrite>& plan) {
  return plan.back().dst_offset + plan.back().bytes + 64;
}

void fill_sources(Heaps& h, const std::vector<ProxyWrite>& plan) {
  for (size_t i = 0; i < plan.size(); ++i) std::memset(h.base[0] + plan[i].src_offset, fill_of(i), plan[i].bytes);
}

bool landed(const Heaps& h, const std::vector<ProxyWrite>& plan, size_t i) {
  const char* p = h.base[plan[i].peer] + plan[i].dst_offset;
  return std::all_of(p, p + plan[i].bytes, [&](char c) { return c == fill_of(i); });
}

// What each (rank, flag) reads once every write has landed.
std::vector<std::vector<uint64_t>> final_flags(const std::vector<ProxyWrite>& plan, int world) {
  std::vector<std::vector<uint64_t>> want(world, std::vector<uint64_t>(kNumFlags, 0));
  for (const ProxyWrite& w : plan) want[w.peer][w.flag_offset / 8] += w.add;
  return want;
}

// Every flag reads no more than the adds of writes whose bytes have fully landed.
// Flags are read first: bytes that land after that only add to what is covered.
::testing::AssertionResult flags_never_run_ahead(const Heaps& h, const std::vector<ProxyWrite>& plan, int world) {
  std::vector<std::vector<uint64_t>> seen(world, std::vector<uint64_t>(kNumFlags, 0));
  for (int r = 0; r < world; ++r) {
    for (int f = 0; f < kNumFlags; ++f) seen[r][f] = h.flag(r, f);
  }
  std::vector<std::vector<uint64_t>> covered(world, std::vector<uint64_t>(kNumFlags, 0));
  for (size_t i = 0; i < plan.size(); ++i) {
    if (landed(h, plan, i)) covered[plan[i].peer][plan[i].flag_offset / 8] += plan[i].add;
  }
  for (int r = 0; r < world; ++r) {
    for (int f = 0; f < kNumFlags; ++f) {
      if (seen[r][f] > covered[r][f]) {
        return ::testing::AssertionFailure() << "rank " << r << "'s flag " << f << " reads " << seen[r][f]
                                             << " while writes adding up to only " << covered[r][f] << " have landed";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

const std::vector<uint64_t> kSizes = {0, 1, 7, 64, 1000, 4096, 65537};

TEST(LoopbackBackend, EachFlagMovesAfterItsBytes) {
  const auto plan = plan_writes(56, {1, 2}, kSizes);
  Heaps h(3, heap_bytes_for(plan));
  fill_sources(h, plan);
  FakeEngine engine(11);
  LoopbackBackend backend(0, h.base, h.bytes, engine, LoopbackOptions{0, 1 << 20, 64, {}});
  for (const ProxyWrite& w : plan) ASSERT_TRUE(backend.post(w));
  // Each write is issued as its copy (none for a flag alone) and then its add, to the right places.
  ASSERT_EQ(engine.writes().size(), plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    const auto& ops = engine.writes()[i].ops;
    const ProxyWrite& w = plan[i];
    ASSERT_EQ(ops.size(), w.bytes > 0 ? 2u : 1u) << "write " << i;
    if (w.bytes > 0) {
      EXPECT_EQ(ops[0].kind, FakeEngine::Op::kCopy);
      EXPECT_EQ(ops[0].dst, h.base[w.peer] + w.dst_offset);
      EXPECT_EQ(ops[0].src, h.base[0] + w.src_offset);
      EXPECT_EQ(ops[0].bytes, w.bytes);
    }
    EXPECT_EQ(ops.back().kind, FakeEngine::Op::kAdd);
    EXPECT_EQ(ops.back().flag, reinterpret_cast<uint64_t*>(h.base[w.peer] + w.flag_offset));
    EXPECT_EQ(ops.back().value, w.add);
  }
  // One operation at a time, writes interleaved at random: no flag ever runs ahead of its bytes.
  while (engine.step()) ASSERT_TRUE(flags_never_run_ahead(h, plan, 3));
  backend.progress();
  EXPECT_EQ(backend.in_flight(), 0u);
  EXPECT_EQ(backend.writes_landed(), plan.size());
}

TEST(LoopbackBackend, ManyWritesInFlightLandOutOfOrderAndFlagsCount) {
  const auto plan = plan_writes(700, {1, 2}, kSizes);
  Heaps h(3, heap_bytes_for(plan));
  fill_sources(h, plan);
  FakeEngine engine(5);
  constexpr uint32_t kDepth = 64;
  LoopbackBackend backend(0, h.base, h.bytes, engine, LoopbackOptions{0, 1 << 20, kDepth, {}});
  std::mt19937_64 random(9);
  size_t next = 0;
  for (int round = 0; backend.writes_landed() < plan.size(); ++round) {
    ASSERT_LT(round, 100000) << "the writes never all landed";
    while (next < plan.size() && backend.post(plan[next])) ++next;
    EXPECT_LE(backend.in_flight(), kDepth);
    for (int s = std::uniform_int_distribution<int>(0, 40)(random); s > 0 && engine.step(); --s) {
    }
    backend.progress();
    ASSERT_TRUE(flags_never_run_ahead(h, plan, 3));
  }
  EXPECT_EQ(backend.most_in_flight(), kDepth);
  const auto& order = engine.completion_order();
  EXPECT_FALSE(std::is_sorted(order.begin(), order.end())) << "the fake engine was meant to land writes out of order";
  const auto want = final_flags(plan, 3);
  for (int r = 1; r < 3; ++r) {
    for (int f = 0; f < kNumFlags; ++f) EXPECT_EQ(h.flag(r, f), want[r][f]) << "rank " << r << " flag " << f;
  }
  for (size_t i = 0; i < plan.size(); ++i) EXPECT_TRUE(landed(h, plan, i)) << "write " << i;
  EXPECT_EQ(backend.failure(), "");
}

TEST(ByteRateLimiter, AdmitsTheRateOverASimulatedSecondAndBoundsBursts) {
  constexpr double kRate = 50e9;  // a 400 Gb/s NIC
  constexpr uint64_t kBurst = 1 << 20, kWrite = 256 << 10;
  ByteRateLimiter limiter(kRate, kBurst, 0);
  uint64_t admitted = 0;
  for (uint64_t now = 0; now <= kSecond; now += 1000) {  // a greedy producer, every microsecond
    while (limiter.admit(kWrite, now)) admitted += kWrite;
    // Never ahead of the bucket plus the rate; never more than one write behind it.
    const double allowed = kBurst + kRate * static_cast<double>(now) / kSecond;
    ASSERT_LE(static_cast<double>(admitted), allowed + 1) << "at " << now << " ns";
    ASSERT_GE(static_cast<double>(admitted), allowed - kWrite - 1) << "at " << now << " ns";
  }
  EXPECT_NEAR(static_cast<double>(admitted), kRate, 0.001 * kRate);
  // After a long idle spell the bucket holds kBurst at most: that is the largest burst.
  uint64_t burst = 0;
  while (limiter.admit(kWrite, 5 * kSecond)) burst += kWrite;
  EXPECT_EQ(burst, kBurst);
}

TEST(ByteRateLimiter, AWriteLargerThanTheBucketWaitsForAFullOneThenOwesTheRest) {
  ByteRateLimiter limiter(1e9, 1000, 0);  // a byte per ns, 1000 bytes of burst
  EXPECT_TRUE(limiter.admit(600, 0));
  EXPECT_FALSE(limiter.admit(5000, 0));    // needs a full bucket: 1000 tokens
  EXPECT_FALSE(limiter.admit(5000, 599));  // 999
  EXPECT_TRUE(limiter.admit(5000, 600));   // full: it goes, and leaves -4000
  EXPECT_FALSE(limiter.admit(1, 4600));    // 0 tokens
  EXPECT_TRUE(limiter.admit(1, 4601));
  EXPECT_TRUE(ByteRateLimiter(0, 0, 0).admit(uint64_t{1} << 50, 0));  // rate 0: unthrottled
}

TEST(LoopbackBackend, CarriesTheRateOverSimulatedTime) {
  constexpr double kRate = 100e6;
  constexpr uint64_t kBurst = 64 << 10, kWrite = 4096;
  Heaps h(2, kData + kWrite);
  uint64_t now = 0;
  FakeEngine engine;
  LoopbackBackend backend(0, h.base, h.bytes, engine, LoopbackOptions{kRate, kBurst, 1024, [&] { return now; }});
  const ProxyWrite w{1, kData, kData, kWrite, 0, 1};
  uint64_t admitted = 0, at_one_second = 0;
  for (now = 0; now <= 2 * kSecond; now += 100000) {  // a greedy producer, every 100 us
    while (backend.post(w)) admitted += kWrite;
    if (now == kSecond) at_one_second = admitted;
    engine.run_all();
    backend.progress();
    const double allowed = kBurst + kRate * static_cast<double>(now) / kSecond;
    ASSERT_LE(static_cast<double>(admitted), allowed + 1) << "at " << now << " ns";
    ASSERT_GE(static_cast<double>(admitted), allowed - kWrite - 1) << "at " << now << " ns";
  }
  EXPECT_NEAR(static_cast<double>(admitted - at_one_second), kRate, 0.001 * kRate);  // the second second
  EXPECT_EQ(backend.bytes_posted(), admitted);
  EXPECT_EQ(h.flag(1, 0), admitted / kWrite);
  // Idle for a while, then as much as it will take at one instant: one bucket's worth.
  now += 10 * kSecond;
  uint64_t burst = 0;
  while (backend.post(w)) burst += kWrite;
  EXPECT_EQ(burst, kBurst);
}

TEST(LoopbackBackend, RefusesWhenFullAndTakesMoreAfterProgress) {
  Heaps h(2, 4096);
  uint64_t now = 0;
  FakeEngine engine;
  const ProxyWrite w{1, kData, kData, 100, 0, 1};
  {
    // The send queue: 4 writes out at most, room again only once progress() has seen them land.
    LoopbackBackend backend(0, h.base, h.bytes, engine, LoopbackOptions{0, 1 << 20, 4, {}});
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(backend.post(w));
    const uint64_t issued = engine.issued();
    EXPECT_FALSE(backend.post(w));
    EXPECT_EQ(engine.issued(), issued) << "a refused write must leave no trace";
    engine.run_all();
    EXPECT_FALSE(backend.post(w));
    backend.progress();
    EXPECT_TRUE(backend.post(w));
    EXPECT_EQ(backend.most_in_flight(), 4u);
  }
  {
    // The rate: 1000 bytes of burst at a byte per ns.
    LoopbackBackend backend(0, h.base, h.bytes, engine, LoopbackOptions{1e9, 1000, 64, [&] { return now; }});
    for (int i = 0; i < 10; ++i) EXPECT_TRUE(backend.post(w));
    EXPECT_FALSE(backend.post(w));
    now += 99;
    EXPECT_FALSE(backend.post(w));
    now += 1;
    EXPECT_TRUE(backend.post(w));
    // A flag alone costs no bytes: it goes at once, however dry the bucket.
    EXPECT_TRUE(backend.post(ProxyWrite{1, 0, 0, 0, 8, 1}));
  }
}

TEST(LoopbackBackend, AFailingEngineIsReportedOnceAndLaterWritesAreDropped) {
  const auto plan = plan_writes(40, {1}, {100});
  Heaps h(2, heap_bytes_for(plan));
  FakeEngine engine;
  engine.fail_at(5);  // the third write's add, its bytes copied
  LoopbackBackend backend(0, h.base, h.bytes, engine, LoopbackOptions{0, 1 << 20, 8, {}});
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(backend.post(plan[i]));
    engine.run_all();
    backend.progress();
  }
  const std::string why = backend.failure();
  EXPECT_EQ(why, "rank 0's loopback proxy: injected fault: the copy engine stopped");
  EXPECT_EQ(backend.writes_landed(), 2u);
  const uint64_t issued = engine.issued();
  EXPECT_TRUE(backend.post(plan[4]));  // taken and dropped: the group is aborting
  EXPECT_EQ(engine.issued(), issued);
  backend.progress();
  EXPECT_EQ(backend.failure(), why);
}

TEST(LoopbackBackend, AFailingEngineReachesTheGroupOnceThroughTheProxy) {
  constexpr uint32_t kSlots = 8;
  const auto plan = plan_writes(300, {1}, {64});
  Heaps h(2, heap_bytes_for(plan));
  std::vector<ProxyRequest> slots(kSlots);
  uint64_t claimed = 0, consumed = 0;
  FakeEngine engine(3, 1);
  engine.fail_at(100);
  LoopbackBackend backend(0, h.base, h.bytes, engine, LoopbackOptions{0, 1 << 20, 16, {}});
  std::atomic<int> reports{0};
  std::mutex why_mutex;
  std::string why;
  {
    Proxy proxy(ProxyQueue{slots.data(), &consumed, kSlots}, backend, 2, [&](const std::string& reason) {
      std::lock_guard<std::mutex> lock(why_mutex);
      why = reason;
      ++reports;
    });
    const ProxyFifo fifo{slots.data(), &claimed, &consumed, kSlots};
    const auto start = Clock::now();
    for (const ProxyWrite& w : plan) {
      // After the failure the proxy drops requests: producers never wait on it for long.
      ASSERT_EQ(proxy_post(fifo, ProxyRequest{w.src_offset, w.dst_offset, w.bytes, w.flag_offset, w.add, w.peer, 0, 0},
                           10 * kSecond, [] { return false; }),
                PostResult::kPosted);
    }
    while (reports == 0 && seconds_since(start) < 5) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // time for a second report, were there one
  }
  EXPECT_EQ(reports.load(), 1);
  EXPECT_NE(why.find("injected fault"), std::string::npos) << why;
}

TEST(LoopbackBackend, WritesOutsideTheHeapsAreRefused) {
  Heaps h(2, 4096);
  struct Case {
    ProxyWrite w;
    const char* says;
  };
  const Case cases[] = {
      {{2, 0, 0, 8, 0, 1}, "to rank 2, which has no heap on this host (2 heaps)"},
      {{-1, 0, 0, 8, 0, 1}, "to rank -1, which has no heap"},
      {{1, 4000, 0, 200, 0, 1}, "runs past the heap"},
      {{1, 0, 4000, 200, 0, 1}, "runs past the heap"},
      {{1, 8, 8, std::numeric_limits<uint64_t>::max() - 4, 0, 1}, "runs past the heap"},
      {{1, 0, 0, 8, 4, 1}, "flag at offset 4, which is not an 8-byte aligned word"},
      {{1, 0, 0, 8, 4096, 1}, "flag at offset 4096"},
  };
  for (const Case& c : cases) {
    FakeEngine engine;
    LoopbackBackend backend(0, h.base, h.bytes, engine);
    EXPECT_TRUE(backend.post(c.w));  // taken and dropped, with the reason
    EXPECT_EQ(engine.issued(), 0u) << c.says;
    EXPECT_NE(backend.failure().find(c.says), std::string::npos) << backend.failure();
    EXPECT_EQ(backend.failure().rfind("rank 0's loopback proxy: a write", 0), 0u) << backend.failure();
  }
  FakeEngine engine;
  EXPECT_THROW(LoopbackBackend(2, h.base, h.bytes, engine), Error);  // its own rank has no heap
}

// The whole path: producer threads post with the kernels' proxy_post(), a Proxy thread serves the
// FIFO, the backend carries writes through an engine that lands them out of order.
TEST(LoopbackBackend, CarriesAProxyQueueEndToEnd) {
  constexpr uint32_t kSlots = 16;
  constexpr size_t kThreads = 2, kPerThread = 350;
  const auto plan = plan_writes(kThreads * kPerThread, {1, 2}, kSizes);
  Heaps h(3, heap_bytes_for(plan));
  fill_sources(h, plan);
  std::vector<ProxyRequest> slots(kSlots);
  uint64_t claimed = 0, consumed = 0;
  FakeEngine engine(21, /*steps_per_query=*/1);
  LoopbackBackend backend(0, h.base, h.bytes, engine, LoopbackOptions{0, 1 << 20, 32, {}});
  std::string failure;
  const auto want = final_flags(plan, 3);
  std::atomic<bool> receiver_ok{true};
  {
    Proxy proxy(ProxyQueue{slots.data(), &consumed, kSlots}, backend, 3,
                [&](const std::string& why) { failure = why; });
    std::thread receiver([&] {  // rank 1 and 2's view: a flag's count never runs ahead of the bytes
      const auto start = Clock::now();
      while (seconds_since(start) < 20) {
        bool all = true;
        for (int r = 1; r < 3; ++r) {
          for (int f = 0; f < kNumFlags; ++f) all &= h.flag(r, f) == want[r][f];
        }
        if (!flags_never_run_ahead(h, plan, 3)) receiver_ok = false;
        if (all) break;
      }
    });
    const ProxyFifo fifo{slots.data(), &claimed, &consumed, kSlots};
    std::vector<std::thread> producers;
    for (size_t t = 0; t < kThreads; ++t) {
      producers.emplace_back([&, t] {
        for (size_t j = 0; j < kPerThread; ++j) {
          const ProxyWrite& w = plan[t * kPerThread + j];
          EXPECT_EQ(proxy_post(fifo, ProxyRequest{w.src_offset, w.dst_offset, w.bytes, w.flag_offset, w.add, w.peer, 0, 0},
                               10 * kSecond, [] { return false; }),
                    PostResult::kPosted);
        }
      });
    }
    for (auto& p : producers) p.join();
    receiver.join();
    EXPECT_EQ(proxy.taken(), plan.size());
  }
  EXPECT_TRUE(receiver_ok) << "a flag counted a write whose bytes had not landed";
  for (int r = 1; r < 3; ++r) {
    for (int f = 0; f < kNumFlags; ++f) EXPECT_EQ(h.flag(r, f), want[r][f]) << "rank " << r << " flag " << f;
  }
  for (size_t i = 0; i < plan.size(); ++i) EXPECT_TRUE(landed(h, plan, i)) << "write " << i;
  EXPECT_LE(backend.most_in_flight(), 32u);
  EXPECT_EQ(failure, "");
}

TEST(LoopbackBackend, ThrottlesAProxyQueueOnTheRealClock) {
  constexpr double kRate = 50e6;
  constexpr uint64_t kBurst = 64 << 10;
  const auto plan = plan_writes(320, {1}, {16 << 10});  // 5 MiB: at least 0.1 s at 50 MB/s
  Heaps h(2, heap_bytes_for(plan));
  fill_sources(h, plan);
  std::vector<ProxyRequest> slots(8);
  uint64_t claimed = 0, consumed = 0;
  FakeEngine engine(2, 1);
  LoopbackBackend backend(0, h.base, h.bytes, engine, LoopbackOptions{kRate, kBurst, 16, {}});
  const auto start = Clock::now();
  uint64_t total = 0;
  {
    Proxy proxy(ProxyQueue{slots.data(), &consumed, 8}, backend, 2, [](const std::string&) {});
    const ProxyFifo fifo{slots.data(), &claimed, &consumed, 8};
    for (const ProxyWrite& w : plan) {
      total += w.bytes;
      ASSERT_EQ(proxy_post(fifo, ProxyRequest{w.src_offset, w.dst_offset, w.bytes, w.flag_offset, w.add, w.peer, 0, 0},
                           10 * kSecond, [] { return false; }),
                PostResult::kPosted);
    }
    const auto want = final_flags(plan, 2);
    for (int f = 0; f < kNumFlags; ++f) {
      while (h.flag(1, f) < want[1][f] && seconds_since(start) < 10) std::this_thread::yield();
    }
  }
  const double seconds = seconds_since(start);
  EXPECT_GE(seconds, (static_cast<double>(total) - kBurst) / kRate) << "faster than the rate";
  EXPECT_LT(seconds, 10.0);
  for (size_t i = 0; i < plan.size(); ++i) EXPECT_TRUE(landed(h, plan, i)) << "write " << i;
}

}  // namespace
}  // namespace interlace
