"""safetile: GPU tile kernels that cannot race on their outputs.

    import safetile as st
    import safetile.lang as sl

    @st.kernel
    def add(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32]):
        z.store(sl.load_like(x, z) + sl.load_like(y, z))

    x, y = st.randn((4096,)), st.randn((4096,))
    x, y, z = add(x, y, st.empty((4096,)).partition((1024,))).sync()
    result = z.unpartition().to_torch()

Where to look next:
- ``help(st.kernel)``: the parameter grammar (``st.In``, ``st.Out``, ``st.Const``, scalars,
  ``st.Ptr``) and the return convention; ``help(st.In)``, ``help(st.Out)``: what a parameter
  can do in the body; ``help(safetile.lang)``: the tile operations.
- Host values: ``st.Tensor`` (``st.zeros``, ``st.randn``, ``st.from_torch`` ...), its
  ``.partition(tile_shape)`` (an ``st.Partition``, for an Out) and ``.share()`` (an
  ``st.Shared``).
- ``st.DeviceOp``: what a launch returns (``sync``, ``await``, ``then``, ``graph``).
- ``st.set_backend`` / ``st.backend``: the GPU (``"triton"``) or the checking CPU executor
  (``"interpret"``); ``safetile.ops``: the kernel library; ``safetile.errors``: every error.
- The user guide: ``docs/guide.md``.
"""
import typing as _typing

from . import errors  # noqa: F401
from .backends import backend, set_backend  # noqa: F401
from .device import DeviceOp, Graph, graph_scope, recovered, submit, zip  # noqa: F401,A004
from .device import CollectiveOp, all_gather, all_reduce  # noqa: F401
from .dtypes import DType, bfloat16, bool_, float16, float32, int8, int32, int64  # noqa: F401
from .dtypes import bf16, f16, f32, i32, i64  # noqa: F401
from .errors import (AliasError, ArgumentError, BorrowError, ExecutionError,  # noqa: F401
                     CollectiveError, CopyError, DivisionByZeroError, FrozenError,
                     GraphCaptureError, HeldInFlightError, IndexOutOfRangeError,
                     KernelDefinitionError, NotRunError,
                     LaunchError, MovedError, OutOfBoundsError, PartitionError, RaceError,
                     SafetileError, UnsafeError)
from .errors import BlockingSyncWarning, UnrunOpWarning  # noqa: F401
from .device.unsafe_block import unsafe  # noqa: F401
from .kernel.kernel import Kernel, function, kernel  # noqa: F401
from .kernel.params import Const, In, Out, Ptr  # noqa: F401
from .tensor import (Partition, Shared, Tensor, arange, empty, from_dlpack,  # noqa: F401
                     from_numpy, from_torch, full, ones, randn, zeros)

dtype = DType          # for st.Const[st.dtype]
floats = float32 | float16 | bfloat16

__version__ = "0.1.0"


# ``st.ops`` without ``import safetile.ops``: the kernel library loads on first use, so
# ``import safetile`` does not pay for checking every library kernel's definition. Type
# checkers see the module itself, never a module ``__getattr__`` (which would make every
# misspelt ``st.name`` pass unreported).
if _typing.TYPE_CHECKING:
    from . import ops  # noqa: F401
else:
    def __getattr__(name: str):
        if name == "ops":
            import importlib
            return importlib.import_module(".ops", __name__)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    # kernels
    "kernel", "function", "unsafe", "Kernel", "In", "Out", "Const", "Ptr",
    # host values
    "Tensor", "Partition", "Shared", "zeros", "ones", "full", "empty", "arange", "randn",
    "from_torch", "from_numpy", "from_dlpack",
    # device operations
    "DeviceOp", "Graph", "graph_scope", "submit", "recovered", "zip",
    # collectives (torch.distributed)
    "all_reduce", "all_gather", "CollectiveOp",
    # backends
    "backend", "set_backend",
    # dtypes
    "DType", "dtype", "float32", "float16", "bfloat16", "int32", "int64", "int8", "bool_",
    "f32", "f16", "bf16", "i32", "i64", "floats",
    # errors and warnings
    "errors", "SafetileError", "KernelDefinitionError", "LaunchError", "ArgumentError",
    "MovedError", "BorrowError", "AliasError", "UnsafeError", "RaceError", "OutOfBoundsError", "CollectiveError",
    "GraphCaptureError", "ExecutionError", "PartitionError", "IndexOutOfRangeError",
    "CopyError", "DivisionByZeroError", "FrozenError", "HeldInFlightError", "NotRunError",
    "UnrunOpWarning",
    "BlockingSyncWarning",
]
