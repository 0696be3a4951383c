// Which copies make progress while a kernel holds every warp slot of the GPU, as ag_gemm's GEMM
// does? (Why ag_gemm stages its own shard with the kernel and leaves only the peers' shards to
// the copy engines: docs/DESIGN.md, ag_gemm.) Needs two GPUs with peer access:
//   nvcc -O2 -arch=sm_90 -o /tmp/copy_engines tools/probes/copy_engines.cu && /tmp/copy_engines
// On 2 x H200 (driver 580, CUDA 13.0), 2026-11-30: "hold" STUCK for both local copies
// (cudaMemcpyAsync and cuMemcpyBatchAsync with PREFER_OVERLAP_WITH_COMPUTE), ok for every copy
// between the GPUs (pull or push, either API); "light" (one block) ok for all.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); return 1; } } while (0)
static decltype(&cuStreamWriteValue32) write32;
static decltype(&cuMemcpyBatchAsync) batch;

__global__ void __launch_bounds__(1024, 2) hold(volatile unsigned* flag, int* result, long long limit_ns) {
  long long start; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  if (threadIdx.x == 0) {
    for (;;) {
      long long now; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      if (*flag >= 1) { if (blockIdx.x == 0) *result = 1; break; }
      if (now - start > limit_ns) { if (blockIdx.x == 0) *result = 2; break; }
    }
  }
  __syncthreads();
}

enum Kind { kLocalMemcpy, kLocalBatch, kPullMemcpy, kPullBatch, kPushMemcpy, kPushBatch, kPullPeerApi };
const char* names[] = {"local memcpyAsync", "local batch(prefer-overlap)", "pull memcpyAsync", "pull batch(prefer-overlap)",
                       "push memcpyAsync", "push batch(prefer-overlap)", "pull memcpyPeerAsync"};

int main() {
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", (void**)&write32, 12000, cudaEnableDefault, &q));
  CK(cudaGetDriverEntryPointByVersion("cuMemcpyBatchAsync", (void**)&batch, 13000, cudaEnableDefault, &q));
  const size_t bytes = size_t{8} << 20;
  char *l0, *l1, *r1; unsigned* flag; int* result;
  CK(cudaSetDevice(1)); CK(cudaMalloc(&r1, bytes)); CK(cudaDeviceEnablePeerAccess(0, 0));
  CK(cudaSetDevice(0)); CK(cudaDeviceEnablePeerAccess(1, 0));
  CK(cudaMalloc(&l0, bytes)); CK(cudaMalloc(&l1, bytes)); CK(cudaMalloc(&flag, 4)); CK(cudaMallocManaged(&result, 4));
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int light = 0; light < 2; ++light) {
    for (int k = kLocalMemcpy; k <= kPullPeerApi; ++k) {
      CK(cudaMemset(flag, 0, 4)); *result = 0; CK(cudaDeviceSynchronize());
      cudaStream_t s, side; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
      hold<<<light ? 1 : sms * 2, 1024, 0, s>>>(flag, result, 1500000000LL);
      char* dst = k == kPushMemcpy || k == kPushBatch ? r1 : l0;
      char* src = k == kLocalMemcpy || k == kLocalBatch ? l1 : k == kPushMemcpy || k == kPushBatch ? l1 : r1;
      if (k == kPullPeerApi) { CK(cudaMemcpyPeerAsync(l0, 0, r1, 1, bytes, side)); }
      else if (k == kLocalMemcpy || k == kPullMemcpy || k == kPushMemcpy) { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, side)); }
      else {
        CUdeviceptr d = (CUdeviceptr)dst, sr = (CUdeviceptr)src; size_t n = bytes, idx = 0;
        CUmemcpyAttributes a = {}; a.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM; a.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
        a.srcLocHint.type = CU_MEM_LOCATION_TYPE_DEVICE; a.srcLocHint.id = k == kPullBatch ? 1 : 0;
        a.dstLocHint.type = CU_MEM_LOCATION_TYPE_DEVICE; a.dstLocHint.id = k == kPushBatch ? 1 : 0;
        CUresult e = batch(&d, &sr, &n, 1, &a, &idx, 1, (CUstream)side);
        if (e != CUDA_SUCCESS) { printf("batch failed %d\n", (int)e); return 1; }
      }
      if (write32((CUstream)side, (CUdeviceptr)flag, 1, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) { printf("write32 failed\n"); return 1; }
      CK(cudaDeviceSynchronize());
      printf("%-6s %-30s %s\n", light ? "light" : "hold", names[k], *result == 1 ? "ok" : "STUCK");
      CK(cudaStreamDestroy(s)); CK(cudaStreamDestroy(side));
    }
  }
  return 0;
}
