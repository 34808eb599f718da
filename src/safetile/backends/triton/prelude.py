"""Triton helper functions that generated kernels call: masked tile loads and stores.

Every generated module starts with the helpers it uses, so the file is self-contained and
readable on its own. Tile ``(i0, i1, ...)`` of shape ``(t0, t1, ...)`` covers elements
``i_k * t_k + [0, t_k)`` on each axis; lanes outside ``[0, n_k)`` are masked off (loads read
``pad``). A sub-tile ``(j0, ...)`` of shape ``(r0, ...)`` inside owned tile ``(i0, ...)`` covers
``i_k * t_k + j_k * r_k + [0, r_k)`` and is masked to the owned slab as well as the tensor.
"""
from __future__ import annotations

HEADER = '''import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice
'''

FIXED = {
    "_st_tanh": '''
@triton.jit
def _st_tanh(x):
    if x.dtype.is_fp16() or x.dtype.is_bf16() or x.dtype.is_fp32():
        return libdevice.tanh(x.to(tl.float32)).to(x.dtype)
    else:
        return libdevice.tanh(x.to(tl.float32))       # integers give fp32, as other math does
''',
    "_st_sum": '''
@triton.jit
def _st_sum(x, axis: tl.constexpr = None):
    if x.dtype.is_fp16() or x.dtype.is_bf16():
        return tl.sum(x.to(tl.float32), axis).to(x.dtype)
    else:
        return tl.sum(x, axis)
''',
    # Python's floor division and remainder of ints (lang/semantics.py): no division here can
    # trap or be undefined (x // 0 is 0, x % 0 is x, INT_MIN // -1 wraps).
    "_st_floordiv": '''
@triton.jit
def _st_floordiv(a, b):
    a2 = a + b * 0
    b2 = b + a * 0
    nz = tl.where(b2 == 0, 1, b2)
    q = tl.where(nz == -1, -a2, a2 // tl.where(nz == -1, 1, nz))
    r = a2 - q * nz
    q = tl.where((r != 0) & ((r < 0) != (nz < 0)), q - 1, q)
    return tl.where(b2 == 0, 0, q)
''',
    "_st_floormod": '''
@triton.jit
def _st_floormod(a, b):
    a2 = a + b * 0
    b2 = b + a * 0
    safe = tl.where((b2 == 0) | (b2 == -1), 1, b2)
    r = a2 % safe
    r = tl.where((r != 0) & ((r < 0) != (safe < 0)), r + safe, r)
    return tl.where(b2 == 0, a2, r)
''',
    "_st_cdiv": '''
@triton.jit
def _st_cdiv(a, b):
    q = _st_floordiv(a, b)
    return tl.where(_st_floormod(a, b) != 0, q + 1, q)
''',
    # Shifts by an amount outside [0, bits) are 0 (<<) or the sign fill (>>), never undefined.
    # Both operands broadcast through `x ^ x` (a zero of x's own type): `bool * 0` would be
    # int32 and widen an int8 or bool shift (lang/semantics.py promotes bool to the int); the
    # fill constants are int32 too, hence the cast of the result back to the operands' type.
    "_st_shl": '''
@triton.jit
def _st_shl(a, b):
    a2 = a + (b ^ b)
    b2 = b + (a ^ a)
    ok = (b2 >= 0) & (b2 < a2.dtype.primitive_bitwidth)
    return tl.where(ok, a2 << tl.where(ok, b2, 0), 0).to(a2.dtype)
''',
    "_st_shr": '''
@triton.jit
def _st_shr(a, b):
    a2 = a + (b ^ b)
    b2 = b + (a ^ a)
    ok = (b2 >= 0) & (b2 < a2.dtype.primitive_bitwidth)
    return tl.where(ok, a2 >> tl.where(ok, b2, 0), tl.where(a2 < 0, -1, 0)).to(a2.dtype)
''',
    # float -> int: truncate toward zero and saturate; NaN gives 0 (never an undefined cast).
    "_st_f2i": '''
@triton.jit
def _st_f2i(x, dtype: tl.constexpr, lo: tl.constexpr, hi: tl.constexpr):
    xf = x.to(tl.float32)
    r = tl.where((xf >= lo * 1.0) & (xf < (hi + 1) * 1.0), xf, 0.0).to(dtype)
    r = tl.where(xf >= (hi + 1) * 1.0, hi, r)
    return tl.where(xf < lo * 1.0, lo, r)
''',
    # arg-extrema count a NaN as -inf / +inf (it never beats a number), so the result does not depend on the
    # reduction tree.
    "_st_argmax": '''
@triton.jit
def _st_argmax(x, axis: tl.constexpr):
    if x.dtype.is_floating():
        x = tl.where(x != x, float("-inf"), x)
    return tl.argmax(x, axis)
''',
    "_st_argmin": '''
@triton.jit
def _st_argmin(x, axis: tl.constexpr):
    if x.dtype.is_floating():
        x = tl.where(x != x, float("inf"), x)
    return tl.argmin(x, axis)
''',
    # x ** n (lang/semantics.py): n factors multiplied left to right, each product rounded as
    # the language's `*` rounds it.
    "_st_pow": '''
@triton.jit
def _st_pow(x, n: tl.constexpr):
    r = x
    for _ in tl.static_range(n - 1):
        r = r * x
    return r
''',
    # The tensor-descriptor coordinate of tile index i with block b: where i * b would pass
    # the int32 range, a box wholly outside the tensor (read as zeros) instead of a wrap.
    "_st_tmacoord": '''
@triton.jit
def _st_tmacoord(i, b: tl.constexpr):
    return tl.where((i >= -(2147483647 // b)) & (i <= 2147483647 // b), i * b, -b)
''',
}


#: Prelude helpers that call others (the emitter includes those too).
DEPENDS = {"_st_cdiv": ("_st_floordiv", "_st_floormod")}


def _bcast(k: int, r: int) -> str:
    """Index suffix that places a 1-D axis k into rank r: e.g. [:, None] for k=0, r=2."""
    if r == 1:
        return ""
    return "[" + ", ".join(":" if j == k else "None" for j in range(r)) + "]"


def _args(prefix: str, r: int) -> str:
    return ", ".join(f"{prefix}{k}" for k in range(r))


def _cargs(prefix: str, r: int) -> str:
    return ", ".join(f"{prefix}{k}: tl.constexpr" for k in range(r))


def _offsets(r: int, sub: bool, neg: bool = False) -> list[str]:
    lines = []
    for k in range(r):
        if sub:
            lines.append(f"    l{k} = j{k} * r{k} + tl.arange(0, r{k})")
            lines.append(f"    o{k} = i{k} * t{k} + l{k}")
        else:
            lines.append(f"    o{k} = i{k} * t{k} + tl.arange(0, t{k})")
    off = " + ".join(f"o{k}{_bcast(k, r)} * s{k}" for k in range(r))
    lines.append(f"    off = {off}")
    masks = []
    for k in range(r):
        if sub:
            # j outside the sub-grid is masked off whole (j * r cannot wrap for the others)
            cond = (f"(j{k} >= 0) & (j{k} < (t{k} + r{k} - 1) // r{k}) & (l{k} < t{k}) & "
                    f"(o{k} < n{k})")
        else:
            cond = f"(o{k} < n{k})"
        masks.append(f"({cond}){_bcast(k, r)}")
    lines.append(f"    m = {' & '.join(masks)}")
    if neg:
        nonneg = " & ".join(f"(o{k} >= 0){_bcast(k, r)}" for k in range(r))
        lines.append(f"    if CHECK_NEG:\n        m = m & {nonneg}")
    return lines


def load_tile(r: int) -> str:
    head = (f"def _st_load{r}(ptr, {_args('n', r)}, {_args('s', r)}, {_args('i', r)}, "
            f"{_cargs('t', r)}, pad: tl.constexpr, CHECK_NEG: tl.constexpr):")
    body = _offsets(r, sub=False, neg=True) + ["    return tl.load(ptr + off, mask=m, other=pad)"]
    return "\n@triton.jit\n" + head + "\n" + "\n".join(body) + "\n"


def store_tile(r: int) -> str:
    head = (f"def _st_store{r}(ptr, {_args('n', r)}, {_args('s', r)}, {_args('i', r)}, "
            f"{_cargs('t', r)}, value):")
    body = _offsets(r, sub=False) + ["    tl.store(ptr + off, value, mask=m)"]   # owned: i >= 0
    return "\n@triton.jit\n" + head + "\n" + "\n".join(body) + "\n"


def desc_store_tile(r: int) -> str:
    """Store the owned tile through a tensor descriptor (TMA); out-of-bounds elements drop."""
    head = f"def _st_dstore{r}(desc, {_args('i', r)}, {_cargs('t', r)}, value):"
    coords = ", ".join(f"i{k} * t{k}" for k in range(r))
    shape = ", ".join(f"t{k}" for k in range(r))
    body = [f"    desc.store([{coords}], tl.broadcast_to(value, ({shape},)).to(desc.dtype))"]
    return "\n@triton.jit\n" + head + "\n" + "\n".join(body) + "\n"


def index_load_tile(r: int) -> str:
    """``_st_iload<r>``: a tile load at a data-dependent tile index. A tile index ``i`` with
    ``i * t`` past the int32 range names a box wholly outside the tensor, so such a program
    reads padding (the ``i`` range check) instead of a wrapped box; for the others every
    coordinate ``i * t + [0, t)`` fits in int32 (``lang/semantics.py``)."""
    head = (f"def _st_iload{r}(ptr, {_args('n', r)}, {_args('s', r)}, {_args('i', r)}, "
            f"{_cargs('t', r)}, pad: tl.constexpr):")
    body = []
    for k in range(r):
        body.append(f"    o{k} = i{k} * t{k} + tl.arange(0, t{k})")
    body.append("    off = " + " + ".join(f"o{k}{_bcast(k, r)} * s{k}" for k in range(r)))
    body.append("    m = " + " & ".join(
        f"((o{k} < n{k}) & (i{k} >= 0) & (i{k} <= 2147483647 // t{k})){_bcast(k, r)}"
        for k in range(r)))
    body.append("    return tl.load(ptr + off, mask=m, other=pad)")
    return "\n@triton.jit\n" + head + "\n" + "\n".join(body) + "\n"


def sub_tile(r: int, store: bool) -> str:
    name = f"_st_substore{r}" if store else f"_st_subload{r}"
    extra = "value" if store else "pad: tl.constexpr"
    head = (f"def {name}(ptr, {_args('n', r)}, {_args('s', r)}, {_args('i', r)}, "
            f"{_cargs('t', r)}, {_args('j', r)}, {_cargs('r', r)}, {extra}):")
    last = ("    tl.store(ptr + off, value, mask=m)" if store
            else "    return tl.load(ptr + off, mask=m, other=pad)")
    body = _offsets(r, sub=True) + [last]
    return "\n@triton.jit\n" + head + "\n" + "\n".join(body) + "\n"


def load_at(r: int) -> str:
    """A box of shape ``(t0, ...)`` starting at element ``(e0, ...)``: masked on every side."""
    head = (f"def _st_loadat{r}(ptr, {_args('n', r)}, {_args('s', r)}, {_args('e', r)}, "
            f"{_cargs('t', r)}, pad: tl.constexpr):")
    body = []
    for k in range(r):
        body.append(f"    o{k} = e{k} + tl.arange(0, t{k})")
    body.append("    off = " + " + ".join(f"o{k}{_bcast(k, r)} * s{k}" for k in range(r)))
    body.append("    m = " + " & ".join(f"((o{k} >= 0) & (o{k} < n{k})){_bcast(k, r)}" for k in range(r)))
    body.append("    return tl.load(ptr + off, mask=m, other=pad)")
    return "\n@triton.jit\n" + head + "\n" + "\n".join(body) + "\n"


def load_scalar(r: int) -> str:
    head = f"def _st_scalar{r}(ptr, {_args('n', r)}, {_args('s', r)}, {_args('e', r)}, pad: tl.constexpr):"
    m = " & ".join(f"(e{k} >= 0) & (e{k} < n{k})" for k in range(r))
    off = " + ".join(f"e{k} * s{k}" for k in range(r))
    return (f"\n@triton.jit\n{head}\n    return tl.load(ptr + ({off}), mask={m}, other=pad)\n")


# PTX of one predicated L2 prefetch per lane: $1 the address, $2 nonzero where the lane is
# inside the tensor. The instruction loads nothing into a register (the dummy result $0 is a
# constant), so the value at the address cannot influence the program.
PREFETCH_ASM = ("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; "
                "mov.u32 $0, 0; }")


def prefetch_tile(r: int) -> str:
    """``_st_prefetch<r>``: prefetch into L2 the lines of tile ``(i0, ...)`` of shape
    ``(t0, ...)``, one point every ``STEP`` elements of the last axis (a line's worth when the
    last stride is 1). Not pure, so the compiler keeps it although its result is unused."""
    head = (f"def _st_prefetch{r}(ptr, {_args('n', r)}, {_args('s', r)}, {_args('i', r)}, "
            f"{_cargs('t', r)}, STEP: tl.constexpr):")
    body = []
    for k in range(r):
        if k == r - 1:
            body.append(f"    o{k} = i{k} * t{k} + tl.arange(0, t{k} // STEP) * STEP")
        else:
            body.append(f"    o{k} = i{k} * t{k} + tl.arange(0, t{k})")
    body.append("    off = " + " + ".join(f"o{k}{_bcast(k, r)} * s{k}" for k in range(r)))
    body.append("    m = " + " & ".join(f"((o{k} >= 0) & (o{k} < n{k})){_bcast(k, r)}"
                                        for k in range(r)))
    body.append("    tl.inline_asm_elementwise(" + repr(PREFETCH_ASM) +
                ", \"=r,l,r\", [ptr + tl.where(m, off, 0), m.to(tl.int32)], "
                "dtype=tl.int32, is_pure=False, pack=1)")
    return "\n@triton.jit\n" + head + "\n" + "\n".join(body) + "\n"


# Element-wise functions whose Triton spelling accepts only fp32/fp64 (``tl.exp`` etc.).
FP32_MATH = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "sigmoid")


def fp32_math(fn: str) -> str:
    """``_st_m_<fn>``: ``tl.<fn>`` on any dtype. fp16/bf16 are computed in fp32 and rounded back
    (as the CPU executor does), integers give fp32; Triton itself rejects anything but fp32/fp64."""
    return f'''
@triton.jit
def _st_m_{fn}(x):
    if x.dtype.is_fp16() or x.dtype.is_bf16():
        return tl.{fn}(x.to(tl.float32)).to(x.dtype)
    elif x.dtype.is_floating():
        return tl.{fn}(x)
    else:
        return tl.{fn}(x.to(tl.float32))
'''


def helper_source(name: str) -> str:
    """Source of the prelude helper called ``name`` (e.g. ``_st_load2``)."""
    if name in FIXED:
        return FIXED[name]
    if name.startswith("_st_m_") and name[len("_st_m_"):] in FP32_MATH:
        return fp32_math(name[len("_st_m_"):])
    for prefix, make in (("_st_substore", lambda r: sub_tile(r, True)),
                         ("_st_subload", lambda r: sub_tile(r, False)),
                         ("_st_scalar", load_scalar), ("_st_loadat", load_at),
                         ("_st_prefetch", prefetch_tile),
                         ("_st_iload", index_load_tile),
                         ("_st_load", load_tile),
                         ("_st_dstore", desc_store_tile),
                         ("_st_store", store_tile)):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return make(int(name[len(prefix):]))
    raise KeyError(name)
