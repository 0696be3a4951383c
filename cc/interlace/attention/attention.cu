#include "interlace/attention/attention.h"

#include <cmath>

#include "interlace/attention/args.h"
#include "interlace/attention/sm90_attention.cuh"
#include "interlace/base/cuda.h"

namespace interlace {
namespace {

template <class Element, int kHeadDim, int kTileK>
void launch(const AttentionProblem& p, const TensorView& q, const TensorView& k, const TensorView& v,
            const TensorView& out, const TensorView* lse, cudaStream_t stream) {
  using Config = attention_engine::Config<Element, kHeadDim, kTileK>;
  // With no keys, K and V are never read; the descriptors still need an address.
  const auto* kp = static_cast<const Element*>(p.seq_k > 0 ? k.data : q.data);
  const auto* vp = static_cast<const Element*>(p.seq_k > 0 ? v.data : q.data);
  attention_engine::Params<Config> params{};
  params.tma_q = Config::tma_q(static_cast<const Element*>(q.data), p.batch, p.seq_q, p.heads_q);
  params.tma_k = Config::tma_k(kp, p.batch, p.seq_k, p.heads_kv, 1);
  params.tma_v = Config::tma_v(vp, p.batch, p.seq_k, p.heads_kv, 1);
  params.tma_k_recv = params.tma_k;
  params.tma_v_recv = params.tma_v;
  params.out = static_cast<Element*>(out.data);
  params.lse = lse != nullptr ? static_cast<float*>(lse->data) : nullptr;
  params.batch = static_cast<int32_t>(p.batch);
  params.rows_q = static_cast<int32_t>(p.seq_q);
  params.rows_k = static_cast<int32_t>(p.seq_k);
  params.rows_recv = params.rows_k;
  params.slots = 1;
  params.heads_q = static_cast<int32_t>(p.heads_q);
  params.heads_kv = static_cast<int32_t>(p.heads_kv);
  params.scale = p.softmax_scale;
  params.scale_log2 = static_cast<float>(p.softmax_scale * M_LOG2E);

  auto kernel = attention_engine::sm90_attention_kernel<Config>;
  const int smem = static_cast<int>(sizeof(typename Config::SharedStorage));
  IL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int q_tiles = static_cast<int>((p.seq_q + Config::kTileQ - 1) / Config::kTileQ);
  kernel<<<dim3(q_tiles, params.heads_q, params.batch), Config::kThreads, smem, stream>>>(params, p.causal ? 1 : 0);
  IL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const TensorView* lse, bool causal, double softmax_scale, cudaStream_t stream) {
  require_gpus();
  int device = 0;
  IL_CUDA_CHECK(cudaGetDevice(&device));
  if (q.device.device_type == kDLCUDA) device = q.device.device_id;
  const AttentionProblem p = check_attention_args(q, k, v, out, lse, causal, softmax_scale, device);
  require_hopper(device, "attention");
  DeviceGuard guard(device);
  if (p.batch == 0 || p.heads_q == 0 || p.seq_q == 0) return;
  auto by_dim = [&](auto element) {
    using E = decltype(element);
    if (p.head_dim == 64) return launch<E, 64, 128>(p, q, k, v, out, lse, stream);
    // Wider key tiles where the keys go beyond one tile, with the causal mask too: its diagonal then
    // spans up to two masked key tiles, but the softmax and the turns have more matmul to hide under
    // (causal at S = 8192 and 16384: 591-662 -> 628-707 TFLOP/s on 1 x H200, NOTES fourteenth session).
    if (p.seq_k > 128) return launch<E, 128, 192>(p, q, k, v, out, lse, stream);
    launch<E, 128, 128>(p, q, k, v, out, lse, stream);
  };
  p.dtype == AttentionDtype::kBf16 ? by_dim(cutlass::bfloat16_t{}) : by_dim(cutlass::half_t{});
}

}  // namespace interlace
