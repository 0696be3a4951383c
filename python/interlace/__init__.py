"""Interlace: persistent CUDA kernels that fuse GPU communication with compute.

    import interlace
    group = interlace.init(heap_bytes=1 << 30)       # rank etc. from torchrun / mpirun / srun
    x = torch.from_dlpack(group.empty((4096, 8192), "bfloat16"))
    interlace.all_gather(out, x, group)              # on torch's current stream

Ops take any DLPack tensor (PyTorch, CuPy, JAX inputs, or interlace's own) and a CUDA stream
handle; with stream=None they use the current stream of the framework the tensors come from.
After synchronizing, group.check() raises interlace.Error if the group was aborted (a rank died,
ranks called different ops, a wait timed out, or group.abort()). Ops of one group run one after
another on the GPU, whichever streams they are issued on.
"""
from interlace import _frameworks
from interlace._group import Group, native as _native
from interlace._interlace import Bootstrap, Error, gpu_count
from interlace import _interlace as _C

__all__ = ["Bootstrap", "Error", "Group", "MoeHandle", "ag_gemm", "all_gather", "all_reduce", "attention", "gemm",
           "gemm_ar", "gemm_rs", "gpu_count", "grouped_gemm", "init", "moe_combine", "moe_dispatch", "moe_dispatch_gemm",
           "moe_gemm_combine", "moe_no_drop_capacity", "reduce_scatter", "ring_attention", "ring_attention_shard",
           "ring_attention_unshard"]
__version__ = "0.1.0"


def init(*, rank=None, world_size=None, master_addr=None, master_port=None, secret=None, device=None,
         heap_bytes=1 << 30, timeout_s=300.0, heartbeat_timeout_s=30.0, bootstrap_timeout_s=60.0,
         node_name=None, cross_node="auto", loopback_rate=0.0) -> Group:
    """Joins the job's other processes and returns the Group (collective: every rank calls it).

    Unset arguments come from the launcher's environment (torchrun, mpirun, srun; see DESIGN.md).
    heap_bytes: size of this rank's symmetric heap (equal on every rank).
    secret: the job's shared secret (default: INTERLACE_SECRET); required when master_addr is not a
      loopback address, so that no other process can join the rendezvous.
    timeout_s: how long a GPU wait for a peer may last before the group aborts. A last resort: a dead
      rank is noticed within a second through its closed connection, and then every rank's kernels stop.
    heartbeat_timeout_s: a rank from which nothing arrives for this long (its host is down) is taken
      for dead. Heartbeats come from a thread of their own: a slow or busy rank is never taken for dead.
    device: the CUDA device; default is the launcher's local rank.
    node_name: ranks with the same name share NVLink; default is the hostname. Ranks of one host with
      different names act as separate nodes (the loopback backend emulates a network between them).
    cross_node: with several nodes, how writes reach ranks on other nodes: "auto" (loopback when every
      rank runs on one host, else "rc"), "loopback", "rc" (InfiniBand / RoCE) or "srd" (EFA). With one
      node nothing is made for it.
    loopback_rate: the loopback backend's rate in bytes/s, as a NIC's (50e9 ~ 400 Gb/s); 0: unthrottled.
    Both are checked before the rendezvous, so a bad value raises interlace.Error at once.
    """
    _C._check_cross_node_options(cross_node, float(loopback_rate))
    return Group(_C._init(
        rank=-1 if rank is None else rank,
        world_size=-1 if world_size is None else world_size,
        master_addr=master_addr or "",
        master_port=0 if master_port is None else master_port,
        secret=secret or "",
        device=-1 if device is None else device,
        heap_bytes=heap_bytes,
        timeout_s=timeout_s,
        heartbeat_timeout_s=heartbeat_timeout_s,
        bootstrap_timeout_s=bootstrap_timeout_s,
        node_name=node_name or "",
        cross_node=cross_node,
        loopback_rate=float(loopback_rate),
    ))


def all_gather(out, inp, group, *, stream=None, num_blocks=0, chunk_bytes=0):
    """out = every rank's inp, concatenated in rank order (out is [world, *inp.shape] or
    [world * inp.shape[0], *inp.shape[1:]]). A GPU-driven kernel over NVLink; stream-ordered and
    CUDA-graph capturable. If out is symmetric (group.empty), peers store straight into it; otherwise
    into a receive buffer in the heap (world * inp bytes), copied into out as chunks land.
    num_blocks and chunk_bytes tune the kernel (0: automatic). Raises interlace.Error before any GPU
    work on bad arguments."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: use interlace.jax.all_gather(x, group), which returns a new array")
    native = _native(group)
    if stream is None:
        stream = _frameworks.current_stream(out, inp)
    _C.all_gather(_frameworks.as_dlpack(out), _frameworks.as_dlpack(inp), native, stream=stream,
                  num_blocks=num_blocks, chunk_bytes=chunk_bytes)


def reduce_scatter(out, inp, group, *, stream=None, num_blocks=0, chunk_bytes=0):
    """out = this rank's block of the sum over ranks of inp: inp holds world blocks of out's shape
    ([world * n, ...], [world, n, ...] or flat), and rank r gets the sum of every rank's block r.
    float16, bfloat16 or float32, summed in fp32 in rank order and rounded once: the same bits on
    every run. A block's bytes must be a multiple of 16 (8 fp16/bf16 elements). Every rank pushes its
    blocks into their owners' heap scratch ((world - 1) x out bytes) over NVLink; stream-ordered and
    CUDA-graph capturable. num_blocks and chunk_bytes tune the kernel (0: automatic). Raises
    interlace.Error before any GPU work on bad arguments."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: interlace.reduce_scatter writes into out")
    native = _native(group)
    if stream is None:
        stream = _frameworks.current_stream(out, inp)
    _C.reduce_scatter(_frameworks.as_dlpack(out), _frameworks.as_dlpack(inp), native, stream=stream,
                      num_blocks=num_blocks, chunk_bytes=chunk_bytes)


_REDUCE_ALGORITHMS = {"auto": 0, "one_shot": 2, "two_shot": 3}


def all_reduce(out, inp, group, *, stream=None, algorithm="auto", num_blocks=0, chunk_bytes=0):
    """out = the sum over ranks of inp (same shape); out may be inp itself (in place). float16,
    bfloat16 or float32, any element count, summed in fp32 in rank order and rounded once: the same
    bits on every rank and every run. One launch: "one_shot" (every rank sums every rank's whole
    input; automatic up to 256 KiB, 4 MiB on two ranks) or "two_shot" (each rank sums one share, then sends it to every
    rank; if out is symmetric, group.empty, owners store into it directly). Heap scratch: (world - 1)
    x the input for one-shot, up to 2 x (world - 1) / world x for two-shot. Stream-ordered and
    CUDA-graph capturable. num_blocks and chunk_bytes tune the kernel (0: automatic). Raises
    interlace.Error before any GPU work on bad arguments."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: interlace.all_reduce writes into out")
    if algorithm not in _REDUCE_ALGORITHMS:
        raise Error(f"all_reduce: algorithm must be one of {', '.join(_REDUCE_ALGORITHMS)}, got {algorithm!r}")
    native = _native(group)
    if stream is None:
        stream = _frameworks.current_stream(out, inp)
    _C.all_reduce(_frameworks.as_dlpack(out), _frameworks.as_dlpack(inp), native, stream=stream,
                  algorithm=_REDUCE_ALGORITHMS[algorithm], num_blocks=num_blocks, chunk_bytes=chunk_bytes)


def gemm(a, b, out, *, stream=None, band_m=0, tile_n=0, cluster_m=0, pingpong=True):
    """out[M, N] = a[M, K] @ b[K, N] on one GPU with interlace's Hopper engine: bf16 or fp16 in, fp32
    accumulation, out in the input dtype. b is [K, N], row-major or column-major; a Linear weight
    w [N, K] goes in as w.t(). Rows must be 16-byte aligned (K and N multiples of 8). Tuning, 0 meaning
    automatic: band_m, cluster-tile rows per band of the tile order (L2 reuse); cluster_m, CTAs per
    cluster sharing B (1 or 2; automatic: 1 for M <= 128, else 2; at M <= 64, or 128 at moderate N, with
    b a weight.t() and every tuning left automatic, gemm computes out^T = b^T a^T instead, on 64-row
    tiles of N); pingpong (default), consumer warpgroups on alternate 128 x 128 tiles,
    else cooperative tiles of width tile_n (128 or 256, by wave fill). With band_m, tile_n and pingpong
    all left as they are, a GPU of little HBM bandwidth per SM (an H100) gets cooperative tiles from
    1e12 flop (2 M N K) and ping-pong in bands of 2 below. Raises interlace.Error before any GPU work."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: interlace.gemm writes into out")
    if stream is None:
        stream = _frameworks.current_stream(out, a, b)
    _C.gemm(_frameworks.as_dlpack(a), _frameworks.as_dlpack(b), _frameworks.as_dlpack(out), stream=stream,
            band_m=band_m, tile_n=tile_n, cluster_m=cluster_m, pingpong=pingpong)


def _swap_code(op, swap):
    """The binding's swap (0 automatic, 1 swapped, -1 never) for None, True or False."""
    if swap is not None and not isinstance(swap, bool):
        raise TypeError(f"{op}: swap must be None (automatic), True or False; got {swap!r}")
    return {None: 0, True: 1, False: -1}[swap]


def grouped_gemm(a, b, out, rows, *, stream=None, cluster_m=0, tile_n=0, swap=None):
    """G GEMMs in one launch, a mixture of experts' FFN matmul on the tokens each expert received:
    out[g, :rows[g]] = a[g, :rows[g]] @ b[g] for every group g. a is [G, C, K] (C rows per group, the
    capacity), b [G, K, N] with N or K contiguous (Linear weights w [G, N, K] go in as
    w.transpose(1, 2)), out [G, C, N]; bf16 or fp16 alike, fp32 accumulation, out in the input dtype.
    rows: int32 [G] on the GPU, the row count of each group, clamped to C; it is read by the kernel and
    never synced to the host, so the counts can come straight from a routing kernel. Rows of out at or
    past rows[g] are left as they are. Rows and group strides 16-byte aligned (K and N multiples of 8);
    out may not overlap a, b or rows. Stream-ordered and CUDA-graph capturable. tile_n: 128 (128 x 128
    tiles, ping-pong) or 256 (128 x 256, cooperative); cluster_m, 1 or 2, is how many CTAs share each
    load of b[g]; 0: automatic (tile_n 256 and cluster_m 1 where C <= 384, else 128 and 2, or on a GPU
    of little HBM bandwidth per SM, an H100, 256 and 2). swap: True computes out[g]^T = b[g]^T a[g]^T
    instead, a group's rows across 160-wide tiles and 128 of N down them, two such tiles one cluster
    that reads each slice of b[g] once (b K-major only; cluster_m and tile_n left 0); None: where b is
    K-major and 128 < C <= 320, with the other settings automatic (there 128-row tiles take two or
    three CTAs, each reading b[g] again); False: never. Where most groups have about C / 8 rows, the
    two run level. Raises interlace.Error before any GPU work on bad arguments."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: interlace.grouped_gemm writes into out")
    swap = _swap_code("grouped_gemm", swap)
    if stream is None:
        stream = _frameworks.current_stream(out, a, b)
    _C.grouped_gemm(_frameworks.as_dlpack(a), _frameworks.as_dlpack(b), _frameworks.as_dlpack(out),
                    _frameworks.as_dlpack(rows), stream=stream, cluster_m=cluster_m, tile_n=tile_n,
                    swap=swap)


def _check_scale(op, softmax_scale):
    # The binding takes 0 for "1 / sqrt(D)": a scale of 0 given on purpose must not mean that.
    if softmax_scale is not None and not softmax_scale > 0:
        raise Error(f"{op}: softmax_scale {softmax_scale} must be positive (None: 1 / sqrt(head_dim))")


def attention(q, k, v, out, *, causal=False, softmax_scale=None, lse=None, stream=None):
    """out = softmax(q k^T * softmax_scale) v on one GPU with interlace's Hopper attention engine, the
    compute ring attention runs per block. q and out are [B, S_q, Hq, D], k and v [B, S_k, Hkv, D], all
    contiguous, bf16 or fp16 alike; D is 64 or 128 and Hq a multiple of Hkv (grouped-query attention:
    query head h reads KV head h // (Hq // Hkv)). Any sequence lengths. causal: query i sees keys 0..i
    (needs S_q == S_k). softmax_scale defaults to 1 / sqrt(D). lse, if given, float32 [B, Hq, S_q],
    receives each query's log-sum-exp of its scaled scores (natural log), which a backward pass needs.
    fp32 softmax and accumulation. Stream-ordered, graph-capturable; raises interlace.Error before any
    GPU work on bad arguments."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: interlace.attention writes into out")
    _check_scale("attention", softmax_scale)
    if stream is None:
        stream = _frameworks.current_stream(out, q, k, v)
    _C.attention(_frameworks.as_dlpack(q), _frameworks.as_dlpack(k), _frameworks.as_dlpack(v),
                 _frameworks.as_dlpack(out), lse=None if lse is None else _frameworks.as_dlpack(lse), causal=causal,
                 softmax_scale=0.0 if softmax_scale is None else float(softmax_scale), stream=stream)


def ag_gemm(a_shard, b, out, group, *, gathered=None, shard_rows=None, stream=None, chunk_rows=0, band_m=0, tile_n=0,
            pingpong=True, transfer="auto", copy_ctas=0):
    """out[M, N] = A[M, K] @ b, where A is every rank's a_shard ([M_r, K], row-major) stacked in rank
    order, in one launch: the shards travel over NVLink while the GEMM computes on the rows that have
    landed (this rank's own first). b is [K, N], row-major or column-major (a Linear weight w [N, K]
    as w.t()); bf16 or fp16, fp32 accumulation; rows 16-byte aligned (K and N multiples of 8).
    shard_rows: every rank's M_r, the same list on every rank (default: even shards, M / world).
    gathered: an optional [M, K] tensor that receives A (the backward pass needs it); a symmetric one
    (group.empty) is written in place, an ordinary one is copied into from heap scratch.
    Tuning (0: automatic): chunk_rows, rows per transfer chunk; band_m, as in gemm; pingpong (default),
    consumer warpgroups on alternate 128 x 128 tiles, else cooperative tiles of width tile_n (128 or
    256); transfer, how the shards travel: "copy_engine" (automatic: the copy engines pull them and
    the GEMM keeps every SM) or "ctas" (copy_ctas SMs, a multiple of 2, set aside to push them).
    Stream-ordered, graph-capturable;
    raises interlace.Error before any GPU work on bad arguments."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: interlace.ag_gemm writes into out")
    native = _native(group)
    if stream is None:
        stream = _frameworks.current_stream(out, a_shard, b)
    _C.ag_gemm(_frameworks.as_dlpack(a_shard), _frameworks.as_dlpack(b), _frameworks.as_dlpack(out), native,
               gathered=None if gathered is None else _frameworks.as_dlpack(gathered),
               shard_rows=[] if shard_rows is None else [int(r) for r in shard_rows], stream=stream,
               chunk_rows=chunk_rows, band_m=band_m, tile_n=tile_n, pingpong=pingpong, transfer=transfer,
               copy_ctas=copy_ctas)


def gemm_rs(a, b, out, group, *, shard_rows=None, stream=None, band_m=0, tile_n=0, pingpong=True, reduce_ctas=0,
            round_m=0):
    """out = this rank's rows of sum over ranks r of a_r @ b_r, in one launch (GEMM + ReduceScatter):
    K is split across ranks, a is [M, K_r] (row-major) and b [K_r, N], row-major or column-major (a
    Linear weight w [N, K_r] as w.t()); out is [rows of this rank, N]. bf16 or fp16; the partials are
    summed in fp32 in rank order and rounded once, so the result is bitwise the same on every run.
    Rows 16-byte aligned (K_r and N multiples of 8). K_r may differ across ranks, but must be 0 on all
    or on none.
    shard_rows: every rank's output rows, the same list on every rank (default: even blocks, M / world);
    a rank may own none.
    Tuning (0: automatic): band_m, as in gemm; pingpong (default), consumer warpgroups on alternate
    128 x 128 tiles, else cooperative tiles of width tile_n (128 or 256); reduce_ctas, SMs (a multiple
    of 2) set aside to sum this rank's tiles as they land: automatically none where every block starts
    on a multiple of 256 rows (each owner sums its own tiles in the GEMM's epilogue), else 32; a given
    count forces that many reducers; round_m (blocks on that grid only), 256-row bands per owner per
    round of the tile order, so that the pushes to peers spread over the whole GEMM: automatically the
    fewest that fit (1 up to M = 72 x 256); a round_m of a whole block or more takes
    each owner's block at once.
    Needs heap scratch for the fp32 partials of the tiles this rank owns from every rank (world x its
    rows x N x 4 bytes, rounded up to whole tiles). Stream-ordered, graph-capturable; raises
    interlace.Error before any GPU work on bad arguments."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: interlace.gemm_rs writes into out")
    native = _native(group)
    if stream is None:
        stream = _frameworks.current_stream(out, a, b)
    _C.gemm_rs(_frameworks.as_dlpack(a), _frameworks.as_dlpack(b), _frameworks.as_dlpack(out), native,
               shard_rows=[] if shard_rows is None else [int(r) for r in shard_rows], stream=stream, band_m=band_m,
               tile_n=tile_n, pingpong=pingpong, reduce_ctas=reduce_ctas, round_m=round_m)


def gemm_ar(a, b, out, group, *, stream=None, band_m=0, tile_n=0, pingpong=True, reduce_ctas=0):
    """out[M, N] = sum over ranks r of a_r @ b_r on every rank, in one launch (GEMM + AllReduce):
    a is [M, K_r] and b [K_r, N] as for gemm_rs; out is the whole [M, N]. Each tile row is summed by
    one owner (whole, balanced 256-row tile rows per rank), in fp32 in rank order, rounded once, and
    sent to every rank: the result is bitwise the same on every run and on every rank. At decode
    sizes (M <= 256, one wave of tiles) every rank sums every tile itself from every rank's partial
    instead (at M <= 128 with K split into runs, whose partial sums are added first, or, with b a
    Linear weight's .t(), on the swapped GEMM out^T = b^T a^T), as deterministic and the same on every
    rank; b's layout must then be the same on every rank (the tiles differ). Tuning as gemm_rs,
    without round_m (reduce_ctas given: reducer CTAs instead of sums in the epilogue). Needs heap
    scratch for the fp32 partials of the tiles this rank sums (world x M / world x N x 4 bytes,
    about; world x M x N x 4 at decode sizes) and a landing copy of out (M x N x 2 bytes).
    Stream-ordered, graph-capturable; raises interlace.Error before any GPU work on bad arguments."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: interlace.gemm_ar writes into out")
    native = _native(group)
    if stream is None:
        stream = _frameworks.current_stream(out, a, b)
    _C.gemm_ar(_frameworks.as_dlpack(a), _frameworks.as_dlpack(b), _frameworks.as_dlpack(out), native, stream=stream,
               band_m=band_m, tile_n=tile_n, pingpong=pingpong, reduce_ctas=reduce_ctas)


_CAPACITY_KINDS = {"per_expert": 0, "per_rank": 1}


def _capacity_kind(name):
    if name not in _CAPACITY_KINDS:
        raise Error(f"moe: capacity_kind must be one of {', '.join(_CAPACITY_KINDS)}, got {name!r}")
    return _CAPACITY_KINDS[name]


def MoeHandle(group, *, num_experts, topk, hidden, max_tokens, capacity, capacity_kind="per_expert"):
    """The workspace of moe_dispatch and moe_combine for one shape, in the group's heap (collective:
    every rank makes its handles in the same order, with the same arguments). Make one per MoE layer
    and pass it to every moe_dispatch of that layer (a CUDA graph needs its buffers to stay put); a
    dispatch overwrites what the last one with the same handle left.
    max_tokens: the most tokens any rank dispatches. capacity: receive rows per local expert
    ("per_expert") or for all of a rank's experts ("per_rank"); slots past it are dropped.
    Its device tensors (DLPack, this rank's, valid once a dispatch has run, stream-ordered): expert_x
    [recv_rows, hidden] bf16, counts [world, num_experts] int32, slots [recv_rows, 4] int32 (MoeSlot:
    source token, source rank | top-k position << 16, primary row, weight bits), expert_starts and
    expert_rows [num_experts / world] int32 (each local expert's rows of expert_x, the grouped GEMM's
    M)."""
    return _C._moe_handle(_native(group), experts=num_experts, topk=topk, hidden=hidden, max_tokens=max_tokens,
                          capacity=capacity, capacity_kind=_capacity_kind(capacity_kind))


def moe_no_drop_capacity(world_size, *, num_experts, topk, max_tokens, capacity_kind="per_expert"):
    """The smallest capacity with which no routing drops anything (every token of every rank to one
    expert, or per rank to min(topk, local experts) of one rank's experts)."""
    return _C._moe_no_drop_capacity(world_size=world_size, experts=num_experts, topk=topk, max_tokens=max_tokens,
                                    capacity_kind=_capacity_kind(capacity_kind))


def _dispatch_handle(op, x, topk_idx, group, handle, num_experts, capacity, capacity_kind, max_tokens):
    """handle, or a new MoeHandle for x and topk_idx (a collective allocation)."""
    _capacity_kind(capacity_kind)
    if handle is not None:
        return handle
    if num_experts is None or capacity is None:
        raise Error(f"{op}: pass num_experts and capacity (or a handle)")
    return MoeHandle(group, num_experts=num_experts, topk=topk_idx.shape[1], hidden=x.shape[1],
                     max_tokens=x.shape[0] if max_tokens is None else max_tokens, capacity=capacity,
                     capacity_kind=capacity_kind)


def moe_dispatch(x, topk_idx, topk_weights, group, *, num_experts=None, capacity=None, capacity_kind="per_expert",
                 max_tokens=None, handle=None, stream=None):
    """Expert-parallel MoE dispatch over NVLink: sends each token's row x[t] to the ranks of its
    experts topk_idx[t] (expert e lives on rank e // (num_experts / world) as its local expert
    e % (num_experts / world)), once per rank however many of its experts live there. Returns
    (expert_x, handle): expert_x [recv_rows, hidden] bf16 holds each local expert's rows (from
    handle.expert_starts, handle.expert_rows of them; per source rank, in token order), the handle is
    what moe_combine needs.
    x [T, hidden] bf16 (hidden a multiple of 8); topk_idx [T, k] int32 or int64, -1 for an unused
    entry, no expert twice in a row (entries outside [-1, num_experts) count as unused); topk_weights
    [T, k] float32, applied by moe_combine. T may differ between ranks, up to max_tokens.
    handle: a MoeHandle to reuse (its shape must match); without one, a new one is made from
    num_experts, capacity, capacity_kind and max_tokens (default: this rank's T; pass the largest
    T of any rank when they differ), which costs a collective allocation: pass handle= in loops and
    CUDA graphs.
    Nothing waits on the host: counts stay on the device. Slots past the capacity are dropped (the
    last sources' last tokens of a full expert) and never written out of bounds; group.check() then
    raises interlace.Error once, after synchronizing. Stream-ordered, graph-capturable; raises
    interlace.Error before any GPU work on bad arguments."""
    handle = _dispatch_handle("moe_dispatch", x, topk_idx, group, handle, num_experts, capacity, capacity_kind,
                              max_tokens)
    native = _native(group)
    if stream is None:
        stream = _frameworks.current_stream(x, topk_idx, topk_weights)
    _C.moe_dispatch(_frameworks.as_dlpack(x), _frameworks.as_dlpack(topk_idx), _frameworks.as_dlpack(topk_weights),
                    handle, native, stream=stream)
    return handle.expert_x, handle


def moe_combine(expert_out, handle, group, *, out, stream=None):
    """The way back of moe_dispatch(..., handle): out [T, hidden] bf16 (T: this rank's tokens in that
    dispatch) = for each token, the sum over j = 0 .. k - 1 of topk_weights[t, j] x the output row of
    its j-th expert, in fp32 in that order, rounded once to bf16: deterministic. Unused and dropped
    entries add nothing (a token with none gets zeros). expert_out [recv_rows, hidden] bf16 is in
    expert_x's layout; only the kept rows are read. Stream-ordered, graph-capturable; raises
    interlace.Error before any GPU work on bad arguments."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: interlace.moe_combine writes into out")
    native = _native(group)
    if stream is None:
        stream = _frameworks.current_stream(out, expert_out)
    _C.moe_combine(_frameworks.as_dlpack(expert_out), _frameworks.as_dlpack(out), handle, native, stream=stream)
    return out


def moe_dispatch_gemm(x, topk_idx, topk_weights, w, group, *, out, num_experts=None, capacity=None,
                      capacity_kind="per_expert", max_tokens=None, handle=None, stream=None, cluster_m=0, tile_n=0,
                      swap=None, copy_ctas=0):
    """moe_dispatch fused with the experts' first FFN matmul, in one launch: x is dispatched as
    moe_dispatch(x, topk_idx, topk_weights, group, ...) dispatches it, and meanwhile
    out[l C + r] = expert_x[l C + r] @ w[l] for each local expert l and each row r it kept, each tile
    computed as soon as the rows it reads have landed. Returns (out, handle); the handle (and its
    expert_x) serve moe_combine and moe_gemm_combine as a moe_dispatch's do. The same bits as
    moe_dispatch, then grouped_gemm(expert_x viewed [L, C, hidden], w, out viewed [L, C, N],
    handle.expert_rows) with the same tiling.
    w: [L, hidden, N] bf16 (Linear weights [L, N, hidden] go in as w.transpose(1, 2)); out:
    [recv_rows, N] bf16, rows past an expert's kept rows left alone. The handle's capacity_kind must be
    "per_expert" and top-k at most 32. cluster_m, tile_n and swap as grouped_gemm's; copy_ctas: the
    SMs that dispatch while the others compute (0: automatic, fewer the wider N: 16 at N = 4096, 4 at
    28672). The other arguments as moe_dispatch's.
    Collective, stream-ordered, graph-capturable; raises interlace.Error before any GPU work on bad
    arguments."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: interlace.moe_dispatch_gemm writes into out")
    swap = _swap_code("moe_dispatch_gemm", swap)
    handle = _dispatch_handle("moe_dispatch_gemm", x, topk_idx, group, handle, num_experts, capacity, capacity_kind,
                              max_tokens)
    native = _native(group)
    if stream is None:
        stream = _frameworks.current_stream(out, x, topk_idx, topk_weights, w)
    _C.moe_dispatch_gemm(_frameworks.as_dlpack(x), _frameworks.as_dlpack(topk_idx),
                         _frameworks.as_dlpack(topk_weights), _frameworks.as_dlpack(w), _frameworks.as_dlpack(out),
                         handle, native, stream=stream, cluster_m=cluster_m, tile_n=tile_n,
                         swap=swap, copy_ctas=copy_ctas)
    return out, handle


def moe_gemm_combine(act, w, handle, group, *, out, stream=None, cluster_m=0, tile_n=0):
    """The experts' second FFN matmul fused with moe_combine, in one launch: for each local expert l and
    each row r it kept in moe_dispatch(..., handle), act[l C + r] @ w[l] is computed and sent straight
    from the GEMM's epilogue to its token's home rank, where out [T, hidden] bf16 is then summed as
    moe_combine sums it. The same bits as grouped_gemm (with the same cluster_m and tile_n, so the same
    swap) into an expert_out followed by moe_combine.
    act: [recv_rows, F] bf16 in expert_x's layout (F: the FFN width); w: [L, F, hidden] bf16 (Linear
    weights [L, hidden, F] go in as w.transpose(1, 2)). The handle's capacity_kind must be
    "per_expert". cluster_m and tile_n as grouped_gemm's. Collective, stream-ordered, graph-capturable; raises
    interlace.Error before any GPU work on bad arguments."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: interlace.moe_gemm_combine writes into out")
    native = _native(group)
    if stream is None:
        stream = _frameworks.current_stream(out, act, w)
    _C.moe_gemm_combine(_frameworks.as_dlpack(act), _frameworks.as_dlpack(w), _frameworks.as_dlpack(out), handle,
                        native, stream=stream, cluster_m=cluster_m, tile_n=tile_n)
    return out


def _along(x, dim, start, rows):
    return x[(slice(None),) * dim + (slice(start, start + rows),)]


def ring_attention(q, k, v, out, group, *, causal=False, softmax_scale=None, lse=None, seq_len=None, stream=None,
                   sender_ctas=0):
    """Attention over the whole sequence, sharded across the group's ranks, in one launch: every
    rank's K/V block travels around the ring over NVLink while the attention engine computes on the
    blocks that have landed. q and out are this rank's shard, [B, S_local, Hq, D]; k and v [B,
    S_local, Hkv, D]; all sharded along the sequence with ring_attention_shard (rank i holds chunks i
    and 2W-1-i of 2W, so that causal work is the same on every rank). out = softmax(q K^T *
    softmax_scale) V over every rank's keys; causal: over the global positions. lse, if given,
    float32 [B, Hq, S_local], receives each query's log-sum-exp (natural log). seq_len: the global
    S, needed only where 2 x world_size does not divide it (default world_size x S_local). bf16 or
    fp16, D 64 or 128, Hq a multiple of Hkv (GQA). The blocks land in (world_size - 1) K/V blocks of
    the group's heap scratch. Stream-ordered, graph-capturable; raises interlace.Error before any GPU
    work on bad arguments. sender_ctas tunes how many CTAs forward the blocks (0: automatic, 16)."""
    if _frameworks.is_jax(out):
        raise TypeError("JAX arrays are immutable: interlace.ring_attention writes into out")
    _check_scale("ring_attention", softmax_scale)
    native = _native(group)
    if stream is None:
        stream = _frameworks.current_stream(out, q, k, v)
    _C.ring_attention(_frameworks.as_dlpack(q), _frameworks.as_dlpack(k), _frameworks.as_dlpack(v),
                      _frameworks.as_dlpack(out), native, lse=None if lse is None else _frameworks.as_dlpack(lse),
                      causal=causal, softmax_scale=0.0 if softmax_scale is None else float(softmax_scale),
                      seq_len=seq_len or 0, stream=stream, sender_ctas=sender_ctas)


def ring_attention_shard(x, rank, world_size, *, dim=1):
    """Rank `rank`'s share of x under ring attention's load-balanced (zigzag) sharding: the sequence
    (x's axis dim, S rows, any S) cut into 2 x world_size contiguous chunks, the first S % (2W) of
    them one row longer; the rank holds chunk rank, then chunk 2W-1-rank, so that under a causal
    mask every rank has the same work. x: the whole sequence, any framework's array (torch, JAX,
    CuPy, NumPy), e.g. [B, S, H, D]. Returns a new array of the rank's rows."""
    ranks = _C._ring_attention_ranges(x.shape[dim], world_size)
    if not 0 <= rank < world_size:
        raise Error(f"ring_attention_shard: rank {rank} out of range for {world_size} ranks")
    ranges = ranks[rank]
    halves = [_along(x, dim, ranges[3 * h], ranges[3 * h + 2]) for h in (0, 1)]
    return _frameworks.concatenate(halves, dim)


def ring_attention_unshard(x, world_size, *, dim=1):
    """The inverse of ring_attention_shard: x holds every rank's shard stacked in rank order along dim
    (an all_gather of the shards, S rows in all); returns the sequence in its global order."""
    ranks = _C._ring_attention_ranges(x.shape[dim], world_size)
    # (global start, sharded start, rows) of every chunk, put back in global order.
    chunks = sorted((r[3 * h], r[3 * h + 1], r[3 * h + 2]) for r in ranks for h in (0, 1))
    return _frameworks.concatenate([_along(x, dim, start, rows) for _, start, rows in chunks], dim)
