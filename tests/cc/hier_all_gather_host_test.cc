// The hierarchical all_gather protocol (ops/all_gather/hierarchy.h) run end to end on CPU threads
// over host memory, as the kernel (ops/all_gather/hier_kernel.cuh) does it: each rank is a thread
// with a heap that starts with a SignalPad, then the landing slots, then its staging buffer; NVLink
// puts are memcpy into the peer's heap then an atomic add on its flag; network chunks (ready and
// drained signals included) go through that rank's ProxyTransport, FIFO and Proxy thread, over the
// memory backend (shuffled, as SRD delivers). Checks that the plan's flags and offsets fit together:
// every rank ends each of two launches with every shard (flags only grow). Each rank checks its
// landing slots in its own thread before it starts the next launch, so a sender that writes the next
// launch's shard too early is caught: with a barrier between launches (the op handshake, which in
// reality covers only a node), and back to back with one rank per node, where only the ready
// handshake holds a fast sender back. And a run must not end while the network still reads its
// staging, which any later op may overwrite: with every rank overwriting its staging as soon as its
// run returns and one rank's network reading late, only the drained handshake keeps the data right.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/device/proxy_transport.h"
#include "interlace/ops/all_gather/hierarchy.h"
#include "interlace/transport/memory_backend.h"
#include "interlace/transport/proxy.h"
#include "interlace/transport/proxy_backend.h"
#include "thread_barrier.h"

namespace interlace {
namespace {

using device::ProxySend;
using device::ProxyTransport;
using Clock = std::chrono::steady_clock;
constexpr uint64_t kSecond = 1000000000ull;
constexpr uint64_t kLanding = (sizeof(SignalPad) + 255) / 256 * 256;  // landing slots after the pad

struct HostWait {
  uint64_t timeout_ns;
};

uint64_t* at(char* heap, uint64_t offset) { return reinterpret_cast<uint64_t*>(heap + offset); }
// The heap offset of a rank's staging buffer, after the pad and a landing slot per rank.
uint64_t staging_offset(int world, uint64_t bytes) { return kLanding + world * bytes; }
char pattern(int launch, int s, uint64_t i) { return static_cast<char>((launch * 7 + s * 13 + i) % 251 + 1); }

// A rank's network when it reads that rank's heap late: writes that carry bytes wait `delay` before
// the memory backend copies them out of the heap, as a NIC may (SRD and RC also read the source
// again to resend a lost packet). Zero-byte signals (ready, drained) go at once, so the peers start
// and end on time: the rank's run can return while its staging is still to be read. Only the
// proxy's thread calls it, so the held writes need no lock.
class SlowReads : public ProxyBackend {
 public:
  SlowReads(std::unique_ptr<MemoryBackend> network, std::chrono::milliseconds delay)
      : network_(std::move(network)), delay_(delay) {}

  bool post(const ProxyWrite& w) override {
    if (w.bytes == 0) return network_->post(w);
    held_.push_back({Clock::now() + delay_, w});
    return true;
  }
  bool progress() override {
    while (!held_.empty() && held_.front().due <= Clock::now() && network_->post(held_.front().write)) {
      held_.pop_front();
    }
    return network_->progress() || !held_.empty();
  }
  std::string failure() const override { return network_->failure(); }
  // Held writes have yet to be read: the proxy's teardown waits for them as for a NIC's.
  uint64_t outstanding() const override { return held_.size(); }

 private:
  struct Held {
    Clock::time_point due;
    ProxyWrite write;
  };
  std::unique_ptr<MemoryBackend> network_;
  const std::chrono::milliseconds delay_;
  std::deque<Held> held_;
};

struct Rank {
  std::vector<ProxyRequest> slots;
  uint64_t claimed = 0, consumed = 0;
  std::unique_ptr<ProxyBackend> network;
  std::unique_ptr<Proxy> proxy;  // declared after network: its thread stops before the network goes
};

// One launch of rank r, as the kernel does it. False if a wait or a post failed.
bool run_rank(const NodeLayout& l, const HierAllGatherPlan& plan, std::vector<char*>& heaps, Rank& me, int r,
              const std::vector<char>& inp, uint64_t heap_bytes) {
  const AgRankWork work = all_gather_rank_work(l, r);
  char* heap = heaps[r];
  ProxyTransport t{};
  t.fifo = ProxyFifo{me.slots.data(), &me.claimed, &me.consumed, static_cast<uint32_t>(me.slots.size())};
  t.heap = heap;
  t.heap_bytes = heap_bytes;
  t.timeout_ns = 20 * kSecond;
  HierAllGatherFlags* flags = reinterpret_cast<HierAllGatherFlags*>(heap + hier_landed_offset(0) -
                                                                    offsetof(HierAllGatherFlags, landed));
  const uint64_t bytes = plan.bytes_per_rank;
  const uint64_t staging = staging_offset(l.world_size(), bytes);
  const uint64_t launch = flags->launches + 1;
  auto chunk = [&](int c, uint64_t* lo, uint64_t* n) {
    *lo = std::min<uint64_t>(c * plan.chunk_bytes, bytes);
    *n = std::min<uint64_t>(*lo + plan.chunk_bytes, bytes) - *lo;
  };
  // Chunk c of s's shard, held at `shard` here, into q's landing slot, then landed[s] there.
  auto nvlink_put = [&](int q, int s, int c, const char* shard) {
    uint64_t lo, n;
    chunk(c, &lo, &n);
    std::memcpy(heaps[q] + kLanding + s * bytes + lo, shard + lo, n);
    __atomic_fetch_add(at(heaps[q], hier_landed_offset(s)), 1, __ATOMIC_RELEASE);
  };
  // 0. Tell each rank whose shard lands here from the network that this launch has started.
  for (int s : work.relayed) {
    if (t.signal(s, &flags->ready[r], 1) != ProxySend::kPosted) return false;
  }
  // 1. Own shard, from inp: into the own landing slot and over NVLink.
  for (int c = 0; c < plan.chunks; ++c) {
    uint64_t lo, n;
    chunk(c, &lo, &n);
    std::memcpy(heap + kLanding + r * bytes + lo, inp.data() + lo, n);
    for (int q : work.nvlink_peers) nvlink_put(q, r, c, inp.data());
  }
  // 2. Own shard over the network, from staging, once every network receiver has started this
  // launch: before that, its landing slot (and so our staging) may still hold the last launch's.
  for (int q : work.network_peers) {
    if (t.wait(&flags->ready[q], launch, HostWait{20 * kSecond}, FlagId::kReady, q) == 0) return false;
  }
  for (int c = 0; c < plan.chunks && !work.network_peers.empty(); ++c) {
    uint64_t lo, n;
    chunk(c, &lo, &n);
    std::memcpy(heap + staging + lo, inp.data() + lo, n);
    for (int q : work.network_peers) {
      uint64_t* arrived = at(heap, hier_arrived_offset(relay_slot(l, r, l.node_of[q]), c));
      if (t.put_signal(q, kLanding + r * bytes + lo, heap + staging + lo, n, arrived, 1) != ProxySend::kPosted) {
        return false;
      }
    }
  }
  // 3. Relays: take each chunk of each relayed shard as it arrives, in whatever order.
  std::vector<std::pair<int, int>> pending;
  for (int j = 0; j < static_cast<int>(work.relayed.size()); ++j) {
    for (int c = 0; c < plan.chunks; ++c) pending.emplace_back(j, c);
  }
  const auto start = Clock::now();
  while (!pending.empty()) {
    if (Clock::now() - start > std::chrono::seconds(20)) return false;
    for (size_t i = 0; i < pending.size();) {
      const auto [j, c] = pending[i];
      const uint64_t seen = __atomic_load_n(&flags->arrived[j][c], __ATOMIC_ACQUIRE);
      if (seen <= flags->consumed[j][c]) {
        ++i;
        continue;
      }
      flags->consumed[j][c] = seen;
      const int s = work.relayed[j];
      __atomic_fetch_add(&flags->landed[s], 1, __ATOMIC_RELEASE);
      for (int q : work.nvlink_peers) nvlink_put(q, s, c, heap + kLanding + s * bytes);
      pending[i] = pending.back();
      pending.pop_back();
    }
  }
  // 4. The final waits, the same for every shard whatever its path.
  for (int s : work.waits_for) {
    if (t.wait(&flags->landed[s], flags->base + plan.chunks, HostWait{20 * kSecond}, FlagId::kDone, s) == 0) return false;
  }
  // 5. Drained: every shard is here, so the network is done reading the staging of each rank whose
  // shard came over it; tell them. Then wait to hear the same from this rank's network receivers:
  // only then is this rank's staging free for whatever runs next (the landing waits above say
  // nothing about it, and the op handshake covers only the node).
  for (int s : work.relayed) {
    if (t.signal(s, &flags->drained[r], 1) != ProxySend::kPosted) return false;
  }
  for (int q : work.network_peers) {
    if (t.wait(&flags->drained[q], launch, HostWait{20 * kSecond}, FlagId::kDrained, q) == 0) return false;
  }
  flags->base += plan.chunks;
  flags->launches = launch;
  return true;
}

enum class Between { kBarrier, kNothing };
// What happens to a rank's staging when its run returns: nothing, or it is overwritten (0xEE) at
// once, as a later op using that scratch may do, while rank 0's network reads it late (SlowReads).
enum class Staging { kLeave, kOverwrite };
constexpr auto kSlowRead = std::chrono::milliseconds(50);  // far longer than rank 0 takes to finish
constexpr int kLaunches = 2;

// Launches run one after another on each rank's thread; after each, the rank checks its own landing
// slots against that launch's inputs before it starts the next.
void run_group(const std::vector<std::string>& names, uint64_t bytes, uint64_t chunk_bytes,
               Between between = Between::kBarrier, Staging staging = Staging::kLeave) {
  const NodeLayout l = make_node_layout(names);
  const int w = l.world_size();
  const HierAllGatherPlan plan = plan_hier_all_gather(l, bytes, chunk_bytes);
  const uint64_t heap_bytes = staging_offset(w, bytes) + bytes;
  std::vector<std::vector<char>> memory(w, std::vector<char>(heap_bytes, 0));
  std::vector<char*> heaps;
  for (auto& m : memory) heaps.push_back(m.data());
  std::vector<Rank> ranks(w);
  std::atomic<int> failures{0};
  auto on_failure = [&](const std::string& why) {
    ADD_FAILURE() << why;
    ++failures;
  };
  for (int r = 0; r < w; ++r) {
    ranks[r].slots.resize(8);
    auto network = std::make_unique<MemoryBackend>(r, heaps, /*max_in_flight=*/4, MemoryBackend::Order::kShuffled);
    if (staging == Staging::kOverwrite && r == 0) {
      ranks[r].network = std::make_unique<SlowReads>(std::move(network), kSlowRead);
    } else {
      ranks[r].network = std::move(network);
    }
    const ProxyQueue queue{ranks[r].slots.data(), &ranks[r].consumed, 8};
    ranks[r].proxy = std::make_unique<Proxy>(queue, *ranks[r].network, w, on_failure);
  }
  std::vector<std::vector<std::vector<char>>> inp(kLaunches,  // [launch][s]
                                                  std::vector<std::vector<char>>(w, std::vector<char>(bytes)));
  for (int launch = 0; launch < kLaunches; ++launch) {
    for (int s = 0; s < w; ++s) {
      for (uint64_t i = 0; i < bytes; ++i) inp[launch][s][i] = pattern(launch, s, i);
    }
  }
  Barrier barrier(w);
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      bool running = true;  // after a failed launch, only the barriers: the others must not hang on them
      for (int launch = 0; launch < kLaunches; ++launch) {
        if (running && !run_rank(l, plan, heaps, ranks[r], r, inp[launch][r], heap_bytes)) {
          ADD_FAILURE() << "rank " << r << " stopped in launch " << launch;
          running = false;
        }
        if (running && staging == Staging::kOverwrite) std::memset(heaps[r] + staging_offset(w, bytes), 0xEE, bytes);
        for (int s = 0; running && s < w; ++s) {
          EXPECT_EQ(std::memcmp(heaps[r] + kLanding + s * bytes, inp[launch][s].data(), bytes), 0)
              << "rank " << r << " lacks rank " << s << "'s shard after launch " << launch;
        }
        // The op handshake's part: nobody starts the next launch before all are done.
        if (between == Between::kBarrier) barrier.wait();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(HierAllGatherOnHostThreads, TwoNodesOfTwo) { run_group({"a", "a", "b", "b"}, 1000, 64); }

TEST(HierAllGatherOnHostThreads, ThreeUnevenInterleavedNodes) {
  run_group({"a", "b", "a", "c", "b", "a"}, 777, 32);
}

TEST(HierAllGatherOnHostThreads, TwoNodesOfThreeWithOneChunk) { run_group({"x", "y", "x", "y", "x", "y"}, 4096, 0); }

// No barrier between launches and no node peers: only the ready handshake keeps a sender that is a
// launch ahead out of a landing slot its receiver is still checking.
TEST(HierAllGatherOnHostThreads, BackToBackTwoNodes) { run_group({"a", "b"}, 1000, 64, Between::kNothing); }

TEST(HierAllGatherOnHostThreads, BackToBackThreeNodes) { run_group({"a", "b", "c"}, 777, 32, Between::kNothing); }

// Every rank overwrites its staging as soon as its run returns, and rank 0's network reads its
// staging late: only the drained handshake keeps rank 0's run from returning before its receiver
// (and, through it, the receiver's node peers) holds its shard. Its landing waits do not: they are
// for the other ranks' shards.
TEST(HierAllGatherOnHostThreads, StagingReusedAsSoonAsRunReturns) {
  run_group({"a", "a", "b", "b"}, 1000, 64, Between::kBarrier, Staging::kOverwrite);
}

}  // namespace
}  // namespace interlace
