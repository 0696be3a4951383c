"""reduce_scatter's and all_reduce's argument checks, which run before any GPU work, driven through
DLPack from numpy (so on the CPU: the checks past the device one are covered by
tests/cc/reduce_plan_test.cc, the rest by tests/gpu/test_reduce_scatter_all_reduce.py)."""
import numpy as np
import pytest

import interlace
from interlace._interlace import _check_all_reduce_args as check_ar
from interlace._interlace import _check_reduce_scatter_args as check_rs


def test_the_ops_exist():
    assert "reduce_scatter" in interlace.__all__ and callable(interlace.reduce_scatter)
    assert "all_reduce" in interlace.__all__ and callable(interlace.all_reduce)


def test_dtype_mismatch():
    with pytest.raises(interlace.Error, match="out has dtype float32 but inp has float16"):
        check_rs(np.zeros(8, np.float32), np.zeros(16, np.float16), world_size=2, device=0)
    with pytest.raises(interlace.Error, match="out has dtype float16 but inp has float32"):
        check_ar(np.zeros(8, np.float16), np.zeros(8, np.float32), device=0)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.uint8])
def test_only_float16_bfloat16_float32_are_summed(dtype):
    with pytest.raises(interlace.Error, match="float16, bfloat16 or float32"):
        check_rs(np.zeros(8, dtype), np.zeros(16, dtype), world_size=2, device=0)
    with pytest.raises(interlace.Error, match="float16, bfloat16 or float32"):
        check_ar(np.zeros(8, dtype), np.zeros(8, dtype), device=0)


def test_non_contiguous():
    with pytest.raises(interlace.Error, match="inp must be contiguous"):
        check_ar(np.zeros((8, 4), np.float32), np.zeros((4, 8), np.float32).T, device=0)


def test_host_memory_is_rejected_with_the_device_named():
    with pytest.raises(interlace.Error, match="inp is on cpu but the group's GPU is cuda:0"):
        check_rs(np.zeros(8, np.float32), np.zeros(16, np.float32), world_size=2, device=0)
    with pytest.raises(interlace.Error, match="inp is on cpu but the group's GPU is cuda:0"):
        check_ar(np.zeros(8, np.float32), np.zeros(8, np.float32), device=0)


def test_unknown_algorithm_raises_before_the_group_is_touched():
    with pytest.raises(interlace.Error, match="algorithm must be one of auto, one_shot, two_shot"):
        interlace.all_reduce(np.zeros(8, np.float32), np.zeros(8, np.float32), None, algorithm="ring")
