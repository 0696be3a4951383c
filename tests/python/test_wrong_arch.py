"""A GEMM kernel built for a GPU without sm_90a's features (here plain sm_90) must trap rather than
run an empty body and leave an output it never wrote. Compiles one instantiation of the engine for
sm_90 and reads its SASS: a trap, and no wgmma."""
import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SOURCE = r"""
#include "interlace/gemm/sm90_gemm_tma_warpspecialized.cuh"
#include "interlace/gemm/tile_plan.h"
using Config = interlace::gemm_engine::Sm90GemmConfig<cutlass::bfloat16_t, true, 128, 1, true>;
template __global__ void interlace::gemm_engine::sm90_gemm_kernel<Config, interlace::BandedOrder,
    interlace::gemm_engine::NoInputWait, interlace::gemm_engine::StoreTile<cutlass::bfloat16_t>>(
    const __grid_constant__ interlace::gemm_engine::GemmParams<Config, interlace::BandedOrder, interlace::gemm_engine::NoInputWait,
                                             interlace::gemm_engine::StoreTile<cutlass::bfloat16_t>>);
"""


def cutlass_include():
    try:
        import cutlass_library
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
    return path if os.path.isdir(path) else None


def test_gemm_built_without_sm90a_features_traps(tmp_path):
    cuda = os.environ.get("INTERLACE_CUDA_PATH", "/usr/local/cuda-13.0")  # as tools/setup finds it
    nvcc = os.path.join(cuda, "bin", "nvcc")
    # cuobjdump comes with the toolkit or, on our machines, from a pip package in .venv (as in tools/check_sass)
    found = glob.glob(os.path.join(ROOT, ".venv/lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump"))
    candidates = found + [shutil.which("cuobjdump") or "", os.path.join(cuda, "bin", "cuobjdump")]
    cuobjdump = next((c for c in candidates if c and os.path.exists(c)), "")
    include = cutlass_include()
    if not (os.path.exists(nvcc) and cuobjdump) or include is None:
        pytest.skip(f"needs nvcc and cuobjdump under {cuda} and the nvidia-cutlass package's headers")
    src = tmp_path / "wrong_arch.cu"
    src.write_text(SOURCE)
    cubin = tmp_path / "wrong_arch.cubin"
    r = subprocess.run([nvcc, "-arch=sm_90", "-cubin", "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-DNDEBUG",
                        "-I", os.path.join(ROOT, "cc"), "-I", include, str(src), "-o", str(cubin)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert "sm90_gemm_kernel" in sass
    assert "TRAP" in sass, "the kernel body for a GPU without sm_90a features must trap"
    assert "HGMMA" not in sass
