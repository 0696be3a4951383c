"""interlace.jax under jax.jit on real GPUs, one process per GPU: the XLA FFI handlers run
all_gather, gemm, ag_gemm, gemm_rs, gemm_ar, reduce_scatter, all_reduce, the MoE ops, attention and
ring_attention on XLA's stream; results against jnp / jax.lax references, the reductions bit for bit
and all_reduce the same bits on every rank
(jax_ffi_worker.py). Skips, saying why, where jax is missing or has no GPU backend."""
import os
import subprocess
import sys
import textwrap

import pytest

from interlace.bench.launch import expect_ranks_passed, run_ranks

WORKER = os.path.join(os.path.dirname(__file__), "jax_ffi_worker.py")
pytestmark = pytest.mark.gpus(2)


def jax_gpu_count():
    """GPUs JAX sees, asked in a child process (this one keeps no JAX GPU client), or why none."""
    probe = "import jax; print(len(jax.devices('gpu')))"
    try:
        res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"))
    except subprocess.TimeoutExpired:
        return 0, "probing jax's GPU backend timed out"
    if res.returncode != 0:
        return 0, "jax has no GPU backend here: " + (res.stderr.strip().splitlines() or ["?"])[-1]
    return int(res.stdout.strip().splitlines()[-1]), None


def test_jax_jit_ops():
    count, why = jax_gpu_count()
    if count < 2:
        pytest.skip(why or f"jax sees {count} GPU(s), needs 2")
    expect_ranks_passed(run_ranks([WORKER], 2, 300))


# interlace.jax.grouped_gemm on one GPU, in a child process (this one keeps no JAX GPU client): an
# expert FFN under jax.jit (Linear weights swapped, relu, a second grouped_gemm) with new row counts
# every run of the same executable, one call per cluster_m, eagerly too, K = 0, and a bad call. Rows
# of the result at or past min(rows[g], C) must be zeros, bit for bit, in every run (the handler
# zero-fills out first; XLA may hand a run the buffer an earlier run wrote).
GROUPED_GEMM = textwrap.dedent("""
    import os
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax, jax.numpy as jnp, numpy as np
    import interlace.jax as ij

    G, C, K, F = 8, 300, 256, 520
    rng = np.random.default_rng(5)

    def bf16(shape, scale=1.0):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * scale, dtype=jnp.bfloat16)

    def f32(x):
        return np.asarray(jax.device_get(x)).astype(np.float32)

    def check(out, ref_rows, counts, what):
        # ref_rows(i, r): the fp32 reference of group i's first r rows.
        out = np.asarray(jax.device_get(out))
        assert out.shape[:2] == (G, C), (what, out.shape)
        for i, count in enumerate(counts):
            r = min(count, C)
            rest = out[i, r:].view(np.uint16)
            assert not rest.any(), f"{what}: group {i}: {int((rest != 0).sum())} elements past row {r} are not +0"
            if r:
                ref, got = ref_rows(i, r), out[i, :r].astype(np.float32)
                err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                assert err < 1e-2, f"{what}: group {i} (r {r}) relative error {err}"

    w1, w2 = bf16((G, F, K)), bf16((G, F, K), 1 / 8)  # w1 Linear weights [G, F, K]; w2 [G, K_in = F, N = K]
    ffn = jax.jit(lambda x, w1, w2, rows: ij.grouped_gemm(
        jax.nn.relu(ij.grouped_gemm(x, jnp.swapaxes(w1, 1, 2), rows)), w2, rows))
    up = {cm: jax.jit(lambda x, w1, rows, cm=cm: ij.grouped_gemm(x, jnp.swapaxes(w1, 1, 2), rows, cluster_m=cm))
          for cm in (0, 1, 2)}
    patterns = [[C] * G, [C // (i + 2) for i in range(G)], [0] * G, [2**31 - 1] + [C + 1 + i for i in range(G - 1)],
                [0] * (G - 1) + [C], [0, 1, 77, 150, 299, C, 1000, 128]]
    for step, counts in enumerate(patterns + [rng.integers(0, C + 1, G).tolist() for _ in range(2)]):
        x = bf16((G, C, K))
        rows = jnp.asarray(counts, dtype=jnp.int32)
        xf, w1f, w2f = f32(x), f32(w1), f32(w2)
        first = lambda i, r: xf[i, :r] @ w1f[i].T
        second = lambda i, r: f32(jnp.asarray(np.maximum(first(i, r), 0), dtype=jnp.bfloat16)) @ w2f[i]
        check(ffn(x, w1, w2, rows), second, counts, f"jit ffn step {step} rows {counts}")
        for cm, fn in up.items():
            check(fn(x, w1, rows), first, counts, f"jit cluster_m={cm} step {step} rows {counts}")
        if step == 1:
            check(ij.grouped_gemm(x, jnp.swapaxes(w1, 1, 2), rows), first, counts, "eager")
    # K = 0: the first r_g rows are zeros from the kernel, the rest from the handler's fill.
    out = jax.jit(ij.grouped_gemm)(jnp.zeros((G, C, 0), jnp.float16), jnp.zeros((G, 0, 136), jnp.float16),
                                   jnp.asarray(patterns[-1], dtype=jnp.int32))
    assert out.dtype == jnp.float16 and not np.asarray(jax.device_get(out)).view(np.uint16).any(), "K = 0"
    # An interlace.Error inside the handler comes back as a JAX error (K not a multiple of 8).
    try:
        jax.block_until_ready(jax.jit(ij.grouped_gemm)(bf16((2, 16, 12)), bf16((2, 12, 16)),
                                                       jnp.asarray([4, 4], dtype=jnp.int32)))
    except Exception as e:  # noqa: BLE001 (XlaRuntimeError / JaxRuntimeError by version)
        print(f"bad grouped_gemm raised {type(e).__name__}: {str(e)[:200]}")
    else:
        raise AssertionError("grouped_gemm with K = 12 did not raise")
    print(f"jax.jit grouped_gemm correct (jax {jax.__version__})")
""")


@pytest.mark.gpus(1)
def test_jax_grouped_gemm():
    import torch
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        pytest.skip(f"grouped_gemm needs a Hopper GPU (sm_90a); this one is sm_{major}{minor}")
    count, why = jax_gpu_count()
    if count < 1:
        pytest.skip(why or "jax sees no GPU")
    r = subprocess.run([sys.executable, "-c", GROUPED_GEMM], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0")))
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "jax.jit grouped_gemm correct" in r.stdout, r.stdout + r.stderr
