// The device-side ProxyTransport run on CPU threads standing in for a GPU's CTAs: they put and
// signal through the FIFO, a Proxy serves it, and a MemoryBackend delivers in order, reversed or
// shuffled (as SRD does). Receivers wait with the transport's own wait.
#include "interlace/device/proxy_transport.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/transport/memory_backend.h"
#include "interlace/transport/proxy.h"

namespace interlace {
namespace {

using device::ProxySend;
using device::ProxyTransport;
using Clock = std::chrono::steady_clock;
constexpr uint64_t kSecond = 1000000000ull;
constexpr uint64_t kFlags = 0;     // flag t (one per producer, as done[b]) at 8 t
constexpr uint64_t kData = 4096;   // chunks after the flags

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct HostWait {
  uint64_t timeout_ns;
};

// Heaps of `world` ranks; rank 0's FIFO; the abort words a Group would hold.
struct World {
  World(int world, uint64_t heap_bytes, uint32_t capacity) : bytes(heap_bytes), slots(capacity) {
    for (int r = 0; r < world; ++r) memory.emplace_back(heap_bytes, 0);
    for (auto& m : memory) heaps.push_back(m.data());
    queue = ProxyQueue{slots.data(), &consumed, capacity};
  }
  // Rank r's transport (only rank 0 posts; the others wait).
  ProxyTransport transport(int r, uint64_t timeout_ns = 10 * kSecond) {
    ProxyTransport t{};
    t.fifo = ProxyFifo{slots.data(), &claimed, &consumed, static_cast<uint32_t>(slots.size())};
    t.heap = heaps[r];
    t.heap_bytes = bytes;
    t.timeout_ns = timeout_ns;
    t.host_abort = &host_abort;
    t.device_aborted = &device_aborted;
    return t;
  }
  uint64_t* flag(int r, int t) { return reinterpret_cast<uint64_t*>(heaps[r] + kFlags + 8 * t); }
  uint64_t flag_value(int r, int t) { return __atomic_load_n(flag(r, t), __ATOMIC_ACQUIRE); }

  const uint64_t bytes;
  std::vector<std::vector<char>> memory;
  std::vector<char*> heaps;
  std::vector<ProxyRequest> slots;
  uint64_t claimed = 0;
  uint64_t consumed = 0;
  ProxyQueue queue;
  int32_t host_abort = 0;
  uint32_t device_aborted = 0;
};

// Chunk c of producer t: `bytes` at a place of its own, the same offset on sender and receiver.
uint64_t chunk_offset(int t, int c, int per_thread, uint64_t bytes) { return kData + (t * per_thread + c) * bytes; }
char pattern(int t, int c) { return static_cast<char>((t * 31 + c) % 251 + 1); }

int chunks_landed(World& w, int peer, int t, int per_thread, uint64_t bytes) {
  int n = 0;
  for (int c = 0; c < per_thread; ++c) {
    const char* p = w.heaps[peer] + chunk_offset(t, c, per_thread, bytes);
    n += std::all_of(p, p + bytes, [&](char x) { return x == pattern(t, c); });
  }
  return n;
}

class ProxyTransportDelivery : public ::testing::TestWithParam<MemoryBackend::Order> {};

TEST_P(ProxyTransportDelivery, EveryPeersFlagCountsOnlyChunksThatHaveLanded) {
  // Four producers (CTAs) each send their chunks to peers 1..3 as put + signal; the receivers'
  // flags must never count a chunk whose bytes are not all there, whatever the delivery order.
  constexpr int kWorld = 4, kThreads = 4, kPerThread = 60;
  constexpr uint64_t kBytes = 200;  // not a multiple of 8 or 16
  World w(kWorld, kData + kThreads * kPerThread * kBytes, 16);
  for (int t = 0; t < kThreads; ++t) {
    for (int c = 0; c < kPerThread; ++c) {
      std::memset(w.heaps[0] + chunk_offset(t, c, kPerThread, kBytes), pattern(t, c), kBytes);
    }
  }
  MemoryBackend backend(0, w.heaps, 8, GetParam(), 11);
  std::string failure;
  Proxy proxy(w.queue, backend, kWorld, [&](const std::string& why) { failure = why; });

  std::atomic<bool> counted_early{false};
  std::vector<std::thread> receivers;
  std::vector<uint64_t> final_seen(kWorld * kThreads, 0);
  for (int q = 1; q < kWorld; ++q) {
    receivers.emplace_back([&, q] {
      const ProxyTransport t = w.transport(q);
      for (int producer = 0; producer < kThreads; ++producer) {
        for (uint64_t k = 1; k <= kPerThread; ++k) {
          const uint64_t seen = t.wait(w.flag(q, producer), k, HostWait{20 * kSecond}, FlagId::kDone, 0);
          if (seen == 0 || chunks_landed(w, q, producer, kPerThread, kBytes) < static_cast<int>(seen)) {
            counted_early = true;
          }
        }
        final_seen[q * kThreads + producer] = w.flag_value(q, producer);
      }
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < kThreads; ++p) {
    producers.emplace_back([&, p] {
      ProxyTransport t = w.transport(0);
      for (int c = 0; c < kPerThread; ++c) {
        const uint64_t off = chunk_offset(p, c, kPerThread, kBytes);
        for (int k = 0; k < kWorld - 1; ++k) {
          const int q = 1 + (p + k) % (kWorld - 1);  // producers start at different peers
          EXPECT_EQ(t.put(q, off, w.heaps[0] + off, kBytes), ProxySend::kHeld);
          EXPECT_EQ(t.signal(q, w.flag(0, p), 1), ProxySend::kPosted);
        }
      }
    });
  }
  for (auto& t : producers) t.join();
  for (auto& t : receivers) t.join();
  EXPECT_FALSE(counted_early) << "a flag counted a chunk before its bytes had landed";
  for (int q = 1; q < kWorld; ++q) {
    for (int p = 0; p < kThreads; ++p) {
      EXPECT_EQ(w.flag_value(q, p), uint64_t{kPerThread});
      EXPECT_EQ(chunks_landed(w, q, p, kPerThread, kBytes), kPerThread);
    }
  }
  EXPECT_EQ(w.claimed, uint64_t{kThreads * kPerThread * (kWorld - 1)});
  EXPECT_EQ(failure, "");
}

INSTANTIATE_TEST_SUITE_P(Orders, ProxyTransportDelivery,
                         ::testing::Values(MemoryBackend::Order::kInOrder, MemoryBackend::Order::kReversed,
                                           MemoryBackend::Order::kShuffled));

TEST(ProxyTransport, APutIsHeldAndGoesWithTheSignalAsOneRequest) {
  World w(2, 8192, 4);  // no proxy: the requests stay in the slots to be read
  ProxyTransport t = w.transport(0);
  EXPECT_EQ(t.put(1, 5000, w.heaps[0] + 100, 300), ProxySend::kHeld);
  EXPECT_EQ(w.claimed, 0u);
  EXPECT_EQ(t.signal(1, w.flag(0, 3), 7), ProxySend::kPosted);
  ASSERT_EQ(w.claimed, 1u);
  const ProxyRequest& r = w.slots[0];
  EXPECT_EQ(r.ticket, 1u);
  EXPECT_EQ(r.peer, 1);
  EXPECT_EQ(r.src_offset, 100u);
  EXPECT_EQ(r.dst_offset, 5000u);
  EXPECT_EQ(r.bytes, 300u);
  EXPECT_EQ(r.flag_offset, kFlags + 24);
  EXPECT_EQ(r.add, 7u);
  // A signal with nothing held is a request of zero bytes; put_signal is the pair in one call.
  EXPECT_EQ(t.signal(1, w.flag(0, 0), 1), ProxySend::kPosted);
  EXPECT_EQ(w.slots[1].bytes, 0u);
  EXPECT_EQ(w.slots[1].flag_offset, kFlags);
  EXPECT_EQ(t.put_signal(1, 64, w.heaps[0] + 64, 16, w.flag(0, 1), 2), ProxySend::kPosted);
  EXPECT_EQ(w.slots[2].bytes, 16u);
  EXPECT_EQ(w.slots[2].add, 2u);
}

TEST(ProxyTransport, MisuseIsRefusedWithoutPosting) {
  World w(3, 8192, 4);
  ProxyTransport t = w.transport(0);
  char outside[64];
  EXPECT_EQ(t.put(1, 0, outside, 8), ProxySend::kOutsideHeap);
  EXPECT_EQ(t.put(1, 0, w.heaps[0] + 8000, 500), ProxySend::kOutsideHeap);  // source runs past the heap
  EXPECT_EQ(t.put(1, 8000, w.heaps[0], 500), ProxySend::kOutsideHeap);      // destination does
  EXPECT_EQ(t.signal(1, reinterpret_cast<uint64_t*>(w.heaps[0] + 4), 1), ProxySend::kOutsideHeap);  // misaligned
  uint64_t stray = 0;
  EXPECT_EQ(t.signal(1, &stray, 1), ProxySend::kOutsideHeap);
  EXPECT_EQ(t.put(1, 0, w.heaps[0] + 64, 8), ProxySend::kHeld);
  EXPECT_EQ(t.put(2, 0, w.heaps[0] + 64, 8), ProxySend::kUnpaired);   // one put held at a time
  EXPECT_EQ(t.signal(2, w.flag(0, 0), 1), ProxySend::kUnpaired);      // the held put is for rank 1
  EXPECT_EQ(w.claimed, 0u);
  EXPECT_EQ(t.signal(1, w.flag(0, 0), 1), ProxySend::kPosted);        // still held, and still right
  EXPECT_EQ(w.slots[0].bytes, 8u);
}

TEST(ProxyTransport, AStalledBackendHoldsSendersOnCreditThenEverythingLands) {
  constexpr int kN = 24;
  constexpr uint32_t kSlots = 4;
  constexpr uint64_t kBytes = 64;
  World w(2, kData + kN * kBytes, kSlots);
  for (int c = 0; c < kN; ++c) std::memset(w.heaps[0] + chunk_offset(0, c, kN, kBytes), pattern(0, c), kBytes);
  MemoryBackend backend(0, w.heaps, 1, MemoryBackend::Order::kInOrder);
  backend.hold(true);
  Proxy proxy(w.queue, backend, 2, [](const std::string&) {});
  std::atomic<int> posted{0};
  std::thread producer([&] {
    ProxyTransport t = w.transport(0);
    for (int c = 0; c < kN; ++c) {
      const uint64_t off = chunk_offset(0, c, kN, kBytes);
      EXPECT_EQ(t.put_signal(1, off, w.heaps[0] + off, kBytes, w.flag(0, 0), 1), ProxySend::kPosted);
      posted = c + 1;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(proxy.taken(), 1u);                   // the backend's one write in flight
  EXPECT_EQ(posted.load(), 1 + int{kSlots});      // the queue full behind it, the sender waiting
  EXPECT_EQ(w.flag_value(1, 0), 0u);
  backend.hold(false);
  producer.join();
  const ProxyTransport receiver = w.transport(1);
  EXPECT_EQ(receiver.wait(w.flag(1, 0), kN, HostWait{10 * kSecond}, FlagId::kDone, 0), uint64_t{kN});
  EXPECT_EQ(chunks_landed(w, 1, 0, kN, kBytes), kN);
}

TEST(ProxyTransport, WaitsForCreditAreBoundedAndStopOnEitherAbortWord) {
  World w(2, 8192, 2);  // nobody serves the queue: the third post never gets credit
  ProxyTransport t = w.transport(0, kSecond / 10);
  ASSERT_EQ(t.signal(1, w.flag(0, 0), 1), ProxySend::kPosted);
  ASSERT_EQ(t.signal(1, w.flag(0, 0), 1), ProxySend::kPosted);
  auto start = Clock::now();
  EXPECT_EQ(t.put_signal(1, 64, w.heaps[0] + 64, 8, w.flag(0, 0), 1), ProxySend::kTimedOut);
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_EQ(t.held_peer, -1);  // a failed post holds nothing for later

  ProxyTransport patient = w.transport(0, 600 * kSecond);
  std::thread host([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    __atomic_store_n(&w.host_abort, 1, __ATOMIC_RELEASE);
  });
  start = Clock::now();
  EXPECT_EQ(patient.signal(1, w.flag(0, 0), 1), ProxySend::kStopped);
  EXPECT_LT(seconds_since(start), 2.0);
  host.join();
  w.host_abort = 0;
  w.device_aborted = 1;
  start = Clock::now();
  EXPECT_EQ(patient.signal(1, w.flag(0, 0), 1), ProxySend::kStopped);
  EXPECT_LT(seconds_since(start), 1.0);
}

TEST(ProxyTransport, WaitsForFlagsAreBoundedAndStopOnAbort) {
  World w(2, 8192, 2);
  const ProxyTransport t = w.transport(1);
  auto start = Clock::now();
  EXPECT_EQ(t.wait(w.flag(1, 0), 1, HostWait{kSecond / 10}, FlagId::kDone, 0), 0u);
  EXPECT_LT(seconds_since(start), 2.0);
  std::thread host([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    __atomic_store_n(&w.host_abort, 1, __ATOMIC_RELEASE);
  });
  start = Clock::now();
  EXPECT_EQ(t.wait(w.flag(1, 0), 1, HostWait{600 * kSecond}, FlagId::kDone, 0), 0u);
  EXPECT_LT(seconds_since(start), 2.0);
  host.join();
}

TEST(ProxyTransport, ADeadPeerAbortsTheGroupAndNoSenderOrReceiverHangs) {
  // Rank 0 sends to ranks 1 and 2; rank 2's node goes down midway. The proxy reports it (here the
  // report sets the abort word, as the group's abort does), drops what follows, and both the
  // senders and rank 2's receiver come back within a bound instead of waiting.
  constexpr int kN = 300;
  constexpr uint64_t kBytes = 32;
  World w(3, kData + 2 * kN * kBytes, 8);
  MemoryBackend backend(0, w.heaps, 4, MemoryBackend::Order::kShuffled, 3);
  std::mutex mutex;
  std::string why;
  Proxy proxy(w.queue, backend, 3, [&](const std::string& reason) {
    std::lock_guard<std::mutex> lock(mutex);
    why = reason;
    __atomic_store_n(&w.host_abort, 1, __ATOMIC_RELEASE);
  });
  uint64_t receiver_saw = 1;
  std::thread receiver([&] {
    const ProxyTransport t = w.transport(2);
    receiver_saw = t.wait(w.flag(2, 0), kN, HostWait{600 * kSecond}, FlagId::kDone, 0);
  });
  const auto start = Clock::now();
  std::vector<std::thread> senders;
  for (int s = 0; s < 2; ++s) {
    senders.emplace_back([&, s] {
      ProxyTransport t = w.transport(0, 600 * kSecond);
      for (int c = 0; c < kN; ++c) {
        if (s == 1 && c == kN / 3) backend.kill(2);  // rank 2 never sees all kN
        const uint64_t off = chunk_offset(s, c, kN, kBytes);
        const ProxySend r = t.put_signal(1 + s, off, w.heaps[0] + off, kBytes, w.flag(0, 0), 1);
        EXPECT_TRUE(r == ProxySend::kPosted || r == ProxySend::kStopped) << static_cast<int>(r);
        if (r == ProxySend::kStopped) break;
      }
    });
  }
  for (auto& t : senders) t.join();
  receiver.join();
  EXPECT_LT(seconds_since(start), 10.0);
  EXPECT_EQ(receiver_saw, 0u) << "the wait on a dead peer's flag must end with the abort";
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_NE(why.find("rank 2 is unreachable"), std::string::npos) << why;
}

}  // namespace
}  // namespace interlace
