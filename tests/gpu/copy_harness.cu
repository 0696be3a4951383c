// Checks device::block_copy byte for byte; built and run by test_copy.py (nvcc -I cc).
//   copy_harness          every (dst % 16, src % 16, size) case; exits 1 naming the first wrong one
//   copy_harness bench    GB/s of large copies (within a GPU, and to a second one) at a few alignments
// Sources lie at either edge of a mapped region with unmapped address space around it, so a read
// past the aligned 16-byte words that hold source bytes faults instead of passing unseen.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "interlace/device/copy.cuh"

namespace {

// all_gather's CTA shape and register budget, so that what is checked here is what it runs.
constexpr int kThreads = 512;
constexpr uint64_t kSlack = 64;  // guard bytes around every destination
constexpr unsigned char kGuard = 0xA5;
// CTA sizes checked: all_gather's, one warp, and one with a partial warp (which takes the byte path).
constexpr int kShapes[] = {kThreads, 32, 100};

struct Case {
  char* dst;
  const char* src;
  uint64_t bytes;
};

__global__ void __launch_bounds__(kThreads, 3) copy_cases(const Case* cases) {
  const Case c = cases[blockIdx.x];
  interlace::device::block_copy(c.dst, c.src, c.bytes);
}

// Each CTA copies one contiguous part of [src, src + bytes).
__global__ void __launch_bounds__(kThreads, 3) copy_split(char* dst, const char* src, uint64_t bytes) {
  const uint64_t part = (bytes / gridDim.x + 15) / 16 * 16;
  const uint64_t lo = min(bytes, blockIdx.x * part);
  interlace::device::block_copy(dst + lo, src + lo, min(bytes, lo + part) - lo);
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::printf("FAIL %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

void check(CUresult err, const char* what) {
  if (err != CUDA_SUCCESS) {
    std::printf("FAIL %s: CUresult %d\n", what, static_cast<int>(err));
    std::exit(1);
  }
}

template <typename F>
F driver(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  check(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found), name);
  if (found != cudaDriverEntryPointSuccess) check(cudaErrorSymbolNotFound, name);
  return reinterpret_cast<F>(fn);
}

// `size` bytes of device memory with at least one unmapped granule on either side.
char* map_fenced(uint64_t size) {
  int device;
  check(cudaGetDevice(&device), "cudaGetDevice");
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t granule;
  check(driver<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity")(
            &granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity");
  size = (size + granule - 1) / granule * granule;
  CUdeviceptr va;
  check(driver<decltype(&cuMemAddressReserve)>("cuMemAddressReserve")(&va, size + 2 * granule, 0, 0, 0), "reserve");
  CUmemGenericAllocationHandle handle;
  check(driver<decltype(&cuMemCreate)>("cuMemCreate")(&handle, size, &prop, 0), "cuMemCreate");
  check(driver<decltype(&cuMemMap)>("cuMemMap")(va + granule, size, 0, handle, 0), "cuMemMap");
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(driver<decltype(&cuMemSetAccess)>("cuMemSetAccess")(va + granule, size, &access, 1), "cuMemSetAccess");
  return reinterpret_cast<char*>(va + granule);
}

unsigned char pattern(uint64_t i) { return static_cast<unsigned char>((i * 2654435761u) >> 13); }

int check_all() {
  std::vector<uint64_t> sizes;
  for (uint64_t b = 0; b <= 70; ++b) sizes.push_back(b);
  sizes.insert(sizes.end(), {4095, 4096 + 13, (1 << 20) + 5});
  const uint64_t region = (2 << 20);
  char* src = map_fenced(region);
  std::vector<unsigned char> host(region);
  for (uint64_t i = 0; i < region; ++i) host[i] = pattern(i);
  check(cudaMemcpy(src, host.data(), region, cudaMemcpyHostToDevice), "fill source");

  Case* cases;
  check(cudaMalloc(&cases, 256 * sizeof(Case)), "cudaMalloc");
  int checked = 0;
  for (uint64_t bytes : sizes) {
    const uint64_t slot = (bytes + 2 * kSlack + 255) / 256 * 256;
    char* pool;
    check(cudaMalloc(&pool, 256 * slot), "cudaMalloc");
    for (int run = 0; run < 6; ++run) {
      const int threads = kShapes[run / 2], at_end = run % 2;
      std::vector<Case> batch;
      std::vector<uint64_t> src_at;  // the source's offset in the region
      for (uint64_t d = 0; d < 16; ++d) {
        for (uint64_t s = 0; s < 16; ++s) {
          // At the end, the last aligned word holding source bytes ends the mapping.
          const uint64_t at = at_end ? region - (s + bytes + 15) / 16 * 16 + s : s;
          batch.push_back({pool + batch.size() * slot + kSlack + d, src + at, bytes});
          src_at.push_back(at);
        }
      }
      check(cudaMemset(pool, kGuard, 256 * slot), "cudaMemset");
      check(cudaMemcpy(cases, batch.data(), batch.size() * sizeof(Case), cudaMemcpyHostToDevice), "cases");
      copy_cases<<<batch.size(), threads>>>(cases);
      char what[128];
      std::snprintf(what, sizeof what, "copy of %llu bytes by %d threads (source at the %s of the mapping)",
                    static_cast<unsigned long long>(bytes), threads, at_end ? "end" : "start");
      check(cudaDeviceSynchronize(), what);
      std::vector<unsigned char> out(256 * slot);
      check(cudaMemcpy(out.data(), pool, out.size(), cudaMemcpyDeviceToHost), "read back");
      for (size_t c = 0; c < batch.size(); ++c) {
        const uint64_t d = c / 16, s = c % 16, first = kSlack + d;
        for (uint64_t i = 0; i < slot; ++i) {
          const unsigned char want = i >= first && i < first + bytes ? host[src_at[c] + i - first] : kGuard;
          if (out[c * slot + i] != want) {
            std::printf("FAIL bytes %llu dst%%16 %llu src%%16 %llu threads %d at_end %d: byte %lld of dst is 0x%02x, "
                        "want 0x%02x\n", static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(d),
                        static_cast<unsigned long long>(s), threads, at_end, static_cast<long long>(i - first),
                        out[c * slot + i], want);
            return 1;
          }
        }
        ++checked;
      }
    }
    check(cudaFree(pool), "cudaFree");
  }
  std::printf("ok: %d cases byte-exact, guards intact, no read outside the source's aligned words\n", checked);
  return 0;
}

// Copies 1 GiB within GPU 0, then, where there is a second GPU, from GPU 0 into GPU 1's memory with
// stores over NVLink (all_gather's push), at several relative alignments.
int bench() {
  const uint64_t bytes = 1ull << 30;
  int sms, gpus;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
  check(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
  char *src, *dst;
  check(cudaMalloc(&src, bytes + 64), "cudaMalloc");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  for (int target = 0; target < std::min(gpus, 2); ++target) {
    check(cudaSetDevice(target), "cudaSetDevice");
    check(cudaMalloc(&dst, bytes + 64), "cudaMalloc");
    check(cudaSetDevice(0), "cudaSetDevice");
    if (target != 0) check(cudaDeviceEnablePeerAccess(target, 0), "cudaDeviceEnablePeerAccess");
    for (int d : {0, 1, 3, 4, 8, 9}) {
      for (int i = 0; i < 3; ++i) copy_split<<<2 * sms, kThreads>>>(dst + d, src, bytes);
      check(cudaEventRecord(start), "record");
      constexpr int kIters = 10;
      for (int i = 0; i < kIters; ++i) copy_split<<<2 * sms, kThreads>>>(dst + d, src, bytes);
      check(cudaEventRecord(stop), "record");
      check(cudaEventSynchronize(stop), "copy");
      float ms;
      check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
      std::printf("GPU 0 -> GPU %d, dst - src = %d mod 16: %.0f GB/s copied\n", target, d,
                  1.0 * bytes * kIters / (ms * 1e-3) / 1e9);
    }
    check(cudaFree(dst), "cudaFree");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "no usable GPU");
  if (prop.major != 9) {
    std::printf("FAIL built for sm_90a, the GPU is sm_%d%d\n", prop.major, prop.minor);
    return 1;
  }
  return argc > 1 && std::strcmp(argv[1], "bench") == 0 ? bench() : check_all();
}
