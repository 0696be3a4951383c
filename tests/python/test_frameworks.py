"""interlace._frameworks on the CPU, with stand-ins for CuPy arrays and streams (CuPy needs a GPU):
ops take CuPy's current stream when none is given, and CuPy arrays are exported without DLPack's
stream handshake. The real thing is tests/gpu/test_cupy_gpu.py."""
import sys
import types

import pytest

import interlace
from interlace import _frameworks
from interlace import _interlace as _C


class FakeStream:
    def __init__(self, ptr):
        self.ptr = ptr


def fake_cupy(monkeypatch):
    """A module named cupy whose current stream is set by `with stream_of(ptr):`, like CuPy's."""
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(current=FakeStream(0))
    cupy.cuda.get_current_stream = lambda: cupy.cuda.current
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return cupy


class FakeArray:
    """Looks like a cupy.ndarray to _frameworks (its type's module is cupy's); records __dlpack__ calls."""
    __module__ = "cupy._core.core"

    def __init__(self):
        self.dlpack_calls = []

    def __dlpack__(self, stream=None):
        self.dlpack_calls.append(stream)
        return ("capsule of", self)


def test_current_stream_is_cupys(monkeypatch):
    cupy = fake_cupy(monkeypatch)
    x = FakeArray()
    assert _frameworks.current_stream(x) == 0  # CuPy's null stream: the legacy default
    cupy.cuda.current = FakeStream(0x7F00DEAD)
    assert _frameworks.current_stream(x) == 0x7F00DEAD
    assert _frameworks.current_stream(object(), x) == 0x7F00DEAD  # the first framework tensor decides
    assert _frameworks.current_stream(object()) == 0


def test_torch_tensors_off_the_gpu_have_no_stream():
    torch = pytest.importorskip("torch", reason="needs torch")
    # Without this skip, torch.cuda.current_stream(cpu) raised a ValueError before the op's checks
    # could raise interlace.Error for the misplaced tensor.
    assert _frameworks.current_stream(torch.zeros(4), torch.zeros(4)) == 0


class FakeTorchTensor:
    """Looks like a torch.Tensor on cuda:3 to _frameworks."""
    __module__ = "torch"
    device = types.SimpleNamespace(type="cuda", index=3)


def test_torch_stream_is_the_raw_current_stream_of_the_tensors_gpu(monkeypatch):
    torch = types.ModuleType("torch")
    asked = []
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda index: asked.append(index) or 0xBEEF)
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert _frameworks.current_stream(object(), FakeTorchTensor()) == 0xBEEF
    assert asked == [3]
    # A torch without the raw getter: its Stream object's handle, for the same device.
    torch._C = types.SimpleNamespace()
    torch.cuda = types.SimpleNamespace(current_stream=lambda device: types.SimpleNamespace(cuda_stream=device.index + 7))
    assert _frameworks.current_stream(FakeTorchTensor()) == 10


def test_cupy_exports_without_stream_handshake(monkeypatch):
    fake_cupy(monkeypatch)
    x = FakeArray()
    assert _frameworks.as_dlpack(x) == ("capsule of", x)
    assert x.dlpack_calls == [-1]  # DLPack's "no synchronization"
    other = object()
    assert _frameworks.as_dlpack(other) is other


class OldCupyArray(FakeArray):
    """A CuPy that refuses stream=-1."""
    __module__ = "cupy._core.core"

    def __dlpack__(self, stream=None):
        self.dlpack_calls.append(stream)
        if stream == -1:
            raise ValueError("unsupported stream")
        return ("capsule of", self)


def test_cupy_without_no_sync_value_falls_back_to_the_handshake(monkeypatch):
    fake_cupy(monkeypatch)
    x = OldCupyArray()
    assert _frameworks.as_dlpack(x) == ("capsule of", x)
    assert x.dlpack_calls == [-1, None]


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce"])
def test_collectives_launch_on_cupys_stream(monkeypatch, op):
    cupy = fake_cupy(monkeypatch)
    calls = []
    monkeypatch.setattr(_C, op, lambda out, inp, group, **kw: calls.append((out, inp, kw)))
    monkeypatch.setattr(interlace, "_native", lambda group: "native")
    out, inp = FakeArray(), FakeArray()
    cupy.cuda.current = FakeStream(1234)
    getattr(interlace, op)(out, inp, "group")
    getattr(interlace, op)(out, inp, "group", stream=99)  # an explicit stream wins
    assert [c[2]["stream"] for c in calls] == [1234, 99]
    assert calls[0][:2] == (("capsule of", out), ("capsule of", inp))
    assert out.dlpack_calls == inp.dlpack_calls == [-1, -1]


def test_gemm_and_ag_gemm_launch_on_cupys_stream(monkeypatch):
    cupy = fake_cupy(monkeypatch)
    calls = []
    monkeypatch.setattr(_C, "gemm", lambda a, b, out, **kw: calls.append(kw["stream"]))
    monkeypatch.setattr(_C, "ag_gemm", lambda a, b, out, group, **kw: calls.append(kw["stream"]))
    monkeypatch.setattr(interlace, "_native", lambda group: "native")
    cupy.cuda.current = FakeStream(555)
    a, b, out = FakeArray(), FakeArray(), FakeArray()
    interlace.gemm(a, b, out)
    interlace.ag_gemm(a, b, out, "group")
    interlace.ag_gemm(a, b, out, "group", stream=7)
    assert calls == [555, 555, 7]
