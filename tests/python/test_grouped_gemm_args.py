"""grouped_gemm's argument checks, run before any GPU work, driven through DLPack from numpy (float16,
int32 counts)."""
import ctypes

import numpy as np
import pytest

import interlace
from interlace import _interlace as _C
from interlace._interlace import _check_grouped_gemm_args as check


def zeros(n, dtype, misalign=0):
    """n zeros starting `misalign` bytes past a 16-byte boundary (numpy itself promises less)."""
    item = np.dtype(dtype).itemsize
    buf = np.zeros(n + 16 // item, dtype)
    start = ((-buf.ctypes.data) % 16 + misalign) // item
    return buf[start:start + n]


def f16(*shape, misalign=0):
    return zeros(int(np.prod(shape)), np.float16, misalign).reshape(shape)


def counts(g):
    return np.zeros(g, np.int32)


def strided(shape, strides, dtype=np.float16, reach=8):
    """A view with any shape and element strides over `reach` elements (the checks never read them).
    The bytes it claims may run past them, over other arrays: the overlap checks then see operands
    overlap by chance of allocation. Valid layouts that must pass use apart()."""
    base = zeros(reach, dtype)
    return np.lib.stride_tricks.as_strided(base, shape=shape, strides=tuple(base.itemsize * s for s in strides))


def apart(shape, strides):
    """strided over memory of its own as long as the view's reach (non-negative strides)."""
    return strided(shape, strides, reach=1 + sum((n - 1) * s for n, s in zip(shape, strides)))


# Host arrays fail the device check, which comes last. To see valid layouts pass and what they
# return, on_gpu hands over an array as a DLPack capsule claiming cuda:0: the checks read only its
# address, dtype, shape and strides.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_KEEP = []  # what the capsules point into (they have no deleter): alive until the tests end
KDL_CUDA, KDL_INT, KDL_FLOAT, KDL_BFLOAT = 2, 0, 2, 4


def on_gpu(x, code=None):
    code = {"f": KDL_FLOAT, "i": KDL_INT}[x.dtype.kind] if code is None else code
    shape = (ctypes.c_int64 * x.ndim)(*x.shape)
    strides = (ctypes.c_int64 * x.ndim)(*(s // x.itemsize for s in x.strides))
    mt = _DLManagedTensor(_DLTensor(x.ctypes.data, _DLDevice(KDL_CUDA, 0), x.ndim,
                                    _DLDataType(code, 8 * x.itemsize, 1), shape, strides, 0), None, None)
    _KEEP.append((x, shape, strides, mt))
    return _capsule_new(ctypes.addressof(mt), b"dltensor", None)


def check_on_gpu(a, b, out, rows, code=None):
    return check(on_gpu(a, code), on_gpu(b, code), on_gpu(out, code), on_gpu(rows), device=0)


def test_it_is_exported():
    assert "grouped_gemm" in interlace.__all__ and callable(interlace.grouped_gemm)


def test_host_memory_is_rejected_after_shape_checks_pass():
    a, b, out, rows = f16(4, 64, 32), f16(4, 32, 16), f16(4, 64, 16), counts(4)
    with pytest.raises(interlace.Error, match="grouped_gemm: a is on cpu but the GPU is cuda:0"):
        check(a, b, out, rows, device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: rows is on cpu but the GPU is cuda:0"):
        check(on_gpu(a), on_gpu(b), on_gpu(out), rows, device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: a is on cuda:0 but the GPU is cuda:1"):
        check(on_gpu(a), on_gpu(b), on_gpu(out), on_gpu(rows), device=1)


PADDED_A = f16(4, 80, 40)  # capacity 80, rows of 40: a [4, 64, 32] view with padded rows and groups


@pytest.mark.parametrize("a,b,out,expected", [
    (f16(4, 64, 32), f16(4, 32, 16), f16(4, 64, 16), (4, 64, 16, 32, False)),
    (f16(4, 64, 32), f16(4, 16, 32).transpose(0, 2, 1), f16(4, 64, 16), (4, 64, 16, 32, True)),
    (PADDED_A[:, :64, :32], f16(4, 32, 24)[:, :, :16], f16(4, 72, 24)[:, :64, :16], (4, 64, 16, 32, False)),
    (f16(4, 64, 32), f16(4, 24, 40)[:, :16, :32].transpose(0, 2, 1), f16(4, 64, 16), (4, 64, 16, 32, True)),
    (f16(1, 8, 8), f16(1, 8, 8), f16(1, 8, 8), (1, 8, 8, 8, False)),
    # One group: its stride is never used, so any passes, e.g. torch's w.t().unsqueeze(0) of a Linear
    # weight [N, K] = [16, 32] (strides (K, 1, K)), or a stride of 0 or one not 16-byte aligned.
    (apart((1, 64, 32), (3, 32, 1)), apart((1, 32, 16), (32, 1, 32)), apart((1, 64, 16), (0, 16, 1)),
     (1, 64, 16, 32, True)),
], ids=["b_n_contiguous", "b_k_contiguous", "padded_rows_and_groups", "b_k_contiguous_padded", "one_group",
        "one_group_any_group_strides"])
def test_valid_layouts_pass_and_return_g_c_n_k_and_b_k_major(a, b, out, expected):
    assert check_on_gpu(a, b, out, counts(a.shape[0])) == expected


def test_bfloat16_passes_and_mixed_dtypes_do_not():
    a, b, out = f16(2, 16, 8), f16(2, 8, 16), f16(2, 16, 16)
    assert check_on_gpu(a, b, out, counts(2), code=KDL_BFLOAT) == (2, 16, 16, 8, False)
    with pytest.raises(interlace.Error, match="share a dtype; got bfloat16, float16, bfloat16"):
        check(on_gpu(a, KDL_BFLOAT), on_gpu(b), on_gpu(out, KDL_BFLOAT), on_gpu(counts(2)), device=0)


def test_dtypes():
    a, b, out, rows = f16(4, 8, 8), f16(4, 8, 8), f16(4, 8, 8), counts(4)
    with pytest.raises(interlace.Error, match="grouped_gemm: a has dtype float32; supported are bfloat16 and float16"):
        check(a.astype(np.float32), b.astype(np.float32), out.astype(np.float32), rows, device=0)
    with pytest.raises(interlace.Error, match="a, b and out must share a dtype"):
        check(a, b.view(np.int16), out, rows, device=0)
    with pytest.raises(interlace.Error, match="a, b and out must share a dtype"):
        check(a, b, out.astype(np.float32), rows, device=0)
    for bad in (np.int64, np.uint32, np.float32, np.int16):
        with pytest.raises(interlace.Error, match="grouped_gemm: rows has dtype .*; it must be int32"):
            check(a, b, out, np.zeros(4, bad), device=0)


def test_ranks():
    with pytest.raises(interlace.Error, match="grouped_gemm: a, b and out must be 3-D"):
        check(f16(64, 32), f16(4, 32, 16), f16(4, 64, 16), counts(4), device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: a, b and out must be 3-D"):
        check(f16(4, 64, 32), f16(32, 16), f16(4, 64, 16), counts(4), device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: a, b and out must be 3-D"):
        check(f16(4, 64, 32), f16(4, 32, 16), f16(4, 64, 16, 1), counts(4), device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: rows must be 1-D"):
        check(f16(4, 64, 32), f16(4, 32, 16), f16(4, 64, 16), counts(4).reshape(2, 2), device=0)


@pytest.mark.parametrize("a,b,out", [
    (f16(4, 64, 32), f16(3, 32, 16), f16(4, 64, 16)),  # groups
    (f16(4, 64, 32), f16(4, 16, 16), f16(4, 64, 16)),  # K
    (f16(4, 64, 32), f16(4, 32, 16), f16(4, 64, 24)),  # N
    (f16(4, 64, 32), f16(4, 32, 16), f16(4, 48, 16)),  # capacity
    (f16(4, 64, 32), f16(4, 32, 16), f16(2, 64, 16)),  # out's groups
    (f16(4, 64, 32), f16(4, 16, 32), f16(4, 64, 16)),  # Linear weights [G, N, K] not transposed
], ids=["groups", "k", "n", "capacity", "out_groups", "weights_untransposed"])
def test_shapes_must_chain_and_say_how_to_pass_linear_weights(a, b, out):
    with pytest.raises(interlace.Error, match=r"grouped_gemm: shapes do not chain: .*w\.transpose\(1, 2\)"):
        check(a, b, out, counts(4), device=0)


def test_rows_holds_one_count_per_group():
    with pytest.raises(interlace.Error, match="grouped_gemm: rows has 3 counts but a has G = 4 groups"):
        check(f16(4, 64, 32), f16(4, 32, 16), f16(4, 64, 16), counts(3), device=0)


def test_layouts():
    a, b, out, rows = f16(4, 64, 32), f16(4, 32, 16), f16(4, 64, 16), counts(4)
    with pytest.raises(interlace.Error, match="grouped_gemm: a's rows must be K-contiguous"):
        check(f16(4, 32, 64).transpose(0, 2, 1), b, out, rows, device=0)
    with pytest.raises(interlace.Error, match=r"grouped_gemm: b must be \[G, K, N\] with N or K contiguous"):
        check(a, f16(4, 32, 32)[:, :, ::2], out, rows, device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: b must be"):  # contiguous along G only
        check(a, f16(32, 16, 4).transpose(2, 0, 1), out, rows, device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: out's rows must be N-contiguous"):
        check(a, b, f16(4, 16, 64).transpose(0, 2, 1), rows, device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: rows must be contiguous; its stride is 2"):
        check(a, b, out, counts(8)[::2], device=0)


def test_sixteen_byte_rows():
    rows = counts(4)
    with pytest.raises(interlace.Error, match=r"grouped_gemm: a's rows must be 16-byte aligned \(K a multiple of 8\)"):
        check(f16(4, 64, 30), f16(4, 30, 16), f16(4, 64, 16), rows, device=0)
    with pytest.raises(interlace.Error, match=r"grouped_gemm: b's rows must be 16-byte aligned \(N a multiple of 8\)"):
        check(f16(4, 64, 32), f16(4, 32, 12), f16(4, 64, 12), rows, device=0)
    with pytest.raises(interlace.Error, match=r"grouped_gemm: b's rows must be 16-byte aligned \(K a multiple of 8\)"):
        check(f16(4, 64, 32)[:, :, :30], f16(4, 16, 30).transpose(0, 2, 1), f16(4, 64, 16), rows, device=0)
    with pytest.raises(interlace.Error, match=r"out's rows must be 16-byte aligned \(N a multiple of 8\)"):
        check(f16(4, 64, 32), f16(4, 32, 16), f16(4, 64, 20)[:, :, :16], rows, device=0)


@pytest.mark.parametrize("a,b,out,needle", [
    (strided((4, 8, 8), (68, 8, 1)), f16(4, 8, 8), f16(4, 8, 8), "a's group stride 68 must be 16-byte aligned"),
    (f16(4, 8, 8), strided((4, 8, 8), (68, 8, 1)), f16(4, 8, 8), "b's group stride 68 must be 16-byte aligned"),
    (f16(4, 8, 8), strided((4, 8, 8), (68, 1, 8)), f16(4, 8, 8), "b's group stride 68 must be 16-byte aligned"),
    (f16(4, 8, 8), f16(4, 8, 8), strided((4, 8, 8), (68, 8, 1)), "out's group stride 68 must be 16-byte aligned"),
], ids=["a", "b_n_contiguous", "b_k_contiguous", "out"])
def test_sixteen_byte_group_strides(a, b, out, needle):
    with pytest.raises(interlace.Error, match=needle):
        check(a, b, out, counts(4), device=0)


def test_sixteen_byte_base_addresses():
    a, b, out, rows = f16(4, 64, 32), f16(4, 32, 16), f16(4, 64, 16), counts(4)
    with pytest.raises(interlace.Error, match="grouped_gemm: a must start 16-byte aligned"):
        check(f16(4, 64, 32, misalign=8), b, out, rows, device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: b must start 16-byte aligned"):
        check(a, f16(4, 32, 16, misalign=2), out, rows, device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: b must start 16-byte aligned"):
        check(a, f16(4, 16, 32, misalign=4).transpose(0, 2, 1), out, rows, device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: out must start 16-byte aligned"):
        check(a, b, f16(4, 64, 16, misalign=14), rows, device=0)
    # The counts are int32, read one by one: their own alignment is what they need.
    raw = np.zeros(24, np.uint8)
    off = (-raw.ctypes.data) % 4
    assert check_on_gpu(a, b, out, raw[off + 4:off + 20].view(np.int32)) == (4, 64, 16, 32, False)
    with pytest.raises(interlace.Error, match=r"grouped_gemm: rows must start 4-byte aligned \(int32\)"):
        check_on_gpu(a, b, out, raw[off + 2:off + 18].view(np.int32))


@pytest.mark.parametrize("a,b,out,needle", [
    (strided((4, 64, 32), (2048, 16, 1)), f16(4, 32, 16), f16(4, 64, 16),
     r"a's rows overlap \(row stride 16 < K = 32\)"),
    (strided((4, 64, 32), (1024, 32, 1)), f16(4, 32, 16), f16(4, 64, 16),
     r"a's groups overlap \(group stride 1024 < C = 64 rows of stride 32\)"),
    (f16(4, 64, 32), strided((4, 32, 16), (512, 8, 1)), f16(4, 64, 16), r"b's rows overlap \(row stride 8 < N = 16\)"),
    (f16(4, 64, 32), strided((4, 32, 16), (256, 16, 1)), f16(4, 64, 16),
     r"b's groups overlap \(group stride 256 < K = 32 rows of stride 16\)"),
    (f16(4, 64, 32), strided((4, 32, 16), (0, 16, 1)), f16(4, 64, 16), "b's groups overlap"),  # one b for all
    (f16(4, 64, 32), strided((4, 32, 16), (512, 1, 16)), f16(4, 64, 16),
     r"b's rows overlap \(row stride 16 < K = 32\)"),
    (f16(4, 64, 32), strided((4, 32, 16), (256, 1, 32)), f16(4, 64, 16),
     r"b's groups overlap \(group stride 256 < N = 16 rows of stride 32\)"),
    (f16(4, 64, 32), f16(4, 32, 16), strided((4, 64, 16), (1024, 8, 1)),
     r"out's rows overlap \(row stride 8 < N = 16\)"),
    (f16(4, 64, 32), f16(4, 32, 16), strided((4, 64, 16), (1016, 16, 1)),
     r"out's groups overlap \(group stride 1016 < C = 64 rows of stride 16\)"),
    (f16(4, 64, 32), f16(4, 32, 16), strided((4, 64, 16), (-1024, 16, 1)), "out's groups overlap"),
], ids=["a_rows", "a_groups", "b_rows", "b_groups", "b_broadcast", "b_k_contiguous_rows", "b_k_contiguous_groups",
        "out_rows", "out_groups", "out_negative_group_stride"])
def test_rows_and_groups_may_not_overlap(a, b, out, needle):
    with pytest.raises(interlace.Error, match="grouped_gemm: " + needle):
        check(a, b, out, counts(4), device=0)


BIG = 2**31 - 1024 + 1


def big_counts(g):
    return strided((g,), (1,), np.int32)


@pytest.mark.parametrize("a,b,out,rows", [
    (strided((BIG, 8, 8), (64, 8, 1)), strided((BIG, 8, 8), (64, 8, 1)), strided((BIG, 8, 8), (64, 8, 1)),
     big_counts(BIG)),
    (strided((1, BIG, 8), (8 * BIG, 8, 1)), f16(1, 8, 8), strided((1, BIG, 8), (8 * BIG, 8, 1)), counts(1)),
    (f16(1, 8, 8), strided((1, 8, BIG), (8 * (BIG + 7), BIG + 7, 1)), strided((1, 8, BIG), (8 * (BIG + 7), BIG + 7, 1)),
     counts(1)),
    (strided((1, 8, BIG), (8 * (BIG + 7), BIG + 7, 1)), strided((1, BIG, 8), (8 * BIG, 8, 1)), f16(1, 8, 8), counts(1)),
    (strided((1, 2**31, 0), (1, 1, 1)), f16(1, 0, 8), strided((1, 2**31, 8), (8 * 2**31, 8, 1)), counts(1)),
], ids=["G", "C", "N", "K", "C_with_K_0"])
def test_dimensions_that_would_overflow_32_bit_counters_are_rejected(a, b, out, rows):
    with pytest.raises(interlace.Error, match=r"grouped_gemm: G, C, N and K must be at most 2\^31 - 1024"):
        check(a, b, out, rows, device=0)


@pytest.mark.parametrize("a,b,out,needle", [
    (strided((2, 8, 8), (2**39 + 64, 2**39, 1)), f16(2, 8, 8), f16(2, 8, 8), "a's row stride 549755813888 is beyond"),
    (strided((2, 8, 8), (2**39, 8, 1)), f16(2, 8, 8), f16(2, 8, 8), "a's group stride 549755813888 is beyond"),
    (f16(2, 8, 8), strided((2, 8, 8), (2**39, 1, 8)), f16(2, 8, 8), "b's group stride 549755813888 is beyond"),
    (f16(2, 8, 8), strided((2, 8, 8), (2**39 + 64, 2**39, 1)), f16(2, 8, 8), "b's row stride 549755813888 is beyond"),
    (f16(2, 8, 8), f16(2, 8, 8), strided((2, 8, 8), (2**39 + 64, 2**39, 1)), "out's row stride 549755813888 is beyond"),
    (f16(2, 8, 8), f16(2, 8, 8), strided((2, 8, 8), (2**39, 8, 1)), "out's group stride 549755813888 is beyond"),
], ids=["a_rows", "a_groups", "b_groups", "b_rows", "out_rows", "out_groups"])
def test_strides_beyond_tma_are_rejected(a, b, out, needle):
    with pytest.raises(interlace.Error, match="grouped_gemm: " + needle + " TMA's 2\\^40-byte limit"):
        check(a, b, out, counts(2), device=0)


def test_strides_that_reach_outside_the_address_space_are_rejected():
    g = BIG - 1  # every stride within TMA's limits, but G of them reach 2^70 elements past a
    with pytest.raises(interlace.Error, match=r"grouped_gemm: a \(\[2147482624, 1, 8\]\) has strides that reach"):
        check(strided((g, 1, 8), (2**39 - 8, 8, 1)), strided((g, 8, 8), (64, 8, 1)), strided((g, 1, 8), (8, 8, 1)),
              big_counts(g), device=0)


BUF = f16(4, 128, 32)  # groups of 128 rows of 64 bytes
FLAT = f16(2 * 4 * 64 * 32)


@pytest.mark.parametrize("a,b,out,needle", [
    (BUF[:, :64], f16(4, 32, 32), BUF[:, :64], "out overlaps a"),                # out is a
    (BUF[:, :64], f16(4, 32, 32), BUF[:, 63:127], "out overlaps a"),             # one shared row per group
    (BUF[:, :, 16:], f16(4, 16, 16), BUF[:, :, :16], "out overlaps a"),          # interleaved column halves
    (BUF[:, :64], f16(4, 32, 32), BUF[:, 64:], "out overlaps a"),                # interleaved groups
    (f16(4, 64, 32), BUF[:, :32], BUF[:, 31:95], "out overlaps b"),              # b N-contiguous
    (f16(4, 64, 32), BUF[:, :32].transpose(0, 2, 1), BUF[:, 16:80], "out overlaps b"),  # b as w.transpose(1, 2)
    (FLAT[:8192].reshape(4, 64, 32), f16(4, 32, 32), FLAT[8192:].reshape(4, 64, 32), "a is on cpu"),  # adjacent
], ids=["out_is_a", "shared_row", "interleaved_columns", "interleaved_groups", "b_n_contiguous", "b_weight_t",
        "adjacent_is_fine"])
def test_out_overlapping_a_or_b_is_rejected(a, b, out, needle):
    """Byte ranges, lowest to highest element: views of one buffer that share a byte are refused,
    interleaved ones too."""
    with pytest.raises(interlace.Error, match="grouped_gemm: " + needle):
        check(a, b, out, counts(4), device=0)


def test_out_overlapping_rows_is_rejected():
    out = f16(4, 64, 16)
    with pytest.raises(interlace.Error, match="grouped_gemm: out overlaps rows"):
        check(f16(4, 64, 32), f16(4, 32, 16), out, out[3, 63, 8:].view(np.int32), device=0)


# Operands without elements are never touched: their layouts are not checked, those of the others are.
@pytest.mark.parametrize("a,b,out,rows,expected", [
    (strided((0, 64, 30), (7, 3, 5)), strided((0, 30, 12), (1, 1, 1)), strided((0, 64, 12), (3, 3, 3)), counts(0),
     (0, 64, 12, 30, False)),
    (strided((4, 0, 32), (5, 1, 3)), f16(4, 32, 16), strided((4, 0, 16), (1, 1, 1)), counts(4), (4, 0, 16, 32, False)),
    (f16(4, 64, 32), strided((4, 32, 0), (3, 5, 7)), strided((4, 64, 0), (1, 1, 1)), counts(4), (4, 64, 0, 32, False)),
    (strided((4, 64, 0), (3, 1, 5)), strided((4, 0, 16), (1, 1, 1)), f16(4, 64, 16), counts(4), (4, 64, 16, 0, False)),
    (f16(4, 0, 32), f16(4, 16, 32).transpose(0, 2, 1), f16(4, 0, 16), counts(4), (4, 0, 16, 32, True)),
], ids=["G_0", "C_0", "N_0", "K_0", "C_0_b_k_contiguous"])
def test_empty_operands_pass_without_layout_checks(a, b, out, rows, expected):
    assert check_on_gpu(a, b, out, rows) == expected
    with pytest.raises(interlace.Error, match="is on cpu"):  # every check before the device one passes
        check(a, b, out, rows, device=0)


def test_the_operands_with_elements_are_still_checked():
    with pytest.raises(interlace.Error, match="grouped_gemm: b must be"):  # C = 0: b is still a weight
        check(f16(4, 0, 32), f16(4, 32, 32)[:, :, ::2], f16(4, 0, 16), counts(4), device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: out's rows must be 16-byte aligned"):  # K = 0: zeros
        check(f16(4, 64, 0), f16(4, 0, 16), f16(4, 64, 20)[:, :, 4:], counts(4), device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: out's rows must be N-contiguous"):
        check(f16(4, 64, 0), f16(4, 0, 16), f16(4, 16, 64).transpose(0, 2, 1), counts(4), device=0)
    with pytest.raises(interlace.Error, match="grouped_gemm: rows must be contiguous"):  # C = 0: counts still read
        check(f16(4, 0, 32), f16(4, 32, 16), f16(4, 0, 16), counts(8)[::2], device=0)


class FakeJaxArray:
    pass


FakeJaxArray.__module__ = "jaxlib.xla_extension"


def test_the_python_wrapper_forwards_every_tensor_the_stream_and_the_tuning(monkeypatch):
    calls = []
    monkeypatch.setattr(_C, "grouped_gemm", lambda *tensors, stream, **tuning: calls.append((tensors, stream, tuning)))
    a, b, out, rows = f16(4, 64, 32), f16(4, 32, 16), f16(4, 64, 16), counts(4)
    interlace.grouped_gemm(a, b, out, rows)  # numpy tensors: no framework stream, the legacy default one
    interlace.grouped_gemm(a, b, out, rows, stream=7, cluster_m=1, tile_n=256)
    interlace.grouped_gemm(a, b, out, rows, stream=7, swap=True)
    interlace.grouped_gemm(a, b, out, rows, stream=7, swap=False)
    assert [s for _, s, _ in calls] == [0, 7, 7, 7]
    assert calls[0][2] == {"cluster_m": 0, "tile_n": 0, "swap": 0}  # swap None: automatic
    assert calls[1][2] == {"cluster_m": 1, "tile_n": 256, "swap": 0}
    assert calls[2][2] == {"cluster_m": 0, "tile_n": 0, "swap": 1}
    assert calls[3][2] == {"cluster_m": 0, "tile_n": 0, "swap": -1}
    for bad in (0, 1, "yes"):  # 0 would read as False, "never", where 0 means automatic elsewhere
        with pytest.raises(TypeError, match="swap must be None .automatic., True or False"):
            interlace.grouped_gemm(a, b, out, rows, swap=bad)
    assert len(calls) == 4
    assert all(x is y for x, y in zip(calls[0][0], (a, b, out, rows)))
    with pytest.raises(TypeError, match="JAX arrays are immutable: interlace.grouped_gemm writes into out"):
        interlace.grouped_gemm(a, b, FakeJaxArray(), rows)
