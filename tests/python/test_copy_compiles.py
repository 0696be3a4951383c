"""The GPU copy harness (tests/gpu/copy_harness.cu) compiles for sm_90a, so a broken
device/copy.cuh shows up here rather than first on the GPU machine; and the copy fits
all_gather's register budget (the harness kernels share its launch bounds) without local memory."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_copy_harness_compiles_without_local_memory(tmp_path):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        pytest.skip("no nvcc on this machine")
    r = subprocess.run([nvcc, "-arch=sm_90a", "-std=c++17", "-O2", "-I", os.path.join(ROOT, "cc"),
                        "-Xptxas=--warn-on-spills,--warn-on-local-memory-usage", "-c",
                        os.path.join(ROOT, "tests/gpu/copy_harness.cu"), "-o", str(tmp_path / "copy_harness.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr
