"""interlace.jax on the CPU: the XLA FFI handlers exist in the native module, and jax.jit of
functions calling interlace.jax.all_gather, gemm and ag_gemm traces and lowers, for the CUDA
platform, to stablehlo.custom_call ops with interlace's target names, attributes and result shapes.
Lowering for CUDA needs no GPU and no CUDA plugin; running the calls does (tests/gpu/test_jax_ffi_gpu.py).

The group is a real interlace.Group whose native group (which needs a GPU) is a stand-in; the
native registry that the handlers look groups up in is replaced by a recorder, since it takes only
a real native group (that it refuses anything else is tested too)."""
import re

import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (requirements-dev.txt pins jax/jaxlib 0.10.2)")
import jax.numpy as jnp  # noqa: E402

import interlace  # noqa: E402
import interlace.jax as ij  # noqa: E402
from interlace import _group  # noqa: E402
from interlace import _interlace as _C  # noqa: E402

WORLD = 4


@pytest.fixture
def group(monkeypatch):
    """An interlace.Group of WORLD ranks around a stand-in native group; registrations are recorded."""
    registered = []
    monkeypatch.setattr(_C, "_register_xla_group", lambda handle, native: registered.append((handle, native)))
    g = _group.Group.__new__(_group.Group)
    g._native = "native stand-in"
    g.rank, g.world_size, g.device, g.handle = 0, WORLD, 0, 4242
    g.registered = registered
    return g


def lower_cuda(f, *args):
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def custom_calls(text):
    """[(target, attributes, result type)] of every stablehlo.custom_call in the module text."""
    return re.findall(r"stablehlo\.custom_call @(\w+)\(.*?mhlo\.backend_config = \{(.*?)\}.*?-> (tensor<[^>]*>)", text)


def sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_handlers_are_capsules():
    handlers = _C._xla_ffi_handlers()
    assert set(handlers) == set(ij.TARGETS)
    for name, capsule in handlers.items():
        assert type(capsule).__name__ == "PyCapsule", name


def test_targets_register_for_cuda():
    ij._register()
    ij._register()  # once only; a second call is a no-op
    assert ij._registered


def test_register_group_takes_only_native_groups():
    with pytest.raises(TypeError):
        _C._register_xla_group(1, object())


def test_gemm_lowers_to_custom_call():
    text = lower_cuda(lambda a, b: ij.gemm(a, b), sds((256, 128)), sds((128, 512)))
    [(target, attrs, result)] = custom_calls(text)
    assert target == "interlace_gemm"
    assert result == "tensor<256x512xbf16>"
    assert "pingpong = 1 : i64" in attrs and "band_m = 0 : i64" in attrs
    text = lower_cuda(lambda a, b: ij.gemm(a, b, pingpong=False, tile_n=256), sds((64, 128), jnp.float16),
                      sds((128, 64), jnp.float16))
    [(_, attrs, result)] = custom_calls(text)
    assert result == "tensor<64x64xf16>"
    assert "pingpong = 0 : i64" in attrs and "tile_n = 256 : i64" in attrs


def test_all_gather_lowers_to_custom_call(group):
    text = lower_cuda(lambda x: ij.all_gather(x, group, num_blocks=8), sds((128, 256)))
    [(target, attrs, result)] = custom_calls(text)
    assert target == "interlace_all_gather"
    assert result == f"tensor<{WORLD * 128}x256xbf16>"
    assert f"group = {group.handle} : i64" in attrs and "num_blocks = 8 : i64" in attrs
    assert group.registered == [(group.handle, "native stand-in")]


def test_ag_gemm_lowers_to_custom_call(group):
    text = lower_cuda(lambda x, w: ij.ag_gemm(x, w, group), sds((128, 256)), sds((256, 384)))
    [(target, attrs, result)] = custom_calls(text)
    assert target == "interlace_ag_gemm"
    assert result == f"tensor<{WORLD * 128}x384xbf16>"
    assert f"group = {group.handle} : i64" in attrs
    rows = [100, 156, 128, 128]
    text = lower_cuda(lambda x, w: ij.ag_gemm(x, w, group, shard_rows=rows), sds((100, 256)), sds((256, 384)))
    [(_, attrs, result)] = custom_calls(text)
    assert result == f"tensor<{sum(rows)}x384xbf16>"
    assert "shard_rows = dense<[100, 156, 128, 128]> : tensor<4xi64>" in attrs


def test_composed_block_lowers(group):
    def block(x, w):
        return jax.nn.relu(ij.gemm(ij.all_gather(x, group), w)), ij.ag_gemm(x, w, group)

    calls = custom_calls(lower_cuda(block, sds((128, 256)), sds((256, 384))))
    assert [c[0] for c in calls] == ["interlace_all_gather", "interlace_gemm", "interlace_ag_gemm"]
    out = jax.eval_shape(block, sds((128, 256)), sds((256, 384)))
    assert [o.shape for o in out] == [(WORLD * 128, 384)] * 2 and all(o.dtype == jnp.bfloat16 for o in out)


def test_shapes(group):
    assert jax.eval_shape(lambda x: ij.all_gather(x, group), sds((), jnp.float32)).shape == (WORLD,)
    assert jax.eval_shape(lambda x: ij.all_gather(x, group), sds((3, 5, 7), jnp.float32)).shape == (WORLD * 3, 5, 7)
    with pytest.raises(ValueError, match="2-D"):
        jax.eval_shape(lambda a, b: ij.gemm(a, b), sds((2, 3, 4)), sds((4, 8)))


def test_needs_an_interlace_group():
    with pytest.raises(TypeError, match="interlace.Group"):
        jax.eval_shape(lambda x: ij.all_gather(x, object()), sds((4, 8)))
