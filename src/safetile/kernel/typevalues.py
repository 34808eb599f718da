"""The abstract values of the per-variant type check (``kernel/types.py``).

A ``V`` is what the check knows of one expression: a compile-time value, a runtime scalar
or tile with its dtype (and shape), a dtype, a tuple, a view, or a callable the body names.
``bound``: for a runtime int known to lie in ``[0, bound]`` (indices, shapes, program ids):
the code generator emits Python's floor division as plain Triton division there.
``special``: an int derived only from ``int`` parameters, In shapes and compile-time values.
Triton turns such a value into a compile-time constant when it is 1, which changes how it
promotes; the check therefore refuses it where that would show (meeting an int8 or bf16
operand).
"""
from __future__ import annotations

from ..dtypes import DType

INT32_MAX = 2**31 - 1


class V:
    """One abstract value; see the module docstring."""

    __slots__ = ("kind", "dtype", "shape", "value", "bound", "special")

    def __init__(self, kind: str, dtype: DType | None = None, shape: tuple = (), value=None,
                 bound: int | None = None, special: bool = False):
        self.kind, self.dtype, self.shape, self.value = kind, dtype, shape, value
        self.bound, self.special = bound, special

    @property
    def runtime(self) -> bool:
        return self.kind in ("scalar", "tile")

    def same_type(self, other: "V") -> bool:
        """Equal runtime types (kind, dtype, shape) or equal tuples of them."""
        if self.kind == "tuple" and other.kind == "tuple":
            return len(self.value) == len(other.value) and all(
                a.same_type(b) for a, b in zip(self.value, other.value))
        return self.runtime and other.runtime and (self.kind, self.dtype, self.shape) == \
            (other.kind, other.dtype, other.shape)

    def describe(self) -> str:
        if self.kind == "const":
            return f"the compile-time value {self.value!r}"
        if self.kind == "scalar":
            return f"a st.{self.dtype.name} scalar"
        if self.kind == "tile":
            return f"a st.{self.dtype.name} tile of shape {self.shape}"
        if self.kind == "dtype":
            return f"the dtype {self.value!r}"
        if self.kind == "tuple":
            return f"a tuple of {len(self.value)}"
        if self.kind == "view":
            return f"the view '{self.value[1]}'"
        return {"none": "None", "str": "a string", "fn": "a function"}.get(self.kind, self.kind)

    def signature(self):
        """What a helper instance is specialized on (compile-time values by value)."""
        if self.kind == "const":
            return ("c", type(self.value).__name__, repr(self.value))
        if self.kind == "tuple":
            return ("t",) + tuple(v.signature() for v in self.value)
        if self.kind == "dtype":
            return ("d", self.value.name)
        return (self.kind, self.dtype.name if self.dtype else None, self.shape, self.special,
                self.bound)


def const(value) -> V:
    b = value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
    return V("const", value=value, bound=b)


def scalar(dtype: DType, bound: int | None = None, special: bool = False) -> V:
    return V("scalar", dtype, (), bound=bound, special=special)


def tile(dtype: DType, shape: tuple, bound: int | None = None) -> V:
    return V("tile", dtype, tuple(shape), bound=bound)


def runtime(dtype: DType, shape: tuple, bound: int | None = None, special: bool = False) -> V:
    """A scalar when ``shape`` is empty, else a tile."""
    if shape:
        return tile(dtype, shape, bound)
    return scalar(dtype, bound, special)


def operand(v: V):
    """``v`` as an operand of the rules in ``lang/semantics.py`` (DType or Python number)."""
    return v.value if v.kind == "const" else v.dtype


def bounded(b) -> int | None:
    """``b`` if it is a bound an int32 holds, else None."""
    return b if b is not None and 0 <= b <= INT32_MAX else None


def merged(a: V, b: V) -> V:
    """One runtime value that is ``a`` on some paths and ``b`` (of the same type) on others."""
    if a is b:
        return a
    if a.kind == "tuple":
        return V("tuple", value=tuple(merged(x, y) for x, y in zip(a.value, b.value)))
    bound = max(a.bound, b.bound) if a.bound is not None and b.bound is not None else None
    return V(a.kind, a.dtype, a.shape, None, bound, a.special and b.special)


def unbounded(v: V) -> V:
    """``v`` without its bound (a tuple's entries too)."""
    if v.kind == "tuple":
        return V("tuple", value=tuple(unbounded(x) for x in v.value))
    return V(v.kind, v.dtype, v.shape, v.value, None, v.special)


def bounds(v: V):
    """``v``'s bound, or its entries' for a tuple (to compare the facts of two values)."""
    return tuple(bounds(x) for x in v.value) if v.kind == "tuple" else v.bound


def specials(v: V):
    """``v``'s ``special`` fact, or its entries' for a tuple."""
    return tuple(specials(x) for x in v.value) if v.kind == "tuple" else v.special


def leaves(v: V):
    """The entries of tuple ``v``, nested tuples' entries in place of the tuples."""
    for x in v.value:
        yield from leaves(x) if x.kind == "tuple" else (x,)
