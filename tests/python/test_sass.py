"""The compiled kernels' machine code: wgmma (HGMMA) in every GEMM kernel, no local memory anywhere."""
import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_check_sass():
    if not glob.glob(os.path.join(ROOT, "bazel-bin/cc/_objs/*_cuda_objects/*.pic.o")):
        pytest.skip("no CUDA objects under bazel-bin: run `bazel build //...` (tools/test does)")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools/check_sass")], capture_output=True, text=True)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gemm_kernel" in r.stdout
