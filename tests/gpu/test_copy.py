"""device::block_copy on a GPU, byte for byte, at every (dst % 16, src % 16) and a spread of sizes.
The extension does not expose it, so copy_harness.cu is compiled here with nvcc against cc/."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def nvcc():
    found = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(found):
        pytest.skip("no nvcc on this machine: the copy harness is compiled at test time")
    return found


def test_block_copy_every_alignment(tmp_path):
    exe = str(tmp_path / "copy_harness")
    subprocess.run([nvcc(), "-arch=sm_90a", "-std=c++17", "-O2", "-I", os.path.join(ROOT, "cc"),
                    os.path.join(HERE, "copy_harness.cu"), "-o", exe], check=True)
    r = subprocess.run([exe], capture_output=True, text=True, timeout=600)
    print(r.stdout)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr
