"""Typing of the unsafe pointer operations, ``sl.load_ptr``, ``sl.store_ptr`` and
``sl.atomic_add``: what both backends compute the same way, refused before launch otherwise.

- offsets are ints (a float offset is truncated by the CPU executor and refused by Triton);
- a mask is bool and broadcasts to the offsets' shape (an int mask is nonzero on the CPU
  executor and refused by Triton; a wider mask broadcasts on one backend only);
- ``load_ptr``'s ``other``, what masked-off lanes read, is a compile-time number of the
  pointer's dtype;
- ``atomic_add`` adds into float32, float16, bfloat16, int32 or int64 memory (the GPU's
  atomic adds), and only what a store there would take (no float into ints).
"""
from __future__ import annotations

import ast

from .. import dtypes as _d
from ..lang import semantics as S
from .typecalls import _arg
from .typevalues import V, operand, runtime


class PointerTyper:
    """Pointer op typing; the host class provides ``expr``, ``number``, ``rule``, ``fail``
    and ``view_spec``."""

    def ptr_view(self, node):
        v = self.expr(node.args[0])
        return self.view_spec(v.value[1])

    def ptr_offsets(self, node) -> V:
        off = self.number(node.args[1], "the offsets")
        if off.runtime:
            is_int = not off.dtype.is_float and off.dtype is not _d.bool_
        else:
            is_int = isinstance(off.value, int) and not isinstance(off.value, bool)
        if not is_int:
            raise self.fail(node.args[1], f"`{ast.unparse(node.args[1])}`: pointer offsets are "
                                          f"ints, got {off.describe()}")
        return off

    def ptr_mask(self, node, position: int, off: V) -> None:
        m = _arg(node, position, "mask")
        if m is None or isinstance(m, ast.Constant) and m.value is None:
            return
        t = self.expr(m)
        is_bool = t.dtype is _d.bool_ if t.runtime else isinstance(t.value, bool)
        shape = t.shape if t.kind == "tile" else ()
        fits = len(shape) <= len(off.shape) and all(
            a in (1, b) for a, b in zip(reversed(shape), reversed(off.shape)))
        if not is_bool or not fits:
            raise self.fail(m, f"`{ast.unparse(m)}`: a pointer op's mask is bool and broadcasts "
                               f"to the offsets' shape {off.shape}, got {t.describe()}")

    def op_load_ptr(self, node) -> V:
        p = self.ptr_view(node)
        off = self.ptr_offsets(node)
        self.ptr_mask(node, 2, off)
        other = _arg(node, 3, "other")
        if other is not None:
            v = self.expr(other)
            if v.kind != "const":
                raise self.fail(other, f"`{ast.unparse(other)}`: load_ptr's other (what "
                                       f"masked-off lanes read) is a compile-time number")
            self.rule(other, S.representable, v.value, p.dtype, "read as the other of")
        return runtime(p.dtype, off.shape)

    def op_store_ptr(self, node) -> V:
        p = self.ptr_view(node)
        off = self.ptr_offsets(node)
        v = self.number(node.args[2], "the stored value")
        self.rule(node, S.store_check, operand(v), p.dtype)
        self.ptr_mask(node, 3, off)
        return V("none")

    def op_atomic_add(self, node) -> V:
        p = self.ptr_view(node)
        if p.dtype in (_d.int8, _d.bool_):
            raise self.fail(node, f"sl.atomic_add adds into float32, float16, bfloat16, int32 "
                                  f"or int64 memory (the GPU has no atomic add of "
                                  f"st.{p.dtype.name}), got a st.{p.dtype.name} pointer")
        off = self.ptr_offsets(node)
        v = self.number(node.args[2], "the added value")
        self.rule(node, S.store_check, operand(v), p.dtype)
        self.ptr_mask(node, 3, off)
        return runtime(p.dtype, off.shape)
