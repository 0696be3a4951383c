"""One rank of a CuPy GPU test scenario (see test_cupy_gpu.py): all_gather, gemm, ag_gemm,
reduce_scatter and all_reduce on cupy arrays, against CuPy references. Exits non-zero on failure,
saying which rank, op, case and element.

  streams  every op under `with cupy.cuda.Stream(non_blocking=True):` with no stream= (interlace must
           take CuPy's current stream), then every op with stream= an explicit other stream. Only that
           stream is synchronized before the results are read, and it is kept busy before the op:
           an op issued on any other stream would race with its inputs or its reader.
  graph    the same ops captured into a CUDA graph on a CuPy stream (stream capture fails if an op
           launched anywhere else) and replayed with fresh inputs.

Every rank's inputs come from seeds, so each rank computes the references alone."""
import os
import sys

import cupy
import numpy as np

import interlace
import interlace.cupy as icupy
from interlace import _frameworks

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
K, N = 256, 384


def normal(rank, shape, dtype, seed):
    """Rank `rank`'s input for case `seed`, computable on any rank (on the current stream)."""
    rs = cupy.random.RandomState(seed * 1009 + rank)
    return rs.standard_normal(shape, dtype=cupy.float32).astype(dtype)


def rank_order_sum(parts, dtype):
    """The fp32 sum in rank order, rounded once: bit for bit what interlace computes."""
    acc = parts[0].astype(cupy.float32)
    for p in parts[1:]:
        acc = acc + p.astype(cupy.float32)
    return acc.astype(dtype)


def expect_exact(out, want, what):
    word = {2: cupy.uint16, 4: cupy.uint32}[out.dtype.itemsize]
    assert out.shape == want.shape, f"rank {RANK}: {what}: shape {out.shape}, expected {want.shape}"
    bad = cupy.flatnonzero(cupy.ascontiguousarray(out).view(word).ravel() != cupy.ascontiguousarray(want).view(word).ravel())
    if bad.size:
        i = int(bad[0])
        raise AssertionError(f"rank {RANK}: {what}: {int(bad.size)} of {want.size} elements differ, first at flat index "
                             f"{i}: got {out.ravel()[i].item()!r}, expected {want.ravel()[i].item()!r}")


def expect_close(out, want, what, tol=1e-2):
    assert out.shape == want.shape, f"rank {RANK}: {what}: shape {out.shape}, expected {want.shape}"
    out32 = out.astype(cupy.float32)
    unwritten = int(cupy.isnan(out32).sum())
    err = float(cupy.linalg.norm(out32 - want) / max(float(cupy.linalg.norm(want)), 1e-30))
    assert unwritten == 0 and err <= tol, f"rank {RANK}: {what}: relative error {err:.3g}, {unwritten} NaN (unwritten)"


def keep_busy(n=6):
    """A few milliseconds of work on the current stream, ahead of the op under test."""
    x = cupy.ones((4096, 4096), dtype=cupy.float32)
    for _ in range(n):
        x = x @ x * (1.0 / 4096)


class Cases:
    """Inputs, outputs (poisoned) and references for every op, made on the current stream; run(**kw)
    issues every op with kw (stream= or nothing); check() compares after the caller synchronized."""

    def __init__(self, group, seed, symmetric=True):
        """symmetric=False: no symmetric outputs (for inputs and references only, without heap allocations)."""
        self.group, self.seed = group, seed
        f16 = cupy.float16
        rows = 96
        self.x = normal(RANK, (rows, 64), f16, seed)
        self.gathered_ref = cupy.concatenate([normal(q, (rows, 64), f16, seed) for q in range(WORLD)])
        self.gathered = cupy.full((WORLD * rows, 64), cupy.nan, f16)
        if symmetric:
            self.gathered_sym = icupy.empty(group, (WORLD * rows, 64), "float16")
            self.gathered_sym.fill(cupy.nan)
        # gemm: b row-major [K, N], and b = w.T for a Linear weight w [N, K] (column-major).
        self.a = normal(RANK, (200, K), f16, seed + 1)
        self.b = normal(99, (K, N), f16, seed + 2)
        self.w = normal(98, (N, K), f16, seed + 3)
        self.gemm_out = cupy.full((200, N), cupy.nan, f16)
        self.gemm_t_out = cupy.full((200, N), cupy.nan, f16)
        # ag_gemm: uneven shards.
        self.rows = [64 + 16 * q for q in range(WORLD)]
        shards = [normal(q, (self.rows[q], K), f16, seed + 4) for q in range(WORLD)]
        self.shard = shards[RANK]
        self.ag_ref = cupy.concatenate(shards).astype(cupy.float32) @ self.w.T.astype(cupy.float32)
        self.ag_out = cupy.full((sum(self.rows), N), cupy.nan, f16)
        # reduce_scatter and all_reduce: float32 and float16, one-shot and two-shot sizes.
        self.reductions = []
        for i, (shape, dtype) in enumerate((((WORLD * 40, 36), cupy.float32), ((WORLD * 512, 640), f16),
                                            ((1000, 3), f16), ((WORLD * 1024, 512), cupy.float32))):
            parts = [normal(q, shape, dtype, seed + 10 + i) for q in range(WORLD)]
            total = rank_order_sum(parts, dtype)
            block = shape[0] // WORLD
            # reduce_scatter needs world equal blocks whose bytes are a multiple of 16.
            scatters = shape[0] % WORLD == 0 and block * int(np.prod(shape[1:])) * np.dtype(dtype).itemsize % 16 == 0
            scatter_ref = total[RANK * block:(RANK + 1) * block] if scatters else None
            self.reductions.append({
                "inp": parts[RANK], "total": total, "scatter_ref": scatter_ref,
                "scatter": None if scatter_ref is None else cupy.full(scatter_ref.shape, cupy.nan, dtype),
                "reduced": cupy.full(shape, cupy.nan, dtype), "in_place": parts[RANK].copy(),
                "what": f"{shape} {np.dtype(dtype).name}"})
        self.sym_inp = self.reductions[1]["inp"]
        if symmetric:
            self.reduced_sym = icupy.empty(self.group, self.sym_inp.shape, "float16")
            self.reduced_sym.fill(cupy.nan)

    def run(self, **kw):
        g = self.group
        interlace.all_gather(self.gathered, self.x, g, **kw)
        interlace.all_gather(self.gathered_sym, self.x, g, **kw)
        interlace.gemm(self.a, self.b, self.gemm_out, **kw)
        interlace.gemm(self.a, self.w.T, self.gemm_t_out, **kw)
        interlace.ag_gemm(self.shard, self.w.T, self.ag_out, g, shard_rows=self.rows, **kw)
        for r in self.reductions:
            if r["scatter"] is not None:
                interlace.reduce_scatter(r["scatter"], r["inp"], g, **kw)
            interlace.all_reduce(r["reduced"], r["inp"], g, **kw)
            interlace.all_reduce(r["in_place"], r["in_place"], g, **kw)
        interlace.all_reduce(self.reduced_sym, self.sym_inp, g, **kw)

    def check(self, how):
        expect_exact(self.gathered, self.gathered_ref, f"all_gather {how}")
        expect_exact(self.gathered_sym, self.gathered_ref, f"all_gather into a symmetric out {how}")
        a32 = self.a.astype(cupy.float32)
        expect_close(self.gemm_out, a32 @ self.b.astype(cupy.float32), f"gemm (b row-major) {how}")
        expect_close(self.gemm_t_out, a32 @ self.w.T.astype(cupy.float32), f"gemm (b = w.T) {how}")
        expect_close(self.ag_out, self.ag_ref, f"ag_gemm (shard_rows {self.rows}) {how}")
        for r in self.reductions:
            if r["scatter"] is not None:
                expect_exact(r["scatter"], r["scatter_ref"], f"reduce_scatter {r['what']} {how}")
            expect_exact(r["reduced"], r["total"], f"all_reduce {r['what']} {how}")
            expect_exact(r["in_place"], r["total"], f"all_reduce in place {r['what']} {how}")
        expect_exact(self.reduced_sym, self.reductions[1]["total"], f"all_reduce into a symmetric out {how}")


def start():
    group = interlace.init(heap_bytes=256 << 20)
    cupy.cuda.Device(group.device).use()
    print(f"rank {RANK}: cupy {cupy.__version__} on GPU {group.device}", flush=True)
    return group


def scenario_streams():
    group = start()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        cases = Cases(group, seed=1)
        x = cases.x
        assert _frameworks.current_stream(x) == stream.ptr != 0, (_frameworks.current_stream(x), stream.ptr)
        keep_busy()
        cases.run()  # no stream=: CuPy's current stream
        stream.synchronize()
        group.check()
        cases.check("under `with cupy.cuda.Stream()`")
    print(f"rank {RANK}: ops on CuPy's current stream correct", flush=True)

    # stream= names another stream; CuPy's current one is the null stream here.
    other = cupy.cuda.Stream(non_blocking=True)
    cases = Cases(group, seed=2)
    cupy.cuda.get_current_stream().synchronize()  # inputs made on the null stream
    with other:
        keep_busy()
    cases.run(stream=other.ptr)
    other.synchronize()
    group.check()
    with other:
        cases.check("with stream= an explicit stream")
    print(f"rank {RANK}: ops with an explicit stream= correct", flush=True)


def scenario_graph():
    group = start()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        cases = Cases(group, seed=3)
        cases.run()  # the first calls outside capture: cross-rank checks, scratch
        stream.synchronize()
        group.check()
        cases.check("eager before capture")
        stream.begin_capture()
        cases.run()
        graph = stream.end_capture()
        for step in range(4):  # fresh inputs into the same buffers, outputs poisoned, then replay
            fresh = Cases(group, seed=100 + step, symmetric=False)
            for name in ("x", "a", "b", "w", "shard"):
                getattr(cases, name)[...] = getattr(fresh, name)
            for mine, new in zip(cases.reductions, fresh.reductions):
                mine["inp"][...] = new["inp"]
                mine["in_place"][...] = new["inp"]
                for key in ("scatter", "reduced"):
                    if mine[key] is not None:
                        mine[key].fill(cupy.nan)
            for out in (cases.gathered, cases.gathered_sym, cases.gemm_out, cases.gemm_t_out, cases.ag_out,
                        cases.reduced_sym):
                out.fill(cupy.nan)
            cases.gathered_ref, cases.ag_ref = fresh.gathered_ref, fresh.ag_ref
            for mine, new in zip(cases.reductions, fresh.reductions):
                mine["total"], mine["scatter_ref"] = new["total"], new["scatter_ref"]
            del fresh
            graph.launch(stream=stream)
            stream.synchronize()
            group.check()
            cases.check(f"in a CuPy CUDA graph, replay {step}")
    print(f"rank {RANK}: ops captured into a CuPy CUDA graph replay correctly", flush=True)


SCENARIOS = {"streams": scenario_streams, "graph": scenario_graph}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
