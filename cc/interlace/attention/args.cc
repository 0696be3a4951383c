#include "interlace/attention/args.h"

#include <cmath>

#include "interlace/base/error.h"

namespace interlace {
namespace {

bool is16(const DLDataType& t, uint8_t code) { return t.code == code && t.bits == 16 && t.lanes == 1; }

// q, k and v are read by TMA (16-byte aligned); out and lse are written in 4-byte words.
void check_attention_placed(const char* name, const TensorView& t, int device, size_t align = 16) {
  interlace::check_placed("attention", name, t, device, align, "the GPU");
}

}  // namespace

AttentionProblem check_attention_args(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView* lse, bool causal,
                                      double softmax_scale, int device) {
  AttentionProblem p;
  IL_CHECK(is16(q.dtype, kDLBfloat) || is16(q.dtype, kDLFloat), "attention: q has dtype ", q.dtype_name(),
           "; supported are bfloat16 and float16");
  for (const TensorView* t : {&k, &v, &out}) {
    IL_CHECK(t->dtype.code == q.dtype.code && t->dtype.bits == q.dtype.bits && t->dtype.lanes == 1,
             "attention: q, k, v and out must share a dtype; got ", q.dtype_name(), ", ", k.dtype_name(), ", ",
             v.dtype_name(), ", ", out.dtype_name());
  }
  p.dtype = is16(q.dtype, kDLBfloat) ? AttentionDtype::kBf16 : AttentionDtype::kF16;
  IL_CHECK(q.shape.size() == 4 && k.shape.size() == 4 && v.shape.size() == 4 && out.shape.size() == 4,
           "attention: q, k, v and out must be 4-D [batch, seq, heads, head_dim]; got ", q.shape_string(), ", ",
           k.shape_string(), ", ", v.shape_string(), ", ", out.shape_string());
  p.batch = q.shape[0];
  p.seq_q = q.shape[1];
  p.heads_q = q.shape[2];
  p.head_dim = q.shape[3];
  p.seq_k = k.shape[1];
  p.heads_kv = k.shape[2];
  IL_CHECK(out.shape == q.shape, "attention: out has shape ", out.shape_string(), "; it must be q's, ",
           q.shape_string());
  IL_CHECK(v.shape == k.shape, "attention: v has shape ", v.shape_string(), "; it must be k's, ", k.shape_string());
  IL_CHECK(k.shape[0] == p.batch && k.shape[3] == p.head_dim, "attention: k ", k.shape_string(),
           " must have q's batch and head_dim (q is ", q.shape_string(), ")");
  IL_CHECK(p.head_dim == 64 || p.head_dim == 128, "attention: head_dim ", p.head_dim, " is not supported; it is 64 or 128");
  IL_CHECK(p.heads_kv >= 1 && p.heads_q % p.heads_kv == 0, "attention: q's ", p.heads_q,
           " heads must be a multiple of k's and v's ", p.heads_kv, " (grouped-query attention)");
  IL_CHECK(!causal || p.seq_q == p.seq_k, "attention: causal attention needs as many queries as keys; got S_q = ",
           p.seq_q, " and S_k = ", p.seq_k);
  p.causal = causal;
  IL_CHECK(p.seq_q <= kMaxAttentionSeq && p.seq_k <= kMaxAttentionSeq, "attention: sequences are limited to 2^31 - 256 rows");
  IL_CHECK(p.heads_q <= kMaxAttentionGrid && p.batch <= kMaxAttentionGrid, "attention: batch and heads are limited to ",
           kMaxAttentionGrid, "; got batch ", p.batch, ", heads ", p.heads_q);
  // Finite as the kernel uses it: in float, times log2(e).
  IL_CHECK(softmax_scale == 0 || (softmax_scale > 0 && std::isfinite(static_cast<float>(softmax_scale * M_LOG2E))),
           "attention: softmax_scale ", softmax_scale, " must be positive and finite in float32 (0: 1 / sqrt(head_dim))");
  p.softmax_scale = softmax_scale == 0 ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.head_dim)))
                                       : static_cast<float>(softmax_scale);

  if (lse != nullptr) {
    IL_CHECK(lse->dtype.code == kDLFloat && lse->dtype.bits == 32 && lse->dtype.lanes == 1, "attention: lse has dtype ",
             lse->dtype_name(), "; it must be float32");
    IL_CHECK(lse->shape == std::vector<int64_t>({p.batch, p.heads_q, p.seq_q}), "attention: lse has shape ",
             lse->shape_string(), "; it must be [batch, heads_q, seq_q] = [", p.batch, ", ", p.heads_q, ", ", p.seq_q,
             "]");
  }

  check_attention_placed("q", q, device);
  check_attention_placed("k", k, device);
  check_attention_placed("v", v, device);
  check_attention_placed("out", out, device, 4);
  for (const TensorView* t : {&q, &k, &v}) {
    IL_CHECK(!bytes_overlap(out, *t), "attention: out overlaps an input in memory; write to a separate tensor");
  }
  if (lse != nullptr) {
    check_attention_placed("lse", *lse, device, 4);
    for (const TensorView* t : {&q, &k, &v, &out}) {
      IL_CHECK(!bytes_overlap(*lse, *t), "attention: lse overlaps another tensor in memory");
    }
  }
  return p;
}

}  // namespace interlace
