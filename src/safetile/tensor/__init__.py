"""Host values of safetile: owned ``Tensor``, tiled ``Partition``, read-only ``Shared``.

Ownership states live in :mod:`.ownership`, storage borrows of in-flight operations and the
overlap test in :mod:`.borrows`, allocation / interop and the graph-capture allocation
guard in :mod:`.alloc`.
"""
from .ownership import LOCK, Handle
from .tensor import Tensor
from .partition import Partition, ProgramOrder
from .shared import Shared
from .borrows import Hold, acquire, check_host_read, check_host_write, overlaps, active_holds
from .alloc import (allocation_forbidden, arange, default_device, empty, forbid_allocation,
                    from_dlpack, from_numpy, from_torch, full, ones, randn, zeros)

__all__ = [
    "LOCK", "Handle", "Tensor", "Partition", "ProgramOrder", "Shared",
    "Hold", "acquire", "check_host_read", "check_host_write", "overlaps", "active_holds",
    "default_device", "zeros", "ones", "full", "empty", "arange", "randn",
    "from_torch", "from_numpy", "from_dlpack", "forbid_allocation", "allocation_forbidden",
]
