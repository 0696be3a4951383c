"""examples/jax_distributed.py on the CPU: its jitted step lowers for CUDA to the five interlace
custom calls, its jax.lax references agree with numpy's (the reductions bit for bit with the fp32
sum in rank order), and its comparison catches what it must. Running it needs 2 GPUs
(tests/gpu/test_jax_distributed_gpu.py)."""
import importlib.util
import os
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (requirements-dev.txt pins jax/jaxlib 0.10.2)")
import jax.numpy as jnp  # noqa: E402

from interlace import _group  # noqa: E402
from interlace import _interlace as _C  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "jax_distributed.py")
WORLD = 2


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("jax_distributed_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def group(monkeypatch):
    """An interlace.Group of WORLD ranks around a stand-in native group (as in test_jax_ffi.py)."""
    monkeypatch.setattr(_C, "_register_xla_group", lambda handle, native: None)
    g = _group.Group.__new__(_group.Group)
    g._native = "native stand-in"
    g.rank, g.world_size, g.device, g.handle = 0, WORLD, 0, 77
    return g


def test_step_lowers_to_interlace_custom_calls(example, group):
    x, r = example.inputs(0, 0, WORLD)
    w = example.weight(0)
    text = jax.jit(example.make_step(group)).trace(x, w, r).lower(lowering_platforms=("cuda",)).as_text()
    targets = sorted(re.findall(r"stablehlo\.custom_call @(\w+)", text))
    assert targets == sorted(["interlace_all_gather", "interlace_gemm", "interlace_ag_gemm", "interlace_reduce_scatter",
                              "interlace_all_reduce", "interlace_all_reduce"])
    shapes = jax.eval_shape(example.make_step(group), x, w, r)
    ref = jax.eval_shape(example.reference_step, np.stack([x] * WORLD), w, np.stack([r] * WORLD), 0)
    assert {k: (v.shape, v.dtype) for k, v in shapes.items()} == {k: (v.shape, v.dtype) for k, v in ref.items()}


def test_references_match_numpy(example):
    everyone = [example.inputs(q, 1, WORLD) for q in range(WORLD)]
    w = example.weight(1)
    for rank in range(WORLD):
        ref = example.reference_step(np.stack([e[0] for e in everyone]), w, np.stack([e[1] for e in everyone]), rank)
        total = (everyone[0][1].astype(np.float32) + everyone[1][1].astype(np.float32)).astype(jnp.bfloat16)
        block = total.shape[0] // WORLD
        gathered = np.concatenate([e[0] for e in everyone])
        want = {"all_gather": gathered, "all_reduce": total, "reduce_scatter": total[rank * block:(rank + 1) * block],
                "all_reduce_small": (everyone[0][0].astype(np.float32) + everyone[1][0].astype(np.float32)).astype(
                    jnp.bfloat16),
                "gemm": everyone[rank][0].astype(np.float32) @ w.astype(np.float32),
                "ag_gemm": gathered.astype(np.float32) @ w.astype(np.float32)}
        for name, value in want.items():
            assert example.compare(name, ref[name], value, rank, 1) == "", name


def test_compare_reports_differences(example):
    a = np.ones((4, 8), jnp.bfloat16)
    b = a.copy()
    b[1, 2] = 2
    assert "1 of 32 elements differ, first at flat index 10" in example.compare("all_reduce", a, b, 0, 0)
    assert "shape" in example.compare("all_gather", a, a[:2], 0, 0)
    assert example.compare("gemm", a, a * 1.001, 0, 0) == ""  # GEMMs within bf16 rounding
    assert "relative error" in example.compare("gemm", a, b * 2, 0, 0)


def test_args_from_the_launchers_environment(example, monkeypatch):
    monkeypatch.setattr("sys.argv", ["jax_distributed.py"])
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "4000"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    args = example.parse_args()
    assert (args.rank, args.world_size, args.local_rank, args.master_addr, args.master_port) == (1, 2, 1, "10.0.0.5", 4000)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr("sys.argv", ["jax_distributed.py", "--master_port", "5000"])
    args = example.parse_args()
    assert (args.local_rank, args.master_port) == (0, 5000)
