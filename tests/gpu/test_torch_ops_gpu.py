"""interlace's torch.library ops on real GPUs: eager, torch.compile(fullgraph=True) and
mode="reduce-overhead" (CUDA graphs), one process per GPU."""
import os

import pytest

from interlace.bench.launch import expect_ranks_passed, run_ranks

WORKER = os.path.join(os.path.dirname(__file__), "torch_ops_worker.py")
pytestmark = pytest.mark.gpus(2)


@pytest.mark.parametrize("mode", ["eager", "fullgraph", "reduce_overhead", "from_process_group"])
def test_torch_ops(mode):
    import torch
    results = run_ranks([WORKER, mode], torch.cuda.device_count(), 300)
    expect_ranks_passed(results)


def _grouped_counts(step, g, c, gen):
    """Row counts for step `step`: all C first, then fewer (rows a previous run wrote must come back as
    zeros), none, past C (clamped, one at INT32_MAX) and all in one group, then random."""
    import torch
    patterns = [[c] * g, [c // (i + 2) for i in range(g)], [0] * g,
                [2**31 - 1] + [c + 1 + i for i in range(g - 1)], [0] * (g - 1) + [c]]
    if step < len(patterns):
        return patterns[step]
    return torch.randint(0, c + 1, (g,), generator=gen).tolist()


@pytest.mark.gpus(1)
@pytest.mark.parametrize("mode", ["eager", "fullgraph", "reduce_overhead"])
def test_torch_grouped_gemm(mode):
    """interlace.torch.grouped_gemm on one Hopper GPU, in this process: an expert FFN (x @ w1[g].t()
    with w1 Linear weights [G, F, K] passed as w1.transpose(1, 2), relu, then @ w2[g] with w2
    [G, F, K] row-major) with new row counts every step, eager, compiled with fullgraph=True and
    with mode="reduce-overhead" (CUDA graphs replayed with the new counts, which the kernel reads on
    the GPU). The functional op's rows at or past min(rows[g], C) must be zeros, bit for bit, in
    every step (also after a step that wrote them); the out= form must leave them as they were."""
    import torch

    import interlace.torch as itorch
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        pytest.skip(f"grouped_gemm needs a Hopper GPU (sm_90a); this one is sm_{major}{minor}")
    torch._dynamo.reset()
    g, c, k, f = 8, 300, 256, 520
    gen = torch.Generator(device="cuda").manual_seed(7)
    w1 = torch.randn(g, f, k, device="cuda", generator=gen).to(torch.bfloat16)
    w2 = (torch.randn(g, f, k, device="cuda", generator=gen) / 8).to(torch.bfloat16)

    def ffn(x, w1, w2, rows):
        return itorch.grouped_gemm(torch.relu(itorch.grouped_gemm(x, w1.transpose(1, 2), rows)), w2, rows)

    fn = {"eager": ffn, "fullgraph": torch.compile(ffn, fullgraph=True),
          "reduce_overhead": torch.compile(ffn, fullgraph=True, mode="reduce-overhead")}[mode]

    def check(out, x, counts, what, second=True, past=None):
        """out's first r_g rows of each group against an fp32 reference; the rest zeros (+0.0, bit for
        bit), or all equal to `past` where given."""
        for i, count in enumerate(counts):
            r = min(count, c)
            rest = out[i, r:].view(torch.int16) == 0 if past is None else out[i, r:] == past
            assert bool(rest.all()), f"{what}: group {i} rows past {r} are not {'zeros' if past is None else past}"
            if r:
                ref = x[i, :r].float() @ w1[i].float().t()
                if second:
                    ref = torch.relu(ref).to(torch.bfloat16).float() @ w2[i].float()
                err = ((out[i, :r].float() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, f"{what}: group {i} (r {r}) relative error {err}"

    host_gen = torch.Generator().manual_seed(7)
    for step in range(8):  # fresh inputs and row counts every step; graphs replay with them
        x = torch.randn(g, c, k, device="cuda", generator=gen).to(torch.bfloat16)
        counts = _grouped_counts(step, g, c, host_gen)
        out = fn(x, w1, w2, torch.tensor(counts, dtype=torch.int32, device="cuda"))
        torch.cuda.synchronize()
        assert out.shape == (g, c, k) and out.dtype == torch.bfloat16
        check(out.clone(), x, counts, f"{mode} grouped_gemm step {step} rows {counts}")
    # The out= form (interlace::grouped_gemm_into) leaves rows past the counts alone; cluster_m passes through.
    x = torch.randn(g, c, k, device="cuda", generator=gen).to(torch.bfloat16)
    counts = [0, 1, 77, 150, 299, c, 1000, 128]
    rows = torch.tensor(counts, dtype=torch.int32, device="cuda")
    for cluster_m in (0, 1, 2):
        buf = torch.full((g, c, f), 7.0, device="cuda", dtype=torch.bfloat16)
        assert itorch.grouped_gemm(x, w1.transpose(1, 2), rows, out=buf, cluster_m=cluster_m) is buf
        torch.cuda.synchronize()
        check(buf, x, counts, f"out= cluster_m={cluster_m}", second=False, past=7.0)
        check(itorch.grouped_gemm(x, w1.transpose(1, 2), rows, cluster_m=cluster_m), x, counts,
              f"functional cluster_m={cluster_m}", second=False)
