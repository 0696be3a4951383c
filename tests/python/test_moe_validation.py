"""moe_dispatch's and moe_combine's argument checks, which run before any GPU work, driven through
DLPack from torch CPU tensors (so the checks past the device one are covered by
tests/cc/moe_args_test.cc, the rest by tests/gpu/test_moe.py)."""
import pytest

import interlace
from interlace._interlace import _check_moe_combine_args as check_combine
from interlace._interlace import _check_moe_dispatch_args as check_dispatch
from interlace._interlace import _check_moe_dispatch_gemm_args as check_dispatch_gemm
from interlace._interlace import _check_moe_gemm_combine_args as check_gemm_combine

torch = pytest.importorskip("torch")


def test_the_ops_exist():
    for name in ("moe_dispatch", "moe_combine", "moe_dispatch_gemm", "moe_gemm_combine", "MoeHandle",
                 "moe_no_drop_capacity"):
        assert name in interlace.__all__ and callable(getattr(interlace, name))


def args(tokens=8, hidden=64, k=2, x_dtype=torch.bfloat16, idx_dtype=torch.int32):
    return (torch.zeros(tokens, hidden, dtype=x_dtype), torch.zeros(tokens, k, dtype=idx_dtype),
            torch.zeros(tokens, k, dtype=torch.float32))


def dispatch(*tensors, experts=8, capacity=16, kind=0, max_tokens=-1, world_size=2):
    return check_dispatch(*tensors, experts=experts, capacity=capacity, capacity_kind=kind, max_tokens=max_tokens,
                          world_size=world_size, device=0)


def test_dtype_and_shape_come_before_the_device():
    with pytest.raises(interlace.Error, match="x has dtype float32; it must be bfloat16"):
        dispatch(*args(x_dtype=torch.float32))
    with pytest.raises(interlace.Error, match="x must be 2-D"):
        x, i, w = args()
        dispatch(x.view(-1), i, w)


def test_host_memory_is_rejected_with_the_device_named():
    with pytest.raises(interlace.Error, match="x is on cpu but the group's GPU is cuda:0"):
        dispatch(*args())
    with pytest.raises(interlace.Error, match="expert_out has shape"):
        check_combine(torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16),
                      world_size=2, experts=8, topk=2, hidden=64, max_tokens=8, capacity=16, capacity_kind=0, tokens=8,
                      device=0)
    with pytest.raises(interlace.Error, match="expert_out is on cpu"):
        check_combine(torch.zeros(64, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16),
                      world_size=2, experts=8, topk=2, hidden=64, max_tokens=8, capacity=16, capacity_kind=0, tokens=8,
                      device=0)


def test_unknown_capacity_kind_and_missing_sizes_raise_before_the_group_is_touched():
    x, i, w = args()
    with pytest.raises(interlace.Error, match="capacity_kind must be one of per_expert, per_rank"):
        interlace.moe_no_drop_capacity(2, num_experts=8, topk=2, max_tokens=8, capacity_kind="per_token")
    with pytest.raises(interlace.Error, match="pass num_experts and capacity"):
        interlace.moe_dispatch(x, i, w, None)


def test_no_drop_capacity():
    assert interlace.moe_no_drop_capacity(2, num_experts=8, topk=2, max_tokens=100) == 200
    assert interlace.moe_no_drop_capacity(2, num_experts=8, topk=2, max_tokens=100, capacity_kind="per_rank") == 400
    assert interlace.moe_no_drop_capacity(4, num_experts=8, topk=4, max_tokens=0) == 1


def gemm_combine(act, w, out, kind=0, tokens=8):
    """W = 2, E = 8 (L = 4), k = 2, hidden 64, capacity 16 per expert: recv_rows 64."""
    return check_gemm_combine(act, w, out, torch.zeros(4, dtype=torch.int32), world_size=2, experts=8, topk=2,
                              hidden=64, max_tokens=8, capacity=16, capacity_kind=kind, tokens=tokens, device=0)


def test_moe_gemm_combine_checks_its_tensors_before_the_device():
    act, w, out = (torch.zeros(64, 32, dtype=torch.bfloat16), torch.zeros(4, 32, 64, dtype=torch.bfloat16),
                   torch.zeros(8, 64, dtype=torch.bfloat16))
    with pytest.raises(interlace.Error, match="capacity_kind is per_rank; the fused GEMM needs per_expert"):
        gemm_combine(act, w, out, kind=1)
    with pytest.raises(interlace.Error, match="act has dtype float32"):
        gemm_combine(act.float(), w, out)
    with pytest.raises(interlace.Error, match=r"act has shape \[63, 32\]; it must be \[64, F\]"):
        gemm_combine(act[:-1], w, out)
    with pytest.raises(interlace.Error, match="F = 0"):
        gemm_combine(act[:, :0], w[:, :0], out)
    with pytest.raises(interlace.Error, match=r"w has shape \[4, 64, 32\]; it must be \[4, 32, 64\].*transpose"):
        gemm_combine(act, w.transpose(1, 2).contiguous(), out)
    with pytest.raises(interlace.Error, match=r"out has shape \[7, 64\]; it must be \[8, 64\]"):
        gemm_combine(act, w, out[:-1])
    with pytest.raises(interlace.Error, match="out is on cpu"):
        gemm_combine(act, w, out)


def dispatch_gemm(w, out, kind=0, topk=2, experts=8):
    """W = 2, E = 8 (L = 4), hidden 64, capacity 16 per expert: recv_rows 64."""
    local = experts // 2
    expert_x = torch.zeros(local * 16, 64, dtype=torch.bfloat16)
    return check_dispatch_gemm(w, out, expert_x, torch.zeros(local, dtype=torch.int32), world_size=2,
                               experts=experts, topk=topk, hidden=64, max_tokens=8, capacity=16, capacity_kind=kind,
                               device=0)


def test_moe_dispatch_gemm_checks_its_gemm_before_the_device():
    w, out = torch.zeros(4, 64, 96, dtype=torch.bfloat16), torch.zeros(64, 96, dtype=torch.bfloat16)
    with pytest.raises(interlace.Error, match="capacity_kind is per_rank; the fused GEMM needs per_expert"):
        dispatch_gemm(w, out, kind=1)
    with pytest.raises(interlace.Error, match="top-33 is more than the 32 the fused op takes"):
        dispatch_gemm(torch.zeros(32, 64, 96, dtype=torch.bfloat16), out, topk=33, experts=64)
    with pytest.raises(interlace.Error, match="w has dtype float32"):
        dispatch_gemm(w.float(), out)
    with pytest.raises(interlace.Error, match=r"w has shape \[4, 96, 64\]; it must be \[4, 64, N\].*transpose"):
        dispatch_gemm(w.transpose(1, 2).contiguous(), out)
    with pytest.raises(interlace.Error, match="out has dtype float32"):
        dispatch_gemm(w, out.float())
    with pytest.raises(interlace.Error, match=r"out has shape \[64, 95\]; it must be \[64, 96\]"):
        dispatch_gemm(w, out[:, :95])
    with pytest.raises(interlace.Error, match="out is on cpu"):
        dispatch_gemm(w, out)
