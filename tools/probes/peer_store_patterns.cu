// How fast do SM stores into a peer GPU's memory go, in the patterns a GEMM epilogue can store a
// 128 x 128 tile in? (Why gemm_rs and gemm_ar stage partials in the accumulators' own order:
// docs/DESIGN.md, gemm_rs and gemm_ar.) Every CTA of 256 threads (a cooperative tile's two consumer
// warpgroups) stores tiles into the peer, one after another:
//   rowmajor_f32x2   fp32 column pairs where wgmma's accumulators sit, into a row-major tile (the
//                    partials' staging before): a warp's store covers 8 rows x 32 bytes
//   rowmajor_bf16x2  the same in bf16 (gemm_ar's landing tiles before): 8 rows x 16 bytes
//   fragment_f32x4   thread t's values i, i+1, i+2, i+3 at (i / 4 * 256 + t) x 16 bytes: 512 bytes
//                    in a row per warp store
//   fragment_bf16x8  eight bf16 values per thread and store, the same way
// Needs two GPUs with peer access; both push at once in "both", as gemm_rs's ranks do:
//   nvcc -O2 -arch=sm_90 -o /tmp/peer_store_patterns tools/probes/peer_store_patterns.cu && /tmp/peer_store_patterns
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); return 1; } } while (0)

enum Pattern { kRowF32, kRowBf16, kFragF32, kFragBf16 };
const char* names[] = {"rowmajor_f32x2", "rowmajor_bf16x2", "fragment_f32x4", "fragment_bf16x8"};
constexpr int kTile = 128, kThreads = 256;

// Thread t's accumulator pair p (0..31) of a 128 x 128 tile: warpgroup t / 128 holds rows 64 x
// (t / 128) on; warp w of it rows 16 w on; lane l rows l / 4 and l / 4 + 8, columns 8 j + 2 (l % 4).
__device__ __forceinline__ void pair_at(int t, int p, int& row, int& col) {
  const int wg = t / 128, w = (t / 32) % 4, l = t % 32, j = p / 2, half = p % 2;
  row = 64 * wg + 16 * w + l / 4 + 8 * half;
  col = 8 * j + 2 * (l % 4);
}

template <Pattern kP>
__global__ void __launch_bounds__(kThreads) push(char* peer, int tiles, float seed) {
  const int t = threadIdx.x;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    if constexpr (kP == kRowF32 || kP == kRowBf16) {
      for (int p = 0; p < 32; ++p) {
        int row, col;
        pair_at(t, p, row, col);
        if constexpr (kP == kRowF32) {
          float2* base = reinterpret_cast<float2*>(peer + size_t(tile) * kTile * kTile * 4);
          base[(row * kTile + col) / 2] = make_float2(seed + p, seed - p);
        } else {
          __nv_bfloat162* base = reinterpret_cast<__nv_bfloat162*>(peer + size_t(tile) * kTile * kTile * 2);
          base[(row * kTile + col) / 2] = __floats2bfloat162_rn(seed + p, seed - p);
        }
      }
    } else if constexpr (kP == kFragF32) {
      float4* base = reinterpret_cast<float4*>(peer + size_t(tile) * kTile * kTile * 4);
      for (int q = 0; q < 16; ++q) base[q * kThreads + t] = make_float4(seed + q, seed - q, seed, -seed);
    } else {
      uint4* base = reinterpret_cast<uint4*>(peer + size_t(tile) * kTile * kTile * 2);
      for (int q = 0; q < 8; ++q) base[q * kThreads + t] = make_uint4(q, t, tile, __float_as_uint(seed));
    }
  }
}

template <Pattern kP>
void launch(char* peer, int tiles, int ctas, cudaStream_t s) { push<kP><<<ctas, kThreads, 0, s>>>(peer, tiles, 1.f); }

void launch_any(Pattern p, char* peer, int tiles, int ctas, cudaStream_t s) {
  switch (p) {
    case kRowF32: launch<kRowF32>(peer, tiles, ctas, s); break;
    case kRowBf16: launch<kRowBf16>(peer, tiles, ctas, s); break;
    case kFragF32: launch<kFragF32>(peer, tiles, ctas, s); break;
    case kFragBf16: launch<kFragBf16>(peer, tiles, ctas, s); break;
  }
}

int main() {
  const size_t bytes = size_t{256} << 20;
  char* buf[2];
  cudaStream_t stream[2];
  cudaEvent_t start[2], stop[2];
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&buf[d], bytes));
    CK(cudaStreamCreateWithFlags(&stream[d], cudaStreamNonBlocking));
    CK(cudaEventCreate(&start[d]));
    CK(cudaEventCreate(&stop[d]));
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  printf("%-16s %-5s %5s %10s %10s\n", "pattern", "dir", "ctas", "GB/s dev0", "GB/s dev1");
  for (int p = 0; p < 4; ++p) {
    const int element = (p == kRowF32 || p == kFragF32) ? 4 : 2;
    const int tiles = static_cast<int>(bytes / (kTile * kTile * element));
    for (int both = 0; both < 2; ++both) {
      for (int ctas : {sms / 4, sms, 2 * sms}) {
        float ms[2] = {0, 0};
        const int reps = 10;
        for (int d = 0; d <= both; ++d) {  // warm-up
          CK(cudaSetDevice(d));
          launch_any(static_cast<Pattern>(p), buf[1 - d], tiles, ctas, stream[d]);
        }
        for (int d = 0; d <= both; ++d) { CK(cudaSetDevice(d)); CK(cudaStreamSynchronize(stream[d])); }
        for (int d = 0; d <= both; ++d) {
          CK(cudaSetDevice(d));
          CK(cudaEventRecord(start[d], stream[d]));
          for (int r = 0; r < reps; ++r) launch_any(static_cast<Pattern>(p), buf[1 - d], tiles, ctas, stream[d]);
          CK(cudaEventRecord(stop[d], stream[d]));
        }
        for (int d = 0; d <= both; ++d) {
          CK(cudaSetDevice(d));
          CK(cudaEventSynchronize(stop[d]));
          CK(cudaEventElapsedTime(&ms[d], start[d], stop[d]));
          CK(cudaGetLastError());
        }
        const double moved = double(tiles) * kTile * kTile * element * reps;
        printf("%-16s %-5s %5d %10.1f %10.1f\n", names[p], both ? "both" : "one", ctas, moved / ms[0] / 1e6,
               both ? moved / ms[1] / 1e6 : 0.0);
      }
    }
  }
  return 0;
}
