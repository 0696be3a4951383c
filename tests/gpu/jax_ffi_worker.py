"""One rank of interlace.jax under jax.jit (see test_jax_ffi_gpu.py): all_gather, gemm, ag_gemm,
gemm_rs, gemm_ar, MoE layers (moe_combine, moe_gemm_combine, moe_dispatch_gemm), attention,
ring_attention, reduce_scatter and all_reduce as XLA FFI custom calls on XLA's stream, checked
against jnp / jax.lax references (the reductions bit for bit against the fp32 sum in rank order,
rounded once). One process per GPU; each process's JAX sees every GPU and computes on the one its
interlace group uses."""
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the processes share the GPUs

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import interlace  # noqa: E402
import interlace.jax as ij  # noqa: E402

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
group = interlace.init(heap_bytes=256 << 20)
dev = jax.devices("gpu")[group.device]
K, N = 256, 384


def shard(rank, rows, seed, cols=K):
    rng = np.random.default_rng(seed * 100 + rank)
    return jnp.asarray(rng.standard_normal((rows, cols), dtype=np.float32), dtype=jnp.bfloat16)


def put(x):
    return jax.device_put(x, dev)


def reference_matmul(a, b):
    return jax.lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), (((1,), (0,)), ((), ())),
                               precision=jax.lax.Precision.HIGHEST)


def check(out, ref, what, tol=1e-2):
    out, ref = np.asarray(jax.device_get(out), dtype=np.float32), np.asarray(jax.device_get(ref), dtype=np.float32)
    assert out.shape == ref.shape, f"rank {RANK}: {what}: shape {out.shape}, expected {ref.shape}"
    err = float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
    assert err <= tol, f"rank {RANK}: {what}: relative error {err}"


def summands(rank, shape, dtype, seed):
    """Rank `rank`'s input to a reduction, as numpy (every rank can recompute every rank's)."""
    rng = np.random.default_rng(seed * 1009 + rank)
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


def rank_order_sum(parts, dtype):
    """What interlace promises bit for bit: the fp32 sum in rank order, rounded once to dtype."""
    acc = parts[0].astype(np.float32)
    for p in parts[1:]:
        acc = acc + p.astype(np.float32)
    return acc.astype(dtype)


def bits(x):
    x = np.asarray(jax.device_get(x))
    return x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def expect_bits(out, want, what):
    got, ref = bits(out), bits(want)
    assert got.shape == ref.shape, f"rank {RANK}: {what}: shape {got.shape}, expected {ref.shape}"
    bad = np.flatnonzero(got.reshape(-1) != ref.reshape(-1))
    if bad.size:
        i = int(bad[0])
        o, r = np.asarray(jax.device_get(out)).reshape(-1), np.asarray(want).reshape(-1)
        raise AssertionError(f"rank {RANK}: {what}: {bad.size} of {ref.size} elements differ from the rank-order fp32 "
                             f"sum, first at {i}: got {o[i]!r}, expected {r[i]!r}")


def check_reductions():
    """jit reduce_scatter and all_reduce against the rank-order sum, bit for bit; all_reduce's result
    gathered from every rank (interlace.jax.all_gather) must be the same bits everywhere."""
    scatter = jax.jit(lambda x: ij.reduce_scatter(x, group))
    reduce_auto = jax.jit(lambda x: ij.all_reduce(x, group))
    gather = jax.jit(lambda x: ij.all_gather(x, group))
    cases = [((WORLD * 64, 96), jnp.bfloat16), ((WORLD * 1024, 512), jnp.bfloat16), ((WORLD * 40, 33), jnp.float32),
             ((WORLD * 256, 1000), jnp.float16)]
    for seed, (shape, dtype) in enumerate(cases):
        parts = [summands(q, shape, dtype, seed) for q in range(WORLD)]
        x = put(parts[RANK])
        full = rank_order_sum(parts, dtype)
        rows = shape[0] // WORLD
        what = f"{shape} {jnp.dtype(dtype).name}"
        expect_bits(scatter(x), full[RANK * rows:(RANK + 1) * rows], f"jit reduce_scatter {what}")
        expect_bits(ij.reduce_scatter(x, group), full[RANK * rows:(RANK + 1) * rows], f"eager reduce_scatter {what}")
        for algorithm in ("auto", "one_shot", "two_shot"):
            fn = reduce_auto if algorithm == "auto" else jax.jit(lambda x, a=algorithm: ij.all_reduce(x, group, algorithm=a))
            out = fn(x)
            expect_bits(out, full, f"jit all_reduce ({algorithm}) {what}")
            everyone = np.asarray(jax.device_get(gather(out)))
            for q in range(WORLD):
                assert np.array_equal(bits(everyone[q * shape[0]:(q + 1) * shape[0]]), bits(out)), \
                    f"rank {RANK}: all_reduce ({algorithm}) {what}: rank {q}'s result differs from this rank's"
        group.check()
    # In a jitted tensor-parallel block: column-parallel ag_gemm, then a local matmul and all_reduce.
    w1, w2 = shard(RANK, K, 21, N), shard(RANK, N, 22, 64)
    mlp = jax.jit(lambda x, w1, w2: ij.all_reduce(jax.nn.relu(ij.ag_gemm(x, w1, group)) @ w2, group))
    x = shard(RANK, 128, 23)
    full_x = jnp.concatenate([shard(q, 128, 23) for q in range(WORLD)])
    ref = sum(jax.nn.relu(reference_matmul(full_x, shard(q, K, 21, N))).astype(jnp.bfloat16).astype(jnp.float32)
              @ shard(q, N, 22, 64).astype(jnp.float32) for q in range(WORLD))
    check(mlp(put(x), put(w1), put(w2)), ref, "jit ag_gemm + matmul + all_reduce", tol=2e-2)
    # A bad call (a block of 12 bytes) comes back as a JAX error on every rank; the group stays usable.
    try:
        jax.block_until_ready(scatter(put(jnp.ones((WORLD * 2, 3), jnp.float16))))
    except Exception as e:  # noqa: BLE001 (XlaRuntimeError / JaxRuntimeError by version)
        print(f"rank {RANK}: bad reduce_scatter raised {type(e).__name__}: {str(e)[:200]}")
    else:
        raise AssertionError("reduce_scatter of 12-byte blocks did not raise")
    group.check()


def check_row_parallel():
    """gemm_rs and gemm_ar under jit: K split over ranks (512 rows on 2 GPUs: even blocks of 256,
    whose owners sum in the epilogue; 384: blocks of 192, summed by reducers), against the fp32 sum
    of every rank's product; gemm_ar's out equal on every rank, bit for bit."""
    rs = jax.jit(lambda a, w: jax.nn.relu(ij.gemm_rs(a, w, group)))
    ar = jax.jit(lambda a, w: ij.gemm_ar(a, w, group))
    for m in (512, 384):
        for step in range(3):
            seed = 40 + 10 * step + m
            a, w = shard(RANK, m, seed, 128), shard(RANK, 128, seed + 1, N)
            total = sum(reference_matmul(shard(q, m, seed, 128), shard(q, 128, seed + 1, N)) for q in range(WORLD))
            rows = m // WORLD
            mine = total[RANK * rows:(RANK + 1) * rows]
            check(rs(put(a), put(w)), jax.nn.relu(mine), f"jit gemm_rs m={m} step {step}")
            out = ar(put(a), put(w))
            check(out, total, f"jit gemm_ar m={m} step {step}")
            everyone = np.asarray(jax.device_get(ij.all_gather(out, group)))
            for q in range(WORLD):
                assert np.array_equal(bits(everyone[q * m:(q + 1) * m]), bits(out)), \
                    f"rank {RANK}: gemm_ar m={m} step {step}: rank {q}'s result differs from this rank's"
    group.check()


MOE_EXPERTS, MOE_TOPK, MOE_HIDDEN, MOE_TOKENS = 4 * WORLD, 2, 256, 64


def moe_buffers():
    return ij.MoeBuffers(group, num_experts=MOE_EXPERTS, topk=MOE_TOPK, hidden=MOE_HIDDEN, max_tokens=MOE_TOKENS,
                         capacity=MOE_TOKENS * WORLD)


def moe_routing(rank, step):
    """Rank `rank`'s x, top-k expert ids and weights for step `step` (every rank can recompute every rank's)."""
    rng = np.random.default_rng(80 + step + 1000 * rank)
    x = jnp.asarray(rng.standard_normal((MOE_TOKENS, MOE_HIDDEN), dtype=np.float32), dtype=jnp.bfloat16)
    idx = np.argsort(rng.random((MOE_TOKENS, MOE_EXPERTS)), axis=1)[:, :MOE_TOPK].astype(np.int32)
    return x, idx, rng.random((MOE_TOKENS, MOE_TOPK), dtype=np.float32)


def check_moe():
    """moe_dispatch, a stand-in expert (x 2, exact in bf16) and moe_combine in one jitted layer, with
    new routing every step: each token comes back as the sum over its experts of weight x 2x, in fp32
    in top-k order and rounded once (interlace's bits), and the experts' kept rows add up to the
    (token, expert) pairs every rank routed here."""
    tokens, local = MOE_TOKENS, MOE_EXPERTS // WORLD
    moe = moe_buffers()

    def layer(x, idx, w):
        expert_x, _, expert_rows = ij.moe_dispatch(x, idx, w, moe)
        return ij.moe_combine(expert_x * 2, moe, tokens=tokens), expert_rows

    layer = jax.jit(layer)
    for step in range(3):
        x, idx, w = moe_routing(RANK, step)
        out, expert_rows = layer(put(x), put(idx), put(w))
        twice = np.asarray(x, dtype=np.float32) * 2
        want = jnp.asarray(w[:, :1] * twice + w[:, 1:] * twice, dtype=jnp.bfloat16)
        expect_bits(out, want, f"jit moe layer step {step}")
        here = sum(int(((i >= RANK * local) & (i < (RANK + 1) * local)).sum())
                   for i in (moe_routing(q, step)[1] for q in range(WORLD)))
        assert int(np.asarray(jax.device_get(expert_rows)).sum()) == here, \
            f"rank {RANK}: moe step {step}: expert_rows sum to {np.asarray(expert_rows).sum()}, expected {here}"
    group.check()


def check_moe_gemm_combine():
    """moe_dispatch, then moe_gemm_combine of act (the received rows' first F columns x 2, exact) with
    w [L, F, H], in one jitted layer; against grouped_gemm into an expert_out then moe_combine (a
    second jitted function, run after it on the same dispatch), bit for bit."""
    F, local = 128, MOE_EXPERTS // WORLD
    moe = moe_buffers()
    capacity = moe.native.recv_rows // local
    w2 = put(shard(RANK, local * F, 31, MOE_HIDDEN).reshape(local, F, MOE_HIDDEN) / 16)

    def fused(x, idx, w, w2):
        expert_x, _, expert_rows = ij.moe_dispatch(x, idx, w, moe)
        act = expert_x[:, :F] * 2
        return ij.moe_gemm_combine(act, w2, moe, tokens=MOE_TOKENS), act, expert_rows

    def unfused(act, w2, expert_rows):  # reads the dispatch that fused's call left in moe
        expert_out = ij.grouped_gemm(act.reshape(local, capacity, F), w2, expert_rows)
        return ij.moe_combine(expert_out.reshape(-1, MOE_HIDDEN), moe, tokens=MOE_TOKENS)

    fused, unfused = jax.jit(fused), jax.jit(unfused)
    for step in range(3):
        out, act, expert_rows = fused(*(put(a) for a in moe_routing(RANK, 10 + step)), w2)
        want = unfused(act, w2, expert_rows)
        assert np.isfinite(np.asarray(jax.device_get(out), dtype=np.float32)).all(), \
            f"rank {RANK}: moe_gemm_combine step {step}: out has NaN or inf"
        expect_bits(out, want, f"jit moe_gemm_combine step {step} (against grouped_gemm + moe_combine)")
    group.check()


def check_moe_dispatch_gemm():
    """moe_dispatch_gemm with w1 [L, H, F], then moe_gemm_combine of its relu, in one jitted layer;
    against moe_dispatch, grouped_gemm, relu and moe_gemm_combine (a second jitted function, the same
    routing), bit for bit."""
    F, local = 128, MOE_EXPERTS // WORLD
    moe = moe_buffers()
    capacity = moe.native.recv_rows // local
    w1 = put(shard(RANK, local * MOE_HIDDEN, 37, F).reshape(local, MOE_HIDDEN, F) / 16)
    w2 = put(shard(RANK, local * F, 31, MOE_HIDDEN).reshape(local, F, MOE_HIDDEN) / 16)

    def fused(x, idx, w, w1, w2):
        h, _, expert_rows = ij.moe_dispatch_gemm(x, idx, w, w1, moe)
        return ij.moe_gemm_combine(jax.nn.relu(h), w2, moe, tokens=MOE_TOKENS)

    def unfused(x, idx, w, w1, w2):
        expert_x, _, expert_rows = ij.moe_dispatch(x, idx, w, moe)
        h = ij.grouped_gemm(expert_x.reshape(local, capacity, MOE_HIDDEN), w1, expert_rows)
        return ij.moe_gemm_combine(jax.nn.relu(h.reshape(-1, F)), w2, moe, tokens=MOE_TOKENS)

    fused, unfused = jax.jit(fused), jax.jit(unfused)
    for step in range(3):
        inputs = [put(a) for a in moe_routing(RANK, 20 + step)]
        out = fused(*inputs, w1, w2)
        want = unfused(*inputs, w1, w2)
        assert np.isfinite(np.asarray(jax.device_get(out), dtype=np.float32)).all(), \
            f"rank {RANK}: moe_dispatch_gemm step {step}: out has NaN or inf"
        expect_bits(out, want, f"jit moe_dispatch_gemm layer step {step} (against moe_dispatch + grouped_gemm)")
    group.check()


def reference_attention(q, k, v, causal, scale):
    """fp32 attention and its lse (natural log) on q, k, v's values: [B, S, Hq, D] and [B, Hq, S]; query
    head h reads KV head h // (Hq // Hkv)."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    k, v = (jnp.repeat(x, q.shape[2] // x.shape[2], axis=2) for x in (k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=jax.lax.Precision.HIGHEST) * scale
    if causal:
        scores = jnp.where(jnp.tril(jnp.ones(scores.shape[-2:], dtype=bool)), scores, -jnp.inf)
    lse = jax.nn.logsumexp(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", jnp.exp(scores - lse[..., None]), v, precision=jax.lax.Precision.HIGHEST)
    return out, lse


def check_lse(lse, ref, what, tol=2e-3):
    lse, ref = np.asarray(jax.device_get(lse)), np.asarray(jax.device_get(ref))
    assert lse.shape == ref.shape and lse.dtype == np.float32, f"rank {RANK}: {what}: lse {lse.shape} {lse.dtype}"
    err = float(np.abs(lse - ref).max()) if lse.size else 0.0
    assert err < tol, f"rank {RANK}: {what}: lse off by {err}"


def check_attention():
    """attention under jit (causal, GQA 4:2, S = 300) against an fp32 jnp reference; ring_attention
    on the zigzag shards of the same sequence (alike on every rank) against the shard of the
    single-GPU result (the same engine, the blocks in another order: close, not equal), S = 301
    with seq_len given where 2 x world does not divide S."""
    def qkv(seq, d, seed):
        rng = np.random.default_rng(seed)
        return tuple(jnp.asarray(rng.standard_normal((2, seq, heads, d), dtype=np.float32), dtype=jnp.bfloat16)
                     for heads in (4, 2, 2))

    for d, causal, scale in ((64, True, None), (128, True, None), (128, False, 0.1)):
        attend = jax.jit(lambda q, k, v, c=causal, s=scale: ij.attention(q, k, v, causal=c, softmax_scale=s))
        q, k, v = qkv(300, d, 60 + d)
        out, lse = attend(put(q), put(k), put(v))
        ref_out, ref_lse = reference_attention(q, k, v, causal, scale or 1 / np.sqrt(d))
        what = f"jit attention d={d} causal={causal} scale={scale}"
        assert out.dtype == jnp.bfloat16, f"rank {RANK}: {what}: out is {out.dtype}"
        check(out, ref_out, what)
        check_lse(lse, ref_lse, what)
    for seq in (300, 301):
        seq_len = None if seq % (2 * WORLD) == 0 else seq
        ring = jax.jit(lambda q, k, v, n=seq_len: ij.ring_attention(q, k, v, group, causal=True, seq_len=n))
        attend = jax.jit(lambda q, k, v: ij.attention(q, k, v, causal=True))
        for step in range(2):  # fresh inputs, the same executables
            q, k, v = qkv(seq, 128, 70 + step)
            out, lse = attend(put(q), put(k), put(v))
            ring_out, ring_lse = ring(*(put(interlace.ring_attention_shard(x, RANK, WORLD)) for x in (q, k, v)))
            what = f"jit ring_attention S={seq} step {step}"
            check(ring_out, interlace.ring_attention_shard(out, RANK, WORLD), what)
            check_lse(ring_lse, interlace.ring_attention_shard(lse, RANK, WORLD, dim=2), what)
    group.check()


def main():
    w = put(shard(99, K, 7, N))  # the same weight on every rank
    gather = jax.jit(lambda x: ij.all_gather(x, group))
    matmul = jax.jit(lambda a, b: ij.gemm(a, b))
    block = jax.jit(lambda x, w: jax.nn.relu(ij.gemm(ij.all_gather(x, group), w)))
    fused = jax.jit(lambda x, w: ij.ag_gemm(x, w, group))
    for step in range(3):  # fresh inputs each step, the same compiled executables
        x = put(shard(RANK, 129, step))
        full = jnp.concatenate([shard(q, 129, step) for q in range(WORLD)])
        check(gather(x), full, f"jit all_gather step {step}", tol=0)
        check(ij.all_gather(x, group), full, f"eager all_gather step {step}", tol=0)
        check(matmul(x, w), reference_matmul(shard(RANK, 129, step), shard(99, K, 7, N)), f"jit gemm step {step}")
        ref = jax.nn.relu(reference_matmul(full, shard(99, K, 7, N)))
        check(block(x, w), ref, f"jit all_gather+gemm step {step}")
        check(fused(x, w), reference_matmul(full, shard(99, K, 7, N)), f"jit ag_gemm step {step}")
        group.check()
    # Uneven shards.
    rows = [64 + 8 * q for q in range(WORLD)]
    uneven = jax.jit(lambda x, w: ij.ag_gemm(x, w, group, shard_rows=rows))
    full = jnp.concatenate([shard(q, rows[q], 11) for q in range(WORLD)])
    check(uneven(put(shard(RANK, rows[RANK], 11)), w), reference_matmul(full, shard(99, K, 7, N)), "jit ag_gemm uneven")
    check_row_parallel()
    check_moe()
    check_moe_gemm_combine()
    check_moe_dispatch_gemm()
    check_attention()
    check_reductions()  # ends with a bad reduce_scatter call, as this ends with a bad gemm
    # An interlace.Error inside a handler comes back as a JAX error, not a crash (K not a multiple of 8).
    try:
        jax.block_until_ready(matmul(put(shard(RANK, 16, 0, 12)), put(shard(RANK, 12, 0, 16))))
    except Exception as e:  # noqa: BLE001 (XlaRuntimeError / JaxRuntimeError by version)
        print(f"rank {RANK}: bad gemm raised {type(e).__name__}: {str(e)[:200]}")
    else:
        raise AssertionError("gemm with K = 12 did not raise")
    group.check()
    print(f"rank {RANK}: jax.jit all_gather, gemm, ag_gemm, gemm_rs, gemm_ar, moe, moe_gemm_combine, "
          f"moe_dispatch_gemm, attention, "
          f"ring_attention, reduce_scatter, all_reduce correct (jax {jax.__version__})")


if __name__ == "__main__":
    main()
