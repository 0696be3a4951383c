"""Small shapes of every op, for compute-sanitizer (memcheck, racecheck): run one per rank by
tools/sanitize. Exits non-zero on a wrong result; the sanitizer's own exit code reports hazards."""
import os

import torch

import interlace
import interlace.torch as itorch

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
group = interlace.init(heap_bytes=32 << 20)
for n in (1, 7, 1000, 65536 + 5):
    inp = torch.full((n,), RANK + 1, dtype=torch.bfloat16, device="cuda")
    ref = torch.cat([torch.full((n,), q + 1, dtype=torch.bfloat16, device="cuda") for q in range(WORLD)])
    for out in (torch.empty(WORLD * n, dtype=torch.bfloat16, device="cuda"),
                itorch.empty(group, (WORLD * n,), torch.bfloat16)):
        interlace.all_gather(out, inp, group)
        torch.cuda.synchronize()
        group.check()
        assert torch.equal(out, ref), f"all_gather of {n}"
        del out
for m, n, k in ((1, 8, 8), (130, 136, 72), (257, 264, 200)):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    interlace.gemm(a, b, out)
    torch.cuda.synchronize()
    err = ((out.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
    assert err < 1e-2, f"gemm {m}x{n}x{k}: relative error {err}"
# grouped_gemm, swapped (a group's rows across two 160-wide tiles) and not: groups with no rows, a
# tail of rows, rows past C (clamped).
for swap in (True, False):
    a = torch.randn(3, 300, 200, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3, 136, 200, device="cuda", dtype=torch.bfloat16)
    rows = torch.tensor([0, 77, 400], dtype=torch.int32, device="cuda")
    out = torch.zeros(3, 300, 136, device="cuda", dtype=torch.bfloat16)
    interlace.grouped_gemm(a, w.transpose(1, 2), out, rows, swap=swap)
    torch.cuda.synchronize()
    for g, r in enumerate((0, 77, 300)):
        ref = a[g, :r].float() @ w[g].float().t()
        assert not out[g, r:].any(), f"grouped_gemm swap={swap}: rows past group {g}'s count written"
        if r:
            err = ((out[g, :r].float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"grouped_gemm swap={swap} group {g}: relative error {err}"
# attention: 192-key tiles (D = 128 without the mask) with a ragged last one, and the causal 128s.
for causal, sk in ((False, 200), (True, 130)):
    q = torch.randn(1, 130, 2, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, sk, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, sk, 2, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    interlace.attention(q, k, v, out, causal=causal)
    torch.cuda.synchronize()
    s = torch.einsum("qhd,khd->hqk", q[0].float(), k[0].float()) / 128 ** 0.5
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.einsum("hqk,khd->qhd", s.softmax(-1), v[0].float())
    err = ((out[0].float() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, f"attention causal={causal} S_k={sk}: relative error {err}"
# ring attention under the causal mask (its persistent compute CTAs): each rank's 600 rows are its
# two zigzag chunks of 300 (chunks RANK and 2W-1-RANK), 3 query tiles each, so 6 per head x 32 heads,
# more than the SMs: some CTAs run two tiles one after the other (the hand-off of Q and of the
# tile); every rank's K/V from its seed, for the reference. GQA (4 K/V heads) keeps the receive slots
# at (W - 1) x 1.2 MiB of the heap at any world size.
def ring_inputs(q):
    g = torch.Generator(device="cuda").manual_seed(100 + q)
    return [torch.randn(1, 600, heads, 128, device="cuda", dtype=torch.bfloat16, generator=g) for heads in (32, 4, 4)]


ring_shards = [ring_inputs(r) for r in range(WORLD)]


def ring_chunk(t, c):  # global chunk c of tensor t (1: K, 2: V), from its owner's shard
    owner, part = (c, 0) if c < WORLD else (2 * WORLD - 1 - c, 1)
    return ring_shards[owner][t][:, part * 300:(part + 1) * 300]


q, k, v = ring_shards[RANK]
out = torch.full_like(q, float("nan"))
interlace.ring_attention(q, k, v, out, group, causal=True)
torch.cuda.synchronize()
group.check()
keys = torch.cat([ring_chunk(1, c) for c in range(2 * WORLD)], 1)[0].float().repeat_interleave(8, 1)
values = torch.cat([ring_chunk(2, c) for c in range(2 * WORLD)], 1)[0].float().repeat_interleave(8, 1)
positions = torch.cat([torch.arange(c * 300, (c + 1) * 300, device="cuda") for c in (RANK, 2 * WORLD - 1 - RANK)])
s = torch.einsum("qhd,khd->hqk", q[0].float(), keys) / 128 ** 0.5
s = s.masked_fill(torch.arange(keys.shape[0], device="cuda")[None, None, :] > positions[None, :, None], float("-inf"))
ref = torch.einsum("hqk,khd->qhd", s.softmax(-1), values)
err = ((out[0].float() - ref).norm() / ref.norm()).item()
assert err < 1e-2, f"ring_attention: relative error {err}"
# ag_gemm: uneven shards (one of 1 row), a tile row spanning both, an ordinary gathered A.
rows = [1 if q == 0 else 130 for q in range(WORLD)]
shards = [torch.full((rows[q], 64), q + 1, dtype=torch.bfloat16, device="cuda") for q in range(WORLD)]
b = torch.randn(64, 136, device="cuda", dtype=torch.bfloat16)
out = torch.empty(sum(rows), 136, device="cuda", dtype=torch.bfloat16)
gathered = torch.empty(sum(rows), 64, device="cuda", dtype=torch.bfloat16)
interlace.ag_gemm(shards[RANK], b, out, group, gathered=gathered, shard_rows=rows)
torch.cuda.synchronize()
group.check()
full = torch.cat(shards)
assert torch.equal(gathered, full), "ag_gemm's gathered A"
ref = full.float() @ b.float()
assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2, "ag_gemm"
# gemm_rs and gemm_ar (drafts: last, so that a failure here leaves the ops above checked): uneven row
# blocks (one of 1 row), a tile row spanning both, N with a short last column group, uneven K.
rows = [1 if q == 0 else 130 for q in range(WORLD)]
m, n, ks = sum(rows), 12, [64 if q % 2 == 0 else 8 for q in range(WORLD)]
a_of = [torch.full((m, ks[q]), (q + 1) / 8, dtype=torch.bfloat16, device="cuda") for q in range(WORLD)]
w_of = [torch.randn(n, ks[q], generator=torch.Generator(device="cuda").manual_seed(q), device="cuda")
        .to(torch.bfloat16) for q in range(WORLD)]
ref = sum(a_of[q].float() @ w_of[q].float().t() for q in range(WORLD))
start = sum(rows[:RANK])
out = torch.empty(rows[RANK], 16, device="cuda", dtype=torch.bfloat16)[:, :n]
interlace.gemm_rs(a_of[RANK], w_of[RANK].t(), out, group, shard_rows=rows)
torch.cuda.synchronize()
group.check()
mine = ref[start:start + rows[RANK]]
assert ((out.float() - mine).norm() / mine.norm()).item() < 1e-2, "gemm_rs"
out = torch.empty(m, 16, device="cuda", dtype=torch.bfloat16)[:, :n]
interlace.gemm_ar(a_of[RANK], w_of[RANK].t(), out, group)
torch.cuda.synchronize()
group.check()
assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2, "gemm_ar"
# MoE: dispatch fused with the first matmul (a copier per chunk's task, so sends, fills and the
# GEMM's waits all overlap), then the second fused with the combine; the same layer unfused.
E, k, H, T, F = 4 * WORLD, 3, 64, 40, 72
gen = torch.Generator(device="cuda").manual_seed(RANK)
x = torch.randn(T, H, generator=gen, device="cuda").to(torch.bfloat16)
idx = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:k] for _ in range(T)]).int()
wts = torch.rand(T, k, generator=gen, device="cuda")
capacity = interlace.moe_no_drop_capacity(WORLD, num_experts=E, topk=k, max_tokens=T)
w1 = torch.randn(E // WORLD, H, F, generator=gen, device="cuda").to(torch.bfloat16)
w2 = torch.randn(E // WORLD, H, F, generator=gen, device="cuda").to(torch.bfloat16)
handle = interlace.MoeHandle(group, num_experts=E, topk=k, hidden=H, max_tokens=T, capacity=capacity)
act = torch.empty(handle.recv_rows, F, dtype=torch.bfloat16, device="cuda")
fused = torch.empty(T, H, dtype=torch.bfloat16, device="cuda")
interlace.moe_dispatch_gemm(x, idx, wts, w1, group, out=act, handle=handle, copy_ctas=2)
interlace.moe_gemm_combine(act, w2.transpose(1, 2), handle, group, out=fused)
expert_x, _ = interlace.moe_dispatch(x, idx, wts, group, handle=handle)
L = E // WORLD
act2 = torch.zeros_like(act)
interlace.grouped_gemm(torch.from_dlpack(expert_x).view(L, capacity, H), w1, act2.view(L, capacity, F),
                       torch.from_dlpack(handle.expert_rows))
expert_out = torch.empty(handle.recv_rows, H, dtype=torch.bfloat16, device="cuda")
interlace.grouped_gemm(act2.view(L, capacity, F), w2.transpose(1, 2), expert_out.view(L, capacity, H),
                       torch.from_dlpack(handle.expert_rows), swap=False)
unfused = torch.empty_like(fused)
interlace.moe_combine(expert_out, handle, group, out=unfused)
torch.cuda.synchronize()
group.check()
assert torch.equal(fused, unfused), "moe_dispatch_gemm + moe_gemm_combine against the unfused layer"
# The second matmul on the swapped problem (w K-major, 128 < C <= 320), whose epilogue turns each tile
# around in shared memory before sending it home; against grouped_gemm, which swaps there too.
T2, C2 = 160, 200  # about 80 rows an expert at any world size: none dropped
x2 = torch.randn(T2, H, generator=gen, device="cuda").to(torch.bfloat16)
idx2 = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:2] for _ in range(T2)]).int()
handle2 = interlace.MoeHandle(group, num_experts=E, topk=2, hidden=H, max_tokens=T2, capacity=C2)
interlace.moe_dispatch(x2, idx2, torch.rand(T2, 2, generator=gen, device="cuda"), group, handle=handle2)
act3 = torch.randn(handle2.recv_rows, F, generator=gen, device="cuda").to(torch.bfloat16)
fused = torch.empty(T2, H, dtype=torch.bfloat16, device="cuda")
interlace.moe_gemm_combine(act3, w2.transpose(1, 2), handle2, group, out=fused)
expert_out = torch.empty(handle2.recv_rows, H, dtype=torch.bfloat16, device="cuda")
interlace.grouped_gemm(act3.view(L, C2, F), w2.transpose(1, 2), expert_out.view(L, C2, H),
                       torch.from_dlpack(handle2.expert_rows))
unfused = torch.empty_like(fused)
interlace.moe_combine(expert_out, handle2, group, out=unfused)
torch.cuda.synchronize()
group.check()
assert torch.equal(fused, unfused), "moe_gemm_combine on the swapped problem against grouped_gemm + moe_combine"
# moe_dispatch's other two numberings (the dispatches above are small: CTA 0 numbers every slot): by
# chunks of the tokens (more than 1024 top-k entries), and the grid's layout (more than 1024
# experts); then the combine of the rows as they arrived: each token's row times the sum of its weights.
for T3, E3, numbering in ((600, E, "chunks"), (300, WORLD * (1024 // WORLD + 1), "the grid's layout")):
    x3 = torch.randn(T3, H, generator=gen, device="cuda").to(torch.bfloat16)
    idx3 = torch.rand(T3, E3, generator=gen, device="cuda").argsort(dim=1)[:, :2].int()
    wts3 = torch.rand(T3, 2, generator=gen, device="cuda")
    # per_rank: W x T x 2 rows in all (per_expert's no-drop capacity is W x T rows for each of 1025
    # experts, more than the heap holds).
    handle3 = interlace.MoeHandle(group, num_experts=E3, topk=2, hidden=H, max_tokens=T3, capacity_kind="per_rank",
                                  capacity=interlace.moe_no_drop_capacity(WORLD, num_experts=E3, topk=2, max_tokens=T3,
                                                                          capacity_kind="per_rank"))
    expert_x3, _ = interlace.moe_dispatch(x3, idx3, wts3, group, handle=handle3)
    combined = torch.empty(T3, H, dtype=torch.bfloat16, device="cuda")
    interlace.moe_combine(torch.from_dlpack(expert_x3).clone(), handle3, group, out=combined)
    torch.cuda.synchronize()
    group.check()
    want = x3.float() * wts3.sum(dim=1, keepdim=True)
    err = ((combined.float() - want).norm() / want.norm()).item()
    assert err < 1e-2, f"moe_dispatch by {numbering}, then moe_combine"
    del handle3
group.barrier()
print(f"rank {RANK}: sanitizer workload correct")
