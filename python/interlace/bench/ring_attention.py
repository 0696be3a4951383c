"""Ring attention forward (issue 13) benchmark, one rank per GPU. Started by
`python -m interlace.bench ring_attention`.

Shapes: global sequence S of 16384 and 32768 (--sizes: others), B = 1, D = 128, (Hq, Hkv) of
(32, 32) and (32, 8), causal and not. Every rank builds the whole q, k, v from one seed and keeps its
zigzag shard (interlace.ring_attention_shard). Each shape is checked first, out poisoned with NaN
beforehand: interlace.ring_attention's out and lse on this rank's rows against an fp32 reference
(heads 0 and Hq-1), and against the serial baseline's (every head); relative error <= 1e-2 and lse
within 2e-3, else the run stops. Each baseline ring is checked against the reference the same way,
and dropped (with the reason) if wrong or if it fails. Then, in the same run, interleaved (CUDA
events, the slower rank's median):
  interlace               interlace.ring_attention (with lse, which training needs and the
                          baselines make anyway)
  serial                  the ring as ring-flash-attn computes it (ring_attention_baseline): cuDNN
                          attention per K/V block with its log-sum-exp, fp32 merges, NCCL
                          point-to-point for the blocks; each transfer done before its compute
  overlapped              the same, the next block's transfer in flight while this one computes
  compute_only            the ring's per-step cuDNN calls on this GPU alone: no transfers, no merges
  interlace_compute_only  the same calls on interlace.attention, the engine ring_attention runs per
                          block: the floor for interlace
With GQA, cuDNN is given K/V's own heads where it takes them (checked against expanded heads; the
row's "cudnn_gqa" says which), else the rings expand each block as it computes it (the blocks travel
with Hkv heads, as interlace's do) and compute_only's K/V are expanded once, before timing.
TFLOP/s per rank: 4 S^2 Hq D / W, halved under the causal mask. speedup_vs_baseline: the faster of
serial and overlapped over interlace; ratio_to_compute_only: interlace over interlace_compute_only."""
import functools

import torch
import torch.distributed as dist
from absl import app, flags

import interlace
from interlace.bench import common
from interlace.bench.ring_attention_baseline import (attend_cudnn, compute_only, expand_kv, reference, ring_overlapped,
                                                     ring_serial, shard_halves)

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "bench/results", "where the JSON and the plot go")
flags.DEFINE_list("sizes", [], "global sequence lengths (default 16384, 32768)")
flags.DEFINE_integer("warmup", 3, "untimed calls per method first")
flags.DEFINE_integer("iters", 10, "timed calls per method (each takes milliseconds)")
flags.DEFINE_list("tunings", [], "sender CTA counts to time besides the automatic one, as interlace[<n> senders]")
flags.DEFINE_string("command", "", "the command line, recorded in the JSON")

SEQS = [16384, 32768]
HEADS = [(32, 32), (32, 8)]  # (Hq, Hkv): MHA and GQA 4
HEAD_DIM, BATCH = 128, 1
METHODS = ("interlace", "serial", "overlapped", "compute_only", "interlace_compute_only")
SHORT = {"interlace": "interlace", "serial": "serial", "overlapped": "overlapped", "compute_only": "compute",
         "interlace_compute_only": "il_compute"}  # the final table's column heads
OUT_TOL, LSE_TOL = 1e-2, 2e-3  # relative error of out; absolute error of lse


def attend_interlace(q, k, v, causal, scale):
    """(out, lse) of interlace.attention, the engine ring_attention runs per block."""
    q, k, v = (t.contiguous() for t in (q, k, v))  # no-ops at B = 1, where the ring's row slices are contiguous
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device, dtype=torch.float32)
    interlace.attention(q, k, v, out, causal=causal, softmax_scale=scale, lse=lse)
    return out, lse


def cudnn_attend(q, k, v, scale):
    """The cuDNN attend for these heads, and how it treats GQA: "native" where cuDNN takes fewer KV
    heads and gives what expanding them gives (on every rank), else "expanded per block"."""
    if k.shape[2] == q.shape[2]:
        return attend_cudnn, "mha"
    native = False
    try:
        got = attend_cudnn(q, k, v, False, scale, expand=False)[0]
        native = common.relative_error(got, attend_cudnn(q, k, v, False, scale)[0]) < 1e-3
    except Exception:  # noqa: BLE001 (a cuDNN that refuses fewer KV heads: expand them)
        pass
    if common.all_ranks(native):
        return functools.partial(attend_cudnn, expand=False), "native"
    return attend_cudnn, "expanded per block"


def heap_bytes(seqs, world):
    """Room in the symmetric heap for ring_attention's landing blocks at every shape (W - 1 blocks of
    K and V, each of the largest shard), plus slack."""
    need = 0
    for s in seqs:
        rows = max(sum(shard_halves(s, world, r)) for r in range(world))
        need += sum((world - 1) * 2 * BATCH * rows * hkv * HEAD_DIM * 2 for hkv in {hkv for _, hkv in HEADS})
    return need + (256 << 20)


def measure(group, s, hq, hkv, causal, rank, world):
    """Checks and times every method at one shape; all tensors are freed on return."""
    d, scale = HEAD_DIM, HEAD_DIM ** -0.5
    # The global sequence, the same on every rank (one seed), then this rank's zigzag shard.
    g = torch.Generator(device="cuda").manual_seed(s * 131 + hq * 7 + hkv * 3 + causal)
    whole = [torch.randn(BATCH, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for h in (hq, hkv, hkv)]
    q, k, v = (interlace.ring_attention_shard(t, rank, world, dim=1) for t in whole)
    positions = interlace.ring_attention_shard(torch.arange(s, device="cuda"), rank, world, dim=0)
    heads = [0, hq - 1]
    ref_out, ref_lse = reference(*whole, positions, heads, causal, scale)
    del whole
    row = {"s": s, "b": BATCH, "h": hq, "h_kv": hkv, "d": d, "causal": causal, "world": world,
           "s_local": q.shape[1], "check": {}}

    def errors(out, lse, serial=None):
        e = {"rel_err_fp32": common.relative_error(out[:, :, heads], ref_out),
             "lse_err_fp32": (lse[:, heads] - ref_lse).abs().max().item()}
        if serial is not None:
            e["rel_err_vs_serial"] = common.relative_error(out, serial[0])
            e["lse_err_vs_serial"] = (lse - serial[1]).abs().max().item()
        return e

    def wrong(e):  # also NaN: rows never written
        return any(not value <= (LSE_TOL if name.startswith("lse") else OUT_TOL) for name, value in e.items())

    methods, serial = {}, {}

    def add(label, make):
        fn, why = common.agreed(make, label)
        if fn is None:  # recorded; the other methods still run
            row[label] = {"error": why}
        else:
            methods[label] = fn

    attend, row["cudnn_gqa"] = cudnn_attend(q, k, v, scale)
    for label, ring in (("serial", ring_serial), ("overlapped", ring_overlapped)):
        def make(label=label, ring=ring):
            def call():
                return ring(q, k, v, causal, attend, scale=scale, seq_len=s)
            result = call()
            torch.cuda.synchronize()
            row["check"][label] = errors(*result)
            if wrong(row["check"][label]):
                raise RuntimeError(f"wrong result: {row['check'][label]}")
            if label == "serial":
                serial["result"] = result
            return call
        add(label, make)

    out = torch.empty_like(q)
    lse = torch.empty(BATCH, hq, q.shape[1], device="cuda", dtype=torch.float32)
    problem = []

    def make_interlace(label, senders):
        def call_interlace():
            interlace.ring_attention(q, k, v, out, group, causal=causal, softmax_scale=scale, lse=lse, seq_len=s,
                                     sender_ctas=senders)

        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        call_interlace()
        torch.cuda.synchronize()
        group.check()
        e = row["check"][label] = errors(out, lse, serial.get("result"))
        if wrong(e):
            problem.append(f"{label} wrong at S={s} Hq={hq} Hkv={hkv} causal={causal}: {e}, "
                           f"{int(out.isnan().sum())} elements unwritten")
        return call_interlace

    add("interlace", lambda: make_interlace("interlace", 0))
    for senders in sender_tunings():
        label = f"interlace[{senders} senders]"
        add(label, lambda label=label, senders=senders: make_interlace(label, senders))
    if not common.all_ranks(not problem):
        raise SystemExit(f"rank {rank}: {problem[0] if problem else 'another rank found a wrong result'}")
    serial.clear()

    # With cuDNN expanding GQA's K/V per call, compute_only's are expanded once here, outside the timing.
    k_x, v_x = expand_kv(k, v, hq) if row["cudnn_gqa"] == "expanded per block" else (k, v)
    for label, keys, values, attend_fn in (("compute_only", k_x, v_x, attend),
                                           ("interlace_compute_only", k, v, attend_interlace)):
        def make(keys=keys, values=values, attend_fn=attend_fn):
            def call():
                compute_only(q, keys, values, causal, attend_fn, scale=scale, seq_len=s)
            call()
            return call
        add(label, make)

    medians = common.time_collective(methods, FLAGS.warmup, FLAGS.iters) if methods else {}
    if "interlace" in methods:
        group.check()
    flop = 4.0 * s * s * hq * d / world / (2 if causal else 1)
    for label, ms in medians.items():
        row[label] = {"ms": ms, "tflops": flop / ms / 1e9}
    ms = {label: medians.get(label) for label in METHODS}
    baselines = [label for label in ("serial", "overlapped") if ms[label]]
    best = min(baselines, key=lambda label: ms[label]) if baselines else None
    row["baseline"] = best
    row["speedup_vs_baseline"] = ms[best] / ms["interlace"] if best and ms["interlace"] else None
    row["ratio_to_compute_only"] = (ms["interlace"] / ms["interlace_compute_only"]
                                    if ms["interlace"] and ms["interlace_compute_only"] else None)
    return row


def sender_tunings():
    """The --tunings sender counts (the launcher always passes the automatic "0:0" first)."""
    return [int(t) for t in FLAGS.tunings if t not in ("0", "0:0")]


def fmt(value, spec):
    return format(value, spec) if value is not None else "-"


def print_row(r):
    labels = list(METHODS) + [label for label in r if label.startswith("interlace[")]  # the tunings
    ms = "  ".join(f"{label} {fmt(r[label].get('ms'), '.3f')}" for label in labels)
    print(f"S={r['s']} Hq={r['h']} Hkv={r['h_kv']} causal={r['causal']!s:5}: {ms} ms  speedup "
          f"{fmt(r['speedup_vs_baseline'], '.2f')}  vs compute {fmt(r['ratio_to_compute_only'], '.2f')}", flush=True)


def plot(path, rows, env, world):
    """Per shape, milliseconds of each method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"S={r['s']} {r['h']}/{r['h_kv']}{' causal' if r['causal'] else ''}" for r in rows]
    width = 0.8 / len(METHODS)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * len(rows)), 4.8))
    for i, label in enumerate(METHODS):
        ax.bar([x + (i - (len(METHODS) - 1) / 2) * width for x in range(len(rows))],
               [r[label].get("ms", float("nan")) for r in rows], width=width, label=label)  # NaN: no bar
    ax.set_xticks(list(range(len(rows))), labels, rotation=45, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms per call (slower rank's median)")
    ax.set_title(f"ring attention forward, B=1, D=128, {world} x {env['gpu']}, {env['date'][:10]}")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(_):
    rank, world = common.init_rank()
    seqs = [int(s) for s in FLAGS.sizes] or SEQS
    if any(s < 1 for s in seqs):
        raise SystemExit(f"ring_attention: sequence lengths must be positive, got {seqs}")
    group = interlace.init(heap_bytes=heap_bytes(seqs, world), timeout_s=60.0)
    common.warm_up_gpu()
    rows = []
    for s in seqs:
        for hq, hkv in HEADS:
            for causal in (False, True):
                rows.append(measure(group, s, hq, hkv, causal, rank, world))
                if rank == 0:
                    print_row(rows[-1])
    if rank == 0:
        env = common.environment(FLAGS.command)
        payload = {"op": "ring_attention", "gpu": env["gpu"], "date": env["date"], "command": env["command"],
                   "env": env, "dtype": "bfloat16",
                   "layout": "q, out [B, S/W, Hq, D], k, v [B, S/W, Hkv, D] per rank: zigzag shards; lse [B, Hq, S/W]",
                   "rows": rows}
        name = f"ring_attention_{world}x{env['gpu'].replace(' ', '_')}"
        path = common.write_results(FLAGS.out_dir, name, payload, lambda p: plot(p, rows, env, world))
        print(f"wrote {path}")
        print("median ms per call; speedup = the faster of serial / overlapped over interlace; "
              "floor = interlace / interlace_compute_only")
        print(f"{'S':>6} {'Hq':>3} {'Hkv':>3} {'causal':>6} " + " ".join(f"{SHORT[label]:>12}" for label in METHODS) +
              f" {'speedup':>7} {'floor':>6}")
        for r in rows:
            print(f"{r['s']:6} {r['h']:3} {r['h_kv']:3} {r['causal']!s:>6} " +
                  " ".join(f"{fmt(r[label].get('ms'), '12.3f'):>12}" for label in METHODS) +
                  f" {fmt(r['speedup_vs_baseline'], '7.2f'):>7} {fmt(r['ratio_to_compute_only'], '6.2f'):>6}")
        for r in rows:
            for label in METHODS:
                if "error" in r[label]:
                    print(f"S={r['s']} Hq={r['h']} Hkv={r['h_kv']} causal={r['causal']}: {label} did not run: "
                          f"{r[label]['error']}")
    dist.destroy_process_group()


if __name__ == "__main__":
    app.run(main)
