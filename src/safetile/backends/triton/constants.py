"""Compile-time numbers in generated Triton: built as constants of the type the semantics give.

``lang/semantics.py`` converts a compile-time number to the runtime operand it meets (fp32
first, then that operand's type) in every operation. Triton does so in arithmetic and
``tl.where`` only; ``needs_type`` names where it does not, and ``typed_constant`` builds the
constant there. ``/`` computes in fp32 on operands from ``fp32_operand``.
"""
from __future__ import annotations

from ...dtypes import float32
from ...lang import semantics as S


def float_literal(v: float) -> str:
    """A float as Triton source (infinities and NaN spelled through float())."""
    return repr(v) if abs(v) != float("inf") and v == v else f'float("{v}")'


def needs_type(op: str, v, d) -> bool:
    """Whether compile-time ``v`` meeting a runtime ``d`` (of the same or a higher kind) in
    ``op`` must be built as a constant of type ``d`` to be converted as the semantics say.
    Triton converts it to ``d`` itself in arithmetic and ``tl.where``, except that its bf16
    constants lose digits (zero is exact); in comparisons and ``tl.maximum``/``minimum`` it
    keeps the number as an fp32 (fp64 outside fp32's normal range) or int32 value."""
    if op in S.COMPARE:
        return d.is_float and v == v and S.rounded(v, d) != v
    if op in ("max", "min"):
        return d.name in ("int8", "float16", "bfloat16") or \
            (d.is_float and isinstance(v, float) and not S.fp32_normal(v))
    return d.name == "bfloat16" and v != 0


def typed_constant(v, d) -> str:
    """Compile-time number ``v`` as a Triton scalar of dtype ``d``: a float is rounded
    to fp32 and then to ``d`` (``semantics.compile_time_float``)."""
    if not d.is_float:
        return f"tl.full((), {int(v)}, tl.{d.triton_name})"
    x = f"tl.full((), {float_literal(S.compile_time_float(v))}, tl.float32)"
    return x if d.name == "float32" else f"{x}.to(tl.{d.triton_name})"


def fp32_operand(t, src: str) -> str:
    """An operand of ``/`` (typed ``t``) as an fp32 value: ``/`` computes in fp32."""
    if t.kind == "const":
        return typed_constant(t.value, float32)
    if t.special:
        return f"tl.cast({src}, tl.float32)"
    return src if t.dtype.name == "float32" else f"({src}).to(tl.float32)"


def extremum_type(name: str, acc, at):
    """The runtime dtype of an extremum so far (None where it is not known)."""
    if at is None:
        return None
    b = at.dtype if at.runtime else at.value
    if acc is None:
        return b if at.runtime else None
    try:
        return S.binary(name, acc, b)[1]
    except S.SemanticsError:
        return None


def kept_bf16(src: str, t) -> str:
    """An extremum typed bf16 (``t``) kept bf16: Triton's tl.maximum/minimum of bf16 give fp32."""
    if t is not None and t.runtime and t.dtype.name == "bfloat16":
        return f"({src}).to(tl.bfloat16)"
    return src


def stored_as(src: str, t, dtype) -> str:
    """Value ``src`` (typed ``t``) converted as a store into memory of ``dtype`` converts it,
    as ``astype`` does: into bool, ``!= 0`` (Triton's store to a bool pointer truncates the
    value to a byte)."""
    if dtype.name == "bool_" and not (t is not None and t.runtime and t.dtype.name == "bool_"):
        return f"(({src}) != 0)"
    return src
