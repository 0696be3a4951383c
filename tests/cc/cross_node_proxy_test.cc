// CrossNodeProxy, the owner of the cross-node path: built over host memory (the memory backend,
// and the loopback backend with a host engine), carrying what a ProxyTransport posts, reporting
// failures once, tearing down cleanly (after the writes still on their way, within a bound); and
// its setup errors, the verbs backends' on this host (which has no RDMA devices) included.
#include "interlace/transport/cross_node_proxy.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "error_of.h"
#include "interlace/device/proxy_transport.h"
#include "interlace/transport/verbs_library.h"

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

namespace interlace {
namespace {

using device::ProxySend;
using device::ProxyTransport;
using Clock = std::chrono::steady_clock;
constexpr uint64_t kSecond = 1000000000ull;
constexpr uint64_t kHeapBytes = 1 << 16;
constexpr uint64_t kFlag = 0;
constexpr uint64_t kData = 1024;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Rank 0 of a group of 4 on two nodes (ranks 0, 1 on node a; 2, 3 on node b), over host memory.
struct Rig {
  explicit Rig(uint32_t capacity = 8) : slots(capacity) {
    topology = make_topology(0, {"a", "a", "b", "b"});
    for (int r = 0; r < 4; ++r) memory.emplace_back(kHeapBytes, 0);
    for (auto& m : memory) heaps.push_back(m.data());
    options.backend = CrossNodeBackend::kMemory;
    options.queue = ProxyQueue{slots.data(), &consumed, capacity};
    options.heaps = heaps;
    options.heap_bytes = kHeapBytes;
  }
  ProxyTransport transport() {
    ProxyTransport t{};
    t.fifo = ProxyFifo{slots.data(), &claimed, &consumed, static_cast<uint32_t>(slots.size())};
    t.heap = heaps[0];
    t.heap_bytes = kHeapBytes;
    t.timeout_ns = 10 * kSecond;
    t.host_abort = &abort_word;
    return t;
  }
  uint64_t flag(int r) { return __atomic_load_n(reinterpret_cast<uint64_t*>(heaps[r] + kFlag), __ATOMIC_ACQUIRE); }
  bool wait_flag(int r, uint64_t n) {
    const auto start = Clock::now();
    while (flag(r) < n) {
      if (seconds_since(start) > 10) return false;
      std::this_thread::yield();
    }
    return true;
  }

  Topology topology;
  std::vector<std::vector<char>> memory;
  std::vector<char*> heaps;
  std::vector<ProxyRequest> slots;
  uint64_t claimed = 0, consumed = 0;
  int32_t abort_word = 0;
  CrossNodeOptions options;
};

// Sends n chunks of `bytes` from rank 0 to each of ranks 2 and 3 (the other node).
void send_to_other_node(Rig& s, int n, uint64_t bytes) {
  ProxyTransport t = s.transport();
  for (int i = 0; i < n; ++i) {
    const uint64_t off = kData + i * bytes;
    std::memset(s.heaps[0] + off, i + 1, bytes);
    for (int q : {2, 3}) {
      ASSERT_EQ(t.put_signal(q, off, s.heaps[0] + off, bytes, reinterpret_cast<uint64_t*>(s.heaps[0] + kFlag), 1),
                ProxySend::kPosted);
    }
  }
}

TEST(CrossNodeProxy, CarriesWhatTheTransportPostsOverTheMemoryBackend) {
  Rig s;
  s.options.memory_order = MemoryBackend::Order::kShuffled;
  CrossNodeProxy proxy(s.topology, s.options);
  EXPECT_EQ(proxy.backend_kind(), CrossNodeBackend::kMemory);
  constexpr int kN = 100;
  send_to_other_node(s, kN, 96);
  for (int q : {2, 3}) {
    ASSERT_TRUE(s.wait_flag(q, kN));
    EXPECT_EQ(std::memcmp(s.heaps[q] + kData, s.heaps[0] + kData, kN * 96), 0);
  }
  EXPECT_EQ(proxy.taken(), 2u * kN);
  EXPECT_EQ(proxy.failure(), "");
}

// Lands every write at once, in host memory: the loopback path without a GPU.
class HostEngine : public LoopbackEngine {
 public:
  void copy(char* dst, const char* src, uint64_t bytes) override { std::memcpy(dst, src, bytes); }
  void add(uint64_t* flag, uint64_t value) override { __atomic_fetch_add(flag, value, __ATOMIC_RELEASE); }
  Ticket record() override { return next_++; }
  bool done(Ticket) override { return true; }
  std::string failure() const override { return ""; }

 private:
  Ticket next_ = 0;
};

TEST(CrossNodeProxy, CarriesWritesOverTheLoopbackBackend) {
  Rig s;
  HostEngine engine;
  s.options.backend = CrossNodeBackend::kLoopback;
  s.options.engine = &engine;
  CrossNodeProxy proxy(s.topology, s.options);
  send_to_other_node(s, 50, 40);
  for (int q : {2, 3}) {
    ASSERT_TRUE(s.wait_flag(q, 50));
    EXPECT_EQ(std::memcmp(s.heaps[q] + kData, s.heaps[0] + kData, 50 * 40), 0);
  }
  auto& backend = dynamic_cast<LoopbackBackend&>(proxy.backend());
  EXPECT_EQ(backend.bytes_posted(), 2u * 50 * 40);
}

TEST(CrossNodeProxy, ABackendFailureIsReportedOnceAndKept) {
  Rig s;
  std::atomic<int> reports{0};
  std::string first;
  std::mutex mutex;
  s.options.on_failure = [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex);
    if (reports++ == 0) first = why;
    s.abort_word = 1;
  };
  CrossNodeProxy proxy(s.topology, s.options);
  dynamic_cast<MemoryBackend&>(proxy.backend()).kill(3);
  ProxyTransport t = s.transport();
  const auto start = Clock::now();
  for (int i = 0; i < 40; ++i) {
    const ProxySend r = t.signal(2 + i % 2, reinterpret_cast<uint64_t*>(s.heaps[0] + kFlag), 1);
    ASSERT_TRUE(r == ProxySend::kPosted || r == ProxySend::kStopped);
  }
  while (proxy.failure().empty() && seconds_since(start) < 5) std::this_thread::yield();
  EXPECT_HAS(proxy.failure(), "rank 3 is unreachable");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_EQ(reports.load(), 1);
  EXPECT_EQ(first, proxy.failure());
}

TEST(CrossNodeProxy, TearsDownPromptlyWithWritesStuckInAStalledBackend) {
  Rig s(4);
  s.options.memory_max_in_flight = 1;
  auto proxy = std::make_unique<CrossNodeProxy>(s.topology, s.options);
  dynamic_cast<MemoryBackend&>(proxy->backend()).hold(true);
  ProxyTransport t = s.transport();
  for (int i = 0; i < 5; ++i) ASSERT_EQ(t.signal(2, reinterpret_cast<uint64_t*>(s.heaps[0] + kFlag), 1), ProxySend::kPosted);
  const auto start = Clock::now();
  proxy.reset();
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_EQ(s.flag(2), 0u);
}

// Lands a write only when asked about it `delay` after it was issued, or never: a GPU stream still
// copying when the proxy is torn down. Called from the proxy's thread only.
class LateEngine : public LoopbackEngine {
 public:
  static constexpr Clock::duration kNever = Clock::duration::max();
  explicit LateEngine(Clock::duration delay) : delay_(delay) {}
  void copy(char* dst, const char* src, uint64_t bytes) override {
    issued_.push_back([=] { std::memcpy(dst, src, bytes); });
  }
  void add(uint64_t* flag, uint64_t value) override {
    issued_.push_back([=] { __atomic_fetch_add(flag, value, __ATOMIC_RELEASE); });
  }
  Ticket record() override {
    const auto due = delay_ == kNever ? Clock::time_point::max() : Clock::now() + delay_;
    writes_.push_back({std::move(issued_), due});
    issued_.clear();
    return static_cast<Ticket>(writes_.size() - 1);
  }
  bool done(Ticket t) override {
    if (Clock::now() < writes_[t].due) return false;
    for (auto& op : writes_[t].ops) op();  // the copy, then the add
    return true;
  }
  std::string failure() const override { return ""; }

 private:
  struct Write {
    std::vector<std::function<void()>> ops;
    Clock::time_point due;
  };
  const Clock::duration delay_;
  std::vector<std::function<void()>> issued_;
  std::vector<Write> writes_;
};

// The process's last op posted its writes and it exits at once: they still land.
TEST(CrossNodeProxy, TeardownLandsTheWritesStillOnTheirWay) {
  Rig s;
  LateEngine engine(std::chrono::milliseconds(100));
  s.options.backend = CrossNodeBackend::kLoopback;
  s.options.engine = &engine;
  auto proxy = std::make_unique<CrossNodeProxy>(s.topology, s.options);
  send_to_other_node(s, 5, 40);
  while (proxy->taken() < 10) std::this_thread::yield();
  ASSERT_EQ(s.flag(2), 0u) << "the writes landed before teardown began: this tests nothing";
  proxy.reset();
  for (int q : {2, 3}) {
    EXPECT_EQ(s.flag(q), 5u);
    EXPECT_EQ(std::memcmp(s.heaps[q] + kData, s.heaps[0] + kData, 5 * 40), 0);
  }
}

TEST(CrossNodeProxy, TeardownGivesUpOnWritesThatNeverLandAndSaysSo) {
  Rig s;
  LateEngine engine(LateEngine::kNever);
  s.options.backend = CrossNodeBackend::kLoopback;
  s.options.engine = &engine;
  auto proxy = std::make_unique<CrossNodeProxy>(s.topology, s.options);
  send_to_other_node(s, 1, 40);
  while (proxy->taken() < 2) std::this_thread::yield();
  testing::internal::CaptureStderr();
  const auto start = Clock::now();
  proxy.reset();
  const double waited = seconds_since(start);
  const std::string told = testing::internal::GetCapturedStderr();
  const double bound = std::chrono::duration<double>(Proxy::kTeardownWait).count();
  EXPECT_GE(waited, bound);
  EXPECT_LT(waited, bound + 2.0);
  EXPECT_HAS(told, "rank 0's cross-node proxy (loopback) tore down with 2 write(s) still in flight");
  EXPECT_HAS(told, "no completion within 5000 ms");
}

TEST(CrossNodeProxy, SetupErrorsSayWhatIsWrong) {
  auto error = [](Rig& s) { return error_of([&] { CrossNodeProxy proxy(s.topology, s.options); }); };
  {
    Rig s;
    s.topology = make_topology(0, {"a", "a"});
    s.options.heaps.resize(2);
    EXPECT_HAS(error(s), "rank 0's cross-node proxy (memory): the group has one node");
  }
  {
    Rig s;
    s.options.queue.capacity = 6;
    EXPECT_HAS(error(s), "capacity must be a power of two, got 6");
  }
  {
    Rig s;
    s.options.queue.slots = nullptr;
    EXPECT_HAS(error(s), "no FIFO memory");
  }
  {
    Rig s;
    s.options.heaps.pop_back();
    EXPECT_HAS(error(s), "got 3 for 4 ranks");
  }
  {
    Rig s;
    HostEngine engine;
    s.options.backend = CrossNodeBackend::kLoopback;
    s.options.engine = &engine;
    s.options.heaps[3] = nullptr;
    EXPECT_HAS(error(s), "(loopback): rank 3's heap is not mapped in this process");
    EXPECT_HAS(error(s), "every rank must run on it");
  }
  {
    Rig s;
    s.options.backend = CrossNodeBackend::kLoopback;
    EXPECT_HAS(error(s), "no loopback engine");
  }
  {
    Rig s;
    s.options.backend = CrossNodeBackend::kRc;
    s.options.ibv.heap_address = 0x10000;
    s.options.ibv.heap_bytes = kHeapBytes;
    EXPECT_HAS(error(s), "(ibverbs): no exchange");
  }
  {
    Rig s;
    s.options.backend = CrossNodeBackend::kSrd;
    s.options.all_gather = [](const std::string& b) { return std::vector<std::string>{b}; };
    EXPECT_HAS(error(s), "(efa): the heap to register was not given");
    s.options.ibv.heap_address = 0x10000;
    s.options.ibv.heap_bytes = kHeapBytes;
    EXPECT_HAS(error(s), "SRD needs a flag sink");
  }
}

TEST(CrossNodeBackendName, ParsesTheNamesUsersGive) {
  EXPECT_EQ(parse_cross_node_backend("loopback"), CrossNodeBackend::kLoopback);
  EXPECT_EQ(parse_cross_node_backend("ibverbs"), CrossNodeBackend::kRc);
  EXPECT_EQ(parse_cross_node_backend("efa"), CrossNodeBackend::kSrd);
  EXPECT_EQ(parse_cross_node_backend("memory"), CrossNodeBackend::kMemory);
  EXPECT_HAS(error_of([] { parse_cross_node_backend("nvshmem"); }), "unknown cross-node backend 'nvshmem'");
}

// An all_gather between threads of this process, as the bootstrap's is between processes.
class ThreadExchange {
 public:
  explicit ThreadExchange(int n) : n_(n), blobs_(n) {}
  std::vector<std::string> all_gather(int rank, const std::string& mine) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int round = round_;
    blobs_[rank] = mine;
    if (++arrived_ == n_) {
      result_ = blobs_;
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
    return result_;
  }

 private:
  const int n_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int round_ = 0, arrived_ = 0;
  std::vector<std::string> blobs_, result_;
};

TEST(CrossNodeProxy, WithoutRdmaDevicesEveryRankRaisesTheSameErrorInsteadOfWaiting) {
  try {
    if (!VerbsLibrary::load().devices().empty()) GTEST_SKIP() << "this host has RDMA devices";
  } catch (const Error&) {
    // no libibverbs at all: the same path, another reason
  }
  ThreadExchange exchange(2);
  std::string why[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      Rig s;
      s.topology = make_topology(r, {"a", "b"});
      s.options.backend = CrossNodeBackend::kRc;
      s.options.ibv.heap_address = 0x10000;
      s.options.ibv.heap_bytes = kHeapBytes;
      s.options.all_gather = [&, r](const std::string& mine) { return exchange.all_gather(r, mine); };
      why[r] = error_of([&] { CrossNodeProxy proxy(s.topology, s.options); });
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_HAS(why[0], "rank 0's cross-node proxy (ibverbs) could not connect to the other nodes: ");
  EXPECT_HAS(why[0], "RDMA setup failed on rank 0");
  EXPECT_HAS(why[1], "rank 1's cross-node proxy (ibverbs) could not connect to the other nodes: ");
  EXPECT_HAS(why[1], "RDMA setup failed on rank 0");
}

}  // namespace
}  // namespace interlace
