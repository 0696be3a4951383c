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
