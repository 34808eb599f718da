"""Running a generated case on each backend, and comparing the results.

- ``run_cpu``: the CPU executor (``st.backend("interpret")``).
- ``run_interpreter``: the kernel's generated Triton source under Triton's own interpreter
  (``TRITON_INTERPRET=1``, in a worker process: ``interp_worker.py``, which also puts right
  the two places where the interpreter does not compute what the GPU does). ``libdevice``
  (``sl.tanh``) does not run there at all: cases with it are checked against ``reference``. It is wrong for bf16 (integer math on the bits), so cases
  with bf16 are checked against ``reference`` instead.
- ``reference``: an fp32 emulation of the generated code, evaluated from the case's
  expression trees with Triton's own promotion (``TritonSemantic.computation_type_impl``):
  every operation computed in fp32 (int64 for ints) and rounded to the type Triton gives it.
- ``run_gpu``: the ``triton`` backend on a CUDA device.

``agree`` asserts equality: bit for bit (all NaNs alike), except what the semantics leave
open: element-wise math and float sums to a relative tolerance by dtype, and the sign of a
zero from maximum/minimum. On the GPU, fp32 results also get a small relative tolerance, and
fp16 / bf16 results of expressions with a product one rounding unit: ``a * b + c`` may be fused
into one rounding there (lang/semantics.py; division is IEEE on both backends, and square root
is a math function).
"""
from __future__ import annotations

import numpy as np
import torch

import safetile as st
from safetile.backends.triton import pack
from safetile.kernel.launch import bind, check_launch, launch_grid
from safetile.lang import semantics as S

RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# On the GPU: what a fused multiply-add (one rounding instead of two) may change, by dtype.
FMA_RTOL = {torch.float32: 4e-6, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def outputs(values, n_inputs: int, n_outs: int) -> list:
    return [p.unpartition().to_torch().cpu() for p in values[n_inputs:n_inputs + n_outs]]


def run_cpu(kernel, args, n_inputs: int, n_outs: int, seed: int = 0) -> list:
    with st.backend("interpret", seed=seed):
        values = kernel(*args).sync()
    return outputs(values, n_inputs, n_outs)


def run_gpu(kernel, args, n_inputs: int, n_outs: int) -> list:
    with st.backend("triton"):
        values = kernel(*args).sync()
    return outputs(values, n_inputs, n_outs)


_POOL: list = []


def _worker():
    """The interpreter's process (``interp_worker.py``), started once."""
    if not _POOL:
        import interp_worker
        _POOL.append(interp_worker.Worker())
    return _POOL[0]


def run_interpreter(kernel, args, n_inputs: int, n_outs: int) -> list:
    """The generated Triton source of ``kernel`` (without tensor descriptors) run by Triton's
    interpreter on copies of the arguments' CPU tensors."""
    kernel = kernel.options(tma=False)
    bound = bind(kernel, args, {})
    check_launch(kernel, bound, None)
    variant = kernel._launches.variant(kernel, bound)
    launch_args, _ = pack.pack(variant.packing, bound)
    out_names = [b.name for b in bound[n_inputs:n_inputs + n_outs]]
    positions = [i for i, entry in enumerate(variant.generated.layout)
                 if entry[0] == "ptr" and entry[1] in out_names]
    return _worker().run(str(variant.path), variant.generated.entry, launch_args,
                         launch_grid(kernel, bound), positions)


def agree(e, a: torch.Tensor, b: torch.Tensor, gpu: bool = False) -> bool:
    """Whether two results of generated expression ``e`` agree."""
    return same(a, b, e.approx, e.zero_sign, gpu, 8 * 1000.0 if e.bounded_sum else 0.0,
                fused=gpu and "*" in e.src)


def same(a: torch.Tensor, b: torch.Tensor, approx: bool, zero_sign: bool,
         gpu: bool = False, scale: float = 0.0, fused: bool = False) -> bool:
    """Whether two results agree under the semantics' tolerances (see the module docstring)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    x, y = a.float(), b.float()
    nan = torch.isnan(x)
    if not torch.equal(nan, torch.isnan(y)):
        return False
    x, y = torch.where(nan, 0.0, x), torch.where(nan, 0.0, y)
    fma = gpu and (fused or a.dtype == torch.float32)
    if approx or fma:
        rtol = max(RTOL[a.dtype] if approx else 0.0, FMA_RTOL[a.dtype] if fma else 0.0)
        inf = torch.isinf(x) | torch.isinf(y)
        if not torch.equal(x[inf], y[inf]):
            return False
        fin = ~inf
        atol = rtol * max(scale, 1e-3)          # a sum of terms up to `scale` in all
        return bool(torch.isclose(x[fin], y[fin], rtol=rtol, atol=atol).all())
    if zero_sign:
        return bool((x == y).all())
    return torch.equal(torch.signbit(x), torch.signbit(y)) and bool((x == y).all())


# ---- the fp32 emulation of the generated code (bf16 cases) -------------------------------------

def _tl(d):
    import triton.language as tl
    return getattr(tl, d.triton_name)


def _st(tl_dtype):
    from safetile.dtypes import ALL
    return next(d for d in ALL if _tl(d) == tl_dtype)


def _triton_type(a, b, div_or_mod: bool):
    """Triton's computation type for two operands (a DType, or a Python number)."""
    from triton.language.semantic import TritonSemantic
    sem = TritonSemantic.__new__(TritonSemantic)
    wa, wb = not isinstance(a, st.DType), not isinstance(b, st.DType)
    ta = _tl(S.weak_dtype(a)) if wa else _tl(a)
    tb = _tl(S.weak_dtype(b)) if wb else _tl(b)
    return _st(sem.computation_type_impl(ta, wa, tb, wb, div_or_mod))


class Reference:
    """Evaluates a case's expression trees (``diffcases.N.tree``) for one program's tile."""

    def __init__(self, case, tiles: list, n: int, s: float, index: int, shape: tuple):
        self.case, self.tiles, self.n, self.s, self.index = case, tiles, n, s, index
        self.shape = shape

    def value(self, tree):
        """(tensor or Python number, dtype or None)."""
        kind = tree[0]
        if kind == "in":
            t = self.tiles[tree[1]]
            return t, st.dtypes.from_torch(t.dtype)
        if kind == "n":
            return torch.tensor(self.n, dtype=torch.int32), st.i32
        if kind == "s":
            return torch.tensor(self.s, dtype=torch.float32), st.f32
        if kind == "index":
            return torch.tensor(self.index, dtype=torch.int32), st.i32
        if kind == "arange":
            t = torch.arange(self.shape[-1], dtype=torch.int32)
            return (t if len(self.shape) == 1 else t[None, :]), st.i32
        if kind == "c":
            return tree[1], None
        return getattr(self, "v_" + kind)(tree)

    @staticmethod
    def to(v, d):
        if isinstance(v, torch.Tensor):
            return v.to(d.torch)
        if d.is_float:
            return torch.tensor(0.0 if v == 0 else float(v), dtype=torch.float32).to(d.torch)
        return torch.tensor(int(v), dtype=d.torch)

    def v_bin(self, tree):
        _, op, ta, tb, _ = tree
        a, da = self.value(ta)
        b, db = self.value(tb)
        if da is None and db is None:
            return eval(f"a {op} b", {}, {"a": a, "b": b}), None
        rule = "//" if op == "cdiv" else op
        d = _triton_type(a if da is None else da, b if db is None else db,
                         rule in ("/", "%", "//"))
        x, y = self.to(a, d), self.to(b, d)
        if op in S.COMPARE:
            return _CMP[op](x.float() if d.is_float else x, y.float() if d.is_float else y), st.bool_
        if d.is_float:
            xf, yf = x.double(), y.double()
            if op == "/":
                return (xf / yf).float().to(d.torch), d
            if op in ("max", "min"):
                return (torch.fmax if op == "max" else torch.fmin)(x, y), d
            r = {"+": xf + yf, "-": xf - yf, "*": xf * yf}[op]
            return r.float().to(d.torch), d
        if op == "/":
            return x.float() / y.float(), st.f32
        xi, yi = x.long(), y.long()
        r = {"+": lambda: xi + yi, "-": lambda: xi - yi, "*": lambda: xi * yi,
             "//": lambda: torch.div(xi, yi, rounding_mode="floor"),
             "cdiv": lambda: -torch.div(-xi, yi, rounding_mode="floor"),
             "%": lambda: torch.remainder(xi, yi), "&": lambda: xi & yi, "|": lambda: xi | yi,
             "^": lambda: xi ^ yi, "<<": lambda: xi << yi, ">>": lambda: xi >> yi,
             "max": lambda: torch.maximum(xi, yi), "min": lambda: torch.minimum(xi, yi)}[op]()
        return _wrap(r, d), d

    def v_un(self, tree):
        _, op, ta, d = tree
        a, _ = self.value(ta)
        if op == "-":
            return ((torch.zeros_like(a) - a) if a.is_floating_point() else _wrap(-a.long(), d)), d
        if op == "~":
            return ~a, d
        return (a.abs() if a.is_floating_point() else _wrap(a.long().abs(), d)), d

    def v_astype(self, tree):
        _, d, ta = tree
        a, _ = self.value(ta)
        if a.is_floating_point() and not d.is_float and d is not st.bool_:
            lo, hi = S.int_range(d)
            x = torch.where(torch.isnan(a.double()), 0.0, a.double().trunc())
            big, small = x >= float(hi) + 1, x < float(lo)
            r = torch.where(big | small, 0.0, x).long()
            r = torch.where(big, hi, torch.where(small, lo, r))
            return r.to(d.torch), d
        if d is st.bool_:
            return a != 0, d
        return a.to(d.torch), d

    def v_where(self, tree):
        _, tc, ta, tb, d = tree
        c, _ = self.value(tc)
        a, da = self.value(ta)
        b, db = self.value(tb)
        d = _triton_type(a if da is None else da, b if db is None else db, False)
        return torch.where(self.to(c, st.bool_) if not isinstance(c, torch.Tensor) else c,
                           self.to(a, d), self.to(b, d)), d

    def v_small(self, tree):
        a, d = self.value(tree[1])
        t = torch.broadcast_to(a, self.shape)
        return torch.where(t.float().abs() < 1000.0, t, torch.zeros((), dtype=t.dtype)), d

    def v_math(self, tree):
        _, name, ta, d = tree
        a, _ = self.value(ta)
        fn = {"rsqrt": torch.rsqrt, "sigmoid": torch.sigmoid}.get(name) or getattr(torch, name)
        return fn(a.float()).to(d.torch), d

    def v_red(self, tree):
        _, name, ta, d = tree
        a, da = self.value(ta)
        t = torch.broadcast_to(a, self.shape)
        if name == "sum":
            r = t.float().sum(1) if t.is_floating_point() else t.long().sum(1)
        elif name in ("max", "min"):
            v = t.to(d.torch)
            if v.is_floating_point():
                fill = float("-inf") if name == "max" else float("inf")
                m = torch.where(torch.isnan(v), fill, v)
                r = m.amax(1) if name == "max" else m.amin(1)
                r = torch.where(torch.isnan(v).all(1), float("nan"), r)
            else:
                r = v.amax(1) if name == "max" else v.amin(1)
        else:
            v = t.float() if t.is_floating_point() else t.long()
            if v.is_floating_point():
                v = torch.where(torch.isnan(v), float("-inf") if name == "argmax" else float("inf"), v)
            r = v.argmax(1) if name == "argmax" else v.argmin(1)
        return _wrap(r, d)[:, None] if not d.is_float else r.to(d.torch)[:, None], d


def _wrap(r: torch.Tensor, d) -> torch.Tensor:
    if d is st.bool_:
        return r != 0
    return r.to(d.torch)


_CMP = {"<": torch.lt, "<=": torch.le, ">": torch.gt, ">=": torch.ge, "==": torch.eq,
        "!=": torch.ne}


def reference(case) -> list:
    """The case's outputs from the fp32 emulation, program by program."""
    from diffcases import inputs
    xs = inputs(case)
    outs = [torch.zeros(case.shape, dtype=d.torch) for d in case.out_dtypes]
    grid = [-(-n // t) for n, t in zip(case.shape, case.tile)]
    for p in range(int(np.prod(grid))):
        coords, rest = [], p
        for g in reversed(grid):
            coords.append(rest % g)
            rest //= g
        coords = coords[::-1]
        lo = [c * t for c, t in zip(coords, case.tile)]
        box = tuple(slice(a, min(a + t, n)) for a, t, n in zip(lo, case.tile, case.shape))
        inner = tuple(slice(0, b.stop - b.start) for b in box)
        tiles = []
        for x in xs:
            t = torch.zeros(case.tile, dtype=x.dtype)
            t[inner] = x[box]
            tiles.append(t)
        ref = Reference(case, tiles, case.n, case.s, coords[0], case.tile)
        for e, out, d in zip(case.exprs, outs, case.out_dtypes):
            v, _ = ref.value(e.tree)
            v = Reference.to(v, d) if not isinstance(v, torch.Tensor) else v.to(d.torch)
            out[box] = torch.broadcast_to(v, case.tile)[inner]
    return outs
