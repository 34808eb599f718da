"""Regression tests for the miscompiles and CPU/GPU disagreements a red-team run found: each
runs on the CPU executor and as generated Triton (Triton's interpreter), and both must give
the stated result (lang/semantics.py) or both must refuse the kernel with file:line."""
import math

import pytest
import torch

import backends as be
import safetile as st
import safetile.lang as sl


def t(values, dtype=torch.float32):
    return st.from_torch(torch.tensor(values, dtype=dtype))


def out(n, dtype=st.f32):
    return st.empty((n,), dtype=dtype).partition((1 << (n - 1).bit_length(),))


def both(kernel, make_args, n_in: int, n_out: int) -> list:
    """The outputs on the CPU executor; asserts the interpreted generated code agrees."""
    cpu = be.run_cpu(kernel, make_args(), n_in, n_out)
    gpu_code = be.run_interpreter(kernel, make_args(), n_in, n_out)
    for a, b in zip(cpu, gpu_code):
        assert be.same(a, b, approx=False, zero_sign=False), (a, b)
    return cpu


def refused(kernel, args, match):
    """Both backends refuse: the CPU executor at launch, the code generator likewise."""
    with st.backend("interpret"), pytest.raises(st.KernelDefinitionError, match=match) as e:
        kernel(*args)
    assert e.value.lineno > 0 and "[type]" in str(e.value)
    with pytest.raises(st.KernelDefinitionError, match=match):
        kernel.source(*e.value.recovered)
    return e.value


# ---- 2. silent miscompiles ---------------------------------------------------------------------

def _scaled_by(k):
    @st.function
    def scale(x):
        return x * k
    return scale


double, triple = _scaled_by(2.0), _scaled_by(3.0)       # one factory: one __name__


@st.kernel
def two_helpers(x: st.In[st.f32], z: st.Out[st.f32]):
    v = sl.load_like(x, z)
    z.store(double(v) + triple(v))


def test_helpers_with_one_name_stay_two_helpers():
    got = both(two_helpers, lambda: [t([1.0, 2.0]), out(2)], 1, 1)[0]
    assert got.tolist() == [5.0, 10.0]                 # was 6.0 on the GPU (one helper)
    src = two_helpers.source(t([1.0, 2.0]), out(2))
    assert "def _stf_scale(" in src and "def _stf_scale_1(" in src


@st.kernel
def three_way(x: st.In[st.f32], y: st.In[st.f32], w: st.In[st.f32], lo: st.Out[st.f32],
              hi: st.Out[st.f32]):
    a, b, c = sl.load_like(x, lo), sl.load_like(y, lo), sl.load_like(w, lo)
    lo.store(min(a, b, c))
    hi.store(max(a, b, c))


def test_three_operand_min_and_max_use_every_operand():
    args = lambda: [t([1.0, 5.0]), t([2.0, 4.0]), t([0.5, 9.0]), out(2), out(2)]
    lo, hi = both(three_way, args, 3, 2)
    assert lo.tolist() == [0.5, 4.0] and hi.tolist() == [2.0, 9.0]
    assert "tl.minimum(tl.minimum(a, b), c)" in three_way.source(*args())


@st.kernel
def loop_variable_after_loop(x: st.In[st.f32], z: st.Out[st.f32], n: int):
    acc = sl.load_like(x, z)
    for i in range(n):
        acc = acc + 1.0
    z.store(acc * i)


def test_a_loop_variable_used_after_its_loop_is_refused():
    refused(loop_variable_after_loop, [t([1.0]), out(1), 3], "variable of the loop")


@st.kernel
def divide_by_const(x: st.In[st.f32], z: st.Out[st.f32], C: st.Const[float]):
    z.store(sl.load_like(x, z) / C)


def test_a_compile_time_minus_zero_is_plus_zero_on_both_backends_and_nan_adds_no_variants():
    got = both(divide_by_const, lambda: [t([1.0, -1.0]), out(2), -0.0], 1, 1)[0]
    assert got.tolist() == [math.inf, -math.inf]       # the stated +0.0 (as Triton builds it)
    for _ in range(3):
        divide_by_const.source(t([1.0]), out(1), float("nan"))
    keys = [k for k in divide_by_const._launches.variants if isinstance(k.args[2].value, float)]
    assert sum(1 for k in keys if k.args[2].value != k.args[2].value) == 1


# ---- 3. the backends used to disagree -----------------------------------------------------------

@st.kernel
def float_mod(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) % 2.0)


def test_float_remainder_and_floor_division_are_refused_with_a_hint():
    refused(float_mod, [t([1.0]), out(1)], "on floats is not supported")


@st.kernel
def half_meets_scalar(x: st.In[st.bf16], z: st.Out[st.f32], q: st.Out[st.f32],
                      m: st.Out[st.bf16], s: float):
    v = sl.load_like(x, z)
    z.store(v * s)                  # bf16 * runtime fp32: computed and returned in fp32
    q.store(v / v)                  # / of bf16 returns fp32
    m.store(sl.maximum(v, v * 0.5))


@st.kernel
def half_meets_int(x: st.In[st.bf16], z: st.Out[st.f32], n: int):
    z.store(sl.load_like(x, z) + n)


def test_a_bf16_tile_meeting_a_runtime_float_computes_in_fp32_as_triton_does():
    x = torch.tensor([1.0, 3.0, 0.1], dtype=torch.bfloat16)
    with st.backend("interpret"):
        _, z, q, m, _ = half_meets_scalar(st.from_torch(x.clone()), out(3), out(3),
                                          out(3, st.bf16), 0.1).sync()
    assert torch.equal(z.unpartition().to_torch(), x.float() * torch.tensor(0.1))
    assert q.unpartition().to_torch().tolist() == [1.0, 1.0, 1.0]
    assert torch.equal(m.unpartition().to_torch(), x)


def test_a_bf16_tile_meeting_an_int_parameter_is_refused():
    # Triton passes an int argument equal to 1 as a compile-time 1, which keeps bf16, and any
    # other value as an int32, which promotes to fp32: the type would depend on the value
    refused(half_meets_int, [t([1.0], torch.bfloat16), out(1), 3], "int parameters or In shapes")


@st.kernel
def saturate(x: st.In[st.f32], i: st.Out[st.i32], b: st.Out[st.int8]):
    v = sl.load_like(x, i)
    i.store(v.astype(st.i32))
    b.store(v.astype(st.int8))


def test_float_to_int_conversions_saturate_and_nan_gives_zero():
    vals = [1.9, -1.9, 3e9, -3e9, math.inf, -math.inf, math.nan, 300.0]
    i, b = both(saturate, lambda: [t(vals), out(8, st.i32), out(8, st.int8)], 1, 2)
    assert i.tolist() == [1, -1, 2**31 - 1, -2**31, 2**31 - 1, -2**31, 0, 300]
    assert b.tolist() == [1, -1, 127, -128, 127, -128, 0, 127]


@st.kernel
def bool_add(x: st.In[st.bool_], z: st.Out[st.int8]):
    v = sl.load_like(x, z)
    z.store(v + v)


def test_arithmetic_on_bools_is_refused_with_a_hint():
    e = refused(bool_add, [t([True], torch.bool), out(1, st.int8)], "bools take no part")
    assert ".astype(st.int32)" in str(e)


@st.kernel
def argmax_nan(x: st.In[st.f32, 2], z: st.Out[st.i32, 2]):
    z.store(sl.argmax(sl.load_like(x, z), 1)[:, None] + sl.zeros(z.shape, st.i32))


def test_argmax_skips_nan_on_both_backends():
    nan = math.nan
    rows = [[1.0, nan, 3.0, 2.0], [nan, nan, nan, nan], [nan, -1.0, -2.0, nan], [5.0] * 4]
    x = lambda: st.from_torch(torch.tensor(rows))
    (got,) = both(argmax_nan, lambda: [x(), st.empty((4, 4), dtype=st.i32).partition((4, 4))],
                  1, 1)
    assert got[:, 0].tolist() == [2, 0, 1, 0]


@st.kernel
def negatives(a: st.In[st.i32], b: st.In[st.i32], q: st.Out[st.i32], r: st.Out[st.i32],
              c: st.Out[st.i32]):
    x, y = sl.load_like(a, q), sl.load_like(b, q)
    q.store(x // y)
    r.store(x % y)
    c.store(sl.cdiv(x, y))


def test_division_remainder_and_cdiv_of_negatives_follow_python():
    xs, ys = [7, -7, 7, -7, -2**31, 13, -1, 0], [2, 2, -2, -2, -1, -4, 3, 5]
    args = lambda: [t(xs, torch.int32), t(ys, torch.int32), out(8, st.i32), out(8, st.i32),
                    out(8, st.i32)]
    q, r, c = both(negatives, args, 2, 3)
    wq = [x // y for x, y in zip(xs, ys)]
    wq[4] = -2**31                                       # 2**31 wraps to INT_MIN
    assert q.tolist() == wq
    assert r.tolist() == [x % y for x, y in zip(xs, ys)]
    assert c.tolist() == [(-(-x // y)) if i != 4 else -2**31 for i, (x, y) in
                          enumerate(zip(xs, ys))]


def test_integer_division_by_zero_is_reported_on_the_cpu_and_zero_in_generated_code():
    args = lambda: [t([7, -7], torch.int32), t([0, 0], torch.int32), out(2, st.i32),
                    out(2, st.i32), out(2, st.i32)]
    with st.backend("interpret"), pytest.raises(st.errors.DivisionByZeroError):
        negatives(*args()).sync()
    q, r, _ = be.run_interpreter(negatives, args(), 2, 3)
    assert q.tolist() == [0, 0] and r.tolist() == [7, -7]


GLOBAL_SCALE = 2.0


@st.kernel
def uses_global(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) * GLOBAL_SCALE)


def test_globals_rebound_after_the_decorator_change_neither_backend():
    global GLOBAL_SCALE
    GLOBAL_SCALE = 5.0
    try:
        got = both(uses_global, lambda: [t([1.0]), out(1)], 1, 1)[0]
    finally:
        GLOBAL_SCALE = 2.0
    assert got.tolist() == [2.0]


@st.function
def plus_one(x):
    return x + 1.0


@st.kernel
def calls_helper(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(plus_one(sl.load_like(x, z)))


def test_a_helper_rebound_to_plain_python_still_runs_its_checked_body_on_the_cpu():
    global plus_one
    checked = plus_one
    plus_one = lambda x: x * 100.0                      # noqa: E731
    try:
        got = both(calls_helper, lambda: [t([1.0]), out(1)], 1, 1)[0]
    finally:
        plus_one = checked
    assert got.tolist() == [2.0]


# ---- 5. accepted on the CPU, impossible on the GPU: now refused on both -----------------------

@st.kernel
def float_of_runtime(x: st.In[st.f32], z: st.Out[st.f32], n: int):
    z.store(sl.load_like(x, z) * float(n))


@st.kernel
def power(x: st.In[st.f32], z: st.Out[st.f32], n: int):
    v = sl.load_like(x, z)
    z.store(v ** n)


@st.kernel
def cube(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) ** 3)


def test_a_power_by_a_compile_time_int_runs_as_the_same_multiplications_on_both_backends():
    values = [1.5, -2.25, 3.0078125, 0.1, -7.5]         # (fp32: Triton's interpreter's bf16
    got = both(cube, lambda: [t(values), out(5)], 1, 1)[0]     # is not the GPU's)
    x = torch.tensor(values)
    assert torch.equal(got[:5], (x * x) * x)


@st.kernel
def one_branch(x: st.In[st.f32], z: st.Out[st.f32], n: int):
    v = sl.load_like(x, z)
    if n > 0:
        w = v * 2.0
    z.store(w)


@st.kernel
def int8_overflow(x: st.In[st.int8], z: st.Out[st.int8]):
    z.store(sl.load_like(x, z) + 300)


@st.kernel
def float_mma_int_acc(x: st.In[st.f32, 2], z: st.Out[st.i32, 2]):
    a = sl.load_like(x, z)
    z.store(sl.mma(a, a, sl.zeros(z.shape, st.i32)))


@pytest.mark.parametrize("kernel,args,match", [
    (float_of_runtime, lambda: [t([1.0]), out(1), 2], "float\\(\\) converts compile-time"),
    (power, lambda: [t([1.0]), out(1), 2], "`\\*\\*` on a runtime value takes a compile-time int"),
    (one_branch, lambda: [t([1.0]), out(1), 2], "bound in only one branch"),
    (int8_overflow, lambda: [t([1], torch.int8), out(1, st.int8)], "300 does not fit st.int8"),
    (float_mma_int_acc, lambda: [st.zeros((16, 16)), st.empty((16, 16), dtype=st.i32)
                                 .partition((16, 16))], "accumulates in st.float32"),
], ids=["float-of-runtime", "pow", "one-branch", "int8-plus-300", "float-mma-int-acc"])
def test_what_the_gpu_cannot_compile_is_refused_on_both_backends(kernel, args, match):
    refused(kernel, args(), match)


@st.kernel
def int8_mma(a: st.In[st.int8, 2], b: st.In[st.int8, 2], z: st.Out[st.i32, 2]):
    z.store(sl.mma(a.load((0, 0), (16, 32)), b.load((0, 0), (32, 16)), sl.zeros(z.shape, st.i32)))


def test_an_int8_mma_with_an_int32_accumulator_runs_and_compiles():
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (16, 32), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (32, 16), generator=g, dtype=torch.int8)
    make = lambda: [st.from_torch(a.clone()), st.from_torch(b.clone()),
                    st.empty((16, 16), dtype=st.i32).partition((16, 16))]
    with st.backend("interpret"):
        *_, z = int8_mma(*make()).sync()
    assert torch.equal(z.unpartition().to_torch(), (a.long() @ b.long()).int())
    assert "out_dtype=tl.int32" in int8_mma.source(*make())
    int8_mma.compile(*make())


@st.kernel
def grid_axes(ids: st.Out[st.i32, 2]):
    ids.store(sl.zeros(ids.shape, st.i32) + sl.bid(0) * 100 + sl.bid(1) * 10 +
              sl.num_blocks(1) + sl.num_blocks(2) * 1000 + sl.bid(2))


@pytest.mark.parametrize("order", ["row_major", "grouped"])
def test_bid_and_num_blocks_are_the_out_grids_axes_in_the_generated_code_too(order):
    kw = dict(order="grouped", group_size=2) if order == "grouped" else {}
    got = both(grid_axes, lambda: [st.full((12, 20), -1, dtype=st.i32).partition((4, 4), **kw)],
               0, 1)[0]
    rows, cols = torch.arange(12)[:, None] // 4, torch.arange(20)[None, :] // 4
    assert torch.equal(got, (rows * 100 + cols * 10 + 5 + 1000).int())
