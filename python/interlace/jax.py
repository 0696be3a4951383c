"""JAX adapter. JAX arrays are immutable, so ops return new arrays instead of writing into
arguments; they wait for their inputs, run on their own stream, and finish before returning."""
import jax as _jax
import jax.dlpack as _jax_dlpack

from interlace import _interlace as _C
from interlace import _frameworks
from interlace._group import native as _native


def all_gather(x, group, *, num_blocks=0, chunk_bytes=0) -> "_jax.Array":
    """Every rank's x concatenated along axis 0 (shape [world * x.shape[0], *x.shape[1:]])."""
    x.block_until_ready()
    shape = (group.world_size * x.shape[0],) + tuple(x.shape[1:]) if x.ndim else (group.world_size,)
    out = _C._device_empty(list(shape), _frameworks.dtype_name(x.dtype), group.device)
    _C.all_gather(out, x, _native(group), stream=0, num_blocks=num_blocks, chunk_bytes=chunk_bytes)
    _C._synchronize(0)
    return _jax_dlpack.from_dlpack(out)
