// reduce_scatter and all_reduce across nodes (ops/reduce/nodes_kernel.cuh, launched by
// reduce_across_nodes in ops/reduce/launch.cu) run on CPU threads over host memory: the first
// executable check of that kernel's protocol, which has not yet run on a GPU. The approach is
// hier_all_gather_host_test.cc's. Each rank is a thread with a heap that starts with a SignalPad
// (the real NodesReduceFlags in it, nodes_flags.h), then the scratch. Per launch it runs the
// kernel's CTAs as threads, each doing what a CTA of the kernel does, in its order:
//   - CTA 0 raises ready[me] on every rank of another node;
//   - 1. partials to their owners: to a node peer as NVLink stores (memcpy into its staging slot,
//     then landed[me][c] += 1 there); to another node's rank once it is ready, copied into the send
//     buffer and posted from there through this rank's ProxyTransport, FIFO and CrossNodeProxy,
//     whose memory backend delivers in shuffled order, and late while a stalling thread holds it;
//   - 2. the own share, chunk by chunk once landed[s][c] >= uses[c] + 1 for every s != me, summed in
//     rank order in fp32 (sum_in_rank_order) into out, or (all_reduce) into the gather slot and out
//     and pushed to every rank the same two ways (gathered[me][c]);
//   - 3. all_reduce: every other owner's sums, once gathered[s][c] >= uses[c] + 1, into out;
//   - the last CTA out: drained[me] to every rank of another node, waits for theirs, then moves
//     uses[c] and launches on.
// The op handshake (op_enter) is a barrier of the node's ranks at each launch's start.
//
// What each rank checks, in its own thread, after each launch:
//   - out, bit for bit, against the rank-order sum of that launch's inputs computed here;
//   - its scratch is its own between launches: right after the launch returns it fills its whole
//     scratch (staging slots, send buffer, gather buffer) and inp with garbage, as a later op may,
//     and a moment later finds the garbage intact. Receivers still get the right data only if the
//     network read this rank's send and gather buffers before the kernel returned (drained); the
//     garbage stays intact only if no sender writes here before this rank starts its next launch
//     (ready across nodes, the handshake on the node).
// And at the end, every counter moved exactly once per launch (uses, landed, gathered, ready,
// drained). Launches mix the two ops (they share the scratch, not the flags) and sizes (so chunk
// counts, which uses[c] follows), with short and empty last shares, an empty message and an
// all_reduce in place; they run back to back (only ready, drained and the node's handshake order
// them) or with a barrier of the whole group between them. Chunks are small so that shares have many.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/device/proxy_transport.h"
#include "interlace/device/signal_pad.h"
#include "interlace/ops/reduce/flags.h"
#include "interlace/ops/reduce/nodes_flags.h"
#include "interlace/ops/reduce/plan.h"
#include "interlace/runtime/topology.h"
#include "interlace/transport/cross_node_proxy.h"
#include "interlace/transport/memory_backend.h"
#include "thread_barrier.h"

namespace interlace {
namespace {

using device::ProxySend;
using device::ProxyTransport;
using Clock = std::chrono::steady_clock;

constexpr auto kWaitLimit = std::chrono::seconds(10);               // a wait that long is a hang
constexpr uint64_t kScratch = (sizeof(SignalPad) + 255) / 256 * 256;  // the ops' scratch, after the pad
constexpr uint32_t kFifoSlots = 8;  // few: posts wait for credit now and then
constexpr unsigned char kGarbage = 0xEE;

// ---- What one launch is: reduce_across_nodes' choices. ----

struct Step {
  OpId op;
  uint64_t elements;      // fp32; reduce_scatter: out's (one share), all_reduce: the message's
  bool in_place = false;  // all_reduce: out is inp
};
Step rs(uint64_t elements) { return {OpId::kReduceScatter, elements}; }
Step ar(uint64_t elements) { return {OpId::kAllReduce, elements}; }
Step ar_in_place(uint64_t elements) { return {OpId::kAllReduce, elements, true}; }

// NodesReduceParams for one rank and launch, the transports aside.
struct Launch {
  OpId op;
  bool in_place;
  ReducePlan plan;
  int chunks;
  uint64_t staging, send, gather;  // heap offsets, as the kernel's
  uint64_t scratch_bytes;
  uint64_t in_bytes, out_bytes;
};

// reduce_across_nodes (launch.cu) for rank `rank`: the same plan and nodes_reduce_layout, with
// min_chunk in place of its kHierDefaultChunk (1 MiB), so that small messages get several chunks.
Launch plan_launch(const Step& step, int world, int rank, uint64_t min_chunk) {
  Launch p{};
  p.op = step.op;
  p.in_place = step.in_place;
  const uint64_t bytes = step.elements * sizeof(float);
  if (step.op == OpId::kReduceScatter) {
    p.plan = plan_reduce_scatter(bytes, sizeof(float), world, rank, kReduceMaxBlocks);
  } else {
    ReduceTuning shares;
    shares.algorithm = ReduceAlgorithm::kTwoShot;
    p.plan = plan_all_reduce(bytes, sizeof(float), world, rank, kReduceMaxBlocks, /*symmetric_out=*/false, shares);
  }
  const NodesReduceLayout layout = nodes_reduce_layout(p.plan, step.op == OpId::kAllReduce, min_chunk);
  p.plan.chunk_bytes = layout.chunk_bytes;
  p.chunks = layout.chunks;
  p.staging = kScratch + layout.staging;
  p.send = kScratch + layout.send;
  p.gather = kScratch + layout.gather;
  p.scratch_bytes = layout.scratch_bytes;
  p.in_bytes = p.plan.bytes;
  p.out_bytes = step.op == OpId::kReduceScatter ? p.plan.share_bytes : p.plan.bytes;
  return p;
}

// Element i of rank s's input in step k: values of many magnitudes, so that the fp32 sum depends on
// the order (the kernel's is the rank order) and any partial of another step or rank shows.
float value(int k, int s, uint64_t i) {
  uint64_t h = (static_cast<uint64_t>(k) * 1000003u + static_cast<uint64_t>(s) * 7919u + i + 1) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  return std::ldexp(static_cast<float>(static_cast<int>(h % 2001) - 1000), -static_cast<int>((h >> 20) % 16));
}

float load_float(const char* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}

// ---- The group: heaps, proxies, handshakes, abort. ----

struct Rank {
  Topology topo;
  std::vector<int> local_of;  // NodesReduceParams::local_of: a rank's index on this node, or -1
  std::vector<ProxyRequest> slots = std::vector<ProxyRequest>(kFifoSlots);
  uint64_t claimed = 0, consumed = 0;
  std::unique_ptr<CrossNodeProxy> proxy;
};

class Group {
 public:
  Group(const std::vector<std::string>& names, uint64_t heap_bytes, size_t max_in_flight)
      : world(static_cast<int>(names.size())),
        heap_bytes((heap_bytes + 7) / 8 * 8),
        memory(world, std::vector<uint64_t>(this->heap_bytes / 8, 0)),
        ranks(world),
        all_(world) {
    for (auto& m : memory) heaps.push_back(reinterpret_cast<char*>(m.data()));
    for (int r = 0; r < world; ++r) {
      Rank& rank = ranks[r];
      rank.topo = make_topology(r, names);
      rank.local_of.assign(world, -1);
      for (int l = 0; l < rank.topo.local_size(); ++l) rank.local_of[rank.topo.local_ranks[l]] = l;
      CrossNodeOptions o;
      o.backend = CrossNodeBackend::kMemory;
      o.queue = ProxyQueue{rank.slots.data(), &rank.consumed, kFifoSlots};
      o.heaps = heaps;
      o.heap_bytes = this->heap_bytes;
      o.memory_order = MemoryBackend::Order::kShuffled;
      o.memory_max_in_flight = max_in_flight;
      o.on_failure = [this](const std::string& why) { abort("proxy: " + why); };
      rank.proxy = std::make_unique<CrossNodeProxy>(rank.topo, o);
    }
    for (int n = 0; n < ranks[0].topo.num_nodes; ++n) {
      int size = 0;
      for (int r = 0; r < world; ++r) size += ranks[r].topo.node == n;
      handshakes_.push_back(std::make_unique<Barrier>(size));
    }
  }

  // The op handshake on rank r's node (op_enter): every rank there has started this launch.
  void handshake(int r) { handshakes_[ranks[r].topo.node]->wait(); }
  // Everyone has finished the launch: a barrier that, in a real group, nothing provides across nodes.
  void barrier() { all_.wait(); }

  bool remote(int me, int q) const { return ranks[me].local_of[q] < 0; }

  // What a posting thread of rank r copies out of NodesReduceParams::proxy.
  ProxyTransport proxy(int r) {
    ProxyTransport t{};
    t.fifo = ProxyFifo{ranks[r].slots.data(), &ranks[r].claimed, &ranks[r].consumed, kFifoSlots};
    t.heap = heaps[r];
    t.heap_bytes = heap_bytes;
    t.timeout_ns = std::chrono::nanoseconds(kWaitLimit).count();
    t.host_abort = &abort_;
    return t;
  }

  // The first failure aborts the group, as a device fault does: every wait and post then gives up.
  void abort(const std::string& why) {
    if (__atomic_exchange_n(&abort_, 1, __ATOMIC_ACQ_REL) == 0) ADD_FAILURE() << why;
  }
  bool aborted() const { return __atomic_load_n(&abort_, __ATOMIC_ACQUIRE) != 0; }

  // The kernel's waits (NvlinkTransport::wait, ProxyTransport::wait) on the host: until
  // *flag >= value, yielding, then sleeping (the test runs many more threads than cores, and
  // spinning waiters would starve the proxies and the senders). False once the group is aborted,
  // or after kWaitLimit, which aborts it, saying what() waited.
  template <class What>
  bool wait(const uint64_t* flag, uint64_t value, const What& what) {
    Clock::time_point start{};
    for (uint32_t spin = 0;; ++spin) {
      const uint64_t seen = __atomic_load_n(flag, __ATOMIC_ACQUIRE);
      if (seen >= value) return true;
      if (spin % 64 == 0) {
        if (aborted()) return false;
        if (spin == 0) {
          start = Clock::now();
        } else if (Clock::now() - start > kWaitLimit) {
          abort(what() + " waited for " + std::to_string(value) + ", saw " + std::to_string(seen));
          return false;
        }
      }
      if (spin < 256) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  const int world;
  const uint64_t heap_bytes;
  std::vector<std::vector<uint64_t>> memory;  // declared before ranks: the proxies go first
  std::vector<char*> heaps;
  std::vector<Rank> ranks;

 private:
  int32_t abort_ = 0;
  Barrier all_;
  std::vector<std::unique_ptr<Barrier>> handshakes_;  // by node
};

// An op's NodesReduceFlags in a heap: the kernel's flags_of.
NodesReduceFlags& flags_of(char* heap, OpId op) {
  SignalPad* pad = reinterpret_cast<SignalPad*>(heap);
  ReduceFlags* f = op == OpId::kReduceScatter ? op_flags<ReduceFlags, OpId::kReduceScatter>(pad)
                                              : op_flags<ReduceFlags, OpId::kAllReduce>(pad);
  return *reinterpret_cast<NodesReduceFlags*>(reinterpret_cast<char*>(f) + kNodesReduceFlagsInRegion);
}

// Holds one rank's network at a time, for up to 300 us: writes then land late, after the NVLink
// stores, and possibly after their sender's kernel would have returned.
class Stalls {
 public:
  explicit Stalls(Group& g) : thread_([this, &g] {
    std::mt19937 random(std::random_device{}());
    while (!stop_.load()) {
      auto& net = static_cast<MemoryBackend&>(g.ranks[random() % g.world].proxy->backend());
      net.hold(true);
      std::this_thread::sleep_for(std::chrono::microseconds(random() % 300));
      net.hold(false);
      std::this_thread::sleep_for(std::chrono::microseconds(random() % 300));
    }
  }) {}
  ~Stalls() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- One CTA of nodes_reduce_kernel. ----

// CTA `block` of `ctas` on rank me, in the kernel's order; run() is false if a wait or a post
// failed (the group is then aborted).
class Cta {
 public:
  Cta(Group& g, const Launch& p, int me, const char* inp, char* out, int block, int ctas)
      : g_(g),
        p_(p),
        plan_(p.plan),
        me_(me),
        world_(p.plan.world),
        heap_(g.heaps[me]),
        inp_(inp),
        out_(out),
        block_(block),
        ctas_(ctas),
        flags_(flags_of(g.heaps[me], p.op)),
        launch_(__atomic_load_n(&flags_.launches, __ATOMIC_ACQUIRE) + 1) {}

  bool run() { return announce() && partials() && own_share() && gathered_shares() && finish(); }

 private:
  // Bytes [lo, lo + n) of share q that chunk c covers (the kernel's chunk_of).
  void chunk_of(int q, int c, uint64_t* lo, uint64_t* n) const {
    const uint64_t size = plan_.share_size(q);
    *lo = static_cast<uint64_t>(c) * plan_.chunk_bytes;
    *n = *lo < size ? std::min(plan_.chunk_bytes, size - *lo) : 0;
  }

  // The same flag in rank q's pad (NvlinkTransport::on_peer).
  uint64_t* on_peer(int q, uint64_t* mine) const {
    return reinterpret_cast<uint64_t*>(g_.heaps[q] + (reinterpret_cast<char*>(mine) - heap_));
  }

  bool posted(ProxySend sent, const char* what, int q) {
    if (sent == ProxySend::kPosted) return true;
    g_.abort("rank " + std::to_string(me_) + ": " + what + " to rank " + std::to_string(q) + " not posted (" +
             std::to_string(static_cast<int>(sent)) + ")");
    return false;
  }

  std::string where(const char* flag, int peer, int c = -1) const {
    return std::string(op_name(p_.op)) + " launch " + std::to_string(launch_) + ", rank " + std::to_string(me_) +
           ": " + flag + "[" + std::to_string(peer) + "]" + (c >= 0 ? "[" + std::to_string(c) + "]" : "");
  }

  // The kernel's send(): n bytes at src to rank q's heap at `offset`, then flag += 1 there. A node
  // peer: stores into its heap, then the add (NVLink). Another node's: once q has started this
  // launch, from `stage` (this rank's send buffer; null: src is in the heap already) through the proxy.
  bool send(int q, uint64_t offset, const char* src, char* stage, uint64_t n, uint64_t* flag) {
    if (!g_.remote(me_, q)) {
      if (n > 0) std::memcpy(g_.heaps[q] + offset, src, n);
      __atomic_fetch_add(on_peer(q, flag), 1, __ATOMIC_RELEASE);
      return true;
    }
    if (!g_.wait(&flags_.ready[q], launch_, [&] { return where("ready", q); })) return false;
    if (stage != nullptr) {
      if (n > 0) std::memcpy(stage, src, n);
      src = stage;
    }
    return posted(g_.proxy(me_).put_signal(q, offset, src, n, flag, 1), "put_signal", q);
  }

  // dst[0, n) = the world's partials of one chunk of the own share, summed in rank order in fp32:
  // partial s is `own` for s == me, else slot(s, me) of `slots` (the kernel's reduce_range).
  void reduce_range(const char* own, const char* slots, char* dst, uint64_t n) const {
    for (uint64_t at = 0; at < n; at += sizeof(float)) {
      const float sum = sum_in_rank_order(world_, [&](int32_t s) {
        return load_float((s == me_ ? own : slots + ReducePlan::slot(s, me_) * plan_.share_bytes) + at);
      });
      std::memcpy(dst + at, &sum, sizeof sum);
    }
  }

  // CTA 0: every rank of another node sends here; tell each that this launch has started.
  bool announce() {
    for (int q = 0; block_ == 0 && q < world_; ++q) {
      if (g_.remote(me_, q) && !posted(g_.proxy(me_).signal(q, &flags_.ready[me_], 1), "ready", q)) return false;
    }
    return true;
  }

  // 1. Partials to their owners.
  bool partials() {
    for (int i = block_; i < (world_ - 1) * p_.chunks; i += ctas_) {
      const int q = (me_ + 1 + i / p_.chunks) % world_;
      const int c = i % p_.chunks;
      uint64_t lo, n;
      chunk_of(q, c, &lo, &n);
      const uint64_t at = p_.staging + ReducePlan::slot(me_, q) * plan_.share_bytes + lo;
      if (!send(q, at, inp_ + plan_.share_begin(q) + lo, heap_ + p_.send + q * plan_.share_bytes + lo, n,
                &flags_.landed[me_][c])) {
        return false;
      }
    }
    return true;
  }

  // 2. The own share: each chunk summed once every partial of it landed; all_reduce pushes the sum.
  bool own_share() {
    for (int c = block_; c < p_.chunks; c += ctas_) {
      const uint64_t expected = flags_.uses[c] + 1;
      for (int s = 0; s < world_; ++s) {
        if (s != me_ && !g_.wait(&flags_.landed[s][c], expected, [&] { return where("landed", s, c); })) return false;
      }
      uint64_t lo, n;
      chunk_of(me_, c, &lo, &n);
      const char* own = inp_ + plan_.share_begin(me_) + lo;
      if (p_.op == OpId::kReduceScatter) {
        reduce_range(own, heap_ + p_.staging + lo, out_ + lo, n);
        continue;
      }
      const uint64_t at = p_.gather + me_ * plan_.share_bytes + lo;
      reduce_range(own, heap_ + p_.staging + lo, heap_ + at, n);
      if (n > 0) std::memcpy(out_ + plan_.share_begin(me_) + lo, heap_ + at, n);
      for (int k = 1; k < world_; ++k) {
        const int q = (me_ + k) % world_;
        if (!send(q, at, heap_ + at, nullptr, n, &flags_.gathered[me_][c])) return false;
      }
    }
    return true;
  }

  // 3. all_reduce: every other owner's sums, into out.
  bool gathered_shares() {
    for (int i = block_; p_.op == OpId::kAllReduce && i < (world_ - 1) * p_.chunks; i += ctas_) {
      const int s = (me_ + 1 + i / p_.chunks) % world_;
      const int c = i % p_.chunks;
      if (!g_.wait(&flags_.gathered[s][c], flags_.uses[c] + 1, [&] { return where("gathered", s, c); })) return false;
      uint64_t lo, n;
      chunk_of(s, c, &lo, &n);
      if (n > 0) std::memcpy(out_ + plan_.share_begin(s) + lo, heap_ + p_.gather + s * plan_.share_bytes + lo, n);
    }
    return true;
  }

  // The last CTA out: drained both ways with every rank of another node, then the local counters.
  bool finish() {
    if (__atomic_fetch_add(&flags_.finished, 1u, __ATOMIC_ACQ_REL) != static_cast<uint32_t>(ctas_ - 1)) return true;
    for (int q = 0; q < world_; ++q) {
      if (g_.remote(me_, q) && !posted(g_.proxy(me_).signal(q, &flags_.drained[me_], 1), "drained", q)) return false;
    }
    for (int q = 0; q < world_; ++q) {
      if (g_.remote(me_, q) && !g_.wait(&flags_.drained[q], launch_, [&] { return where("drained", q); })) return false;
    }
    flags_.finished = 0;
    for (int c = 0; c < p_.chunks; ++c) flags_.uses[c] += 1;
    __atomic_store_n(&flags_.launches, launch_, __ATOMIC_RELEASE);
    return true;
  }

  Group& g_;
  const Launch& p_;
  const ReducePlan& plan_;
  const int me_, world_;
  char* const heap_;
  const char* const inp_;
  char* const out_;
  const int block_, ctas_;
  NodesReduceFlags& flags_;
  const uint64_t launch_;
};

// ---- A rank's launches, and their checks. ----

enum class Between { kNothing, kBarrier };

struct Options {
  uint64_t min_chunk = 64;  // bytes: shares of a few KiB get dozens of chunks
  int ctas = 2;
  Between between = Between::kNothing;
  size_t max_in_flight = 16;  // the memory backend's writes in flight per rank
};

// The kernel's launch: its CTAs as threads, all resident at once. False if one failed.
bool launch(Group& g, const Launch& p, int me, const char* inp, char* out, int ctas) {
  std::vector<std::thread> threads;
  std::vector<char> ok(ctas, 0);
  for (int b = 0; b < ctas; ++b) {
    threads.emplace_back([&, b] { ok[b] = Cta(g, p, me, inp, out, b, ctas).run(); });
  }
  for (auto& t : threads) t.join();
  return std::all_of(ok.begin(), ok.end(), [](char x) { return x != 0; });
}

// out of rank r after step k, bit for bit: element j is the rank-order sum of element j (all_reduce)
// or of element j of share r (reduce_scatter) of every rank's input.
void check_out(const Group& g, const Launch& p, int k, int r, const float* out) {
  const uint64_t first = p.op == OpId::kReduceScatter ? p.plan.share_begin(r) / sizeof(float) : 0;
  int wrong = 0;
  for (uint64_t j = 0; j < p.out_bytes / sizeof(float); ++j) {
    const float want = sum_in_rank_order(g.world, [&](int32_t s) { return value(k, s, first + j); });
    if (std::memcmp(&want, &out[j], sizeof want) != 0 && wrong++ < 3) {
      const uint64_t byte = (first + j) * sizeof(float);  // in the message
      ADD_FAILURE() << op_name(p.op) << " step " << k << ", rank " << r << ": out[" << j << "] is " << out[j]
                    << ", the sum is " << want << " (share " << byte / p.plan.share_bytes << ", chunk "
                    << byte % p.plan.share_bytes / p.plan.chunk_bytes << ")";
    }
  }
}

// Right after a launch returns, rank r treats its scratch as a later op may: it fills all of it
// with garbage, then, a moment later (that op's run), expects to find it intact.
void scribble_scratch(Group& g, int r) { std::memset(g.heaps[r] + kScratch, kGarbage, g.heap_bytes - kScratch); }
void check_scratch_untouched(Group& g, int r, int k, std::mt19937& random) {
  std::this_thread::sleep_for(std::chrono::microseconds(random() % 200));
  const char* scratch = g.heaps[r] + kScratch;
  for (uint64_t i = 0; i < g.heap_bytes - kScratch; ++i) {
    if (static_cast<unsigned char>(scratch[i]) != kGarbage) {
      ADD_FAILURE() << "after step " << k << ", before its next launch, something wrote rank " << r
                    << "'s scratch at byte " << i;
      return;
    }
  }
}

void run_rank(Group& g, int r, const std::vector<Step>& steps, const Options& o) {
  std::mt19937 random(std::random_device{}());
  bool running = true;  // after a failure, only the barriers: the others must not hang on them
  for (int k = 0; k < static_cast<int>(steps.size()); ++k) {
    const Launch p = plan_launch(steps[k], g.world, r, o.min_chunk);
    std::vector<float> inp(p.in_bytes / sizeof(float));
    for (uint64_t i = 0; i < inp.size(); ++i) inp[i] = value(k, r, i);
    std::vector<float> separate(p.in_place ? 0 : p.out_bytes / sizeof(float));
    if (!separate.empty()) std::memset(separate.data(), kGarbage, separate.size() * sizeof(float));  // all rewritten
    float* out = p.in_place ? inp.data() : separate.data();
    g.handshake(r);
    running = running && launch(g, p, r, reinterpret_cast<const char*>(inp.data()), reinterpret_cast<char*>(out),
                                o.ctas);
    if (running) {
      scribble_scratch(g, r);
      if (!p.in_place) std::memset(inp.data(), kGarbage, inp.size() * sizeof(float));  // nothing reads inp now
      check_out(g, p, k, r, out);
      check_scratch_untouched(g, r, k, random);
    }
    if (o.between == Between::kBarrier) g.barrier();
  }
}

// Every counter moved once per launch: per op, uses[c] and landed / gathered[s][c] by the launches
// with a chunk c, ready and drained[q] (another node's q) by the launches.
void check_counters(Group& g, const std::vector<Step>& steps, const Options& o) {
  for (OpId op : {OpId::kReduceScatter, OpId::kAllReduce}) {
    uint64_t launches = 0;
    std::vector<uint64_t> uses(kNodesReduceMaxChunks, 0);
    for (const Step& step : steps) {
      if (step.op != op) continue;
      ++launches;
      const int chunks = plan_launch(step, g.world, 0, o.min_chunk).chunks;
      for (int c = 0; c < chunks; ++c) ++uses[c];
    }
    for (int r = 0; r < g.world; ++r) {
      NodesReduceFlags& f = flags_of(g.heaps[r], op);
      const std::string who = std::string(op_name(op)) + " on rank " + std::to_string(r) + ": ";
      EXPECT_EQ(f.launches, launches) << who << "launches";
      EXPECT_EQ(f.finished, 0u) << who << "finished";
      for (int c = 0; c < kNodesReduceMaxChunks; ++c) {
        EXPECT_EQ(f.uses[c], uses[c]) << who << "uses[" << c << "]";
        for (int s = 0; s < g.world; ++s) {
          EXPECT_EQ(f.landed[s][c], s == r ? 0 : uses[c]) << who << "landed[" << s << "][" << c << "]";
          const uint64_t gathered = s == r || op != OpId::kAllReduce ? 0 : uses[c];
          EXPECT_EQ(f.gathered[s][c], gathered) << who << "gathered[" << s << "][" << c << "]";
        }
      }
      for (int q = 0; q < g.world; ++q) {
        const uint64_t want = g.remote(r, q) ? launches : 0;
        // The last ready and drained signals may still be on their way.
        g.wait(&f.ready[q], want, [&] { return who + "ready[" + std::to_string(q) + "]"; });
        g.wait(&f.drained[q], want, [&] { return who + "drained[" + std::to_string(q) + "]"; });
        EXPECT_EQ(f.ready[q], want) << who << "ready[" << q << "]";
        EXPECT_EQ(f.drained[q], want) << who << "drained[" << q << "]";
      }
    }
  }
}

void run_group(const std::vector<std::string>& names, const std::vector<Step>& steps, const Options& o = {}) {
  const int world = static_cast<int>(names.size());
  uint64_t scratch = 0;
  for (const Step& step : steps) scratch = std::max(scratch, plan_launch(step, world, 0, o.min_chunk).scratch_bytes);
  Group g(names, kScratch + scratch, o.max_in_flight);
  {
    Stalls stalls(g);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { run_rank(g, r, steps, o); });
    for (auto& t : threads) t.join();
  }
  if (!g.aborted()) check_counters(g, steps, o);
}

// Both ops, in turn (they share the scratch); chunk counts that rise and fall (uses[c]); an
// all_reduce whose elements do not divide by the world (short last shares) and one so short that the
// last shares are empty; an empty message; an all_reduce in place. With 64-byte chunks: rs(128) has
// 8 chunks a share, rs(32) 2, ar(1001) 16 to 32, ar(10000) 60 to 63 (larger chunks, to fit 64).
std::vector<Step> mixed_steps() {
  return {rs(128), ar(1001), rs(32), ar(10000), ar(5), rs(128), ar_in_place(999), ar(0), rs(0), ar(1001), rs(32)};
}

// One rank per node, back to back: only ready and drained keep a rank that is a launch ahead out of
// its peers' scratch, and its own send buffer from being reused too early.
TEST(NodesReduceOnHostThreads, TwoNodesBackToBack) { run_group({"a", "b"}, mixed_steps()); }

TEST(NodesReduceOnHostThreads, ThreeNodesBackToBack) { run_group({"a", "b", "c"}, mixed_steps(), {64, 3}); }

// NVLink and network mixed: the node's handshake orders its ranks, ready and drained the nodes.
TEST(NodesReduceOnHostThreads, TwoNodesOfTwoBackToBack) { run_group({"a", "a", "b", "b"}, mixed_steps()); }

TEST(NodesReduceOnHostThreads, TwoNodesOfTwoWithBarrier) {
  run_group({"a", "a", "b", "b"}, mixed_steps(), {64, 2, Between::kBarrier});
}

// Uneven nodes, a node's ranks not adjacent.
TEST(NodesReduceOnHostThreads, UnevenNodesBackToBack) { run_group({"a", "b", "a"}, mixed_steps(), {64, 3}); }

TEST(NodesReduceOnHostThreads, UnevenNodesWithBarrier) {
  run_group({"a", "b", "a"}, mixed_steps(), {256, 1, Between::kBarrier});
}

// One CTA per rank, larger chunks, few writes in flight (backpressure on the FIFO).
TEST(NodesReduceOnHostThreads, OneCtaLargerChunks) {
  run_group({"a", "a", "b", "b"}, {ar(3000), rs(1000), ar(7), rs(4), ar(3000)}, {256, 1, Between::kNothing, 2});
}

}  // namespace
}  // namespace interlace
