"""interlace.Group: a plain Python object around the native group (interlace._interlace.Group).

Its attributes are ordinary instance attributes, copied from the native group once (they never
change), and its methods forward explicitly: torch.compile reads group.world_size and group.handle
as it reads any int attribute of a Python object (a constant, guarded on) and never has to trace
into nanobind. The native group goes to the _C functions (native(group)); the torch adapter's
custom ops take group.handle, an integer, and find the group again with by_handle.
"""
import itertools
import weakref

from interlace import _frameworks
from interlace._interlace import Error

_next_handle = itertools.count(1)
# Live groups by handle. Weak: a group nobody holds any more is freed, with its heap and threads.
_groups = weakref.WeakValueDictionary()


class Group:
    """The job's processes, one per GPU, and their symmetric heap. Create with interlace.init() or
    interlace.torch.init().

    Attributes (fixed for the group's life): rank, world_size; local_rank and local_size (this
    rank's index among the ranks of its node, and how many they are); node (this node's index)
    and num_nodes; device (the CUDA device ordinal); heap_bytes (usable bytes of this rank's
    symmetric heap); node_names (every rank's node name, by rank); cross_node (the backend that
    reaches other nodes: "loopback", "ibverbs" or "efa"; "" with one node); handle (a small integer naming this group within the process, which the
    torch.library ops take in its place).
    """

    def __init__(self, native):
        """Wraps `native`, an interlace._interlace.Group (what interlace.init makes)."""
        self._native = native
        self.rank = native.rank
        self.world_size = native.world_size
        self.local_rank = native.local_rank
        self.local_size = native.local_size
        self.node = native.node
        self.num_nodes = native.num_nodes
        self.device = native.device
        self.heap_bytes = native.heap_bytes
        self.node_names = list(native.node_names)
        self.cross_node = native.cross_node
        self.handle = next(_next_handle)
        _groups[self.handle] = self

    def __repr__(self):
        return (f"interlace.Group(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
                f"handle={self.handle})")

    def check(self):
        """Raises interlace.Error if the group is aborted (a dead rank, a device wait that timed out,
        ranks that called different ops, group.abort()), naming the rank, the op and the flag; or,
        once, if a kernel skipped an op call because another rank's call of it failed its checks.
        Call after synchronizing."""
        self._native.check()

    def abort(self, why=""):
        """Aborts the group on every rank (like ncclCommAbort): running and queued kernels stop
        without touching peers, and every later call raises. It cannot be undone."""
        self._native.abort(why)

    def barrier(self):
        """Host barrier over all ranks (no GPU work)."""
        self._native.barrier()

    def empty(self, shape, dtype):
        """A symmetric tensor: same offset in every rank's heap. Wrap it with torch.from_dlpack,
        cupy.from_dlpack or jax.dlpack.from_dlpack (zero-copy). Collective: all ranks allocate alike."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return self._native._empty(list(shape), _frameworks.dtype_name(dtype))

    def peer(self, tensor, rank):
        """A view of `tensor` (symmetric) as it lies in the heap of `rank`, which must share this node."""
        return self._native._peer(tensor, rank)


def native(group):
    """The native group inside `group`, for the _C functions."""
    if not isinstance(group, Group):
        raise TypeError(f"expected an interlace.Group (from interlace.init), got {type(group).__name__}")
    return group._native


def by_handle(handle: int) -> Group:
    """The live Group whose handle is `handle`."""
    group = _groups.get(handle)
    if group is None:
        raise Error(f"no live interlace.Group has handle {handle}")
    return group
