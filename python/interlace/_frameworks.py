"""What interlace needs to know about the frameworks whose tensors it is given, without importing
any of them: a framework is touched only when one of its tensors arrives."""
import sys


def _module(x) -> str:
    return type(x).__module__.split(".", 1)[0]


def is_jax(x) -> bool:
    return _module(x) in ("jax", "jaxlib")


def current_stream(*tensors) -> int:
    """The CUDA stream the tensors' framework is currently issuing work to, as an integer handle:
    torch.cuda.current_stream(device), or CuPy's current stream on this thread (`with
    cupy.cuda.Stream():` sets it; CuPy's null stream is 0). 0 (the legacy default stream) when no
    torch or CuPy tensor is among them (interlace's own DLPack objects, JAX arrays). A torch tensor
    off the GPU has no stream: it is skipped, and the op's own checks then raise interlace.Error
    for it (torch.cuda.current_stream of a CPU device would raise a ValueError first)."""
    for t in tensors:
        m = _module(t)
        if m == "torch" and t.device.type == "cuda":
            torch = sys.modules["torch"]
            # The raw handle (what torch's inductor asks for) costs no Stream object per call: eager
            # calls pay this on every op. torch builds without CUDA lack it, and so need the other way.
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            if raw is not None:
                return raw(t.device.index)
            return torch.cuda.current_stream(t.device).cuda_stream
        if m == "cupy":
            cupy = sys.modules["cupy"]
            return cupy.cuda.get_current_stream().ptr
    return 0


def as_dlpack(x):
    """What to hand the native layer for x. interlace launches on the stream it is given (by default
    the tensors' framework's current one), so it asks no framework for the DLPack stream handshake,
    which would make the legacy default stream wait on the current one:
    - torch tensors become capsules through torch.utils.dlpack.to_dlpack, about a microsecond; their
      __dlpack__() would also record that wait, costing tens;
    - CuPy arrays export with __dlpack__(stream=-1), "no synchronization" in the DLPack protocol;
      plain __dlpack__() (what nanobind calls) records an event on CuPy's current stream and makes
      the legacy default stream wait for it, on every call."""
    m = _module(x)
    if m == "torch":
        return sys.modules["torch"].utils.dlpack.to_dlpack(x)
    if m == "cupy":
        try:
            return x.__dlpack__(stream=-1)
        except (TypeError, ValueError, BufferError):  # a CuPy without the "no synchronization" value
            return x.__dlpack__()
    return x


def dtype_name(dtype) -> str:
    """'bfloat16' from 'bfloat16', torch.bfloat16, numpy/cupy dtypes, np.float32 or jnp.bfloat16."""
    if isinstance(dtype, str):
        return dtype
    name = getattr(dtype, "name", None)  # numpy.dtype (also what CuPy and JAX use)
    if isinstance(name, str):
        return name
    name = getattr(dtype, "__name__", None)  # scalar types: np.float32, jnp.bfloat16
    if isinstance(name, str):
        return name
    text = str(dtype)  # torch.bfloat16
    return text.split(".", 1)[1] if text.startswith("torch.") else text


def concatenate(parts, axis: int):
    """parts joined along axis, by the framework of parts[0]: torch.cat, or the concatenate of jax.numpy,
    CuPy or NumPy (the array API name)."""
    m = _module(parts[0])
    if m == "torch":
        return sys.modules["torch"].cat(list(parts), dim=axis)
    if m in ("jax", "jaxlib"):
        return sys.modules["jax"].numpy.concatenate(list(parts), axis=axis)
    if m == "cupy":
        return sys.modules["cupy"].concatenate(list(parts), axis=axis)
    import numpy
    return numpy.concatenate(list(parts), axis=axis)
