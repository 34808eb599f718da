"""The in-kernel language, imported as ``sl``: tile types and operations.

Inside an ``@st.kernel`` body, parameters are views (``st.In`` x, ``st.Out`` z, ``st.Ptr``
p): their methods (``x.load``, ``x.load_at``, ``x.load_scalar``, ``x.prefetch``, ``z.load``,
``z.store``, ``z.partition(...).store``, ``z.tiles()``) are documented once, in
``safetile/lang/views.py`` (``help(st.In)``, ``help(st.Out)``); ``sl.load_like(x, z)`` is
the tile of ``x`` at ``z``'s position and shape.
Tiles support Python arithmetic (``x ** n`` by a compile-time int ``n``: ``n`` rounded
multiplications) and comparisons, ``t.astype(dtype)``, ``t.T``, ``t.shape`` and
``t.dtype`` (e.g. ``y.astype(x.dtype)`` rounds an fp32 result back to a loaded tile's type).
Of Python's builtins, a body may call ``range`` (in ``for``), ``min``, ``max`` and ``abs``
(element-wise on tiles, as ``sl.minimum``, ``sl.maximum`` and ``sl.abs``) and ``float`` (of
compile-time values); any other builtin is refused, naming what to write instead.

Stores convert: ``z.store(tile)`` (and a sub-tile store) converts the tile to the Out's element
type, as ``tile.astype(z_dtype)`` would: an fp32 tile stored into a bf16 Out rounds to nearest
even. It is the one implicit conversion of the kernel language (the host side converts
nothing); write the ``.astype`` to make a narrowing store visible. A float tile stored into
an int Out is refused: convert it explicitly. ``help(st.In)`` and ``help(st.Out)`` list the
view methods with their arguments; ``help(sl.<op>)`` shows each operation's signature, and
``semantics.py`` states what all of it computes, for both backends.
"""
from ..dtypes import bfloat16, bool_, float16, float32, int8, int32, int64  # noqa: F401
from ..dtypes import bf16, f16, f32, i32, i64  # noqa: F401
from .ops import (  # noqa: F401
    BUILTINS, abs, arange, argmax, argmin, atomic_add, bid, broadcast_to, cdiv, cos, exp, exp2,
    full, load_ptr, log, log2, matmul, max, maximum, min, minimum, mma, num_blocks, permute,
    reshape, rsqrt, sigmoid, sin, sqrt, store_ptr, sum, tanh, transpose, where, zeros,
)


def load_like(x, z):
    """The tile of In ``x`` at Out ``z``'s index and shape (padding 0 outside ``x``)."""
    return x.load(z.index, z.shape)


__all__ = [
    "load_like",
    # element-wise
    "where", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
    "abs", "maximum", "minimum",
    # reductions
    "sum", "max", "min", "argmax", "argmin",
    # matrix products
    "mma", "matmul",
    # shape
    "reshape", "broadcast_to", "permute", "transpose",
    # construction and program geometry
    "arange", "full", "zeros", "bid", "num_blocks", "cdiv",
    # unsafe: raw pointers
    "load_ptr", "store_ptr", "atomic_add",
    # dtypes
    "float32", "float16", "bfloat16", "int32", "int64", "int8", "bool_",
    "f32", "f16", "bf16", "i32", "i64",
]
