// The loopback backend on two GPUs of one process, as two emulated nodes: each GPU's heap is a
// cudaMalloc buffer the other reaches by peer access, and each has its LoopbackBackend and
// CudaLoopbackEngine, driven here from one thread as two proxies would drive them.
//
//   1. correctness: writes of varied sizes (a flag alone, odd sizes, unaligned offsets, MiBs) in
//      both directions at once, many in flight; then every byte of both heaps and every flag is
//      checked on the host;
//   2. throughput: one direction and both, unthrottled and throttled to 50 GB/s (a 400 Gb/s NIC),
//      printed as a table; a throttled row must come within [0.85, 1.03] x 50 GB/s wherever the
//      unthrottled copy is faster than that.
//
// Prints "ok" last when every check passed (tests/gpu/test_loopback_gpu.py looks for it); exits 1
// naming the first failure otherwise.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "interlace/transport/cuda_loopback_engine.h"
#include "interlace/transport/loopback_backend.h"

namespace {

using interlace::CudaLoopbackEngine;
using interlace::LoopbackBackend;
using interlace::LoopbackOptions;
using interlace::ProxyWrite;
using Clock = std::chrono::steady_clock;

constexpr int kNumFlags = 8;                             // at the start of each heap
constexpr uint64_t kData = 4096;                         // data after the flags
constexpr uint64_t kHalf = uint64_t{512} << 20;          // sources in the first half, landing in the second
constexpr uint64_t kHeapBytes = kData + 2 * kHalf;
constexpr double kNicRate = 50e9;                        // bytes/s: a 400 Gb/s NIC
constexpr double kTimeoutSeconds = 60;

[[noreturn]] void fail(const std::string& why) {
  std::printf("FAILED: %s\n", why.c_str());
  std::fflush(stdout);
  std::exit(1);
}

void cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(err));
}

// Waits for both GPUs. The engines' streams are non-blocking, so they do not wait for the harness's
// cudaMemset (asynchronous) or cudaMemcpy from pageable memory (which may return before its DMA has
// landed) on the legacy default stream: setup is synchronized before any write is posted.
void sync_both() {
  for (int d = 0; d < 2; ++d) {
    cuda(cudaSetDevice(d), "cudaSetDevice");
    cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  cuda(cudaSetDevice(0), "cudaSetDevice");
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The byte at `offset` of rank r's sources.
char pattern(int rank, uint64_t offset) {
  return static_cast<char>(((offset * 2654435761u) >> 13) ^ (offset >> 20) ^ (rank * 0x5b + 1));
}

struct Direction {
  int from, to;
  LoopbackBackend* backend;
  std::vector<ProxyWrite> writes;
  size_t posted = 0;
};

// Posts and progresses every direction until all writes have landed (or a backend fails).
void drive(std::vector<Direction*> dirs) {
  const auto start = Clock::now();
  while (true) {
    bool busy = false;
    for (Direction* d : dirs) {
      while (d->posted < d->writes.size() && d->backend->post(d->writes[d->posted])) ++d->posted;
      d->backend->progress();
      const std::string why = d->backend->failure();
      if (!why.empty()) fail(why);
      busy |= d->posted < d->writes.size() || d->backend->in_flight() > 0;
    }
    if (!busy) return;
    if (seconds_since(start) > kTimeoutSeconds) fail("the writes did not all land within a minute");
  }
}

// n writes from rank `from`, sizes cycling through `sizes`, packed from kData (so mostly
// unaligned), landing at the same place in the second half of the peer's heap; flags cycle.
std::vector<ProxyWrite> plan(int to, size_t n, const std::vector<uint64_t>& sizes) {
  std::vector<ProxyWrite> writes;
  uint64_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t bytes = sizes[i % sizes.size()];
    if (offset + bytes > kHalf) fail("the correctness plan does not fit half a heap");
    writes.push_back(ProxyWrite{to, kData + offset, kData + kHalf + offset, bytes, 8 * (i % kNumFlags), 1 + i % 3});
    offset += bytes;
  }
  return writes;
}

void check_correctness(std::vector<char*> heaps, LoopbackOptions options) {
  const std::vector<uint64_t> sizes = {0, 1, 7, 64, 1000, 4096, 65537, 1 << 20, (3 << 20) + 5};
  constexpr size_t kWrites = 600;
  CudaLoopbackEngine engine0(0), engine1(1);
  LoopbackBackend backend0(0, heaps, kHeapBytes, engine0, options), backend1(1, heaps, kHeapBytes, engine1, options);
  Direction d01{0, 1, &backend0, plan(1, kWrites, sizes)}, d10{1, 0, &backend1, plan(0, kWrites, sizes)};
  const uint64_t extent = d01.writes.back().src_offset + d01.writes.back().bytes - kData;
  for (Direction* d : {&d01, &d10}) {
    std::vector<char> source(extent);
    for (uint64_t o = 0; o < extent; ++o) source[o] = pattern(d->from, o);
    cuda(cudaMemcpy(heaps[d->from] + kData, source.data(), extent, cudaMemcpyHostToDevice), "filling the sources");
  }
  sync_both();
  drive({&d01, &d10});
  for (Direction* d : {&d01, &d10}) {
    // Every byte of the landing half: the sender's pattern where written, still zero past it.
    std::vector<char> landed(kHalf);
    cuda(cudaMemcpy(landed.data(), heaps[d->to] + kData + kHalf, kHalf, cudaMemcpyDeviceToHost), "reading back");
    for (uint64_t o = 0; o < kHalf; ++o) {
      const char want = o < extent ? pattern(d->from, o) : 0;
      if (landed[o] != want) {
        fail("rank " + std::to_string(d->to) + "'s heap at landing offset " + std::to_string(o) + " holds " +
             std::to_string(landed[o]) + ", not " + std::to_string(want));
      }
    }
    uint64_t flags[kNumFlags], want[kNumFlags] = {};
    for (const ProxyWrite& w : d->writes) want[w.flag_offset / 8] += w.add;
    cuda(cudaMemcpy(flags, heaps[d->to], sizeof flags, cudaMemcpyDeviceToHost), "reading the flags");
    for (int f = 0; f < kNumFlags; ++f) {
      if (flags[f] != want[f]) {
        fail("rank " + std::to_string(d->to) + "'s flag " + std::to_string(f) + " reads " + std::to_string(flags[f]) +
             ", not " + std::to_string(want[f]));
      }
    }
  }
  if (engine0.events_made() > options.max_in_flight || engine1.events_made() > options.max_in_flight) {
    fail("the event pool grew past max_in_flight");
  }
  std::printf("correctness: %zu writes each way (%.1f MiB), sizes 0 B .. 3 MiB, bytes and %d flags exact; "
              "events made %zu and %zu (max_in_flight %u)\n",
              kWrites, extent / 1048576.0, kNumFlags, engine0.events_made(), engine1.events_made(), options.max_in_flight);
}

// GB/s of each direction when `directions` (1: 0 -> 1; 2: both ways) carry `total` bytes each in
// writes of `write_bytes`, every write adding 1 to flag 0 of the receiver (checked).
std::vector<double> throughput(std::vector<char*> heaps, double rate, uint64_t write_bytes, uint64_t total,
                               int directions) {
  CudaLoopbackEngine engine0(0), engine1(1);
  LoopbackOptions options;
  options.rate_bytes_per_s = rate;
  LoopbackBackend backend0(0, heaps, kHeapBytes, engine0, options), backend1(1, heaps, kHeapBytes, engine1, options);
  std::vector<Direction> dirs = {{0, 1, &backend0, {}}, {1, 0, &backend1, {}}};
  dirs.resize(directions);
  const uint64_t n = total / write_bytes, window = kHalf / write_bytes;
  for (Direction& d : dirs) {
    cuda(cudaMemset(heaps[d.to], 0, 8), "clearing a flag");
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t offset = (i % window) * write_bytes;
      d.writes.push_back(ProxyWrite{d.to, kData + offset, kData + kHalf + offset, write_bytes, 0, 1});
    }
  }
  sync_both();
  std::vector<Direction*> driven;
  for (Direction& d : dirs) driven.push_back(&d);
  const auto start = Clock::now();
  drive(driven);
  const double seconds = seconds_since(start);
  std::vector<double> gbs;
  for (Direction& d : dirs) {
    uint64_t flag = 0;
    cuda(cudaMemcpy(&flag, heaps[d.to], 8, cudaMemcpyDeviceToHost), "reading a flag");
    if (flag != n) fail("flag counted " + std::to_string(flag) + " of " + std::to_string(n) + " writes");
    gbs.push_back(static_cast<double>(n * write_bytes) / seconds / 1e9);
  }
  return gbs;
}

}  // namespace

int main() {
  int count = 0;
  cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count < 2) fail("needs 2 GPUs, found " + std::to_string(count));
  std::vector<char*> heaps(2);
  for (int d = 0; d < 2; ++d) {
    int can = 0;
    cuda(cudaDeviceCanAccessPeer(&can, d, 1 - d), "cudaDeviceCanAccessPeer");
    if (!can) fail("GPU " + std::to_string(d) + " cannot access GPU " + std::to_string(1 - d) + "'s memory");
    cuda(cudaSetDevice(d), "cudaSetDevice");
    cuda(cudaDeviceEnablePeerAccess(1 - d, 0), "cudaDeviceEnablePeerAccess");
    void* heap = nullptr;
    cuda(cudaMalloc(&heap, kHeapBytes), "cudaMalloc");
    heaps[d] = static_cast<char*>(heap);
    cuda(cudaMemset(heaps[d], 0, kHeapBytes), "cudaMemset");
  }
  sync_both();
  cudaDeviceProp prop;
  cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("2 x %s, one process, peer access both ways\n", prop.name);

  LoopbackOptions options;
  options.max_in_flight = 64;
  check_correctness(heaps, options);

  std::printf("\n%-10s %-12s %-12s %12s %12s\n", "direction", "write", "limit", "GB/s 0->1", "GB/s 1->0");
  bool rates_ok = true;
  for (int directions : {1, 2}) {
    for (uint64_t write_bytes : {uint64_t{256} << 10, uint64_t{1} << 20, uint64_t{16} << 20}) {
      std::vector<double> unthrottled;
      for (double rate : {0.0, kNicRate}) {
        const uint64_t total = rate == 0 ? uint64_t{16} << 30 : uint64_t{4} << 30;
        const std::vector<double> gbs = throughput(heaps, rate, write_bytes, total, directions);
        if (rate == 0) unthrottled = gbs;
        std::printf("%-10s %-12s %-12s %12.1f %12s\n", directions == 1 ? "one way" : "both ways",
                    (std::to_string(write_bytes >> 10) + " KiB").c_str(), rate == 0 ? "none" : "50 GB/s", gbs[0],
                    directions == 2 ? std::to_string(gbs[1]).substr(0, 6).c_str() : "-");
        for (size_t i = 0; rate > 0 && i < gbs.size(); ++i) {
          const bool can_reach = unthrottled[i] > 1.2 * kNicRate / 1e9;
          if (can_reach && (gbs[i] < 0.85 * kNicRate / 1e9 || gbs[i] > 1.03 * kNicRate / 1e9)) {
            std::printf("  ^ throttled rate %.1f GB/s is outside [42.5, 51.5]\n", gbs[i]);
            rates_ok = false;
          }
        }
      }
    }
  }
  for (char* h : heaps) cuda(cudaFree(h), "cudaFree");
  if (!rates_ok) fail("a throttled rate missed 50 GB/s");
  std::printf("ok\n");
  return 0;
}
