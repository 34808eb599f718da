"""Kernel AST -> Triton source, with the token ordering of owned tiles.

Tokens: each ``Out`` has an ordering chain. A load of an owned tile after a store to it, and a
store after any earlier access of it, get a CTA barrier (``tl.debug_barrier()``) in between,
because different threads hold different elements of a tile. Reads of ``In`` views carry no
token and no barrier. Across control flow the analysis is conservative: a loop body starts from
the join of the state before the loop and at the end of its body; an ``if`` joins its branches.
Each tile of ``for t in z.tiles()`` starts a fresh chain, since distinct tiles are disjoint.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ..dtypes import DType
from ..errors import KernelDefinitionError, LaunchError
from .prelude import HEADER, helper_source
from .spec import VariantKey

TMA_MIN_INNER_BYTES = 16
TMA_MAX_BOX = 256          # a tensor-map box has at most 256 elements along each axis


@dataclass
class Generated:
    """A generated module: its source and how to lay out launch arguments."""

    source: str
    entry: str
    layout: list                 # ("ptr"|"shape"|"stride"|"const"|"scalar"|"tile"|"desc", ...)
    descriptors: list = field(default_factory=list)   # (param name, block shape)


def _join(a: dict, b: dict) -> dict:
    keys = set(a) | set(b)
    return {k: a.get(k, frozenset()) | b.get(k, frozenset()) for k in keys}


class Emitter:
    """Translates one kernel (and the @st.function helpers it calls) for one variant."""

    def __init__(self, kernel, key: VariantKey):
        self.kernel = kernel
        self.src = kernel.src
        self.info = kernel.info
        self.scope = kernel.info.scope
        self.key = key
        self.specs = {a.name: a for a in key.args}
        self.outs = [a for a in key.args if a.kind == "Out"]
        self.lead = self.outs[0] if self.outs else None
        self.persistent = bool(self.lead and self.lead.persistent)
        self.helpers: dict[str, str] = {}
        self.descs: dict[tuple, str] = {}      # (param, block) -> descriptor arg name
        self.subs: dict[str, tuple] = {}       # sub view name -> (out, shape exprs)
        self.tmp = 0
        self.accesses: list = []               # (out name, "load"|"store") in the statement
        self.in_tile_loop = False
        self.tma_outs = self.tma_store_outs()

    def tma_store_outs(self) -> set:
        """Outs whose owned tile is written by a tensor-descriptor (TMA) store.

        A TMA store writes the whole box and drops elements outside the tensor, so edge
        tiles stay inside the partition, as the masked store does. It is asynchronous and its
        completion is not ordered by a CTA barrier, so it is used only where no token chain
        can need that order: the kernel stores the Out in exactly one statement and never
        reads it back (no ``z.load()``, no sub-partition views).
        """
        if not (self.key.tma and self.key.tma_store):
            return set()
        stores, other = {}, set()
        for node in ast.walk(self.src.tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            base = node.func.value
            kind = self.view_kind(base)
            if kind not in ("Out", "tile", "sub"):
                continue
            out = self.out_name(base)
            if node.func.attr == "tiles":
                continue
            if kind == "sub" or node.func.attr != "store":
                other.add(out)
            else:
                stores[out] = stores.get(out, 0) + 1
        for name, view in self.info.views.items():
            if view[0] == "sub":
                other.add(view[1])
        ok = set()
        for o in self.outs:
            t = o.tile
            if (o.tma and stores.get(o.name) == 1 and o.name not in other and len(t) >= 2
                    and t[-1] * o.dtype.itemsize >= TMA_MIN_INNER_BYTES
                    and all(d <= TMA_MAX_BOX for d in t)):
                ok.add(o.name)
        return ok

    # -- errors ------------------------------------------------------------------------------
    def fail(self, node, message):
        return KernelDefinitionError(message, self.src.filename, self.src.line(node), "codegen")

    # -- helpers -------------------------------------------------------------------------------
    def use(self, name: str) -> str:
        if name not in self.helpers:
            self.helpers[name] = helper_source(name)
        return name

    def new_tmp(self) -> str:
        self.tmp += 1
        return f"_st_v{self.tmp}"

    def out_name(self, node) -> str:
        """The Out parameter a view expression refers to."""
        name = node.id
        if name in self.specs:
            return name
        return self.info.views[name][1]

    def view_kind(self, node):
        if isinstance(node, ast.Name):
            if node.id in self.specs and self.specs[node.id].kind in ("In", "Out", "Ptr"):
                return self.specs[node.id].kind
            if node.id in self.info.views:
                return self.info.views[node.id][0]
        return None

    def idx(self, k: int) -> str:
        if self.persistent and not self.in_tile_loop:
            raise LaunchError(
                f"kernel '{self.kernel.name}': Out '{self.lead.name}' is a persistent partition, "
                f"so owned tiles are only reachable inside `for t in {self.lead.name}.tiles():`")
        return f"_st_i{k}"

    # -- static evaluation of shapes (for tensor descriptors) ------------------------------------
    def static(self, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            s = self.specs.get(node.id)
            if s is not None and s.kind == "Const" and isinstance(s.value, int):
                return s.value
            r = self.scope.resolve(node)
            if r is not None and r.kind == "const" and isinstance(r.value, int):
                return r.value
            return None
        if isinstance(node, (ast.Tuple, ast.List)):
            vals = [self.static(e) for e in node.elts]
            return None if any(v is None for v in vals) else tuple(vals)
        if isinstance(node, ast.Attribute) and node.attr == "shape" and \
                self.view_kind(node.value) in ("Out", "tile"):
            return self.specs[self.out_name(node.value)].tile
        if isinstance(node, ast.Subscript):
            base, i = self.static(node.value), self.static(node.slice)
            if isinstance(base, tuple) and isinstance(i, int):
                return base[i]
            return None
        if isinstance(node, ast.BinOp):
            a, b = self.static(node.left), self.static(node.right)
            if isinstance(a, int) and isinstance(b, int):
                ops = {ast.Mult: lambda: a * b, ast.Add: lambda: a + b, ast.Sub: lambda: a - b,
                       ast.FloorDiv: lambda: a // b if b else None}
                f = ops.get(type(node.op))
                return f() if f else None
        return None

    # -- tuple-ish arguments ------------------------------------------------------------------
    def parts(self, node, rank: int) -> list[str]:
        """Split an index or shape argument into ``rank`` expressions."""
        if isinstance(node, (ast.Tuple, ast.List)):
            if len(node.elts) != rank:
                raise self.fail(node, f"expected {rank} entries, got {len(node.elts)}")
            return [self.expr(e) for e in node.elts]
        if isinstance(node, ast.Attribute) and self.view_kind(node.value) in ("Out", "tile"):
            out = self.specs[self.out_name(node.value)]
            if node.attr == "index":
                return [self.idx(k) for k in range(len(out.tile))]
            if node.attr == "shape":
                return [f"_st_{out.name}_t{k}" for k in range(len(out.tile))]
        if rank == 1:
            return [self.expr(node)]
        e = self.expr(node)
        return [f"({e})[{k}]" for k in range(rank)]

    # -- expressions ---------------------------------------------------------------------------
    def expr(self, node) -> str:
        m = getattr(self, "expr_" + type(node).__name__, None)
        if m is None:
            raise self.fail(node, f"`{ast.unparse(node)}` cannot be compiled")
        return m(node)

    def expr_Constant(self, node):
        return repr(node.value)

    def expr_Name(self, node):
        spec = self.specs.get(node.id)
        if spec is not None:
            if spec.kind in ("In", "Out", "Ptr"):
                raise self.fail(node, f"view '{node.id}' is not a value; load a tile from it")
            return node.id
        if node.id in self.info.views:
            raise self.fail(node, f"view '{node.id}' is not a value")
        r = self.scope.resolve(node)
        if r is None or r.kind in ("local", "param"):
            return node.id
        return self.resolved_value(node, r)

    def resolved_value(self, node, r):
        if r.kind == "const":
            v = r.value
            return repr(v) if not isinstance(v, float) or v == v and abs(v) != float("inf") \
                else f'float("{v}")'
        if r.kind == "dtype":
            return f"tl.{r.value.triton_name}"
        raise self.fail(node, f"`{ast.unparse(node)}` is not a value in a kernel")

    def expr_Attribute(self, node):
        kind = self.view_kind(node.value)
        if kind == "In" and node.attr == "shape":
            s = self.specs[node.value.id]
            return "(" + ", ".join(f"_st_{s.name}_n{k}" for k in range(s.rank)) + ",)"
        if kind in ("Out", "tile"):
            return "(" + ", ".join(self.parts(node, len(self.specs[self.out_name(node.value)].tile))) + ",)"
        if kind == "sub":
            return "(" + ", ".join(self.subs[node.value.id][1]) + ",)"
        r = self.scope.resolve(node)
        if r is not None:
            return self.resolved_value(node, r)
        base = self.expr(node.value)
        if node.attr == "T":
            return f"tl.trans({base})"
        return f"({base}).{node.attr}"

    def expr_Subscript(self, node):
        v = node.value
        if isinstance(v, ast.Attribute) and self.view_kind(v.value) == "In" and v.attr == "shape":
            k = self.static(node.slice)
            if k is None:
                raise self.fail(node, "index x.shape with a constant")
            return f"_st_{v.value.id}_n{k}"
        if isinstance(v, ast.Attribute) and self.view_kind(v.value) in ("Out", "tile"):
            k = self.static(node.slice)
            if k is not None:
                return self.parts(v, len(self.specs[self.out_name(v.value)].tile))[k]
        return f"{self.expr(v)}[{self.slice(node.slice)}]"

    def slice(self, node) -> str:
        if isinstance(node, ast.Tuple):
            return ", ".join(self.slice(e) for e in node.elts)
        if isinstance(node, ast.Slice):
            lo = self.expr(node.lower) if node.lower else ""
            hi = self.expr(node.upper) if node.upper else ""
            return f"{lo}:{hi}" + (f":{self.expr(node.step)}" if node.step else "")
        return self.expr(node)

    def expr_BinOp(self, node):
        op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
              ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|",
              ast.BitAnd: "&", ast.BitXor: "^", ast.MatMult: "@"}[type(node.op)]
        if op == "@":
            return f"tl.dot({self.expr(node.left)}, {self.expr(node.right)})"
        return f"({self.expr(node.left)} {op} {self.expr(node.right)})"

    def expr_UnaryOp(self, node):
        op = {ast.USub: "-", ast.UAdd: "+", ast.Not: "not ", ast.Invert: "~"}[type(node.op)]
        return f"({op}{self.expr(node.operand)})"

    def expr_BoolOp(self, node):
        op = " and " if isinstance(node.op, ast.And) else " or "
        return "(" + op.join(self.expr(v) for v in node.values) + ")"

    def expr_Compare(self, node):
        ops = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
               ast.NotEq: "!=", ast.Is: "is", ast.IsNot: "is not"}
        s = self.expr(node.left)
        for op, right in zip(node.ops, node.comparators):
            s += f" {ops[type(op)]} {self.expr(right)}"
        return f"({s})"

    def expr_IfExp(self, node):
        return f"({self.expr(node.body)} if {self.expr(node.test)} else {self.expr(node.orelse)})"

    def expr_Tuple(self, node):
        return "(" + "".join(self.expr(e) + ", " for e in node.elts) + ")"

    def expr_List(self, node):
        return "[" + ", ".join(self.expr(e) for e in node.elts) + "]"

    def expr_Call(self, node):
        f = node.func
        if isinstance(f, ast.Attribute):
            kind = self.view_kind(f.value)
            if kind is not None:
                return self.view_call(node, f, kind)
            r = self.scope.resolve(f)
            if r is None:                          # t.astype(dtype)
                return f"({self.expr(f.value)}).to({self.expr(node.args[0])})"
        else:
            r = self.scope.resolve(f)
        if r.kind == "builtin":
            return self.builtin_call(node, r.value)
        if r.kind == "load_like":
            x, z = node.args
            return self.in_load(node, x, ast.Attribute(z, "index"), ast.Attribute(z, "shape"),
                                None, nonneg=True)
        if r.kind == "function":
            return f"_stf_{r.value.name}({self.args(node)})"
        if r.kind == "pybuiltin":
            name = f.id
            if name == "float":
                v = float(ast.literal_eval(node.args[0]))
                return repr(v) if abs(v) != float("inf") and v == v else f'float("{v}")'
            return {"min": "tl.minimum", "max": "tl.maximum", "abs": "tl.abs"}[name] + \
                f"({self.args(node)})"
        raise self.fail(node, f"cannot compile call `{ast.unparse(node)}`")

    def args(self, node) -> str:
        parts = [self.expr(a) for a in node.args]
        parts += [f"{k.arg}={self.expr(k.value)}" for k in node.keywords]
        return ", ".join(parts)

    def builtin_call(self, node, b):
        name = b.name
        if name == "arange":
            return f"tl.arange(0, {self.expr(node.args[0])})"
        if name == "sum":
            return f"{self.use('_st_sum')}({self.args(node)})"
        if name in ("load_ptr", "store_ptr", "atomic_add"):
            p = node.args[0].id
            rest = [self.expr(a) for a in node.args[1:]]
            kw = {k.arg: self.expr(k.value) for k in node.keywords}
            ptr = f"_st_{p}_ptr + {rest[0]}"
            if name == "load_ptr":
                mask = kw.get("mask", rest[1] if len(rest) > 1 else "None")
                other = kw.get("other", rest[2] if len(rest) > 2 else "0")
                return f"tl.load({ptr}, mask={mask}, other={other})"
            value = rest[1]
            mask = kw.get("mask", rest[2] if len(rest) > 2 else "None")
            fn = "tl.store" if name == "store_ptr" else "tl.atomic_add"
            return f"{fn}({ptr}, {value}, mask={mask})"
        target = b.triton
        if target.startswith("_st_"):
            self.use(target)
        return f"{target}({self.args(node)})"

    # -- view operations -------------------------------------------------------------------------
    def view_call(self, node, f, kind):
        name, method = f.value.id, f.attr
        if kind == "In":
            if method == "load":
                index = node.args[0] if node.args else _kw(node, "index")
                shape = node.args[1] if len(node.args) > 1 else _kw(node, "shape")
                pad = node.args[2] if len(node.args) > 2 else _kw(node, "padding")
                owned = isinstance(index, ast.Attribute) and index.attr == "index" and \
                    self.view_kind(index.value) in ("Out", "tile")
                return self.in_load(node, f.value, index, shape, pad, nonneg=owned)
            if method == "load_at":
                s = self.specs[name]
                offset = node.args[0] if node.args else _kw(node, "offset")
                shape = node.args[1] if len(node.args) > 1 else _kw(node, "shape")
                pad = node.args[2] if len(node.args) > 2 else _kw(node, "padding")
                e = ", ".join(self.parts(offset, s.rank))
                shp = ", ".join(self.parts(shape, s.rank))
                helper = self.use(f"_st_loadat{s.rank}")
                return f"{helper}({self.tensor_args(name, s.rank)}, {e}, {shp}, {self.pad(pad)})"
            if method == "load_scalar":
                s = self.specs[name]
                index = node.args[0]
                pad = node.args[1] if len(node.args) > 1 else _kw(node, "padding")
                e = ", ".join(self.parts(index, s.rank))
                helper = self.use(f"_st_scalar{s.rank}")
                return f"{helper}({self.tensor_args(name, s.rank)}, {e}, {self.pad(pad)})"
        out = self.specs[self.out_name(f.value)]
        r = len(out.tile)
        if kind in ("Out", "tile") and method == "load":
            self.accesses.append((out.name, "load"))
            helper = self.use(f"_st_load{r}")
            return (f"{helper}({self.tensor_args(out.name, r)}, {', '.join(self.idx(k) for k in range(r))}, "
                    f"{', '.join(f'_st_{out.name}_t{k}' for k in range(r))}, 0, False)")
        if kind == "sub" and method == "load":
            self.accesses.append((out.name, "load"))
            helper = self.use(f"_st_subload{r}")
            return f"{helper}({self.sub_args(name, out, r, node.args[0])}, 0)"
        raise self.fail(node, f"`{ast.unparse(node)}` must be a statement of its own")

    def tensor_args(self, name: str, r: int) -> str:
        return (f"_st_{name}_ptr, " + ", ".join(f"_st_{name}_n{k}" for k in range(r)) + ", " +
                ", ".join(f"_st_{name}_s{k}" for k in range(r)))

    def sub_args(self, sub: str, out, r: int, index_node) -> str:
        shape = self.subs[sub][1]
        j = self.parts(index_node, r)
        return (f"{self.tensor_args(out.name, r)}, {', '.join(self.idx(k) for k in range(r))}, "
                f"{', '.join(f'_st_{out.name}_t{k}' for k in range(r))}, {', '.join(j)}, "
                f"{', '.join(shape)}")

    def pad(self, node) -> str:
        if node is None:
            return "0"
        v = self.static_float(node)
        if v is None:
            raise self.fail(node, "padding must be a compile-time constant (a literal or Const)")
        return repr(v) if abs(v) != float("inf") and v == v else f'float("{v}")'

    def static_float(self, node):
        try:
            return float(ast.literal_eval(node))
        except (ValueError, TypeError, SyntaxError):
            pass
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float":
            return float(ast.literal_eval(node.args[0]))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = self.static_float(node.operand)
            return None if v is None else -v
        if isinstance(node, ast.Name):
            s = self.specs.get(node.id)
            if s is not None and s.kind == "Const":
                return float(s.value)
            r = self.scope.resolve(node)
            if r is not None and r.kind == "const":
                return float(r.value)
        return None

    def in_load(self, node, x, index, shape, pad, nonneg: bool) -> str:
        s = self.specs[x.id]
        if s.kind != "In":
            raise self.fail(node, f"'{x.id}' is not an In parameter")
        block = self.static(shape)
        if isinstance(block, int):
            block = (block,)
        pad_s = self.pad(pad)
        idx = self.parts(index, s.rank)
        if (self.key.tma and s.tma and s.rank >= 2 and block is not None and pad_s in ("0", "0.0")
                and block[-1] * s.dtype.itemsize >= TMA_MIN_INNER_BYTES
                and all(b & (b - 1) == 0 and b <= TMA_MAX_BOX for b in block)):
            d = self.descs.setdefault((x.id, block), f"_st_{x.id}_d{len(self.descs)}")
            coords = ", ".join(f"({i}) * {b}" for i, b in zip(idx, block))
            return f"{d}.load([{coords}])"
        shp = self.parts(shape, s.rank)
        helper = self.use(f"_st_load{s.rank}")
        return (f"{helper}({self.tensor_args(x.id, s.rank)}, {', '.join(idx)}, {', '.join(shp)}, "
                f"{pad_s}, {not nonneg})")

    # -- statements ------------------------------------------------------------------------------
    def block(self, body, state, indent) -> tuple[list, dict]:
        lines = []
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue
            out, state = self.stmt(stmt, state, indent)
            lines += out
        return lines or [indent + "pass"], state

    def barrier_check(self, state, accesses):
        """Which accesses of this statement need a barrier before them."""
        need = []
        seen = {k: set(v) for k, v in state.items()}
        for out, kind in accesses:
            prev = seen.setdefault(out, set())
            need.append("store" in prev or (kind == "store" and bool(prev)))
            prev.add(kind)
        return need, {k: frozenset(v) for k, v in seen.items()}

    def stmt(self, node, state, ind) -> tuple[list, dict]:
        self.accesses = []
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "store" and \
                self.view_kind(node.value.func.value) in ("Out", "tile", "sub"):
            return self.store_stmt(node.value, state, ind)
        if isinstance(node, ast.Assign):
            if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and \
                    node.targets[0].id in self.info.views:
                call = node.value
                out = self.specs[self.out_name(call.func.value)]
                self.subs[node.targets[0].id] = (out.name, self.parts(call.args[0], len(out.tile)))
                return [], state
            targets = " = ".join(self.target(t) for t in node.targets)
            if self.constexpr_alias(node):
                targets += ": tl.constexpr"
            text = f"{ind}{targets} = {self.expr(node.value)}"
        elif isinstance(node, ast.AugAssign):
            op = self.expr_BinOp(ast.BinOp(node.target, node.op, node.value))
            text = f"{ind}{self.target(node.target)} = {op}"
        elif isinstance(node, ast.AnnAssign):
            text = f"{ind}{self.target(node.target)} = {self.expr(node.value)}"
        elif isinstance(node, ast.Expr):
            text = f"{ind}{self.expr(node.value)}"
        elif isinstance(node, ast.Pass):
            return [f"{ind}pass"], state
        elif isinstance(node, ast.Return):
            return [f"{ind}return {self.expr(node.value) if node.value else ''}"], state
        elif isinstance(node, ast.If):
            return self.if_stmt(node, state, ind)
        elif isinstance(node, ast.For):
            return self.for_stmt(node, state, ind)
        else:
            raise self.fail(node, f"`{type(node).__name__}` cannot be compiled")
        need, state = self.barrier_check(state, self.accesses)
        pre = [f"{ind}tl.debug_barrier()  # token: read of an owned tile after a store"] if any(need) else []
        return pre + [text], state

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
        name = node.targets[0].id
        binds = sum(1 for n in ast.walk(self.src.tree)
                    if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store))
        return binds == 1

    def target(self, node) -> str:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Tuple):
            return ", ".join(self.target(e) for e in node.elts)
        raise self.fail(node, f"cannot assign to `{ast.unparse(node)}`")

    def store_stmt(self, call, state, ind):
        f = call.func
        kind = self.view_kind(f.value)
        out = self.specs[self.out_name(f.value)]
        r = len(out.tile)
        value = self.expr(call.args[0])
        value_accesses = list(self.accesses)
        need, state = self.barrier_check(state, value_accesses + [(out.name, "store")])
        lines = []
        if any(need[:-1]):
            lines.append(f"{ind}tl.debug_barrier()  # token: read of an owned tile after a store")
        if need[-1]:
            tmp = self.new_tmp()
            lines.append(f"{ind}{tmp} = {value}")
            lines.append(f"{ind}tl.debug_barrier()  # token: store after an access of the owned tile")
            value = tmp
        if kind == "sub":
            helper = self.use(f"_st_substore{r}")
            lines.append(f"{ind}{helper}({self.sub_args(f.value.id, out, r, call.args[1])}, {value})")
        elif out.name in self.tma_outs:
            d = self.descs.setdefault((out.name, tuple(out.tile)), f"_st_{out.name}_d{len(self.descs)}")
            helper = self.use(f"_st_dstore{r}")
            lines.append(f"{ind}{helper}({d}, {', '.join(self.idx(k) for k in range(r))}, "
                         f"{', '.join(f'_st_{out.name}_t{k}' for k in range(r))}, {value})")
        else:
            helper = self.use(f"_st_store{r}")
            lines.append(f"{ind}{helper}({self.tensor_args(out.name, r)}, "
                         f"{', '.join(self.idx(k) for k in range(r))}, "
                         f"{', '.join(f'_st_{out.name}_t{k}' for k in range(r))}, {value})")
        return lines, state

    def if_stmt(self, node, state, ind):
        taken = self.static(node.test)
        if isinstance(taken, int):
            # A compile-time condition (a literal, Const or closure constant): only the taken
            # branch is emitted, so the other branch's loads make no descriptors or helpers.
            branch = node.body if taken else node.orelse
            return self.block(branch, state, ind) if branch else ([], state)
        self.accesses = []
        test = self.expr(node.test)
        need, state = self.barrier_check(state, self.accesses)
        lines = [f"{ind}tl.debug_barrier()  # token: read of an owned tile after a store"] if any(need) else []
        body, s1 = self.block(node.body, state, ind + "    ")
        lines += [f"{ind}if {test}:"] + body
        s2 = state
        if node.orelse:
            orelse, s2 = self.block(node.orelse, state, ind + "    ")
            lines += [f"{ind}else:"] + orelse
        return lines, _join(s1, s2)

    def for_stmt(self, node, state, ind):
        it = node.iter
        if isinstance(it.func, ast.Attribute) and it.func.attr == "tiles":
            return self.tiles_loop(node, state, ind)
        args = ", ".join(self.expr(a) for a in it.args)
        _, end = self.block(node.body, state, ind + "    ")        # first pass: loop-carried state
        entry = _join(state, end)
        body, end = self.block(node.body, entry, ind + "    ")
        innermost = not any(isinstance(n, ast.For) for s in node.body for n in ast.walk(s))
        if self.key.loop_stages and innermost:
            loop = f"tl.range({args}, num_stages={int(self.key.loop_stages)})"
        else:
            loop = f"range({args})"
        return [f"{ind}for {node.target.id} in {loop}:"] + body, _join(state, end)

    def tiles_loop(self, node, state, ind):
        if not self.persistent:
            body, end = self.block(node.body, state, ind)
            return body, end
        if self.in_tile_loop:
            raise self.fail(node, "`tiles()` loops cannot nest")
        self.in_tile_loop = True
        coords = self.coords("_st_t", ind + "    ")
        body, end = self.block(node.body, {}, ind + "    ")
        self.in_tile_loop = False
        hints = "".join(f", {h}=True" for h in ("flatten", "warp_specialize") if getattr(self.key, h))
        loop = f"tl.range(tl.program_id(0), _st_ntiles, tl.num_programs(0){hints})" if hints else \
            "range(tl.program_id(0), _st_ntiles, tl.num_programs(0))"
        head = f"{ind}for _st_t in {loop}:"
        return [head] + coords + body, _join(state, end)

    # -- program -> tile -----------------------------------------------------------------------
    def coords(self, s: str, ind: str) -> list[str]:
        """Lines computing _st_i0.. (tile coordinates) from sequence position ``s``."""
        lead, r = self.lead, len(self.lead.tile)
        g = [f"_st_g{k}" for k in range(r)]
        if lead.order == "grouped":
            G = lead.group_size
            return [f"{ind}_st_gw = {G} * {g[1]}",
                    f"{ind}_st_fm = ({s} // _st_gw) * {G}",
                    f"{ind}_st_gs = tl.minimum({g[0]} - _st_fm, {G})",
                    f"{ind}_st_i0 = _st_fm + (({s} % _st_gw) % _st_gs)",
                    f"{ind}_st_i1 = ({s} % _st_gw) // _st_gs"]
        lines, rest = [], s
        for k in reversed(range(1, r)):
            lines.append(f"{ind}_st_i{k} = {rest} % {g[k]}")
            lines.append(f"{ind}_st_r{k} = {rest} // {g[k]}")
            rest = f"_st_r{k}"
        lines.append(f"{ind}_st_i0 = {rest}")
        return lines

    # -- whole module --------------------------------------------------------------------------
    def generate(self) -> Generated:
        ind = "    "
        body, _ = self.block(self.src.tree.body, {}, ind)
        prologue = []
        if self.lead is not None:
            r = len(self.lead.tile)
            for k in range(r):
                prologue.append(f"{ind}_st_g{k} = tl.cdiv(_st_{self.lead.name}_n{k}, _st_{self.lead.name}_t{k})")
            if self.persistent:
                prologue.append(f"{ind}_st_ntiles = " + " * ".join(f"_st_g{k}" for k in range(r)))
            else:
                prologue += self.coords("tl.program_id(0)", ind)
        params, layout = [], []
        for a in self.key.args:
            if a.kind in ("In", "Out"):
                r = a.rank
                params.append(f"_st_{a.name}_ptr")
                layout.append(("ptr", a.name))
                for k in range(r):
                    params.append(f"_st_{a.name}_n{k}")
                    layout.append(("shape", a.name, k))
                for k in range(r):
                    params.append(f"_st_{a.name}_s{k}")
                    layout.append(("stride", a.name, k))
                if a.kind == "Out":
                    for k in range(r):
                        params.append(f"_st_{a.name}_t{k}: tl.constexpr")
                        layout.append(("tile", a.name, k))
                for (pname, blk), dname in self.descs.items():
                    if pname == a.name:
                        params.append(dname)
                        layout.append(("desc", a.name, blk))
            elif a.kind == "Ptr":
                params.append(f"_st_{a.name}_ptr")
                layout.append(("ptr", a.name))
            elif a.kind == "Const":
                params.append(f"{a.name}: tl.constexpr")
                layout.append(("const", a.name))
            else:
                params.append(a.name)
                layout.append(("scalar", a.name))
        entry = self.kernel.name
        funcs = self.function_sources()
        text = [HEADER]
        text += list(self.helpers.values())
        text += funcs
        text.append(f"\n@triton.jit\ndef {entry}({', '.join(params)}):")
        text += prologue + body
        descriptors = [(p, blk) for (p, blk) in self.descs]
        return Generated("\n".join(text) + "\n", entry, layout, descriptors)

    def function_sources(self) -> list[str]:
        out, done = [], set()
        pending = list(self.info.functions)
        while pending:
            fn = pending.pop()
            if fn.name in done:
                continue
            done.add(fn.name)
            sub = FunctionEmitter(fn, self)
            out.append(sub.generate())
            pending += [f for f in fn.info.functions if f.name not in done]
        return out


class FunctionEmitter(Emitter):
    """Translates an @st.function helper: tiles and scalars only, no views."""

    def __init__(self, fn, parent: Emitter):
        self.kernel = parent.kernel
        self.src, self.info, self.scope = fn.src, fn.info, fn.info.scope
        self.key, self.specs, self.outs, self.lead, self.persistent = parent.key, {}, [], None, False
        self.helpers, self.descs, self.subs = parent.helpers, {}, {}
        self.tmp, self.accesses, self.in_tile_loop = 0, [], False
        self.fn = fn

    def generate(self) -> str:
        body, _ = self.block(self.src.tree.body, {}, "    ")
        args = ", ".join(a.arg for a in self.src.tree.args.args)
        return f"\n@triton.jit\ndef _stf_{self.fn.name}({args}):\n" + "\n".join(body) + "\n"


def _kw(node, name):
    for k in node.keywords:
        if k.arg == name:
            return k.value
    return None


def generate(kernel, key: VariantKey) -> Generated:
    """Generate the Triton module for ``kernel`` specialized on ``key``."""
    return Emitter(kernel, key).generate()
