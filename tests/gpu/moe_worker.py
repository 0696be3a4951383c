"""One rank of a moe_dispatch / moe_combine GPU test scenario (see test_moe.py). Exits non-zero on
failure, saying which rank, case and what differed.

Every rank can rebuild every rank's tokens and routing (seeded by case and rank), so the references
need no communication. The reference layout walks the routing as ops/moe/plan.h defines it
(moe_reference's order: per destination, local expert, source, token); the expert is a per-expert
affine map in bf16, and the combine's reference is the fp32 sum over top-k entries in order of
weight x the expert's output, rounded once: what interlace promises bit for bit."""
import itertools
import os
import sys

import torch

import interlace
from interlace.bench.launch import expect_error

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
# moe_dispatch's small layout takes at most 1024 experts (CTA 0 numbers up to 1024 top-k entries a
# rank, each CTA a chunk of the tokens past that): the grid's layout is reached by more experts.
EGRID = WORLD * (1024 // WORLD + 1)
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
MIB = 1 << 20
INPUTS = {}  # a handle's last dispatch's inputs, by id(handle)


class Case:
    """A routing pattern: every rank's tokens, routing and weights, from the case's seed."""

    def __init__(self, name, experts, topk, hidden, tokens, route, capacity=None, kind="per_expert",
                 index_dtype=torch.int32, seed=0):
        self.name, self.experts, self.topk, self.hidden = name, experts, topk, hidden
        self.tokens = tokens if isinstance(tokens, list) else [tokens] * WORLD  # per rank
        self.kind, self.index_dtype, self.seed = kind, index_dtype, seed
        self.local = experts // WORLD
        g = torch.Generator().manual_seed(seed)
        self.idx = [route(g, s, self.tokens[s], experts, topk) for s in range(WORLD)]
        self.weights = [torch.rand(self.tokens[s], topk, generator=g) for s in range(WORLD)]
        self.x = [(torch.randn(self.tokens[s], hidden, generator=g) * 4).to(torch.bfloat16) for s in range(WORLD)]
        self.max_tokens = max(max(self.tokens), 1)
        need = self.needed_capacity()
        self.capacity = need if capacity is None else capacity(need)

    def needed_capacity(self):
        """The smallest capacity that drops nothing for this routing (at least 1)."""
        totals = torch.zeros(self.experts, dtype=torch.int64)
        for idx in self.idx:
            used = idx[idx >= 0]
            totals += torch.bincount(used, minlength=self.experts)
        if self.kind == "per_expert":
            return max(int(totals.max()), 1)
        return max(int(totals.view(WORLD, self.local).sum(1).max()), 1)

    def layout(self):
        """(row_of, counts, starts, kept): row_of[s] [T_s, k], the slot's receive row at its expert's
        rank or -1 (unused, dropped); counts [W, E]; per local expert of this rank its first row and
        kept rows."""
        W, E, L, k, C = WORLD, self.experts, self.local, self.topk, self.capacity
        counts = torch.stack([torch.bincount(i[i >= 0], minlength=E) for i in self.idx]).to(torch.int32)
        row_of = [torch.full_like(i, -1, dtype=torch.int64) for i in self.idx]
        starts, kept = torch.zeros(L, dtype=torch.int32), torch.zeros(L, dtype=torch.int32)
        for d in range(W):
            cursor = 0
            for l in range(L):
                e = d * L + l
                if self.kind == "per_expert":
                    base, end, cursor = l * C, (l + 1) * C, 0
                else:
                    base, end = 0, C
                first = base + cursor
                n_kept = 0
                for s in range(W):
                    t, j = (self.idx[s] == e).nonzero(as_tuple=True)  # token order: a token lists e once
                    rows = base + cursor + torch.arange(t.numel())
                    cursor += t.numel()
                    ok = rows < end
                    row_of[s][t[ok], j[ok]] = rows[ok]
                    n_kept += int(ok.sum())
                if d == RANK:
                    starts[l], kept[l] = min(first, end), n_kept
        return row_of, counts, starts, kept

    def expert_fn(self, rows_x, e):
        """The stand-in experts: row i through expert e[i], an affine map in fp32 rounded to bf16 (any
        per-expert function would do); e is a tensor of experts, one per row."""
        scale = (1.0 + 0.125 * (e % 7)).float().unsqueeze(1)  # exact in fp32
        shift = (0.0625 * (e % 5) - 0.125).float().unsqueeze(1)
        return (rows_x.float() * scale + shift).to(torch.bfloat16)


def route_random(g, s, T, E, k):
    return torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]) if T else torch.empty(0, k,
                                                                                                    dtype=torch.int64)


def route_zipf(g, s, T, E, k):
    """Skewed: expert popularity ~ 1 / rank^1.2 (a shuffled Zipf), k distinct per token."""
    if T == 0:
        return torch.empty(0, k, dtype=torch.int64)
    p = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** 1.2
    p = p[torch.randperm(E, generator=g)]
    return torch.multinomial(p.unsqueeze(0).expand(T, E).contiguous(), k, replacement=False, generator=g)


def route_subset(experts_used):
    def route(g, s, T, E, k):
        used = torch.tensor(experts_used(E))
        if T == 0:
            return torch.empty(0, k, dtype=torch.int64)
        return torch.stack([used[torch.randperm(used.numel(), generator=g)[:k]] for _ in range(T)])
    return route


def route_with_unused(g, s, T, E, k):
    idx = route_random(g, s, T, E, k)
    if T:
        idx[torch.rand(T, k, generator=g) < 0.3] = -1
    return idx


def route_one_rank_per_token(g, s, T, E, k):
    """Every token's k experts on one rank (k <= local experts): another rank's token travels there once;
    in moe_dispatch this rank's own is written into each of its slots."""
    L = E // WORLD
    if T == 0:
        return torch.empty(0, k, dtype=torch.int64)
    d = torch.randint(0, WORLD, (T,), generator=g)
    return torch.stack([d[t] * L + torch.randperm(L, generator=g)[:k] for t in range(T)])


def cases():
    """Non-overflowing routing patterns (capacity exactly what they need, unless said)."""
    r = route_random
    E8 = max(8, 2 * WORLD)
    yield Case("random", E8, 2, 256, 64, r, seed=1)
    yield Case("random top-1", E8, 1, 128, 100, r, seed=2)
    yield Case("random top-k = E", E8, E8, 64, 16, r, seed=3)
    yield Case("random int64 index", 4 * WORLD, 4, 512, 77, r, index_dtype=torch.int64, seed=4)
    yield Case("random per-rank capacity", 4 * WORLD, 3, 256, 90, r, kind="per_rank", seed=5)
    yield Case("random, capacity to spare", E8, 2, 256, 50, r, capacity=lambda need: need + 17, seed=6)
    yield Case("zipf", 16 * WORLD, 4, 256, 200, route_zipf, seed=7)
    yield Case("zipf per rank", 16 * WORLD, 4, 256, 200, route_zipf, kind="per_rank", seed=8)
    yield Case("zipf deepseek-like small", 32 * WORLD, 8, 1024, 128, route_zipf, seed=9)
    yield Case("empty experts (only even ones)", 8 * WORLD, 2, 256, 64,
               route_subset(lambda E: list(range(0, E, 2))), seed=10)
    yield Case("empty experts per rank", 8 * WORLD, 2, 256, 64,
               route_subset(lambda E: list(range(0, E, 2))), kind="per_rank", seed=11)
    yield Case("all tokens to rank 0", 4 * WORLD, 2, 256, 80,
               route_subset(lambda E: list(range(E // WORLD))), seed=12)
    yield Case("all tokens to the last rank, per rank", 4 * WORLD, 2, 256, 80,
               route_subset(lambda E: list(range(E - E // WORLD, E))), kind="per_rank", seed=13)
    yield Case("all tokens to one expert", 4 * WORLD, 1, 256, 60, route_subset(lambda E: [E - 1]), seed=14)
    yield Case("each token's experts on one rank", 4 * WORLD, 3, 256, 70, route_one_rank_per_token, seed=15)
    yield Case("each token's experts on one rank, per rank", 4 * WORLD, 4, 128, 70, route_one_rank_per_token,
               kind="per_rank", seed=16)
    yield Case("unused entries (-1)", E8, 3, 256, 64, route_with_unused, seed=17)
    yield Case("one rank with no tokens", E8, 2, 256, [0] + [48] * (WORLD - 1), r, seed=18)
    yield Case("every rank but the last without tokens", E8, 2, 256, [0] * (WORLD - 1) + [33], r, seed=19)
    yield Case("no tokens anywhere", E8, 2, 256, 0, r, seed=20)
    yield Case("uneven token counts", E8, 2, 256, [5 + 13 * s for s in range(WORLD)], r, seed=21)
    yield Case("hidden 8 (one vector)", E8, 2, 8, 64, r, seed=22)
    yield Case("hidden 7168, 128 experts per rank, top-8", 128 * WORLD, 8, 7168, 256, route_zipf, kind="per_rank",
               seed=23)
    yield Case("mixtral-like: 8 experts, top-2, hidden 4096", 8, 2, 4096, 512, r, seed=24) if 8 % WORLD == 0 else \
        Case("mixtral-like: 2 per rank, top-2, hidden 4096", 2 * WORLD, 2, 4096, 512, r, seed=24)
    # More top-k entries than a warp has lanes: the CTA-per-token send, the sums' entries in two rounds
    # (1200 entries: numbered by chunks, a token a CTA).
    yield Case("random top-k 40", 48 * WORLD, 40, 320, 30, r, seed=25)
    # moe_dispatch's numbering: up to 1024 top-k entries on a rank CTA 0 numbers them all (its warps
    # runs of the entries, 8 rounds of 32 loaded at once); past that, with at most 1024 experts, each
    # CTA its chunk of the tokens (above: top-k 40 over 30 tokens, a token a CTA and most chunks empty;
    # top-8 over 256 tokens), with many experts, more rounds than a batch, one more token than the
    # grid's chunks divide evenly; past 1024 experts the grid's layout, where every CTA numbers some
    # experts' slots and the phases meet at grid barriers.
    yield Case("random, 512 tokens top-2", E8, 2, 256, 512, r, seed=28)
    yield Case("random, 128 tokens top-8 of 64 experts a rank", 64 * WORLD, 8, 256, 128, r, seed=31)
    yield Case("random top-k 40, 12 tokens (a CTA per token)", 48 * WORLD, 40, 320, 12, r, seed=29)
    yield Case("zipf, 64 experts per rank, 300 tokens top-8", 64 * WORLD, 8, 256, 300, route_zipf, kind="per_rank",
               seed=27)
    yield Case("random, 1024 experts, 1100 tokens top-8", 1024, 8, 64, 1100, r, seed=32) if 1024 % WORLD == 0 else \
        Case("random, 1100 tokens top-8", 64 * WORLD, 8, 64, 1100, r, seed=32)
    yield Case("top-32, 64 tokens on even ranks, 2100 on odd ones (chunks of 16 tokens)", 64 * WORLD, 32, 64,
               [64 if s % 2 == 0 else 2100 for s in range(WORLD)], r, seed=30)
    yield Case("random, 4097 tokens top-2 (a chunk of one token on 132 SMs)", E8, 2, 64, 4097, r, seed=34)
    # Chunks of about 4250 entries on 132 SMs: more than 8 rounds of 32 on a warp (16 a CTA in moe_dispatch,
    # 12 in moe_dispatch_gemm), which number_slots_in then reads twice.
    yield Case("random, 70000 tokens top-8, hidden 8 (a warp's entries read twice)", 64 * WORLD, 8, 8, 70000, r,
               seed=36)
    yield Case("top-32, 16 tokens on even ranks (CTA 0 numbers), 2100 on odd ones (by chunks)", 64 * WORLD, 32, 64,
               [16 if s % 2 == 0 else 2100 for s in range(WORLD)], r, seed=35)
    yield Case("random, 1100 tokens top-2 of more than 1024 experts (the grid's layout)", EGRID, 2, 256, 1100, r,
               seed=26)
    yield Case("random, 64 tokens top-2 of more than 1024 experts (the grid's layout, a CTA per token)", EGRID, 2,
               256, 64, r, seed=33)


def fail(case, what):
    raise AssertionError(f"rank {RANK}, case '{case.name}': {what}")


def dispatch(group, case, handle=None, stream=None):
    """Issues case's dispatch on this rank; returns (expert_x as a torch tensor, handle)."""
    dev = torch.device("cuda")
    x = case.x[RANK].to(dev)
    idx = case.idx[RANK].to(case.index_dtype).to(dev)
    w = case.weights[RANK].to(dev)
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream())  # the inputs' copies
    expert_x, handle = interlace.moe_dispatch(x, idx, w, group, num_experts=case.experts, capacity=case.capacity,
                                              capacity_kind=case.kind, max_tokens=case.max_tokens, handle=handle,
                                              stream=None if stream is None else stream.cuda_stream)
    INPUTS[id(handle)] = (x, idx, w)  # alive until the next dispatch with this handle: the kernel may not have run
    return torch.from_dlpack(expert_x), handle


def check_dispatch(case, handle, expert_x, row_of, counts, starts, kept, direct=True):
    """Compares the handle's tensors and the kept rows with the references; returns expert_out: the
    experts applied to the kept rows, NaN elsewhere (poison: a row the combine should not read shows).
    direct: moe_dispatch's primaries (each of this rank's own tokens' slots its own); False for
    moe_dispatch_gemm's (one row a rank)."""
    got_counts = torch.from_dlpack(handle.counts).cpu()
    if not torch.equal(got_counts, counts):
        fail(case, f"counts {got_counts.tolist()} != {counts.tolist()}")
    got_starts = torch.from_dlpack(handle.expert_starts).cpu()
    got_rows = torch.from_dlpack(handle.expert_rows).cpu()
    if not (torch.equal(got_starts, starts) and torch.equal(got_rows, kept)):
        fail(case, f"expert starts/rows {got_starts.tolist()}/{got_rows.tolist()} != {starts.tolist()}/{kept.tolist()}")
    slots = torch.from_dlpack(handle.slots).cpu()
    ex = expert_x.cpu()
    expert_out = torch.full_like(ex, float("nan"))
    L = case.local
    for s in range(WORLD):
        # Every kept slot of source s at this rank's experts, (t, j) in token order.
        idx = case.idx[s].long()
        here = (row_of[s] >= 0) & (idx // L == RANK)
        t, j = here.nonzero(as_tuple=True)
        r, e = row_of[s][t, j], idx[t, j]

        def first_bad(ok):
            i = int((~ok).nonzero()[0])
            return f"row {int(r[i])} (source {s}, token {int(t[i])}, top-k {int(j[i])}, expert {int(e[i])})"

        ok = (ex[r] == case.x[s][t]).all(dim=1)
        if not ok.all():
            fail(case, f"expert_x {first_bad(ok)} differs from the token")
        got = slots[r]
        ok = (got[:, 0] == t) & (got[:, 1] == s | j << 16)
        if not ok.all():
            fail(case, f"the slot of {first_bad(ok)} names another slot: {got[int((~ok).nonzero()[0])].tolist()}")
        ok = got[:, 3] == case.weights[s][t, j].float().view(torch.int32)
        if not ok.all():
            fail(case, f"the slot of {first_bad(ok)} holds other weight bits")
        # The primary: the kept slot of the token's lowest-numbered expert on this rank; in
        # moe_dispatch (direct) the slot itself for this rank's own tokens (written straight from x).
        want = r if direct and s == RANK else torch.where(here, row_of[s], torch.iinfo(torch.int64).max).amin(1)[t]
        ok = got[:, 2] == want
        if not ok.all():
            fail(case, f"the slot of {first_bad(ok)} names primary row {int(got[int((~ok).nonzero()[0]), 2])}")
        expert_out[r] = case.expert_fn(ex[r], e)
    return expert_out.cuda()


def check_combine(case, out, row_of):
    want = combine_reference(case, row_of)
    got = out.cpu()
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[0].tolist()
        fail(case, f"combine: out{bad} = {got[bad[0], bad[1]].item()}, want {want[bad[0], bad[1]].item()}")


def new_out(case):
    return torch.full((case.tokens[RANK], case.hidden), float("nan"), dtype=torch.bfloat16, device="cuda")


def run_case(group, case, handle=None, stream=None, check=True):
    """Dispatch, the experts, combine, each compared with the references. Returns the handle."""
    expert_x, handle = dispatch(group, case, handle, stream)
    torch.cuda.synchronize()
    if check:
        group.check()
    row_of, counts, starts, kept = case.layout()
    expert_out = check_dispatch(case, handle, expert_x, row_of, counts, starts, kept)
    out = new_out(case)
    if stream is not None:  # the NaN fill ran on the default stream; a pool stream does not wait for it
        stream.wait_stream(torch.cuda.current_stream())
    interlace.moe_combine(expert_out, handle, group, out=out, stream=None if stream is None else stream.cuda_stream)
    torch.cuda.synchronize()
    if check:
        group.check()
    check_combine(case, out, row_of)
    return handle


def combine_reference(case, row_of):
    """This rank's tokens: the fp32 sum over kept top-k entries in order of weight x expert output,
    rounded once (separate multiply and add, as the kernel)."""
    T = case.tokens[RANK]
    acc = torch.zeros(T, case.hidden, dtype=torch.float32)
    for j in range(case.topk):
        t = (row_of[RANK][:, j] >= 0).nonzero(as_tuple=True)[0]
        y = case.expert_fn(case.x[RANK][t], case.idx[RANK][t, j].long()).float()
        acc[t] = acc[t] + case.weights[RANK][t, j].unsqueeze(1) * y
    return acc.to(torch.bfloat16)


def scenario_patterns():
    group = interlace.init(heap_bytes=2048 * MIB)
    n = 0
    for case in cases():
        run_case(group, case)
        n += 1
    assert n >= 20
    print(f"rank {RANK}: {n} routing patterns correct")


def scenario_overflow():
    """A capacity below what the routing needs: kept slots are right, dropped ones add nothing, and
    group.check() raises once, naming moe_dispatch; the group stays usable."""
    group = interlace.init(heap_bytes=512 * MIB)
    # moe_dispatch's numberings: CTA 0's, by chunks (more than 1024 entries), the grid's layout (more
    # than 1024 experts).
    for kind, (experts, tokens) in itertools.product(("per_expert", "per_rank"),
                                                     ((4 * WORLD, 96), (4 * WORLD, 600), (EGRID, 600))):
        case = Case(f"overflow {kind}, {experts} experts, {tokens} tokens", experts, 2, 256, tokens, route_zipf,
                    capacity=lambda need: max(need // 3, 1), kind=kind, seed=40)
        assert case.capacity < case.needed_capacity()
        try:
            run_case(group, case)
        except interlace.Error as e:
            text = str(e)
            assert "moe_dispatch" in text and "overflowed its capacity" in text, text
        else:
            fail(case, "no error for a capacity overflow")
        run_case(group, case, check=False)  # the layout and sums with drops (its check raises again)
        expect_error(group.check, "overflowed its capacity")
        group.check()  # reported once
    run_case(group, Case("after overflow", 4 * WORLD, 2, 256, 64, route_random, seed=41))
    print(f"rank {RANK}: overflows raise, drops add nothing, the group still works")


def scenario_streams():
    """Two streams: cases alternate between them with a handle each, reused; then both layers'
    dispatches, then both combines, issued back to back with no sync in between (the group orders them)."""
    group = interlace.init(heap_bytes=512 * MIB)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    a = Case("stream 1", 4 * WORLD, 2, 256, 600, route_random, seed=50)  # moe_dispatch by chunks
    b = Case("stream 2", EGRID, 2, 256, 600, route_zipf, seed=51)  # its grid layout
    ha = hb = None
    for _ in range(3):
        ha = run_case(group, a, handle=ha, stream=s1)
        hb = run_case(group, b, handle=hb, stream=s2)
    # The expert outputs from the first rounds (the layout does not change with the same routing).
    layouts = {id(c): c.layout() for c in (a, b)}
    expert_outs = {}
    for c, h in ((a, ha), (b, hb)):
        ex = torch.from_dlpack(h.expert_x)
        expert_outs[id(c)] = check_dispatch(c, h, ex, *layouts[id(c)])
    torch.cuda.synchronize()
    outs = {id(c): new_out(c) for c in (a, b)}
    torch.cuda.synchronize()
    for c, h, s in ((a, ha, s1), (b, hb, s2)):
        dispatch(group, c, h, s)
    for c, h, s in ((a, ha, s1), (b, hb, s2)):
        interlace.moe_combine(expert_outs[id(c)], h, group, out=outs[id(c)], stream=s.cuda_stream)
    torch.cuda.synchronize()
    group.check()
    for c in (a, b):
        check_combine(c, outs[id(c)], layouts[id(c)][0])
    print(f"rank {RANK}: two streams back to back correct")


def graph_buffers(group, E, k, H, T, kind="per_expert"):
    """A captured layer's inputs (x, idx, weights), its out, a no-drop capacity and its handle: the
    graph replays read and write these same buffers."""
    dev = torch.device("cuda")
    x = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    idx = torch.empty(T, k, dtype=torch.int32, device=dev)
    w = torch.empty(T, k, dtype=torch.float32, device=dev)
    out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    capacity = interlace.moe_no_drop_capacity(WORLD, num_experts=E, topk=k, max_tokens=T, capacity_kind=kind)
    handle = interlace.MoeHandle(group, num_experts=E, topk=k, hidden=H, max_tokens=T, capacity=capacity,
                                 capacity_kind=kind)
    return x, idx, w, out, capacity, handle


def load_routing(case, x, idx, wts):
    """This rank's tokens, routing and weights of case into a captured layer's buffers."""
    x.copy_(case.x[RANK])
    idx.copy_(case.idx[RANK].int())
    wts.copy_(case.weights[RANK])


def captured(layer, stream):
    """layer's CUDA graph on stream, after one eager run (the calls agree outside capture)."""
    with torch.cuda.stream(stream):
        layer()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        layer()
    return graph


def scenario_graph():
    """Dispatch, an expert map and combine captured in one CUDA graph, replayed with new routing; at
    64 tokens of 4 experts a rank (moe_dispatch's small layout, CTA 0 numbering), 600 (numbered by
    chunks) and 600 of more than 1024 experts (its grid layout)."""
    group = interlace.init(heap_bytes=512 * MIB)
    for T, E, kind in ((64, 4 * WORLD, "per_expert"), (600, 4 * WORLD, "per_expert"),
                       (600, EGRID, "per_rank")):  # per_rank: W x T x k rows
        graph_replays(group, T, E, kind)
    print(f"rank {RANK}: 3 x 20 graph replays correct")


def graph_replays(group, T, E, kind):
    k, H = 2, 256
    x, idx, w, out, capacity, handle = graph_buffers(group, E, k, H, T, kind)
    stream = torch.cuda.Stream()
    expert_x = torch.from_dlpack(handle.expert_x)
    expert_out = torch.empty_like(expert_x)

    def layer():
        interlace.moe_dispatch(x, idx, w, group, handle=handle, stream=stream.cuda_stream)
        expert_out.copy_((expert_x.float() * 2.0).to(torch.bfloat16))  # one map for every expert: exact
        interlace.moe_combine(expert_out, handle, group, out=out, stream=stream.cuda_stream)

    g0 = torch.Generator().manual_seed(60)
    idx.copy_(route_random(g0, RANK, T, E, k).int())
    graph = captured(layer, stream)
    for step in range(20):
        case = Case(f"replay {step}", E, k, H, T, route_random if step % 2 else route_zipf, capacity=lambda n: capacity,
                    kind=kind, seed=100 + step)
        load_routing(case, x, idx, w)
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        group.check()
        acc = torch.zeros(T, H)
        for j in range(k):
            acc = acc + case.weights[RANK][:, j:j + 1] * (case.x[RANK].float() * 2.0).to(torch.bfloat16).float()
        if not torch.equal(out.cpu(), acc.to(torch.bfloat16)):
            fail(case, "graph replay: combine differs from the reference")


def scenario_validation():
    """Bad arguments raise before any GPU work, on every rank; mismatched ones across ranks are caught."""
    group = interlace.init(heap_bytes=256 * MIB)
    dev = torch.device("cuda")
    E, k, H, T = 4 * WORLD, 2, 256, 32
    x = torch.randn(T, H, device=dev).to(torch.bfloat16)
    idx = torch.zeros(T, k, dtype=torch.int32, device=dev)
    idx[:, 1] = 1
    w = torch.ones(T, k, device=dev)
    kw = dict(num_experts=E, capacity=64)
    expect_error(lambda: interlace.moe_dispatch(x.float(), idx, w, group, **kw), "bfloat16")
    expect_error(lambda: interlace.moe_dispatch(x[:, :250], idx, w, group, **kw), "multiple of 16")  # the handle's
    expect_error(lambda: interlace.moe_dispatch(x[:, :128], idx, w, group, **kw), "x must be contiguous")
    expect_error(lambda: interlace.moe_dispatch(x, idx.float(), w, group, **kw), "int32 or int64")
    expect_error(lambda: interlace.moe_dispatch(x, idx, w.half(), group, **kw), "float32")
    expect_error(lambda: interlace.moe_dispatch(x, idx[:-1], w, group, **kw), "topk_idx has shape")
    expect_error(lambda: interlace.moe_dispatch(x.cpu(), idx, w, group, **kw), "cpu")
    if WORLD > 1:  # every count of experts divides among one rank
        expect_error(lambda: interlace.moe_dispatch(x, idx, w, group, num_experts=E + 1, capacity=64), "multiple")
    expect_error(lambda: interlace.moe_dispatch(x, idx, w, group, num_experts=E, capacity=0), "capacity")
    expect_error(lambda: interlace.moe_dispatch(x, idx, w, group, num_experts=E, capacity=8, capacity_kind="x"),
                 "capacity_kind")
    _, handle = interlace.moe_dispatch(x, idx, w, group, **kw)
    expect_error(lambda: interlace.moe_dispatch(x[:, :128].contiguous(), idx, w, group, handle=handle),
                 "the handle was made for")
    good_out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    eo = torch.zeros(handle.recv_rows, H, dtype=torch.bfloat16, device=dev)
    expect_error(lambda: interlace.moe_combine(eo[:-1], handle, group, out=good_out), "expert_out has shape")
    expect_error(lambda: interlace.moe_combine(eo, handle, group, out=good_out[:-1]), "out has shape")
    # A call only one rank gets wrong: every rank raises, and the group stays usable. Rank 1 has made
    # this very call before, so it does not wait for the others' word (OpCall::agree): it hears of
    # rank 0's failure when its kernel skips the call, by the next check at the latest.
    bad = x.float() if RANK == 0 else x

    def dispatch_then_check():
        interlace.moe_dispatch(bad, idx, w, group, handle=handle)
        torch.cuda.synchronize()
        group.check()

    expect_error(dispatch_then_check, ("bfloat16", "rank 0"))
    # Arguments that differ across ranks, each fine alone (one local expert: both kinds take the same
    # workspace, so the handles agree and the call's signature differs). Last: it may leave the group aborted.
    if WORLD > 1:
        one = torch.zeros(T, 1, dtype=torch.int32, device=dev)
        expect_error(lambda: interlace.moe_dispatch(x, one, w[:, :1].contiguous(), group, num_experts=WORLD,
                                                    capacity=64, capacity_kind="per_rank" if RANK else "per_expert"),
                     "different op calls")
    print(f"rank {RANK}: bad arguments rejected before GPU work")


def fused_inputs(case, d, kept, ffn, k_major=True):
    """Rank d's act [recv_rows, F] in expert_x's layout and its down projections w [L, H, F], from a seed
    of (case, d), so that every rank can rebuild every rank's; act's rows that no expert kept (kept:
    rank d's rows per local expert, or None for no poison) are NaN, so a row sent that should not be
    shows as NaN at home. b: w as the op takes it, transposed (K-contiguous) or a contiguous [L, F, H]."""
    g = torch.Generator().manual_seed(1000 * case.seed + d)
    L, C, H = case.local, case.capacity, case.hidden
    act = (torch.randn(L * C, ffn, generator=g) / 4).to(torch.bfloat16)
    w = (torch.randn(L, H, ffn, generator=g) / ffn ** 0.5).to(torch.bfloat16)
    if kept is not None:
        used = torch.zeros(L * C, dtype=torch.bool)
        for l in range(L):
            used[l * C:l * C + int(kept[l])] = True
        act[~used] = float("nan")
    return act, w


def as_b(w, k_major):
    return w.transpose(1, 2) if k_major else w.transpose(1, 2).contiguous()


def fused_reference(case, row_of, ffn):
    """This rank's out in fp32: for each token, the sum over its kept slots j of weight x the slot's
    row of act at its expert's rank, times that expert's w, rounded to bf16 as an expert output is."""
    T, L = case.tokens[RANK], case.local
    acc = torch.zeros(T, case.hidden, dtype=torch.float32, device="cuda")
    inputs = {}
    for j in range(case.topk):
        for t in range(T):
            r = int(row_of[RANK][t, j])
            if r < 0:
                continue
            e = int(case.idx[RANK][t, j])
            d = e // L
            if d not in inputs:
                act, w = fused_inputs(case, d, None, ffn)
                inputs[d] = (act.cuda().float(), w.cuda().float())
            act, w = inputs[d]
            y = (act[r] @ w[e % L].t()).to(torch.bfloat16).float()
            acc[t] = acc[t] + float(case.weights[RANK][t, j]) * y
    return acc


def check_fused(group, case, handle, row_of, ffn, k_major=True, stream=None, **tuning):
    """moe_gemm_combine (tuning: cluster_m, tile_n) against grouped_gemm + moe_combine (bit for bit;
    both swap where grouped_gemm's rule says so) and the fp32 reference."""
    L, C = case.local, case.capacity
    act, w = fused_inputs(case, RANK, torch.from_dlpack(handle.expert_rows).cpu(), ffn)
    act, b = act.cuda(), as_b(w.cuda(), k_major)
    expert_out = torch.full((handle.recv_rows, case.hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    interlace.grouped_gemm(act.view(L, C, -1), b, expert_out.view(L, C, -1), torch.from_dlpack(handle.expert_rows),
                           **tuning)
    want = new_out(case)
    interlace.moe_combine(expert_out, handle, group, out=want)
    out = new_out(case)
    torch.cuda.synchronize()
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream())
    interlace.moe_gemm_combine(act, b, handle, group, out=out, stream=None if stream is None else stream.cuda_stream,
                               **tuning)
    torch.cuda.synchronize()
    group.check()
    if torch.isnan(out).any():
        bad = torch.isnan(out).nonzero()[0].tolist()
        fail(case, f"moe_gemm_combine: out{bad} is NaN (unwritten, or a row no expert kept was sent)")
    if not torch.equal(out, want):
        bad = (out != want).nonzero()[0].tolist()
        fail(case, f"moe_gemm_combine: out{bad} = {out[bad[0], bad[1]].item()}, grouped_gemm + moe_combine give "
                   f"{want[bad[0], bad[1]].item()}")
    ref = fused_reference(case, row_of, act.shape[1])
    err = ((out.float() - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item() if ref.numel() else 0.0
    if err > 1e-2:
        fail(case, f"moe_gemm_combine: relative error {err:.3g} against the fp32 reference")


def scenario_gemm_combine():
    """moe_gemm_combine on every per_expert routing pattern, against grouped_gemm + moe_combine bit for
    bit and an fp32 reference, with out poisoned and the rows no expert kept NaN; FFN widths with
    K tails, w in both layouts; a per_rank handle refused; two streams back to back; CUDA-graph
    replays with new routing."""
    group = interlace.init(heap_bytes=2048 * MIB)
    n = 0
    for i, case in enumerate(cases()):
        if case.kind != "per_expert":
            continue
        _, handle = dispatch(group, case)
        torch.cuda.synchronize()
        group.check()
        ffn = (64, 136, 200, 256, 1032)[i % 5]  # tails past the 64-wide k-slices: 0, 8, 8, 0, 8
        check_fused(group, case, handle, case.layout()[0], ffn, k_major=i % 3 != 0)
        n += 1
    assert n >= 15, n

    # Every tile and cluster variant, on experts of about 512 rows (four tile rows: pairs of
    # 128 x 128 tiles by default) and of about 48 (one tile row: 128 x 256 by default); hidden 328
    # and 264 end in a part of a tile and of a 128-column pass of its epilogue.
    for case in (Case("fused variants, C > 384", 4 * WORLD, 4, 328, 512, route_random, seed=72),
                 Case("fused variants, one tile row", 8 * WORLD, 2, 264, 96, route_zipf, seed=73)):
        _, handle = dispatch(group, case)
        torch.cuda.synchronize()
        for cluster_m in (1, 2):
            for tile_n in (128, 256):
                check_fused(group, case, handle, case.layout()[0], 200, cluster_m=cluster_m, tile_n=tile_n)

    # Experts of about 256 rows (128 < C <= 320): the swapped problem, w K-major (each slot a tile
    # column, turned into a row in shared memory), and w N-contiguous (unswapped) beside it.
    swapped = Case("fused swapped, C about 256", 8 * WORLD, 4, 264, 512, route_random, seed=75)
    _, handle = dispatch(group, swapped)
    torch.cuda.synchronize()
    assert 128 < swapped.capacity <= 320, swapped.capacity
    for k_major in (True, False):
        check_fused(group, swapped, handle, swapped.layout()[0], 200, k_major=k_major)

    # Dropped slots (a capacity below the routing's need) add nothing, as in moe_combine.
    over = Case("fused overflow", 4 * WORLD, 2, 256, 96, route_zipf, capacity=lambda need: max(need // 3, 1), seed=74)
    _, handle = dispatch(group, over)
    torch.cuda.synchronize()
    expect_error(group.check, "overflowed its capacity")
    check_fused(group, over, handle, over.layout()[0], 128)

    # moe_combine, then moe_gemm_combine twice, on one handle with no sync between them, rank 0 late
    # (a sleep queued first): each op waits for its peers' previous one before it writes their rows.
    case = Case("fused back to back", 4 * WORLD, 2, 256, 80, route_random, seed=75)
    _, handle = dispatch(group, case)
    torch.cuda.synchronize()
    L, C = case.local, case.capacity
    act, w = fused_inputs(case, RANK, torch.from_dlpack(handle.expert_rows).cpu(), 136)
    act, b = act.cuda(), as_b(w.cuda(), True)
    expert_out = torch.full((handle.recv_rows, case.hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    interlace.grouped_gemm(act.view(L, C, -1), b, expert_out.view(L, C, -1), torch.from_dlpack(handle.expert_rows))
    outs = [new_out(case) for _ in range(3)]
    torch.cuda.synchronize()
    if RANK == 0:
        torch.cuda._sleep(200_000_000)  # about 0.1 s at H200 clocks
    interlace.moe_combine(expert_out, handle, group, out=outs[0])
    interlace.moe_gemm_combine(act, b, handle, group, out=outs[1])
    interlace.moe_gemm_combine(act, b, handle, group, out=outs[2])
    torch.cuda.synchronize()
    group.check()
    for i in (1, 2):
        if not torch.equal(outs[i], outs[0]):
            fail(case, f"back to back: moe_gemm_combine call {i} differs from moe_combine's")

    # Back to back on two streams, two handles, no sync between the calls (the group orders them).
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    a = Case("fused stream 1", 4 * WORLD, 2, 256, 64, route_random, seed=80)
    c = Case("fused stream 2", 8 * WORLD, 4, 512, 96, route_zipf, seed=81)
    for _ in range(2):
        for case, s in ((a, s1), (c, s2)):
            _, h = dispatch(group, case, stream=s)
            torch.cuda.synchronize()
            check_fused(group, case, h, case.layout()[0], 128, stream=s)

    # A layer half captured in a graph: dispatch, then moe_gemm_combine, replayed with new routing.
    E, k, H, T, F = 4 * WORLD, 2, 256, 64, 128
    dev = torch.device("cuda")
    x, idx, wts, out, capacity, handle = graph_buffers(group, E, k, H, T)
    act = torch.empty(handle.recv_rows, F, dtype=torch.bfloat16, device=dev)
    w = torch.empty(E // WORLD, H, F, dtype=torch.bfloat16, device=dev)
    stream = torch.cuda.Stream()

    def layer():
        interlace.moe_dispatch(x, idx, wts, group, handle=handle, stream=stream.cuda_stream)
        interlace.moe_gemm_combine(act, w.transpose(1, 2), handle, group, out=out, stream=stream.cuda_stream)

    load_routing(Case("graph warm-up", E, k, H, T, route_random, capacity=lambda n: capacity, seed=90), x, idx, wts)
    torch.cuda.synchronize()
    graph = captured(layer, stream)
    for step in range(6):
        case = Case(f"fused replay {step}", E, k, H, T, route_random if step % 2 else route_zipf,
                    capacity=lambda n: capacity, seed=91 + step)
        load_routing(case, x, idx, wts)
        row_of = case.layout()[0]
        a_, w_ = fused_inputs(case, RANK, None, F)
        act.copy_(a_)
        w.copy_(w_)
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        group.check()
        ref = fused_reference(case, row_of, F)
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        if not err <= 1e-2:  # NaN fails too
            fail(case, f"graph replay: moe_gemm_combine's relative error {err:.3g} against the fp32 reference")

    # Bad arguments, before any GPU work.
    per_rank = Case("per rank", 4 * WORLD, 2, 256, 32, route_random, kind="per_rank", seed=70)
    _, h = dispatch(group, per_rank)
    a0 = torch.zeros(h.recv_rows, 64, dtype=torch.bfloat16, device=dev)
    b0 = torch.zeros(per_rank.local, 64, 256, dtype=torch.bfloat16, device=dev)
    expect_error(lambda: interlace.moe_gemm_combine(a0, b0, h, group, out=new_out(per_rank)), "per_expert")
    good = Case("good", 4 * WORLD, 2, 256, 32, route_random, seed=71)
    _, h = dispatch(group, good)
    a0 = torch.zeros(h.recv_rows, 64, dtype=torch.bfloat16, device=dev)
    b0 = torch.zeros(good.local, 64, 256, dtype=torch.bfloat16, device=dev)
    o0 = new_out(good)
    expect_error(lambda: interlace.moe_gemm_combine(a0.float(), b0, h, group, out=o0), "bfloat16")
    expect_error(lambda: interlace.moe_gemm_combine(a0[:-1], b0, h, group, out=o0), "act has shape")
    expect_error(lambda: interlace.moe_gemm_combine(a0, b0[:, :32], h, group, out=o0), "w has shape")
    expect_error(lambda: interlace.moe_gemm_combine(a0, b0, h, group, out=o0[:-1]), "out has shape")
    expect_error(lambda: interlace.moe_gemm_combine(a0, b0, h, group, out=o0, tile_n=64),
                 "moe_gemm_combine: tile_n must be")
    in_heap = torch.from_dlpack(h.expert_x)[:good.tokens[RANK]]  # the right shape, in the workspace
    expect_error(lambda: interlace.moe_gemm_combine(a0, b0, h, group, out=in_heap), "out lies in the handle's")
    eo = torch.zeros(h.recv_rows, 256, dtype=torch.bfloat16, device=dev)
    expect_error(lambda: interlace.moe_combine(eo, h, group, out=in_heap), "out lies in the handle's")
    torch.cuda.synchronize()
    group.check()
    print(f"rank {RANK}: moe_gemm_combine correct on {n} routing patterns, two streams and 6 graph replays")


def dispatch_gemm_weights(case, n, k_major=True):
    """This rank's w [L, hidden, N] as moe_dispatch_gemm takes it: Linear weights [L, N, hidden]
    transposed (K-contiguous), or contiguous."""
    g = torch.Generator().manual_seed(2000 * case.seed + RANK)
    w = (torch.randn(case.local, n, case.hidden, generator=g) / case.hidden ** 0.5).to(torch.bfloat16).cuda()
    return w.transpose(1, 2) if k_major else w.transpose(1, 2).contiguous()


def dispatch_gemm(group, case, b, handle=None, stream=None, **tuning):
    """Issues case's moe_dispatch_gemm on this rank into a NaN-poisoned out; returns (out, handle)."""
    dev = torch.device("cuda")
    x = case.x[RANK].to(dev)
    idx = case.idx[RANK].to(case.index_dtype).to(dev)
    w = case.weights[RANK].to(dev)
    recv_rows = case.local * case.capacity
    out = torch.full((recv_rows, b.shape[2]), float("nan"), dtype=torch.bfloat16, device=dev)
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream())  # the inputs' copies and the poison
    out, handle = interlace.moe_dispatch_gemm(x, idx, w, b, group, out=out, num_experts=case.experts,
                                              capacity=case.capacity, capacity_kind=case.kind,
                                              max_tokens=case.max_tokens, handle=handle,
                                              stream=None if stream is None else stream.cuda_stream, **tuning)
    INPUTS[id(handle)] = (x, idx, w)
    return out, handle


def check_dispatch_gemm(group, case, out, handle, b, **tuning):
    """out against grouped_gemm on the dispatched rows with the same tiling (bit for bit), an fp32
    reference (1e-2), and NaN past each expert's kept rows (left alone); the dispatch's own results
    as check_dispatch and a moe_combine check them."""
    torch.cuda.synchronize()
    row_of, counts, starts, kept = case.layout()
    expert_x = torch.from_dlpack(handle.expert_x)
    expert_out = check_dispatch(case, handle, expert_x, row_of, counts, starts, kept, direct=False)
    L, C, n = case.local, case.capacity, b.shape[2]
    want = torch.full_like(out, float("nan"))
    rows = torch.from_dlpack(handle.expert_rows)
    interlace.grouped_gemm(expert_x.view(L, C, -1), b, want.view(L, C, n), rows, **tuning)
    torch.cuda.synchronize()
    for l in range(L):
        r0, r1, end = l * C, l * C + int(kept[l]), (l + 1) * C
        if not torch.equal(out[r0:r1], want[r0:r1]):
            bad = (out[r0:r1] != want[r0:r1]).nonzero()[0].tolist()
            fail(case, f"moe_dispatch_gemm: expert {l} row {bad[0]} col {bad[1]} = {out[r0 + bad[0], bad[1]].item()}, "
                       f"grouped_gemm gives {want[r0 + bad[0], bad[1]].item()}")
        if not torch.isnan(out[r1:end]).all():
            fail(case, f"moe_dispatch_gemm: expert {l} wrote rows past its {int(kept[l])} kept rows")
        if r1 > r0:
            ref = expert_x[r0:r1].float() @ b[l].float()
            err = ((out[r0:r1].float() - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item()
            if not err <= 1e-2:
                fail(case, f"moe_dispatch_gemm: expert {l}'s relative error {err:.3g} against the fp32 reference")
    # The handle's home rows and weights: moe_combine of the experts' reference outputs.
    combined = new_out(case)
    interlace.moe_combine(expert_out, handle, group, out=combined)
    torch.cuda.synchronize()
    check_combine(case, combined, row_of)


def scenario_dispatch_gemm():
    """moe_dispatch_gemm on every per_expert routing pattern with top-k <= 32: the dispatch as
    moe_dispatch's checks, out bit for bit grouped_gemm's on the dispatched rows and within 1e-2 of
    fp32, rows past the kept ones untouched; every tiling (the swapped problem too) and copier count;
    overflow; back to back with rank 0 late; two streams; CUDA-graph replays with new routing; bad
    arguments."""
    group = interlace.init(heap_bytes=2048 * MIB, timeout_s=30)  # a stuck wait fails in seconds, naming its flag
    n = 0
    for i, case in enumerate(cases()):
        if case.kind != "per_expert" or case.topk > 32:
            continue
        b = dispatch_gemm_weights(case, (64, 136, 200, 256, 1032)[i % 5], k_major=i % 3 != 0)
        out, handle = dispatch_gemm(group, case, b)
        torch.cuda.synchronize()
        group.check()
        check_dispatch_gemm(group, case, out, handle, b)
        n += 1
    assert n >= 15, n

    # Every tiling and copier count, on experts of about 300 rows (3 tile rows, the swapped problem's
    # C) and of about 48 (one tile row).
    for case in (Case("dispatch_gemm variants, C near 300", 4 * WORLD, 4, 512, 300 // WORLD + 4, route_random,
                      capacity=lambda need: max(need, 257), seed=76),
                 Case("dispatch_gemm variants, one tile row", 8 * WORLD, 2, 264, 96, route_zipf, seed=77)):
        b = dispatch_gemm_weights(case, 200)
        for tuning in ({"cluster_m": 1, "tile_n": 128}, {"cluster_m": 1, "tile_n": 256},
                       {"cluster_m": 2, "tile_n": 128}, {"cluster_m": 2, "tile_n": 256}, {"swap": True},
                       {"copy_ctas": 2}, {"copy_ctas": 64}, {"swap": True, "copy_ctas": 2}):
            out, handle = dispatch_gemm(group, case, b, **tuning)
            torch.cuda.synchronize()
            group.check()
            check_dispatch_gemm(group, case, out, handle, b,
                                **{k: v for k, v in tuning.items() if k != "copy_ctas"})

    # Dropped slots (a capacity below the routing's need): reported, never computed on.
    over = Case("dispatch_gemm overflow", 4 * WORLD, 2, 256, 96, route_zipf, capacity=lambda need: max(need // 3, 1),
                seed=78)
    b = dispatch_gemm_weights(over, 128)
    out, handle = dispatch_gemm(group, over, b)
    torch.cuda.synchronize()
    expect_error(group.check, "overflowed its capacity")
    check_dispatch_gemm(group, over, out, handle, b)

    # Twice back to back with one handle and no sync, rank 0 late: the second call's sends wait for
    # every peer's first call to finish reading its receive rows.
    a = Case("dispatch_gemm back to back 1", 4 * WORLD, 2, 256, 80, route_random, seed=82)
    c = Case("dispatch_gemm back to back 2", 4 * WORLD, 2, 256, 80, route_zipf, capacity=lambda need: a.capacity,
             seed=83)
    b = dispatch_gemm_weights(a, 136)
    torch.cuda.synchronize()
    if RANK == 0:
        torch.cuda._sleep(200_000_000)  # about 0.1 s at H200 clocks
    out_a, handle = dispatch_gemm(group, a, b)
    snapshot = torch.from_dlpack(handle.expert_x).clone()
    if c.capacity >= c.needed_capacity():
        out_c, _ = dispatch_gemm(group, c, b, handle=handle)
        torch.cuda.synchronize()
        group.check()
        check_dispatch_gemm(group, c, out_c, handle, b)
        L, C = a.local, a.capacity
        want = torch.full_like(out_a, float("nan"))
        interlace.grouped_gemm(snapshot.view(L, C, -1), b, want.view(L, C, -1), torch.tensor(
            a.layout()[3].tolist(), dtype=torch.int32, device="cuda"))
        torch.cuda.synchronize()
        kept = a.layout()[3]
        for l in range(L):
            if not torch.equal(out_a[l * C:l * C + int(kept[l])], want[l * C:l * C + int(kept[l])]):
                fail(a, f"back to back: the first call's expert {l} differs")

    # Back to back on two streams, two handles, no sync between the calls (the group orders them).
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    a = Case("dispatch_gemm stream 1", 4 * WORLD, 2, 256, 64, route_random, seed=84)
    c = Case("dispatch_gemm stream 2", 8 * WORLD, 4, 512, 96, route_zipf, seed=85)
    ba, bc = dispatch_gemm_weights(a, 128), dispatch_gemm_weights(c, 256)
    for _ in range(2):
        out_a, ha = dispatch_gemm(group, a, ba, stream=s1)
        out_c, hc = dispatch_gemm(group, c, bc, stream=s2)
        torch.cuda.synchronize()
        group.check()
        check_dispatch_gemm(group, a, out_a, ha, ba)
        check_dispatch_gemm(group, c, out_c, hc, bc)

    # A whole layer captured in a graph: moe_dispatch_gemm, then moe_gemm_combine, replayed with new
    # routing and weights, against the fp32 reference of the two matmuls.
    E, k, H, T, F = 4 * WORLD, 2, 256, 64, 128
    dev = torch.device("cuda")
    x, idx, wts, out, capacity, handle = graph_buffers(group, E, k, H, T)
    w1 = torch.empty(E // WORLD, H, F, dtype=torch.bfloat16, device=dev)
    w2 = torch.empty(E // WORLD, H, F, dtype=torch.bfloat16, device=dev)
    act = torch.empty(handle.recv_rows, F, dtype=torch.bfloat16, device=dev)
    stream = torch.cuda.Stream()

    def layer():
        interlace.moe_dispatch_gemm(x, idx, wts, w1, group, out=act, handle=handle, stream=stream.cuda_stream)
        interlace.moe_gemm_combine(act, w2.transpose(1, 2), handle, group, out=out, stream=stream.cuda_stream)

    load_routing(Case("graph warm-up", E, k, H, T, route_random, capacity=lambda n: capacity, seed=90), x, idx, wts)
    torch.cuda.synchronize()
    graph = captured(layer, stream)
    for step in range(6):
        case = Case(f"dispatch_gemm replay {step}", E, k, H, T, route_random if step % 2 else route_zipf,
                    capacity=lambda n: capacity, seed=95 + step)
        load_routing(case, x, idx, wts)
        row_of = case.layout()[0]
        g = torch.Generator().manual_seed(3000 + step)  # the same weights on every rank
        w1_all = (torch.randn(E, H, F, generator=g) / H ** 0.5).to(torch.bfloat16)
        w2_all = (torch.randn(E, H, F, generator=g) / F ** 0.5).to(torch.bfloat16)
        L = E // WORLD
        w1.copy_(w1_all[RANK * L:(RANK + 1) * L])
        w2.copy_(w2_all[RANK * L:(RANK + 1) * L])
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        group.check()
        ref = torch.zeros(T, H, dtype=torch.float32)
        for t in range(T):
            for j in range(k):
                if row_of[RANK][t, j] < 0:
                    continue
                e = int(case.idx[RANK][t, j])
                h = (case.x[RANK][t].float() @ w1_all[e].float()).to(torch.bfloat16).float()
                y = (h @ w2_all[e].float().t()).to(torch.bfloat16).float()
                ref[t] += float(case.weights[RANK][t, j]) * y
        err = ((out.float().cpu() - ref).abs().max() / ref.abs().max()).item()
        if not err <= 2e-2:  # NaN fails too
            fail(case, f"graph replay: the layer's relative error {err:.3g} against the fp32 reference")

    # Bad arguments, before any GPU work.
    per_rank = Case("per rank", 4 * WORLD, 2, 256, 32, route_random, kind="per_rank", seed=70)
    b0 = dispatch_gemm_weights(per_rank, 64)
    expect_error(lambda: dispatch_gemm(group, per_rank, b0), "per_expert")
    wide = Case("top-k 33", 64 * WORLD, 33, 64, 8, route_random, seed=79)
    expect_error(lambda: dispatch_gemm(group, wide, dispatch_gemm_weights(wide, 64)), "top-33")
    good = Case("good", 4 * WORLD, 2, 256, 32, route_random, seed=71)
    b0 = dispatch_gemm_weights(good, 64)
    expect_error(lambda: dispatch_gemm(group, good, b0.float()), "bfloat16")
    expect_error(lambda: dispatch_gemm(group, good, b0[:, :128]), "w has shape")
    expect_error(lambda: dispatch_gemm(group, good, b0, tile_n=64), "moe_dispatch_gemm: tile_n must be")
    expect_error(lambda: dispatch_gemm(group, good, b0, cluster_m=2, tile_n=128, copy_ctas=3), "copy_ctas")
    expect_error(lambda: dispatch_gemm(group, good, b0, copy_ctas=100000), "copy_ctas")
    _, h = dispatch_gemm(group, good, b0)
    in_heap = torch.from_dlpack(h.expert_x).view(-1)[:h.recv_rows * 64].view(h.recv_rows, 64)  # contiguous
    expect_error(lambda: interlace.moe_dispatch_gemm(good.x[RANK].cuda(), good.idx[RANK].cuda(),
                                                     good.weights[RANK].cuda(), b0, group, out=in_heap, handle=h),
                 "out overlaps a")
    torch.cuda.synchronize()
    group.check()
    print(f"rank {RANK}: moe_dispatch_gemm correct on {n} routing patterns, every tiling, two streams and 6 graph "
          f"replays")


SCENARIOS = {
    "dispatch_gemm": scenario_dispatch_gemm,
    "gemm_combine": scenario_gemm_combine,
    "patterns": scenario_patterns,
    "overflow": scenario_overflow,
    "streams": scenario_streams,
    "graph": scenario_graph,
    "validation": scenario_validation,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
