// Probe: how long a GPU thread's read of mapped host memory takes (op_begin's abort word), against
// device memory; and op_begin's gate (CTA 0 reads the host word, then opens a flag the other 131
// CTAs spin on) as a kernel time. nvcc -O2 -arch=sm_90 -o /tmp/host_read tools/probes/host_read_latency.cu
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
__device__ uint64_t gtime() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__global__ void lat(const volatile int* p, int n, uint64_t* out) {
  uint64_t t0 = gtime(); int s = 0;
  for (int i = 0; i < n; ++i) s += p[0];
  uint64_t t1 = gtime(); out[0] = (t1 - t0) / n; out[1] = s;
}
__global__ void gate(const volatile int* host, uint64_t* flag, uint64_t want, int use_host) {
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) {
      int stop = use_host ? host[0] : 0;
      asm volatile("st.release.gpu.global.u64 [%0], %1;" :: "l"(flag), "l"(want | stop) : "memory");
    } else {
      uint64_t v; do { asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(flag) : "memory"); } while (v < want);
    }
  }
  __syncthreads();
}
__global__ void empty() {}
int main() {
  int* h; cudaHostAlloc(&h, 64, cudaHostAllocMapped); h[0] = 0; int* hd; cudaHostGetDevicePointer(&hd, h, 0);
  int* d; cudaMalloc(&d, 64); cudaMemset(d, 0, 64);
  uint64_t* o; cudaMallocManaged(&o, 64);
  uint64_t* f; cudaMalloc(&f, 8); cudaMemset(f, 0, 8);
  for (int r = 0; r < 3; ++r) {
    lat<<<1, 1>>>(hd, 100, o); cudaDeviceSynchronize(); printf("host-mapped read: %lu ns\n", (unsigned long)o[0]);
    lat<<<1, 1>>>(d, 100, o); cudaDeviceSynchronize(); printf("device read (L2 hit): %lu ns\n", (unsigned long)o[0]);
  }
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int use = 0; use < 3; ++use) {
    float best = 1e9, sum = 0; int n = 200;
    for (int i = 0; i < n; ++i) {
      cudaEventRecord(a);
      if (use == 2) empty<<<132, 384>>>(); else gate<<<132, 384>>>(hd, f, 2 * (uint64_t)(i + 1 + use * 1000), use);
      cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); sum += ms; if (ms < best) best = ms;
    }
    printf("%s: event us min %.2f mean %.2f\n", use == 2 ? "empty 132x384" : use ? "gate with host read" : "gate, device only", best * 1e3, sum / n * 1e3);
  }
  return 0;
}
