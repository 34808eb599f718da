"""Definition-time check of tile shapes written as constants (rule ``tile-shape``).

Every tile is built from ``tl.arange`` on the GPU, so each tile size must be a power of two.
Where a shape is known when the decorator runs (int literals, int globals, arithmetic on
them), a size that is not one is a ``KernelDefinitionError`` naming the line, rather than an
error at the first launch. Shapes that depend on ``Const`` parameters or ``z.shape`` are
checked when the kernel is specialized or run.
"""
from __future__ import annotations

import ast
import operator

from ..lang.views import InView, OutView, parameter_position
from .checker import BodyInfo, kind_of
from .source import KernelSource

# The parameters that take a tile shape (sl.arange takes one size), found by name in the
# declared signatures: a call passes them by position or by keyword.
SHAPE_PARAMS = ("shape", "sub_shape", "n")
# (receiver kind, method) -> the declaration of the view method (lang/views.py)
VIEW_SHAPES = {("In", "load"): InView.load, ("In", "load_at"): InView.load_at,
               ("In", "prefetch"): InView.prefetch, ("Out", "partition"): OutView.partition,
               ("tile", "partition"): OutView.partition}
# the sl.<op> operations that take a shape
OP_SHAPES = frozenset({"arange", "full", "zeros", "reshape", "broadcast_to"})

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv, ast.LShift: operator.lshift,
           ast.RShift: operator.rshift, ast.Pow: operator.pow}


def _static_int(node, info: BodyInfo):
    """The int ``node`` denotes when the decorator runs, else None."""
    if isinstance(node, ast.Constant):
        v = node.value
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    if isinstance(node, (ast.Name, ast.Attribute)):
        r = info.scope.resolve(node)
        if r is not None and r.kind == "const" and isinstance(r.value, int) \
                and not isinstance(r.value, bool):
            return r.value
        return None
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _static_int(node.left, info), _static_int(node.right, info)
        if a is None or b is None:
            return None
        try:
            return _BINOPS[type(node.op)](a, b)
        except (ArithmeticError, ValueError):
            return None
    return None


def _shape_arg(call: ast.Call, declared):
    """The shape argument of ``call``, a call of the operation ``declared`` declares."""
    position, name = parameter_position(declared, SHAPE_PARAMS)
    if len(call.args) > position:
        return call.args[position]
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def _fail(src: KernelSource, node, sizes, what: str):
    for axis, d in enumerate(sizes):
        if d is not None and (d < 1 or d & (d - 1)):
            lo = 1 << d.bit_length() - 1 if d > 1 else 1
            use = f"{lo} or {lo * 2}" if d > 1 else "1 or more"
            at = f" (axis {axis})" if len(sizes) > 1 else ""
            raise src.error(node, "tile-shape",
                            f"`{ast.unparse(node)}`: {what} {d}{at} is not a power of two; "
                            f"tile sizes must be positive powers of two (the GPU builds tiles "
                            f"from tl.arange): use {use}, and let loads pad and stores mask "
                            f"the elements past the tensor's edge")


def check_static_shapes(src: KernelSource, params: dict, info: BodyInfo) -> None:
    """Raise ``KernelDefinitionError`` for a constant tile shape that is not all powers of two."""
    for node in ast.walk(src.tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        declared, what = None, ""
        if isinstance(f, ast.Attribute):
            kind = kind_of(f.value, params, info.views)
            if (kind, f.attr) in VIEW_SHAPES:
                declared, what = VIEW_SHAPES[(kind, f.attr)], f"the {f.attr} size"
        if declared is None and isinstance(f, (ast.Attribute, ast.Name)):
            r = info.scope.resolve(f)
            if r is not None and r.kind == "builtin" and r.value.name in OP_SHAPES:
                declared, what = r.value.__wrapped__, f"the sl.{r.value.name} size"
                if r.value.name == "arange" and len(node.args) + len(node.keywords) != 1:
                    raise src.error(node, "call", f"`{ast.unparse(node)}`: sl.arange(n) takes "
                                    f"one size, unlike tl.arange(start, end): write "
                                    f"sl.arange(end - start) + start")
        if declared is None:
            continue
        shape = _shape_arg(node, declared)
        if shape is None:
            continue
        elts = shape.elts if isinstance(shape, (ast.Tuple, ast.List)) else [shape]
        _fail(src, node, [_static_int(e, info) for e in elts], what)
