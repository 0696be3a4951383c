"""interlace.jax under jax.jit on real GPUs, one process per GPU: the XLA FFI handlers run
all_gather, gemm, ag_gemm, gemm_rs, gemm_ar, reduce_scatter, all_reduce, the MoE ops, attention and
ring_attention on XLA's stream; results against jnp / jax.lax references, the reductions bit for bit
and all_reduce the same bits on every rank
(jax_ffi_worker.py). Skips, saying why, where jax is missing or has no GPU backend."""
import os
import subprocess
import sys

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
