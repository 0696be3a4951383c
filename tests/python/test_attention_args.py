"""attention's argument checks, run before any GPU work, driven through DLPack from numpy: every shape
and dtype rule raises its own message; arguments that pass them all reach the device check."""
import numpy as np
import pytest

import interlace
from interlace._interlace import _check_attention_args as check


def f16(*shape):
    return np.zeros(shape, np.float16)


def call(q, k, v=None, out=None, **kw):
    return check(q, k, k.copy() if v is None else v, q.copy() if out is None else out, device=0, **kw)


def test_valid_arguments_reach_the_device_check():
    for shape_q, shape_k, causal in [((2, 100, 8, 128), (2, 300, 2, 128), False), ((1, 5, 4, 64), (1, 5, 4, 64), True),
                                     ((1, 0, 1, 64), (1, 0, 1, 64), True)]:
        with pytest.raises(interlace.Error, match="is on cpu but the GPU is cuda:0"):
            call(f16(*shape_q), f16(*shape_k), causal=causal, lse=np.zeros(shape_q[:1] + shape_q[2:3] + shape_q[1:2],
                                                                           np.float32))


@pytest.mark.parametrize("q,k,causal,message", [
    (np.zeros((1, 8, 2, 64), np.float32), np.zeros((1, 8, 2, 64), np.float32), False, "bfloat16 and float16"),
    (f16(1, 8, 2, 64), np.zeros((1, 8, 2, 64), np.int16), False, "share a dtype"),
    (f16(8, 2, 64), f16(8, 2, 64), False, "4-D"),
    (f16(1, 8, 2, 96), f16(1, 8, 2, 96), False, "head_dim 96"),
    (f16(1, 8, 6, 64), f16(1, 8, 4, 64), False, "multiple"),
    (f16(1, 8, 2, 64), f16(2, 8, 2, 64), False, "batch"),
    (f16(1, 8, 2, 64), f16(1, 9, 2, 64), True, "causal attention needs as many queries as keys"),
])
def test_shapes_and_dtypes(q, k, causal, message):
    with pytest.raises(interlace.Error, match=message):
        call(q, k, causal=causal)


def test_out_v_lse_and_scale():
    q, k = f16(1, 8, 4, 64), f16(1, 16, 2, 64)
    with pytest.raises(interlace.Error, match="out has shape"):
        call(q, k, out=f16(1, 8, 4, 128))
    with pytest.raises(interlace.Error, match="v has shape"):
        call(q, k, v=f16(1, 15, 2, 64))
    with pytest.raises(interlace.Error, match="lse has dtype"):
        call(q, k, lse=np.zeros((1, 4, 8), np.float16))
    with pytest.raises(interlace.Error, match=r"lse has shape \[1, 8, 4\]"):
        call(q, k, lse=np.zeros((1, 8, 4), np.float32))
    for scale in (-1.0, float("inf"), float("nan")):
        with pytest.raises(interlace.Error, match="softmax_scale"):
            call(q, k, softmax_scale=scale)
    with pytest.raises(interlace.Error, match="contiguous"):
        call(f16(1, 4, 8, 64).transpose(0, 2, 1, 3), k)


def test_a_scale_of_zero_is_not_the_default():
    q = f16(1, 8, 2, 64)
    for op in (lambda: interlace.attention(q, q, q, q.copy(), softmax_scale=0.0),
               lambda: interlace.ring_attention(q, q, q, q.copy(), None, softmax_scale=-1.0)):
        with pytest.raises(interlace.Error, match="must be positive"):
            op()
