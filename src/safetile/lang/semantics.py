"""The semantics of kernel code, stated once: values, types, promotion, rounding, overflow.

Both backends implement this statement: the code generator by emitting Triton that computes
it (Triton's own rules where they agree, explicit code where they do not), the CPU executor
with torch. The type rules are functions here, shared by the per-variant type check
(``kernel/types.py``, which refuses what a rule rejects, with file:line) and by the CPU
executor's arithmetic (``backends``' interpret tiles). ``tests/test_differential_*.py``
checks the two backends against each other.

Values
------
*Compile-time* values are Python numbers (int, float, bool) and tuples of them: literals,
``st.Const`` parameters, module and closure constants (as they were when the decorator
ran), ``z.shape``, sub-tile shapes, ``t.shape`` and ``t.dtype``, and local names bound to
them (however often, by tuple unpacking too). Arithmetic on compile-time values alone is
Python's, done at compile time (``-7 // 2 == -4``). A tuple entry ``s[k]`` with a negative
``k`` counts from the end (``x.shape[-1]``).

*Runtime* values have a dtype: a *scalar* (no axes) or a *tile* (axes with compile-time
sizes, each a power of two, at most 2**20 elements). Runtime scalars:

- ``int`` parameters are int32 (a launch with a value outside int32 is refused);
  ``float`` parameters are fp32 (the value is rounded to fp32; 1e300 becomes inf);
- ``z.index[k]``, ``sl.bid(a)``, ``sl.num_blocks(a)``, ``x.shape[k]`` are int32;
- a ``for i in range(a, b, c)`` variable has the promoted type of its bounds (int32 unless
  one is int64); ``x.load_scalar`` has ``x``'s dtype; a reduction over all axes is a scalar.

Tile shapes, ``sl.arange``'s size, reshape and broadcast shapes and reduction axes must be
compile-time values.

Promotion (arithmetic, comparisons, ``sl.where``, ``sl.maximum``, ``min``/``max``)
---------------------------------------------------------------------------------
Kinds are ordered bool < int < float. When a compile-time number meets a runtime value of
the same or a higher kind, the runtime value's dtype wins and the number is converted to it
(an int must fit: ``int8_tile + 300`` is refused; a float is rounded to fp32 and then to the
tile's type, and a compile-time zero is +0.0: ``-0.0`` in kernel code is ``+0.0``).
Otherwise the operands promote:

- fp32 with anything gives fp32; fp16 with an int gives fp16; bf16 with bf16 gives bf16;
  bf16 with an int gives fp32; fp16 meeting bf16 is refused (convert one with ``.astype``);
- ints promote to the wider (int8 < int32 < int64); bool takes no part in arithmetic;
- a compile-time number meeting a runtime value of a lower kind takes its own type (an int
  is int32, or int64 when it does not fit; a float is fp32: ``int_tile * 0.5`` is fp32), as
  does one that becomes a runtime value on its own (a ``range`` bound, a helper's result, a
  branch of a runtime conditional). An int in ``[2**31, 2**32)`` is refused there (Triton
  would make it uint32, a type the language does not have: use ``sl.full((), v, st.int64)``),
  and an int outside int64 is refused wherever it meets a runtime value;
- a value computed only from ``int`` parameters, In shapes and compile-time numbers is
  refused where it meets an int8, fp16 or bf16 operand that it would promote differently as
  a compile-time number: Triton passes such an argument equal to 1 as the constant 1, so
  the result type would depend on the value (convert one operand with ``.astype``).

``/`` of fp16 or bf16 operands computes and returns fp32; ``/`` of ints returns fp32.
``/`` is IEEE division, rounded to nearest even (``tl.div_rn`` on the GPU), never an
approximation: ``x / x`` is 1.0 for every finite nonzero ``x``.
A compile-time number is converted the same way wherever it meets a runtime value:
comparisons, ``sl.where`` and ``sl.maximum``/``min``/``max`` included (``fp16_tile == 0.1``
compares with 0.1 rounded to fp32 and then to fp16; the code generator builds such
constants itself, as Triton would compare in fp32).
Every other operation returns its computation type, rounded (to nearest even) after each
operation: ``bf16 + bf16`` is bf16, computed exactly and rounded once, which fp32 math
followed by one rounding reproduces.

Operators
---------
- ``+ - *`` on ints wrap (two's complement) in the result type. Unary ``-x`` is ``0 - x``
  (so ``-(+0.0)`` is ``+0.0``, as in Triton).
- ``//`` and ``%`` on ints follow Python: the quotient is floored and the remainder has the
  divisor's sign (``-7 // 2 == -4``, ``-7 % 2 == 1``), for runtime and compile-time values
  alike; ``INT_MIN // -1`` wraps to ``INT_MIN``. Division by zero (in any lane, even one
  never stored) raises ``DivisionByZeroError`` on the CPU; on the GPU, which cannot report
  it, ``x // 0`` is 0 and ``x % 0`` is ``x``. ``sl.cdiv(a, b)`` is ``-(-a // b)`` (the ceiling;
  on the GPU ``sl.cdiv(a, 0)`` is 1 for a nonzero ``a``, 0 for 0).
- ``//`` and ``%`` on floats are refused: Triton has no float floor division, and its float
  remainder is exact ``fmod`` in its interpreter but derived from a rounded quotient on the
  GPU, so no one result could be promised. Write the quotient (``a / b``, ``.astype(st.i32)``
  truncates) and the remainder from it.
- ``<< >>`` shift ints (a bool operand takes the other's int type: ``bool << int8`` is int8); a shift amount outside ``[0, bits)`` is an error on the CPU executor
  and gives 0 (``<<``) or the sign fill (``>>``) on the GPU. ``& | ^ ~`` work on ints and
  bools. ``x ** n`` on a runtime ``x`` takes a compile-time int ``n`` from 1 to
  :data:`MAX_POWER` and is ``x * x * ... * x`` (``n`` factors, multiplied left to right, each
  product rounded and wrapping as ``*`` does); other exponents are refused (write
  ``sl.sqrt``, ``sl.rsqrt`` or ``sl.exp2(y * sl.log2(x))``).
- ``and``, ``or``, ``not`` take bool scalars (``&``, ``|``, ``~`` combine tiles); a runtime
  ``if`` or conditional expression takes a scalar condition.
- Comparisons give bool; NaN compares false except ``!=``. Chained comparisons and ``is``
  are refused.

Operations (``safetile.lang``; see each op's docstring for its signature)
------------------------------------------------------------------------
- ``exp exp2 log log2 sqrt rsqrt sin cos tanh sigmoid``: fp16/bf16 are computed in fp32 and
  rounded back; ints give fp32. The GPU uses fast approximations (a few ulp): results are
  specified to that accuracy, not bit for bit. ``sqrt`` and ``rsqrt`` take a subnormal
  fp32 argument as a zero of its sign (their GPU instructions flush it: ``rsqrt(1e-39)`` is
  inf). A result below the smallest normal fp32 (2**-126) may be 0 on the GPU where the CPU
  executor gives the subnormal: ``exp2`` of -126 to -150, ``sigmoid`` below about -87.3.
  ``abs`` keeps the dtype (ints wrap).
- ``maximum``/``minimum``/``min``/``max`` of runtime values: where one operand is NaN the other
  wins. When both are zeros of different signs, the sign of the result is unspecified.
- ``sl.sum``: fp16/bf16 accumulate in fp32 and round back to their type, int8 sums are int32;
  the order of the additions is unspecified (float sums may differ in the last bits).
  ``sl.max``/``sl.min`` skip NaN (NaN only if every element is NaN) and return fp16/bf16 as
  fp32 and int8 as int32. ``sl.argmax``/``sl.argmin`` count a NaN as -inf (argmin: +inf), so
  a NaN never beats a number, and give the first index on ties (``[nan, -inf]``: 0), int32.
  Reductions of bool tiles are refused (``.astype(st.i32)`` first).
- ``sl.mma(a, b, acc)``: ``a``, ``b`` of one dtype (fp16, bf16, fp32 with an fp32 ``acc``;
  int8 with an int32 ``acc``), 2-D, K at least 16 (32 for int8). fp32 operands use TF32 on
  the GPU. ``a * b + c`` on floats may be fused into one rounding on the GPU.
- ``t.astype(dtype)``: float to int truncates toward zero and saturates (NaN gives 0); int to
  int wraps; to bool is ``!= 0``; float to float rounds to nearest even.
- Stores convert the value to the ``Out``'s dtype as ``astype`` does; a float value stored
  into an int ``Out`` is refused (convert explicitly). Padding values and ``sl.full``
  values must be representable in the dtype (``float("-inf")`` pads float tensors only).

Indices and limits
------------------
A tile index ``i`` with shape ``t`` reads elements ``i*t + [0, t)``, computed exactly: any
element outside the tensor reads the padding, whatever ``i`` (no wrap-around); a
compile-time ``i`` that is negative or whose box passes the int32 range (either way wholly
outside every tensor) is refused. A sub-tile index outside the owned slab's sub-grid is refused: by the type check
when it is compile-time, else by the CPU executor (``OutOfBoundsError``); the GPU masks it
off. Tensors whose dimensions exceed ``MAX_DIM`` or whose elements lie past offset
2**31 - 1, tiles over ``MAX_TILE_ELEMENTS`` elements, and launches of more than
``MAX_PROGRAMS`` programs are refused before anything runs. A ``range`` loop whose variable
would pass the int32 range (``stop + step`` beyond it) is refused by the CPU executor; on the
GPU it is undefined.

Names
-----
A kernel sees module globals and closure variables as they were when its decorator ran.
An assignment has one target: a name, or one level of names unpacking a tuple
(``i, j = z.index``; not ``a = b = v``, not ``a, (b, c) = ...``).
A name bound inside a ``for`` body, and the loop variable itself, are not defined after the
loop. After a runtime ``if``, a name is defined only if it was defined before or in both
branches (with one type); a name holding a runtime value keeps its type through a branch or
a loop (``acc = 0`` then ``acc = acc + tile`` in a loop is refused: start from
``sl.zeros``); a compile-time value cannot be rebound inside a runtime ``if`` or a loop.
"""
from __future__ import annotations

import math
import struct

from .. import dtypes as _d
from ..dtypes import DType

#: The largest dimension of an In or Out tensor. Generated kernels compute element
#: coordinates in int32; with every tile at most MAX_TILE_ELEMENTS wide, a coordinate past
#: the end of a dimension (an edge tile's masked lanes) stays below 2**31.
MAX_DIM = 2**31 - 2**20
#: Triton's block limit: the most elements one tile may have.
MAX_TILE_ELEMENTS = 2**20
#: The most programs one launch may have (CUDA's grid limit along x).
MAX_PROGRAMS = 2**31 - 1
#: The largest element offset of an In or Out tensor (offsets are computed in int32).
MAX_OFFSET = 2**31 - 1

BOOL, INT, FLOAT = 0, 1, 2

_INT_BITS = {"bool_": 1, "int8": 8, "int32": 32, "int64": 64}


class SemanticsError(Exception):
    """A rule of this module refuses an operation; callers attach where (file:line)."""


def kind(d: DType) -> int:
    """BOOL, INT or FLOAT."""
    if d is _d.bool_:
        return BOOL
    return FLOAT if d.is_float else INT


def weak_kind(v) -> int:
    """The kind of a compile-time number."""
    if isinstance(v, bool):
        return BOOL
    return INT if isinstance(v, int) else FLOAT


def int_range(d: DType) -> tuple[int, int]:
    """The smallest and largest value of an integer dtype (bool: 0 and 1)."""
    bits = _INT_BITS[d.name]
    if d is _d.bool_:
        return 0, 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def bits(d: DType) -> int:
    """The width of an integer dtype in bits."""
    return _INT_BITS[d.name]


def weak_dtype(v) -> DType:
    """The dtype a compile-time number takes on its own (Triton's ``to_tensor``)."""
    if isinstance(v, bool):
        return _d.bool_
    if isinstance(v, int):
        if -2**31 <= v < 2**31:
            return _d.int32
        if 0 <= v < 2**32:
            raise SemanticsError(
                f"the compile-time int {v} lies in [2**31, 2**32): on its own Triton types it "
                f"uint32, which the language does not have; make it a runtime int64 value with "
                f"sl.full((), {v}, st.int64), or keep it inside int32")
        int64_check(v)
        return _d.int64
    if not fp32_normal(v):
        raise SemanticsError(
            f"the compile-time float {v!r} is not a normal fp32 number: it can only meet "
            f"float tiles (where it is rounded to their type)")
    return _d.float32


def int64_check(v) -> None:
    """Refuse a compile-time int outside int64 (the GPU has no wider int to build it in)."""
    if isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63:
        shown = v if v.bit_length() <= 256 else f"of {v.bit_length()} bits"
        raise SemanticsError(f"the compile-time int {shown} does not fit in 64 bits, so it "
                             f"cannot meet a runtime value; to meet float values write it as "
                             f"a float (1e30, not 10**30)")


def fp32_normal(v: float) -> bool:
    """Whether ``v`` is 0, inf, NaN or a normal fp32 magnitude (what Triton keeps as fp32)."""
    a = abs(v)
    return a == 0.0 or a == math.inf or v != v or 2.0**-126 <= a <= (2 - 2**-23) * 2.0**127


def _promote_ints(a: DType, b: DType) -> DType:
    if a is _d.bool_:
        return b
    if b is _d.bool_:
        return a
    return a if bits(a) >= bits(b) else b


def _strong(a: DType, b: DType, div_or_mod: bool) -> DType:
    """Promotion of two runtime dtypes (Triton's computation type, fp16/bf16 mixing refused)."""
    if a is b and not (div_or_mod and a in (_d.float16, _d.bfloat16)):
        return a
    if _d.float32 in (a, b):
        return _d.float32
    if {a, b} == {_d.float16, _d.bfloat16}:
        raise SemanticsError("fp16 meets bf16: convert one of them with .astype(...) first")
    if _d.float16 in (a, b):
        return _d.float32 if div_or_mod else _d.float16
    if _d.bfloat16 in (a, b):
        return _d.float32 if div_or_mod or a is not b else _d.bfloat16
    return _promote_ints(a, b)


def _fit(v, d: DType, what: str):
    """Check that compile-time ``v`` may take runtime dtype ``d``; returns ``v``."""
    if kind(d) == FLOAT:
        return v
    if isinstance(v, float):
        raise SemanticsError(f"the float {v!r} {what} st.{d.name}")
    lo, hi = int_range(d)
    if not lo <= v <= hi:
        raise SemanticsError(f"{v} does not fit st.{d.name} ({what} it); convert the "
                             f"{'tile' if d is not _d.bool_ else 'value'} first, e.g. "
                             f".astype(st.int32)")
    return v


def computation_dtype(a, b, div_or_mod: bool = False) -> DType:
    """The dtype ``a op b`` is computed in; ``a``/``b`` are DTypes (runtime operands) or
    Python numbers (compile-time operands; at least one operand must be runtime)."""
    wa, wb = not isinstance(a, DType), not isinstance(b, DType)
    if wa and wb:
        return _strong(weak_dtype(a), weak_dtype(b), div_or_mod)
    if wa or wb:
        v, t = (a, b) if wa else (b, a)
        int64_check(v)
        if weak_kind(v) <= kind(t):
            _fit(v, t, "meets a tile of")
            if div_or_mod and t in (_d.float16, _d.bfloat16):
                return _d.float32
            return t
        return _strong(weak_dtype(v), t, div_or_mod)
    return _strong(a, b, div_or_mod)


def _no_bool(op: str, *operands) -> None:
    for x in operands:
        if x is _d.bool_ or isinstance(x, bool):
            raise SemanticsError(
                f"`{op}` on a bool: bools take no part in arithmetic; convert with "
                f".astype(st.int32) (or use & | ~ to combine masks)")


ARITH = ("+", "-", "*")
#: The largest compile-time exponent ``x ** n`` takes on a runtime ``x`` (n multiplications).
MAX_POWER = 64
COMPARE = ("<", "<=", ">", ">=", "==", "!=")
BITWISE = ("&", "|", "^", "<<", ">>")


def binary(op: str, a, b) -> tuple[DType, DType]:
    """``(computation dtype, result dtype)`` of ``a op b`` for an operator of the language
    (``+ - * / // % < <= > >= == != & | ^ << >>``, ``max``/``min`` for maximum and minimum,
    ``where`` for the two values of ``sl.where``)."""
    if op in ARITH or op in ("/", "//", "%", "max", "min"):
        _no_bool(op, a, b)
    if op == "**":
        raise SemanticsError(f"`**` on a runtime value takes a compile-time int exponent "
                             f"from 1 to {MAX_POWER} (x ** 2 is x * x); for other powers "
                             f"use sl.sqrt, sl.rsqrt or sl.exp2(y * sl.log2(x))")
    if op in BITWISE:
        for x in (a, b):
            if (isinstance(x, DType) and x.is_float) or isinstance(x, float):
                raise SemanticsError(f"`{op}` needs ints or bools, got a float")
        c = computation_dtype(a, b)
        return c, c
    div_or_mod = op in ("/", "%", "//")
    c = computation_dtype(a, b, div_or_mod)
    if op in ("//", "%") and c.is_float:
        raise SemanticsError(f"`{op}` on floats is not supported (Triton's GPU and interpreter "
                             f"disagree on float remainders): write a / b, truncate with "
                             f".astype(st.int32), and form the remainder from that quotient")
    if op == "/" and not c.is_float:
        return _d.float32, _d.float32
    if op in COMPARE:
        return c, _d.bool_
    return c, c


def where_dtype(a, b) -> DType:
    """The dtype of ``sl.where(c, a, b)`` (bools may be selected)."""
    return computation_dtype(a, b)


def unary(op: str, a: DType) -> DType:
    """The dtype of ``-a``, ``+a``, ``~a`` and ``abs(a)``."""
    if op in ("-", "abs"):
        _no_bool(op, a)
    if op == "~" and a.is_float:
        raise SemanticsError("`~` needs an int or a bool, got a float")
    return a


#: Math functions whose GPU instructions flush a subnormal fp32 argument to zero.
FLUSHES_SUBNORMALS = frozenset({"sqrt", "rsqrt"})


def math_dtype(name: str, a: DType) -> DType:
    """The dtype of ``sl.exp(a)`` and the other element-wise math functions."""
    _no_bool(f"sl.{name}", a)
    return a if a.is_float else _d.float32


def reduction_dtype(name: str, a: DType) -> DType:
    """The dtype of ``sl.sum / max / min / argmax / argmin`` of a tile of dtype ``a``."""
    if a is _d.bool_:
        raise SemanticsError(f"sl.{name} of a bool tile: convert it with .astype(st.int32)")
    if name in ("argmax", "argmin"):
        return _d.int32
    if a is _d.int8:
        return _d.int32
    if name in ("max", "min") and a in (_d.float16, _d.bfloat16):
        return _d.float32
    return a


def mma_check(a: DType, b: DType, acc: DType | None, k: int) -> DType:
    """Check the operands of ``sl.mma`` / ``sl.matmul`` (``sl.matmul`` when ``acc`` is None);
    returns the result dtype."""
    op = "sl.mma" if acc is not None else "sl.matmul"
    if a is not b:
        raise SemanticsError(f"{op} operands must have one dtype, got st.{a.name} and "
                             f"st.{b.name}")
    if a not in (_d.float16, _d.bfloat16, _d.float32, _d.int8):
        raise SemanticsError(f"{op} takes fp16, bf16, fp32 or int8 operands, got st.{a.name}")
    out = _d.int32 if a is _d.int8 else _d.float32
    if acc is not None and acc is not out:
        raise SemanticsError(f"{op} of st.{a.name} operands accumulates in st.{out.name}, "
                             f"got an st.{acc.name} accumulator")
    least = 32 if a is _d.int8 else 16
    if k < least:
        raise SemanticsError(f"{op} needs K >= {least} for st.{a.name} operands, got K = {k}")
    return out


def store_check(value, out: DType) -> None:
    """Check that a value (a DType, or a compile-time number) may be stored into ``out``."""
    if isinstance(value, DType):
        if value.is_float and not out.is_float:
            raise SemanticsError(f"storing a st.{value.name} value into a st.{out.name} Out: "
                                 f"convert it explicitly with .astype(st.{out.name})")
        return
    representable(value, out, "stored into")


def representable(v, d: DType, what: str) -> None:
    """Check that compile-time ``v`` is a value of ``d`` (padding, stores, ``sl.full``)."""
    if d.is_float:
        if isinstance(v, bool):
            raise SemanticsError(f"the bool {v!r} {what} a st.{d.name} tile: write 0.0 or 1.0")
        int64_check(v)
        return
    if isinstance(v, float):
        raise SemanticsError(f"the float {v!r} cannot be {what} a st.{d.name} tile")
    lo, hi = int_range(d)
    if not lo <= int(v) <= hi:
        raise SemanticsError(f"{v} is not a st.{d.name} value (it cannot be {what} it)")


def compile_time_float(v) -> float:
    """A compile-time number as it becomes a float value: rounded to fp32 (to nearest even;
    past fp32's range it is +-inf), and a zero is +0.0 (Triton builds compile-time zeros as
    +0.0). Both backends round it here, then to the operand's type."""
    v = float(v)
    try:
        v = struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:                 # rounds past the largest fp32
        v = math.copysign(math.inf, v)
    return 0.0 if v == 0.0 else v


def rounded(v, d: DType) -> float:
    """Compile-time number ``v`` as a value of float dtype ``d``: rounded to fp32 (see
    ``compile_time_float``), then to ``d``, to nearest even."""
    x = compile_time_float(v)
    if d is _d.float16 and math.isfinite(x):
        try:
            return struct.unpack("e", struct.pack("e", x))[0]
        except OverflowError:
            return math.copysign(math.inf, x)
    if d is _d.bfloat16 and math.isfinite(x):
        b = struct.unpack("<I", struct.pack("<f", x))[0]
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return struct.unpack("<f", struct.pack("<I", b))[0]
    return x


def range_dtype(bounds) -> DType:
    """The dtype of a ``for i in range(...)`` variable; ``bounds`` are DTypes or ints."""
    out = None
    for x in bounds:
        if isinstance(x, DType):
            if x.is_float or x is _d.bool_:
                raise SemanticsError(f"range() bounds must be ints, got a st.{x.name}")
            t = x
        elif isinstance(x, bool) or not isinstance(x, int):
            raise SemanticsError(f"range() bounds must be ints, got {x!r}")
        else:
            t = weak_dtype(x)
        out = t if out is None else _promote_ints(out, t)
    return out
