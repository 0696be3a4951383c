"""interlace.jax.grouped_gemm on the CPU: the XLA FFI handler interlace_grouped_gemm exists in the
native module, and jax.jit of functions calling interlace.jax.grouped_gemm traces and lowers, for the
CUDA platform, to a stablehlo.custom_call with its operands (a, b, rows), attribute (cluster_m) and
result [G, C, N] in a's dtype; shapes and argument errors under jax.eval_shape. Lowering for CUDA
needs no GPU; running the call does (tests/gpu/test_jax_ffi_gpu.py), where the rows of the result
past min(rows[g], C) must be zeros (the handler zero-fills out first)."""
import re

import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (requirements-dev.txt pins jax/jaxlib 0.10.2)")
import jax.numpy as jnp  # noqa: E402

import interlace.jax as ij  # noqa: E402
from interlace import _interlace as _C  # noqa: E402


def lower_cuda(f, *args):
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def custom_calls(text):
    """[(target, operand types, attributes, result type)] of every stablehlo.custom_call in the text."""
    return re.findall(r"stablehlo\.custom_call @(\w+)\(.*?mhlo\.backend_config = \{(.*?)\}.*?\} : \((.*?)\) -> "
                      r"(tensor<[^>]*>)", text)


def sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def rows_sds(g):
    return sds((g,), jnp.int32)


def test_handler_is_a_capsule_and_a_target():
    handlers = _C._xla_ffi_handlers()
    assert "interlace_grouped_gemm" in ij.TARGETS
    assert type(handlers["interlace_grouped_gemm"]).__name__ == "PyCapsule"
    assert set(handlers) == set(ij.TARGETS)


def test_lowers_to_custom_call():
    text = lower_cuda(lambda a, b, rows: ij.grouped_gemm(a, b, rows), sds((8, 300, 128)), sds((8, 128, 520)),
                      rows_sds(8))
    [(target, attrs, operands, result)] = custom_calls(text)
    assert target == "interlace_grouped_gemm"
    assert operands == "tensor<8x300x128xbf16>, tensor<8x128x520xbf16>, tensor<8xi32>"
    assert result == "tensor<8x300x520xbf16>"
    assert "cluster_m = 0 : i64" in attrs
    text = lower_cuda(lambda a, b, rows: ij.grouped_gemm(a, b, rows, cluster_m=2), sds((2, 1, 8), jnp.float16),
                      sds((2, 8, 16), jnp.float16), rows_sds(2))
    [(_, attrs, _, result)] = custom_calls(text)
    assert result == "tensor<2x1x16xf16>"
    assert "cluster_m = 2 : i64" in attrs


def test_expert_ffn_lowers_to_two_calls():
    """Linear weights [G, N, K] go in swapped (XLA transposes them); the second call reads the first's
    result, rows past the counts included (zeros)."""
    def ffn(x, w1, w2, rows):
        h = jax.nn.relu(ij.grouped_gemm(x, jnp.swapaxes(w1, 1, 2), rows))
        return ij.grouped_gemm(h, jnp.swapaxes(w2, 1, 2), rows)

    args = sds((4, 256, 64)), sds((4, 96, 64)), sds((4, 64, 96)), rows_sds(4)
    calls = custom_calls(lower_cuda(ffn, *args))
    assert [c[0] for c in calls] == ["interlace_grouped_gemm"] * 2
    assert [c[3] for c in calls] == ["tensor<4x256x96xbf16>", "tensor<4x256x64xbf16>"]
    out = jax.eval_shape(ffn, *args)
    assert out.shape == (4, 256, 64) and out.dtype == jnp.bfloat16


def test_shapes_and_errors():
    out = jax.eval_shape(lambda a, b, r: ij.grouped_gemm(a, b, r), sds((3, 5, 16), jnp.float16),
                         sds((3, 16, 24), jnp.float16), rows_sds(3))
    assert out.shape == (3, 5, 24) and out.dtype == jnp.float16
    assert jax.eval_shape(lambda a, b, r: ij.grouped_gemm(a, b, r), sds((0, 5, 16)), sds((0, 16, 8)),
                          rows_sds(0)).shape == (0, 5, 8)
    bad = {
        "a 2-D": ((sds((5, 16)), sds((3, 16, 24)), rows_sds(3)), "must be 3-D"),
        "b 2-D": ((sds((3, 5, 16)), sds((16, 24)), rows_sds(3)), "must be 3-D"),
        "rows 2-D": ((sds((3, 5, 16)), sds((3, 16, 24)), sds((3, 1), jnp.int32)), "rows 1-D"),
        "K differs": ((sds((3, 5, 16)), sds((3, 8, 24)), rows_sds(3)), r"not \[G, C, K\], \[G, K, N\] and \[G\]"),
        "G differs in b": ((sds((3, 5, 16)), sds((2, 16, 24)), rows_sds(3)), r"not \[G, C, K\]"),
        "G differs in rows": ((sds((3, 5, 16)), sds((3, 16, 24)), rows_sds(4)), r"not \[G, C, K\]"),
        "rows uint32": ((sds((3, 5, 16)), sds((3, 16, 24)), sds((3,), jnp.uint32)), "rows must be int32"),
        "rows float": ((sds((3, 5, 16)), sds((3, 16, 24)), sds((3,), jnp.float32)), "rows must be int32"),
    }
    for what, (args, match) in bad.items():
        with pytest.raises(ValueError, match=match):
            jax.eval_shape(lambda a, b, r: ij.grouped_gemm(a, b, r), *args)
            pytest.fail(f"{what}: no error")
