"""examples/jax_distributed.py on real GPUs: 2 processes, each in a jax.distributed job with only its
own GPU (local_device_ids) and in an interlace group; all_gather, gemm, ag_gemm, reduce_scatter and
all_reduce under jax.jit against jax.lax / jnp references. Skips, saying why, where jax is missing
or has no GPU backend; on failure prints every rank's output."""
import os

import pytest

from interlace.bench.launch import expect_ranks_passed, run_ranks
from test_jax_ffi_gpu import jax_gpu_count  # tests/gpu is on sys.path (pytest's rootdir-less import)

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "jax_distributed.py")
pytestmark = pytest.mark.gpus(2)


def test_jax_distributed_example():
    count, why = jax_gpu_count()
    if count < 2:
        pytest.skip(why or f"jax sees {count} GPU(s), needs 2")
    report = expect_ranks_passed(run_ranks([EXAMPLE, "--steps", "3"], 2, 300))
    for rank in range(2):
        assert f"rank {rank}: all_gather, gemm, ag_gemm, reduce_scatter, all_reduce under jax.jit match" in report, report
