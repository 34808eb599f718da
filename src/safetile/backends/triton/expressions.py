"""Kernel expressions -> Triton expressions: names, operators, calls of ``safetile.lang``.

``ExpressionEmitter`` holds what every translated body needs (the variant's parameter specs,
name resolution, compile-time evaluation of shapes); ``views.ViewEmitter`` adds the view
operations and ``emit.Emitter`` the statements and token ordering.
"""
from __future__ import annotations

import ast

from ...dtypes import bool_
from ...errors import KernelDefinitionError
from ...lang.views import inline_partition, kind_of
from ...lang import semantics as S
from .folding import ConstantNames
from .constants import (extremum_type, float_literal, fp32_operand, kept_bf16, needs_type,
                        stored_as, typed_constant)
from .prelude import DEPENDS, helper_source


BINOP_SPELLING = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
                  ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>",
                  ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^", ast.MatMult: "@"}


def _kw(node, name):
    for k in node.keywords:
        if k.arg == name:
            return k.value
    return None


class ExpressionEmitter(ConstantNames):
    """Translates expressions of one kernel or @st.function body for one variant."""

    def fail(self, node, message):
        return KernelDefinitionError(message, self.src.filename, self.src.line(node), "codegen")

    def use(self, name: str) -> str:
        if name not in self.helpers:
            self.helpers[name] = helper_source(name)
            for dep in DEPENDS.get(name, ()):
                self.use(dep)
        return name

    def tp(self, node):
        """The type the per-variant check gave ``node`` (``kernel/types.py``), or None."""
        return self.typed.types.get(id(node))

    def literal(self, v) -> str:
        """A compile-time value as Triton source."""
        return float_literal(v) if isinstance(v, float) else repr(v)

    def new_tmp(self) -> str:
        self.tmp += 1
        return f"_st_v{self.tmp}"

    def out_name(self, node) -> str:
        """The Out parameter a view expression refers to."""
        if inline_partition(node):
            return self.out_name(node.func.value)
        name = node.id
        if name in self.specs:
            return name
        return self.info.views[name][1]

    def in_shape(self, name: str, k: int) -> str:
        """``x.shape[k]`` of In ``name``, the int32 value the kernel binds at its entry."""
        self.shape_reads.add((name, k))
        return f"_st_{name}_len{k}"

    def view_kind(self, node):
        """'In'/'Out'/'Ptr'/'sub'/'tile' if ``node`` names a view, else None."""
        kind = kind_of(node, self.specs, self.info.views)
        return kind if kind in ("In", "Out", "Ptr", "sub", "tile") else None

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

    def compile_time_condition(self, node) -> bool | None:
        """Whether the compile-time condition ``node`` holds, as the per-variant type check
        decided it (None for a runtime condition)."""
        t = self.tp(node)
        if t is not None:
            return bool(t.value) if t.kind == "const" else None
        taken = self.static(node)
        return bool(taken) if isinstance(taken, int) else None

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
        t = self.tp(node)
        if rank == 1 and (t is None or t.kind != "tuple"):
            return [self.expr(node)]
        e = self.expr(node)
        return [f"({e})[{k}]" for k in range(rank)]

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
            return self.folded_name(node) or node.id
        return self.resolved_value(node, r)

    def resolved_value(self, node, r):
        if r.kind == "const":
            return self.literal(r.value)
        if r.kind == "dtype":
            return f"tl.{r.value.triton_name}"
        raise self.fail(node, f"`{ast.unparse(node)}` is not a value in a kernel")

    def expr_Attribute(self, node):
        kind = self.view_kind(node.value)
        if kind == "In" and node.attr == "shape":
            s = self.specs[node.value.id]
            return "(" + ", ".join(self.in_shape(s.name, k) for k in range(s.rank)) + ",)"
        if kind in ("Out", "tile"):
            return "(" + ", ".join(self.parts(node, len(self.specs[self.out_name(node.value)].tile))) + ",)"
        if kind == "sub":
            v = node.value
            shape = self.parts(v.args[0], len(self.specs[self.out_name(v)].tile)) \
                if isinstance(v, ast.Call) else self.subs[v.id][1]
            return "(" + ", ".join(shape) + ",)"
        r = self.scope.resolve(node)
        if r is not None:
            return self.resolved_value(node, r)
        base = self.expr(node.value)
        if node.attr == "T":
            return f"tl.trans({base})"
        return f"({base}).{node.attr}"

    def expr_Subscript(self, node):
        v = node.value
        # the entry the type check took (a compile-time int, negative ones from the end)
        k = self.tp(node.slice)
        k = k.value if k is not None and k.kind == "const" else self.static(node.slice)
        if isinstance(v, ast.Attribute) and self.view_kind(v.value) == "In" and v.attr == "shape":
            if k is None:
                raise self.fail(node, "index x.shape with a constant")
            return self.in_shape(v.value.id, k % self.specs[v.value.id].rank)
        if isinstance(v, ast.Attribute) and self.view_kind(v.value) in ("Out", "tile"):
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
        op = BINOP_SPELLING[type(node.op)]
        if op == "@":
            return f"tl.dot({self.expr(node.left)}, {self.expr(node.right)})"
        return self.binop(node, op, node.left, node.right)

    def binop(self, node, op: str, left, right) -> str:
        """``left op right`` with the language's semantics where Triton's differ: Python's
        floor division and remainder, guarded shifts, IEEE division, typed compile-time
        operands (``lang/semantics.py``)."""
        a, b = self.tp(left), self.tp(right)
        if op == "**" and a is not None and a.runtime:    # n multiplications (type-checked)
            return f"{self.use('_st_pow')}({self.expr(left)}, {b.value})"
        lt, rt = self.operands(op, left, right)
        if a is not None and b is not None and (a.runtime or b.runtime):
            if op == "/":
                # IEEE division, rounded to nearest: Triton's `/` is an approximate division
                # on the GPU (wrong in the last bits, and 0 for divisors past 2**126)
                return f"tl.div_rn({fp32_operand(a, lt)}, {fp32_operand(b, rt)})"
            float_op = (a.runtime and a.dtype.is_float) or (b.runtime and b.dtype.is_float) or \
                (a.kind == "const" and isinstance(a.value, float)) or \
                (b.kind == "const" and isinstance(b.value, float))
            if op in ("//", "%") and not float_op:
                if not (a.bound is not None and b.kind == "const" and b.value > 0):
                    helper = "_st_floordiv" if op == "//" else "_st_floormod"
                    return f"{self.use(helper)}({lt}, {rt})"
            elif op in ("<<", ">>") and (b.runtime or not 0 <= b.value < 8 * a.dtype.itemsize):
                # (a constant amount outside [0, bits) is undefined in Triton, as at runtime)
                return f"{self.use('_st_shl' if op == '<<' else '_st_shr')}({lt}, {rt})"
        return f"({lt} {op} {rt})"

    def operands(self, op: str, left, right) -> tuple[str, str]:
        """``left`` and ``right`` as Triton source, a compile-time number that meets a
        runtime operand built as a constant of that operand's type where Triton would not
        convert it as ``lang/semantics.py`` does: in comparisons and extrema Triton keeps it
        in fp32, fp64 or int32, and its own bf16 constants lose digits."""
        lt, rt = self.expr(left), self.expr(right)
        a, b = self.tp(left), self.tp(right)
        if a is None or b is None or a.runtime == b.runtime:
            return lt, rt
        c, r = (a, b) if b.runtime else (b, a)
        if c.kind != "const" or not isinstance(c.value, (int, float)) or \
                S.weak_kind(c.value) > S.kind(r.dtype):
            return lt, rt
        if needs_type(op, c.value, r.dtype):
            typed = typed_constant(c.value, r.dtype)
            return (typed, rt) if c is a else (lt, typed)
        return lt, rt

    def expr_UnaryOp(self, node):
        op = {ast.USub: "-", ast.UAdd: "+", ast.Not: "not ", ast.Invert: "~"}[type(node.op)]
        t = self.tp(node.operand)
        if op == "~" and t is not None and (t.dtype if t.runtime else type(t.value)) in (bool_, bool):
            # xor: Triton makes an int argument equal to 1 a Python constant, where ~True is -2
            return f"({self.expr(node.operand)} ^ True)"
        return f"({op}{self.expr(node.operand)})"

    def expr_BoolOp(self, node):
        op = " and " if isinstance(node.op, ast.And) else " or "
        return "(" + op.join(self.expr(v) for v in node.values) + ")"

    def expr_Compare(self, node):
        ops = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
               ast.NotEq: "!=", ast.Is: "is", ast.IsNot: "is not"}
        if len(node.ops) == 1 and ops[type(node.ops[0])] in S.COMPARE:
            op = ops[type(node.ops[0])]
            lt, rt = self.operands(op, node.left, node.comparators[0])
            return f"({lt} {op} {rt})"
        s = self.expr(node.left)
        for op, right in zip(node.ops, node.comparators):
            s += f" {ops[type(op)]} {self.expr(right)}"
        return f"({s})"

    def expr_IfExp(self, node):
        taken = self.compile_time_condition(node.test)
        if taken is not None:                      # only the taken value exists (types.py)
            return self.expr(node.body if taken else node.orelse)
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
                return self.astype(node)
        else:
            r = self.scope.resolve(f)
        if r.kind == "builtin":
            return self.builtin_call(node, r.value)
        if r.kind == "load_like":
            x, z = node.args
            return self.in_load(node, x, ast.Attribute(z, "index"), ast.Attribute(z, "shape"),
                                None, nonneg=True)
        if r.kind == "function":
            return f"{self.helper_name(node)}({self.args(node)})"
        if r.kind == "pybuiltin":
            return self.pybuiltin_call(node, f.id)
        raise self.fail(node, f"cannot compile call `{ast.unparse(node)}`")

    def astype(self, node):
        """``t.astype(d)``: float to int saturates (``_st_f2i``); a value Triton may have
        folded to a compile-time number converts through ``tl.cast``."""
        x, d = self.expr(node.func.value), self.expr(node.args[0])
        src, dst = self.tp(node.func.value), self.tp(node)
        if src is not None and dst is not None and src.dtype.is_float and \
                not dst.dtype.is_float and dst.dtype.name != "bool_":
            lo, hi = S.int_range(dst.dtype)
            return f"{self.use('_st_f2i')}({x}, {d}, {lo}, {hi})"
        if src is not None and src.special:
            return f"tl.cast({x}, {d})"
        return f"({x}).to({d})"

    def pybuiltin_call(self, node, name: str) -> str:
        t = self.tp(node)
        if t is not None and t.kind == "const":    # float(...), folded min/max/abs
            return self.literal(t.value)
        if name == "abs":
            return f"tl.abs({self.expr(node.args[0])})"
        # min/max of two or more values: nested, compile-time neighbours folded first
        # (compile-time operands typed as `operands` does)
        fn = "tl.minimum" if name == "min" else "tl.maximum"
        acc, acc_const, acc_type = None, None, None
        for a in node.args:
            at = self.tp(a)
            if at is not None and at.kind == "const" and (acc is None or acc_const is not None):
                acc_const = at.value if acc is None else \
                    (min if name == "min" else max)(acc_const, at.value)
                acc = self.literal(acc_const)
                continue
            x = self.expr(a)
            if acc is not None and at is not None:
                if acc_const is not None and at.runtime:
                    acc = self.constant_for(acc_const, at.dtype, acc)
                elif at.kind == "const" and acc_type is not None:
                    x = self.constant_for(at.value, acc_type, x)
            acc_type = extremum_type(name, acc_const if acc_const is not None else acc_type, at)
            acc = x if acc is None else f"{fn}({acc}, {x})"
            acc_const = None
        return kept_bf16(acc, t)

    def constant_for(self, v, d, src: str) -> str:
        """Compile-time ``v`` meeting a runtime ``d`` in an extremum (see ``operands``)."""
        if isinstance(v, (int, float)) and S.weak_kind(v) <= S.kind(d) and \
                needs_type("max", v, d):
            return typed_constant(v, d)
        return src

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
            p, rest = node.args[0].id, [self.expr(a) for a in node.args[1:]]
            kw = {k.arg: self.expr(k.value) for k in node.keywords}
            ptr = f"_st_{p}_ptr + {rest[0]}"
            if name == "load_ptr":                # (other: a constant, through fp32 as ever)
                mask = kw.get("mask", rest[1] if len(rest) > 1 else "None")
                o = _kw(node, "other") or (node.args[3] if len(node.args) > 3 else None)
                other = "0" if o is None else typed_constant(self.tp(o).value, self.specs[p].dtype)
                return f"tl.load({ptr}, mask={mask}, other={other})"
            value = rest[1]
            if name == "store_ptr":
                value = stored_as(value, self.tp(node.args[2]), self.specs[p].dtype)
            mask = kw.get("mask", rest[2] if len(rest) > 2 else "None")
            fn = "tl.store" if name == "store_ptr" else "tl.atomic_add"
            return f"{fn}({ptr}, {value}, mask={mask})"
        if name in ("bid", "num_blocks") and self.lead is not None and not self.persistent:
            # The launch grid is the Out grid: its coordinates and extents (emit.py prologue).
            axis, rank = self.tp(node.args[0]).value, len(self.lead.tile)
            if axis >= rank:                  # a runtime int32, as typed (not a literal)
                return f"tl.full((), {0 if name == 'bid' else 1}, tl.int32)"
            return f"_st_i{axis}" if name == "bid" else f"_st_g{axis}"
        t = self.tp(node)
        if name == "cdiv":
            if t is not None and t.kind == "const":
                return self.literal(t.value)
            a, c = self.tp(node.args[0]), self.tp(node.args[1])
            if a is not None and a.bound is not None and c is not None and c.kind == "const" \
                    and c.value > 0 and a.bound + c.value - 1 <= S.MAX_OFFSET:
                return f"tl.cdiv({self.args(node)})"
            return f"{self.use('_st_cdiv')}({self.args(node)})"
        if name in ("argmax", "argmin"):
            return f"{self.use('_st_' + name)}({self.args(node)})"
        if name == "mma" and t is not None and t.dtype.name == "int32":
            return f"tl.dot({self.args(node)}, out_dtype=tl.int32)"
        if name == "full":
            v = self.tp(node.args[1]) if len(node.args) > 1 else None
            if v is not None and v.runtime and v.dtype.is_float and t is not None and \
                    not t.dtype.is_float and t.dtype.name != "bool_":
                lo, hi = S.int_range(t.dtype)
                d = self.expr(node.args[2] if len(node.args) > 2 else _kw(node, "dtype"))
                value = f"{self.use('_st_f2i')}({self.expr(node.args[1])}, {d}, {lo}, {hi})"
                return f"tl.full({self.expr(node.args[0])}, {value}, {d})"
            if v is not None and v.kind == "const" and t is not None and \
                    t.dtype.name == "bfloat16":           # Triton's bf16 constants lose digits
                value = float_literal(S.compile_time_float(v.value))
                return f"tl.full({self.expr(node.args[0])}, {value}, tl.float32).to(tl.bfloat16)"
        if name in ("where", "maximum", "minimum") and not node.keywords:
            first = 1 if name == "where" else 0
            if len(node.args) == first + 2:
                x, y = self.operands({"maximum": "max", "minimum": "min"}.get(name, name),
                                     node.args[first], node.args[first + 1])
                head = [self.expr(node.args[0])] if first else []
                call = f"{b.triton}({', '.join(head + [x, y])})"
                return call if first else kept_bf16(call, t)
        target = b.triton
        if target.startswith("_st_"):
            self.use(target)
        return f"{target}({self.args(node)})"
