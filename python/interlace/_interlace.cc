// The nanobind binding: DLPack tensors in, interlace::Error out as interlace.Error. Everything
// here converts and forwards; the C++ library does the checks and the work.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "interlace/api/interlace.h"
#include "interlace/attention/args.h"
#include "interlace/base/cuda.h"
#include "interlace/gemm/args.h"
#include "interlace/gemm/grouped_args.h"
#include "interlace/gemm/grouped_gemm.h"
#include "interlace/ops/ring_attention/plan.h"
#include "interlace/runtime/cross_node_choice.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace interlace {
namespace {

template <typename... Config>
TensorView view_of(const nb::ndarray<Config...>& a) {
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.device = DLDevice{static_cast<DLDeviceType>(a.device_type()), a.device_id()};
  v.dtype = DLDataType{a.dtype().code, a.dtype().bits, a.dtype().lanes};
  for (size_t i = 0; i < a.ndim(); ++i) {
    v.shape.push_back(static_cast<int64_t>(a.shape(i)));
    v.strides.push_back(a.stride(i));
  }
  return v;
}

nb::dlpack::dtype parse_dtype(const std::string& name) {
  using nb::dlpack::dtype_code;
  struct Named { const char* name; dtype_code code; uint8_t bits; };
  static const Named known[] = {
      {"float16", dtype_code::Float, 16},   {"bfloat16", dtype_code::Bfloat, 16}, {"float32", dtype_code::Float, 32},
      {"float64", dtype_code::Float, 64},   {"int8", dtype_code::Int, 8},         {"int16", dtype_code::Int, 16},
      {"int32", dtype_code::Int, 32},       {"int64", dtype_code::Int, 64},       {"uint8", dtype_code::UInt, 8},
      {"uint16", dtype_code::UInt, 16},     {"uint32", dtype_code::UInt, 32},     {"uint64", dtype_code::UInt, 64},
      {"bool", dtype_code::Bool, 8},
  };
  for (const auto& k : known) {
    if (name == k.name) return nb::dlpack::dtype{static_cast<uint8_t>(k.code), k.bits, 1};
  }
  IL_FAIL("unknown dtype '", name, "'; use one of float16, bfloat16, float32, float64, int8..int64, uint8..uint64, bool");
}

// Tensors go back to Python as objects with __dlpack__ and __dlpack_device__ (nanobind's
// array_api export), which torch, CuPy and JAX all wrap zero-copy, as often as needed.

// Keeps the group alive while a symmetric tensor is, and returns its memory to the heap after.
struct SymmetricBlock {
  std::shared_ptr<Group> group;
  size_t offset;
};

nb::ndarray<nb::array_api> wrap(std::shared_ptr<Group> group, char* data, std::vector<size_t> shape, nb::dlpack::dtype dtype,
                   std::optional<size_t> owned_offset) {
  nb::capsule owner;
  if (owned_offset) {
    owner = nb::capsule(new SymmetricBlock{group, *owned_offset}, [](void* p) noexcept {
      auto* block = static_cast<SymmetricBlock*>(p);
      try {
        block->group->free(block->offset);
      } catch (...) {
      }
      delete block;
    });
  } else {
    owner = nb::capsule(new std::shared_ptr<Group>(group),
                        [](void* p) noexcept { delete static_cast<std::shared_ptr<Group>*>(p); });
  }
  return nb::ndarray<nb::array_api>(data, shape.size(), shape.data(), owner, nullptr, dtype, nb::device::cuda::value,
                                    group->device());
}

// A view of memory `owner` (a Python object) keeps alive, such as a MoeHandle's buffers.
nb::ndarray<nb::array_api> view_owned_by(nb::handle owner, const TensorView& v) {
  std::vector<size_t> shape(v.shape.begin(), v.shape.end());
  nb::dlpack::dtype dt{v.dtype.code, v.dtype.bits, static_cast<uint16_t>(v.dtype.lanes)};
  return nb::ndarray<nb::array_api>(v.data, shape.size(), shape.data(), owner, nullptr, dt, nb::device::cuda::value,
                                    v.device.device_id);
}

MoeShape moe_shape(int world_size, int64_t experts, int topk, int64_t hidden, int64_t max_tokens, int64_t capacity,
                   int capacity_kind) {
  MoeShape s;
  s.world = world_size;
  s.experts = experts;
  s.topk = topk;
  s.row_bytes = hidden * 2;
  s.tokens = max_tokens;
  s.capacity = capacity;
  s.capacity_kind = static_cast<MoeCapacityKind>(capacity_kind);
  return s;
}

size_t nbytes_of(const std::vector<size_t>& shape, nb::dlpack::dtype dtype) {
  size_t n = (dtype.bits + 7) / 8;
  for (size_t d : shape) n *= d;
  return n;
}

}  // namespace

void register_xla_ffi(nb::module_& m);  // xla_ffi.cc: the XLA FFI handlers of interlace.jax

}  // namespace interlace

NB_MODULE(_interlace, m) {
  using namespace interlace;
  m.doc() = "Interlace's native core: bootstrap, groups, symmetric heap and fused GPU ops.";
  nb::exception<Error>(m, "Error", PyExc_RuntimeError);

  m.def("gpu_count", [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }, "Number of CUDA GPUs this process sees (0 without a driver or GPU).");

  nb::class_<Bootstrap>(m, "Bootstrap",
                        "TCP rendezvous of a job's processes: all_gather of byte blobs and a barrier.")
      .def("__init__",
           [](Bootstrap* self, int rank, int world_size, std::string master_addr, int master_port,
              std::string secret, double timeout_s) {
             BootstrapOptions o;
             o.rank = rank;
             o.world_size = world_size;
             o.master_addr = std::move(master_addr);
             o.master_port = master_port;
             o.secret = std::move(secret);
             o.timeout_s = timeout_s;
             nb::gil_scoped_release release;
             new (self) Bootstrap(o);
           },
           nb::kw_only(), "rank"_a, "world_size"_a, "master_addr"_a, "master_port"_a, "secret"_a = "",
           "timeout_s"_a = 60.0)
      .def_prop_ro("rank", &Bootstrap::rank)
      .def_prop_ro("world_size", &Bootstrap::world_size)
      .def("all_gather",
           [](Bootstrap& b, nb::bytes mine) {
             std::string blob(mine.c_str(), mine.size());
             std::vector<std::string> all;
             {
               nb::gil_scoped_release release;
               all = b.all_gather(blob);
             }
             nb::list out;
             for (auto& s : all) out.append(nb::bytes(s.data(), s.size()));
             return out;
           },
           "mine"_a, "Every rank's blob, indexed by rank.")
      .def("barrier", [](Bootstrap& b) {
        nb::gil_scoped_release release;
        b.barrier();
      });

  nb::class_<Group>(m, "Group", "The job's processes, one per GPU, and their symmetric heap. Create with interlace.init().")
      .def_prop_ro("rank", &Group::rank)
      .def_prop_ro("world_size", &Group::world_size)
      .def_prop_ro("local_rank", [](const Group& g) { return g.topology().local_rank; })
      .def_prop_ro("local_size", [](const Group& g) { return g.topology().local_size(); })
      .def_prop_ro("node", [](const Group& g) { return g.topology().node; })
      .def_prop_ro("num_nodes", [](const Group& g) { return g.topology().num_nodes; })
      .def_prop_ro("device", &Group::device)
      .def_prop_ro("heap_bytes", [](Group& g) { return g.heap().usable_bytes(); })
      .def_prop_ro("node_names", &Group::node_names)
      .def_prop_ro("cross_node", &Group::cross_node_backend)
      .def("_heap_offset",
           [](Group& g, nb::ndarray<nb::ro> t) {
             TensorView v = view_of(t);
             long long offset = g.heap().offset_of(v.data, v.nbytes());
             IL_CHECK(offset >= 0, "_heap_offset(): the tensor is not in the group's symmetric heap");
             return static_cast<uint64_t>(offset);
           },
           "tensor"_a)
      .def("_proxy_post",
           [](Group& g, int peer, uint64_t src_offset, uint64_t dst_offset, uint64_t bytes, uint64_t flag_offset,
              uint64_t add) {
             ProxyRequest r{};
             r.src_offset = src_offset;
             r.dst_offset = dst_offset;
             r.bytes = bytes;
             r.flag_offset = flag_offset;
             r.add = add;
             r.peer = peer;
             nb::gil_scoped_release release;
             g.post_from_host(r);
           },
           "peer"_a, "src_offset"_a, "dst_offset"_a, "bytes"_a, "flag_offset"_a, "add"_a,
           "Posts one write to the proxy FIFO from the host (tests): bytes of this rank's heap at src_offset to "
           "rank peer's heap at dst_offset, then add to the 64-bit flag at flag_offset there.")
      .def("check", [](Group& g) {
        nb::gil_scoped_release release;
        g.check();
      }, "Raises interlace.Error if the group is aborted (a dead rank, a device wait that timed out, ranks that called "
         "different ops, group.abort()), naming the rank, the op and the flag; or, once, if a kernel skipped an op call "
         "because another rank's call of it failed its checks. Call after synchronizing.")
      .def("abort", [](Group& g, const std::string& why) {
        nb::gil_scoped_release release;
        g.abort(why);
      }, "why"_a = "", "Aborts the group on every rank (like ncclCommAbort): running and queued kernels stop without "
         "touching peers, and every later call raises. It cannot be undone.")
      .def("barrier", [](Group& g) {
        nb::gil_scoped_release release;
        g.bootstrap().barrier();
      }, "Host barrier over all ranks (no GPU work).")
      .def("_empty",
           [](std::shared_ptr<Group> g, std::vector<size_t> shape, const std::string& dtype) {
             nb::dlpack::dtype dt = parse_dtype(dtype);
             size_t offset;
             {
               nb::gil_scoped_release release;
               offset = g->allocate(nbytes_of(shape, dt), "group.empty(" + dtype + ")");
             }
             return wrap(g, g->heap().local_base() + offset, shape, dt, offset);
           },
           "shape"_a, "dtype"_a)
      .def("_peer",
           [](std::shared_ptr<Group> g, nb::ndarray<nb::ro> t, int rank) {
             TensorView v = view_of(t);
             const Topology& topo = g->topology();
             int local = -1;
             for (int i = 0; i < topo.local_size(); ++i) {
               if (topo.local_ranks[i] == rank) local = i;
             }
             IL_CHECK(local >= 0, "peer(): rank ", rank, " is not on this node, so its memory is not mapped here");
             IL_CHECK(v.contiguous(), "peer(): the tensor must be contiguous");
             long long offset = g->heap().offset_of(v.data, v.nbytes());
             IL_CHECK(offset >= 0, "peer(): the tensor is not in the group's symmetric heap (allocate it with group.empty)");
             std::vector<size_t> shape(v.shape.begin(), v.shape.end());
             nb::dlpack::dtype dt{v.dtype.code, v.dtype.bits, static_cast<uint16_t>(v.dtype.lanes)};
             return wrap(g, g->heap().base(local) + offset, shape, dt, std::nullopt);
           },
           "tensor"_a, "rank"_a);

  m.def("_init",
        [](int rank, int world_size, std::string master_addr, int master_port, std::string secret, int device,
           size_t heap_bytes, double timeout_s, double heartbeat_timeout_s, double bootstrap_timeout_s,
           std::string node_name, std::string cross_node, double loopback_rate) {
          // Before the rendezvous: a bad option must not cost the other ranks a wait.
          check_cross_node_options(cross_node, loopback_rate);
          GroupOptions o;
          o.bootstrap.rank = rank;
          o.bootstrap.world_size = world_size;
          o.bootstrap.master_addr = std::move(master_addr);
          o.bootstrap.master_port = master_port;
          o.bootstrap.secret = std::move(secret);
          o.bootstrap.timeout_s = bootstrap_timeout_s;
          o.device = device;
          o.heap_bytes = heap_bytes;
          o.timeout_s = timeout_s;
          o.heartbeat_timeout_s = heartbeat_timeout_s;
          o.node_name = std::move(node_name);
          o.cross_node = std::move(cross_node);
          o.loopback_rate_bytes_per_s = loopback_rate;
          nb::gil_scoped_release release;
          return std::make_shared<Group>(o);
        },
        nb::kw_only(), "rank"_a, "world_size"_a, "master_addr"_a, "master_port"_a, "secret"_a, "device"_a,
        "heap_bytes"_a, "timeout_s"_a, "heartbeat_timeout_s"_a, "bootstrap_timeout_s"_a, "node_name"_a,
        "cross_node"_a = "auto", "loopback_rate"_a = 0.0);

  m.def("_check_cross_node_options", &check_cross_node_options, "cross_node"_a, "loopback_rate"_a,
        "Raises interlace.Error if cross_node or loopback_rate is not valid (what init checks first).");

  m.def("all_gather",
        [](nb::ndarray<> out, nb::ndarray<nb::ro> inp, Group& group, uintptr_t stream, int num_blocks,
           uint64_t chunk_bytes) {
          TensorView o = view_of(out), i = view_of(inp);
          nb::gil_scoped_release release;
          all_gather(group, o, i, reinterpret_cast<cudaStream_t>(stream), AllGatherTuning{num_blocks, chunk_bytes});
        },
        "out"_a.noconvert(), "inp"_a.noconvert(), "group"_a, nb::kw_only(), "stream"_a, "num_blocks"_a = 0,
        "chunk_bytes"_a = 0);

  m.def("reduce_scatter",
        [](nb::ndarray<> out, nb::ndarray<nb::ro> inp, Group& group, uintptr_t stream, int num_blocks,
           uint64_t chunk_bytes) {
          TensorView o = view_of(out), i = view_of(inp);
          nb::gil_scoped_release release;
          reduce_scatter(group, o, i, reinterpret_cast<cudaStream_t>(stream),
                         ReduceTuning{ReduceAlgorithm::kAuto, num_blocks, chunk_bytes});
        },
        "out"_a.noconvert(), "inp"_a.noconvert(), "group"_a, nb::kw_only(), "stream"_a, "num_blocks"_a = 0,
        "chunk_bytes"_a = 0);

  // algorithm: a ReduceAlgorithm (0 automatic, 2 one-shot, 3 two-shot); Python passes names.
  m.def("all_reduce",
        [](nb::ndarray<> out, nb::ndarray<nb::ro> inp, Group& group, uintptr_t stream, int algorithm, int num_blocks,
           uint64_t chunk_bytes) {
          TensorView o = view_of(out), i = view_of(inp);
          nb::gil_scoped_release release;
          all_reduce(group, o, i, reinterpret_cast<cudaStream_t>(stream),
                     ReduceTuning{static_cast<ReduceAlgorithm>(algorithm), num_blocks, chunk_bytes});
        },
        "out"_a.noconvert(), "inp"_a.noconvert(), "group"_a, nb::kw_only(), "stream"_a, "algorithm"_a = 0,
        "num_blocks"_a = 0, "chunk_bytes"_a = 0);

  m.def("ag_gemm",
        [](nb::ndarray<nb::ro> a_shard, nb::ndarray<nb::ro> b, nb::ndarray<> out, Group& group,
           std::optional<nb::ndarray<>> gathered, std::vector<int64_t> shard_rows, uintptr_t stream,
           int64_t chunk_rows, int band_m, int tile_n, bool pingpong, const std::string& transfer, int copy_ctas) {
          AgGemmTuning tuning{chunk_rows, band_m, tile_n, pingpong, ag_gemm_transfer_named(transfer), copy_ctas};
          TensorView va = view_of(a_shard), vb = view_of(b), vo = view_of(out);
          std::optional<TensorView> vg;
          if (gathered) vg = view_of(*gathered);
          nb::gil_scoped_release release;
          ag_gemm(group, va, vb, vo, vg ? &*vg : nullptr, shard_rows, reinterpret_cast<cudaStream_t>(stream),
                  tuning);
        },
        "a_shard"_a.noconvert(), "b"_a.noconvert(), "out"_a.noconvert(), "group"_a, nb::kw_only(),
        "gathered"_a.noconvert() = nb::none(), "shard_rows"_a = std::vector<int64_t>{}, "stream"_a,
        "chunk_rows"_a = 0, "band_m"_a = 0, "tile_n"_a = 0, "pingpong"_a = true, "transfer"_a = "auto",
        "copy_ctas"_a = 0);

  m.def("gemm_rs",
        [](nb::ndarray<nb::ro> a, nb::ndarray<nb::ro> b, nb::ndarray<> out, Group& group,
           std::vector<int64_t> shard_rows, uintptr_t stream, int band_m, int tile_n, bool pingpong, int reduce_ctas,
           int round_m) {
          GemmRsTuning tuning{band_m, tile_n, pingpong, reduce_ctas, round_m};
          TensorView va = view_of(a), vb = view_of(b), vo = view_of(out);
          nb::gil_scoped_release release;
          gemm_rs(group, va, vb, vo, shard_rows, reinterpret_cast<cudaStream_t>(stream), tuning);
        },
        "a"_a.noconvert(), "b"_a.noconvert(), "out"_a.noconvert(), "group"_a, nb::kw_only(),
        "shard_rows"_a = std::vector<int64_t>{}, "stream"_a, "band_m"_a = 0, "tile_n"_a = 0, "pingpong"_a = true,
        "reduce_ctas"_a = 0, "round_m"_a = 0);

  m.def("gemm_ar",
        [](nb::ndarray<nb::ro> a, nb::ndarray<nb::ro> b, nb::ndarray<> out, Group& group, uintptr_t stream,
           int band_m, int tile_n, bool pingpong, int reduce_ctas) {
          GemmRsTuning tuning{band_m, tile_n, pingpong, reduce_ctas};
          TensorView va = view_of(a), vb = view_of(b), vo = view_of(out);
          nb::gil_scoped_release release;
          gemm_ar(group, va, vb, vo, reinterpret_cast<cudaStream_t>(stream), tuning);
        },
        "a"_a.noconvert(), "b"_a.noconvert(), "out"_a.noconvert(), "group"_a, nb::kw_only(), "stream"_a,
        "band_m"_a = 0, "tile_n"_a = 0, "pingpong"_a = true, "reduce_ctas"_a = 0);

  m.def("gemm",
        [](nb::ndarray<nb::ro> a, nb::ndarray<nb::ro> b, nb::ndarray<> out, uintptr_t stream, int band_m, int tile_n,
           int cluster_m, bool pingpong) {
          TensorView va = view_of(a), vb = view_of(b), vo = view_of(out);
          nb::gil_scoped_release release;
          gemm(va, vb, vo, reinterpret_cast<cudaStream_t>(stream), GemmTuning{band_m, tile_n, cluster_m, pingpong});
        },
        "a"_a.noconvert(), "b"_a.noconvert(), "out"_a.noconvert(), nb::kw_only(), "stream"_a, "band_m"_a = 0,
        "tile_n"_a = 0, "cluster_m"_a = 0, "pingpong"_a = true);

  m.def("grouped_gemm",
        [](nb::ndarray<nb::ro> a, nb::ndarray<nb::ro> b, nb::ndarray<> out, nb::ndarray<nb::ro> rows,
           uintptr_t stream, int cluster_m, int tile_n, int swap) {
          TensorView va = view_of(a), vb = view_of(b), vo = view_of(out), vr = view_of(rows);
          nb::gil_scoped_release release;
          grouped_gemm(va, vb, vo, vr, reinterpret_cast<cudaStream_t>(stream),
                       GroupedGemmTuning{cluster_m, tile_n, swap});
        },
        "a"_a.noconvert(), "b"_a.noconvert(), "out"_a.noconvert(), "rows"_a.noconvert(), nb::kw_only(), "stream"_a,
        "cluster_m"_a = 0, "tile_n"_a = 0, "swap"_a = 0);

  m.def("attention",
        [](nb::ndarray<nb::ro> q, nb::ndarray<nb::ro> k, nb::ndarray<nb::ro> v, nb::ndarray<> out,
           std::optional<nb::ndarray<>> lse, bool causal, double softmax_scale, uintptr_t stream) {
          TensorView vq = view_of(q), vk = view_of(k), vv = view_of(v), vo = view_of(out);
          std::optional<TensorView> vl;
          if (lse) vl = view_of(*lse);
          nb::gil_scoped_release release;
          attention(vq, vk, vv, vo, vl ? &*vl : nullptr, causal, softmax_scale, reinterpret_cast<cudaStream_t>(stream));
        },
        "q"_a.noconvert(), "k"_a.noconvert(), "v"_a.noconvert(), "out"_a.noconvert(), nb::kw_only(),
        "lse"_a.noconvert() = nb::none(), "causal"_a = false, "softmax_scale"_a = 0.0, "stream"_a);

  m.def("ring_attention",
        [](nb::ndarray<nb::ro> q, nb::ndarray<nb::ro> k, nb::ndarray<nb::ro> v, nb::ndarray<> out, Group& group,
           std::optional<nb::ndarray<>> lse, bool causal, double softmax_scale, int64_t seq_len, uintptr_t stream,
           int sender_ctas) {
          TensorView vq = view_of(q), vk = view_of(k), vv = view_of(v), vo = view_of(out);
          std::optional<TensorView> vl;
          if (lse) vl = view_of(*lse);
          nb::gil_scoped_release release;
          ring_attention(group, vq, vk, vv, vo, vl ? &*vl : nullptr, causal, softmax_scale, seq_len,
                         reinterpret_cast<cudaStream_t>(stream), sender_ctas);
        },
        "q"_a.noconvert(), "k"_a.noconvert(), "v"_a.noconvert(), "out"_a.noconvert(), "group"_a, nb::kw_only(),
        "lse"_a.noconvert() = nb::none(), "causal"_a = false, "softmax_scale"_a = 0.0, "seq_len"_a = 0, "stream"_a,
        "sender_ctas"_a = 0);

  // MoE: a handle per shape (its workspace in the heap), then dispatch / combine with it. capacity_kind:
  // a MoeCapacityKind (0 per expert, 1 per rank); Python passes names.
  nb::class_<MoeHandle>(m, "MoeHandle",
                        "What a moe_dispatch leaves for its combine: receive rows, slot metadata, counts (device "
                        "memory in the group's heap). Make with interlace.MoeHandle.")
      .def_prop_ro("world_size", [](const MoeHandle& h) { return h.shape().world; })
      .def_prop_ro("num_experts", [](const MoeHandle& h) { return h.shape().experts; })
      .def_prop_ro("topk", [](const MoeHandle& h) { return h.shape().topk; })
      .def_prop_ro("hidden", &MoeHandle::hidden)
      .def_prop_ro("max_tokens", [](const MoeHandle& h) { return h.shape().tokens; })
      .def_prop_ro("capacity", [](const MoeHandle& h) { return h.shape().capacity; })
      .def_prop_ro("capacity_kind", [](const MoeHandle& h) { return static_cast<int>(h.shape().capacity_kind); })
      .def_prop_ro("recv_rows", [](const MoeHandle& h) { return h.plan().recv_rows; })
      .def_prop_ro("tokens", &MoeHandle::tokens)
      .def_prop_ro("expert_x", [](nb::handle_t<MoeHandle> self) {
        return view_owned_by(self, nb::inst_ptr<MoeHandle>(self)->expert_x());
      })
      .def_prop_ro("counts", [](nb::handle_t<MoeHandle> self) {
        return view_owned_by(self, nb::inst_ptr<MoeHandle>(self)->counts());
      })
      .def_prop_ro("slots", [](nb::handle_t<MoeHandle> self) {
        return view_owned_by(self, nb::inst_ptr<MoeHandle>(self)->slots());
      })
      .def_prop_ro("expert_starts", [](nb::handle_t<MoeHandle> self) {
        return view_owned_by(self, nb::inst_ptr<MoeHandle>(self)->expert_starts());
      })
      .def_prop_ro("expert_rows", [](nb::handle_t<MoeHandle> self) {
        return view_owned_by(self, nb::inst_ptr<MoeHandle>(self)->expert_rows());
      });

  m.def("_moe_handle",
        [](Group& group, int64_t experts, int topk, int64_t hidden, int64_t max_tokens, int64_t capacity,
           int capacity_kind) {
          const MoeShape shape = moe_shape(group.world_size(), experts, topk, hidden, max_tokens, capacity, capacity_kind);
          nb::gil_scoped_release release;
          return std::make_shared<MoeHandle>(group, shape);
        },
        "group"_a, nb::kw_only(), "experts"_a, "topk"_a, "hidden"_a, "max_tokens"_a, "capacity"_a, "capacity_kind"_a,
        nb::keep_alive<0, 1>(), "Collective: a MoeHandle with its workspace in the group's heap.");

  m.def("moe_dispatch",
        [](nb::ndarray<nb::ro> x, nb::ndarray<nb::ro> topk_idx, nb::ndarray<nb::ro> topk_weights, MoeHandle& handle,
           Group& group, uintptr_t stream) {
          TensorView vx = view_of(x), vi = view_of(topk_idx), vw = view_of(topk_weights);
          nb::gil_scoped_release release;
          moe_dispatch(group, handle, vx, vi, vw, reinterpret_cast<cudaStream_t>(stream));
        },
        "x"_a.noconvert(), "topk_idx"_a.noconvert(), "topk_weights"_a.noconvert(), "handle"_a, "group"_a,
        nb::kw_only(), "stream"_a);

  m.def("moe_combine",
        [](nb::ndarray<nb::ro> expert_out, nb::ndarray<> out, MoeHandle& handle, Group& group, uintptr_t stream) {
          TensorView ve = view_of(expert_out), vo = view_of(out);
          nb::gil_scoped_release release;
          moe_combine(group, handle, ve, vo, reinterpret_cast<cudaStream_t>(stream));
        },
        "expert_out"_a.noconvert(), "out"_a.noconvert(), "handle"_a, "group"_a, nb::kw_only(), "stream"_a);

  m.def("moe_dispatch_gemm",
        [](nb::ndarray<nb::ro> x, nb::ndarray<nb::ro> topk_idx, nb::ndarray<nb::ro> topk_weights,
           nb::ndarray<nb::ro> w, nb::ndarray<> out, MoeHandle& handle, Group& group, uintptr_t stream, int cluster_m,
           int tile_n, int swap, int copy_ctas) {
          TensorView vx = view_of(x), vi = view_of(topk_idx), vt = view_of(topk_weights), vw = view_of(w),
                     vo = view_of(out);
          nb::gil_scoped_release release;
          moe_dispatch_gemm(group, handle, vx, vi, vt, vw, vo, reinterpret_cast<cudaStream_t>(stream),
                            GroupedGemmTuning{cluster_m, tile_n, swap}, copy_ctas);
        },
        "x"_a.noconvert(), "topk_idx"_a.noconvert(), "topk_weights"_a.noconvert(), "w"_a.noconvert(),
        "out"_a.noconvert(), "handle"_a, "group"_a, nb::kw_only(), "stream"_a, "cluster_m"_a = 0, "tile_n"_a = 0,
        "swap"_a = 0, "copy_ctas"_a = 0);

  m.def("moe_gemm_combine",
        [](nb::ndarray<nb::ro> act, nb::ndarray<nb::ro> w, nb::ndarray<> out, MoeHandle& handle, Group& group,
           uintptr_t stream, int cluster_m, int tile_n) {
          TensorView va = view_of(act), vw = view_of(w), vo = view_of(out);
          nb::gil_scoped_release release;
          moe_gemm_combine(group, handle, va, vw, vo, reinterpret_cast<cudaStream_t>(stream),
                           GroupedGemmTuning{cluster_m, tile_n});
        },
        "act"_a.noconvert(), "w"_a.noconvert(), "out"_a.noconvert(), "handle"_a, "group"_a, nb::kw_only(), "stream"_a,
        "cluster_m"_a = 0, "tile_n"_a = 0);

  m.def("_check_moe_dispatch_args",
        [](nb::ndarray<nb::ro> x, nb::ndarray<nb::ro> topk_idx, nb::ndarray<nb::ro> topk_weights, int64_t experts,
           int64_t capacity, int capacity_kind, int64_t max_tokens, int world_size, int device) {
          MoeDispatchOptions o{experts, capacity, static_cast<MoeCapacityKind>(capacity_kind), max_tokens};
          MoeShape s = check_moe_dispatch_args(view_of(x), view_of(topk_idx), view_of(topk_weights), o, world_size,
                                               device);
          return nb::make_tuple(s.experts, s.topk, s.row_bytes / 2, s.tokens, s.capacity);
        },
        "x"_a.noconvert(), "topk_idx"_a.noconvert(), "topk_weights"_a.noconvert(), nb::kw_only(), "experts"_a,
        "capacity"_a, "capacity_kind"_a, "max_tokens"_a, "world_size"_a, "device"_a,
        "The checks moe_dispatch makes before any GPU work, without a group (for tests): returns (experts, topk, "
        "hidden, max_tokens, capacity).");

  m.def("_check_moe_combine_args",
        [](nb::ndarray<nb::ro> expert_out, nb::ndarray<> out, int world_size, int64_t experts, int topk, int64_t hidden,
           int64_t max_tokens, int64_t capacity, int capacity_kind, int64_t tokens, int device) {
          const MoePlan plan =
              make_moe_plan(moe_shape(world_size, experts, topk, hidden, max_tokens, capacity, capacity_kind));
          check_moe_combine_args(view_of(expert_out), view_of(out), plan, tokens, device);
        },
        "expert_out"_a.noconvert(), "out"_a.noconvert(), nb::kw_only(), "world_size"_a, "experts"_a, "topk"_a,
        "hidden"_a, "max_tokens"_a, "capacity"_a, "capacity_kind"_a, "tokens"_a, "device"_a,
        "The checks moe_combine makes before any GPU work, without a group (for tests).");

  m.def("_check_moe_dispatch_gemm_args",
        [](nb::ndarray<nb::ro> w, nb::ndarray<> out, nb::ndarray<nb::ro> expert_x, nb::ndarray<nb::ro> rows,
           int world_size, int64_t experts, int topk, int64_t hidden, int64_t max_tokens, int64_t capacity,
           int capacity_kind, int device) {
          const MoePlan plan =
              make_moe_plan(moe_shape(world_size, experts, topk, hidden, max_tokens, capacity, capacity_kind));
          const GroupedGemmProblem p =
              check_moe_dispatch_gemm_args(view_of(w), view_of(out), view_of(expert_x), view_of(rows), plan, device);
          return nb::make_tuple(p.groups, p.capacity, p.k, p.n, p.b_k_major);
        },
        "w"_a.noconvert(), "out"_a.noconvert(), "expert_x"_a.noconvert(), "rows"_a.noconvert(), nb::kw_only(),
        "world_size"_a, "experts"_a, "topk"_a, "hidden"_a, "max_tokens"_a, "capacity"_a, "capacity_kind"_a,
        "device"_a,
        "The checks moe_dispatch_gemm makes of its GEMM before any GPU work, without a group (for tests): returns "
        "the grouped GEMM's (experts, capacity, hidden, N, w K-contiguous).");

  m.def("_check_moe_gemm_combine_args",
        [](nb::ndarray<nb::ro> act, nb::ndarray<nb::ro> w, nb::ndarray<> out, nb::ndarray<nb::ro> rows, int world_size,
           int64_t experts, int topk, int64_t hidden, int64_t max_tokens, int64_t capacity, int capacity_kind,
           int64_t tokens, int device) {
          const MoePlan plan =
              make_moe_plan(moe_shape(world_size, experts, topk, hidden, max_tokens, capacity, capacity_kind));
          const GroupedGemmProblem p =
              check_moe_gemm_combine_args(view_of(act), view_of(w), view_of(out), view_of(rows), plan, tokens, device);
          return nb::make_tuple(p.groups, p.capacity, p.k, p.n, p.b_k_major);
        },
        "act"_a.noconvert(), "w"_a.noconvert(), "out"_a.noconvert(), "rows"_a.noconvert(), nb::kw_only(),
        "world_size"_a, "experts"_a, "topk"_a, "hidden"_a, "max_tokens"_a, "capacity"_a, "capacity_kind"_a,
        "tokens"_a, "device"_a,
        "The checks moe_gemm_combine makes before any GPU work, without a group (for tests): returns the grouped "
        "GEMM's (experts, capacity, F, hidden, w K-contiguous).");

  m.def("_ring_attention_ranges",
        [](int64_t seq, int world_size) {
          // Per rank, its two halves (chunk r, then chunk 2W-1-r) as (global start, sharded start, rows):
          // the plan's zigzag, so that shard and unshard agree with the kernels by construction.
          make_ring_attention_plan(world_size, 0, seq, true, 1, 1);  // raises on a bad world size or length
          std::vector<std::vector<int64_t>> ranks;
          for (int r = 0; r < world_size; ++r) {
            const RingAttentionPlan plan = make_ring_attention_plan(world_size, r, seq, true, 1, 1);
            std::vector<int64_t> halves;
            for (int h = 0; h < 2; ++h) {
              const RingChunkRange c = plan.range(r, h);
              halves.insert(halves.end(), {c.global_start, c.sharded_start, c.rows});
            }
            ranks.push_back(halves);
          }
          return ranks;
        },
        "seq"_a, "world_size"_a);

  m.def("_moe_no_drop_capacity",
        [](int world_size, int64_t experts, int topk, int64_t max_tokens, int capacity_kind) {
          return moe_no_drop_capacity(moe_shape(world_size, experts, topk, 8, max_tokens, 1, capacity_kind));
        },
        nb::kw_only(), "world_size"_a, "experts"_a, "topk"_a, "max_tokens"_a, "capacity_kind"_a);

  m.def("_check_gemm_args",
        [](nb::ndarray<nb::ro> a, nb::ndarray<nb::ro> b, nb::ndarray<> out, int device) {
          GemmProblem p = check_gemm_args(view_of(a), view_of(b), view_of(out), device);
          return nb::make_tuple(p.m, p.n, p.k, p.b_k_major);
        },
        "a"_a.noconvert(), "b"_a.noconvert(), "out"_a.noconvert(), nb::kw_only(), "device"_a,
        "The checks gemm makes before any GPU work, without a GPU (for tests): returns (M, N, K, b_k_major).");

  m.def("_check_grouped_gemm_args",
        [](nb::ndarray<nb::ro> a, nb::ndarray<nb::ro> b, nb::ndarray<> out, nb::ndarray<nb::ro> rows, int device) {
          GroupedGemmProblem p = check_grouped_gemm_args(view_of(a), view_of(b), view_of(out), view_of(rows), device);
          return nb::make_tuple(p.groups, p.capacity, p.n, p.k, p.b_k_major);
        },
        "a"_a.noconvert(), "b"_a.noconvert(), "out"_a.noconvert(), "rows"_a.noconvert(), nb::kw_only(), "device"_a,
        "The checks grouped_gemm makes before any GPU work, without a GPU (for tests): returns (G, C, N, K, "
        "b_k_major).");

  m.def("_check_attention_args",
        [](nb::ndarray<nb::ro> q, nb::ndarray<nb::ro> k, nb::ndarray<nb::ro> v, nb::ndarray<> out,
           std::optional<nb::ndarray<>> lse, bool causal, double softmax_scale, int device) {
          std::optional<TensorView> vl;
          if (lse) vl = view_of(*lse);
          AttentionProblem p = check_attention_args(view_of(q), view_of(k), view_of(v), view_of(out), vl ? &*vl : nullptr,
                                                    causal, softmax_scale, device);
          return nb::make_tuple(p.batch, p.seq_q, p.seq_k, p.heads_q, p.heads_kv, p.head_dim, p.softmax_scale);
        },
        "q"_a.noconvert(), "k"_a.noconvert(), "v"_a.noconvert(), "out"_a.noconvert(), nb::kw_only(),
        "lse"_a.noconvert() = nb::none(), "causal"_a = false, "softmax_scale"_a = 0.0, "device"_a,
        "The checks attention makes before any GPU work, without a GPU (for tests): returns (B, S_q, S_k, Hq, Hkv, "
        "D, softmax_scale).");

  m.def("_check_all_gather_args",
        [](nb::ndarray<> out, nb::ndarray<nb::ro> inp, int world_size, int device) {
          check_all_gather_args(view_of(out), view_of(inp), world_size, device);
        },
        "out"_a.noconvert(), "inp"_a.noconvert(), nb::kw_only(), "world_size"_a, "device"_a,
        "The checks all_gather makes before any GPU work, without a group (for tests).");

  m.def("_check_reduce_scatter_args",
        [](nb::ndarray<> out, nb::ndarray<nb::ro> inp, int world_size, int device) {
          check_reduce_scatter_args(view_of(out), view_of(inp), world_size, device);
        },
        "out"_a.noconvert(), "inp"_a.noconvert(), nb::kw_only(), "world_size"_a, "device"_a,
        "The checks reduce_scatter makes before any GPU work, without a group (for tests).");

  m.def("_check_all_reduce_args",
        [](nb::ndarray<> out, nb::ndarray<nb::ro> inp, int device) {
          check_all_reduce_args(view_of(out), view_of(inp), device);
        },
        "out"_a.noconvert(), "inp"_a.noconvert(), nb::kw_only(), "device"_a,
        "The checks all_reduce makes before any GPU work, without a group (for tests).");

  register_xla_ffi(m);
}
