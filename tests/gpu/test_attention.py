"""interlace.attention on one GPU against an fp32 reference (out and lse), on fresh random data, at
shapes with ragged tiles, causal and not, GQA ratios 1, 4 and 8, head sizes 64 and 128; poisoned
outputs show unwritten elements. Repeat runs agree bitwise (no race); a first call of a new shape can
be captured in a CUDA graph; bad input raises before any GPU work."""
import math

import pytest

torch = pytest.importorskip("torch")
import interlace  # noqa: E402

# (batch, S_q, S_k, Hq, Hkv, D, causal). Tiles are 128 query rows (two warpgroups of 64) by 128 keys,
# or 192 keys at D = 128 without the causal mask beyond 128 keys (the last shapes: around 192's multiples).
SHAPES = [
    (1, 1, 1, 1, 1, 64, False), (1, 1, 1, 1, 1, 128, True), (1, 7, 7, 2, 1, 128, True), (2, 63, 200, 4, 4, 64, False),
    (1, 64, 64, 8, 2, 128, True), (1, 65, 65, 8, 1, 64, True), (1, 127, 129, 4, 1, 128, False),
    (1, 128, 128, 4, 4, 128, True), (3, 129, 129, 8, 8, 64, True), (1, 200, 77, 4, 2, 128, False),
    (1, 255, 255, 16, 2, 128, True), (2, 256, 256, 8, 8, 128, False), (1, 300, 300, 32, 4, 64, True),
    (1, 513, 1000, 8, 1, 128, False), (1, 1000, 1000, 8, 8, 128, True), (1, 1025, 1025, 4, 4, 64, True),
    (2, 1100, 1100, 8, 1, 128, True), (1, 2048, 2048, 8, 1, 128, False), (1, 2049, 2049, 4, 4, 128, True),
    (1, 3000, 2500, 2, 2, 64, False), (1, 4096, 4096, 4, 1, 128, True), (1, 100, 0, 4, 4, 128, False),
    (1, 130, 192, 2, 2, 128, False), (1, 64, 193, 4, 1, 128, False), (2, 300, 384, 4, 4, 128, False),
    (1, 700, 1761, 8, 2, 128, False), (1, 1, 8191, 2, 2, 128, False),
]


def reference(q, k, v, causal, scale):
    """fp32 attention: (out [B, S_q, Hq, D], lse [B, Hq, S_q])."""
    group = q.shape[2] // k.shape[2]
    qf = q.float().transpose(1, 2)                                          # B, Hq, Sq, D
    kf = k.float().transpose(1, 2).repeat_interleave(group, dim=1)          # B, Hq, Sk, D
    vf = v.float().transpose(1, 2).repeat_interleave(group, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], device=s.device, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # no keys: softmax of nothing is 0 here, as in the kernel
    return (p @ vf).transpose(1, 2), lse


def run(b, sq, sk, hq, hkv, d, causal, dtype, seed, scale=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((b, hq, sq), float("nan"), device="cuda")
    interlace.attention(q, k, v, out, causal=causal, softmax_scale=scale, lse=lse)
    torch.cuda.synchronize()
    return q, k, v, out, lse


@pytest.mark.parametrize("b,sq,sk,hq,hkv,d,causal", SHAPES)
def test_matches_fp32_reference(b, sq, sk, hq, hkv, d, causal):
    dtype = torch.bfloat16 if (sq + hq) % 2 == 0 else torch.float16
    scale = None if sq % 3 else 0.3
    q, k, v, out, lse = run(b, sq, sk, hq, hkv, d, causal, dtype, seed=sq * 7919 + sk * 31 + hq + d, scale=scale)
    assert not out.isnan().any(), f"{out.isnan().sum().item()} elements of out never written"
    assert not lse.isnan().any(), f"{lse.isnan().sum().item()} elements of lse never written"
    ref_out, ref_lse = reference(q, k, v, causal, scale if scale is not None else 1 / math.sqrt(d))
    if sk == 0:
        assert (out == 0).all() and (lse == float("-inf")).all()
        return
    err = ((out.float() - ref_out).norm() / ref_out.norm()).item()
    assert err <= 1e-2, f"{dtype}: relative error of out {err:.2e}"
    worst = (out.float() - ref_out).abs().max().item()
    assert worst <= 3e-2, f"{dtype}: largest error of out {worst:.2e}"
    torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=1e-3)


def test_repeat_runs_agree_bitwise():
    q, k, v, out1, lse1 = run(2, 1500, 1500, 8, 2, 128, True, torch.bfloat16, seed=5)
    for _ in range(3):
        out2 = torch.full_like(out1, float("nan"))
        lse2 = torch.full_like(lse1, float("nan"))
        interlace.attention(q, k, v, out2, causal=True, lse=lse2)
        torch.cuda.synchronize()
        assert torch.equal(out1, out2) and torch.equal(lse1, lse2), "two runs on the same inputs differ: a race"


def test_first_call_of_a_shape_captures_in_a_graph():
    q = torch.randn(1, 777, 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 777, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.full_like(q, float("nan"))
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        interlace.attention(q, k, v, out, causal=True)
    graph.replay()
    torch.cuda.synchronize()
    ref, _ = reference(q, k, v, True, 1 / math.sqrt(128))
    assert ((out.float() - ref).norm() / ref.norm()).item() <= 1e-2


def test_bad_input_raises_before_gpu_work():
    q = torch.randn(1, 64, 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(q, 7.0)
    bad = [
        (dict(q=q.half()), "share a dtype"),
        (dict(k=torch.randn(1, 64, 3, 128, device="cuda", dtype=torch.bfloat16)), "multiple"),
        (dict(q=torch.randn(1, 64, 4, 96, device="cuda", dtype=torch.bfloat16),
              out=torch.empty(1, 64, 4, 96, device="cuda", dtype=torch.bfloat16)), "head_dim"),
        (dict(q=q.transpose(1, 2).contiguous().transpose(1, 2)), "contiguous"),
        (dict(k=k[:, :32], causal=True), "causal"),
        (dict(lse=torch.empty(1, 4, 63, device="cuda")), "lse"),
        (dict(out=q), "overlaps"),
        (dict(k=k.cpu()), "cpu"),
    ]
    for change, message in bad:
        args = dict(q=q, k=k, out=out, causal=False, lse=None)
        args.update(change)
        with pytest.raises(interlace.Error, match=message):
            interlace.attention(args["q"], args["k"], args["k"].clone(), args["out"], causal=args["causal"],
                                lse=args["lse"])
    torch.cuda.synchronize()
    assert (out == 7.0).all(), "a call that raised wrote to out"
