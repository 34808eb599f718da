"""Typing of calls: view methods, ``safetile.lang`` operations, Python builtins, ``astype``.

Mixed into the statement walker of ``kernel/types.py`` (which types ``@st.function`` calls).
The rules are those of ``lang/semantics.py``; shapes follow Triton's (compile-time, powers
of two, at most 2**20 elements).
"""
from __future__ import annotations

import ast
import inspect
import math

from .. import dtypes as _d
from ..dtypes import DType
from ..lang import semantics as S
from ..lang.views import InView, OutView, SubTiles
from .hints import positional_message
from .typevalues import V, bounded, const, operand, runtime, scalar, tile

_MATH = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid")
_FLOAT_NAMES = {"inf": math.inf, "-inf": -math.inf, "+inf": math.inf, "nan": math.nan,
                "infinity": math.inf, "-infinity": -math.inf}

# The keyword arguments each operation takes (both backends pass them by these names).
_KEYWORDS = {"sum": ("axis",), "max": ("axis",), "min": ("axis",), "argmax": ("axis",),
             "argmin": ("axis",), "full": ("dtype",), "zeros": ("dtype",),
             "load_ptr": ("mask", "other"), "store_ptr": ("mask",), "atomic_add": ("mask",)}
_VIEWS = {"In": InView, "Out": OutView, "tile": OutView, "sub": SubTiles}


def _kw(node, name):
    for k in node.keywords:
        if k.arg == name:
            return k.value
    return None


def _arg(node, i: int, name: str):
    """Argument ``i`` (or keyword ``name``) of a call, or None."""
    return node.args[i] if len(node.args) > i else _kw(node, name)


class CallTyper:
    """Call typing; the host class provides the expression typing and ``call_function``."""

    def t_Call(self, node) -> V:
        f = node.func
        if isinstance(f, ast.Attribute):
            base = self.expr(f.value)
            if base.kind == "view":
                return self.view_call(node, base, f.attr)
            if base.kind == "fn" and base.value.kind == "module":
                return self.callee(node, self.expr(f))
            if f.attr == "astype":
                if len(node.args) != 1 or node.keywords:
                    raise self.fail(node, f"`{ast.unparse(node)}`: astype takes one dtype")
                return self.astype(node, base)
            raise self.fail(node, f"`{ast.unparse(f)}(...)` is not a kernel operation")
        return self.callee(node, self.expr(f))

    def callee(self, node, fn: V) -> V:
        if fn.kind != "fn":
            raise self.fail(node, f"`{ast.unparse(node.func)}` is {fn.describe()}, not callable")
        r = fn.value
        if r.kind == "builtin":
            self.arguments(node, r.value.__wrapped__, f"sl.{r.value.name}",
                           _KEYWORDS.get(r.value.name, ()))
            return getattr(self, "op_" + r.value.name)(node)
        if r.kind == "load_like":
            return self.load_like(node)
        if r.kind == "function":
            return self.call_function(node, r.value)
        if r.kind == "pybuiltin":
            return getattr(self, "py_" + r.value)(node)
        raise self.fail(node, f"`{ast.unparse(node.func)}` cannot be called in a kernel")

    def arguments(self, node, fn, what: str, keywords) -> None:
        """Check a call's arguments against ``fn``'s signature (``keywords``: by name)."""
        sig = inspect.Signature([p.replace(annotation=p.empty) for p in
                                 inspect.signature(fn).parameters.values() if p.name != "self"])
        for k in node.keywords:
            if k.arg not in sig.parameters:
                raise self.fail(node, f"`{ast.unparse(node)}`: {what}{sig} has no parameter "
                                      f"`{k.arg or '**'}`")
            if k.arg not in keywords:
                raise self.fail(node, positional_message(node, what, sig, k.arg, keywords))
        try:
            sig.bind(*node.args, **{k.arg: k.value for k in node.keywords})
        except TypeError as e:
            raise self.fail(node, f"`{ast.unparse(node)}`: {what}{sig}: {e}") from None

    # -- views -----------------------------------------------------------------------------------
    def view_call(self, node, view: V, method: str) -> V:
        vk, name = view.value[0], view.value[1]
        cls = _VIEWS.get(vk)
        if cls is not None and method in vars(cls):
            names = tuple(inspect.signature(getattr(cls, method)).parameters)[1:]   # no self
            self.arguments(node, getattr(cls, method), f"{name}.{method}",
                           names if vk == "In" else ())
        if vk == "In":
            spec = self.view_spec(name)
            rank = spec.rank
            if method in ("load", "load_at"):
                idx = _arg(node, 0, "index" if method == "load" else "offset")
                shape = self.static_shape(_arg(node, 1, "shape"), f"{method} shape", rank)
                vals = self.index(idx, rank, f"{method} of '{name}': the index")
                if method == "load":
                    self.tile_index(idx, vals, shape, f"load of '{name}': the index")
                self.padding(_arg(node, 2, "padding"), spec.dtype)
                return tile(spec.dtype, shape)
            if method == "load_scalar":
                self.index(_arg(node, 0, "index"), rank, f"load_scalar of '{name}': the index")
                self.padding(_arg(node, 1, "padding"), spec.dtype)
                return scalar(spec.dtype)
            if method == "prefetch":
                idx, what = _arg(node, 0, "index"), f"prefetch of '{name}': the index"
                vals = self.index(idx, rank, what)
                shape = self.static_shape(_arg(node, 1, "shape"), "prefetch shape", rank)
                self.tile_index(idx, vals, shape, what)
                return V("none")
        out = self.view_spec(view.value[2] if vk in ("sub", "tile") else name)
        if vk in ("Out", "sub") and method != "partition":
            self.owned_tile_reachable(node, out.name)
        if vk in ("Out", "tile"):
            if method == "load":
                return tile(out.dtype, out.tile)
            if method == "store":
                self.store_value(node.args[0], out.dtype, out.tile,
                                 f"the owned tile of Out '{out.name}'")
                return V("none")
            if method == "partition":
                shape = self.static_shape(node.args[0], "sub-tile shape", len(out.tile))
                return V("view", value=("sub", f"{out.name}.partition", out.name, shape))
        if vk == "sub":
            shape = view.value[3]
            if method == "store":
                self.sub_index(node.args[1], shape, out.tile)
                self.store_value(node.args[0], out.dtype, shape, f"a sub-tile of Out '{out.name}'")
                return V("none")
            if method == "load":
                self.sub_index(node.args[0], shape, out.tile)
                return tile(out.dtype, shape)
        raise self.fail(node, f"`{ast.unparse(node.func)}` is not a method of {view.describe()}")

    def sub_index(self, node, shape: tuple, owned: tuple) -> None:
        """A sub-tile index; a compile-time entry outside the slab's sub-grid is refused (the
        CPU executor would refuse it as it runs, the GPU mask it off)."""
        vals = self.index(node, len(shape), "the sub-tile index")
        grid = tuple(-(-t // r) for t, r in zip(owned, shape))
        for x, g in zip(vals, grid):
            if x.kind == "const" and not 0 <= x.value < g:
                raise self.fail(node, f"the sub-tile index `{ast.unparse(node)}`: entry "
                                      f"{x.value} is outside the owned slab's sub-grid {grid} "
                                      f"(tile {owned}, sub-tile {shape})")

    def store_value(self, node, dtype: DType, shape: tuple, region: str) -> None:
        v = self.number(node, "the stored value")
        self.rule(node, S.store_check, operand(v), dtype)
        if v.kind == "tile" and (len(v.shape) != len(shape) or
                                 any(a != b and a != 1 for a, b in zip(v.shape, shape))):
            raise self.fail(node, f"`{ast.unparse(node)}`: a tile of shape {v.shape} cannot "
                                  f"be stored into {region}, of shape {shape} (same rank, "
                                  f"size-1 axes stretch)")

    def owned_tile_reachable(self, node, out: str) -> None:
        """Refuse Out ``out``'s owned tile outside ``for t in out.tiles():`` of a persistent
        partition: the code generator has no tile coordinates there."""
        if self.persistent and not self.in_tiles:
            raise self.fail(node, f"`{ast.unparse(node)}`: Out '{out}' is a persistent "
                                  f"partition: its owned tiles exist only inside `for t in "
                                  f"{out}.tiles():`; move the access into that loop")

    def load_like(self, node) -> V:
        x, z = (self.expr(a) for a in node.args)
        if z.value[0] == "Out":
            self.owned_tile_reachable(node, z.value[1])
        xs, zs = self.view_spec(x.value[1]), self.view_spec(
            z.value[2] if z.value[0] == "tile" else z.value[1])
        if xs.rank != len(zs.tile):
            raise self.fail(node, f"sl.load_like: In '{xs.name}' has rank {xs.rank}, Out "
                                  f"'{zs.name}' rank {len(zs.tile)}")
        return tile(xs.dtype, zs.tile)

    # -- tile values -----------------------------------------------------------------------------
    def astype(self, node, base: V) -> V:
        if not base.runtime:
            raise self.fail(node, f"`.astype` converts runtime values, got {base.describe()}")
        d = self.dtype_arg(node.args[0] if node.args else None, node)
        return runtime(d, base.shape, None, False)

    def dtype_arg(self, n, node) -> DType:
        v = self.expr(n) if n is not None else None
        if v is None or v.kind != "dtype":
            raise self.fail(node, f"`{ast.unparse(node)}`: expected a dtype (st.float32, ...)")
        return v.value

    def runtime_arg(self, node, n, what: str) -> V:
        v = self.number(n, what)
        if v.kind == "const":
            raise self.fail(n, f"{what} `{ast.unparse(n)}` is a compile-time value: compute it "
                               f"on the host (math.*), or build a tile with sl.full")
        return v

    def axis(self, node, n, rank: int, required: bool):
        if n is None or (isinstance(n, ast.Constant) and n.value is None):
            if required:
                raise self.fail(node, f"`{ast.unparse(node)}` needs an axis")
            self.expr(n) if n is not None else None
            return None
        v = self.expr(n)
        if v.kind != "const" or type(v.value) is not int or not -rank <= v.value < rank:
            raise self.fail(n, f"the axis must be a compile-time int in [{-rank}, {rank}), got "
                               f"{v.describe()}")
        return v.value % rank

    # -- safetile.lang ---------------------------------------------------------------------------
    def op_where(self, node) -> V:
        c = self.number(node.args[0], "the condition")
        if (c.dtype is not _d.bool_ if c.runtime else type(c.value) is not bool):
            raise self.fail(node, f"sl.where's condition is {c.describe()}: it takes a bool "
                                  f"condition; compare first (`c != 0`)")
        a, b = self.number(node.args[1], "a value"), self.number(node.args[2], "a value")
        self.refuse_special(node, a, b)
        d = self.rule(node, S.where_dtype, operand(a), operand(b))
        return runtime(d, self.broadcast(node, c, a, b))

    def math(self, node, name: str) -> V:
        v = self.runtime_arg(node, node.args[0], f"sl.{name}'s argument")
        return runtime(self.rule(node, S.math_dtype, name, v.dtype), v.shape)

    def op_abs(self, node) -> V:
        v = self.runtime_arg(node, node.args[0], "sl.abs's argument")
        return runtime(self.rule(node, S.unary, "abs", v.dtype), v.shape)

    def extremum(self, node, op: str, a: V, b: V) -> V:
        self.refuse_special(node, a, b)
        _, d = self.rule(node, S.binary, op, operand(a), operand(b))
        bound = max(a.bound, b.bound) if a.bound is not None and b.bound is not None else None
        return runtime(d, self.broadcast(node, a, b), bound)

    def op_maximum(self, node) -> V:
        a, b = (self.number(x, "an operand") for x in node.args[:2])
        if a.kind == "const" and b.kind == "const":
            raise self.fail(node, "sl.maximum of two compile-time values: use max(a, b)")
        return self.extremum(node, "max", a, b)

    def op_minimum(self, node) -> V:
        a, b = (self.number(x, "an operand") for x in node.args[:2])
        if a.kind == "const" and b.kind == "const":
            raise self.fail(node, "sl.minimum of two compile-time values: use min(a, b)")
        return self.extremum(node, "min", a, b)

    def reduction(self, node, name: str, axis_required: bool) -> V:
        t = self.runtime_arg(node, node.args[0], f"sl.{name}'s argument")
        if t.kind != "tile":
            raise self.fail(node, f"sl.{name} reduces a tile, got {t.describe()}")
        ax = self.axis(node, _arg(node, 1, "axis"), len(t.shape), axis_required)
        d = self.rule(node, S.reduction_dtype, name, t.dtype)
        shape = () if ax is None else t.shape[:ax] + t.shape[ax + 1:]
        bound = t.shape[ax] - 1 if name in ("argmax", "argmin") else None
        return runtime(d, shape, bound)

    def op_sum(self, node) -> V:
        return self.reduction(node, "sum", False)

    def op_max(self, node) -> V:
        return self.reduction(node, "max", False)

    def op_min(self, node) -> V:
        return self.reduction(node, "min", False)

    def op_argmax(self, node) -> V:
        return self.reduction(node, "argmax", True)

    def op_argmin(self, node) -> V:
        return self.reduction(node, "argmin", True)

    def matmul_value(self, node, a: V, b: V, acc: V | None = None) -> V:
        for v, n in ((a, "a"), (b, "b")):
            if v.kind != "tile" or len(v.shape) != 2:
                raise self.fail(node, f"sl.mma / matmul: {n} must be a 2-D tile, got "
                                      f"{v.describe()}")
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2:
            raise self.fail(node, f"sl.mma / matmul: shapes {a.shape} and {b.shape} do not "
                                  f"multiply")
        if acc is not None and (acc.kind != "tile" or acc.shape != (m, n)):
            raise self.fail(node, f"sl.mma: the accumulator must be a ({m}, {n}) tile, got "
                                  f"{acc.describe()}")
        d = self.rule(node, S.mma_check, a.dtype, b.dtype, acc.dtype if acc else None, k)
        return tile(d, (m, n))

    def op_mma(self, node) -> V:
        a, b, acc = (self.number(x, "an operand") for x in node.args[:3])
        return self.matmul_value(node, a, b, acc)

    def op_matmul(self, node) -> V:
        a, b = (self.number(x, "an operand") for x in node.args[:2])
        return self.matmul_value(node, a, b)

    def op_reshape(self, node) -> V:
        t = self.runtime_arg(node, node.args[0], "sl.reshape's argument")
        shape = self.static_shape(node.args[1], "reshape shape")
        if not t.shape:
            raise self.fail(node, f"sl.reshape of a scalar: use sl.broadcast_to(s, {shape})")
        if math.prod(shape) != math.prod(t.shape):
            raise self.fail(node, f"sl.reshape: {t.shape} and {shape} have different sizes")
        return tile(t.dtype, shape)

    def op_broadcast_to(self, node) -> V:
        t = self.runtime_arg(node, node.args[0], "sl.broadcast_to's argument")
        shape = self.static_shape(node.args[1], "broadcast shape")
        if t.shape and len(t.shape) != len(shape) or self.broadcast(
                node, t, tile(t.dtype, shape)) != shape:
            raise self.fail(node, f"sl.broadcast_to: {t.shape} does not broadcast to {shape} "
                                  f"(a tile keeps its rank: t[None, :] adds an axis)")
        return tile(t.dtype, shape)

    def op_permute(self, node) -> V:
        t = self.runtime_arg(node, node.args[0], "sl.permute's argument")
        dims = self.expr(node.args[1])
        vals = tuple(x.value for x in dims.value) if dims.kind == "tuple" and all(
            x.kind == "const" and type(x.value) is int for x in dims.value) else None
        if vals is None or sorted(vals) != list(range(len(t.shape))):
            raise self.fail(node, f"sl.permute: dims must be a compile-time permutation of "
                                  f"{tuple(range(len(t.shape)))}")
        return tile(t.dtype, tuple(t.shape[d] for d in vals))

    def op_transpose(self, node) -> V:
        t = self.runtime_arg(node, node.args[0], "sl.transpose's argument")
        return self.transposed(node, t)

    def transposed(self, node, t: V) -> V:
        if t.kind != "tile" or len(t.shape) != 2:
            raise self.fail(node, f"a transpose needs a 2-D tile, got {t.describe()}")
        return tile(t.dtype, t.shape[::-1])

    def op_arange(self, node) -> V:
        if self.expr(node.args[0]).kind != "const":
            raise self.fail(node, f"`{ast.unparse(node)}`: sl.arange takes one compile-time "
                                  f"int, its size{self.runtime_param_hint(node.args[0])}")
        (n,) = self.static_shape(node.args[0], "sl.arange size", 1)
        return tile(_d.int32, (n,), n - 1)

    def op_full(self, node) -> V:
        shape = self.static_shape(node.args[0], "sl.full shape", tuple_only=True)
        d = self.dtype_arg(node.args[2] if len(node.args) > 2 else _kw(node, "dtype"), node)
        v = self.number(_arg(node, 1, "value"), "the fill value")
        if v.kind == "const":
            self.rule(node, S.representable, v.value, d, "the fill value of")
        elif v.kind != "scalar":
            raise self.fail(node, f"sl.full fills with a scalar, got {v.describe()}")
        return runtime(d, shape)

    def op_zeros(self, node) -> V:
        shape = self.static_shape(node.args[0], "sl.zeros shape", tuple_only=True)
        return runtime(self.dtype_arg(_arg(node, 1, "dtype"), node), shape)

    def program_axis(self, node) -> None:
        v = self.expr(node.args[0]) if node.args else None
        if v is None or v.kind != "const" or v.value not in (0, 1, 2) or \
                type(v.value) is not int:
            raise self.fail(node, "the launch axis must be 0, 1 or 2")
        if v.value and self.program.one_axis:
            raise self.fail(node, f"a persistent launch runs its programs on one axis (each "
                                  f"iterating over tiles), so axis {v.value} has one program: "
                                  f"use t.index[k] for a tile's coordinates")
        if self.stack and self.program.tile_grid:
            raise self.fail(node, "inside an @st.function helper, the program's tile is not "
                                  "known: pass z.index[k] (or sl.bid(k)) to the helper from "
                                  "the kernel")

    def op_bid(self, node) -> V:
        self.program_axis(node)
        return scalar(_d.int32, bound=S.MAX_PROGRAMS - 1)

    def op_num_blocks(self, node) -> V:
        self.program_axis(node)
        # over an Out grid, computed from Out shapes, which Triton may fold (``V.special``)
        return scalar(_d.int32, bound=S.MAX_PROGRAMS, special=self.program.tile_grid)

    def op_cdiv(self, node) -> V:
        a, b = (self.number(x, "an operand") for x in node.args[:2])
        for v, x in ((a, node.args[0]), (b, node.args[1])):
            if v.kind == "const" and (isinstance(v.value, bool) or not isinstance(v.value, int)):
                raise self.fail(x, "sl.cdiv takes ints")
            if v.runtime and (v.dtype.is_float or v.dtype is _d.bool_):
                raise self.fail(x, f"sl.cdiv takes ints, got {v.describe()}")
        if a.kind == "const" and b.kind == "const":
            if b.value == 0:
                raise self.fail(node, "compile-time sl.cdiv by zero")
            return const(-(-a.value // b.value))
        q = self.binop(node, "//", a, b)
        if q.bound is not None:                    # the ceiling may be one above the floor
            q.bound = bounded(q.bound + 1)
        return q

    # -- Python builtins -------------------------------------------------------------------------
    def py_float(self, node) -> V:
        if len(node.args) != 1 or node.keywords:
            raise self.fail(node, "float() takes one compile-time value")
        v = self.expr(node.args[0])
        if v.kind == "str" and v.value.strip().lower() in _FLOAT_NAMES:
            return const(_FLOAT_NAMES[v.value.strip().lower()])
        if v.kind == "const":
            return const(float(v.value))
        raise self.fail(node, f"`{ast.unparse(node)}`: float() converts compile-time values "
                              f"(or 'inf', '-inf', 'nan'); convert a runtime value with "
                              f".astype(st.float32)")

    def py_abs(self, node) -> V:
        if len(node.args) != 1 or node.keywords:
            raise self.fail(node, "abs() takes one value")
        v = self.number(node.args[0], "abs()'s argument")
        if v.kind == "const":
            return const(abs(v.value))
        return runtime(self.rule(node, S.unary, "abs", v.dtype), v.shape)

    def extrema(self, node, name: str) -> V:
        if len(node.args) < 2 or node.keywords:
            raise self.fail(node, f"{name}() takes two or more values (no key=, no iterable); "
                                  f"the {'smallest' if name == 'min' else 'largest'} element "
                                  f"of a tile is sl.{name}(t, axis)")
        vals = [self.number(a, f"{name}()'s argument") for a in node.args]
        if all(v.kind == "const" for v in vals):
            try:
                return const((min if name == "min" else max)(v.value for v in vals))
            except TypeError as e:
                raise self.fail(node, f"compile-time {name}() fails: {e}") from None
        acc = vals[0]
        for v in vals[1:]:
            if acc.kind == "const" and v.kind == "const":
                acc = const((min if name == "min" else max)(acc.value, v.value))
            else:
                acc = self.extremum(node, name, acc, v)
        return acc

    def py_min(self, node) -> V:
        return self.extrema(node, "min")

    def py_max(self, node) -> V:
        return self.extrema(node, "max")

    def py_range(self, node) -> V:
        raise self.fail(node, "range() is only the iterable of a `for` loop")


for _name in _MATH:
    setattr(CallTyper, "op_" + _name, lambda self, node, _n=_name: self.math(node, _n))

