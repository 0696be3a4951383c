"""all_gather's argument checks, which run before any GPU work, driven through DLPack from numpy."""
import numpy as np
import pytest

import interlace
from interlace import _frameworks
from interlace._interlace import _check_all_gather_args as check


def test_dtype_mismatch():
    with pytest.raises(interlace.Error, match="out has dtype float32 but inp has float16"):
        check(np.zeros(8, np.float32), np.zeros(4, np.float16), world_size=2, device=0)


@pytest.mark.parametrize("out_shape,inp_shape", [((7,), (4,)), ((8, 2), (4, 3)), ((3, 4), (4,))])
def test_shape_mismatch(out_shape, inp_shape):
    with pytest.raises(interlace.Error, match="shape"):
        check(np.zeros(out_shape, np.float32), np.zeros(inp_shape, np.float32), world_size=2, device=0)


def test_non_contiguous_input_and_output():
    with pytest.raises(interlace.Error, match="inp must be contiguous"):
        check(np.zeros((8, 3), np.float32), np.zeros((3, 4), np.float32).T, world_size=2, device=0)
    with pytest.raises(interlace.Error, match="out must be contiguous"):
        check(np.zeros((3, 8), np.float32).T, np.zeros((4, 3), np.float32), world_size=2, device=0)


def test_host_memory_is_rejected_with_the_device_named():
    with pytest.raises(interlace.Error, match="inp is on cpu but the group's GPU is cuda:0"):
        check(np.zeros(8, np.float32), np.zeros(4, np.float32), world_size=2, device=0)


def test_dtype_names_from_every_framework_spelling():
    assert _frameworks.dtype_name("bfloat16") == "bfloat16"
    assert _frameworks.dtype_name(np.dtype("float16")) == "float16"
    assert _frameworks.dtype_name(np.float32) == "float32"

    class TorchLike:  # str(torch.bfloat16) == "torch.bfloat16", and it has no .name
        def __str__(self):
            return "torch.bfloat16"

    assert _frameworks.dtype_name(TorchLike()) == "bfloat16"


def test_numpy_arrays_have_no_stream():
    assert _frameworks.current_stream(np.zeros(1)) == 0
    assert not _frameworks.is_jax(np.zeros(1))
