"""The C++ example (examples/all_gather_gemm.cc) links and runs; on a machine without a GPU it must
stop with interlace's clear error, not crash. (On the GPU machine tests/gpu/test_cpp_example_gpu.py runs
it on every GPU.)"""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "bazel-bin", "examples", "all_gather_gemm")


def test_example_reports_a_missing_gpu_clearly():
    if not os.path.exists(BINARY):
        pytest.skip("bazel build //examples:all_gather_gemm first (tools/test does)")
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([BINARY], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "no CUDA GPU is present" in r.stderr, r.stderr
