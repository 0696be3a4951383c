// The proxy protocol with host memory standing in for the GPUs: CPU threads post to the FIFO with
// the same proxy_post() the kernels use, a Proxy serves it, and a MemoryBackend delivers.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/transport/memory_backend.h"
#include "interlace/transport/proxy.h"
#include "interlace/transport/proxy_fifo.h"

namespace interlace {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kFlag = 0;         // every test's flag sits at the start of the receiver's heap
constexpr uint64_t kData = 64;        // data after it
constexpr uint64_t kSecond = 1000000000ull;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Heaps of `world` ranks and rank 0's FIFO of `capacity` slots.
struct World {
  World(int world, size_t heap_bytes, uint32_t capacity) : slots(capacity) {
    for (int r = 0; r < world; ++r) memory.emplace_back(heap_bytes, 0);
    for (auto& m : memory) heaps.push_back(m.data());
    fifo = ProxyFifo{slots.data(), &claimed, &consumed, capacity};
    queue = ProxyQueue{slots.data(), &consumed, capacity};
  }
  uint64_t flag(int rank) { return __atomic_load_n(reinterpret_cast<uint64_t*>(heaps[rank] + kFlag), __ATOMIC_ACQUIRE); }
  // Waits until rank's flag reaches n; false after `seconds`.
  bool wait_flag(int rank, uint64_t n, double seconds = 10) {
    const auto start = Clock::now();
    while (flag(rank) < n) {
      if (seconds_since(start) > seconds) return false;
      std::this_thread::yield();
    }
    return true;
  }

  std::vector<std::vector<char>> memory;
  std::vector<char*> heaps;
  std::vector<ProxyRequest> slots;
  uint64_t claimed = 0;
  uint64_t consumed = 0;
  ProxyFifo fifo;
  ProxyQueue queue;
};

// Request i writes `bytes` of rank 0's pattern (the byte value of i) to region i of `peer`.
ProxyRequest write_request(int peer, uint64_t i, uint64_t bytes) {
  return ProxyRequest{kData + i * bytes, kData + i * bytes, bytes, kFlag, 1, peer, 0, 0};
}

void fill_source(World& w, uint64_t n, uint64_t bytes) {
  for (uint64_t i = 0; i < n; ++i) std::memset(w.heaps[0] + kData + i * bytes, static_cast<int>(i % 251 + 1), bytes);
}

// How many of the n regions have fully landed on `peer`.
uint64_t landed(World& w, int peer, uint64_t n, uint64_t bytes) {
  uint64_t count = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const char* region = w.heaps[peer] + kData + i * bytes;
    count += std::all_of(region, region + bytes, [&](char c) { return c == static_cast<char>(i % 251 + 1); });
  }
  return count;
}

auto never_stop = [] { return false; };

TEST(Proxy, WrapsAroundASmallQueueManyTimes) {
  constexpr uint64_t kN = 1000, kBytes = 48;
  World w(2, kData + kN * kBytes, 8);
  fill_source(w, kN, kBytes);
  MemoryBackend backend(0, w.heaps, 4, MemoryBackend::Order::kInOrder);
  std::string failure;
  {
    Proxy proxy(w.queue, backend, 2, [&](const std::string& why) { failure = why; });
    for (uint64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(proxy_post(w.fifo, write_request(1, i, kBytes), 10 * kSecond, never_stop), PostResult::kPosted);
    }
    ASSERT_TRUE(w.wait_flag(1, kN));
    EXPECT_EQ(proxy.taken(), kN);
  }
  EXPECT_EQ(landed(w, 1, kN, kBytes), kN);
  EXPECT_EQ(w.consumed, kN);
  EXPECT_EQ(w.flag(1), kN);
  EXPECT_EQ(failure, "");
}

TEST(Proxy, AFullBackendHoldsProducersOnCredit) {
  constexpr uint64_t kN = 20, kBytes = 16;
  constexpr uint32_t kSlots = 4;
  World w(2, kData + kN * kBytes, kSlots);
  fill_source(w, kN, kBytes);
  MemoryBackend backend(0, w.heaps, 1, MemoryBackend::Order::kInOrder);
  backend.hold(true);  // a stalled network: one write in flight, no room for more
  Proxy proxy(w.queue, backend, 2, [](const std::string&) {});
  std::atomic<uint64_t> posted{0};
  std::thread producer([&] {
    for (uint64_t i = 0; i < kN; ++i) {
      EXPECT_EQ(proxy_post(w.fifo, write_request(1, i, kBytes), 10 * kSecond, never_stop), PostResult::kPosted);
      posted = i + 1;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // One write taken by the backend, kSlots waiting in the queue, the producer blocked on the next.
  EXPECT_EQ(proxy.taken(), 1u);
  EXPECT_EQ(posted.load(), 1 + kSlots);
  EXPECT_EQ(w.flag(1), 0u);
  backend.hold(false);
  producer.join();
  ASSERT_TRUE(w.wait_flag(1, kN));
  EXPECT_EQ(landed(w, 1, kN, kBytes), kN);
  EXPECT_EQ(backend.most_in_flight(), 1u);
}

TEST(Proxy, CountingFlagsHoldUnderOutOfOrderDelivery) {
  // Four producers, writes delivered in shuffled order (as SRD does): whenever the receiver reads
  // the flag as k, at least k writes have fully landed.
  constexpr uint64_t kPerThread = 250, kThreads = 4, kN = kPerThread * kThreads, kBytes = 256;
  World w(2, kData + kN * kBytes, 64);
  fill_source(w, kN, kBytes);
  MemoryBackend backend(0, w.heaps, 64, MemoryBackend::Order::kShuffled, 7);
  Proxy proxy(w.queue, backend, 2, [](const std::string&) {});
  std::atomic<bool> receiver_ok{true};
  std::thread receiver([&] {
    const auto start = Clock::now();
    uint64_t seen = 0;
    while (seen < kN && seconds_since(start) < 20) {
      seen = w.flag(1);
      if (landed(w, 1, kN, kBytes) < seen) receiver_ok = false;
    }
  });
  std::vector<std::thread> producers;
  for (uint64_t t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (uint64_t j = 0; j < kPerThread; ++j) {
        EXPECT_EQ(proxy_post(w.fifo, write_request(1, t * kPerThread + j, kBytes), 10 * kSecond, never_stop),
                  PostResult::kPosted);
      }
    });
  }
  for (auto& p : producers) p.join();
  receiver.join();
  EXPECT_TRUE(receiver_ok) << "the flag counted a write whose bytes had not landed";
  EXPECT_EQ(w.flag(1), kN);
  EXPECT_EQ(landed(w, 1, kN, kBytes), kN);
}

TEST(Proxy, ADeadPeerIsReportedAndProducersNeverHang) {
  constexpr uint64_t kN = 400, kBytes = 32;
  World w(3, kData + kN * kBytes, 16);
  fill_source(w, kN, kBytes);
  MemoryBackend backend(0, w.heaps, 8, MemoryBackend::Order::kInOrder);
  std::atomic<bool> reported{false};
  std::string why;
  std::mutex why_mutex;
  Proxy proxy(w.queue, backend, 3, [&](const std::string& reason) {
    std::lock_guard<std::mutex> lock(why_mutex);
    why = reason;
    reported = true;
  });
  const auto start = Clock::now();
  for (uint64_t i = 0; i < kN; ++i) {
    if (i == kN / 2) backend.kill(2);
    // Alternate peers; after the failure the proxy drops requests, so posting still finishes.
    ASSERT_EQ(proxy_post(w.fifo, write_request(1 + static_cast<int>(i % 2), i, kBytes), 10 * kSecond, never_stop),
              PostResult::kPosted);
  }
  while (!reported && seconds_since(start) < 5) std::this_thread::yield();
  ASSERT_TRUE(reported);
  EXPECT_LT(seconds_since(start), 5.0);
  std::lock_guard<std::mutex> lock(why_mutex);
  EXPECT_NE(why.find("rank 2 is unreachable"), std::string::npos) << why;
}

TEST(Proxy, ARequestForARankOutsideTheGroupIsAFailure) {
  World w(2, 4096, 4);
  MemoryBackend backend(0, w.heaps, 4, MemoryBackend::Order::kInOrder);
  std::atomic<bool> reported{false};
  std::string why;
  Proxy proxy(w.queue, backend, 2, [&](const std::string& reason) {
    why = reason;
    reported = true;
  });
  ASSERT_EQ(proxy_post(w.fifo, write_request(5, 0, 8), kSecond, never_stop), PostResult::kPosted);
  const auto start = Clock::now();
  while (!reported && seconds_since(start) < 5) std::this_thread::yield();
  ASSERT_TRUE(reported);
  EXPECT_NE(why.find("rank 5"), std::string::npos) << why;
}

TEST(ProxyPost, WaitsForCreditAreBounded) {
  World w(2, 4096, 2);  // no proxy serves this queue: the third post never gets credit
  ASSERT_EQ(proxy_post(w.fifo, write_request(1, 0, 8), kSecond, never_stop), PostResult::kPosted);
  ASSERT_EQ(proxy_post(w.fifo, write_request(1, 1, 8), kSecond, never_stop), PostResult::kPosted);
  auto start = Clock::now();
  EXPECT_EQ(proxy_post(w.fifo, write_request(1, 2, 8), kSecond / 10, never_stop), PostResult::kTimedOut);
  EXPECT_LT(seconds_since(start), 2.0);
  std::atomic<bool> aborted{false};
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    aborted = true;
  });
  start = Clock::now();
  EXPECT_EQ(proxy_post(w.fifo, write_request(1, 3, 8), 60 * kSecond, [&] { return aborted.load(); }),
            PostResult::kStopped);
  EXPECT_LT(seconds_since(start), 2.0);
  aborter.join();
}

TEST(ProxyFifo, SlotsOfAnEarlierLapAreNotTakenForNewOnes) {
  // Capacity 2: ticket 2 reuses slot 0, whose ticket field still says 1 (ticket 0 + 1) until the
  // producer of ticket 2 publishes 3. The proxy waiting for ticket 2 must not take it before.
  World w(2, kData + 4 * 16, 2);
  fill_source(w, 4, 16);
  MemoryBackend backend(0, w.heaps, 8, MemoryBackend::Order::kInOrder);
  Proxy proxy(w.queue, backend, 2, [](const std::string&) {});
  for (uint64_t i = 0; i < 2; ++i) ASSERT_EQ(proxy_post(w.fifo, write_request(1, i, 16), kSecond, never_stop), PostResult::kPosted);
  ASSERT_TRUE(w.wait_flag(1, 2));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(proxy.taken(), 2u);  // slot 0 still holds ticket 0's request: not taken again
  ASSERT_EQ(proxy_post(w.fifo, write_request(1, 2, 16), kSecond, never_stop), PostResult::kPosted);
  ASSERT_TRUE(w.wait_flag(1, 3));
  EXPECT_EQ(proxy.taken(), 3u);
  EXPECT_EQ(landed(w, 1, 3, 16), 3u);
}

// A backend with traffic (here: progress() says so, as an SRD receiver does when flags arrive)
// keeps the proxy polling without pause.
TEST(Proxy, PollsWithoutPauseWhileTheBackendHasTraffic) {
  struct Counting : ProxyBackend {
    bool post(const ProxyWrite&) override { return true; }
    bool progress() override {
      calls.fetch_add(1);
      return true;
    }
    std::string failure() const override { return ""; }
    uint64_t outstanding() const override { return 0; }
    std::atomic<uint64_t> calls{0};
  } backend;
  World world(1, 1024, 4);
  Proxy proxy(world.queue, backend, 1, [](const std::string&) {});
  // Rounds per second over a span (measured, not assumed: a loaded machine oversleeps).
  auto rate = [&](std::chrono::milliseconds span) {
    const uint64_t before = backend.calls.load();
    const auto start = Clock::now();
    std::this_thread::sleep_for(span);
    return (backend.calls.load() - before) / seconds_since(start);
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past any spin the proxy allows itself
  const double busy = rate(std::chrono::milliseconds(30));
  // A round that pauses sleeps 50 us (more, with the timer's slack): at most 20000 rounds a second.
  // Before progress() counted as traffic, a backend that only received got about 7500 (it spun
  // 1000 rounds after its last request, then slept).
  EXPECT_GT(busy, 40000) << "rounds per second with traffic";
}

}  // namespace
}  // namespace interlace
