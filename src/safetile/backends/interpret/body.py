"""Kernel bodies as the CPU executor runs them.

The executor runs the *checked* body: the AST the checker and the code generator read,
compiled here, not the decorated function object (which a wrapper or a later assignment of
``__code__`` could make differ). Names resolve against the snapshot taken when the
decorator ran (module globals and closure values then), as in the generated code, so a
global rebound later changes neither backend. Where Python's own semantics differ from the
language's (``lang/semantics.py``), the tree is lowered to calls of this module:

- ``a if c else b`` with a runtime condition yields a runtime value of one type;
- ``and``/``or``/``not`` on runtime bools give runtime bools (as Triton's logical ops);
- ``range``, ``min``, ``max``, ``abs``, ``float`` are the language's (typed loop variables,
  NaN-skipping extrema, compile-time-only ``float``);
- ``@st.function`` helpers run their own checked bodies, and a compile-time value they
  return becomes a runtime scalar, as Triton returns it.
"""
from __future__ import annotations

import ast
import builtins
import copy

import torch

from ... import dtypes as _d
from ...errors import ArgumentError, OutOfBoundsError
from ...lang import semantics as S
from . import arith
from .tile import Tile, raw, scalar


def executable(obj):
    """The CPU form of a ``Kernel`` or ``@st.function`` ``obj`` (built once, cached)."""
    fn = obj._bodies.get("interpret")
    if fn is None:
        fn = obj._bodies["interpret"] = _build(obj._src, obj._info.scope)
    return fn


def _build(src, scope):
    tree = copy.deepcopy(src.tree)
    tree.decorator_list = []
    tree.returns = None
    for a in tree.args.args:
        a.annotation = None
    names: dict = {}
    params = {a.arg for a in tree.args.args}
    tree = _Lower(scope, names, params | scope.locals).visit(tree)
    module = ast.Module(body=[tree], type_ignores=[])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, src.first_line - 1)
    code = compile(module, src.filename, "exec")
    env = dict(scope.globals)
    env.update(_RUNTIME)
    env.update(names)
    exec(code, env)
    return env[tree.name]


class _Lower(ast.NodeTransformer):
    """Rewrites one body (see the module docstring); ``names`` collects new globals."""

    def __init__(self, scope, names: dict, local: set):
        self.scope, self.names, self.local = scope, names, local

    def bind(self, value, node) -> ast.Name:
        key = f"_st_g{len(self.names)}"
        self.names[key] = value
        return ast.copy_location(ast.Name(key, ast.Load()), node)

    def resolved(self, node):
        r = self.scope.resolve(node)
        if r is None or r.kind in ("local", "param"):
            return None
        if r.kind == "function":
            return self.bind(_helper(r.value), node)
        if r.kind == "builtin":
            # the registered operation, not the ``sl.<name>`` function it is published as
            return self.bind(r.value, node)
        if isinstance(node, ast.Attribute) and r.kind in ("const", "dtype", "load_like"):
            return self.bind(r.value, node)
        return None

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and node.id not in self.local:
            return self.resolved(node) or node
        return node

    def visit_Attribute(self, node):
        if isinstance(node.ctx, ast.Load):
            r = self.resolved(node)
            if r is not None:
                return r
        return self.generic_visit(node)

    def visit_IfExp(self, node):
        self.generic_visit(node)
        return _call(node, "_st_ifexp", [node.test, _thunk(node.body), _thunk(node.orelse)])

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        flag = ast.Constant(isinstance(node.op, ast.And))
        return _call(node, "_st_boolop", [flag] + [_thunk(v) for v in node.values])

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return _call(node, "_st_not", [node.operand])
        return node


def _call(node, name: str, args: list) -> ast.Call:
    return ast.copy_location(ast.Call(ast.Name(name, ast.Load()), args, []), node)


def _thunk(expr) -> ast.Lambda:
    no_args = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[],
                            kw_defaults=[], kwarg=None, defaults=[])
    return ast.copy_location(ast.Lambda(no_args, expr), expr)


def _helper(fn):
    """Calls of ``@st.function`` ``fn`` from a CPU-executed body."""
    def call(*args, **kwargs):
        return decay(executable(fn)(*args, **kwargs))
    call.__name__ = fn.name
    return call


def decay(v):
    """A value as a helper returns it: compile-time numbers become runtime scalars."""
    if isinstance(v, tuple):
        return tuple(decay(x) for x in v)
    if isinstance(v, (bool, int, float)):
        return scalar(v, arith.rule(S.weak_dtype, v))
    return v


def _runtime_value(v) -> bool:
    return isinstance(v, Tile)


def _ifexp(cond, then, other):
    if not _runtime_value(cond):
        return then() if cond else other()
    return decay(then() if bool(cond) else other())


def _boolop(is_and: bool, *thunks):
    # As Triton: compile-time operands short-circuit or drop out; runtime ones (bool
    # scalars) are all evaluated and combine logically.
    live, last = [], None
    for t in thunks:
        v = t()
        last = v
        if not _runtime_value(v):
            if bool(v) is not is_and:
                return v
            continue
        live.append(bool(v))
    if not live:
        return last
    return scalar(all(live) if is_and else any(live), _d.bool_)


def _not(v):
    if not _runtime_value(v):
        return not v
    return scalar(not bool(v), _d.bool_)


def _range(*bounds):
    vals = [raw(b) for b in bounds]
    d = arith.rule(S.range_dtype, [arith.dtype_of(v) for v in vals])
    ints = [int(v) for v in vals]
    start, stop, step = (0, ints[0], 1) if len(ints) == 1 else \
        (ints[0], ints[1], ints[2] if len(ints) > 2 else 1)
    if step == 0 or (len(vals) > 2 and isinstance(vals[2], torch.Tensor) and step < 0):
        raise ArgumentError(f"range() step {step}: a runtime step must be positive, a "
                            f"compile-time one nonzero")
    lo, hi = S.int_range(d)
    if max(start, stop) + abs(step) > hi + 1 or min(start, stop) - abs(step) < lo - 1:
        raise OutOfBoundsError(f"range({start}, {stop}, {step}): the st.{d.name} loop variable "
                               f"would pass its range (undefined on the GPU)")
    for i in range(start, stop, step):
        yield scalar(i, d)


def _extremum(name: str):
    def extremum(*args, **kwargs):
        if kwargs or len(args) < 2:
            raise ArgumentError(f"{name}() takes two or more values (no key=, no iterable)")
        if not any(_runtime_value(a) for a in args):
            return getattr(builtins, name)(*args)
        acc = args[0]
        for v in args[1:]:
            if not _runtime_value(acc) and not _runtime_value(v):
                acc = getattr(builtins, name)(acc, v)
            else:
                acc = Tile(arith.binary(name, raw(acc), raw(v)))
        return acc
    return extremum


def _abs(v):
    if not _runtime_value(v):
        return builtins.abs(v)
    return Tile(arith.absolute(v.t))


def _float(v):
    if _runtime_value(v):
        raise ArgumentError("float() converts compile-time values; convert a runtime value "
                            "with .astype(st.float32)")
    return builtins.float(v)


_RUNTIME = {"_st_ifexp": _ifexp, "_st_boolop": _boolop, "_st_not": _not, "range": _range,
            "min": _extremum("min"), "max": _extremum("max"), "abs": _abs, "float": _float}
