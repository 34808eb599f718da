"""Every tile operation of safetile.lang on the CPU executor, checked against torch.

fp16 and bf16 are computed the way the GPU computes them: in fp32 on upcast values, rounded
back to the element type after each operation. Element-wise results must therefore equal
torch's fp32 result rounded to the dtype exactly; reductions and matrix products (whose
summation order may differ) match within a few units in the last place.
"""
import re
import runpy
import tempfile
from pathlib import Path

import pytest
import torch

import safetile as st
import safetile.lang as sl

from lang_cases import (DTYPES, DTYPE_IDS, In, Out, assert_close, assert_within_one_ulp, rand,
                        result, rounded)
from lang_cases import cpu_executor  # noqa: F401  (the autouse fixture)


# ---- element-wise math --------------------------------------------------------------------------

def unary_kernel(op):
    """A kernel applying the tile operation ``op`` to each tile (the closure names a builtin)."""
    @st.kernel
    def apply(x: st.In[st.floats], z: st.Out[st.floats]):
        z.store(op(sl.load_like(x, z)))
    return apply


UNARY = [
    (sl.exp, torch.exp, False), (sl.exp2, torch.exp2, False), (sl.log, torch.log, True),
    (sl.log2, torch.log2, True), (sl.sqrt, torch.sqrt, True), (sl.rsqrt, torch.rsqrt, True),
    (sl.sin, torch.sin, False), (sl.cos, torch.cos, False), (sl.tanh, torch.tanh, False),
    (sl.sigmoid, torch.sigmoid, False), (sl.abs, torch.abs, False),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op,ref,positive", UNARY, ids=[u[0].name for u in UNARY])
def test_unary_math_is_fp32_math_rounded_to_the_dtype(op, ref, positive, dtype):
    x = rand((50,), dtype, seed=1, positive=positive)
    _, z = unary_kernel(op)(In(x), Out((50,), dtype, (16,))).sync()
    assert_within_one_ulp(result(z), rounded(ref(x.float()), dtype), dtype)


@st.kernel
def arithmetic(a: st.In[st.floats], b: st.In[st.floats], add: st.Out[st.floats],
               sub: st.Out[st.floats], mul: st.Out[st.floats], div: st.Out[st.floats],
               neg: st.Out[st.floats], scalars: st.Out[st.floats], mx: st.Out[st.floats],
               mn: st.Out[st.floats]):
    x = sl.load_like(a, add)
    y = sl.load_like(b, add)
    add.store(x + y)
    sub.store(x - y)
    mul.store(x * y)
    div.store(x / y)
    neg.store(-x)
    scalars.store(2.0 * x - 1.5)
    mx.store(sl.maximum(x, y))
    mn.store(sl.minimum(x, y))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_arithmetic_operators_maximum_and_minimum(dtype):
    n, tile = 40, (16,)
    x, y = rand((n,), dtype, 1), rand((n,), dtype, 2)
    outs = [Out((n,), dtype, tile) for _ in range(8)]
    _, _, *outs = arithmetic(In(x), In(y), *outs).sync()
    fx, fy = x.float(), y.float()
    expected = [fx + fy, fx - fy, fx * fy, fx / fy, -fx,
                rounded(2.0 * fx, dtype).float() - 1.5,     # two operations, two roundings
                torch.maximum(fx, fy), torch.minimum(fx, fy)]
    for got, want in zip(outs, expected):
        assert torch.equal(result(got), rounded(want, dtype))


NUMBERS = st.floats | st.int32 | st.int8


@st.kernel
def powers(x: st.In[NUMBERS], z1: st.Out[NUMBERS], z2: st.Out[NUMBERS], z3: st.Out[NUMBERS],
           z5: st.Out[NUMBERS]):
    v = sl.load_like(x, z1)
    z1.store(v ** 1)
    z2.store(v ** 2)
    z3.store(v ** 3)
    z5.store(v ** 5)


def multiplied(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` multiplied by itself ``n`` times, left to right, each product rounded to x's
    dtype (ints wrap)."""
    r = x
    for _ in range(n - 1):
        r = (r.float() * x.float()).to(x.dtype) if x.dtype.is_floating_point else r * x
    return r


@pytest.mark.parametrize("dtype", DTYPES + [st.i32, st.int8], ids=DTYPE_IDS + ["int32", "int8"])
def test_a_power_by_a_compile_time_int_is_that_many_rounded_multiplications(dtype):
    n, tile = 40, (16,)
    x = rand((n,), dtype, 4) if dtype.is_float else \
        torch.randint(-100, 100, (n,), generator=torch.Generator().manual_seed(4)).to(dtype.torch)
    _, *outs = powers(In(x), *(Out((n,), dtype, tile) for _ in range(4))).sync()
    for got, k in zip(outs, (1, 2, 3, 5)):
        assert torch.equal(result(got), multiplied(x, k))


@pytest.mark.parametrize("exponent, got", [
    ("n", "a st.int32 scalar"), ("0.5", "the compile-time 0.5"), ("0", "the compile-time 0"),
    ("-1", "the compile-time -1"), ("65", "the compile-time 65")])
def test_a_power_by_anything_but_a_compile_time_int_from_1_to_64_is_refused(exponent, got):
    src = (f"import safetile as st, safetile.lang as sl\n"
           f"@st.kernel\n"
           f"def p(x: st.In[st.f32], z: st.Out[st.f32], n: int):\n"
           f"    z.store(sl.load_like(x, z) ** {exponent})\n")
    path = Path(tempfile.mkdtemp()) / "pow_kernel.py"
    path.write_text(src)
    module = runpy.run_path(str(path))
    with pytest.raises(st.KernelDefinitionError,
                       match=rf"pow_kernel.py:4: .*compile-time int exponent from 1 to 64 .*got "
                             rf"{re.escape(got)}.*sl.sqrt"):
        module["p"](In(rand((8,), st.f32)), Out((8,), st.f32, (8,)), 2).sync()


@st.kernel
def comparisons(a: st.In[st.floats], b: st.In[st.floats], lt: st.Out[st.f32],
                le: st.Out[st.f32], gt: st.Out[st.f32], ge: st.Out[st.f32],
                eq: st.Out[st.f32], ne: st.Out[st.f32], sel: st.Out[st.floats]):
    x = sl.load_like(a, lt)
    y = sl.load_like(b, lt)
    lt.store(sl.where(x < y, 1.0, 0.0))
    le.store(sl.where(x <= y, 1.0, 0.0))
    gt.store(sl.where(x > y, 1.0, 0.0))
    ge.store(sl.where(x >= y, 1.0, 0.0))
    eq.store(sl.where(x == y, 1.0, 0.0))
    ne.store(sl.where(x != y, 1.0, 0.0))
    sel.store(sl.where(x > 0, x, y))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_comparison_operators_and_where(dtype):
    n, tile = 40, (16,)
    x, y = rand((n,), dtype, 1), rand((n,), dtype, 2)
    y[::3] = x[::3]                                         # some equal pairs
    outs = [Out((n,), st.f32, tile) for _ in range(6)] + [Out((n,), dtype, tile)]
    _, _, *outs = comparisons(In(x), In(y), *outs).sync()
    for got, cmp in zip(outs, [x < y, x <= y, x > y, x >= y, x == y, x != y]):
        assert torch.equal(result(got), cmp.float())
    assert torch.equal(result(outs[-1]), torch.where(x > 0, x, y))
    assert 0 < int((x == y).sum()) < n


@st.kernel
def int_division(a: st.In[st.i32], b: st.In[st.i32], q: st.Out[st.i32], r: st.Out[st.i32]):
    x = sl.load_like(a, q)
    y = sl.load_like(b, q)
    q.store(x // y)
    r.store(x % y)


def test_integer_division_and_remainder_follow_python_on_both_backends():
    x = torch.tensor([7, -7, 7, -7, 0, 13, -1, 100], dtype=torch.int32)
    y = torch.tensor([2, 2, -2, -2, 5, 4, 3, -7], dtype=torch.int32)
    _, _, q, r = int_division(In(x), In(y), Out((8,), st.i32, (4,)), Out((8,), st.i32, (4,))).sync()
    assert result(q).tolist() == [a // b for a, b in zip(x.tolist(), y.tolist())]
    assert result(r).tolist() == [a % b for a, b in zip(x.tolist(), y.tolist())]
    src = int_division.source(In(x), In(y), Out((8,), st.i32, (4,)), Out((8,), st.i32, (4,)))
    assert "_st_floordiv(x, y)" in src and "_st_floormod(x, y)" in src


# ---- reductions ---------------------------------------------------------------------------------

@st.kernel
def reduce_rows(x: st.In[st.floats, 2], s: st.Out[st.floats, 2], mx: st.Out[st.floats, 2],
                mn: st.Out[st.floats, 2], amax: st.Out[st.i32, 2], amin: st.Out[st.i32, 2],
                BC: st.Const[int]):
    i = s.index[0]
    t = x.load((i, 0), (s.shape[0], BC))
    s.store(sl.sum(t, 1)[:, None])
    mx.store(sl.max(t, 1)[:, None])
    mn.store(sl.min(t, 1)[:, None])
    amax.store(sl.argmax(t, 1)[:, None])
    amin.store(sl.argmin(t, 1)[:, None])


@st.kernel
def reduce_cols(x: st.In[st.floats, 2], s: st.Out[st.floats, 2], mx: st.Out[st.floats, 2],
                mn: st.Out[st.floats, 2], amax: st.Out[st.i32, 2], amin: st.Out[st.i32, 2],
                BR: st.Const[int]):
    j = s.index[1]
    t = x.load((0, j), (BR, s.shape[1]))
    s.store(sl.sum(t, 0)[None, :])
    mx.store(sl.max(t, 0)[None, :])
    mn.store(sl.min(t, 0)[None, :])
    amax.store(sl.argmax(t, 0)[None, :])
    amin.store(sl.argmin(t, 0)[None, :])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reductions_along_axis_1(dtype):
    x = rand((8, 16), dtype, 5)
    shape, tile = (8, 1), (4, 1)
    outs = [Out(shape, dtype, tile) for _ in range(3)] + [Out(shape, st.i32, tile) for _ in range(2)]
    _, s, mx, mn, amax, amin, _ = reduce_rows(In(x), *outs, 16).sync()
    assert_close(result(s)[:, 0], rounded(x.float().sum(1), dtype), dtype)
    assert torch.equal(result(mx)[:, 0], x.amax(1))
    assert torch.equal(result(mn)[:, 0], x.amin(1))
    assert torch.equal(result(amax)[:, 0], x.argmax(1).int())
    assert torch.equal(result(amin)[:, 0], x.argmin(1).int())


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reductions_along_axis_0(dtype):
    x = rand((8, 16), dtype, 6)
    shape, tile = (1, 16), (1, 8)
    outs = [Out(shape, dtype, tile) for _ in range(3)] + [Out(shape, st.i32, tile) for _ in range(2)]
    _, s, mx, mn, amax, amin, _ = reduce_cols(In(x), *outs, 8).sync()
    assert_close(result(s)[0], rounded(x.float().sum(0), dtype), dtype)
    assert torch.equal(result(mx)[0], x.amax(0))
    assert torch.equal(result(mn)[0], x.amin(0))
    assert torch.equal(result(amax)[0], x.argmax(0).int())
    assert torch.equal(result(amin)[0], x.argmin(0).int())


def test_argmax_returns_the_first_index_on_ties():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0] * 4] * 8)
    shape, tile = (8, 1), (4, 1)
    outs = [Out(shape, st.f32, tile) for _ in range(3)] + [Out(shape, st.i32, tile) for _ in range(2)]
    _, _, _, _, amax, amin, _ = reduce_rows(In(x), *outs, 16).sync()
    assert torch.equal(result(amax)[:, 0], torch.full((8,), 1, dtype=torch.int32))
    assert torch.equal(result(amin)[:, 0], torch.full((8,), 3, dtype=torch.int32))


@st.kernel
def row_extremes_padded(x: st.In[st.floats, 2], mx: st.Out[st.floats, 2],
                        mn: st.Out[st.floats, 2], s: st.Out[st.floats, 2], BC: st.Const[int]):
    i = mx.index[0]
    hi = x.load((i, 0), (mx.shape[0], BC), padding=float("-inf"))
    lo = x.load((i, 0), (mx.shape[0], BC), padding=float("inf"))
    zero = x.load((i, 0), (mx.shape[0], BC))
    mx.store(sl.max(hi, 1)[:, None])
    mn.store(sl.min(lo, 1)[:, None])
    s.store(sl.sum(zero, 1)[:, None])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_edge_tiles_read_the_padding_value_outside_the_tensor(dtype):
    # 5 rows in tiles of 2 (the last tile half outside), 12 columns loaded as 16: the padded
    # lanes read -inf before a max, +inf before a min and 0 before a sum, so they never win.
    x = -rand((5, 12), dtype, 7, positive=True)               # all negative: 0-padding would win a max
    _, mx, mn, s, _ = row_extremes_padded(
        In(x), Out((5, 1), dtype, (2, 1)), Out((5, 1), dtype, (2, 1)),
        Out((5, 1), dtype, (2, 1)), 16).sync()
    assert torch.equal(result(mx)[:, 0], x.amax(1))
    assert torch.equal(result(mn)[:, 0], x.amin(1))
    assert_close(result(s)[:, 0], rounded(x.float().sum(1), dtype), dtype)


# ---- matrix products ----------------------------------------------------------------------------

@st.kernel
def mma_loop(a: st.In[st.floats, 2], b: st.In[st.floats, 2], c: st.Out[st.f32, 2],
             BK: st.Const[int]):
    i, j = c.index
    acc = sl.zeros(c.shape, st.f32)
    for k in range(sl.cdiv(a.shape[1], BK)):
        acc = sl.mma(a.load((i, k), (c.shape[0], BK)), b.load((k, j), (BK, c.shape[1])), acc)
    c.store(acc)


@st.kernel
def products(a: st.In[st.floats, 2], b: st.In[st.floats, 2], mm: st.Out[st.f32, 2],
             at: st.Out[st.f32, 2]):
    x = a.load((0, 0), (16, 16))
    y = b.load((0, 0), (16, 16))
    mm.store(sl.matmul(x, y))
    at.store(x @ y + sl.mma(x, y, sl.full((16, 16), 1.0, st.f32)))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_mma_accumulates_in_fp32_across_loop_iterations_with_masked_edges(dtype):
    # (20 x 40) @ (40 x 24) in 16x16 tiles with BK=16: every edge is partial.
    a, b = rand((20, 40), dtype, 1), rand((40, 24), dtype, 2)
    _, _, c, _ = mma_loop(In(a), In(b), Out((20, 24), st.f32, (16, 16)), 16).sync()
    torch.testing.assert_close(result(c), a.float() @ b.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_matmul_and_the_at_operator(dtype):
    a, b = rand((16, 16), dtype, 3), rand((16, 16), dtype, 4)
    _, _, mm, at = products(In(a), In(b), Out((16, 16), st.f32, (16, 16)),
                            Out((16, 16), st.f32, (16, 16))).sync()
    expected = a.float() @ b.float()
    torch.testing.assert_close(result(mm), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result(at), 2 * expected + 1, rtol=1e-5, atol=1e-5)


# ---- conversion and shape -----------------------------------------------------------------------

@st.kernel
def casts(x: st.In[st.f32], down: st.Out[st.floats], up: st.Out[st.f32],
          ints: st.Out[st.i32], DT: st.Const[st.dtype]):
    t = sl.load_like(x, down)
    down.store(t.astype(DT))
    up.store(t.astype(DT).astype(st.f32))
    ints.store((t * 10.0).astype(st.i32))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_astype_rounds_to_nearest_and_float_to_int_truncates(dtype):
    x = rand((24,), st.f32, 9)
    _, down, up, ints, _ = casts(In(x), Out((24,), dtype, (8,)), Out((24,), st.f32, (8,)),
                                 Out((24,), st.i32, (8,)), dtype).sync()
    assert torch.equal(result(down), x.to(dtype.torch))
    assert torch.equal(result(up), x.to(dtype.torch).float())
    assert torch.equal(result(ints), (x * 10.0).to(torch.int32))


@st.kernel
def reshapes(x: st.In[st.floats, 2], r: st.Out[st.floats, 2], tr: st.Out[st.floats, 2],
             dot_t: st.Out[st.floats, 2]):
    t = x.load((0, 0), (4, 8))
    r.store(sl.reshape(t, (8, 4)))
    tr.store(sl.transpose(t))
    dot_t.store(t.T * 2.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reshape_transpose_and_dot_t(dtype):
    x = rand((4, 8), dtype, 10)
    _, r, tr, dot_t = reshapes(In(x), *[Out((8, 4), dtype, (8, 4)) for _ in range(3)]).sync()
    assert torch.equal(result(r), x.reshape(8, 4))
    assert torch.equal(result(tr), x.T)
    assert torch.equal(result(dot_t), rounded(x.T.float() * 2.0, dtype))


@st.kernel
def permute_3d(x: st.In[st.floats, 3], z: st.Out[st.floats, 3]):
    z.store(sl.permute(x.load((0, 0, 0), (2, 4, 8)), (2, 0, 1)))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_permute_reorders_axes(dtype):
    x = rand((2, 4, 8), dtype, 11)
    _, z = permute_3d(In(x), Out((8, 2, 4), dtype, (8, 2, 4))).sync()
    assert torch.equal(result(z), x.permute(2, 0, 1))


@st.kernel
def broadcast_rows(x: st.In[st.floats, 2], z: st.Out[st.floats, 2]):
    row = x.load((0, z.index[1]), (1, z.shape[1]))
    z.store(sl.broadcast_to(row, z.shape) + row)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_broadcast_to_stretches_size_one_axes(dtype):
    x = rand((1, 16), dtype, 12)
    _, z = broadcast_rows(In(x), Out((6, 16), dtype, (4, 8))).sync()
    assert torch.equal(result(z), rounded((x.float() * 2).expand(6, 16), dtype))


# ---- construction and program geometry ----------------------------------------------------------

@st.kernel
def construct(z: st.Out[st.floats], f: st.Out[st.floats], zz: st.Out[st.floats],
              DT: st.Const[st.dtype], V: st.Const[float]):
    z.store(sl.arange(8).astype(DT) + z.index[0] * 8)
    f.store(sl.full((8,), V, DT))
    zz.store(sl.zeros((8,), DT) + 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_arange_full_and_zeros(dtype):
    outs = [Out((24,), dtype, (8,)) for _ in range(3)]
    z, f, zz, _, _ = construct(*outs, dtype, 2.5).sync()
    assert torch.equal(result(z), torch.arange(24).to(dtype.torch))
    assert torch.equal(result(f), torch.full((24,), 2.5, dtype=dtype.torch))
    assert torch.equal(result(zz), torch.ones(24, dtype=dtype.torch))


@st.kernel
def geometry(x: st.In[st.f32], ids: st.Out[st.i32], n: st.Out[st.i32], c: st.Out[st.i32],
             tile: st.Out[st.i32]):
    ids.store(sl.zeros(ids.shape, st.i32) + sl.bid(0))
    n.store(sl.zeros(n.shape, st.i32) + sl.num_blocks(0))
    c.store(sl.zeros(c.shape, st.i32) + sl.cdiv(x.shape[0], 4))
    tile.store(sl.zeros(tile.shape, st.i32) + tile.index[0])


def test_bid_num_blocks_and_cdiv_in_a_row_major_launch():
    # One program per tile, programs numbered in row-major tile order.
    x = torch.zeros(13)
    outs = [Out((6,), st.i32, (2,)) for _ in range(4)]
    _, ids, n, c, tile = geometry(In(x), *outs).sync()
    program_of_element = torch.arange(6, dtype=torch.int32) // 2
    assert torch.equal(result(ids), program_of_element)
    assert torch.equal(result(n), torch.full((6,), 3, dtype=torch.int32))
    assert torch.equal(result(c), torch.full((6,), 4, dtype=torch.int32))       # cdiv(13, 4)
    assert torch.equal(result(tile), program_of_element)


@st.kernel
def grid_axes(ids: st.Out[st.i32, 2], n: st.Out[st.i32, 2]):
    ids.store(sl.zeros(ids.shape, st.i32) + sl.bid(0) * 100 + sl.bid(1) * 10 + sl.bid(2))
    n.store(sl.zeros(n.shape, st.i32) + sl.num_blocks(0) * 100 + sl.num_blocks(1) * 10 +
            sl.num_blocks(2))


@pytest.mark.parametrize("order", ["row_major", "grouped"])
def test_the_launch_grid_is_the_out_grid_bid_and_num_blocks_are_its_axes(order):
    kw = dict(order="grouped", group_size=2) if order == "grouped" else {}
    ids, n = (st.full((12, 20), -1, dtype=st.i32, device="cpu").partition((4, 4), **kw)
              for _ in range(2))
    ids, n = grid_axes(ids, n).sync()
    rows, cols = torch.arange(12)[:, None] // 4, torch.arange(20)[None, :] // 4
    assert torch.equal(result(ids), (rows * 100 + cols * 10).int())   # axis 2: bid 0
    assert torch.equal(result(n), torch.full((12, 20), 351, dtype=torch.int32))  # (3, 5, 1)


@st.kernel
def per_program(z: st.Out[st.i32]):
    for t in z.tiles():
        t.store(sl.zeros(t.shape, st.i32) + sl.bid(0) * 100 + sl.num_blocks(0))


def test_a_persistent_launch_numbers_its_programs_on_axis_0():
    z = st.empty((32,), dtype=st.i32, device="cpu").partition((4,), persistent=3)
    (z,) = per_program(z).sync()
    assert sorted(set(result(z).tolist())) == [3, 103, 203]
