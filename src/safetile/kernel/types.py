"""The per-variant type check: every expression of a kernel typed under one semantics.

``lang/semantics.py`` states the rules; this walks a kernel body (and each ``@st.function``
helper per argument signature) for one variant (the dtypes, ranks, tile shapes and Const
values of a launch) and refuses what a rule refuses, or what Triton could not compile, as a
``KernelDefinitionError`` with file:line (rule ``type``). Both backends run it before a
launch moves anything, so the CPU executor and the GPU refuse the same kernels. The code
generator reads the types it recorded (``Typed.types``) to emit the stated semantics.

Control flow follows Triton's rules (``lang/semantics.py``, Names): a ``for`` body's names
and the loop variable are not defined after the loop; a runtime ``if`` defines a new name
only where both branches bind it with one type; runtime values keep their type through
branches and loops; a compile-time ``if`` types only the branch taken.
"""
from __future__ import annotations

import ast

from .. import dtypes as _d
from ..errors import KernelDefinitionError, SafetileError
from ..lang import semantics as S
from ..lang.diagnostics import TILE_AS_VALUE_HINT
from .typecalls import CallTyper
from .typeexprs import BINOPS, ExprTyper
from .typeptrs import PointerTyper
from .typevalues import V, bounds, const, leaves, merged, scalar, specials, unbounded

_MAX_DIM_BOUND = S.MAX_DIM


class Typed:
    """The types of one body: ``types`` (id(expr) -> V) and ``calls`` (id(call) -> the
    ``HelperInstance`` it calls)."""

    def __init__(self):
        self.types: dict = {}
        self.calls: dict = {}


class HelperInstance:
    """One ``@st.function`` helper typed for one argument signature."""

    def __init__(self, fn, key):
        self.fn, self.key = fn, key
        self.body = Typed()
        self.ret: V | None = None


class Program:
    """A variant's typing: the kernel body and every helper instance it reaches."""

    def __init__(self, one_axis: bool = False, tile_grid: bool = False):
        self.kernel = Typed()
        self.helpers: dict = {}            # (id(fn), signature) -> HelperInstance
        self.one_axis = one_axis           # a persistent launch: its programs on one axis
        self.tile_grid = tile_grid         # a launch over its Out grid: one program per tile


class _Spec:
    """What the check needs of one parameter of the variant."""

    __slots__ = ("name", "kind", "dtype", "rank", "tile", "value", "persistent")

    def __init__(self, a):
        self.name, self.kind, self.dtype, self.rank = a.name, a.kind, a.dtype, a.rank
        self.tile, self.value, self.persistent = a.tile, a.value, a.persistent


class BodyTyper(ExprTyper, CallTyper, PointerTyper):
    """Types one body (a kernel, or a helper for one signature)."""

    def __init__(self, src, scope, typed: Typed, program: Program, specs: dict, env: dict,
                 stack: tuple, persistent: bool):
        self.src, self.scope, self.typed, self.program = src, scope, typed, program
        self.specs, self.env, self.stack, self.persistent = specs, env, stack, persistent
        self.ret: V | None = None

    def fail(self, node, message: str) -> KernelDefinitionError:
        return self.src.error(node, "type", message)

    def record(self, node, v: V) -> None:
        self.typed.types[id(node)] = v

    def view_spec(self, name: str) -> _Spec:
        return self.specs[name]

    # -- names ---------------------------------------------------------------------------------
    def resolve_global(self, node) -> V:
        r = self.scope.resolve(node)
        if r is None or r.kind in ("local", "param"):
            raise self.fail(node, f"name '{node.id}' is not defined here (it is bound later, or "
                                  f"only inside a loop or one branch of an `if`)")
        return self.resolved(node, r)

    def resolved(self, node, r) -> V:
        if r.kind == "const":
            return const(r.value)
        if r.kind == "dtype":
            if not any(r.value is d for d in _d.ALL):
                raise self.fail(node, f"{r.value!r} is not one of safetile's dtypes")
            return V("dtype", value=r.value)
        if r.kind in ("builtin", "load_like", "function", "pybuiltin", "module"):
            return V("fn", value=r)
        raise self.fail(node, f"`{ast.unparse(node)}` cannot be used in a kernel")

    def t_Attribute(self, node) -> V:
        base = self.expr(node.value)
        if base.kind == "view":
            return self.view_attr(node, base)
        if base.kind == "fn" and base.value.kind == "module":
            r = self.scope.resolve(node)
            if r is None:
                raise self.fail(node, f"`{ast.unparse(node)}` does not exist")
            return self.resolved(node, r)
        if base.runtime:
            if node.attr == "T":
                return self.transposed(node, base)
            if node.attr == "shape":
                return V("tuple", value=tuple(const(d) for d in base.shape))
            if node.attr == "dtype":
                return V("dtype", value=base.dtype)
        raise self.fail(node, f"`{ast.unparse(node)}`: {base.describe()} has no attribute "
                              f"'{node.attr}'")

    def view_attr(self, node, view: V) -> V:
        vk = view.value[0]
        if vk == "In" and node.attr == "shape":
            s = self.specs[view.value[1]]
            return V("tuple", value=tuple(scalar(_d.int32, _MAX_DIM_BOUND, special=True)
                                          for _ in range(s.rank)))
        if vk in ("Out", "tile"):
            s = self.specs[view.value[2] if vk == "tile" else view.value[1]]
            if node.attr == "shape":
                return V("tuple", value=tuple(const(d) for d in s.tile))
            if node.attr == "index":
                if self.persistent and vk == "Out" and not self.in_tiles:
                    raise self.fail(node, f"Out '{s.name}' is a persistent partition: its tile "
                                          f"index exists only inside `for t in "
                                          f"{s.name}.tiles():`")
                return V("tuple", value=tuple(scalar(_d.int32, S.MAX_PROGRAMS - 1)
                                              for _ in s.tile))
        if vk == "sub" and node.attr == "shape":
            return V("tuple", value=tuple(const(d) for d in view.value[3]))
        raise self.fail(node, f"`{ast.unparse(node)}`: {view.describe()} has no attribute "
                              f"'{node.attr}'")

    in_tiles = False

    # -- helpers ---------------------------------------------------------------------------------
    def call_function(self, node, fn) -> V:
        params = [a.arg for a in fn._src.tree.args.args]
        args = [self.value(a, "a helper argument") for a in node.args]
        for k in node.keywords:
            if k.arg not in params or params.index(k.arg) < len(args):
                raise self.fail(node, f"helper '{fn.name}': bad keyword argument '{k.arg}'")
        kw = {k.arg: self.value(k.value, "a helper argument") for k in node.keywords}
        if len(args) + len(kw) != len(params):
            raise self.fail(node, f"helper '{fn.name}' takes {len(params)} arguments "
                                  f"({', '.join(params)}), got {len(args) + len(kw)}")
        for v in args + list(kw.values()):
            if v.kind in ("view", "fn"):
                raise self.fail(node, f"{v.describe()} cannot be passed to a helper")
        bound = dict(zip(params, args))
        bound.update(kw)
        vals = [bound[p] for p in params]
        key = (id(fn), tuple(v.signature() for v in vals))
        inst = self.program.helpers.get(key)
        if inst is None:
            if id(fn) in self.stack:
                raise self.fail(node, f"helper '{fn.name}' calls itself: recursion is not "
                                      f"supported on the GPU")
            inst = HelperInstance(fn, key)
            sub = BodyTyper(fn._src, fn._info.scope, inst.body, self.program, {},
                            dict(zip(params, vals)), self.stack + (id(fn),), False)
            body = fn._src.tree.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            sub.block(body)
            inst.ret = sub.ret
            self.program.helpers[key] = inst
        self.typed.calls[id(node)] = inst
        return inst.ret if inst.ret is not None else V("none")

    # -- statements ------------------------------------------------------------------------------
    def block(self, stmts) -> None:
        for s in stmts:
            if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and \
                    isinstance(s.value.value, str):
                continue
            try:
                self.stmt(s)
            except SafetileError:
                raise
            except Exception as e:             # a rule that could not handle this code
                raise self.src.error(s, "internal", f"the type check could not check this "
                                                    f"statement ({e!r}); please report it, "
                                                    f"and rewrite the statement meanwhile") from e

    def stmt(self, node) -> None:
        if isinstance(node, ast.Assign):
            if len(node.targets) > 1:
                raise self.fail(node, "one target per assignment (the GPU has no chained "
                                      "assignment): write `a = value`, then `b = a`")
            self.bind(node.targets[0], self.expr(node.value))
        elif isinstance(node, ast.AugAssign):
            if not isinstance(node.target, ast.Name):
                raise self.fail(node, f"cannot assign to `{ast.unparse(node.target)}`")
            cur = self.number(node.target, "an operand")
            v = self.binop(node, BINOPS[type(node.op)], cur, self.number(node.value, "an operand"))
            self.record(node, v)
            self.env[node.target.id] = v
        elif isinstance(node, ast.AnnAssign):
            self.bind(node.target, self.expr(node.value))
        elif isinstance(node, ast.Expr):
            self.expr(node.value)
        elif isinstance(node, ast.Return):
            self.ret = self.returned(node)
        elif isinstance(node, ast.If):
            self.if_stmt(node)
        elif isinstance(node, ast.For):
            self.for_stmt(node)
        elif not isinstance(node, ast.Pass):
            raise self.fail(node, f"`{type(node).__name__}` statements are not allowed")

    def returned(self, node) -> V:
        if node.value is None:
            return V("none")
        v = self.value(node.value, "a returned value")
        return self.decayed(node.value, v)

    def decayed(self, node, v: V) -> V:
        """A helper's result as Triton returns it: compile-time numbers become runtime."""
        if v.kind == "tuple":
            return V("tuple", value=tuple(self.decayed(node, x) for x in v.value))
        if v.kind == "const":
            return scalar(self.rule(node, S.weak_dtype, v.value))
        if not v.runtime:
            raise self.fail(node, f"a helper cannot return {v.describe()}")
        return v

    def bind(self, target, v: V) -> None:
        if v.kind == "tuple" and any(x.runtime for x in leaves(v)):
            # generated code builds such a tuple: each compile-time number in it becomes a value
            for x in leaves(v):
                if x.kind == "const":
                    self.rule(target, S.int64_check, x.value)
        if isinstance(target, ast.Name):
            module = v.kind == "fn" and v.value.kind == "module"
            if v.kind == "str" or module:
                what = "a module" if module else v.describe()
                raise self.fail(target, f"`{target.id} = ...` binds {what}: a local holds a "
                                        f"tile, a number, a dtype or a tuple of them")
            self.env[target.id] = v
            return
        if isinstance(target, ast.Tuple):
            if v.kind != "tuple" or len(v.value) != len(target.elts):
                raise self.fail(target, f"cannot unpack {v.describe()} into "
                                        f"{len(target.elts)} names")
            if any(not isinstance(t, ast.Name) for t in target.elts):
                raise self.fail(target, f"`{ast.unparse(target)} = ...`: unpack one level "
                                        f"into plain names (the GPU cannot unpack nested "
                                        f"tuples); unpack the inner tuple in a second step")
            for t, x in zip(target.elts, v.value):
                self.bind(t, x)
            return
        raise self.fail(target, f"cannot assign to `{ast.unparse(target)}`")

    def if_stmt(self, node) -> None:
        c = self.number(node.test, "a condition")
        if c.kind == "const":                    # compile-time: only the branch taken exists
            self.block(node.body if c.value else node.orelse)
            return
        if c.kind != "scalar":
            raise self.fail(node.test, f"an `if` takes a scalar condition, got {c.describe()}; "
                                       f"{TILE_AS_VALUE_HINT}")
        before = dict(self.env)
        self.block(node.body)
        then = self.env
        self.env = dict(before)
        self.block(node.orelse)
        other = self.env
        self.env = self.join(node, before, then, other)

    def join(self, node, before: dict, a: dict, b: dict) -> dict:
        out = {}
        for name in set(before) | set(a) | set(b):
            old, x, y = before.get(name), a.get(name), b.get(name)
            if old is not None and old.kind == "unbound":
                old = None
            if old is not None:
                for new in (x, y):
                    if new is old:
                        continue
                    if new.kind == "unbound":
                        continue
                    if old.kind == "view" and new.kind == "view":
                        continue
                    if not (old.runtime or old.kind == "tuple"):
                        raise self.fail(node, f"'{name}' holds {old.describe()} and is rebound "
                                              f"in a branch of this runtime `if`: bind a "
                                              f"runtime value before it (sl.full((), v, dtype))")
                    if not old.same_type(new):
                        raise self.fail(node, f"'{name}' is {old.describe()} before this `if` "
                                              f"and {new.describe()} in a branch; keep one type")
                if x.kind == "unbound" or y.kind == "unbound":
                    out[name] = x if x.kind == "unbound" else y
                else:
                    out[name] = old if x is old and y is old else merged(x, y)
                continue
            live = [v for v in (x, y) if v is not None and v.kind != "unbound"]
            if len(live) == 2:
                if x.kind == "view" or y.kind == "view":
                    out[name] = V("unbound", value=f"'{name}' names a view bound inside a "
                                                   f"branch of a runtime `if`: bind it before")
                    continue
                if not (x.runtime or x.kind == "tuple") or not x.same_type(y):
                    raise self.fail(node, f"'{name}' is bound in both branches of this runtime "
                                          f"`if` as {x.describe()} and {y.describe()}: runtime "
                                          f"values of one type are needed")
                out[name] = merged(x, y)
            elif x is not None and x.kind == "unbound" and (y is None or y.kind == "unbound"):
                out[name] = x
            else:
                out[name] = V("unbound", value=f"'{name}' is bound in only one branch of the "
                                               f"runtime `if` at line {self.src.line(node)}: "
                                               f"bind it in both, or before the `if`")
        return out

    def for_stmt(self, node) -> None:
        it = node.iter
        if isinstance(it.func, ast.Attribute) and it.func.attr == "tiles":
            view = self.expr(it.func.value)
            out = view.value[1]
            if it.args or it.keywords:
                raise self.fail(it, f"`{ast.unparse(it)}`: tiles() takes no arguments")
            if self.in_tiles:          # each program visits each of its tiles once
                raise self.fail(node, f"a `tiles()` loop inside another: write one `for t in "
                                      f"{out}.tiles():` loop and do each tile's work in its "
                                      f"body")
            inner = V("view", value=("tile", node.target.id, out))
            if not self.persistent:
                self.env[node.target.id] = inner
                outer, self.in_tiles = self.in_tiles, True
                self.block(node.body)
                self.in_tiles = outer
                return
            outer, self.in_tiles = self.in_tiles, True
            self.loop(node, inner)
            self.in_tiles = outer
            return
        bounds = [self.number(a, "a range() bound") for a in it.args]
        for b, a in zip(bounds, it.args):
            if b.kind == "tile":
                raise self.fail(a, f"range() bounds are scalars, got {b.describe()}")
        d = self.rule(node, S.range_dtype, [b.value if b.kind == "const" else b.dtype
                                            for b in bounds])
        start = bounds[0] if len(bounds) > 1 else const(0)
        stop = bounds[1] if len(bounds) > 1 else bounds[0]
        step = bounds[2] if len(bounds) > 2 else const(1)
        if step.kind == "const" and step.value == 0:
            raise self.fail(it.args[2], "range() step must not be zero")
        bound = stop.bound if start.bound is not None and step.kind == "const" and \
            step.value > 0 else None
        self.loop(node, scalar(d, bound))

    def loop(self, node, var: V) -> None:
        before = dict(self.env)
        name = node.target.id
        for attempt in range(len(before) + 2):
            # Another pass while a carried value's facts (bound, special) changed, so that the
            # body is typed for every iteration, not only the first. A bound that grows again
            # on a later pass is dropped (it has no fixed point), and ``special`` only goes
            # from True to False: the passes end.
            self.env = dict(before)
            self.env[name] = var
            self.block(node.body)
            changed = False
            for k, old in before.items():
                new = self.env.get(k, old)
                if k == name or new is old or old.kind in ("unbound", "view"):
                    continue
                if not (old.runtime or old.kind == "tuple"):
                    raise self.fail(node, f"'{k}' holds {old.describe()} and is rebound in this "
                                          f"loop: a loop-carried value must be a runtime value "
                                          f"(start from sl.zeros / sl.full)")
                if not old.same_type(new):
                    raise self.fail(node, f"'{k}' is {old.describe()} before this loop and "
                                          f"{new.describe()} after its body; keep one type "
                                          f"(convert with .astype, or start from sl.zeros)")
                general = merged(old, new)
                if attempt and bounds(general) != bounds(old):
                    general = unbounded(general)
                if bounds(general) != bounds(old) or specials(general) != specials(old):
                    before[k] = general
                    changed = True
            if not changed:
                break
        after = {}
        for k, old in before.items():
            if k != name:
                after[k] = old if old.kind in ("unbound", "view") else \
                    merged(old, self.env.get(k, old))
        for k in self.env:
            if k != name and (k not in before or before[k].kind == "unbound") and \
                    self.env[k].kind != "unbound":
                after[k] = V("unbound", value=f"'{k}' is bound inside the loop at line "
                                              f"{self.src.line(node)} and is not defined "
                                              f"after it: bind it before the loop")
        after[name] = V("unbound", value=f"'{name}' is the variable of the loop at line "
                                         f"{self.src.line(node)} and is not defined after it: "
                                         f"copy it to another name inside the loop")
        self.env = after


def check(kernel, key, cache: dict) -> Program:
    """Type ``kernel``'s body for the variant ``key`` (a ``VariantKey``), cached in ``cache``
    (``LaunchCache.programs``) by ``type_key``."""
    tkey = type_key(key)
    program = cache.get(tkey)
    if program is None:
        lead = next((a for a in key.args if a.kind == "Out"), None)
        program = Program(one_axis=bool(lead and lead.persistent),
                          tile_grid=bool(lead and not lead.persistent))
        specs, env = {}, {}
        for a in key.args:
            specs[a.name] = _Spec(a)
            if a.kind in ("In", "Out", "Ptr"):
                env[a.name] = V("view", value=(a.kind, a.name))
            elif a.kind == "Const":
                env[a.name] = V("dtype", value=a.value) if isinstance(a.value, _d.DType) \
                    else const(a.value)
            elif a.kind == "int":
                env[a.name] = scalar(_d.int32, special=True)
            else:
                env[a.name] = scalar(_d.float32)
        typer = BodyTyper(kernel._src, kernel._info.scope, program.kernel, program, specs, env,
                          (), bool(lead and lead.persistent))
        body = kernel._src.tree.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        typer.block(body)
        cache[tkey] = program
    return program


def type_key(key) -> tuple:
    """What typing depends on: each parameter's kind, dtype, rank, tile, persistence and
    Const value."""
    return tuple((a.kind, a.dtype, a.rank, a.tile, a.persistent,
                  type(a.value), repr(a.value)) for a in key.args)
