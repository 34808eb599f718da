"""Local names bound to compile-time values, emitted so that Triton keeps them compile-time.

In the language (``lang/semantics.py``) a name bound to a compile-time value is that value
wherever the type check typed it so, however often it is bound and by unpacking too: the
CPU executor holds the Python value. Triton keeps a value compile-time only through
``name: tl.constexpr = ...`` (``Emitter.constexpr_alias``, for a name bound once); any other
assignment turns a compile-time number into a runtime scalar, which promotes differently
(``int8_tile + c`` becomes int32), is no tile shape, and fails to build past 64 bits. So such
a binding is not emitted at all, and each use of the name where the type check typed it
compile-time is emitted as the value itself (``ConstantNames``).

A function parameter that is never rebound keeps its name: Triton passes a compile-time
argument to a ``@triton.jit`` helper as a constexpr.
"""
from __future__ import annotations

import ast
import functools

from .constants import float_literal


def literal(v) -> str | None:
    """Triton source of a compile-time value of the type check (a number, or a tuple of
    numbers), or None for anything else."""
    if v is None:
        return None
    if v.kind == "const" and isinstance(v.value, (bool, int, float)):
        return float_literal(v.value) if isinstance(v.value, float) else repr(v.value)
    if v.kind == "tuple":
        parts = [literal(x) for x in v.value]
        if all(p is not None for p in parts):
            return "(" + "".join(p + ", " for p in parts) + ")"
    return None


class ConstantNames:
    """Mixed into the expression emitter: constexpr aliases, and the folding above."""

    @functools.cached_property
    def bound_names(self) -> dict:
        """Name -> how many times the body binds it (assignments, loop targets)."""
        counts: dict = {}
        for n in ast.walk(self.src.tree):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                counts[n.id] = counts.get(n.id, 0) + 1
        return counts

    @functools.cached_property
    def alias_names(self) -> set:
        """The names the body binds by a constexpr alias (``constexpr_alias``)."""
        return {n.targets[0].id for n in ast.walk(self.src.tree)
                if isinstance(n, ast.Assign) and self.constexpr_alias(n)}

    def constexpr_alias(self, node) -> bool:
        """Whether ``name = <compile-time int>`` is emitted as ``name: tl.constexpr = ...``.

        Triton 3.6 makes a plain local alias of a constexpr (``BM = _st_z_t0``, from
        ``BM = z.shape[0]``) a runtime value, so a tile shape built from it (``tl.arange(0,
        BM)`` inside a load helper) fails to compile. The annotation keeps it a constexpr; it
        is legal only for a name bound once in the body.
        """
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
            return False
        if not isinstance(self.static(node.value), int):
            return False
        return self.bound_names[node.targets[0].id] == 1

    def folded_name(self, node) -> str | None:
        """A use of a local name bound to a compile-time value other than by a constexpr
        alias, as that value's Triton source; None where the name itself is emitted."""
        if node.id not in self.bound_names:
            return None                   # a parameter: a constexpr where compile-time
        return None if node.id in self.alias_names else literal(self.tp(node))

    def compile_time_binding(self, node) -> bool:
        """Whether an assignment statement binds only compile-time values and is not a
        constexpr alias: it is not emitted (the uses of its names are folded)."""
        if isinstance(node, ast.Assign) and self.constexpr_alias(node):
            return False
        value = node if isinstance(node, ast.AugAssign) else node.value
        return literal(self.tp(value)) is not None
