"""Random kernels over the kernel language, for differential testing of the two backends.

A case is one kernel: a few In tiles of chosen dtypes (edge values mixed in: +-0, NaN, +-inf,
int extremes, negatives), an ``int`` and a ``float`` parameter, an int and a float Const,
and several expressions, each stored into its own Out (of exactly the expression's type, so
that the store converts nothing). Tiles have edge tiles (the shape is not a multiple of the
tile). Expressions are built from the language's operators and operations, steered by the
type rules of ``lang/semantics.py`` so that most cases are accepted; integer divisors are made
odd (``b | 1``) and shift amounts small (``b & 7``), because the CPU executor reports a zero
divisor or an out-of-range shift instead of computing one (``lang/semantics.py``).

Each expression records what the comparison may tolerate, as documented by the semantics:
``approx`` (element-wise math functions and float sums: not bit for bit) and ``zero_sign``
(maximum/minimum of zeros of both signs). See ``backends.py`` for the runs and the comparison.
"""
from __future__ import annotations

import importlib.util
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

import safetile as st
from safetile.lang import semantics as S

DTYPES = [st.f32, st.f16, st.bf16, st.i32, st.i64, st.int8, st.bool_]
FLOAT_EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.75, 1e30, -1e30, 1e-30, 65504.0, 1e5,
               math.inf, -math.inf, math.nan, 3.0e38, 7.0, -7.0]
INT_EDGES = [0, 1, -1, 2, -2, 3, 7, -7, 127, -128, 255, 2**31 - 1, -2**31, 1000003]
BINOPS = ["+", "-", "*", "/", "//", "%", "&", "|", "^", "<<", ">>"]
CMPOPS = ["<", "<=", ">", ">=", "==", "!="]
MATH = ["exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid"]
REDUCTIONS = ["sum", "max", "min", "argmax", "argmin"]


@dataclass
class N:
    """One expression: its source, type (``dtype``; None for a compile-time value) and the
    tolerances its comparison may use."""

    src: str
    dtype: object = None             # DType of a runtime value
    value: object = None             # the Python value of a compile-time one
    tile: bool = False               # a tile (else a scalar or a compile-time value)
    approx: bool = False
    zero_sign: bool = False
    tree: tuple = ()                 # (kind, ...) for the bf16 reference (backends.py)
    special: bool = False            # computed from int parameters only (kernel/typevalues.py)
    bounded_sum: bool = False        # a float sum of terms below 1000 in magnitude

    @property
    def runtime(self) -> bool:
        return self.dtype is not None

    def operand(self):
        return self.dtype if self.runtime else self.value


@dataclass
class Case:
    """One generated kernel and its inputs."""

    rank: int
    tile: tuple
    shape: tuple
    inputs: list                     # DType per In
    exprs: list = field(default_factory=list)
    n: int = 3
    s: float = 0.5
    c: int = 2
    f: float = 1.5
    data_seed: int = 0
    source: str = ""

    @property
    def out_dtypes(self) -> list:
        return [e.dtype if e.runtime else _stored_dtype(e.value) for e in self.exprs]

    @property
    def interpretable(self) -> bool:
        """Whether Triton's interpreter computes this case as the GPU does (not for bf16,
        whose math it gets wrong, nor libdevice, which it does not run)."""
        return not (any(d is st.bf16 for d in self.inputs + self.out_dtypes)
                    or "bfloat16" in self.source or "sl.tanh" in self.source)


def _stored_dtype(value) -> "st.DType":
    """The Out dtype for a compile-time value stored on its own: its weak dtype, or fp32 for
    a float with none (outside fp32's normal range), which the store rounds to the Out's type."""
    try:
        return S.weak_dtype(value)
    except S.SemanticsError:
        return st.f32


class Builder:
    """Builds a random case from a ``random.Random``."""

    def __init__(self, rng: random.Random, rank: int, inputs: list, c: int, f: float):
        self.rng, self.rank, self.inputs, self.c, self.f = rng, rank, inputs, c, f
        self.tile = (8,) if rank == 1 else (4, 8)

    # -- leaves --------------------------------------------------------------------------------
    def leaf(self) -> N:
        r = self.rng.random()
        if r < 0.5:
            k = self.rng.randrange(len(self.inputs))
            return N(f"a{k}", self.inputs[k], tile=True, tree=("in", k))
        if r < 0.6:
            return N("n", st.i32, tree=("n",), special=True)
        if r < 0.68:
            return N("s", st.f32, tree=("s",))
        if r < 0.72:
            return N("z0.index[0]", st.i32, tree=("index",))
        if r < 0.76:
            return self.arange()
        if r < 0.82:
            return N("C", value=self.c, tree=("c", self.c))
        if r < 0.88:
            return N("F", value=self.f, tree=("c", self.f))
        v = self.rng.choice(FLOAT_EDGES + INT_EDGES + [True, False])
        return N(_literal(v), value=v, tree=("c", v))

    def arange(self) -> N:
        t = self.tile[-1]
        src = f"sl.arange({t})" if self.rank == 1 else f"sl.arange({t})[None, :]"
        return N(src, st.i32, tile=True, tree=("arange",))

    # -- inner nodes ---------------------------------------------------------------------------
    def expr(self, depth: int) -> N:
        if depth == 0 or self.rng.random() < 0.2:
            return self.leaf()
        kind = self.rng.choices(["bin", "where", "un", "astype", "minmax", "cdiv"],
                                weights=[8, 2, 2, 2, 2, 1])[0]
        a = self.expr(depth - 1)
        if kind == "un":
            return self.unary(a)
        if kind == "astype":
            if not a.runtime:
                return a
            d = self.rng.choice(DTYPES)
            return N(f"({a.src}).astype(st.{d.name})", d, tile=a.tile, approx=a.approx,
                     zero_sign=a.zero_sign, tree=("astype", d, a.tree))
        b = self.expr(depth - 1)
        if kind == "where":
            c = self.compare(a, b)
            x, y = self.expr(depth - 1), self.expr(depth - 1)
            if c is None or not (x.runtime or y.runtime):
                return a
            try:
                d = S.where_dtype(x.operand(), y.operand())
            except S.SemanticsError:
                return a
            if _special_clash(x, y):
                return a
            return N(f"sl.where({c.src}, {x.src}, {y.src})", d, tile=c.tile or x.tile or y.tile,
                     approx=x.approx or y.approx or c.approx,
                     zero_sign=x.zero_sign or y.zero_sign or c.zero_sign,
                     tree=("where", c.tree, x.tree, y.tree, d))
        if kind == "minmax":
            return self.extremum(a, b)
        if kind == "cdiv":
            return self.binary(a, b, ["cdiv"]) or a
        return self.binary(a, b, BINOPS + CMPOPS) or a

    def unary(self, a: N) -> N:
        ops = ["-", "~", "abs"]
        self.rng.shuffle(ops)
        for op in ops:
            if not a.runtime:
                return a
            try:
                d = S.unary(op, a.dtype)
            except S.SemanticsError:
                continue
            src = f"abs({a.src})" if op == "abs" else f"({op}{a.src})"
            return N(src, d, tile=a.tile, approx=a.approx, zero_sign=a.zero_sign,
                     tree=("un", op, a.tree, d))
        return a

    def compare(self, a: N, b: N):
        return self.binary(a, b, CMPOPS)

    def binary(self, a: N, b: N, ops: list):
        ops = list(ops)
        self.rng.shuffle(ops)
        for op in ops:
            if not (a.runtime or b.runtime):
                if op in ("cdiv", "//", "%", "/", "<<", ">>", "**"):
                    continue                      # compile-time: keep to safe folds
                try:
                    v = eval(f"({a.src}) {op} ({b.src})", {}, {"C": self.c, "F": self.f})
                except Exception:
                    continue
                return N(f"(({a.src}) {op} ({b.src}))", value=v, tree=("c", v))
            rule_op = "//" if op == "cdiv" else op
            try:
                comp, res = S.binary(rule_op, a.operand(), b.operand())
            except S.SemanticsError:
                continue
            if _special_clash(a, b):
                continue
            bb = b
            if op in ("//", "%", "cdiv") and not comp.is_float:
                bb = N(f"({b.src} | 1)", b.dtype, b.value if b.value is None else b.value | 1,
                       b.tile, b.approx, b.zero_sign, ("bin", "|", b.tree, ("c", 1), None))
                if not bb.runtime and isinstance(b.value, bool):
                    continue
            if op in ("<<", ">>"):
                if comp is st.bool_:
                    continue
                bb = N(f"({b.src} & 7)", b.dtype, None if b.runtime else b.value & 7, b.tile,
                       False, False, ("bin", "&", b.tree, ("c", 7), None))
                if not bb.runtime and isinstance(b.value, bool):
                    continue
            src = f"sl.cdiv({a.src}, {bb.src})" if op == "cdiv" else f"({a.src} {op} {bb.src})"
            special = all(x.special or not x.runtime for x in (a, b)) and not (a.tile or b.tile)
            return N(src, res, tile=a.tile or b.tile, approx=a.approx or b.approx,
                     zero_sign=a.zero_sign or b.zero_sign,
                     tree=("bin", op, a.tree, bb.tree, res), special=special)
        return None

    def extremum(self, a: N, b: N) -> N:
        spell = self.rng.choice(["min", "max", "sl.minimum", "sl.maximum"])
        op = "min" if "min" in spell else "max"
        if not (a.runtime or b.runtime):
            return a
        try:
            _, d = S.binary(op, a.operand(), b.operand())
        except S.SemanticsError:
            return a
        if _special_clash(a, b):
            return a
        return N(f"{spell}({a.src}, {b.src})", d, tile=a.tile or b.tile, approx=a.approx or b.approx,
                 zero_sign=True, tree=("bin", op, a.tree, b.tree, d))

    def root(self, depth: int) -> N:
        e = self.expr(depth)
        r = self.rng.random()
        if r < 0.25 and e.runtime and e.dtype is not st.bool_:
            name = self.rng.choice(MATH)
            d = S.math_dtype(name, e.dtype)
            return N(f"sl.{name}({e.src})", d, tile=e.tile, approx=True, zero_sign=e.zero_sign,
                     tree=("math", name, e.tree, d))
        if r < 0.45 and self.rank == 2 and e.runtime and e.tile and e.dtype is not st.bool_:
            name = self.rng.choice(REDUCTIONS)
            d = S.reduction_dtype(name, e.dtype)
            full = f"({e.src} + sl.zeros(z0.shape, st.{e.dtype.name}))"
            tree = e.tree
            fsum = name == "sum" and e.dtype.is_float
            if fsum:
                # the order of a float sum is unspecified: keep its terms small (NaN, inf and
                # 1e30 would make the result depend on that order without bound)
                full = f"sl.where(abs({full}) < 1000.0, {full}, 0.0)"
                tree = ("small", tree)
            return N(f"sl.{name}({full}, 1)[:, None]", d, tile=True,
                     approx=e.approx or fsum, zero_sign=e.zero_sign or name in ("max", "min"),
                     tree=("red", name, tree, d), bounded_sum=fsum)
        return e


def _special_clash(a: N, b: N) -> bool:
    """What the type check refuses: a value Triton may fold to a compile-time 1 meeting an
    operand it would then promote differently (kernel/typevalues.py)."""
    for x, y in ((a, b), (b, a)):
        if x.special and y.runtime and not y.special:
            weak = 1 if not x.dtype.is_float else 0.5
            try:
                if S.computation_dtype(weak, y.dtype) is not S.computation_dtype(x.dtype, y.dtype):
                    return True
            except S.SemanticsError:
                return True
    return False


def _literal(v) -> str:
    if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
        return f'float("{v}")'
    return f"({v!r})"


def build(seed: int, rank: int, n_inputs: int, n_exprs: int, depth: int) -> Case:
    """A case from ``seed`` (the other arguments set its size)."""
    rng = random.Random(seed)
    tile = (8,) if rank == 1 else (4, 8)
    shape = tuple(t * rng.randint(1, 2) + rng.randint(1, t - 1) for t in tile)
    inputs = [rng.choice(DTYPES) for _ in range(n_inputs)]
    c = rng.choice(INT_EDGES[:11])
    f = rng.choice(FLOAT_EDGES)
    b = Builder(rng, rank, inputs, c, f)
    case = Case(rank, tile, shape, inputs, n=rng.choice(INT_EDGES), s=rng.choice(FLOAT_EDGES),
                c=c, f=f, data_seed=rng.randrange(2**31))
    case.exprs = [b.root(depth) for _ in range(n_exprs)]
    case.source = source(case, f"case_{seed}")  # kernel_of imports this name
    return case


def source(case: Case, name: str) -> str:
    r = case.rank
    ins = ", ".join(f"x{k}: st.In[ANY, {r}]" for k in range(len(case.inputs)))
    outs = ", ".join(f"z{k}: st.Out[ANY, {r}]" for k in range(len(case.exprs)))
    lines = ["import safetile as st", "import safetile.lang as sl", "",
             "ANY = st.f32 | st.f16 | st.bf16 | st.i32 | st.i64 | st.int8 | st.bool_", "", "",
             "@st.kernel",
             f"def {name}({ins}, {outs}, n: int, s: float, C: st.Const[int], F: st.Const[float]):"]
    lines += [f"    a{k} = sl.load_like(x{k}, z0)" for k in range(len(case.inputs))]
    lines += [f"    z{k}.store({e.src})" for k, e in enumerate(case.exprs)]
    return "\n".join(lines) + "\n"


_MODULES: dict = {}


def kernel_of(case: Case, directory: Path, name: str):
    """Write the case's source to a file (kernels must live in files) and import it."""
    path = directory / f"{name}.py"
    path.write_text(case.source)
    spec = importlib.util.spec_from_file_location(f"safetile_diffcase_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    _MODULES[name] = module
    return getattr(module, name)


def inputs(case: Case, device="cpu") -> list:
    """Seeded input tensors: edge values mixed with ordinary ones."""
    g = torch.Generator().manual_seed(case.data_seed)
    out = []
    for d in case.inputs:
        n = math.prod(case.shape)
        pick = torch.rand(n, generator=g) < 0.35
        if d.is_float:
            edges = torch.tensor(FLOAT_EDGES, dtype=torch.float32)
            base = torch.randn(n, generator=g) * 4
        elif d is st.bool_:
            edges = torch.tensor([0.0, 1.0])
            base = (torch.rand(n, generator=g) < 0.5).float()
        else:
            lo, hi = S.int_range(d)
            edges = torch.tensor([min(max(v, lo), hi) for v in INT_EDGES], dtype=torch.float64)
            base = torch.randint(-20, 21, (n,), generator=g).double()
        idx = torch.randint(0, len(edges), (n,), generator=g)
        v = torch.where(pick, edges[idx].to(base.dtype), base)
        t = (v != 0) if d is st.bool_ else v.to(d.torch)
        out.append(t.reshape(case.shape).to(device))
    return out


def arguments(case: Case, device="cpu") -> list:
    """Fresh launch arguments (In tensors, Out partitions, scalars, Consts)."""
    xs = [st.from_torch(t) for t in inputs(case, device)]
    zs = [st.empty(case.shape, dtype=d, device=device).partition(case.tile)
          for d in case.out_dtypes]
    return xs + zs + [case.n, case.s, case.c, case.f]
