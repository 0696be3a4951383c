"""interlace.jax on the CPU: the XLA FFI handlers exist in the native module, and jax.jit of
functions calling interlace.jax.all_gather, gemm, ag_gemm, gemm_rs, gemm_ar, reduce_scatter,
all_reduce, moe_dispatch, moe_combine, moe_dispatch_gemm, moe_gemm_combine, attention and
ring_attention traces and lowers, for the CUDA platform, to stablehlo.custom_call ops with interlace's
target names, attributes and result shapes. Lowering for CUDA needs no GPU and no CUDA plugin; running the calls
does (tests/gpu/test_jax_ffi_gpu.py).

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


def typed_custom_calls(text):
    """[(target, attributes, operand types, result types)] of every stablehlo.custom_call in the module text."""
    return re.findall(r"stablehlo\.custom_call @(\w+)\(.*?mhlo\.backend_config = \{(.*?)\}.*?\} : \((.*?)\) -> (.*)",
                      text)


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


def test_gemm_rs_and_gemm_ar_lower_to_custom_calls(group):
    text = lower_cuda(lambda x, w: ij.gemm_rs(x, w, group), sds((512, 64)), sds((64, 384)))
    [(target, attrs, result)] = custom_calls(text)
    assert target == "interlace_gemm_rs"
    assert result == f"tensor<{512 // WORLD}x384xbf16>"
    assert f"group = {group.handle} : i64" in attrs and "reduce_ctas = 0 : i64" in attrs
    rows = [100, 156, 128, 128]  # rank 0's block is 100 rows
    text = lower_cuda(lambda x, w: ij.gemm_rs(x, w, group, shard_rows=rows), sds((512, 64)), sds((64, 384)))
    [(_, attrs, result)] = custom_calls(text)
    assert result == "tensor<100x384xbf16>"
    assert "shard_rows = dense<[100, 156, 128, 128]> : tensor<4xi64>" in attrs
    text = lower_cuda(lambda x, w: ij.gemm_ar(x, w, group, pingpong=False), sds((512, 64)), sds((64, 384)))
    [(target, attrs, result)] = custom_calls(text)
    assert target == "interlace_gemm_ar"
    assert result == "tensor<512x384xbf16>"
    assert "pingpong = 0 : i64" in attrs


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


def test_reduce_scatter_lowers_to_custom_call(group):
    text = lower_cuda(lambda x: ij.reduce_scatter(x, group, chunk_bytes=65536), sds((WORLD * 64, 256), jnp.float32))
    [(target, attrs, result)] = custom_calls(text)
    assert target == "interlace_reduce_scatter"
    assert result == "tensor<64x256xf32>"
    assert f"group = {group.handle} : i64" in attrs and "chunk_bytes = 65536 : i64" in attrs
    assert "num_blocks = 0 : i64" in attrs
    assert group.registered == [(group.handle, "native stand-in")]
    text = lower_cuda(lambda x: ij.reduce_scatter(x, group), sds((WORLD * 3, 5, 8)))
    [(_, _, result)] = custom_calls(text)
    assert result == "tensor<3x5x8xbf16>"


def test_all_reduce_lowers_to_custom_call(group):
    text = lower_cuda(lambda x: ij.all_reduce(x, group), sds((100, 7), jnp.float16))
    [(target, attrs, result)] = custom_calls(text)
    assert target == "interlace_all_reduce"
    assert result == "tensor<100x7xf16>"
    assert f"group = {group.handle} : i64" in attrs and "algorithm = 0 : i64" in attrs
    # The algorithm's name becomes ReduceAlgorithm's value, as interlace.all_reduce passes it.
    for name, value in (("one_shot", 2), ("two_shot", 3)):
        text = lower_cuda(lambda x, n=name: ij.all_reduce(x, group, algorithm=n, num_blocks=16), sds((4096,)))
        [(_, attrs, result)] = custom_calls(text)
        assert result == "tensor<4096xbf16>"
        assert f"algorithm = {value} : i64" in attrs and "num_blocks = 16 : i64" in attrs
    assert ij._REDUCE_ALGORITHMS == interlace._REDUCE_ALGORITHMS


def test_reduce_argument_errors(group):
    with pytest.raises(ValueError, match="blocks along axis 0"):
        jax.eval_shape(lambda x: ij.reduce_scatter(x, group), sds((WORLD * 3 + 1, 8)))
    with pytest.raises(ValueError, match="blocks along axis 0"):
        jax.eval_shape(lambda x: ij.reduce_scatter(x, group), sds((), jnp.float32))
    with pytest.raises(ValueError, match="algorithm must be one of"):
        jax.eval_shape(lambda x: ij.all_reduce(x, group, algorithm="ring"), sds((8,)))
    with pytest.raises(TypeError, match="interlace.Group"):
        jax.eval_shape(lambda x: ij.all_reduce(x, object()), sds((4, 8)))


def test_composed_block_lowers(group):
    def block(x, w):
        return jax.nn.relu(ij.gemm(ij.all_gather(x, group), w)), ij.ag_gemm(x, w, group)

    calls = custom_calls(lower_cuda(block, sds((128, 256)), sds((256, 384))))
    assert [c[0] for c in calls] == ["interlace_all_gather", "interlace_gemm", "interlace_ag_gemm"]

    def tensor_parallel_mlp(x, w1, w2):  # column-parallel, then row-parallel with the sum over ranks
        return ij.all_reduce(jax.nn.relu(ij.ag_gemm(x, w1, group)) @ w2, group)

    calls = custom_calls(lower_cuda(tensor_parallel_mlp, sds((128, 256)), sds((256, 384)), sds((384, 256))))
    assert [c[0] for c in calls] == ["interlace_ag_gemm", "interlace_all_reduce"]
    out = jax.eval_shape(block, sds((128, 256)), sds((256, 384)))
    assert [o.shape for o in out] == [(WORLD * 128, 384)] * 2 and all(o.dtype == jnp.bfloat16 for o in out)


def test_shapes(group):
    assert jax.eval_shape(lambda x: ij.all_gather(x, group), sds((), jnp.float32)).shape == (WORLD,)
    assert jax.eval_shape(lambda x: ij.all_gather(x, group), sds((3, 5, 7), jnp.float32)).shape == (WORLD * 3, 5, 7)
    with pytest.raises(ValueError, match="2-D"):
        jax.eval_shape(lambda a, b: ij.gemm(a, b), sds((2, 3, 4)), sds((4, 8)))
    assert jax.eval_shape(lambda x: ij.reduce_scatter(x, group), sds((WORLD * 2, 3), jnp.float32)).shape == (2, 3)
    out = jax.eval_shape(lambda x: ij.all_reduce(x, group), sds((3, 5, 7), jnp.float16))
    assert out.shape == (3, 5, 7) and out.dtype == jnp.float16


def test_needs_an_interlace_group():
    with pytest.raises(TypeError, match="interlace.Group"):
        jax.eval_shape(lambda x: ij.all_gather(x, object()), sds((4, 8)))


def test_register_moe_takes_only_native_handles():
    with pytest.raises(TypeError):
        _C._register_xla_moe(1, object())


def moe_buffers_stand_in(group):
    """An interlace.jax.MoeBuffers (the real one needs a GPU) of 8 local experts, 96 rows each, hidden 256."""
    from types import SimpleNamespace
    native = SimpleNamespace(num_experts=8 * WORLD, world_size=WORLD, recv_rows=8 * 96, hidden=256)
    buffers = ij.MoeBuffers.__new__(ij.MoeBuffers)
    buffers.native, buffers.group, buffers.handle = native, group, 77
    return buffers


def test_moe_dispatch_and_combine_lower_to_custom_calls(group):
    buffers = moe_buffers_stand_in(group)

    def layer(x, idx, w):
        ex, starts, rows = ij.moe_dispatch(x, idx, w, buffers)
        return ij.moe_combine(ex * 2, buffers, tokens=x.shape[0]), starts, rows

    text = lower_cuda(layer, sds((64, 256)), sds((64, 2), jnp.int32), sds((64, 2), jnp.float32))
    calls = re.findall(r"stablehlo\.custom_call @(\w+)\(.*?mhlo\.backend_config = \{(.*?)\}.*?-> (.*)", text)
    assert [c[0] for c in calls] == ["interlace_moe_dispatch", "interlace_moe_combine"], text
    (_, dispatch_attrs, dispatch_results), (_, combine_attrs, combine_result) = calls
    for attrs in (dispatch_attrs, combine_attrs):
        assert "moe = 77 : i64" in attrs and "group = 4242 : i64" in attrs
    assert "tensor<768x256xbf16>, tensor<8xi32>, tensor<8xi32>" in dispatch_results
    assert "tensor<64x256xbf16>" in combine_result
    assert group.registered and group.registered[-1][0] == 4242


def test_moe_gemm_combine_lowers_to_custom_call(group):
    """A layer with the fused second matmul: dispatch, an activation on the received rows, then
    moe_gemm_combine with w [L, F, H] (F = 512 here); Linear weights [L, H, F] go in swapped."""
    buffers = moe_buffers_stand_in(group)

    def layer(x, idx, w, w1, linear):
        ex, _, _ = ij.moe_dispatch(x, idx, w, buffers)
        act = jax.nn.relu(ex @ w1)  # [recv_rows, F]
        return ij.moe_gemm_combine(act, jnp.swapaxes(linear, 1, 2), buffers, tokens=x.shape[0], cluster_m=2)

    args = sds((64, 256)), sds((64, 2), jnp.int32), sds((64, 2), jnp.float32), sds((256, 512)), sds((8, 256, 512))
    text = lower_cuda(layer, *args)
    calls = typed_custom_calls(text)
    assert [c[0] for c in calls] == ["interlace_moe_dispatch", "interlace_moe_gemm_combine"], text
    _, attrs, operands, result = calls[1]
    assert "moe = 77 : i64" in attrs and "group = 4242 : i64" in attrs and "cluster_m = 2 : i64" in attrs
    assert operands == "tensor<768x512xbf16>, tensor<8x512x256xbf16>", operands
    assert result == "tensor<64x256xbf16>", result
    assert group.registered and group.registered[-1][0] == 4242
    def fused(act, w):  # cluster_m left out: 0, automatic
        return ij.moe_gemm_combine(act, w, buffers, tokens=5)

    out = jax.eval_shape(fused, sds((768, 64)), sds((8, 64, 256)))
    assert out.shape == (5, 256) and out.dtype == jnp.bfloat16
    [(_, attrs, _)] = custom_calls(lower_cuda(fused, sds((768, 64)), sds((8, 64, 256))))
    assert "cluster_m = 0 : i64" in attrs


def test_moe_dispatch_gemm_lowers_to_custom_call(group):
    """The whole layer fused: moe_dispatch_gemm (w1 [L, hidden, N]), an activation, moe_gemm_combine."""
    buffers = moe_buffers_stand_in(group)

    def layer(x, idx, w, w1, w2):
        h, starts, rows = ij.moe_dispatch_gemm(x, idx, w, w1, buffers, cluster_m=2)
        return ij.moe_gemm_combine(jax.nn.relu(h), w2, buffers, tokens=x.shape[0]), starts, rows

    args = (sds((64, 256)), sds((64, 2), jnp.int32), sds((64, 2), jnp.float32), sds((8, 256, 512)),
            sds((8, 512, 256)))
    text = lower_cuda(layer, *args)
    calls = typed_custom_calls(text)
    assert [c[0] for c in calls] == ["interlace_moe_dispatch_gemm", "interlace_moe_gemm_combine"], text
    _, attrs, operands, results = calls[0]
    assert "moe = 77 : i64" in attrs and "group = 4242 : i64" in attrs and "cluster_m = 2 : i64" in attrs
    assert operands == "tensor<64x256xbf16>, tensor<64x2xi32>, tensor<64x2xf32>, tensor<8x256x512xbf16>", operands
    assert "tensor<768x512xbf16>, tensor<8xi32>, tensor<8xi32>" in results, results
    for what, w1, match in (("w1 as Linear's [L, N, H]", sds((8, 512, 256)), r"is not \[L, hidden, N\]"),
                            ("w1 2-D", sds((256, 512)), r"is not \[L, hidden, N\]"),
                            ("w1 float16", sds((8, 256, 512), jnp.float16), "must be bfloat16")):
        with pytest.raises(ValueError, match=match):
            jax.eval_shape(lambda *a: ij.moe_dispatch_gemm(*a, buffers), *args[:3], w1)
            pytest.fail(f"{what}: no error")


def test_moe_gemm_combine_argument_errors(group):
    buffers = moe_buffers_stand_in(group)
    act, w = sds((768, 64)), sds((8, 64, 256))
    bad = {
        "act 1-D": ((sds((768,)), w), r"are not \[recv_rows, F\] and \[L, F, H\]"),
        "w 2-D": ((act, sds((64, 256))), r"are not \[recv_rows, F\]"),
        "F differs": ((act, sds((8, 72, 256))), r"are not \[recv_rows, F\]"),
        "w as Linear's [L, H, F]": ((act, sds((8, 256, 64))), r"are not \[recv_rows, F\]"),
        "act float32": ((sds((768, 64), jnp.float32), w), "must be bfloat16"),
        "w float16": ((act, sds((8, 64, 256), jnp.float16)), "must be bfloat16"),
    }
    for what, (args, match) in bad.items():
        with pytest.raises(ValueError, match=match):
            jax.eval_shape(lambda a, b: ij.moe_gemm_combine(a, b, buffers, tokens=5), *args)
            pytest.fail(f"{what}: no error")
    buffers.group = object()
    with pytest.raises(TypeError, match="interlace.Group"):
        jax.eval_shape(lambda a, b: ij.moe_gemm_combine(a, b, buffers, tokens=5), act, w)


def attention_calls(text):
    """[(target, attributes, operand types, result types)] of every two-result stablehlo.custom_call."""
    return re.findall(r"stablehlo\.custom_call @(\w+)\(.*?mhlo\.backend_config = \{(.*?)\}"
                      r".*?\} : \((.*?)\) -> \((.*?)\)\n", text)


def test_attention_lowers_to_custom_call():
    q, kv = sds((2, 300, 4, 64)), sds((2, 300, 2, 64))  # GQA 4:2
    text = lower_cuda(lambda q, k, v: ij.attention(q, k, v, causal=True), q, kv, kv)
    [(target, attrs, operands, results)] = attention_calls(text)
    assert target == "interlace_attention"
    assert operands == "tensor<2x300x4x64xbf16>, tensor<2x300x2x64xbf16>, tensor<2x300x2x64xbf16>"
    assert results == "tensor<2x300x4x64xbf16>, tensor<2x4x300xf32>"
    assert "causal = true" in attrs and "softmax_scale = 0.000000e+00 : f64" in attrs
    assert "group" not in attrs
    text = lower_cuda(lambda q, k, v: ij.attention(q, k, v, softmax_scale=0.125), sds((1, 7, 8, 128), jnp.float16),
                      sds((1, 33, 8, 128), jnp.float16), sds((1, 33, 8, 128), jnp.float16))
    [(_, attrs, _, results)] = attention_calls(text)
    assert results == "tensor<1x7x8x128xf16>, tensor<1x8x7xf32>"
    assert "causal = false" in attrs and "softmax_scale = 1.250000e-01 : f64" in attrs


def test_ring_attention_lowers_to_custom_call(group):
    q, kv = sds((2, 128, 8, 128)), sds((2, 128, 2, 128))
    text = lower_cuda(lambda q, k, v: ij.ring_attention(q, k, v, group, causal=True), q, kv, kv)
    [(target, attrs, operands, results)] = attention_calls(text)
    assert target == "interlace_ring_attention"
    assert operands == "tensor<2x128x8x128xbf16>, tensor<2x128x2x128xbf16>, tensor<2x128x2x128xbf16>"
    assert results == "tensor<2x128x8x128xbf16>, tensor<2x8x128xf32>"
    assert f"group = {group.handle} : i64" in attrs and "seq_len = 0 : i64" in attrs
    assert "causal = true" in attrs and "softmax_scale = 0.000000e+00 : f64" in attrs
    assert group.registered == [(group.handle, "native stand-in")]
    text = lower_cuda(lambda q, k, v: ij.ring_attention(q, k, v, group, softmax_scale=0.5, seq_len=509), q, kv, kv)
    [(_, attrs, _, _)] = attention_calls(text)
    assert "causal = false" in attrs and "softmax_scale = 5.000000e-01 : f64" in attrs
    assert "seq_len = 509 : i64" in attrs


def test_attention_shapes_and_errors(group):
    out, lse = jax.eval_shape(lambda q, k, v: ij.attention(q, k, v), sds((3, 5, 6, 64), jnp.float16),
                              sds((3, 9, 3, 64), jnp.float16), sds((3, 9, 3, 64), jnp.float16))
    assert out.shape == (3, 5, 6, 64) and out.dtype == jnp.float16
    assert lse.shape == (3, 6, 5) and lse.dtype == jnp.float32
    out, lse = jax.eval_shape(lambda q, k, v: ij.ring_attention(q, k, v, group, causal=True), sds((1, 64, 4, 128)),
                              sds((1, 64, 4, 128)), sds((1, 64, 4, 128)))
    assert out.shape == (1, 64, 4, 128) and out.dtype == jnp.bfloat16
    assert lse.shape == (1, 4, 64) and lse.dtype == jnp.float32
    q = sds((1, 64, 4, 64))
    for scale in (0, -1.0, float("nan")):  # 0 given on purpose must not mean 1 / sqrt(D)
        with pytest.raises(interlace.Error, match="softmax_scale .* must be positive"):
            jax.eval_shape(lambda q, k, v, s=scale: ij.attention(q, k, v, softmax_scale=s), q, q, q)
        with pytest.raises(interlace.Error, match="softmax_scale .* must be positive"):
            jax.eval_shape(lambda q, k, v, s=scale: ij.ring_attention(q, k, v, group, softmax_scale=s), q, q, q)
    with pytest.raises(ValueError, match=r"not \[B, S, H, D\] alike"):
        jax.eval_shape(lambda q, k, v: ij.attention(q, k, v), sds((64, 4, 64)), q, q)
    with pytest.raises(ValueError, match=r"not \[B, S, H, D\] alike"):
        jax.eval_shape(lambda q, k, v: ij.attention(q, k, v), q, q, sds((1, 32, 4, 64)))
    with pytest.raises(ValueError, match=r"not \[B, S, H, D\] alike"):
        jax.eval_shape(lambda q, k, v: ij.ring_attention(q, k, v, group), q, sds((1, 64, 4, 128)), sds((1, 64, 4, 128)))
    with pytest.raises(TypeError, match="interlace.Group"):
        jax.eval_shape(lambda q, k, v: ij.ring_attention(q, k, v, object()), q, q, q)
