"""The extension imports and reports the missing GPU clearly on a machine without one."""
import subprocess
import sys

import pytest

import interlace


def test_import_pulls_in_no_framework():
    code = "import sys, interlace; print(sorted(m for m in ('torch', 'jax', 'cupy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_version_and_error_type():
    assert interlace.__version__ == "0.1.0"
    assert issubclass(interlace.Error, RuntimeError)


@pytest.mark.skipif(interlace.gpu_count() > 0, reason="this machine has a GPU; the no-GPU message cannot show")
def test_init_without_gpu_says_so():
    with pytest.raises(interlace.Error, match="no CUDA GPU is present"):
        interlace.init(rank=0, world_size=1)
