"""Definition-time rules of kernel bodies: every violation is a ``KernelDefinitionError``.

Rules (the ``rule`` tag each error carries):
- ``in-read-only``: no store through an ``In`` parameter.
- ``free-index-store``: stores go through an ``Out`` (``z.store(tile)``) or a sub-partition of
  one (``z.partition(s).store(tile, sub_index)``); never ``z[i] = ...`` or ``z.store(t, index)``.
- ``param-assignment`` / ``view-rebinding``: parameters are not assigned to; a view name
  (a sub-partition, a ``tiles()`` loop variable) is bound exactly once.
- ``ptr-needs-unsafe`` / ``atomic-needs-unsafe`` / ``unsafe-op``: raw pointers, atomics and
  pointer operations only in ``@st.kernel(unsafe=True)``.
- ``prefetch``: ``x.prefetch(index, shape)`` only on ``In`` views, as a statement of its own
  (an L2 hint that delivers no value, so it cannot observe data; see ``lang``).
- ``call``: only ``safetile.lang`` operations, view methods, ``@st.function`` helpers (never
  recursively) and ``range min max abs float`` may be called.
- ``no-out``: a safe kernel declares at least one ``Out`` (its grid is the launch grid).
- ``expression`` / ``tile-slice``: no lambdas, comprehensions, ``:=``, f-strings, dicts, sets,
  chained comparisons, ``is`` or ``in``; tiles are indexed only with ``:`` and ``None``.
- ``statement`` / ``name``: only assignments, expressions, ``for ... in range(...)``, ``if`` and
  ``pass`` (and, in functions, one ``return`` as the last statement); a store is a statement
  of its own; a sub-partition is bound to one name or used inline (``.store``, ``.shape``);
  parameters take no defaults; every name must resolve; names generated code uses (``tl``,
  ``triton``, ``libdevice``, ``float``, ``range``, ``_st_*``, ``_stf_*``) are not bound.
- ``internal``: a rule failed on unforeseen code (still an error naming file:line; report it).

What depends on the argument types (promotion, shapes, control flow of runtime values) is
checked per variant, at launch, by ``kernel/types.py`` (rule ``type``).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ..errors import KernelDefinitionError
from ..lang.views import (IN_ATTRS, IN_METHODS, OUT_ATTRS, OUT_METHODS, SUB_ATTRS,  # noqa: F401
                          SUB_METHODS, inline_partition, kind_of)
from . import hints
from .signature import check_signature, reserved, reserved_message
from .source import KernelSource, Scope, assigned_names

ALLOWED_EXPRESSIONS = (ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.IfExp, ast.Compare, ast.Call,
                       ast.Constant, ast.Attribute, ast.Subscript, ast.Name, ast.Tuple, ast.List,
                       ast.Slice)
TILE_METHODS = {"astype"}
TILE_ATTRS = {"T", "shape", "dtype"}


@dataclass
class BodyInfo:
    """What the checker learned about a body, reused by the code generator."""

    scope: Scope
    views: dict = field(default_factory=dict)       # local name -> ("sub"|"tile", out param)
    functions: list = field(default_factory=list)   # @st.function helpers called


class BodyChecker(ast.NodeVisitor):
    """Walks one kernel or function body and enforces the rules above."""

    def __init__(self, src: KernelSource, params: dict, unsafe: bool, is_function: bool):
        self.src, self.params, self.unsafe, self.is_function = src, params, unsafe, is_function
        local_names = assigned_names(src.tree)
        if is_function:
            local_names |= {a.arg for a in src.tree.args.args}
        self.info = BodyInfo(Scope(src.fn, params, local_names))
        self.statement_call = None          # the call an expression statement consists of

    # -- helpers -------------------------------------------------------------------------------
    def fail(self, node, rule, message):
        raise self.src.error(node, rule, message)

    def undefined(self, node, name: str):
        if self.is_function and name == self.src.tree.name:   # not bound while it is checked
            self.fail(node, "call", f"helper '{name}' calls itself: recursion is not supported")
        self.fail(node, "name", hints.undefined_message(name))

    def kind_of(self, node):
        """'In'/'Out'/'Ptr'/... for a parameter, 'sub'/'tile' for views, else None."""
        return kind_of(node, self.params, self.info.views)

    def check(self) -> BodyInfo:
        """Check the body; any refusal, even an unforeseen rule failure, names file:line."""
        self.current = self.src.tree
        try:
            return self._check()
        except KernelDefinitionError:
            raise
        except Exception as e:                 # a rule that could not handle this code
            raise self.src.error(self.current, "internal",
                                 f"the checker could not check this statement ({e!r}); "
                                 f"please report it, and rewrite the statement meanwhile") from e

    def _check(self) -> BodyInfo:
        tree = self.src.tree
        check_signature(self.src, self.is_function)
        self.collect_views(tree)
        self.view_uses = self.allowed_view_uses(tree)
        body = tree.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]                                    # docstring
        for stmt in body:
            self.current = stmt
            self.visit(stmt)
        return self.info

    def allowed_view_uses(self, tree) -> set:
        """ids of the nodes where a view (a name, an inline ``z.partition(s)``) may be: an
        attribute's receiver, ``sl.load_like``'s or an unsafe op's argument, bound to one name."""
        ok = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                ok.add(id(node.value))
            elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                    isinstance(node.value, ast.Call):
                ok.add(id(node.value))
            elif isinstance(node, ast.Call):
                r = self.info.scope.resolve(node.func)
                if r is not None and r.kind == "load_like":
                    ok.update(id(a) for a in node.args)
                elif r is not None and r.kind == "builtin" and r.value.unsafe and node.args:
                    ok.add(id(node.args[0]))
        return ok

    def collect_views(self, tree):
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                f = node.value.func
                if isinstance(f, ast.Attribute) and f.attr == "partition" and \
                        self.kind_of(f.value) in ("Out", "tile"):
                    if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
                        self.fail(node, "statement", "bind a sub-partition to one plain name")
                    self.info.views[node.targets[0].id] = ("sub", self.out_of(f.value))
            if isinstance(node, ast.For) and isinstance(node.iter, ast.Call):
                f = node.iter.func
                if isinstance(f, ast.Attribute) and f.attr == "tiles" and self.kind_of(f.value) == "Out":
                    if not isinstance(node.target, ast.Name):
                        self.fail(node, "statement", "write `for t in z.tiles():` with one name")
                    self.info.views[node.target.id] = ("tile", f.value.id)
        # A view is a compile-time name for part of an Out: bound once, never rebound (a
        # second binding in another branch, or a tile assigned over it, would make the name
        # mean different regions on different paths).
        binds: dict = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and \
                    node.id in self.info.views:
                binds.setdefault(node.id, []).append(node)
        for name, nodes in binds.items():
            if len(nodes) > 1:
                self.fail(nodes[1], "view-rebinding",
                          f"'{name}' names a view of Out '{self.info.views[name][1]}' and is bound "
                          f"again here; bind each view once and use a new name for other values")

    def out_of(self, node) -> str:
        if inline_partition(node):
            return self.out_of(node.func.value)
        if node.id in self.params:
            return node.id
        return self.info.views[node.id][1]

    # -- statements ------------------------------------------------------------------------------
    def generic_visit(self, node):
        if isinstance(node, ast.stmt):
            self.fail(node, "statement",
                      f"`{type(node).__name__}` statements are not allowed in a kernel; use "
                      f"assignments, expressions, `for ... in range(...)`, `if` and `pass`")
        if isinstance(node, ast.expr) and not isinstance(node, ALLOWED_EXPRESSIONS):
            self.fail(node, "expression",
                      f"`{ast.unparse(node)}`: {type(node).__name__} expressions are not part of "
                      f"the kernel language (no lambdas, comprehensions, `:=`, f-strings, dicts "
                      f"or sets); write the loop or the value out")
        super().generic_visit(node)

    def visit_Compare(self, node):
        if len(node.ops) != 1 or isinstance(node.ops[0], (ast.Is, ast.IsNot, ast.In, ast.NotIn)):
            self.fail(node, "expression", f"`{ast.unparse(node)}`: compare two values with one of "
                                          f"< <= > >= == != (no chains, `is` or `in`)")
        self.generic_visit(node)

    def visit_Subscript(self, node):
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for part in parts:
            if isinstance(part, ast.Slice) and (part.lower or part.upper or part.step):
                self.fail(node, "tile-slice",
                          f"`{ast.unparse(node)}`: tiles cannot be sliced on the GPU (only `:` "
                          f"and `None` index a tile, to add axes); load the part you need with "
                          f"its own shape instead")
        self.generic_visit(node)

    def visit_Pass(self, node):
        pass

    def visit_Return(self, node):
        if not self.is_function:
            self.fail(node, "statement", "kernels return nothing: their results are Out stores")
        if node.value is not None:
            self.visit(node.value)

    def visit_Expr(self, node):
        self.statement_call = node.value
        self.visit(node.value)

    def check_target(self, target):
        if isinstance(target, ast.Name):
            if target.id in self.params:
                kind = self.params[target.id].kind
                self.fail(target, "param-assignment",
                          f"assignment to parameter '{target.id}' ({kind}): parameters are "
                          f"owned by the launch; bind a new local name instead")
            if reserved(target.id):
                self.fail(target, "name", reserved_message(target.id))
        elif isinstance(target, ast.Tuple):
            for elt in target.elts:
                self.check_target(elt)
        elif isinstance(target, ast.Subscript):
            base = target.value
            name = base.id if isinstance(base, ast.Name) else ast.unparse(base)
            kind = self.kind_of(base)
            if kind == "In":
                self.fail(target, "in-read-only",
                          f"store into In '{name}': In parameters are shared and read-only")
            self.fail(target, "free-index-store",
                      f"indexed store `{ast.unparse(target)} = ...`: a safe kernel cannot choose "
                      f"where to write; store the owned tile with `z.store(tile)` or a sub-tile "
                      f"with `z.partition(shape).store(tile, sub_index)`")
        else:
            self.fail(target, "statement", f"cannot assign to `{ast.unparse(target)}`")

    def visit_Assign(self, node):
        for t in node.targets:
            self.check_target(t)
        self.visit(node.value)

    def visit_AugAssign(self, node):
        self.check_target(node.target)
        self.visit(node.value)

    def visit_AnnAssign(self, node):
        self.check_target(node.target)
        if node.value is None:
            self.fail(node, "statement", "a bare annotation binds nothing; assign a value")
        self.visit(node.value)

    def visit_If(self, node):
        self.visit(node.test)
        for s in node.body + node.orelse:
            self.visit(s)

    def visit_For(self, node):
        if node.orelse:
            self.fail(node, "statement", "`for ... else` is not allowed")
        it = node.iter
        is_range = isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and \
            self.info.scope.resolve(it.func) is not None and \
            self.info.scope.resolve(it.func).kind == "pybuiltin" and it.func.id == "range"
        is_tiles = isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and \
            it.func.attr == "tiles" and self.kind_of(it.func.value) == "Out"
        if not (is_range or is_tiles):
            self.fail(node, "statement", "loops are `for i in range(...)` or `for t in z.tiles()`")
        if not isinstance(node.target, ast.Name):
            self.fail(node, "statement", f"a {'range' if is_range else 'tiles()'} loop binds "
                                         f"one plain name")
        self.check_target(node.target)
        if is_range:
            for a in it.args:
                self.visit(a)
            if it.keywords or not 1 <= len(it.args) <= 3:
                self.fail(node, "statement", "range() takes 1 to 3 positional arguments")
        for s in node.body:
            self.visit(s)

    # -- expressions -----------------------------------------------------------------------------
    def visit_Name(self, node):
        r = self.info.scope.resolve(node)
        if r is None:
            self.undefined(node, node.id)
        if r.kind == "forbidden_builtin":
            self.fail(node, "call", f"Python builtin '{node.id}' is not part of the kernel "
                                    f"language; see safetile.lang for the tile operations")
        if r.kind == "other":
            self.fail(node, "name", hints.global_message(node.id, r.value))
        if r.kind == "param" and self.params[node.id].kind == "Ptr" and not self.unsafe:
            self.fail(node, "ptr-needs-unsafe", "raw pointers need @st.kernel(unsafe=True)")
        kind = self.kind_of(node)
        if kind in ("In", "Out", "Ptr", "sub", "tile") and isinstance(node.ctx, ast.Load) \
                and id(node) not in self.view_uses:
            self.fail(node, "view-value",
                      f"'{node.id}' is a view ({kind}), not a value: use its methods "
                      f"({node.id}.load(...), {node.id}.shape ...) or sl.load_like(x, z); views "
                      f"cannot be stored in tuples, assigned, or passed to helpers")

    def visit_Attribute(self, node):
        kind = self.kind_of(node.value)
        allowed = {"In": IN_ATTRS, "Out": OUT_ATTRS, "tile": OUT_ATTRS, "sub": SUB_ATTRS,
                   "Ptr": set()}.get(kind)
        if allowed is not None:
            if node.attr not in allowed:
                self.fail(node, "call", f"'{ast.unparse(node.value)}' ({kind}) has no attribute "
                                        f"'{node.attr}'; it has {sorted(allowed)}")
            return self.visit(node.value)
        r = self.info.scope.resolve(node)
        if r is not None:
            return self.check_resolved_value(node, r)
        if isinstance(node.value, ast.Name):
            base = self.info.scope.resolve(node.value)
            if base is not None and base.kind == "module":
                self.fail(node, "name", f"'{ast.unparse(node)}' does not exist")
        if node.attr not in TILE_ATTRS:
            self.fail(node, "call", f"tiles have no attribute '{node.attr}' (they have .T, "
                                    f".shape, .dtype and .astype(dtype))")
        self.visit(node.value)

    def check_resolved_value(self, node, r):
        if r.kind == "other":
            self.fail(node, "name", f"'{ast.unparse(node)}' cannot be used in a kernel"
                                    f"{hints.foreign_dtype_message(r.value)}")
        if r.kind == "builtin" and r.value.unsafe and not self.unsafe:
            self.fail(node, "atomic-needs-unsafe" if r.value.atomic else "unsafe-op",
                      f"sl.{r.value.name} goes through a raw pointer: only in "
                      f"@st.kernel(unsafe=True)")

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Attribute):
            kind = self.kind_of(f.value)
            if kind is not None:
                return self.check_view_call(node, f, kind)
            r = self.info.scope.resolve(f)
            if r is None:
                base = self.info.scope.resolve(f.value) if isinstance(f.value, ast.Name) else None
                if base is not None and base.kind == "module":
                    self.fail(node, "call", hints.missing_operation_message(f, base.value))
                if f.attr not in TILE_METHODS:
                    self.fail(node, "call", f"`{ast.unparse(f)}(...)` is not a kernel operation "
                                            f"(tiles have .astype(dtype); operations are sl.*)")
                self.visit(f.value)
            else:
                self.check_callee(node, f, r)
        elif isinstance(f, ast.Name):
            r = self.info.scope.resolve(f)
            if r is None:
                self.undefined(node, f.id)
            self.check_callee(node, f, r)
        else:
            self.fail(node, "call", f"cannot call `{ast.unparse(f)}` in a kernel")
        for a in node.args:
            self.visit(a)
        for k in node.keywords:
            self.visit(k.value)

    def check_callee(self, node, f, r):
        name = ast.unparse(f)
        if r.kind == "load_like" and (len(node.args) != 2 or node.keywords
                                      or self.kind_of(node.args[0]) != "In"
                                      or self.kind_of(node.args[1]) not in ("Out", "tile")):
            self.fail(node, "call", hints.load_like_message(self.is_function))
        if r.kind in ("builtin", "load_like", "pybuiltin"):
            self.check_resolved_value(f, r)
            if r.kind == "builtin" and r.value.unsafe and node.args:
                if self.kind_of(node.args[0]) != "Ptr":
                    self.fail(node, "unsafe-op", f"the first argument of sl.{r.value.name} "
                                                 f"must be a st.Ptr parameter")
            return
        if r.kind == "function":
            for a in node.args:
                if self.kind_of(a) in ("In", "Out", "Ptr", "sub", "tile"):     # scalars may pass
                    self.fail(a, "call", f"views (`{ast.unparse(a)}`) cannot be passed to "
                                         f"@st.function helpers; load a tile and pass that")
            if r.value not in self.info.functions:
                self.info.functions.append(r.value)
            return
        if r.kind == "dtype":
            self.fail(node, "call", f"dtypes are not callable; use tile.astype({name})")
        if r.kind == "forbidden_builtin":
            self.fail(node, "call", hints.builtin_message(name))
        self.fail(node, "call", hints.unknown_call_message(self.info.scope, f))

    def check_view_call(self, node, f, kind):
        name, method = ast.unparse(f.value), f.attr
        if inline_partition(f.value):             # z.partition(shape).store(tile, sub_index)
            if len(f.value.args) != 1 or f.value.keywords:
                self.fail(f.value, "call", f"`{name}`: partition takes the sub-tile shape")
            self.visit(f.value.args[0])
        if kind == "Ptr":
            self.fail(node, "unsafe-op", f"raw pointer '{name}' has no methods; use "
                                         f"sl.load_ptr / sl.store_ptr")
        if kind == "In":
            if method == "store":
                self.fail(node, "in-read-only",
                          f"store through In '{name}': In parameters are shared and read-only; "
                          f"declare the destination as st.Out and store its owned tile")
            if method not in IN_METHODS:
                self.fail(node, "call", f"In '{name}' has no method '{method}'")
            if method == "prefetch" and node is not self.statement_call:
                self.fail(node, "prefetch",
                          f"`{name}.prefetch(index, shape)` is a statement of its own: it "
                          f"reads nothing into the program, so it has no value")
        elif kind in ("Out", "tile"):
            if method == "prefetch":
                self.fail(node, "prefetch",
                          f"prefetch of Out '{name}': only In views may be prefetched (an "
                          f"owned tile's reads are ordered by its token chain; a prefetch "
                          f"outside that chain is not allowed)")
            if method not in OUT_METHODS:
                self.fail(node, "call", f"Out '{name}' has no method '{method}'")
            if method == "store" and (len(node.args) != 1 or node.keywords):
                self.fail(node, "free-index-store",
                          f"`{name}.store` takes exactly the tile: the destination is the "
                          f"owned tile; to write part of it use "
                          f"`{name}.partition(sub_shape).store(tile, sub_index)`")
            if method == "load" and (node.args or node.keywords):
                self.fail(node, "free-index-store", f"`{name}.load()` reads the owned tile and "
                                                    f"takes no index")
        elif kind == "sub":
            if method not in SUB_METHODS:
                self.fail(node, "call", f"sub-partition '{name}' has no method '{method}'")
            if method == "store" and (len(node.args) != 2 or node.keywords):
                self.fail(node, "free-index-store", f"`{name}.store(tile, sub_index)`: the "
                                                    f"sub-index is within the owned slab")
        if method == "store" and node is not self.statement_call:
            self.fail(node, "statement", f"`{ast.unparse(node)}`: a store is a statement of its own")
        if method == "partition" and id(node) not in self.view_uses:
            self.fail(node, "statement", f"`{ast.unparse(node)}`: bind a sub-partition to one plain "
                                         f"name (`s = z.partition(shape)`) or store through it inline")
        for a in node.args:
            self.visit(a)
        for k in node.keywords:
            self.visit(k.value)


def check_kernel(src: KernelSource, params: dict, unsafe: bool) -> BodyInfo:
    """Enforce the body rules of a kernel; returns what codegen needs."""
    info = BodyChecker(src, params, unsafe, is_function=False).check()
    if not unsafe and not any(p.kind == "Out" for p in params.values()):
        raise src.error(src.tree, "no-out",
                        f"kernel '{src.fn.__name__}' has no st.Out parameter: a safe kernel writes "
                        f"only its owned tile of an Out partition, and that partition sets the "
                        f"launch grid")
    for name, p in params.items():
        if p.kind == "Ptr" and not unsafe:
            arg = next(a for a in src.tree.args.args if a.arg == name)
            raise src.error(arg, "ptr-needs-unsafe",
                            f"parameter '{name}' is a raw pointer (st.Ptr): only "
                            f"@st.kernel(unsafe=True) kernels take pointers")
    return info


def check_function(src: KernelSource, unsafe: bool = False) -> BodyInfo:
    """Enforce the body rules of an @st.function helper (no views: tiles and scalars only)."""
    return BodyChecker(src, {}, unsafe, is_function=True).check()
