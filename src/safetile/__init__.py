"""safetile: GPU tile kernels that cannot race on their outputs.

    import safetile as st
    import safetile.lang as sl

    @st.kernel
    def add(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32]):
        z.store(sl.load_like(x, z) + sl.load_like(y, z))

    x, y, z = add(x, y, st.empty((n,)).partition((1024,))).sync()
"""
from . import errors  # noqa: F401
from .backends import backend, set_backend  # noqa: F401
from .device import DeviceOp, Graph, graph_scope, submit, zip  # noqa: F401,A004
from .dtypes import DType, bfloat16, bool_, float16, float32, int8, int32, int64  # noqa: F401
from .dtypes import bf16, f16, f32, i32, i64  # noqa: F401
from .errors import (AliasError, ArgumentError, BorrowError, ExecutionError,  # noqa: F401
                     GraphCaptureError, KernelDefinitionError, LaunchError, MovedError,
                     OutOfBoundsError, PartitionError, RaceError, SafetileError, UnsafeError)
from .kernel.kernel import Kernel, function, kernel, unsafe  # noqa: F401
from .kernel.params import Const, In, Out, Ptr  # noqa: F401
from .tensor import (Partition, Shared, Tensor, arange, empty, from_dlpack,  # noqa: F401
                     from_numpy, from_torch, full, ones, randn, zeros)

dtype = DType          # for st.Const[st.dtype]
floats = float32 | float16 | bfloat16

__version__ = "0.1.0"
