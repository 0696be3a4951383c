#include <random>

#include "gtest/gtest.h"
#include "interlace/base/error.h"
#include "interlace/runtime/heap_allocator.h"

namespace interlace {
namespace {

TEST(HeapAllocator, AlignsAndReusesFreedSpace) {
  HeapAllocator a(1024, 1 << 20);
  size_t x = a.allocate(1, "x");
  size_t y = a.allocate(300, "y");
  EXPECT_EQ(x, 1024u);
  EXPECT_EQ(y, 1024u + 256);
  EXPECT_EQ(y % HeapAllocator::kAlignment, 0u);
  a.free(x);
  EXPECT_EQ(a.allocate(200, "z"), x);
}

TEST(HeapAllocator, ScratchFromTheTopLeavesTensorsContiguous) {
  HeapAllocator a(0, 1 << 20);
  size_t scratch = a.allocate(1 << 16, "scratch", /*from_top=*/true);
  EXPECT_EQ(scratch, (1u << 20) - (1u << 16));
  size_t t = a.allocate(1 << 10, "tensor");
  EXPECT_EQ(t, 0u);
  a.free(scratch);
  EXPECT_EQ(a.allocate((1 << 19), "bigger scratch", true), 1u << 19);
  EXPECT_EQ(a.largest_free_block(), (1u << 19) - (1u << 10));
}

TEST(HeapAllocator, TooSmallNamesWhatAndSizes) {
  HeapAllocator a(0, 4096);
  try {
    a.allocate(8192, "my tensor");
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("my tensor"), std::string::npos) << m;
    EXPECT_NE(m.find("8192"), std::string::npos) << m;
    EXPECT_NE(m.find("heap_bytes"), std::string::npos) << m;
  }
  EXPECT_THROW(a.free(12345), Error);
}

TEST(HeapAllocator, RandomAllocFreeCoalescesBackToOneBlock) {
  HeapAllocator a(256, 1 << 22);
  std::mt19937 rng(7);
  std::vector<size_t> live;
  for (int i = 0; i < 2000; ++i) {
    if (live.empty() || rng() % 3) {
      try {
        live.push_back(a.allocate(rng() % 20000, "t", rng() % 2));
      } catch (const Error&) {
      }
    } else {
      size_t k = rng() % live.size();
      a.free(live[k]);
      live.erase(live.begin() + k);
    }
  }
  for (size_t offset : live) a.free(offset);
  EXPECT_EQ(a.largest_free_block(), 1u << 22);
}

// A scratch rollback puts the old block back where it was, whatever lies around it: from the top it
// would land elsewhere once the space above it is free (the case a review found).
TEST(HeapAllocator, AllocateAtPutsAFreedBlockBackExactly) {
  HeapAllocator a(0, 100 * 256);
  const size_t low = a.allocate(60 * 256, "u1");
  const size_t high = a.allocate(40 * 256, "u2");
  a.free(low);
  const size_t old = a.allocate(10 * 256, "scratch", /*from_top=*/true);
  EXPECT_EQ(old, 50u * 256);
  a.free(high);
  a.free(old);  // the growth
  const size_t grown = a.allocate(30 * 256, "scratch", true);
  a.free(grown);  // the rollback
  EXPECT_NE(a.allocate(10 * 256, "from the top", true), old);  // what a rollback by allocate would get
  HeapAllocator b(0, 100 * 256);
  b.allocate_at(old, 10 * 256);
  EXPECT_EQ(b.allocate(50 * 256, "below"), 0u);
  EXPECT_EQ(b.allocate(40 * 256, "above", true), 60u * 256);
  EXPECT_THROW(b.allocate_at(old, 256), Error);  // taken
  b.free(old);
  b.allocate_at(old + 256, 256);  // inside a free block, splitting it in two
  EXPECT_EQ(b.largest_free_block(), 8u * 256);  // [50, 51) and [52, 60) left
}

}  // namespace
}  // namespace interlace
