#include "interlace/attention/attention.h"

#include <cmath>

#include "interlace/attention/args.h"
#include "interlace/attention/sm90_attention.cuh"
#include "interlace/base/cuda.h"

namespace interlace {
namespace {

template <class Element, int kHeadDim, bool kCausal>
void launch(const AttentionProblem& p, const TensorView& q, const TensorView& k, const TensorView& v,
            const TensorView& out, const TensorView* lse, cudaStream_t stream) {
  using Config = attention_engine::Config<Element, kHeadDim, kCausal>;
  using namespace cute;
  // TMA needs every dimension positive: an empty key sequence gets a one-row descriptor it never reads.
  const auto rows = [](int64_t n) { return static_cast<int32_t>(n > 0 ? n : 1); };
  const auto tensor_rows = [&](const TensorView& t, int64_t seq, int64_t heads) {
    return make_tensor(make_gmem_ptr(static_cast<const Element*>(t.data)),
                       make_shape(rows(seq), Int<kHeadDim>{}, static_cast<int32_t>(heads), static_cast<int32_t>(p.batch)),
                       make_stride(heads * kHeadDim, _1{}, int64_t{kHeadDim}, seq * heads * kHeadDim));
  };
  attention_engine::Params<Config> params{};
  params.tma_q = make_tma_copy(SM90_TMA_LOAD{}, tensor_rows(q, p.seq_q, p.heads_q),
                               typename Config::SmemLayoutQ{}(_, _, _0{}));
  params.tma_k = make_tma_copy(SM90_TMA_LOAD{}, tensor_rows(k, p.seq_k, p.heads_kv),
                               typename Config::SmemLayoutK{}(_, _, _0{}));
  auto v_cols = make_tensor(make_gmem_ptr(static_cast<const Element*>(v.data)),
                            make_shape(Int<kHeadDim>{}, rows(p.seq_k), static_cast<int32_t>(p.heads_kv),
                                       static_cast<int32_t>(p.batch)),
                            make_stride(_1{}, p.heads_kv * kHeadDim, int64_t{kHeadDim}, p.seq_k * p.heads_kv * kHeadDim));
  params.tma_v = make_tma_copy(SM90_TMA_LOAD{}, v_cols, typename Config::SmemLayoutV{}(_, _, _0{}));
  params.out = static_cast<Element*>(out.data);
  params.lse = lse != nullptr ? static_cast<float*>(lse->data) : nullptr;
  params.batch = static_cast<int32_t>(p.batch);
  params.seq_q = static_cast<int32_t>(p.seq_q);
  params.seq_k = static_cast<int32_t>(p.seq_k);
  params.heads_q = static_cast<int32_t>(p.heads_q);
  params.heads_kv = static_cast<int32_t>(p.heads_kv);
  params.q_tiles = static_cast<int32_t>((p.seq_q + Config::kTileQ - 1) / Config::kTileQ);
  params.scale = p.softmax_scale;
  params.scale_log2 = static_cast<float>(p.softmax_scale * M_LOG2E);

  auto kernel = attention_engine::sm90_attention_kernel<Config>;
  const int smem = static_cast<int>(sizeof(typename Config::SharedStorage));
  IL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<dim3(params.q_tiles, params.heads_q, params.batch), Config::kThreads, smem, stream>>>(params);
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
  auto by_mask = [&](auto element, auto head_dim) {
    using E = decltype(element);
    constexpr int D = decltype(head_dim)::value;
    causal ? launch<E, D, true>(p, q, k, v, out, lse, stream) : launch<E, D, false>(p, q, k, v, out, lse, stream);
  };
  auto by_dim = [&](auto element) {
    p.head_dim == 64 ? by_mask(element, std::integral_constant<int, 64>{})
                     : by_mask(element, std::integral_constant<int, 128>{});
  };
  p.dtype == AttentionDtype::kBf16 ? by_dim(cutlass::bfloat16_t{}) : by_dim(cutlass::half_t{});
}

}  // namespace interlace
