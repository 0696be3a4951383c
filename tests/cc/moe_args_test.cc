// moe_dispatch / moe_combine / moe_gemm_combine's host checks (ops/moe/args.h): every bad argument
// is refused before any GPU work, with a message naming the argument. Tensors are views over host
// buffers tagged as CUDA: the checks never touch the data.
#include "interlace/ops/moe/args.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/ops/moe/flags.h"
#include "tests/cc/error_of.h"

namespace interlace {
namespace {

constexpr int kDevice = 0;
alignas(256) char g_memory[1 << 16];  // what the views point into; 256-byte aligned

TensorView tensor(std::vector<int64_t> shape, DLDataType dtype, size_t at = 0, int device = kDevice) {
  TensorView v;
  v.data = g_memory + at;
  v.device = DLDevice{kDLCUDA, device};
  v.dtype = dtype;
  v.shape = std::move(shape);
  return v;
}

const DLDataType kBf16{kDLBfloat, 16, 1}, kF32{kDLFloat, 32, 1}, kI32{kDLInt, 32, 1}, kI64{kDLInt, 64, 1};

struct Call {
  TensorView x = tensor({16, 64}, kBf16);
  TensorView idx = tensor({16, 2}, kI32, 4096);
  TensorView w = tensor({16, 2}, kF32, 8192);
  MoeDispatchOptions options{8, 32, MoeCapacityKind::kPerExpert, -1};
  int world = 2;

  std::string error() const {
    return error_of([&] { check_moe_dispatch_args(x, idx, w, options, world, kDevice); });
  }
};

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The fused ops' and the combine's tests share one layout: 2 ranks, 8 experts (L = 4), top-2, H = 64,
// 16 tokens, capacity 10 per expert (recv_rows = 4 x 10).
MoeShape two_ranks_of_four_experts() {
  MoeShape shape;
  shape.world = 2;
  shape.experts = 8;
  shape.topk = 2;
  shape.row_bytes = 128;
  shape.tokens = 16;
  shape.capacity = 10;
  return shape;
}

TEST(MoeDispatchArgs, AcceptsAGoodCallAndReturnsItsShape) {
  Call c;
  const MoeShape s = check_moe_dispatch_args(c.x, c.idx, c.w, c.options, c.world, kDevice);
  EXPECT_EQ(s.world, 2);
  EXPECT_EQ(s.experts, 8);
  EXPECT_EQ(s.topk, 2);
  EXPECT_EQ(s.row_bytes, 128);
  EXPECT_EQ(s.tokens, 16);  // max_tokens -1: this rank's
  EXPECT_EQ(s.capacity, 32);
  c.idx.dtype = kI64;
  c.options.max_tokens = 100;
  c.options.capacity_kind = MoeCapacityKind::kPerRank;
  const MoeShape wide = check_moe_dispatch_args(c.x, c.idx, c.w, c.options, c.world, kDevice);
  EXPECT_EQ(wide.tokens, 100);
  EXPECT_EQ(wide.capacity_kind, MoeCapacityKind::kPerRank);
}

TEST(MoeDispatchArgs, ZeroTokensIsACall) {
  Call c;
  c.x.shape = {0, 64};
  c.idx.shape = c.w.shape = {0, 2};
  c.options.max_tokens = 16;
  EXPECT_EQ(c.error(), "");
}

TEST(MoeDispatchArgs, RefusesEachBadArgument) {
  struct Case {
    const char* what;
    void (*spoil)(Call&);
    const char* needle;
  };
  const Case cases[] = {
      {"x fp32", [](Call& c) { c.x.dtype = kF32; }, "x has dtype float32"},
      {"x 1-D", [](Call& c) { c.x.shape = {1024}; }, "x must be 2-D"},
      {"x strided", [](Call& c) { c.x.strides = {1, 16}; }, "x must be contiguous"},
      {"x on cpu", [](Call& c) { c.x.device = DLDevice{kDLCPU, 0}; }, "x is on cpu"},
      {"x on another GPU", [](Call& c) { c.x.device = DLDevice{kDLCUDA, 1}; }, "cuda:1"},
      {"x misaligned", [](Call& c) { c.x.data = g_memory + 2; }, "16-byte aligned"},
      {"hidden not x8", [](Call& c) { c.x.shape = {16, 60}; }, "multiple of 8 elements"},
      {"idx rows", [](Call& c) { c.idx.shape = {15, 2}; }, "topk_idx has shape"},
      {"idx float", [](Call& c) { c.idx.dtype = kF32; }, "int32 or int64"},
      {"idx int16", [](Call& c) { c.idx.dtype = DLDataType{kDLInt, 16, 1}; }, "int32 or int64"},
      {"idx misaligned", [](Call& c) { c.idx.data = g_memory + 4096 + 2; }, "topk_idx must start"},
      {"weights shape", [](Call& c) { c.w.shape = {16, 3}; }, "topk_weights has shape"},
      {"weights bf16", [](Call& c) { c.w.dtype = kBf16; }, "float32"},
      {"weights on cpu", [](Call& c) { c.w.device = DLDevice{kDLCPU, 0}; }, "topk_weights is on cpu"},
      {"too many tokens", [](Call& c) { c.options.max_tokens = 8; }, "more than max_tokens"},
      {"E % W", [](Call& c) { c.options.experts = 7; }, "multiple of the world size"},
      {"k > E", [](Call& c) { c.options.experts = 1; c.world = 1; }, "k must be <= experts"},
      {"k too big", [](Call& c) { c.idx.shape = c.w.shape = {16, 300}; c.options.experts = 512; }, "top-k must be"},
      {"capacity 0", [](Call& c) { c.options.capacity = 0; }, "capacity"},
      {"flags", [](Call& c) { c.options.experts = 2 * kMoeMaxFlags; }, "flags"},
  };
  for (const Case& k : cases) {
    Call c;
    k.spoil(c);
    const std::string e = c.error();
    EXPECT_TRUE(has(e, "moe")) << k.what << ": " << e;
    EXPECT_TRUE(has(e, k.needle)) << k.what << ": expected '" << k.needle << "' in: " << e;
  }
}

TEST(MoeCombineArgs, AcceptsTheDispatchLayoutAndRefusesOthers) {
  const MoeShape shape = two_ranks_of_four_experts();
  const MoePlan plan = make_moe_plan(shape);
  const TensorView expert_out = tensor({40, 64}, kBf16);
  const TensorView out = tensor({12, 64}, kBf16, 40 * 128);
  auto error = [&](TensorView eo, TensorView o, int64_t tokens = 12) {
    return error_of([&] { check_moe_combine_args(eo, o, plan, tokens, kDevice); });
  };
  EXPECT_EQ(error(expert_out, out), "");
  TensorView bad = expert_out;
  bad.shape = {39, 64};
  EXPECT_TRUE(has(error(bad, out), "expert_out has shape [39, 64]; it must be [40, 64]"));
  bad = out;
  bad.shape = {16, 64};
  EXPECT_TRUE(has(error(expert_out, bad), "the dispatch's tokens on this rank"));
  bad = expert_out;
  bad.dtype = kF32;
  EXPECT_TRUE(has(error(bad, out), "expert_out has dtype float32"));
  bad = out;
  bad.data = g_memory + 8;
  EXPECT_TRUE(has(error(expert_out, bad), "out must start 16-byte aligned"));
  bad = out;
  bad.data = g_memory + 128;
  EXPECT_TRUE(has(error(expert_out, bad), "overlap"));
  bad = out;
  bad.device = DLDevice{kDLCUDA, 3};
  EXPECT_TRUE(has(error(expert_out, bad), "cuda:3"));
  EXPECT_EQ(error(expert_out, tensor({0, 64}, kBf16, 40 * 128), 0), "");
}

// moe_gemm_combine: act in the receive layout viewed as [L, C, F], w [L, F, H] in either layout,
// out [T, H]; then grouped_gemm's own stride and alignment checks on act and w.
TEST(MoeGemmCombineArgs, ReturnsTheGroupedProblemAndRefusesEachBadArgument) {
  const MoeShape shape = two_ranks_of_four_experts();
  const MoePlan plan = make_moe_plan(shape);
  const TensorView act = tensor({40, 32}, kBf16);                  // F = 32: bytes [0, 2560)
  const TensorView w = tensor({4, 32, 64}, kBf16, 4096);           // [L, F, H], H contiguous
  const TensorView out = tensor({12, 64}, kBf16, 24576);
  const TensorView rows = tensor({4}, kI32, 32768);
  auto error = [&](TensorView a, TensorView b, TensorView o) {
    return error_of([&] { check_moe_gemm_combine_args(a, b, o, rows, plan, 12, kDevice); });
  };
  const GroupedGemmProblem p = check_moe_gemm_combine_args(act, w, out, rows, plan, 12, kDevice);
  EXPECT_EQ(p.groups, 4);
  EXPECT_EQ(p.capacity, 10);
  EXPECT_EQ(p.k, 32);
  EXPECT_EQ(p.n, 64);
  EXPECT_EQ(p.lda, 32);
  EXPECT_EQ(p.group_a, 10 * 32);  // expert l's rows start at l x C
  EXPECT_FALSE(p.b_k_major);
  TensorView wt = tensor({4, 32, 64}, kBf16, 4096);  // Linear weights [L, H, F] transposed: F contiguous
  wt.strides = {64 * 32, 1, 32};
  EXPECT_TRUE(check_moe_gemm_combine_args(act, wt, out, rows, plan, 12, kDevice).b_k_major);

  TensorView bad = act;
  bad.shape = {39, 32};
  EXPECT_TRUE(has(error(bad, w, out), "act has shape [39, 32]; it must be [40, F]"));
  bad = tensor({40, 0}, kBf16);
  EXPECT_TRUE(has(error(bad, tensor({4, 0, 64}, kBf16, 4096), out), "F = 0"));
  bad = act;
  bad.dtype = kF32;
  EXPECT_TRUE(has(error(bad, w, out), "act has dtype float32"));
  bad = w;
  bad.shape = {4, 64, 32};
  EXPECT_TRUE(has(error(act, bad, out), "w has shape [4, 64, 32]; it must be [4, 32, 64]"));
  bad = out;
  bad.shape = {16, 64};
  EXPECT_TRUE(has(error(act, w, bad), "the dispatch's tokens on this rank"));
  bad = out;
  bad.data = g_memory + 4096;  // on w
  EXPECT_TRUE(has(error(act, w, bad), "out overlaps act or w"));
  bad = act;
  bad.shape = {40, 36};  // F = 36: rows of 72 bytes, not 16-byte aligned for TMA
  EXPECT_TRUE(has(error(bad, tensor({4, 36, 64}, kBf16, 4096), out),
                  "moe_gemm_combine: a's rows must be 16-byte aligned"));
  bad = w;
  bad.data = g_memory + 4096 + 8;
  EXPECT_TRUE(has(error(act, bad, out), "moe_gemm_combine: b must start 16-byte aligned"));
  bad = act;
  bad.device = DLDevice{kDLCUDA, 3};
  EXPECT_TRUE(has(error(bad, w, out), "cuda:3"));

  MoeShape per_rank = shape;
  per_rank.capacity_kind = MoeCapacityKind::kPerRank;
  const MoePlan packed = make_moe_plan(per_rank);
  EXPECT_TRUE(has(error_of([&] { check_moe_gemm_combine_args(act, w, out, rows, packed, 12, kDevice); }),
                  "capacity_kind is per_rank; the fused GEMM needs per_expert"));
}

// moe_dispatch_gemm: expert_x viewed as [L, C, H] times w [L, H, N] in either layout into out
// [recv_rows, N] viewed as [L, C, N]; then grouped_gemm's own stride, alignment and overlap checks.
TEST(MoeDispatchGemmArgs, ReturnsTheGroupedProblemAndRefusesEachBadArgument) {
  const MoeShape shape = two_ranks_of_four_experts();
  const MoePlan plan = make_moe_plan(shape);
  const TensorView expert_x = tensor({40, 64}, kBf16);         // bytes [0, 5120)
  const TensorView w = tensor({4, 64, 32}, kBf16, 8192);       // [L, H, N], N contiguous
  const TensorView out = tensor({40, 32}, kBf16, 24576);
  const TensorView rows = tensor({4}, kI32, 32768);
  auto error = [&](TensorView b, TensorView o) {
    return error_of([&] { check_moe_dispatch_gemm_args(b, o, expert_x, rows, plan, kDevice); });
  };
  const GroupedGemmProblem p = check_moe_dispatch_gemm_args(w, out, expert_x, rows, plan, kDevice);
  EXPECT_EQ(p.groups, 4);
  EXPECT_EQ(p.capacity, 10);
  EXPECT_EQ(p.k, 64);
  EXPECT_EQ(p.n, 32);
  EXPECT_EQ(p.group_a, 10 * 64);  // expert l's rows start at l x C
  EXPECT_EQ(p.group_out, 10 * 32);
  EXPECT_FALSE(p.b_k_major);
  TensorView wt = w;  // Linear weights [L, N, H] transposed: H contiguous
  wt.strides = {32 * 64, 1, 64};
  EXPECT_TRUE(check_moe_dispatch_gemm_args(wt, out, expert_x, rows, plan, kDevice).b_k_major);

  TensorView bad = w;
  bad.shape = {4, 32, 64};
  EXPECT_TRUE(has(error(bad, out), "w has shape [4, 32, 64]; it must be [4, 64, N]"));
  bad = w;
  bad.dtype = kF32;
  EXPECT_TRUE(has(error(bad, out), "w has dtype float32"));
  bad = out;
  bad.shape = {40, 16};
  EXPECT_TRUE(has(error(w, bad), "out has shape [40, 16]; it must be [40, 32]"));
  bad = out;
  bad.data = g_memory + 8192;  // on w
  EXPECT_TRUE(has(error(w, bad), "moe_dispatch_gemm: out overlaps b"));
  bad = tensor({4, 64, 36}, kBf16, 8192);  // N = 36: rows of 72 bytes
  EXPECT_TRUE(has(error(bad, tensor({40, 36}, kBf16, 24576)), "16-byte aligned"));
  bad = out;
  bad.device = DLDevice{kDLCUDA, 3};
  EXPECT_TRUE(has(error(w, bad), "cuda:3"));

  MoeShape per_rank = shape;
  per_rank.capacity_kind = MoeCapacityKind::kPerRank;
  const MoePlan packed = make_moe_plan(per_rank);
  EXPECT_TRUE(has(error_of([&] { check_moe_dispatch_gemm_args(w, out, expert_x, rows, packed, kDevice); }),
                  "capacity_kind is per_rank; the fused GEMM needs per_expert"));
  MoeShape wide = shape;
  wide.experts = 64;
  wide.topk = 33;
  const MoePlan wide_plan = make_moe_plan(wide);
  EXPECT_TRUE(has(error_of([&] { check_moe_dispatch_gemm_args(w, out, expert_x, rows, wide_plan, kDevice); }),
                  "top-33 is more than the 32"));
}

// The copiers' default: 16 at N = 4096, in proportion to 1 / N below that, at least 4, in whole
// clusters, at most half the grid.
TEST(MoeDispatchGemmArgs, DefaultCopiersShrinkWithTheMatmulsWidth) {
  constexpr int kH200 = 132;
  EXPECT_EQ(default_moe_copy_ctas(4096, 2, kH200), 16);
  EXPECT_EQ(default_moe_copy_ctas(1024, 2, kH200), 16);  // never more than at 4096
  EXPECT_EQ(default_moe_copy_ctas(8192, 1, kH200), 8);
  EXPECT_EQ(default_moe_copy_ctas(6000, 1, kH200), 11);
  EXPECT_EQ(default_moe_copy_ctas(6000, 2, kH200), 12);  // whole clusters
  EXPECT_EQ(default_moe_copy_ctas(28672, 2, kH200), 4);  // Mixtral-like: the fewest
  EXPECT_EQ(default_moe_copy_ctas(1 << 20, 1, kH200), 4);
  EXPECT_EQ(default_moe_copy_ctas(0, 2, kH200), 16);
  EXPECT_EQ(default_moe_copy_ctas(4096, 2, 20), 10);  // a small GPU: half its grid
  EXPECT_EQ(default_moe_copy_ctas(4096, 2, 7), 2);    // whole clusters, one at least
  EXPECT_EQ(default_moe_copy_ctas(4096, 1, 2), 1);
}

TEST(MoeFlagsLayout, PlanFlagsFollowTheGridBarrierWithinTheRegion) {
  EXPECT_EQ(sizeof(MoeFlags), kOpRegionBytes);
  EXPECT_EQ(offsetof(MoeFlags, plan), 2 * sizeof(uint64_t));  // release, then the count (and a spare word)
  // The largest plan the flags allow fits: W + 3E <= kMoeMaxFlags.
  MoeShape s;
  s.world = 2;
  s.experts = (kMoeMaxFlags - 2) / 3 / 2 * 2;
  s.topk = 1;
  s.row_bytes = 16;
  s.tokens = 1;
  s.capacity = 1;
  EXPECT_LE(make_moe_plan(s).flags, kMoeMaxFlags);
}

}  // namespace
}  // namespace interlace
