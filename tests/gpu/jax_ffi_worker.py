"""One rank of interlace.jax under jax.jit (see test_jax_ffi_gpu.py): all_gather, gemm and ag_gemm as
XLA FFI custom calls on XLA's stream, checked against jnp / jax.lax references. One process per GPU;
each process's JAX sees every GPU and computes on the one its interlace group uses."""
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
    # An interlace.Error inside a handler comes back as a JAX error, not a crash (K not a multiple of 8).
    try:
        jax.block_until_ready(matmul(put(shard(RANK, 16, 0, 12)), put(shard(RANK, 12, 0, 16))))
    except Exception as e:  # noqa: BLE001 (XlaRuntimeError / JaxRuntimeError by version)
        print(f"rank {RANK}: bad gemm raised {type(e).__name__}: {str(e)[:200]}")
    else:
        raise AssertionError("gemm with K = 12 did not raise")
    group.check()
    print(f"rank {RANK}: jax.jit all_gather, gemm, ag_gemm correct (jax {jax.__version__})")


if __name__ == "__main__":
    main()
