// The standalone reduce_scatter / all_reduce plan (ops/reduce/plan.h): shares and chunks, the
// algorithm rule, the argument checks, and a host simulation of the kernel's protocol
// (ops/reduce/kernel.cuh) over several launches, in random interleavings of every rank's CTAs.
#include "interlace/ops/reduce/plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/device/signal_pad.h"
#include "interlace/ops/all_gather/hierarchy.h"
#include "interlace/ops/chunks.h"
#include "interlace/ops/reduce/flags.h"
#include "tests/cc/error_of.h"

namespace interlace {
namespace {

static_assert(sizeof(ReduceFlags) <= kOpRegionBytes, "two counters per (CTA, sender) and one per CTA fit a region");

// ---- Shares and chunks ----------------------------------------------------------------------

// Chunks cover every byte of a share, 16-byte aligned, with no empty round; shares tile the message.
void check_reduce_plan(const ReducePlan& p, int resident) {
  SCOPED_TRACE(::testing::Message() << "bytes " << p.bytes << ", world " << p.world);
  EXPECT_GE(p.num_blocks, 1);
  EXPECT_LE(p.num_blocks, std::min(resident, kReduceMaxBlocks));
  EXPECT_EQ(p.chunk_bytes % 16, 0u);
  EXPECT_EQ(p.share_bytes % 16, 0u);
  EXPECT_GE(uint64_t(p.rounds) * p.num_blocks * p.chunk_bytes, p.share_bytes);
  if (p.rounds > 0) {
    EXPECT_LT(uint64_t(p.rounds - 1) * p.num_blocks * p.chunk_bytes, p.share_bytes);
  }
  EXPECT_EQ(p.staging_bytes, p.share_bytes * (p.world - 1));
  uint64_t covered = 0;
  for (int q = 0; q < p.world; ++q) {
    EXPECT_LE(p.share_size(q), p.share_bytes);
    if (p.algorithm == ReduceAlgorithm::kOneShot) {
      EXPECT_EQ(p.share_begin(q), 0u);
      EXPECT_EQ(p.share_size(q), p.bytes);
    } else {
      EXPECT_EQ(p.share_begin(q), covered);  // contiguous, in rank order
      EXPECT_TRUE(p.share_begin(q) % 16 == 0 || p.share_size(q) == 0);
      covered += p.share_size(q);
    }
  }
  if (p.algorithm != ReduceAlgorithm::kOneShot) {
    EXPECT_EQ(covered, p.bytes);
  }
  // Slots: every sender but the receiver, each once, in [0, world - 1).
  for (int q = 0; q < p.world; ++q) {
    std::vector<int> seen(std::max(p.world - 1, 1), 0);
    for (int s = 0; s < p.world; ++s) {
      if (s == q) continue;
      ASSERT_GE(ReducePlan::slot(s, q), 0);
      ASSERT_LT(ReducePlan::slot(s, q), p.world - 1);
      ++seen[ReducePlan::slot(s, q)];
    }
    if (p.world > 1) {
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
  }
}

TEST(ReducePlan, ChunksCoverEveryByte) {
  for (uint64_t bytes : {0ull, 16ull, 2048ull, 65536ull + 16, 1ull << 20, (256ull << 20) + 32, 1ull << 32}) {
    for (int world : {1, 2, 3, 8, 72}) {
      for (int resident : {132, 396, 2000}) {
        check_reduce_plan(plan_reduce_scatter(bytes, 2, world, 0, resident), resident);
        check_reduce_plan(plan_all_reduce(bytes, 2, world, world - 1, resident, false), resident);
        check_reduce_plan(plan_all_reduce(bytes + 2, 2, world, 0, resident, false), resident);
        check_reduce_plan(plan_all_reduce(bytes + 6, 2, world, 0, resident, false, {ReduceAlgorithm::kOneShot}),
                          resident);
        check_reduce_plan(plan_all_reduce(bytes, 4, world, 0, resident, true, {ReduceAlgorithm::kTwoShot}), resident);
      }
    }
  }
}

TEST(ReducePlan, AllReducePicksOneShotForSmallMessages) {
  const auto algorithm = [](uint64_t bytes, int world, ReduceTuning tuning = {}) {
    return plan_all_reduce(bytes, 2, world, 0, 264, false, tuning).algorithm;
  };
  EXPECT_EQ(algorithm(2, 2), ReduceAlgorithm::kOneShot);
  EXPECT_EQ(algorithm(16 << 10, 2), ReduceAlgorithm::kOneShot);
  EXPECT_EQ(algorithm(kAllReduceOneShotMaxBytes, 8), ReduceAlgorithm::kOneShot);
  EXPECT_EQ(algorithm(kAllReduceOneShotMaxBytes + 2, 8), ReduceAlgorithm::kTwoShot);
  EXPECT_EQ(algorithm(kAllReduceOneShotMaxBytes + 2, 3), ReduceAlgorithm::kTwoShot);
  // Two ranks: both move the same bytes, one-shot has a hop less.
  EXPECT_EQ(algorithm(kAllReduceOneShotMaxBytesTwoRanks, 2), ReduceAlgorithm::kOneShot);
  EXPECT_EQ(algorithm(kAllReduceOneShotMaxBytesTwoRanks + 2, 2), ReduceAlgorithm::kTwoShot);
  EXPECT_EQ(algorithm(256ull << 20, 2), ReduceAlgorithm::kTwoShot);
  EXPECT_EQ(algorithm(256ull << 20, 1), ReduceAlgorithm::kOneShot);  // nothing to share
  EXPECT_EQ(algorithm(256ull << 20, 2, {ReduceAlgorithm::kOneShot}), ReduceAlgorithm::kOneShot);
  EXPECT_EQ(algorithm(16, 2, {ReduceAlgorithm::kTwoShot}), ReduceAlgorithm::kTwoShot);
  // Large messages use every resident CTA (up to kReduceMaxBlocks) with the largest chunks, as all_gather.
  const ReducePlan big = plan_all_reduce(256ull << 20, 2, 2, 1, 264, false);
  EXPECT_EQ(big.share_bytes, 128ull << 20);
  EXPECT_EQ(big.num_blocks, 264);
  EXPECT_EQ(big.chunk_bytes, kMaxChunk);
  EXPECT_EQ(big.landing_bytes, big.staging_bytes);
  EXPECT_EQ(plan_all_reduce(256ull << 20, 2, 2, 1, 264, true).landing_bytes, 0u);  // owners store into out
  EXPECT_EQ(plan_all_reduce(256ull << 20, 2, 2, 1, 2000, false).num_blocks, kReduceMaxBlocks);
  EXPECT_EQ(plan_all_reduce(1 << 10, 2, 2, 1, 264, false).landing_bytes, 0u);  // one-shot: no second hop
  EXPECT_EQ(plan_reduce_scatter(1024, 2, 2, 0, 396).num_blocks, 1);
  const ReducePlan tuned = plan_reduce_scatter(1 << 20, 2, 2, 0, 396, {ReduceAlgorithm::kAuto, 64, 4096});
  EXPECT_EQ(tuned.num_blocks, 64);
  EXPECT_EQ(tuned.chunk_bytes, 4096u);
  EXPECT_EQ(tuned.rounds, 4);
  EXPECT_EQ(tuned.steps(), 4u);
  EXPECT_EQ(plan_all_reduce(1 << 20, 2, 2, 0, 396, false, {ReduceAlgorithm::kTwoShot, 64, 4096}).steps(), 4u);
}

TEST(ReducePlan, BadSizesAndOverflowsRaise) {
  // Elements, ranks, shares.
  EXPECT_THROW(plan_reduce_scatter(1024, 3, 2, 0, 132), Error);
  EXPECT_THROW(plan_all_reduce(1024, 1, 2, 0, 132, false), Error);
  EXPECT_THROW(plan_all_reduce(1023, 2, 2, 0, 132, false), Error);
  EXPECT_THROW(plan_all_reduce(1024, 4, 0, 0, 132, false), Error);
  EXPECT_THROW(plan_all_reduce(1024, 4, 2, 2, 132, false), Error);  // rank outside the world
  EXPECT_THROW(plan_reduce_scatter(1024, 2, kMaxLocalRanks + 1, 0, 132), Error);
  const std::string share = error_of([] { plan_reduce_scatter(1000, 2, 2, 0, 132); });
  EXPECT_NE(share.find("multiple of 16 bytes"), std::string::npos) << share;
  EXPECT_NO_THROW(plan_all_reduce(1000, 2, 2, 0, 132, false));  // all_reduce takes any element count
  // Tuning.
  EXPECT_THROW(plan_reduce_scatter(1 << 20, 2, 2, 0, 132, {ReduceAlgorithm::kOneShot}), Error);
  EXPECT_THROW(plan_all_reduce(1 << 20, 2, 2, 0, 132, false, {ReduceAlgorithm::kReduceScatter}), Error);
  EXPECT_THROW(plan_all_reduce(1 << 20, 2, 2, 0, 132, false, {ReduceAlgorithm::kAuto, 133, 0}), Error);
  EXPECT_THROW(plan_all_reduce(1 << 20, 2, 2, 0, 132, false, {ReduceAlgorithm::kAuto, -1, 0}), Error);
  EXPECT_THROW(plan_all_reduce(1 << 20, 2, 2, 0, 132, false, {ReduceAlgorithm::kAuto, 0, 100}), Error);
  EXPECT_THROW(plan_all_reduce(1 << 20, 2, 2, 0, 132, false, {ReduceAlgorithm::kAuto, 0, uint64_t{1} << 31}), Error);
  EXPECT_THROW(plan_all_reduce(1 << 20, 2, 2, 0, 0, false), Error);
  // 32-bit chunk counters: 2^36 chunks of 16 bytes, but fine in chunks of 1 MiB.
  const std::string message =
      error_of([] { plan_reduce_scatter(uint64_t{1} << 40, 2, 2, 0, 132, {ReduceAlgorithm::kAuto, 1, 16}); });
  EXPECT_NE(message.find("32-bit"), std::string::npos) << message;
  EXPECT_NO_THROW(plan_reduce_scatter(uint64_t{1} << 40, 2, 2, 0, 132, {ReduceAlgorithm::kAuto, 1, 1 << 20}));
  // 64-bit sizes: world shares, and one-shot's world - 1 staging slots of the whole message.
  EXPECT_THROW(plan_reduce_scatter(uint64_t{1} << 62, 2, 8, 0, 132), Error);
  const std::string staging = error_of([] {
    plan_all_reduce(uint64_t{1} << 58, 2, 72, 0, 2000, false, {ReduceAlgorithm::kOneShot, 0, uint64_t{1} << 30});
  });
  EXPECT_NE(staging.find("64 bits"), std::string::npos) << staging;
}

// ---- Argument checks ------------------------------------------------------------------------

TensorView view(std::vector<int64_t> shape, DLDataType dtype = {kDLBfloat, 16, 1}, uintptr_t address = 1 << 20,
                int device = 0) {
  TensorView t;
  t.data = reinterpret_cast<void*>(address);
  t.device = DLDevice{kDLCUDA, device};
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

void expect_error(const std::string& message, const std::string& needle) {
  EXPECT_NE(message.find(needle), std::string::npos) << "expected '" << needle << "' in: " << message;
}

TEST(ReduceArgs, ReduceScatterShapes) {
  const uintptr_t far = 1 << 30;  // out's address, apart from inp's
  EXPECT_NO_THROW(check_reduce_scatter_args(view({8, 3}, {kDLBfloat, 16, 1}, far), view({16, 3}), 2, 0));
  EXPECT_NO_THROW(check_reduce_scatter_args(view({8, 3}, {kDLBfloat, 16, 1}, far), view({2, 8, 3}), 2, 0));
  EXPECT_NO_THROW(check_reduce_scatter_args(view({8, 3}, {kDLBfloat, 16, 1}, far), view({48}), 2, 0));
  EXPECT_NO_THROW(check_reduce_scatter_args(view({0}, {kDLBfloat, 16, 1}, far), view({0}), 2, 0));
  expect_error(error_of([&] { check_reduce_scatter_args(view({8, 3}, {kDLBfloat, 16, 1}, far), view({17, 3}), 2, 0); }),
               "inp must be [2 * out.shape[0]");
  expect_error(error_of([&] { check_reduce_scatter_args(view({8, 3}, {kDLBfloat, 16, 1}, far), view({16, 4}), 2, 0); }),
               "shape");
}

TEST(ReduceArgs, DtypeDeviceLayoutAlignmentOverlap) {
  const uintptr_t far = 1 << 30;
  const DLDataType f16{kDLFloat, 16, 1}, f32{kDLFloat, 32, 1}, f64{kDLFloat, 64, 1}, i32{kDLInt, 32, 1};
  EXPECT_NO_THROW(check_all_reduce_args(view({5}, f16, far), view({5}, f16), 0));
  EXPECT_NO_THROW(check_all_reduce_args(view({5}, f32, far), view({5}, f32), 0));
  expect_error(error_of([&] { check_all_reduce_args(view({5}, f32, far), view({5}, f16), 0); }),
               "out has dtype float32 but inp has float16");
  expect_error(error_of([&] { check_all_reduce_args(view({5}, f64, far), view({5}, f64), 0); }),
               "float16, bfloat16 or float32");
  expect_error(error_of([&] { check_reduce_scatter_args(view({8}, i32, far), view({16}, i32), 2, 0); }),
               "float16, bfloat16 or float32");
  expect_error(error_of([&] { check_all_reduce_args(view({5}, f16, far), view({6}, f16), 0); }), "shape");
  expect_error(error_of([&] { check_all_reduce_args(view({5}, f16, far, 1), view({5}, f16), 0); }),
               "out is on cuda:1 but the group's GPU is cuda:0");
  TensorView host = view({5}, f16);
  host.device = DLDevice{kDLCPU, 0};
  expect_error(error_of([&] { check_all_reduce_args(view({5}, f16, far), host, 0); }), "inp is on cpu");
  TensorView strided = view({4, 2}, f16);
  strided.strides = {1, 4};
  expect_error(error_of([&] { check_all_reduce_args(view({4, 2}, f16, far), strided, 0); }),
               "inp must be contiguous");
  expect_error(error_of([&] { check_all_reduce_args(view({5}, f16, far + 2), view({5}, f16), 0); }),
               "out must start 16-byte aligned");
  expect_error(error_of([&] { check_reduce_scatter_args(view({8}, f16, far), view({16}, f16, 8), 2, 0); }),
               "inp must start 16-byte aligned");
  // Overlap: all_reduce may run in place (the same memory), nothing else may overlap.
  EXPECT_NO_THROW(check_all_reduce_args(view({64}, f16), view({64}, f16), 0));
  expect_error(error_of([&] { check_all_reduce_args(view({64}, f16, (1 << 20) + 16), view({64}, f16), 0); }),
               "overlap without being the same memory");
  expect_error(error_of([&] { check_reduce_scatter_args(view({8}, f16, (1 << 20) + 16), view({16}, f16), 2, 0); }),
               "out and inp overlap");
  expect_error(error_of([&] { check_reduce_scatter_args(view({8}, f16), view({16}, f16), 2, 0); }), "overlap");
}

// ---- The kernel's protocol, simulated --------------------------------------------------------
//
// Every rank's CTAs run the kernel's steps (push partials, sum and push the reduced chunk, copy the
// landed chunks out) one action at a time, in a random interleaving; an action whose wait is not yet
// satisfied is skipped. Heaps are byte arrays at the same offsets on every rank, flags persist across
// launches, and data is float32, so the result must equal the rank-order sum exactly. Catches wrong
// slots, offsets, chunk ranges, counter values and in-place hazards (a read after a write).

struct SimRank {
  std::vector<char> heap;  // staging at 0, landing after it (or out itself when symmetric)
  std::vector<char> inp, out;
  ReduceFlags* flags = nullptr;
  std::vector<uint64_t> flag_storage;
};

struct SimCta {
  int32_t step = 0;
  int32_t stage = 0;  // within a step: 0 push, 1 reduce, 2 copy, then the next step
  uint64_t seq = 0;
  bool done = false;
};

enum class SimKind { kReduceScatter, kAllReduce };

class Simulation {
 public:
  Simulation(int world, uint32_t seed) : world_(world), random_(seed), ranks_(world) {
    for (auto& r : ranks_) {
      r.flag_storage.assign(sizeof(ReduceFlags) / 8 + 1, 0);
      r.flags = reinterpret_cast<ReduceFlags*>(r.flag_storage.data());
    }
  }

  // One launch on every rank, then checks every rank's out.
  void run(SimKind kind, uint64_t bytes, bool symmetric_out, bool in_place, ReduceTuning tuning) {
    SCOPED_TRACE(::testing::Message() << "world " << world_ << ", bytes " << bytes << ", "
                                      << (kind == SimKind::kReduceScatter ? "reduce_scatter" : "all_reduce")
                                      << ", symmetric " << symmetric_out << ", in place " << in_place
                                      << ", algorithm " << static_cast<int>(tuning.algorithm) << ", blocks "
                                      << tuning.num_blocks << ", chunk " << tuning.chunk_bytes);
    const uint64_t out_bytes = kind == SimKind::kReduceScatter ? bytes / world_ : bytes;
    std::vector<ReducePlan> plans;
    for (int q = 0; q < world_; ++q) {
      plans.push_back(kind == SimKind::kReduceScatter
                          ? plan_reduce_scatter(out_bytes, 4, world_, q, 1000, tuning)
                          : plan_all_reduce(bytes, 4, world_, q, 1000, symmetric_out, tuning));
    }
    const ReducePlan& plan0 = plans[0];
    staged_ = plan0.algorithm == ReduceAlgorithm::kTwoShot && !symmetric_out;
    // Heap: staging, landing, then a symmetric out at the same offset everywhere.
    const uint64_t out_offset = plan0.staging_bytes + plan0.landing_bytes;
    std::vector<std::vector<float>> inputs(world_);
    for (int q = 0; q < world_; ++q) {
      SimRank& r = ranks_[q];
      r.heap.assign(out_offset + (symmetric_out ? out_bytes : 0), '\x7f');  // garbage, not zeros
      inputs[q].resize(bytes / 4);
      for (auto& x : inputs[q]) x = static_cast<float>(std::uniform_int_distribution<int>(-1000, 1000)(random_)) / 8;
      r.inp.assign(reinterpret_cast<const char*>(inputs[q].data()), reinterpret_cast<const char*>(inputs[q].data()) + bytes);
      r.out.assign(out_bytes, '\x7f');
    }
    // In place, out is inp: in the heap when symmetric.
    if (in_place && symmetric_out) {
      for (int q = 0; q < world_; ++q) std::memcpy(ranks_[q].heap.data() + out_offset, ranks_[q].inp.data(), bytes);
    }
    const auto out_of = [&](int q) -> char* {
      if (symmetric_out) return ranks_[q].heap.data() + out_offset;
      return in_place ? ranks_[q].inp.data() : ranks_[q].out.data();
    };
    const auto in_of = [&](int q) -> const char* { return in_place ? out_of(q) : ranks_[q].inp.data(); };
    // Every (rank, CTA), interleaved at random until all finish.
    std::vector<std::vector<SimCta>> ctas(world_, std::vector<SimCta>(plan0.num_blocks));
    for (int q = 0; q < world_; ++q) {
      for (int b = 0; b < plan0.num_blocks; ++b) ctas[q][b].seq = ranks_[q].flags->steps[b];
    }
    int left = world_ * plan0.num_blocks;
    int idle = 0;
    while (left > 0) {
      const int q = std::uniform_int_distribution<int>(0, world_ - 1)(random_);
      const int b = std::uniform_int_distribution<int>(0, plan0.num_blocks - 1)(random_);
      SimCta& cta = ctas[q][b];
      if (cta.done) continue;
      if (advance(plans[q], q, b, cta, in_of, out_of, symmetric_out ? out_offset : 0)) {
        idle = 0;
        if (cta.done) {
          ranks_[q].flags->steps[b] = cta.seq + plans[q].steps();
          --left;
        }
      } else if (++idle > 100000) {
        FAIL() << "deadlock: no CTA can move";
      }
    }
    // Expected: each element summed in rank order in fp32.
    for (int q = 0; q < world_; ++q) {
      const uint64_t first = kind == SimKind::kReduceScatter ? q * out_bytes / 4 : 0;
      const float* got = reinterpret_cast<const float*>(out_of(q));
      for (uint64_t e = 0; e < out_bytes / 4; ++e) {
        const float want = sum_in_rank_order(world_, [&](int32_t s) { return inputs[s][first + e]; });
        ASSERT_EQ(std::memcmp(&got[e], &want, 4), 0) << "rank " << q << ", element " << e << ": got " << got[e]
                                                      << ", expected " << want;
      }
    }
  }

 private:
  // Runs CTA (q, b)'s next action if its wait is satisfied; returns whether it moved.
  template <class InOf, class OutOf>
  bool advance(const ReducePlan& plan, int q, int b, SimCta& cta, const InOf& in_of, const OutOf& out_of,
               uint64_t out_offset) {
    const int32_t rounds = plan.rounds;
    const int32_t lag = staged_ ? 2 : 1;
    const bool two_shot = plan.algorithm == ReduceAlgorithm::kTwoShot;
    SimRank& me = ranks_[q];
    if (cta.step >= rounds + lag) {  // the end: symmetric two-shot waits for every owner's pushes
      if (two_shot && !staged_ && !peers_reached(me.flags->reduced[b], q, cta.seq + 2 * uint64_t(rounds))) return false;
      cta.done = true;
      return true;
    }
    const int32_t s = cta.step;
    if (cta.stage == 0) {
      if (s < rounds) {
        const uint64_t lo = plan.chunk_begin(s, b);
        for (int32_t k = 1; k < world_; ++k) {
          const int32_t p = (q + k) % world_;
          copy(ranks_[p].heap.data() + ReducePlan::slot(q, p) * plan.share_bytes + lo,
               in_of(q) + plan.share_begin(p) + lo, size(plan, p, lo));
        }
        for (int32_t p = 0; p < world_; ++p) {
          if (p != q) raise(ranks_[p].flags->partial[b][q], cta.seq + s + 1);
        }
      }
    } else if (cta.stage == 1) {
      if (s >= 1 && s - 1 < rounds) {
        const int32_t r = s - 1;
        if (!peers_reached(me.flags->partial[b], q, cta.seq + r + 1)) return false;
        const uint64_t lo = plan.chunk_begin(r, b);
        const uint64_t n = size(plan, q, lo);
        const uint64_t at = (plan.algorithm == ReduceAlgorithm::kReduceScatter ? 0 : plan.share_begin(q)) + lo;
        char* dst = out_of(q) + at;
        const char* own = in_of(q) + plan.share_begin(q) + lo;
        for (uint64_t e = 0; e < n; e += 4) {
          const float sum = sum_in_rank_order(world_, [&](int32_t src) {
            const char* from = src == q ? own : me.heap.data() + ReducePlan::slot(src, q) * plan.share_bytes + lo;
            float x;
            std::memcpy(&x, from + e, 4);
            return x;
          });
          std::memcpy(dst + e, &sum, 4);
        }
        if (two_shot) {
          for (int32_t k = 1; k < world_; ++k) {
            const int32_t p = (q + k) % world_;
            const uint64_t landing = staged_ ? plan.staging_bytes + ReducePlan::slot(q, p) * plan.share_bytes + lo
                                             : out_offset + at;
            copy(ranks_[p].heap.data() + landing, dst, n);
          }
          for (int32_t p = 0; p < world_; ++p) {
            if (p != q) raise(ranks_[p].flags->reduced[b][q], cta.seq + rounds + r + 1);
          }
        }
      }
    } else {
      if (staged_ && s >= 2) {
        const int32_t r = s - 2;
        if (!peers_reached(me.flags->reduced[b], q, cta.seq + rounds + r + 1)) return false;
        const uint64_t lo = plan.chunk_begin(r, b);
        for (int32_t k = 1; k < world_; ++k) {
          const int32_t p = (q + k) % world_;
          copy(out_of(q) + plan.share_begin(p) + lo,
               me.heap.data() + plan.staging_bytes + ReducePlan::slot(p, q) * plan.share_bytes + lo, size(plan, p, lo));
        }
      }
    }
    if (++cta.stage == 3) {
      cta.stage = 0;
      ++cta.step;
    }
    return true;
  }

  static uint64_t size(const ReducePlan& plan, int32_t q, uint64_t lo) {
    const uint64_t share = plan.share_size(q);
    return lo < share ? std::min(plan.chunk_bytes, share - lo) : 0;
  }
  static void copy(char* dst, const char* src, uint64_t n) { std::memmove(dst, src, n); }
  static void raise(uint64_t& flag, uint64_t value) {
    EXPECT_GT(value, flag) << "a counter must only grow";
    flag = std::max(flag, value);
  }
  bool peers_reached(const uint64_t* row, int q, uint64_t value) const {
    for (int p = 0; p < world_; ++p) {
      if (p != q && row[p] < value) return false;
    }
    return true;
  }

  int world_;
  std::mt19937 random_;
  std::vector<SimRank> ranks_;
  bool staged_ = false;
};

TEST(ReduceProtocol, EveryAlgorithmSumsInRankOrderOverManyLaunches) {
  const ReduceTuning one_shot{ReduceAlgorithm::kOneShot, 0, 0}, two_shot{ReduceAlgorithm::kTwoShot, 0, 0};
  for (int world : {1, 2, 3, 5}) {
    Simulation sim(world, 17 + world);  // one group: flags carry over from launch to launch
    for (uint64_t elements : {0, 4, 12, 40, 44, 100, 1000, 1027}) {
      for (int blocks : {1, 3}) {
        for (uint64_t chunk : {16, 48, 112}) {
          const uint64_t bytes = elements * 4;
          if (bytes % (16 * world) == 0) {
            sim.run(SimKind::kReduceScatter, bytes, false, false, {ReduceAlgorithm::kAuto, blocks, chunk});
          }
          for (bool symmetric : {false, true}) {
            for (bool in_place : {false, true}) {
              for (ReduceTuning t : {one_shot, two_shot}) {
                t.num_blocks = blocks;
                t.chunk_bytes = chunk;
                sim.run(SimKind::kAllReduce, bytes, symmetric, in_place, t);
                if (::testing::Test::HasFatalFailure()) return;
              }
            }
          }
        }
      }
    }
  }
}

// Across nodes: chunks of at least the minimum, at most kHierMaxChunks, covering the share; the
// scratch's three buffers back to back.
TEST(ReducePlan, NodesLayoutChunksAndScratch) {
  for (int world : {2, 3, 8, 72}) {
    for (uint64_t bytes : {uint64_t{0}, uint64_t{16}, uint64_t{1000} * 16, uint64_t{64} << 20, uint64_t{3} << 30}) {
      ReduceTuning two_shot;
      two_shot.algorithm = ReduceAlgorithm::kTwoShot;
      const ReducePlan plan = plan_all_reduce(bytes, 2, world, world - 1, kReduceMaxBlocks, false, two_shot);
      for (uint64_t min_chunk : {uint64_t{64}, kHierDefaultChunk}) {
        const NodesReduceLayout l = nodes_reduce_layout(plan, /*gather=*/true, min_chunk);
        EXPECT_EQ(l.chunk_bytes % 16, 0u);
        EXPECT_GE(l.chunk_bytes, min_chunk);
        EXPECT_LE(l.chunks, kHierMaxChunks) << bytes << " bytes on " << world;
        EXPECT_GE(static_cast<uint64_t>(l.chunks) * l.chunk_bytes, plan.share_bytes);
        if (l.chunks > 0) {
          EXPECT_LT(static_cast<uint64_t>(l.chunks - 1) * l.chunk_bytes, plan.share_bytes);  // no empty chunk
        } else {
          EXPECT_EQ(plan.share_bytes, 0u);
        }
        EXPECT_EQ(l.send, plan.share_bytes * (world - 1));
        EXPECT_EQ(l.gather, l.send + plan.share_bytes * world);
        EXPECT_EQ(l.scratch_bytes, l.gather + plan.share_bytes * world);
        EXPECT_EQ(nodes_reduce_layout(plan, /*gather=*/false, min_chunk).scratch_bytes, l.gather);
      }
    }
  }
}

}  // namespace
}  // namespace interlace
