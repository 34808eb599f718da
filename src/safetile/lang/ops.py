"""Every tile operation of the kernel language, documented in one place.

Each name here is a *builtin*: calling it outside a kernel body raises, because a builtin has
no meaning of its own. What each computes (promotion, rounding, NaN, overflow) is stated in
``lang/semantics.py``. Inside a kernel it means two things, kept in step:
- the CPU executor (``safetile.interpret``) supplies an implementation with torch tiles;
- the code generator (``safetile.codegen``) spells it in Triton (``Builtin.triton``).
"""
from __future__ import annotations

import contextvars
import functools
import types
from typing import Any, Callable

from ..errors import ExecutionError, FrozenError

# The implementation table in force while the CPU executor runs a kernel body.
_IMPL: contextvars.ContextVar[Any] = contextvars.ContextVar("safetile_lang_impl", default=None)

_REGISTRY: dict[str, "Builtin"] = {}
#: Every tile operation by name (read-only: the set of operations, and how each is spelled
#: in Triton, is fixed by this module; nothing else may add text to generated code).
BUILTINS = types.MappingProxyType(_REGISTRY)


class Builtin:
    """A tile operation; the callable users write as ``sl.<name>``. Immutable."""

    def __init__(self, fn: Callable, triton: str, unsafe: bool, atomic: bool):
        set_ = object.__setattr__
        set_(self, "name", fn.__name__)
        set_(self, "__doc__", fn.__doc__)
        set_(self, "__wrapped__", fn)
        set_(self, "triton", triton)   # Triton spelling, e.g. "tl.where" or "_st_m_exp" (prelude)
        set_(self, "unsafe", unsafe)   # only inside @st.kernel(unsafe=True)
        set_(self, "atomic", atomic)

    def __setattr__(self, name, value):
        raise FrozenError(f"sl.{self.name} is a tile operation of safetile.lang; it cannot be "
                          f"changed")

    __delattr__ = __setattr__

    @property
    def registered(self) -> bool:
        """Whether this is the operation safetile.lang defines under its name."""
        return _REGISTRY.get(self.name) is self

    def __call__(self, *args, **kwargs):
        impl = _IMPL.get()
        if impl is None:
            raise ExecutionError(
                f"sl.{self.name}() is a tile operation: call it inside an @st.kernel or "
                f"@st.function body, not from host code")
        return getattr(impl, self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<safetile builtin sl.{self.name}>"

    def function(self) -> Callable:
        """What ``sl.<name>`` is: a plain function with the operation's own signature and
        docstring (so ``help(sl.sum)`` shows both), dispatching as ``__call__`` does."""
        def op(*args, **kwargs):
            return self(*args, **kwargs)

        functools.update_wrapper(op, self.__wrapped__)
        op.name = self.name                        # type: ignore[attr-defined]
        return op


# The function each registered operation is published as (``sl.<name>``), by identity: a
# function's attributes can be reassigned, so what an operation is never rests on them.
_FUNCTIONS: dict[int, tuple[Callable, Builtin]] = {}


def builtin_of(value) -> "Builtin | None":
    """The registered ``Builtin`` that ``value`` (an ``sl.<name>`` function, or the
    ``Builtin`` itself) stands for, else None."""
    if isinstance(value, Builtin):
        return value if value.registered else None
    fn, b = _FUNCTIONS.get(id(value), (None, None))
    return b if fn is value else None


def _builtin(triton: str, unsafe: bool = False, atomic: bool = False):
    """Register the operation below (only this module defines operations)."""
    def register(fn: Callable) -> Callable:
        b = Builtin(fn, triton, unsafe, atomic)
        _REGISTRY[b.name] = b
        op = b.function()
        _FUNCTIONS[id(op)] = (op, b)
        return op
    return register


def use_implementation(impl: Any):
    """Install ``impl`` (an object with one method per builtin) for the current context."""
    return _IMPL.set(impl)


def reset_implementation(token) -> None:
    _IMPL.reset(token)


# ---- element-wise math (fp16/bf16 are computed in fp32 and rounded, as on the GPU) ----------

@_builtin("tl.where")
def where(cond, a, b):
    """Element-wise select: ``a`` where ``cond`` (a bool) is true, else ``b`` (broadcasting)."""

@_builtin("_st_m_exp")
def exp(x):
    """e**x."""

@_builtin("_st_m_exp2")
def exp2(x):
    """2**x."""

@_builtin("_st_m_log")
def log(x):
    """Natural logarithm."""

@_builtin("_st_m_log2")
def log2(x):
    """Base-2 logarithm."""

@_builtin("_st_m_sqrt")
def sqrt(x):
    """Square root."""

@_builtin("_st_m_rsqrt")
def rsqrt(x):
    """1 / sqrt(x)."""

@_builtin("_st_m_sin")
def sin(x):
    """Sine."""

@_builtin("_st_m_cos")
def cos(x):
    """Cosine."""

@_builtin("_st_tanh")
def tanh(x):
    """Hyperbolic tangent."""

@_builtin("_st_m_sigmoid")
def sigmoid(x):
    """1 / (1 + e**-x)."""

@_builtin("tl.abs")
def abs(x):
    """Absolute value."""

@_builtin("tl.maximum")
def maximum(a, b):
    """Element-wise maximum; where one operand is NaN the other wins (as Triton's default);
    the sign of a zero result from +0.0 and -0.0 is unspecified."""

@_builtin("tl.minimum")
def minimum(a, b):
    """Element-wise minimum; where one operand is NaN the other wins (as Triton's default);
    the sign of a zero result from +0.0 and -0.0 is unspecified."""


# ---- reductions ----------------------------------------------------------------------------

@_builtin("tl.sum")
def sum(t, axis=None):
    """Sum along ``axis`` (all axes when None, giving a scalar); fp16/bf16 accumulate in fp32
    and round back, int8 sums are int32; the order of the additions is unspecified."""

@_builtin("tl.max")
def max(t, axis=None):
    """Maximum along ``axis``; NaN elements are skipped (NaN only if all are NaN); fp16/bf16
    give fp32 and int8 gives int32, as Triton's reduction widens them."""

@_builtin("tl.min")
def min(t, axis=None):
    """Minimum along ``axis``; NaN elements are skipped (NaN only if all are NaN); fp16/bf16
    give fp32 and int8 gives int32."""

@_builtin("tl.argmax")
def argmax(t, axis):
    """Index of the maximum along ``axis`` (the first one on ties), int32; NaN elements are
    skipped (0 if all are NaN)."""

@_builtin("tl.argmin")
def argmin(t, axis):
    """Index of the minimum along ``axis`` (the first one on ties), int32; NaN elements are
    skipped (0 if all are NaN)."""


# ---- matrix products -------------------------------------------------------------------------

@_builtin("tl.dot")
def mma(a, b, acc):
    """``acc + a @ b``; ``a`` is (M, K), ``b`` (K, N), ``acc`` (M, N), K at least 16.

    fp16, bf16 and fp32 operands accumulate in an fp32 ``acc``, int8 operands (K at least 32)
    in an int32 one. fp32 operands use TF32 on the GPU, as Triton's ``tl.dot`` does by default.
    """

@_builtin("tl.dot")
def matmul(a, b):
    """``a @ b`` as an fp32 tile (int32 for int8 operands)."""


# ---- shape ---------------------------------------------------------------------------------

@_builtin("tl.reshape")
def reshape(t, shape):
    """Same elements in row-major order, new shape (sizes must be powers of two); a tile,
    not a scalar (``broadcast_to`` makes a tile of one)."""

@_builtin("tl.broadcast_to")
def broadcast_to(t, shape):
    """Broadcast ``t`` to ``shape`` (size-1 axes stretch; a tile keeps its rank, so add
    axes first with ``t[None, :]``; a scalar broadcasts to any shape)."""

@_builtin("tl.permute")
def permute(t, dims):
    """Reorder axes: result axis i is input axis ``dims[i]``."""

@_builtin("tl.trans")
def transpose(t):
    """Swap the two axes of a 2-D tile (also written ``t.T``)."""


# ---- construction and program geometry -------------------------------------------------------

@_builtin("tl.arange")
def arange(n):
    """``[0, 1, ..., n-1]`` as an int32 tile; ``n`` a compile-time power of two."""

@_builtin("tl.full")
def full(shape, value, dtype):
    """A tile of ``shape`` filled with ``value``: a compile-time value of ``dtype`` (an int
    in range for int dtypes), or a runtime scalar, converted as ``astype`` converts."""

@_builtin("tl.zeros")
def zeros(shape, dtype):
    """A tile of ``shape`` filled with zeros."""

@_builtin("tl.program_id")
def bid(axis):
    """This program's index along launch axis ``axis`` (0, 1 or 2). The launch grid of a
    kernel with ``Out`` parameters is their grid: ``sl.bid(k)`` is ``z.index[k]`` (0 past the
    grid's rank). A persistent launch (``partition(..., persistent=P)``) has ``P`` programs on
    axis 0; a kernel without ``Out`` launches ``options(grid=...)``."""

@_builtin("tl.num_programs")
def num_blocks(axis):
    """How many programs the launch has along ``axis``: for a kernel with ``Out`` parameters
    (not persistent), the number of tiles of their grid along ``axis`` (1 past its rank)."""

@_builtin("tl.cdiv")
def cdiv(a, b):
    """Ceiling division of integers: ``-(-a // b)`` with Python's floor division, for
    runtime values as for compile-time ones."""


# ---- unsafe: raw pointers (only in @st.kernel(unsafe=True); offsets are element offsets) -----

@_builtin("_st_load_ptr", unsafe=True)
def load_ptr(p, offsets, mask=None, other=0):
    """Load ``p[offsets]``; masked-off lanes read ``other`` (a compile-time value of
    ``p``'s dtype)."""

@_builtin("_st_store_ptr", unsafe=True)
def store_ptr(p, offsets, value, mask=None):
    """Store ``value`` at ``p[offsets]``: the destination is chosen freely, hence unsafe."""

@_builtin("_st_atomic_add", unsafe=True, atomic=True)
def atomic_add(p, offsets, value, mask=None):
    """Atomically add ``value`` at ``p[offsets]``; returns the old values. ``p`` is
    float32, float16, bfloat16, int32 or int64 memory, and ``value`` what a store there
    takes (floats into ints are converted explicitly first)."""
