"""GPU tests need CUDA GPUs and torch (for references). A test marked @pytest.mark.gpus(n) needs n of
them; unmarked ones need one. Where they are missing, tests skip and say why."""
import pytest

_config = None  # the session's, for pytest_runtest_logreport


def pytest_configure(config):
    global _config
    _config = config
    config.addinivalue_line("markers", "gpus(n): the test needs n CUDA GPUs")


def _gpu_count():
    try:
        import torch
    except ImportError:
        return 0, "torch is not installed (GPU tests use it for references)"
    return torch.cuda.device_count(), None


def pytest_collection_modifyitems(config, items):
    have, why = _gpu_count()
    for item in items:
        if "/tests/gpu/" not in str(item.fspath):  # this hook sees the whole session's tests
            continue
        marker = item.get_closest_marker("gpus")
        need = marker.args[0] if marker else 1
        if have < need:
            item.add_marker(pytest.mark.skip(reason=why or f"needs {need} CUDA GPU(s), this machine has {have}"))


@pytest.fixture(params=[1, 2], ids=["node_per_gpu", "2_gpus_per_node"])
def gpus_per_node(request):
    """For the tests across emulated nodes: ranks per node. 1 sends every byte through the proxy; 2
    (on 4 GPUs or more, as 2 nodes or more) mixes NVLink inside a node with the proxy between nodes,
    and relays through a node's ranks."""
    have, why = _gpu_count()
    if request.param > 1 and have < 2 * request.param:
        pytest.skip(why or f"{request.param} GPUs per node on 2 nodes needs {2 * request.param} CUDA GPUs, "
                    f"this machine has {have}")
    return request.param


def pytest_runtest_logreport(report):
    """A failure's details are printed as it happens, not only in the session's summary: a GPU run cut
    short by its time limit still shows why a test failed."""
    terminal = _config.pluginmanager.get_plugin("terminalreporter") if _config else None
    if report.failed and terminal is not None:
        terminal.write_line(f"\n----- {report.nodeid} failed ({report.when}):\n{report.longreprtext}")
