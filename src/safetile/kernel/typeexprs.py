"""Typing of kernel expressions: operators, compile-time folding and conditional values.

``ExprTyper`` is mixed into the statement walker of ``kernel/types.py``; calls (view
methods, ``safetile.lang`` operations, helpers) are typed in ``kernel/typecalls.py``. Every
refusal is a ``KernelDefinitionError`` naming file:line and the rule ``type``.
"""
from __future__ import annotations

import ast
import operator

from .. import dtypes as _d
from ..lang import semantics as S
from ..lang.diagnostics import BROADCAST_HINT, TILE_AS_VALUE_HINT
from .hints import TILE_ELEMENT_HINT
from .typevalues import V, bounded, const, merged, operand, runtime

BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
          ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|",
          ast.BitAnd: "&", ast.BitXor: "^", ast.MatMult: "@"}
CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_PY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
       "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "<<": operator.lshift,
       ">>": operator.rshift, "|": operator.or_, "&": operator.and_, "^": operator.xor,
       "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
       "==": operator.eq, "!=": operator.ne}


def broadcast(a: tuple, b: tuple):
    """The broadcast shape of two tile shapes (numpy's rule), or None if incompatible."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(out)


class ExprTyper:
    """Expression typing; the host class provides ``fail``, ``record``, ``env`` and calls."""

    def expr(self, node) -> V:
        m = getattr(self, "t_" + type(node).__name__, None)
        if m is None:
            raise self.fail(node, f"`{ast.unparse(node)}` is not part of the kernel language")
        v = m(node)
        self.record(node, v)
        return v

    def value(self, node, what: str = "a value") -> V:
        """``node`` typed, refusing what is not a value (views, functions, strings)."""
        v = self.expr(node)
        if v.kind in ("view", "fn", "str", "unbound", "none"):
            raise self.fail(node, f"`{ast.unparse(node)}` is {v.describe()}, not {what}")
        return v

    def number(self, node, what: str) -> V:
        """A runtime scalar/tile or a compile-time number."""
        v = self.value(node, what)
        if v.kind in ("dtype", "tuple"):
            hint = ("; a tuple (an index, a shape) takes no arithmetic: compute on its entries "
                    f"(`{ast.unparse(node)}[0] + 1`) and build a new tuple"
                    if v.kind == "tuple" else "")
            raise self.fail(node, f"`{ast.unparse(node)}` is {v.describe()}, not {what}{hint}")
        return v

    # -- leaves --------------------------------------------------------------------------------
    def t_Constant(self, node) -> V:
        v = node.value
        if v is None:
            return V("none")
        if isinstance(v, str):
            return V("str", value=v)
        if isinstance(v, (bool, int, float)):
            return const(v)
        raise self.fail(node, f"the constant {v!r} is not part of the kernel language")

    def t_Tuple(self, node) -> V:
        return V("tuple", value=tuple(self.expr(e) for e in node.elts))

    t_List = t_Tuple

    # -- operators -----------------------------------------------------------------------------
    def fold(self, node, op: str, a, b):
        """Python's ``a op b`` on compile-time values (as Triton folds constexprs)."""
        if op == "**" and isinstance(b, int) and abs(b) > 256 and abs(a) > 1:
            raise self.fail(node, f"compile-time power {a} ** {b} is too large")
        if op in ("<<", ">>") and isinstance(b, int) and b > 1024:
            raise self.fail(node, f"compile-time shift by {b} is too large")
        try:
            r = _PY[op](a, b)
        except (ZeroDivisionError, ValueError, TypeError, OverflowError) as e:
            raise self.fail(node, f"compile-time `{ast.unparse(node)}` fails: {e}") from None
        if isinstance(r, complex):              # (-8.0) ** 0.5: the language has no complex
            raise self.fail(node, f"compile-time `{ast.unparse(node)}` is complex ({r})")
        return r

    def t_BinOp(self, node) -> V:
        op = BINOPS[type(node.op)]
        a, b = self.number(node.left, "an operand"), self.number(node.right, "an operand")
        if op == "@":
            return self.matmul_value(node, a, b)
        if op == "**" and a.runtime:
            return self.power(node, a, b)
        return self.binop(node, op, a, b)

    def power(self, node, a: V, b: V) -> V:
        """``a ** n``: ``a * a * ... * a`` (``lang/semantics.py``), typed as that product."""
        n = b.value if b.kind == "const" else None
        if type(n) is not int or not 1 <= n <= S.MAX_POWER:
            got = f"the compile-time {n!r}" if b.kind == "const" else b.describe()
            raise self.fail(node, f"`{ast.unparse(node)}`: `**` on a runtime value takes a "
                                  f"compile-time int exponent from 1 to {S.MAX_POWER} (x ** 2 "
                                  f"is x * x), got {got}; for other powers use sl.sqrt, "
                                  f"sl.rsqrt or sl.exp2(y * sl.log2(x))")
        v = a
        for _ in range(n - 1):
            v = self.binop(node, "*", v, a)
        return v

    def binop(self, node, op: str, a: V, b: V) -> V:
        if a.kind == "const" and b.kind == "const":
            return const(self.fold(node, op, a.value, b.value))
        self.refuse_special(node, a, b)
        _, result = self.rule(node, S.binary, op, operand(a), operand(b))
        shape = self.broadcast(node, a, b)
        bound = _bound(op, a, b)
        special = all(x.special or x.kind == "const" for x in (a, b))
        return runtime(result, shape, bound, special and not shape)

    def refuse_special(self, node, *operands: V) -> None:
        """Refuse a value Triton may fold to a compile-time number (``V.special``) where
        that would promote differently: meeting an int8 or a half operand."""
        for x in operands:
            if not x.special:
                continue
            weak = 1 if not x.dtype.is_float else 0.5
            for y in operands:
                if y is x or not y.runtime or y.special:
                    continue
                try:
                    differs = S.computation_dtype(weak, y.dtype) is not \
                        S.computation_dtype(x.dtype, y.dtype)
                except S.SemanticsError:
                    differs = True
                if differs:
                    raise self.fail(node, f"`{ast.unparse(node)}`: a value computed from int "
                                          f"parameters or In shapes meets {y.describe()}; "
                                          f"convert one of them with .astype(...) first")

    def broadcast(self, node, *vals: V) -> tuple:
        shape: tuple = ()
        for v in vals:
            if v.kind == "tile":
                s = broadcast(shape, v.shape)
                if s is None:
                    raise self.fail(node, f"`{ast.unparse(node)}`: shapes {shape} and {v.shape} "
                                          f"do not broadcast; {BROADCAST_HINT}")
                shape = s
        return shape

    def rule(self, node, fn, *args):
        """Apply a rule of ``lang/semantics.py``; its refusal becomes a definition error."""
        try:
            return fn(*args)
        except S.SemanticsError as e:
            raise self.fail(node, f"`{ast.unparse(node)}`: {e}") from None

    def t_UnaryOp(self, node) -> V:
        v = self.number(node.operand, "an operand")
        op = {ast.USub: "-", ast.UAdd: "+", ast.Not: "not", ast.Invert: "~"}[type(node.op)]
        if v.kind == "const":
            try:
                return const({"-": operator.neg, "+": operator.pos, "not": operator.not_,
                              "~": operator.invert}[op](v.value))
            except TypeError as e:
                raise self.fail(node, f"compile-time `{ast.unparse(node)}` fails: {e}") from None
        if op == "not":
            self.need_bool_scalar(node.operand, v, "not")
            return runtime(_d.bool_, ())
        d = self.rule(node, S.unary, op, v.dtype)
        return runtime(d, v.shape, v.bound if op == "+" else None, v.special and op != "~")

    def need_bool_scalar(self, node, v: V, what: str) -> None:
        if v.kind != "scalar" or v.dtype is not _d.bool_:
            raise self.fail(node, f"`{what}` takes bool scalars (a comparison), got "
                                  f"{v.describe()}; combine tiles with & | ~")

    def t_BoolOp(self, node) -> V:
        # As Triton: compile-time operands short-circuit or drop out; the runtime ones (bool
        # scalars) combine logically.
        is_and = isinstance(node.op, ast.And)
        last, live = None, []
        for sub in node.values:
            v = self.number(sub, "an operand")
            last = v
            if v.kind == "const":
                if bool(v.value) is not is_and:
                    return v
                continue
            self.need_bool_scalar(sub, v, "and" if is_and else "or")
            live.append(v)
        return runtime(_d.bool_, ()) if live else last

    def t_Compare(self, node) -> V:
        if len(node.ops) != 1 or type(node.ops[0]) not in CMPOPS:
            raise self.fail(node, f"`{ast.unparse(node)}`: compare two values with one of "
                                  f"< <= > >= == != (no chains, `is` or `in`)")
        return self.binop(node, CMPOPS[type(node.ops[0])], self.number(node.left, "an operand"),
                          self.number(node.comparators[0], "an operand"))

    def t_IfExp(self, node) -> V:
        c = self.number(node.test, "a condition")
        if c.kind == "const":
            return self.value(node.body if c.value else node.orelse)
        if c.kind != "scalar":
            raise self.fail(node.test, f"a conditional expression takes a scalar condition, "
                                       f"got {c.describe()}; {TILE_AS_VALUE_HINT}")
        a, b = self.decay(node.body), self.decay(node.orelse)
        if not a.same_type(b):
            raise self.fail(node, f"`{ast.unparse(node)}`: the two values have different "
                                  f"types ({a.describe()} and {b.describe()}); convert one")
        return merged(a, b)

    def decay(self, node) -> V:
        """A value as a runtime one: compile-time numbers take their own type (int32, fp32,
        bool), as Triton makes them runtime values when it must."""
        v = self.number(node, "a value")
        if v.kind == "const":
            return runtime(self.rule(node, S.weak_dtype, v.value), ())
        return v

    # -- names, attributes, subscripts ------------------------------------------------------------
    def t_Name(self, node) -> V:
        v = self.env.get(node.id)
        if v is not None:
            if v.kind == "unbound":
                raise self.fail(node, v.value)
            return v
        return self.resolve_global(node)

    def t_Subscript(self, node) -> V:
        base = self.expr(node.value)
        if base.kind == "tuple":
            k = self.expr(node.slice)
            if k.kind != "const" or type(k.value) is not int:
                raise self.fail(node, f"`{ast.unparse(node)}`: index a tuple with a "
                                      f"compile-time int")
            try:
                return base.value[k.value]
            except IndexError:
                n, of = len(base.value), node.value
                axes = f", one per axis of '{ast.unparse(of.value)}'" if isinstance(
                    of, ast.Attribute) and of.attr in ("index", "shape") else ""
                raise self.fail(node, f"`{ast.unparse(node)}`: index {k.value} is out of "
                                      f"range: `{ast.unparse(of)}` has {n} "
                                      f"entr{'y' if n == 1 else 'ies'}{axes}") from None
        if not base.runtime:
            raise self.fail(node, f"`{ast.unparse(node)}`: {base.describe()} cannot be indexed")
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        shape, dims = [], list(base.shape)
        for p in parts:
            if isinstance(p, ast.Constant) and p.value is None:
                shape.append(1)
            elif isinstance(p, ast.Slice) and not (p.lower or p.upper or p.step):
                if not dims:
                    raise self.fail(node, f"`{ast.unparse(node)}`: more `:` than axes")
                shape.append(dims.pop(0))
            else:
                raise self.fail(node, f"`{ast.unparse(node)}`: tiles are indexed only with `:` "
                                      f"and None{TILE_ELEMENT_HINT}")
        return runtime(base.dtype, tuple(shape + dims), base.bound)

    # -- shared by calls -------------------------------------------------------------------------
    def static_shape(self, node, what: str, rank: int | None = None,
                     tuple_only: bool = False) -> tuple:
        """A compile-time tile shape: positive powers of two, at most 2**20 elements; a bare
        int is one axis, unless ``tuple_only`` (Triton's tl.full and tl.zeros take none)."""
        v = self.expr(node)
        if tuple_only and v.kind == "const":
            raise self.fail(node, f"{what} `{ast.unparse(node)}` must be a tuple: write "
                                  f"({ast.unparse(node)},)")
        vals = v.value if v.kind == "tuple" else (v,)
        if v.kind not in ("tuple", "const") or any(
                x.kind != "const" or isinstance(x.value, bool) or not isinstance(x.value, int)
                for x in vals):
            got = v.describe()
            if v.kind == "tuple" and isinstance(node, ast.Tuple) and len(node.elts) == len(vals):
                got = ", ".join(f"`{ast.unparse(e)}`, {x.describe()}"
                                for e, x in zip(node.elts, vals) if x.kind != "const")
            raise self.fail(node, f"{what} `{ast.unparse(node)}` must be compile-time ints "
                                  f"(literals, Const parameters, z.shape); got {got}"
                                  f"{self.runtime_param_hint(node)}")
        shape = tuple(x.value for x in vals)
        if rank is not None and len(shape) != rank:
            raise self.fail(node, f"{what} {shape} needs {rank} entries")
        self.check_shape(node, shape, what)
        return shape

    def runtime_param_hint(self, node) -> str:
        """Names the runtime `int` parameters a shape uses: Triton's `BLOCK: tl.constexpr`
        is `BLOCK: st.Const[int]` here, while a plain `int` is a runtime int32."""
        params = getattr(self.scope, "params", {})
        names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)
                        and n.id in params and params[n.id].kind == "int"})
        if not names:
            return ""
        decl = ", ".join(f"{n}: st.Const[int]" for n in names)
        one = len(names) == 1
        return (f"; {', '.join(repr(n) for n in names)} "
                f"{'is a runtime int parameter' if one else 'are runtime int parameters'}, "
                f"known only when the program runs: declare {'it' if one else 'them'} "
                f"`{decl}` (Triton's tl.constexpr) to size a tile")

    def check_shape(self, node, shape: tuple, what: str) -> None:
        n = 1
        for d in shape:
            if d < 1 or d & (d - 1):
                raise self.fail(node, f"{what} {shape}: tile sizes must be powers of two (the "
                                      f"GPU builds tiles from tl.arange); pad and mask")
            n *= d
        if n > S.MAX_TILE_ELEMENTS:
            raise self.fail(node, f"{what} {shape} has {n} elements, over Triton's limit of "
                                  f"{S.MAX_TILE_ELEMENTS} per tile")

    def index(self, node, rank: int, what: str) -> list:
        """An index of ``rank`` ints (compile-time or runtime scalars)."""
        v = self.expr(node)
        vals = list(v.value) if v.kind == "tuple" else [v]
        if len(vals) != rank:
            raise self.fail(node, f"{what} `{ast.unparse(node)}` needs {rank} entries, got "
                                  f"{len(vals)}")
        for x in vals:
            # An int8 entry is refused: generated code multiplies an entry by the tile size in
            # the entry's own type, where int8 would wrap past every mask.
            ok = (x.kind == "const" and isinstance(x.value, int) and not isinstance(x.value, bool)
                  and -2**31 <= x.value < 2**31) or \
                 (x.kind == "scalar" and x.dtype in (_d.int32, _d.int64))
            if not ok:
                hint = "; convert it with .astype(st.int32)" if x.runtime and \
                    x.dtype == _d.int8 else ""
                raise self.fail(node, f"{what} `{ast.unparse(node)}`: each entry must be an "
                                      f"int32 or int64 scalar (int32 range for compile-time "
                                      f"values), got {x.describe()}{hint}")
        return vals

    def tile_index(self, node, vals: list, box: tuple, what: str) -> None:
        """Check a tile-grid index (``index``'s entries) for tiles of shape ``box``."""
        for x, t in zip(vals, box):
            # A compile-time tile index is multiplied by the tile size at compile time; past
            # int32 the box lies wholly outside every tensor (MAX_DIM), so it would only read
            # padding, and the generated code has no int32 product to build it from.
            if x.kind == "const" and abs(x.value) > 2**31 // t - 1:
                raise self.fail(node, f"{what} `{ast.unparse(node)}`: the box of tile index "
                                      f"{x.value} with size {t} lies past the int32 range, "
                                      f"wholly outside every tensor, where a load reads only "
                                      f"padding: build that tile with sl.full(shape, padding, "
                                      f"dtype)")
            # Python habits read `x.load(-1, ...)` as the last tile; a tile index counts from
            # the tensor's start, so a negative compile-time one only ever reads padding.
            if x.kind == "const" and x.value < 0:
                raise self.fail(node, f"{what} `{ast.unparse(node)}`: tile index {x.value} "
                                      f"lies before the tensor's start, where a load reads "
                                      f"only padding; tile indices do not count from the end: "
                                      f"the last tile along axis a is "
                                      f"sl.cdiv(x.shape[a], size) - 1")

    def padding(self, node, dtype) -> None:
        if node is None:
            return
        v = self.expr(node)
        if v.kind != "const":
            raise self.fail(node, "padding must be a compile-time number (a literal or a Const)")
        self.rule(node, S.representable, v.value, dtype, "padding of")


def _bound(op: str, a: V, b: V) -> int | None:
    """What is known of ``a op b`` lying in ``[0, bound]`` (no wrap possible)."""
    if a.bound is None or b.bound is None:
        return None
    if op == "+":
        return bounded(a.bound + b.bound)
    if op == "*":
        return bounded(a.bound * b.bound)
    if op == "//" and b.kind == "const" and b.value > 0:
        return a.bound // b.value
    if op == "%" and b.kind == "const" and b.value > 0:
        return min(a.bound, b.value - 1)
    if op in ("&",):
        return min(a.bound, b.bound)
    return None


