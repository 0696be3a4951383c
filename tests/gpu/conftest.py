"""GPU tests need CUDA GPUs (two or more for the collectives) and torch for references. Where they
are missing, every test here is skipped and says why."""
import pytest


def _gpu_count():
    try:
        import torch
    except ImportError:
        return 0, "torch is not installed (GPU tests use it for references)"
    n = torch.cuda.device_count()
    return n, f"needs 2 or more CUDA GPUs, this machine has {n}"


def pytest_collection_modifyitems(config, items):
    n, reason = _gpu_count()
    if n >= 2:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(skip)
