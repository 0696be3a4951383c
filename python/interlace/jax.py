"""JAX adapter. JAX arrays are immutable, so ops return new arrays instead of writing into
arguments. Every op is an XLA FFI custom call (jax.ffi.ffi_call to a handler compiled into the
native module, python/interlace/xla_ffi.cc): under jax.jit it runs on XLA's stream, on XLA's own
buffers, with no copies and no host synchronization; called eagerly, JAX compiles and runs the same
call. The handlers are registered with XLA for the CUDA platform on first use.

The group reaches a handler as group.handle, an integer attribute of the call; the handler finds the
native group by it (registered here when the op is traced). Outputs are ordinary XLA buffers, not
in the symmetric heap, so all_gather takes its staged path and all_reduce its non-symmetric one.

    y = interlace.jax.all_gather(x, group)          # [world * rows, ...]
    s = interlace.jax.reduce_scatter(x, group)      # [rows / world, ...], summed over ranks
    t = interlace.jax.all_reduce(x, group)          # x's shape, summed over ranks
    c = interlace.jax.gemm(a, b)                    # a @ b
    h = interlace.jax.grouped_gemm(x, w, rows)      # h[g, :rows[g]] = x[g, :rows[g]] @ w[g], the rest zeros
    z = interlace.jax.ag_gemm(x, w, group)          # all_gather(x) @ w in one launch
    moe = interlace.jax.MoeBuffers(group, num_experts=64, topk=2, hidden=4096, max_tokens=512, capacity=1024)
    ex, starts, rows = interlace.jax.moe_dispatch(x, topk_idx, topk_weights, moe)  # per expert: rows of ex
    h, starts, rows = interlace.jax.moe_dispatch_gemm(x, topk_idx, topk_weights, w1, moe)  # ex @ w1[l], one launch
    y = interlace.jax.moe_combine(expert_out, moe, tokens=x.shape[0])             # back home, weighted sum
    y = interlace.jax.moe_gemm_combine(act, w2, moe, tokens=x.shape[0])           # act @ w2[l], then as moe_combine
    o, lse = interlace.jax.attention(q, k, v, causal=True)              # [B, S, H, D] on one GPU
    o, lse = interlace.jax.ring_attention(q, k, v, group, causal=True)  # this rank's zigzag shard of a sequence

The MoE ops keep their state in a MoeBuffers (its interlace.MoeHandle, in the group's heap, where peers
write the receive rows); moe_dispatch copies the rows it received into its XLA output, and
moe_combine reads what the last moe_dispatch with the same buffers left. A combine follows its own
dispatch by data, but nothing orders a second dispatch after the first pair's combine: give every
dispatch/combine pair of one jitted function its own MoeBuffers (one per layer and micro-batch).
"""
import itertools as _itertools

import numpy as _np

import jax as _jax
import jax.numpy as _jnp

import interlace as _interlace
from interlace import _interlace as _C
from interlace._group import native as _native

# The custom-call target names; the handlers register under these for platform "CUDA".
TARGETS = ("interlace_all_gather", "interlace_gemm", "interlace_grouped_gemm", "interlace_ag_gemm",
           "interlace_gemm_rs", "interlace_gemm_ar", "interlace_reduce_scatter", "interlace_all_reduce",
           "interlace_moe_dispatch", "interlace_moe_combine", "interlace_moe_dispatch_gemm",
           "interlace_moe_gemm_combine", "interlace_attention", "interlace_ring_attention")

# all_reduce's algorithm names, as interlace.all_reduce takes them (ReduceAlgorithm's values).
_REDUCE_ALGORITHMS = {"auto": 0, "one_shot": 2, "two_shot": 3}

_registered = False


def _register():
    global _registered
    if not _registered:
        for name, capsule in _C._xla_ffi_handlers().items():
            _jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
        _registered = True


def _group_handle(group) -> _np.int64:
    native = _native(group)  # raises TypeError unless group is an interlace.Group
    _C._register_xla_group(group.handle, native)
    return _np.int64(group.handle)


def all_gather(x, group, *, num_blocks=0, chunk_bytes=0) -> "_jax.Array":
    """Every rank's x concatenated along axis 0 (shape [world * x.shape[0], *x.shape[1:]]).
    Works eagerly and under jax.jit; every rank must make the same call."""
    _register()
    handle = _group_handle(group)
    shape = (group.world_size * x.shape[0],) + tuple(x.shape[1:]) if x.ndim else (group.world_size,)
    call = _jax.ffi.ffi_call("interlace_all_gather", _jax.ShapeDtypeStruct(shape, x.dtype))
    return call(x, group=handle, num_blocks=_np.int64(num_blocks), chunk_bytes=_np.int64(chunk_bytes))


def reduce_scatter(x, group, *, num_blocks=0, chunk_bytes=0) -> "_jax.Array":
    """This rank's block of the sum over ranks of x: x is world blocks along axis 0 ([world * n, ...]),
    and rank r gets [n, ...], the sum of every rank's block r. float16, bfloat16 or float32, summed in
    fp32 in rank order and rounded once (the same bits on every run); a block's bytes a multiple of
    16. Works eagerly and under jax.jit; every rank must make the same call. Tuning as in
    interlace.reduce_scatter."""
    _register()
    handle = _group_handle(group)
    if x.ndim < 1 or x.shape[0] % group.world_size:
        raise ValueError(f"interlace.jax.reduce_scatter: x {tuple(x.shape)} is not {group.world_size} blocks "
                         "along axis 0")
    shape = (x.shape[0] // group.world_size,) + tuple(x.shape[1:])
    call = _jax.ffi.ffi_call("interlace_reduce_scatter", _jax.ShapeDtypeStruct(shape, x.dtype))
    return call(x, group=handle, num_blocks=_np.int64(num_blocks), chunk_bytes=_np.int64(chunk_bytes))


def all_reduce(x, group, *, algorithm="auto", num_blocks=0, chunk_bytes=0) -> "_jax.Array":
    """The sum over ranks of x (same shape and dtype), the same bits on every rank and every run
    (float16, bfloat16 or float32, summed in fp32 in rank order, rounded once). algorithm: "auto",
    "one_shot" or "two_shot", as in interlace.all_reduce. Works eagerly and under jax.jit; every rank
    must make the same call. The result is a new XLA buffer (never x's)."""
    _register()
    handle = _group_handle(group)
    if algorithm not in _REDUCE_ALGORITHMS:
        raise ValueError(f"interlace.jax.all_reduce: algorithm must be one of {', '.join(_REDUCE_ALGORITHMS)}, "
                         f"got {algorithm!r}")
    call = _jax.ffi.ffi_call("interlace_all_reduce", _jax.ShapeDtypeStruct(tuple(x.shape), x.dtype))
    return call(x, group=handle, algorithm=_np.int64(_REDUCE_ALGORITHMS[algorithm]), num_blocks=_np.int64(num_blocks),
                chunk_bytes=_np.int64(chunk_bytes))


def gemm(a, b, *, band_m=0, tile_n=0, cluster_m=0, pingpong=True) -> "_jax.Array":
    """a[M, K] @ b[K, N] on one GPU with interlace's Hopper engine (bf16 or fp16, fp32 accumulation,
    result in the input dtype; K and N multiples of 8). Tuning as in interlace.gemm."""
    _register()
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"interlace.jax.gemm: a and b must be 2-D, got shapes {a.shape} and {b.shape}")
    call = _jax.ffi.ffi_call("interlace_gemm", _jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype))
    return call(a, b, band_m=_np.int64(band_m), tile_n=_np.int64(tile_n), cluster_m=_np.int64(cluster_m),
                pingpong=_np.int64(bool(pingpong)))


def grouped_gemm(a, b, rows, *, cluster_m=0) -> "_jax.Array":
    """G GEMMs in one launch (see interlace.grouped_gemm): out[g, :r_g] = a[g, :r_g] @ b[g] with
    r_g = min(rows[g], C) read on the GPU (no host sync), a [G, C, K], b [G, K, N], rows int32 [G];
    out is [G, C, N] in a's dtype (bf16 or fp16, fp32 accumulation; K and N multiples of 8). Rows of
    out at or past r_g are zeros: the handler zero-fills out (a cudaMemsetAsync on XLA's stream, out's
    bytes) before the kernel, which writes only the first r_g rows of each group. b is row-major as
    every XLA buffer: Linear weights w [G, N, K] go in as jnp.swapaxes(w, 1, 2), which XLA transposes.
    cluster_m as in interlace.grouped_gemm."""
    _register()
    if a.ndim != 3 or b.ndim != 3 or rows.ndim != 1:
        raise ValueError(f"interlace.jax.grouped_gemm: a and b must be 3-D and rows 1-D, got shapes {a.shape}, "
                         f"{b.shape} and {rows.shape}")
    if b.shape[0] != a.shape[0] or b.shape[1] != a.shape[2] or rows.shape[0] != a.shape[0]:
        raise ValueError(f"interlace.jax.grouped_gemm: a {tuple(a.shape)}, b {tuple(b.shape)} and rows "
                         f"{tuple(rows.shape)} are not [G, C, K], [G, K, N] and [G]")
    if rows.dtype != _jnp.int32:
        raise ValueError(f"interlace.jax.grouped_gemm: rows must be int32, got {rows.dtype}")
    call = _jax.ffi.ffi_call("interlace_grouped_gemm",
                             _jax.ShapeDtypeStruct((a.shape[0], a.shape[1], b.shape[2]), a.dtype))
    return call(a, b, rows, cluster_m=_np.int64(cluster_m))


def gemm_rs(a, b, group, *, shard_rows=None, band_m=0, tile_n=0, pingpong=True, reduce_ctas=0) -> "_jax.Array":
    """This rank's rows of the sum over ranks of a[M, K_r] @ b[K_r, N] (K split across ranks), in one
    launch. shard_rows: every rank's output rows, the same list on every rank (default: even blocks).
    Tuning as in interlace.gemm_rs."""
    _register()
    handle = _group_handle(group)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"interlace.jax.gemm_rs: a and b must be 2-D, got shapes {a.shape} and {b.shape}")
    rows = [] if shard_rows is None else [int(r) for r in shard_rows]
    mine = rows[group.rank] if rows else a.shape[0] // group.world_size
    call = _jax.ffi.ffi_call("interlace_gemm_rs", _jax.ShapeDtypeStruct((mine, b.shape[1]), a.dtype))
    return call(a, b, group=handle, shard_rows=_np.asarray(rows, dtype=_np.int64), band_m=_np.int64(band_m),
                tile_n=_np.int64(tile_n), pingpong=_np.int64(bool(pingpong)), reduce_ctas=_np.int64(reduce_ctas))


def gemm_ar(a, b, group, *, band_m=0, tile_n=0, pingpong=True, reduce_ctas=0) -> "_jax.Array":
    """The sum over ranks of a[M, K_r] @ b[K_r, N] (K split across ranks) on every rank, in one launch.
    Tuning as in interlace.gemm_ar."""
    _register()
    handle = _group_handle(group)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"interlace.jax.gemm_ar: a and b must be 2-D, got shapes {a.shape} and {b.shape}")
    call = _jax.ffi.ffi_call("interlace_gemm_ar", _jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype))
    return call(a, b, group=handle, band_m=_np.int64(band_m), tile_n=_np.int64(tile_n),
                pingpong=_np.int64(bool(pingpong)), reduce_ctas=_np.int64(reduce_ctas))


def ag_gemm(a_shard, b, group, *, shard_rows=None, chunk_rows=0, band_m=0, tile_n=0, pingpong=True) -> "_jax.Array":
    """A[M, K] @ b[K, N], where A is every rank's a_shard ([M_r, K]) stacked in rank order, in one
    launch (the shards travel while the GEMM computes). shard_rows: every rank's M_r, the same list on
    every rank (default: even shards). Tuning as in interlace.ag_gemm."""
    _register()
    handle = _group_handle(group)
    if a_shard.ndim != 2 or b.ndim != 2:
        raise ValueError(f"interlace.jax.ag_gemm: a_shard and b must be 2-D, got shapes {a_shard.shape} and {b.shape}")
    rows = [] if shard_rows is None else [int(r) for r in shard_rows]
    m = sum(rows) if rows else group.world_size * a_shard.shape[0]
    call = _jax.ffi.ffi_call("interlace_ag_gemm", _jax.ShapeDtypeStruct((m, b.shape[1]), a_shard.dtype))
    return call(a_shard, b, group=handle, shard_rows=_np.asarray(rows, dtype=_np.int64),
                chunk_rows=_np.int64(chunk_rows), band_m=_np.int64(band_m), tile_n=_np.int64(tile_n),
                pingpong=_np.int64(bool(pingpong)))


_next_moe_handle = _itertools.count(1)


class MoeBuffers:
    """A MoE layer's interlace.MoeHandle for the JAX ops (collective to make, as the handle): the
    handlers find it by an integer handle, registered here (weakly: it lives as long as this object).
    Arguments as interlace.MoeHandle's; native is the handle. One per dispatch/combine pair in a
    jitted function (see the module's docstring)."""

    def __init__(self, group, *, num_experts, topk, hidden, max_tokens, capacity, capacity_kind="per_expert"):
        import interlace
        self.native = interlace.MoeHandle(group, num_experts=num_experts, topk=topk, hidden=hidden,
                                          max_tokens=max_tokens, capacity=capacity, capacity_kind=capacity_kind)
        self.group = group
        self.handle = next(_next_moe_handle)
        _C._register_xla_moe(self.handle, self.native)


def moe_dispatch(x, topk_idx, topk_weights, buffers):
    """interlace.moe_dispatch with buffers' handle: returns (expert_x [recv_rows, hidden] bf16,
    expert_starts [L] int32, expert_rows [L] int32), local expert l's rows being
    expert_x[expert_starts[l]:expert_starts[l] + expert_rows[l]] (L = num_experts / world). x [T,
    hidden] bf16, topk_idx [T, k] int32 or int64, topk_weights [T, k] float32."""
    _register()
    handle = _group_handle(buffers.group)
    native = buffers.native
    experts_per_rank = native.num_experts // native.world_size
    call = _jax.ffi.ffi_call("interlace_moe_dispatch",
                             (_jax.ShapeDtypeStruct((native.recv_rows, native.hidden), _jnp.bfloat16),
                              _jax.ShapeDtypeStruct((experts_per_rank,), _jnp.int32),
                              _jax.ShapeDtypeStruct((experts_per_rank,), _jnp.int32)))
    return call(x, topk_idx, topk_weights, group=handle, moe=_np.int64(buffers.handle))


def moe_combine(expert_out, buffers, *, tokens) -> "_jax.Array":
    """interlace.moe_combine with buffers' handle: [tokens, hidden] bf16, each token's weighted sum of
    its experts' rows of expert_out (expert_x's layout), tokens being this rank's x.shape[0] in the
    last moe_dispatch with these buffers."""
    _register()
    handle = _group_handle(buffers.group)
    call = _jax.ffi.ffi_call("interlace_moe_combine",
                             _jax.ShapeDtypeStruct((tokens, expert_out.shape[1]), _jnp.bfloat16))
    return call(expert_out, group=handle, moe=_np.int64(buffers.handle))


def moe_dispatch_gemm(x, topk_idx, topk_weights, w, buffers, *, cluster_m=0):
    """interlace.moe_dispatch_gemm with buffers' handle: moe_dispatch and the experts' first matmul in
    one launch. Returns (out [recv_rows, N] bf16, expert_starts [L] int32, expert_rows [L] int32):
    local expert l's rows of out, out[expert_starts[l]:expert_starts[l] + expert_rows[l]], are its
    received rows @ w[l]; out's other rows are unset. x, topk_idx and topk_weights as moe_dispatch's;
    w [L, hidden, N] bf16, row-major as every XLA buffer (Linear weights [L, N, hidden] go in as
    jnp.swapaxes(w, 1, 2), which XLA transposes: a copy). buffers' capacity_kind must be "per_expert"
    and top-k at most 32; moe_combine and moe_gemm_combine follow as after moe_dispatch. cluster_m as
    in interlace.grouped_gemm."""
    _register()
    handle = _group_handle(buffers.group)
    native = buffers.native
    if w.ndim != 3 or w.shape[1] != native.hidden:
        raise ValueError(f"interlace.jax.moe_dispatch_gemm: w {tuple(w.shape)} is not [L, hidden, N] with hidden "
                         f"{native.hidden}")
    if w.dtype != _jnp.bfloat16:
        raise ValueError(f"interlace.jax.moe_dispatch_gemm: w must be bfloat16, got {w.dtype}")
    experts_per_rank = native.num_experts // native.world_size
    call = _jax.ffi.ffi_call("interlace_moe_dispatch_gemm",
                             (_jax.ShapeDtypeStruct((native.recv_rows, w.shape[2]), _jnp.bfloat16),
                              _jax.ShapeDtypeStruct((experts_per_rank,), _jnp.int32),
                              _jax.ShapeDtypeStruct((experts_per_rank,), _jnp.int32)))
    return call(x, topk_idx, topk_weights, w, group=handle, moe=_np.int64(buffers.handle),
                cluster_m=_np.int64(cluster_m))


def moe_gemm_combine(act, w, buffers, *, tokens, cluster_m=0) -> "_jax.Array":
    """interlace.moe_gemm_combine with buffers' handle: the experts' second matmul and moe_combine in
    one launch, [tokens, H] bf16 (tokens as in moe_combine), the same bits as grouped_gemm into an
    expert_out then moe_combine. act [recv_rows, F] bf16 in expert_x's layout (F: the FFN width); w
    [L, F, H] bf16, row-major as every XLA buffer: Linear weights [L, H, F] go in as
    jnp.swapaxes(w, 1, 2), which XLA transposes (a copy; keep w as [L, F, H] to avoid it). buffers'
    capacity_kind must be "per_expert". cluster_m as in interlace.grouped_gemm."""
    _register()
    handle = _group_handle(buffers.group)
    if act.ndim != 2 or w.ndim != 3 or w.shape[1] != act.shape[1]:
        raise ValueError(f"interlace.jax.moe_gemm_combine: act {tuple(act.shape)} and w {tuple(w.shape)} are not "
                         "[recv_rows, F] and [L, F, H]")
    if act.dtype != _jnp.bfloat16 or w.dtype != _jnp.bfloat16:
        raise ValueError(f"interlace.jax.moe_gemm_combine: act and w must be bfloat16, got {act.dtype} and {w.dtype}")
    call = _jax.ffi.ffi_call("interlace_moe_gemm_combine",
                             _jax.ShapeDtypeStruct((tokens, w.shape[2]), _jnp.bfloat16))
    return call(act, w, group=handle, moe=_np.int64(buffers.handle), cluster_m=_np.int64(cluster_m))


def _attention_results(op, q, k, v):
    """(out, lse)'s shapes and dtypes: out like q, lse float32 [B, Hq, S_q]."""
    if q.ndim != 4 or k.ndim != 4 or tuple(k.shape) != tuple(v.shape) or q.shape[3] != k.shape[3]:
        raise ValueError(f"interlace.jax.{op}: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} are not "
                         "[B, S, H, D] alike")
    return (_jax.ShapeDtypeStruct(tuple(q.shape), q.dtype),
            _jax.ShapeDtypeStruct((q.shape[0], q.shape[2], q.shape[1]), _jnp.float32))


def attention(q, k, v, *, causal=False, softmax_scale=None):
    """(out, lse) of softmax(q k^T * softmax_scale) v on one GPU (see interlace.attention): q [B, S_q,
    Hq, D], k and v [B, S_k, Hkv, D], bf16 or fp16 alike, D 64 or 128, Hq a multiple of Hkv; out like
    q, lse float32 [B, Hq, S_q] (natural-log log-sum-exp of each query's scaled scores). causal needs
    S_q == S_k; softmax_scale defaults to 1 / sqrt(D)."""
    _register()
    _interlace._check_scale("interlace.jax.attention", softmax_scale)
    call = _jax.ffi.ffi_call("interlace_attention", _attention_results("attention", q, k, v))
    return call(q, k, v, causal=bool(causal),
                softmax_scale=_np.float64(0.0 if softmax_scale is None else softmax_scale))


def ring_attention(q, k, v, group, *, causal=False, softmax_scale=None, seq_len=None):
    """(out, lse) of attention over the sequence sharded across the group, in one launch (see
    interlace.ring_attention): q [B, S_local, Hq, D], k and v [B, S_local, Hkv, D] are this rank's
    zigzag shard (interlace.ring_attention_shard); out like q, lse float32 [B, Hq, S_local]. seq_len:
    the global S, needed only where 2 x world_size does not divide it (default world_size x S_local).
    Every rank must make the same call."""
    _register()
    handle = _group_handle(group)
    _interlace._check_scale("interlace.jax.ring_attention", softmax_scale)
    call = _jax.ffi.ffi_call("interlace_ring_attention", _attention_results("ring_attention", q, k, v))
    return call(q, k, v, group=handle, causal=bool(causal),
                softmax_scale=_np.float64(0.0 if softmax_scale is None else softmax_scale),
                seq_len=_np.int64(seq_len or 0))
