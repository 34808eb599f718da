"""Capping how many programs of one kernel an SM runs at once: ``max_programs_per_sm``.

The cap is made with shared memory, the one per-launch resource a launch can ask more of than
its code needs: each program asks for ``sm_shared // cap - reserved`` bytes, so ``cap``
programs fit on an SM and ``cap + 1`` do not (registers or the kernel's own shared memory
may allow fewer). Why cap at all: a bandwidth-bound kernel chained under programmatic
dependent launch can run faster with fewer programs resident (the next kernel's programs,
waiting on this one, hold fewer slots; fewer concurrent streams reach DRAM); see
benchmarks/results/decode_gemv_notes.md. The cap never changes what a kernel computes.
"""
from __future__ import annotations

import ctypes
import functools

# CUfunction_attribute values (cuda.h)
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_PREFERRED_SHARED_MEMORY_CARVEOUT = 9
# CUdevice_attribute values (cuda.h)
_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81
_RESERVED_SHARED_MEMORY_PER_BLOCK = 111


def padded_shared(shared: int, cap: int, sm_shared: int, reserved: int) -> int:
    """The dynamic shared memory per program that lets at most ``cap`` programs fit in an SM
    of ``sm_shared`` bytes (``reserved`` more bytes per program are the system's), or
    ``shared`` (what the kernel needs) if that already allows no more than ``cap``."""
    if cap < 1:
        raise ValueError(f"max_programs_per_sm must be at least 1, got {cap}")
    return max(shared, sm_shared // cap - reserved)


@functools.lru_cache(maxsize=None)
def _driver():
    return ctypes.CDLL("libcuda.so.1")


def _check(result: int, what: str) -> None:
    if result != 0:
        from ..errors import ExecutionError
        raise ExecutionError(f"max_programs_per_sm: {what} failed with CUDA driver error "
                             f"{result}")


@functools.lru_cache(maxsize=None)
def _sm_shared(device: int) -> tuple[int, int]:
    """(shared memory per SM, shared memory reserved per program) of CUDA device ``device``."""
    cuda = _driver()
    dev, sm, reserved = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    _check(cuda.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    _check(cuda.cuDeviceGetAttribute(ctypes.byref(sm), _MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                                     dev), "cuDeviceGetAttribute")
    _check(cuda.cuDeviceGetAttribute(ctypes.byref(reserved), _RESERVED_SHARED_MEMORY_PER_BLOCK,
                                     dev), "cuDeviceGetAttribute")
    return sm.value, reserved.value


def cap_programs_per_sm(compiled, cap: int, device: int) -> None:
    """Make every launch of Triton's loaded ``compiled`` kernel ask for enough shared memory
    that at most ``cap`` of its programs share an SM (its launch metadata and the function's
    attributes; the SM's shared memory is preferred whole over L1, or the driver could
    choose a smaller carve-out and allow fewer)."""
    sm_shared, reserved = _sm_shared(device)
    num_warps, num_ctas, shared = compiled.packed_metadata
    padded = padded_shared(shared, cap, sm_shared, reserved)
    if padded == shared:
        return
    cuda, fn = _driver(), ctypes.c_void_p(compiled.function)
    _check(cuda.cuFuncSetAttribute(fn, _MAX_DYNAMIC_SHARED_SIZE_BYTES, padded),
           "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
    _check(cuda.cuFuncSetAttribute(fn, _PREFERRED_SHARED_MEMORY_CARVEOUT, 100),
           "cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT)")
    compiled.packed_metadata = (num_warps, num_ctas, padded)
