// Interlace from C++, without any framework: one process per GPU (started by torchrun, mpirun or
// srun, or with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set by hand), a Group
// from the environment, then all_gather and gemm on raw cudaMalloc buffers, checked on the host.
//
//   bazel build //examples:all_gather_gemm
//   RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 bazel-bin/examples/all_gather_gemm &
//   RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 bazel-bin/examples/all_gather_gemm
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "interlace/api/interlace.h"

namespace {

// Raises interlace::Error on a failed CUDA call, naming it.
void cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) IL_FAIL(what, " failed: ", cudaGetErrorString(err));
}

interlace::TensorView view(void* data, int device, DLDataType dtype, std::vector<int64_t> shape) {
  interlace::TensorView t;
  t.data = data;
  t.device = DLDevice{kDLCUDA, device};
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

// Every rank contributes n bytes of the value rank + 1; rank r's bytes must land at [r n, (r+1) n).
void check_all_gather(interlace::Group& group, cudaStream_t stream) {
  const int world = group.world_size();
  const int64_t n = (1 << 20) + 3;  // not a multiple of 16 bytes
  void *inp = nullptr, *out = nullptr;
  cuda(cudaMalloc(&inp, n), "cudaMalloc");
  cuda(cudaMalloc(&out, n * world), "cudaMalloc");
  cuda(cudaMemset(inp, group.rank() + 1, n), "cudaMemset");
  cuda(cudaMemset(out, 0xFF, n * world), "cudaMemset");  // poison: an unwritten byte shows
  const DLDataType u8{kDLUInt, 8, 1};
  interlace::all_gather(group, view(out, group.device(), u8, {n * world}), view(inp, group.device(), u8, {n}), stream);
  cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  group.check();
  std::vector<uint8_t> host(n * world);
  cuda(cudaMemcpy(host.data(), out, host.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (int64_t i = 0; i < n * world; ++i) {
    IL_CHECK(host[i] == i / n + 1, "all_gather: byte ", i, " is ", int(host[i]), ", expected ", i / n + 1);
  }
  cudaFree(inp);
  cudaFree(out);
}

uint16_t to_bf16(float x) {  // exact for the small integers used here
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return static_cast<uint16_t>(bits >> 16);
}

float from_bf16(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

// out = a @ b with a[i][k] = (i % 3) and b[k][j] = (j % 5 == 0 ? 1 : 0.5): out[i][j] = K (i % 3) b_j,
// exact in bf16 for these sizes.
void check_gemm(int device, cudaStream_t stream) {
  const int64_t m = 300, n = 264, k = 128;
  std::vector<uint16_t> a(m * k), b(k * n), c(m * n, 0xFFFF);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < k; ++j) a[i * k + j] = to_bf16(static_cast<float>(i % 3));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) b[i * n + j] = to_bf16(j % 5 == 0 ? 1.0f : 0.5f);
  void *da = nullptr, *db = nullptr, *dc = nullptr;
  cuda(cudaMalloc(&da, a.size() * 2), "cudaMalloc");
  cuda(cudaMalloc(&db, b.size() * 2), "cudaMalloc");
  cuda(cudaMalloc(&dc, c.size() * 2), "cudaMalloc");
  cuda(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda(cudaMemcpy(dc, c.data(), c.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");  // poison (NaN)
  const DLDataType bf16{kDLBfloat, 16, 1};
  interlace::gemm(view(da, device, bf16, {m, k}), view(db, device, bf16, {k, n}), view(dc, device, bf16, {m, n}), stream);
  cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cuda(cudaMemcpy(c.data(), dc, c.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float want = static_cast<float>(k * (i % 3)) * (j % 5 == 0 ? 1.0f : 0.5f);
      IL_CHECK(from_bf16(c[i * n + j]) == want, "gemm: out[", i, "][", j, "] is ", from_bf16(c[i * n + j]),
               ", expected ", want);
    }
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

}  // namespace

int main() {
  try {
    interlace::GroupOptions options;  // rank, world size and master from the launcher's environment
    options.heap_bytes = size_t{64} << 20;
    interlace::Group group(options);
    cudaStream_t stream = nullptr;
    cuda(cudaSetDevice(group.device()), "cudaSetDevice");
    cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_all_gather(group, stream);
    check_gemm(group.device(), stream);
    cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
    std::printf("rank %d of %d: all_gather and gemm correct\n", group.rank(), group.world_size());
    return 0;
  } catch (const interlace::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
