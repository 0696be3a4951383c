"""MoE dispatch and combine benchmark, one rank. Started by `python -m interlace.bench moe`.

Configs per rank (issue 12): DeepSeek-V3-like (4096 tokens, hidden 7168, 256 experts, top-8) and
Mixtral-like (4096 tokens, hidden 4096, 8 experts, top-2), and the decode size of each (128 tokens).
Routing is random (k distinct experts per token); the capacity is the routing's own need, so nothing
is dropped. Each config is checked first: interlace's expert rows against the baseline's, bit for
bit, and its combine against the baseline's (relative error). Then, in the same run, interleaved
(CUDA events, the slower rank's median):
  dispatch, combine           interlace.moe_dispatch / moe_combine (handle reused: no allocation);
  baseline_dispatch/_combine  the host-driven pipeline: exchange counts (all_to_all), sync for the
                              splits, NCCL all_to_all_single of the (token, expert) rows, permute to
                              per-expert order; the way back, then the weighted sum in fp32;
  nccl_all_to_all             all_to_all_single alone on the baseline's rows and splits: the
                              transport the dispatch is measured against (token_gbs: a logical
                              rate, the layer's (token, expert) row bytes over the time);
  nccl_all_to_all_unique      the same on the rows a de-duplicating dispatch moves: each token
                              once to each rank that holds any of its experts;
and at decode sizes, per call under CUDA-graph replay: interlace's two ops, and the baseline
padded to the most rows any rank sends one expert (no host sync, so it can be captured; the usual
capturable form).
The halves the issue's bars are on, unfused: dispatch_gemm1 (moe_dispatch, then
interlace.grouped_gemm on the capacity-padded rows with the counts on the GPU: gate and up, N = 2F)
and gemm2_combine (grouped_gemm of the down projection, K = F, into expert_out, then moe_combine),
against baseline_dispatch_gemm1 (the baseline's dispatch, then torch._grouped_mm on its packed rows)
and baseline_gemm2_combine (torch._grouped_mm, then the baseline's way back). The activation between
the GEMMs is not timed; both sides' GEMMs are checked against each other first. The fused halves, each
checked bit for bit against its unfused one: dispatch_gemm1_fused (interlace.moe_dispatch_gemm;
with --tunings, one method per copy_ctas value) and gemm2_combine_fused (interlace.moe_gemm_combine)."""

import torch
import torch.distributed as dist
from absl import app, flags

import interlace
from interlace.bench import common
from interlace.bench.moe_baseline import Baseline, routing

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "bench/results", "where the JSON goes")
flags.DEFINE_list("sizes", [], "configs to run (default: all): deepseek, mixtral, deepseek_decode, mixtral_decode")
flags.DEFINE_integer("warmup", 5, "untimed calls per method first")
flags.DEFINE_integer("iters", 40, "timed calls per method")
flags.DEFINE_list("tunings", [], "moe_dispatch_gemm's copy_ctas values to time (default: its own)")
flags.DEFINE_string("command", "", "the command line, recorded in the JSON")

# name -> (tokens per rank, hidden, experts, top-k)
CONFIGS = {"deepseek": (4096, 7168, 256, 8), "mixtral": (4096, 4096, 8, 2),
           "deepseek_decode": (128, 7168, 256, 8), "mixtral_decode": (128, 4096, 8, 2)}
CALLS_PER_GRAPH = 8
FFN = {"deepseek": 2048, "mixtral": 14336, "deepseek_decode": 2048, "mixtral_decode": 14336}  # expert FFN width


def expert_rows_of(handle, expert_x):
    """interlace's kept rows, local expert by local expert (its layout leaves gaps of capacity)."""
    starts = torch.from_dlpack(handle.expert_starts).tolist()
    rows = torch.from_dlpack(handle.expert_rows).tolist()
    return torch.cat([expert_x[s:s + n] for s, n in zip(starts, rows)])


def expert_ffn(name, handle, expert_x, packed_rows, x, idx, weights, group, base, out):
    """The dispatch + GEMM1 and GEMM2 + combine halves, interlace's and the baseline's (module
    docstring), each GEMM checked against the other side's first. Returns ({label: fn}, {why skipped})."""
    gmm = getattr(torch, "_grouped_mm", None)
    if gmm is None:
        return {}, {"expert_ffn": f"torch {torch.__version__} has no torch._grouped_mm"}
    local, hidden, ffn = base.L, x.shape[1], FFN[name]
    capacity = handle.recv_rows // local
    if capacity * local != handle.recv_rows:
        return {}, {"expert_ffn": "expert_x is not local experts x capacity rows"}
    g = torch.Generator(device="cuda").manual_seed(11)
    w1t = (torch.randn(local, 2 * ffn, hidden, generator=g, device="cuda", dtype=torch.bfloat16) * hidden ** -0.5)
    w1t = w1t.transpose(1, 2)  # Linear weights [L, 2F, H] as [L, H, 2F]
    w2t = (torch.randn(local, hidden, ffn, generator=g, device="cuda", dtype=torch.bfloat16) * ffn ** -0.5)
    w2t = w2t.transpose(1, 2)
    rows = torch.from_dlpack(handle.expert_rows)  # int32 [L] on the GPU, from the dispatch above
    kept = rows.tolist()
    offs = rows.cumsum(0).to(torch.int32)  # the baseline's group ends (from its own splits in a real layer)
    ex = expert_x.view(local, capacity, hidden)
    h = torch.empty(local, capacity, 2 * ffn, device="cuda", dtype=torch.bfloat16)
    act = torch.randn(local, capacity, ffn, generator=g, device="cuda", dtype=torch.bfloat16)  # GEMM2's input
    expert_out = torch.empty(local * capacity, hidden, device="cuda", dtype=torch.bfloat16)
    eo = expert_out.view(local, capacity, hidden)

    def packed(t):
        return torch.cat([t[e, :n] for e, n in enumerate(kept)])
    act_rows = packed(act)
    interlace.grouped_gemm(ex, w1t, h, rows)
    interlace.grouped_gemm(act, w2t, eo, rows)
    for what, ours, theirs in [("GEMM1", packed(h), gmm(packed_rows, w1t, offs=offs)),
                               ("GEMM2", packed(eo), gmm(act_rows, w2t, offs=offs))]:
        err = common.relative_error(ours, theirs)
        if not err < 1e-2:
            raise SystemExit(f"{name}: grouped_gemm's {what} differs from torch._grouped_mm's: relative error {err}")
    # The fused second half: the same bits as grouped_gemm into expert_out, then moe_combine.
    act_rows_all = act.view(local * capacity, ffn)
    fused_out = torch.full_like(out, float("nan"))
    interlace.moe_combine(expert_out, handle, group, out=out)
    interlace.moe_gemm_combine(act_rows_all, w2t, handle, group, out=fused_out)
    torch.cuda.synchronize()
    group.check()
    if not torch.equal(fused_out, out):
        raise SystemExit(f"{name}: moe_gemm_combine differs from grouped_gemm + moe_combine")
    # The fused first half: the same dispatch again, and the same bits as grouped_gemm on its rows.
    fused_h = torch.full_like(h, float("nan")).view(local * capacity, 2 * ffn)
    interlace.moe_dispatch_gemm(x, idx, weights, w1t, group, out=fused_h, handle=handle)
    torch.cuda.synchronize()
    group.check()
    if not torch.equal(packed(fused_h.view(local, capacity, -1)), packed(h)):
        raise SystemExit(f"{name}: moe_dispatch_gemm differs from moe_dispatch + grouped_gemm")
    # --tunings: copy_ctas values ("0:0", which the launcher adds, is the automatic one).
    copy_ctas = sorted({0 if t == "0:0" else int(t) for t in FLAGS.tunings} | {0})
    fused_first = {"dispatch_gemm1_fused" + (f"_c{c}" if c else ""): c for c in copy_ctas}
    return {
        **{label: (lambda c=c: interlace.moe_dispatch_gemm(x, idx, weights, w1t, group, out=fused_h, handle=handle,
                                                           copy_ctas=c))
           for label, c in fused_first.items()},
        "dispatch_gemm1": lambda: (interlace.moe_dispatch(x, idx, weights, group, handle=handle),
                                   interlace.grouped_gemm(ex, w1t, h, rows)),
        "baseline_dispatch_gemm1": lambda: gmm(base.dispatch(x), w1t, offs=offs),
        "gemm2_combine": lambda: (interlace.grouped_gemm(act, w2t, eo, rows),
                                  interlace.moe_combine(expert_out, handle, group, out=out)),
        "baseline_gemm2_combine": lambda: base.combine(gmm(act_rows, w2t, offs=offs)),
        "gemm2_combine_fused": lambda: interlace.moe_gemm_combine(act_rows_all, w2t, handle, group, out=fused_out),
    }, {}


def run_config(name, group, rank, world):
    tokens, hidden, experts, topk = CONFIGS[name]
    g = torch.Generator(device="cuda").manual_seed(7 + rank)
    x = torch.randn(tokens, hidden, generator=g, device="cuda").to(torch.bfloat16)
    idx, weights = routing(rank, tokens, experts, topk, seed=len(name))
    # The capacity this routing needs per expert (every rank's counts), so nothing is dropped; the
    # padded baseline needs only the most any one source sends an expert.
    counts = torch.bincount(idx.view(-1).long(), minlength=experts)
    most_from_one = counts.max().clone()
    dist.all_reduce(most_from_one, op=dist.ReduceOp.MAX)
    dist.all_reduce(counts)
    capacity = int(counts.max())
    base = Baseline(idx, weights, experts, world, int(most_from_one))
    handle = interlace.MoeHandle(group, num_experts=experts, topk=topk, hidden=hidden, max_tokens=tokens,
                                 capacity=capacity)

    # Correctness: expert rows bit for bit, then the combine of the identity expert.
    expert_x = torch.from_dlpack(interlace.moe_dispatch(x, idx, weights, group, handle=handle)[0])
    want_rows = base.dispatch(x)
    torch.cuda.synchronize()
    group.check()
    got_rows = expert_rows_of(handle, expert_x)
    if not torch.equal(got_rows, want_rows):
        raise SystemExit(f"rank {rank}: {name}: moe_dispatch's expert rows differ from the baseline's "
                         f"({got_rows.shape[0]} rows against {want_rows.shape[0]})")
    out = torch.full_like(x, float("nan"))
    interlace.moe_combine(expert_x, handle, group, out=out)
    want = base.combine(want_rows)
    torch.cuda.synchronize()
    group.check()
    err = common.relative_error(out, want)
    if not err < 1e-2:
        raise SystemExit(f"rank {rank}: {name}: moe_combine's relative error against the baseline is {err}")

    methods = {
        "dispatch": lambda: interlace.moe_dispatch(x, idx, weights, group, handle=handle),
        "combine": lambda: interlace.moe_combine(expert_x, handle, group, out=out),
        "baseline_dispatch": lambda: base.dispatch(x),
        "baseline_combine": lambda: base.combine(want_rows),
    }
    send_splits, recv_splits = base.saved[0], base.saved[1]
    a2a_out = x.new_empty(sum(recv_splits), hidden)
    a2a_in = x[base.tok]
    methods["nccl_all_to_all"] = lambda: dist.all_to_all_single(a2a_out, a2a_in, recv_splits, send_splits)
    # The same transport for the rows a de-duplicating dispatch moves (a token once per rank).
    unique_tokens, unique_send, unique_recv = base.unique_transport()
    unique_in, unique_out = x[unique_tokens], x.new_empty(sum(unique_recv), hidden)
    methods["nccl_all_to_all_unique"] = lambda: dist.all_to_all_single(unique_out, unique_in, unique_recv, unique_send)
    ffn_methods, skipped = expert_ffn(name, handle, expert_x, want_rows, x, idx, weights, group, base, out)
    methods.update(ffn_methods)
    graphed = set()
    if tokens <= 128:
        send = x.new_zeros(experts, base.C, hidden)
        recv = torch.empty_like(send)
        back = torch.empty_like(send)
        padded = {"baseline_padded_dispatch_graph": lambda: base.padded_dispatch(x, send, recv),
                  "baseline_padded_combine_graph": lambda: base.padded_combine(recv, back),
                  "dispatch_graph": methods["dispatch"], "combine_graph": methods["combine"]}
        for label, fn in padded.items():
            replay, why = common.agreed(lambda fn=fn: common.graph_of(fn, CALLS_PER_GRAPH), label)
            if replay is None:  # recorded; the other methods still run
                skipped[label] = why
                continue
            methods[label] = replay
            graphed.add(label)
    ms = common.time_collective(methods, FLAGS.warmup, FLAGS.iters)
    group.check()
    us = {label: t * 1e3 / (CALLS_PER_GRAPH if label in graphed else 1) for label, t in ms.items()}
    # A logical rate, not link bandwidth: the (token, expert) rows the layer delivers, self-routed ones
    # included, over the time. interlace moves a token once per destination rank, the baseline once per
    # (token, expert), so the same numerator compares how fast each delivers the layer's input.
    pair_bytes = torch.tensor([tokens * topk * hidden * 2], device="cuda", dtype=torch.float64)
    dist.all_reduce(pair_bytes)
    return {"config": name, "tokens": tokens, "hidden": hidden, "experts": experts, "topk": topk,
            "capacity": capacity, "combine_rel_error": err, "us": us, "skipped": skipped,
            "token_gbs": {label: pair_bytes.item() / world / (us[label] * 1e-6) / 1e9
                          for label in ("dispatch", "nccl_all_to_all", "nccl_all_to_all_unique")}}


def plot(path, rows, env, world):
    """Per config, microseconds of each method, interlace's beside the baseline's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(rows), figsize=(4.5 * len(rows), 4.8), squeeze=False)
    for ax, r in zip(axes[0], rows):
        labels = list(r["us"])
        ax.barh(labels, [r["us"][label] for label in labels],
                color=["tab:blue" if not label.startswith(("baseline", "nccl")) else "tab:gray" for label in labels])
        ax.set_xlabel("us per call")
        ax.set_title(f"{r['config']} ({r['tokens']} tokens/rank)", fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
    fig.suptitle(f"moe dispatch / combine, {world} x {env['gpu']}, {env['date'][:10]}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def ratio(us, baseline, ours):
    return us[baseline] / us[ours] if baseline in us and ours in us else float("nan")


def main(_):
    rank, world = common.init_rank()
    names = FLAGS.sizes or list(CONFIGS)
    for name in names:
        if name not in CONFIGS:
            raise SystemExit(f"moe: unknown config {name!r}; one of {', '.join(CONFIGS)}")
    group = interlace.init(heap_bytes=6 << 30, timeout_s=30.0)
    common.warm_up_gpu()
    rows = []
    for name in names:
        rows.append(run_config(name, group, rank, world))
        if rank == 0:
            print(name, {k: round(v, 1) for k, v in rows[-1]["us"].items()}, rows[-1]["skipped"] or "", flush=True)
    if rank == 0:
        env = common.environment(FLAGS.command)
        path = common.write_results(FLAGS.out_dir, f"moe_{world}x{env['gpu'].replace(' ', '_')}",
                                    {"op": "moe", "env": env, "rows": rows}, lambda p: plot(p, rows, env, world))
        print(f"wrote {path}")
        print("us per call; speedup = baseline / interlace (bars: dispatch and combine halves with their GEMMs "
              "1.3x; dispatch's token bytes/s 1.3x NCCL all_to_all's; decode under graphs 2x)")
        print(f"{'config':>16} {'dispatch':>9} {'base':>9} {'x':>5} {'combine':>9} {'base':>9} {'x':>5} "
              f"{'a2a':>9} {'a2a uniq':>9} {'x a2a':>6} {'x uniq':>6} {'graph d x':>9} {'graph c x':>9} "
              f"{'d+gemm1 x':>9} {'fused x':>7} {'gemm2+c x':>9} {'fused x':>7}")
        for r in rows:
            us = r["us"]
            print(f"{r['config']:>16} {us['dispatch']:9.1f} {us['baseline_dispatch']:9.1f} "
                  f"{ratio(us, 'baseline_dispatch', 'dispatch'):5.2f} {us['combine']:9.1f} "
                  f"{us['baseline_combine']:9.1f} {ratio(us, 'baseline_combine', 'combine'):5.2f} "
                  f"{us['nccl_all_to_all']:9.1f} {us['nccl_all_to_all_unique']:9.1f} "
                  f"{ratio(us, 'nccl_all_to_all', 'dispatch'):6.2f} {ratio(us, 'nccl_all_to_all_unique', 'dispatch'):6.2f} "
                  f"{ratio(us, 'baseline_padded_dispatch_graph', 'dispatch_graph'):9.2f} "
                  f"{ratio(us, 'baseline_padded_combine_graph', 'combine_graph'):9.2f} "
                  f"{ratio(us, 'baseline_dispatch_gemm1', 'dispatch_gemm1'):9.2f} "
                  f"{ratio(us, 'baseline_dispatch_gemm1', 'dispatch_gemm1_fused'):7.2f} "
                  f"{ratio(us, 'baseline_gemm2_combine', 'gemm2_combine'):9.2f} "
                  f"{ratio(us, 'baseline_gemm2_combine', 'gemm2_combine_fused'):7.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    app.run(main)
