#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/device/signal_pad.h"
#include "interlace/ops/all_gather/plan.h"

namespace interlace {
namespace {

TEST(AllGatherPlan, CoversEveryByteWithAlignedChunks) {
  for (uint64_t bytes : {1ull, 15ull, 16ull, 17ull, 65536ull + 3, 1ull << 20, (256ull << 20) + 7, 1ull << 30}) {
    for (int resident : {132, 396, 2000}) {
      AllGatherPlan p = plan_all_gather(bytes, resident);
      EXPECT_GE(p.num_blocks, 1);
      EXPECT_LE(p.num_blocks, std::min(resident, kMaxBlocks));
      EXPECT_EQ(p.chunk_bytes % 16, 0u);
      EXPECT_GE(p.rounds * p.num_blocks * p.chunk_bytes, bytes);                  // everything is covered
      EXPECT_LT((p.rounds - 1) * p.num_blocks * p.chunk_bytes, bytes) << bytes;  // no empty round
    }
  }
}

TEST(AllGatherPlan, SmallMessagesUseFewCtasLargeOnesAll) {
  EXPECT_EQ(plan_all_gather(1024, 396).num_blocks, 1);
  EXPECT_EQ(plan_all_gather(256ull << 20, 396).num_blocks, 396);
  EXPECT_EQ(plan_all_gather(256ull << 20, 396).chunk_bytes, kMaxChunk);
}

TEST(AllGatherPlan, TuningIsCheckedAndUsed) {
  AllGatherPlan p = plan_all_gather(1 << 20, 396, {64, 4096});
  EXPECT_EQ(p.num_blocks, 64);
  EXPECT_EQ(p.chunk_bytes, 4096u);
  EXPECT_EQ(p.rounds, 4);
  EXPECT_THROW(plan_all_gather(1 << 20, 396, {397, 0}), Error);
  EXPECT_THROW(plan_all_gather(1 << 20, 396, {0, 100}), Error);
}

TensorView cuda_tensor(DLDataType dtype, std::vector<int64_t> shape, int device = 0) {
  static uintptr_t next = 0x10000;  // tensors apart from each other, as separate allocations are
  TensorView t;
  t.data = reinterpret_cast<void*>(next);
  next += uintptr_t{1} << 32;
  t.device = {kDLCUDA, device};
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

constexpr DLDataType kBf16{kDLBfloat, 16, 1};
constexpr DLDataType kF32{kDLFloat, 32, 1};

std::string error_of(const TensorView& out, const TensorView& inp, int world = 2, int device = 0) {
  try {
    check_all_gather_args(out, inp, world, device);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(AllGatherArgs, AcceptsConcatenatedAndStackedOutputs) {
  EXPECT_EQ(error_of(cuda_tensor(kBf16, {8, 3}), cuda_tensor(kBf16, {4, 3})), "");
  EXPECT_EQ(error_of(cuda_tensor(kBf16, {2, 4, 3}), cuda_tensor(kBf16, {4, 3})), "");
  EXPECT_EQ(error_of(cuda_tensor(kBf16, {2}), cuda_tensor(kBf16, {})), "");  // scalars stack
}

TEST(AllGatherArgs, EachBadArgumentIsNamed) {
  EXPECT_NE(error_of(cuda_tensor(kF32, {8}), cuda_tensor(kBf16, {4})).find("dtype"), std::string::npos);
  EXPECT_NE(error_of(cuda_tensor(kBf16, {7}), cuda_tensor(kBf16, {4})).find("shape"), std::string::npos);
  EXPECT_NE(error_of(cuda_tensor(kBf16, {8, 2}), cuda_tensor(kBf16, {4, 3})).find("shape"), std::string::npos);
  TensorView strided = cuda_tensor(kBf16, {4, 3});
  strided.strides = {1, 4};
  EXPECT_NE(error_of(cuda_tensor(kBf16, {8, 3}), strided).find("inp must be contiguous"), std::string::npos);
  TensorView cpu = cuda_tensor(kBf16, {4});
  cpu.device = {kDLCPU, 0};
  EXPECT_NE(error_of(cuda_tensor(kBf16, {8}), cpu).find("inp is on cpu"), std::string::npos);
  EXPECT_NE(error_of(cuda_tensor(kBf16, {8}, 1), cuda_tensor(kBf16, {4})).find("out is on cuda:1"), std::string::npos);
}

TEST(AllGatherArgs, OverlappingOutAndInpAreRefused) {
  static char buffer[1 << 12];
  TensorView out = cuda_tensor(kBf16, {8}), inp = cuda_tensor(kBf16, {4});
  out.data = buffer;
  inp.data = buffer + 8;  // inside out
  EXPECT_NE(error_of(out, inp).find("overlap"), std::string::npos);
  inp.data = buffer + 16;  // just past out's 16 bytes
  EXPECT_EQ(error_of(out, inp), "");
}

TEST(AllGatherPlan, RoundsThatOverflowTheCounterAreRefused) {
  // 2^31 rounds of one 16-byte chunk on one CTA.
  try {
    plan_all_gather(uint64_t{16} << 31, 1, AllGatherTuning{1, 16});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("32-bit round counter"), std::string::npos) << e.what();
  }
  EXPECT_EQ(plan_all_gather(uint64_t{1} << 40, 396).rounds, (uint64_t{1} << 40) / (65536 * 396) + 1);
}

}  // namespace
}  // namespace interlace
