"""CuPy adapter: symmetric tensors as cupy.ndarray."""
import cupy as _cupy


def empty(group, shape, dtype="float32") -> "_cupy.ndarray":
    """A symmetric CuPy array (see Group.empty)."""
    return _cupy.from_dlpack(group.empty(shape, dtype))
