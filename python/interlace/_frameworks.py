"""What interlace needs to know about the frameworks whose tensors it is given, without importing
any of them: a framework is touched only when one of its tensors arrives."""
import sys


def _module(x) -> str:
    return type(x).__module__.split(".", 1)[0]


def is_jax(x) -> bool:
    return _module(x) in ("jax", "jaxlib")


def current_stream(*tensors) -> int:
    """The CUDA stream the tensors' framework is currently issuing work to, as an integer handle.
    0 (the legacy default stream) when no framework tensor is among them."""
    for t in tensors:
        m = _module(t)
        if m == "torch":
            torch = sys.modules["torch"]
            return torch.cuda.current_stream(t.device).cuda_stream
        if m == "cupy":
            cupy = sys.modules["cupy"]
            return cupy.cuda.get_current_stream().ptr
    return 0


def as_dlpack(x):
    """What to hand the native layer for x. torch tensors become DLPack capsules through
    torch.utils.dlpack.to_dlpack, which costs about a microsecond; their __dlpack__() would also make
    the legacy default stream wait on the current one, costing tens. interlace launches on the
    tensors' current stream, so it needs no such wait."""
    if _module(x) == "torch":
        return sys.modules["torch"].utils.dlpack.to_dlpack(x)
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
