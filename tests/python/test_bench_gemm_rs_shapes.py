"""The gemm_rs / gemm_ar benchmark's rows (python -m interlace.bench gemm_rs runs on GPUs): gemm_ar
adds the issue's decode rows, timed under graph replay; gemm_rs does not. Each check runs in its own
process, since the benchmarks all define the same absl flags."""
import ast
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="the benchmarks use torch")
pytest.importorskip("absl", reason="the benchmarks use absl")


def shapes(kind, *flags):
    code = (f"from interlace.bench import gemm_rs as b; b.FLAGS(['bench', *{list(flags)!r}]); "
            f"b.KIND = {kind!r}; print(b.shapes_from_flags())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return ast.literal_eval(out.strip().splitlines()[-1])


def test_gemm_ar_adds_decode_rows_and_gemm_rs_does_not():
    ar = shapes("ar")
    decode = [s for s in ar if s[3] == "decode"]
    assert [m for m, *_ in decode] == [1, 16, 64, 128, 256]
    assert all((k, n) == (8192, 8192) for _, k, n, _ in decode)
    assert ar[:3] == [(8192, 8192, 8192, "headline"), (4096, 8192, 8192, "headline"), (2048, 8192, 8192, "headline")]
    rs = shapes("rs")
    assert rs[:2] == [(8192, 14336, 8192, "headline"), (4096, 8192, 8192, "headline")]
    assert not [s for s in rs if s[3] == "decode"] and [m for m, *_ in rs[2:]] == [1024 << i for i in range(6)]


def test_sizes_are_single_rows_or_m_on_the_sweep():
    assert shapes("rs", "--sizes=4096x8192x1024,512") == [(4096, 8192, 1024, "K=8192, N=1024"),
                                                          (512, 8192, 8192, "K=8192, N=8192")]
