"""gemm's argument checks, run before any GPU work, driven through DLPack from numpy (float16)."""
import numpy as np
import pytest

import interlace
from interlace._interlace import _check_gemm_args as check


def f16(*shape):
    return np.zeros(shape, np.float16)


def test_host_memory_is_rejected_after_shape_checks_pass():
    with pytest.raises(interlace.Error, match="is on cpu but the GPU is cuda:0"):
        check(f16(64, 32), f16(32, 16), f16(64, 16), device=0)


def test_shapes_must_chain_and_say_how_to_pass_a_linear_weight():
    with pytest.raises(interlace.Error, match=r"weight\.t\(\)"):
        check(f16(64, 32), f16(16, 32), f16(64, 16), device=0)


def test_dtypes():
    with pytest.raises(interlace.Error, match="supported are bfloat16 and float16"):
        check(np.zeros((4, 8), np.float32), np.zeros((8, 8), np.float32), np.zeros((4, 8), np.float32), device=0)
    with pytest.raises(interlace.Error, match="share a dtype"):
        check(f16(4, 8), np.zeros((8, 8), np.int16), f16(4, 8), device=0)


def test_layouts():
    with pytest.raises(interlace.Error, match="a must be row-major"):
        check(f16(32, 64).T, f16(32, 16), f16(64, 16), device=0)
    with pytest.raises(interlace.Error, match="b must be row-major"):
        check(f16(64, 32), f16(32, 32)[:, ::2], f16(64, 16), device=0)
    with pytest.raises(interlace.Error, match="out must be row-major"):
        check(f16(64, 32), f16(32, 16), f16(16, 64).T, device=0)


def test_sixteen_byte_rows():
    with pytest.raises(interlace.Error, match="16-byte aligned"):
        check(f16(64, 30), f16(30, 16), f16(64, 16), device=0)


BUF = f16(192, 32)  # rows of 64 bytes


@pytest.mark.parametrize("a,b,out,needle", [
    (BUF[:64], f16(32, 32), BUF[:64], "out overlaps a"),                    # out is a
    (BUF[:64], f16(32, 32), BUF[63:127], "out overlaps a"),                 # one shared row
    (BUF[:64, 16:], f16(16, 16), BUF[:64, :16], "out overlaps a"),          # interleaved column halves
    (f16(64, 32), BUF[:32], BUF[31:95], "out overlaps b"),                  # b row-major
    (f16(64, 32), BUF[:32].T, BUF[16:80], "out overlaps b"),                # b as weight.t()
    (BUF[:64], f16(32, 32), BUF[64:128], "is on cpu"),                      # adjacent: on to the device check
], ids=["out_is_a", "shared_row", "interleaved", "b_row_major", "b_weight_t", "adjacent_is_fine"])
def test_out_overlapping_a_or_b_is_rejected(a, b, out, needle):
    """Byte ranges, lowest to highest element: views of one buffer that share a byte are refused,
    interleaved ones too."""
    with pytest.raises(interlace.Error, match=needle):
        check(a, b, out, device=0)


def test_k_zero_gets_the_same_out_checks_and_no_layout_checks_on_empty_inputs():
    with pytest.raises(interlace.Error, match="is on cpu"):  # every check before the device one passes
        check(f16(5, 0), f16(0, 16), f16(5, 16), device=0)
    with pytest.raises(interlace.Error, match="out's rows must be 16-byte aligned"):
        check(f16(5, 0), f16(0, 16), f16(5, 20)[:, 4:], device=0)
    with pytest.raises(interlace.Error, match="out must be row-major"):
        check(f16(5, 0), f16(0, 16), f16(16, 5).T, device=0)


def strided(shape, strides):
    """A view with any shape and element strides over 8 elements: the checks never read it."""
    return np.lib.stride_tricks.as_strided(f16(8), shape=shape, strides=tuple(2 * s for s in strides))


BIG = 2**31 - 1024 + 1


@pytest.mark.parametrize("a,b,out", [
    (strided((BIG, 8), (8, 1)), f16(8, 8), strided((BIG, 8), (8, 1))),
    (strided((8, BIG), (BIG + 7, 1)), strided((BIG, 8), (8, 1)), f16(8, 8)),
    (f16(8, 8), strided((8, BIG), (BIG + 7, 1)), strided((8, BIG), (BIG + 7, 1))),
    (strided((2**31, 0), (1, 1)), f16(0, 8), strided((2**31, 8), (8, 1))),
], ids=["M", "K", "N", "M_with_K_0"])
def test_dimensions_that_would_overflow_32_bit_counters_are_rejected(a, b, out):
    with pytest.raises(interlace.Error, match=r"at most 2\^31 - 1024"):
        check(a, b, out, device=0)


def test_strides_beyond_tma_and_the_address_space_are_rejected():
    with pytest.raises(interlace.Error, match="a's row stride"):
        check(strided((2, 8), (2**39, 1)), f16(8, 8), f16(2, 8), device=0)
    with pytest.raises(interlace.Error, match="outside the address space"):
        check(strided((BIG - 1, 8), (2**39 - 8, 1)), f16(8, 8), strided((BIG - 1, 8), (8, 1)), device=0)
