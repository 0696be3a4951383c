"""Attention forward on one GPU: interlace.attention against torch's SDPA on cuDNN and on
FlashAttention-2, in the same run. Started by `python -m interlace.bench attention`.

Each timed shape is first checked: every head against cuDNN's output, and two heads against an fp32
reference (out and lse). Shapes are B = 1, S = S_q = S_k, Hq query heads and Hkv KV heads, D = 128
(ring attention's S_local); GQA baselines that do not take fewer KV heads get K and V expanded
outside the timed region. TFLOP/s count 4 S^2 Hq D, halved under the causal mask."""
import math
import os

import torch
import torch.nn.functional as F
from absl import app, flags

import interlace
from interlace.bench import common

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "bench/results", "")
flags.DEFINE_integer("warmup", 5, "")
flags.DEFINE_integer("iters", 30, "")
flags.DEFINE_string("command", "", "")
flags.DEFINE_list("sizes", [], "sequence lengths (default 8192, 16384)")
flags.DEFINE_list("tunings", [], "unused by attention")

HEADS = [(32, 32, 128), (32, 8, 128), (32, 32, 64)]  # (Hq, Hkv, D): MHA, GQA 4, D = 64


def backend(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(getattr(SDPBackend, name))


def sdpa(q, k, v, causal, name):
    """torch SDPA on one backend over [B, S, H, D] tensors (transposed views, as ring attention keeps
    them); K and V expanded to Hq heads beforehand where the backend needs it."""
    group = q.shape[2] // k.shape[2]
    if group > 1:
        k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def call():
        with backend(name):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return call


def fp32_heads(q, k, v, causal, heads):
    """fp32 (out, lse) of the given query heads: [S, len(heads), D] and [len(heads), S]."""
    group = q.shape[2] // k.shape[2]
    outs, lses = [], []
    for h in heads:
        qf, kf, vf = q[0, :, h].float(), k[0, :, h // group].float(), v[0, :, h // group].float()
        s = (qf @ kf.t()) / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
        lses.append(torch.logsumexp(s, dim=-1))
        outs.append(torch.softmax(s, dim=-1) @ vf)
    return torch.stack(outs, dim=1), torch.stack(lses)


def main(_):
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    common.warm_up_gpu()
    seqs = [int(s) for s in FLAGS.sizes] or [8192, 16384]
    rows = []
    for s in seqs:
        for hq, hkv, d in HEADS:
            for causal in (False, True):
                g = torch.Generator(device="cuda").manual_seed(s + hq + hkv + d + causal)
                q = torch.randn(1, s, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
                k = torch.randn(1, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
                v = torch.randn(1, s, hkv, d, device="cuda", dtype=torch.bfloat16, generator=g)
                out = torch.full_like(q, float("nan"))
                lse = torch.full((1, hq, s), float("nan"), device="cuda")
                interlace.attention(q, k, v, out, causal=causal, lse=lse)
                ref_out, ref_lse = fp32_heads(q, k, v, causal, [0, hq - 1])
                err = common.relative_error(out[0, :, [0, hq - 1]], ref_out)
                lse_err = (lse[0, [0, hq - 1]] - ref_lse).abs().max().item()
                methods = {"interlace": lambda: interlace.attention(q, k, v, out, causal=causal, lse=lse)}
                row = {"s": s, "h": hq, "h_kv": hkv, "d": d, "causal": causal, "rel_err_fp32": err,
                       "lse_abs_err": lse_err}
                for label, name in (("cudnn", "CUDNN_ATTENTION"), ("flash2", "FLASH_ATTENTION")):
                    try:
                        fn = sdpa(q, k, v, causal, name)
                        base = fn().transpose(1, 2)
                    except RuntimeError as e:  # a backend that does not take this shape
                        row[label] = {"error": str(e)[:300]}
                        continue
                    row[label] = {"rel_err_vs_interlace": common.relative_error(out, base)}
                    methods[label] = fn
                if err > 1e-2 or lse_err > 2e-3 or out.isnan().any():
                    raise SystemExit(f"attention wrong at S={s} Hq={hq} Hkv={hkv} D={d} causal={causal}: "
                                     f"rel err {err:.2e}, lse err {lse_err:.2e}")
                flop = 4.0 * s * s * hq * d / (2 if causal else 1)
                for label, ms in common.time_interleaved(methods, FLAGS.warmup, FLAGS.iters).items():
                    row.setdefault(label, {}).update({"ms": ms, "tflops": flop / ms / 1e9})
                if "ms" in row.get("cudnn", {}):
                    row["ratio_vs_cudnn"] = row["interlace"]["tflops"] / row["cudnn"]["tflops"]
                rows.append(row)
                base = {k: row[k]["tflops"] for k in ("cudnn", "flash2") if "tflops" in row.get(k, {})}
                print(f"S={s:6} Hq={hq:3} Hkv={hkv:3} D={d:3} causal={causal!s:5}  interlace "
                      f"{row['interlace']['tflops']:6.1f}  " + "  ".join(f"{k} {v:6.1f}" for k, v in base.items()) +
                      f"  ratio {row.get('ratio_vs_cudnn', float('nan')):.3f}  err {err:.1e}", flush=True)
                del q, k, v, out, lse
    report(rows)


def report(rows):
    env = common.environment(FLAGS.command, distributed=False)
    name = f"attention_{env['gpu'].replace(' ', '_')}"

    def plot(path):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        labels = [f"S={r['s']} {r['h']}/{r['h_kv']} D{r['d']}{' causal' if r['causal'] else ''}" for r in rows]
        x = range(len(rows))
        fig, ax = plt.subplots(figsize=(11, 4.5))
        for offset, key, label in ((-0.27, "interlace", "interlace"), (0, "cudnn", "cuDNN SDPA"),
                                   (0.27, "flash2", "FlashAttention-2 SDPA")):
            ax.bar([i + offset for i in x], [r.get(key, {}).get("tflops", 0) for r in rows], width=0.27, label=label)
        ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s (bf16)")
        ax.set_title(f"attention forward, B=1, {env['gpu']}, {env['date'][:10]}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    payload = {"op": "attention", "env": env, "rows": rows}
    print("wrote", common.write_results(FLAGS.out_dir, name, payload, plot))


if __name__ == "__main__":
    app.run(main)
