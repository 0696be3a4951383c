// XLA FFI handlers: what interlace.jax's ops lower to under jax.jit. XLA calls them on its own
// stream with its own buffers (row-major, dense), so nothing synchronizes and nothing is copied but
// moe_dispatch's received rows (they live in the heap, where peers write them).
//
// A handler gets its group as an int64 attribute, the Python Group's handle (_group.py), and finds
// the native Group in a map of weak references that interlace.jax fills when it traces an op
// (register_xla_group below). Errors come back to XLA as xla::ffi::Error carrying interlace::Error's
// message; nothing throws across the FFI boundary.
//
// Built against the XLA FFI headers of the jaxlib in .venv (third_party/local_deps.bzl); the FFI C
// API is versioned and XLA accepts handlers built against older headers (docs/DESIGN.md).
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "interlace/api/interlace.h"
#include "interlace/base/cuda.h"
#include "interlace/gemm/grouped_args.h"
#include "interlace/gemm/grouped_gemm.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;
using namespace nb::literals;

namespace interlace {
namespace {

// What the handlers find by an integer attribute (a Python Group's handle, an interlace.jax
// MoeBuffers' handle), held weakly: a handler holds a strong reference for the length of its call,
// since XLA runs handlers on its own thread while Python may free the object meanwhile.
template <class T>
class WeakRegistry {
 public:
  void add(int64_t id, std::shared_ptr<T> object) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = objects_.begin(); it != objects_.end();) it = it->second.expired() ? objects_.erase(it) : std::next(it);
    objects_[id] = std::move(object);
  }
  std::shared_ptr<T> find(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = objects_.find(id);
    return it == objects_.end() ? nullptr : it->second.lock();
  }

 private:
  std::mutex mutex_;
  std::unordered_map<int64_t, std::weak_ptr<T>> objects_;
};

WeakRegistry<Group>& groups() {
  static auto* registry = new WeakRegistry<Group>();
  return *registry;
}

WeakRegistry<MoeHandle>& moe_handles() {
  static auto* registry = new WeakRegistry<MoeHandle>();
  return *registry;
}

std::shared_ptr<Group> group_by_handle(int64_t handle) {
  std::shared_ptr<Group> group = groups().find(handle);
  if (!group) IL_FAIL("no live interlace.Group has handle ", handle, " (the group was freed, or never used from interlace.jax)");
  return group;
}

std::shared_ptr<MoeHandle> moe_by_handle(int64_t handle) {
  std::shared_ptr<MoeHandle> moe = moe_handles().find(handle);
  IL_CHECK(moe != nullptr, "no live interlace.jax.MoeBuffers has handle ", handle, " (its buffers were freed)");
  return moe;
}

// XLA's element type as DLPack's; interlace checks which dtypes each op accepts.
DLDataType dl_dtype(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED: return DLDataType{6, 8, 1};  // kDLBool (newer than Debian's dlpack.h)
    case ffi::DataType::S8: return DLDataType{kDLInt, 8, 1};
    case ffi::DataType::S16: return DLDataType{kDLInt, 16, 1};
    case ffi::DataType::S32: return DLDataType{kDLInt, 32, 1};
    case ffi::DataType::S64: return DLDataType{kDLInt, 64, 1};
    case ffi::DataType::U8: return DLDataType{kDLUInt, 8, 1};
    case ffi::DataType::U16: return DLDataType{kDLUInt, 16, 1};
    case ffi::DataType::U32: return DLDataType{kDLUInt, 32, 1};
    case ffi::DataType::U64: return DLDataType{kDLUInt, 64, 1};
    case ffi::DataType::F16: return DLDataType{kDLFloat, 16, 1};
    case ffi::DataType::F32: return DLDataType{kDLFloat, 32, 1};
    case ffi::DataType::F64: return DLDataType{kDLFloat, 64, 1};
    case ffi::DataType::BF16: return DLDataType{kDLBfloat, 16, 1};
    default: IL_FAIL("interlace.jax: unsupported XLA element type ", static_cast<int>(t));
  }
}

// XLA buffers are dense and row-major (the default layout; ffi_call asks for it), so strides are
// left empty (C-contiguous).
TensorView view_of(const ffi::AnyBuffer& b, int device) {
  TensorView v;
  v.data = b.untyped_data();
  v.device = DLDevice{kDLCUDA, device};
  v.dtype = dl_dtype(b.element_type());
  for (int64_t d : b.dimensions()) v.shape.push_back(d);
  return v;
}

template <typename F>
ffi::Error guarded(F&& f) {
  try {
    f();
    return ffi::Error::Success();
  } catch (const Error& e) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("interlace: ") + e.what());
  } catch (...) {
    return ffi::Error::Internal("interlace: unknown C++ exception");
  }
}

ffi::Error all_gather_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                           int64_t group, int64_t num_blocks, int64_t chunk_bytes) {
  return guarded([&] {
    std::shared_ptr<Group> g = group_by_handle(group);
    all_gather(*g, view_of(*out, device), view_of(x, device), stream,
               AllGatherTuning{static_cast<int>(num_blocks), static_cast<uint64_t>(chunk_bytes)});
  });
}

ffi::Error gemm_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                     ffi::Result<ffi::AnyBuffer> out, int64_t band_m, int64_t tile_n, int64_t cluster_m,
                     int64_t pingpong) {
  return guarded([&] {
    gemm(view_of(a, device), view_of(b, device), view_of(*out, device), stream,
         GemmTuning{static_cast<int>(band_m), static_cast<int>(tile_n), static_cast<int>(cluster_m), pingpong != 0});
  });
}

// out is XLA's new buffer and the kernel writes only the first min(rows[g], C) rows of each group, so
// the rest is defined here: out is zero-filled on XLA's stream before the kernel (a memset of all of
// out's bytes, stream-ordered, capturable). The arguments, cluster_m and the GPU are checked first, so
// that a call refused does no GPU work (bar grouped_gemm's bound of 2^30 tiles, past any real shape).
ffi::Error grouped_gemm_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                             ffi::AnyBuffer rows, ffi::Result<ffi::AnyBuffer> out, int64_t cluster_m) {
  return guarded([&] {
    const TensorView va = view_of(a, device), vb = view_of(b, device), vr = view_of(rows, device);
    const TensorView vo = view_of(*out, device);
    check_grouped_gemm_args(va, vb, vo, vr, device);
    const GroupedGemmTuning tuning{static_cast<int>(cluster_m)};
    check_grouped_gemm_tuning(tuning);
    require_hopper(device, "grouped_gemm");
    if (out->size_bytes() > 0) {
      DeviceGuard guard(device);
      IL_CUDA_CHECK(cudaMemsetAsync(out->untyped_data(), 0, out->size_bytes(), stream));
    }
    grouped_gemm(va, vb, vo, vr, stream, tuning);
  });
}

ffi::Error ag_gemm_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a_shard, ffi::AnyBuffer b,
                        ffi::Result<ffi::AnyBuffer> out, int64_t group, ffi::Span<const int64_t> shard_rows,
                        int64_t chunk_rows, int64_t band_m, int64_t tile_n, int64_t pingpong) {
  return guarded([&] {
    std::shared_ptr<Group> g = group_by_handle(group);
    std::vector<int64_t> rows(shard_rows.begin(), shard_rows.end());
    ag_gemm(*g, view_of(a_shard, device), view_of(b, device), view_of(*out, device), nullptr, rows, stream,
            AgGemmTuning{chunk_rows, static_cast<int>(band_m), static_cast<int>(tile_n), pingpong != 0});
  });
}

// gemm_rs and gemm_ar.
ffi::Error gemm_rs_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                        ffi::Result<ffi::AnyBuffer> out, int64_t group, ffi::Span<const int64_t> shard_rows,
                        int64_t band_m, int64_t tile_n, int64_t pingpong, int64_t reduce_ctas) {
  return guarded([&] {
    std::shared_ptr<Group> g = group_by_handle(group);
    std::vector<int64_t> rows(shard_rows.begin(), shard_rows.end());
    gemm_rs(*g, view_of(a, device), view_of(b, device), view_of(*out, device), rows, stream,
            GemmRsTuning{static_cast<int>(band_m), static_cast<int>(tile_n), pingpong != 0,
                         static_cast<int>(reduce_ctas)});
  });
}

ffi::Error gemm_ar_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                        ffi::Result<ffi::AnyBuffer> out, int64_t group, int64_t band_m, int64_t tile_n,
                        int64_t pingpong, int64_t reduce_ctas) {
  return guarded([&] {
    std::shared_ptr<Group> g = group_by_handle(group);
    gemm_ar(*g, view_of(a, device), view_of(b, device), view_of(*out, device), stream,
            GemmRsTuning{static_cast<int>(band_m), static_cast<int>(tile_n), pingpong != 0,
                         static_cast<int>(reduce_ctas)});
  });
}

// reduce_scatter and all_reduce: XLA's input buffer is never the output (ffi_call aliases nothing),
// so all_reduce runs out of place here.
ffi::Error reduce_scatter_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                               int64_t group, int64_t num_blocks, int64_t chunk_bytes) {
  return guarded([&] {
    std::shared_ptr<Group> g = group_by_handle(group);
    reduce_scatter(*g, view_of(*out, device), view_of(x, device), stream,
                   ReduceTuning{ReduceAlgorithm::kAuto, static_cast<int>(num_blocks), static_cast<uint64_t>(chunk_bytes)});
  });
}

// algorithm: a ReduceAlgorithm's value (0 automatic, 2 one-shot, 3 two-shot), as the binding takes it.
ffi::Error all_reduce_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out,
                           int64_t group, int64_t algorithm, int64_t num_blocks, int64_t chunk_bytes) {
  return guarded([&] {
    IL_CHECK(algorithm == 0 || algorithm == 2 || algorithm == 3, "all_reduce: algorithm must be 0 (automatic), 2 "
             "(one-shot) or 3 (two-shot), got ", algorithm);
    std::shared_ptr<Group> g = group_by_handle(group);
    all_reduce(*g, view_of(*out, device), view_of(x, device), stream,
               ReduceTuning{static_cast<ReduceAlgorithm>(algorithm), static_cast<int>(num_blocks),
                            static_cast<uint64_t>(chunk_bytes)});
  });
}

// attention and ring_attention: out in q's dtype and lse float32 [B, Hq, S_q] are both XLA's results.
// softmax_scale 0 means 1 / sqrt(D) (interlace.jax passes 0 for None and refuses a given non-positive one).
ffi::Error attention_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                          ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, bool causal,
                          double softmax_scale) {
  return guarded([&] {
    TensorView vl = view_of(*lse, device);
    attention(view_of(q, device), view_of(k, device), view_of(v, device), view_of(*out, device), &vl, causal,
              softmax_scale, stream);
  });
}

// seq_len: the global S (0: world x S_local).
ffi::Error ring_attention_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k,
                               ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                               int64_t group, bool causal, double softmax_scale, int64_t seq_len) {
  return guarded([&] {
    std::shared_ptr<Group> g = group_by_handle(group);
    TensorView vl = view_of(*lse, device);
    ring_attention(*g, view_of(q, device), view_of(k, device), view_of(v, device), view_of(*out, device), &vl, causal,
                   softmax_scale, seq_len, stream);
  });
}

// The handle's receive rows and per-expert runs live in the group's heap, where peers write them;
// XLA's outputs are its own buffers, so they are copied out (on XLA's stream, after the dispatch).
void copy_out(const char* op, const TensorView& from, ffi::AnyBuffer& to, const char* what, cudaStream_t stream) {
  IL_CHECK(static_cast<int64_t>(to.size_bytes()) == static_cast<int64_t>(from.nbytes()), "interlace.jax.", op, ": ",
           what, " is ", to.size_bytes(), " bytes but the handle's is ", from.nbytes());
  IL_CUDA_CHECK(cudaMemcpyAsync(to.untyped_data(), from.data, from.nbytes(), cudaMemcpyDeviceToDevice, stream));
}

ffi::Error moe_dispatch_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer topk_idx,
                             ffi::AnyBuffer topk_weights, ffi::Result<ffi::AnyBuffer> expert_x,
                             ffi::Result<ffi::AnyBuffer> expert_starts, ffi::Result<ffi::AnyBuffer> expert_rows,
                             int64_t group, int64_t moe) {
  return guarded([&] {
    std::shared_ptr<Group> g = group_by_handle(group);
    std::shared_ptr<MoeHandle> h = moe_by_handle(moe);
    moe_dispatch(*g, *h, view_of(x, device), view_of(topk_idx, device), view_of(topk_weights, device), stream);
    copy_out("moe_dispatch", h->expert_x(), *expert_x, "expert_x", stream);
    copy_out("moe_dispatch", h->expert_starts(), *expert_starts, "expert_starts", stream);
    copy_out("moe_dispatch", h->expert_rows(), *expert_rows, "expert_rows", stream);
  });
}

ffi::Error moe_combine_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer expert_out,
                            ffi::Result<ffi::AnyBuffer> out, int64_t group, int64_t moe) {
  return guarded([&] {
    std::shared_ptr<Group> g = group_by_handle(group);
    moe_combine(*g, *moe_by_handle(moe), view_of(expert_out, device), view_of(*out, device), stream);
  });
}

// w arrives as XLA's dense row-major [L, H, N] (N contiguous), one of the two layouts the GEMM reads;
// the dispatch and GEMM write the handle's buffers and XLA's out, then the per-expert runs are copied
// out as moe_dispatch's (the receive rows themselves are not: the fused op's caller has out instead).
ffi::Error moe_dispatch_gemm_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer topk_idx,
                                  ffi::AnyBuffer topk_weights, ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> out,
                                  ffi::Result<ffi::AnyBuffer> expert_starts, ffi::Result<ffi::AnyBuffer> expert_rows,
                                  int64_t group, int64_t moe, int64_t cluster_m) {
  return guarded([&] {
    std::shared_ptr<Group> g = group_by_handle(group);
    std::shared_ptr<MoeHandle> h = moe_by_handle(moe);
    moe_dispatch_gemm(*g, *h, view_of(x, device), view_of(topk_idx, device), view_of(topk_weights, device),
                      view_of(w, device), view_of(*out, device), stream, GroupedGemmTuning{static_cast<int>(cluster_m)});
    copy_out("moe_dispatch_gemm", h->expert_starts(), *expert_starts, "expert_starts", stream);
    copy_out("moe_dispatch_gemm", h->expert_rows(), *expert_rows, "expert_rows", stream);
  });
}

// w arrives as XLA's dense row-major [L, F, H] (H contiguous), one of the two layouts the GEMM reads;
// the combine reads the handle's last dispatch, as moe_combine does, and writes XLA's out.
ffi::Error moe_gemm_combine_impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer act, ffi::AnyBuffer w,
                                 ffi::Result<ffi::AnyBuffer> out, int64_t group, int64_t moe, int64_t cluster_m) {
  return guarded([&] {
    std::shared_ptr<Group> g = group_by_handle(group);
    moe_gemm_combine(*g, *moe_by_handle(moe), view_of(act, device), view_of(w, device), view_of(*out, device), stream,
                     GroupedGemmTuning{static_cast<int>(cluster_m)});
  });
}

}  // namespace
}  // namespace interlace

namespace {

// What every handler binds first: XLA's stream and the ordinal of the GPU it runs on.
auto bind_on_stream() {
  return xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>().Ctx<xla::ffi::DeviceOrdinal>();
}

// all_gather and reduce_scatter: one input, one output, the group and the kernel's tuning.
auto bind_collective() {
  return bind_on_stream()
      .Arg<xla::ffi::AnyBuffer>()
      .Ret<xla::ffi::AnyBuffer>()
      .Attr<int64_t>("group")
      .Attr<int64_t>("num_blocks")
      .Attr<int64_t>("chunk_bytes");
}

// attention and ring_attention: q, k, v in; out and lse out.
auto bind_attention() {
  return bind_on_stream()
      .Arg<xla::ffi::AnyBuffer>()
      .Arg<xla::ffi::AnyBuffer>()
      .Arg<xla::ffi::AnyBuffer>()
      .Ret<xla::ffi::AnyBuffer>()
      .Ret<xla::ffi::AnyBuffer>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_all_gather, interlace::all_gather_impl, bind_collective());

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_gemm, interlace::gemm_impl,
                              bind_on_stream()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("band_m")
                                  .Attr<int64_t>("tile_n")
                                  .Attr<int64_t>("cluster_m")
                                  .Attr<int64_t>("pingpong"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_grouped_gemm, interlace::grouped_gemm_impl,
                              bind_on_stream()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("cluster_m"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_ag_gemm, interlace::ag_gemm_impl,
                              bind_on_stream()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("group")
                                  .Attr<xla::ffi::Span<const int64_t>>("shard_rows")
                                  .Attr<int64_t>("chunk_rows")
                                  .Attr<int64_t>("band_m")
                                  .Attr<int64_t>("tile_n")
                                  .Attr<int64_t>("pingpong"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_gemm_rs, interlace::gemm_rs_impl,
                              bind_on_stream()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("group")
                                  .Attr<xla::ffi::Span<const int64_t>>("shard_rows")
                                  .Attr<int64_t>("band_m")
                                  .Attr<int64_t>("tile_n")
                                  .Attr<int64_t>("pingpong")
                                  .Attr<int64_t>("reduce_ctas"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_gemm_ar, interlace::gemm_ar_impl,
                              bind_on_stream()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("group")
                                  .Attr<int64_t>("band_m")
                                  .Attr<int64_t>("tile_n")
                                  .Attr<int64_t>("pingpong")
                                  .Attr<int64_t>("reduce_ctas"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_reduce_scatter, interlace::reduce_scatter_impl, bind_collective());

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_all_reduce, interlace::all_reduce_impl,
                              bind_on_stream()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("group")
                                  .Attr<int64_t>("algorithm")
                                  .Attr<int64_t>("num_blocks")
                                  .Attr<int64_t>("chunk_bytes"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_moe_dispatch, interlace::moe_dispatch_impl,
                              bind_on_stream()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("group")
                                  .Attr<int64_t>("moe"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_moe_combine, interlace::moe_combine_impl,
                              bind_on_stream()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("group")
                                  .Attr<int64_t>("moe"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_moe_dispatch_gemm, interlace::moe_dispatch_gemm_impl,
                              bind_on_stream()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("group")
                                  .Attr<int64_t>("moe")
                                  .Attr<int64_t>("cluster_m"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_moe_gemm_combine, interlace::moe_gemm_combine_impl,
                              bind_on_stream()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("group")
                                  .Attr<int64_t>("moe")
                                  .Attr<int64_t>("cluster_m"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_attention, interlace::attention_impl,
                              bind_attention().Attr<bool>("causal").Attr<double>("softmax_scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(interlace_xla_ring_attention, interlace::ring_attention_impl,
                              bind_attention()
                                  .Attr<int64_t>("group")
                                  .Attr<bool>("causal")
                                  .Attr<double>("softmax_scale")
                                  .Attr<int64_t>("seq_len"));

namespace interlace {

void register_xla_ffi(nb::module_& m) {
  m.def("_xla_ffi_handlers", [] {
    nb::dict d;
    d["interlace_all_gather"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_all_gather));
    d["interlace_gemm"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_gemm));
    d["interlace_grouped_gemm"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_grouped_gemm));
    d["interlace_ag_gemm"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_ag_gemm));
    d["interlace_gemm_rs"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_gemm_rs));
    d["interlace_gemm_ar"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_gemm_ar));
    d["interlace_reduce_scatter"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_reduce_scatter));
    d["interlace_all_reduce"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_all_reduce));
    d["interlace_moe_dispatch"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_moe_dispatch));
    d["interlace_moe_combine"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_moe_combine));
    d["interlace_moe_dispatch_gemm"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_moe_dispatch_gemm));
    d["interlace_moe_gemm_combine"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_moe_gemm_combine));
    d["interlace_attention"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_attention));
    d["interlace_ring_attention"] = nb::capsule(reinterpret_cast<void*>(&interlace_xla_ring_attention));
    return d;
  }, "The XLA FFI handlers (target name -> PyCapsule of an XLA_FFI_Handler*), for jax.ffi.register_ffi_target.");

  m.def("_register_xla_group",
        [](int64_t handle, std::shared_ptr<Group> group) { groups().add(handle, std::move(group)); },
        "handle"_a, "group"_a,
        "Lets the XLA FFI handlers find `group` (a native Group, held weakly) by `handle`, the Python Group's handle.");

  m.def("_register_xla_moe",
        [](int64_t handle, std::shared_ptr<MoeHandle> moe) { moe_handles().add(handle, std::move(moe)); },
        "handle"_a, "moe"_a,
        "Lets the XLA FFI handlers find `moe` (a native MoeHandle, held weakly) by `handle`.");
}

}  // namespace interlace
