"""Regression tests for the disagreements a GPU differential run found between the GPU and
the CPU executor (``scripts/differential_gpu.py``), one family each: IEEE division,
compile-time numbers in comparisons and extrema, bf16 constants and extrema, shifts of bools,
the type of a shift's result, subnormal arguments of sqrt and rsqrt. Each checks the
generated code for the mechanism (its source, or its sm_90 compilation) and the CPU executor
against the result ``lang/semantics.py`` states, on edge values."""
import math

import torch

import safetile as st
import safetile.lang as sl
from safetile.lang import semantics as S
from test_findings import both, out, t

EDGES = [1.0, -1.0, 3.0e38, -3.0e38, 2.0**127, 2.0**-126, 1e-40, 1e30, 7.0, 0.1]


# ---- division ----------------------------------------------------------------------------------

@st.kernel
def self_quotient(x: st.In[st.f32], z: st.Out[st.f32], k: st.Out[st.int8]):
    v = sl.load_like(x, z)
    z.store(v / v)
    k.store((v / v).astype(st.int8))


def _self_quotient_args():
    return [t(EDGES), out(len(EDGES)), out(len(EDGES), st.int8)]


def test_division_is_emitted_as_ieee_division():
    src = self_quotient.source(*_self_quotient_args())
    assert src.count("tl.div_rn(") == 2 and " / " not in src
    ptx = self_quotient.options(tma=False).compile(*_self_quotient_args()).asm["ptx"]
    assert "div.rn.f32" in ptx and "div.full.f32" not in ptx and "div.approx" not in ptx


def test_x_over_x_is_exactly_one_for_every_finite_nonzero_x():
    z, k = both(self_quotient, _self_quotient_args, 1, 2)
    assert z.tolist() == [1.0] * len(EDGES)
    assert k.tolist() == [1] * len(EDGES)


@st.kernel
def quotients(x: st.In[st.f16], y: st.In[st.f16], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) / sl.load_like(y, z))


def test_fp16_division_is_the_correctly_rounded_fp32_quotient():
    a = torch.tensor([1.0, 2.0, 65504.0, 6e-8, -3.0], dtype=torch.float16)
    b = torch.tensor([3.0, 7.0, 6e-8, 3.0, 65504.0], dtype=torch.float16)
    got = both(quotients, lambda: [st.from_torch(a.clone()), st.from_torch(b.clone()),
                                   out(5)], 2, 1)[0]
    want = (a.double() / b.double()).float()      # one rounding of the exact quotient
    assert torch.equal(got, want)


# ---- compile-time numbers in comparisons and extrema --------------------------------------------

@st.kernel
def compare_half(x: st.In[st.f16], le: st.Out[st.bool_], eq: st.Out[st.bool_],
                 tenth: st.Out[st.bool_], F: st.Const[float]):
    v = sl.load_like(x, le)
    le.store(v <= 3e38)
    eq.store(v == F)
    tenth.store(0.1 == v)


def test_a_compile_time_float_is_compared_as_a_value_of_the_tiles_type():
    x = torch.tensor([math.inf, 65504.0, 0.1, -math.inf], dtype=torch.float16)
    args = lambda: [st.from_torch(x.clone()), out(4, st.bool_), out(4, st.bool_),
                    out(4, st.bool_), 100000.0]
    le, eq, tenth = both(compare_half, args, 1, 3)
    assert S.rounded(3e38, st.f16) == math.inf and S.rounded(1e5, st.f16) == math.inf
    assert le.tolist() == [True, True, True, True]      # 3e38 is inf in fp16
    assert eq.tolist() == [True, False, False, False]   # 100000.0 is inf in fp16
    assert tenth.tolist() == [False, False, True, False]
    assert "tl.full((), 100000.0, tl.float32).to(tl.float16)" in compare_half.source(*args())


@st.kernel
def compare_bf16(x: st.In[st.bf16], z: st.Out[st.bool_], g: st.Out[st.bool_]):
    v = sl.load_like(x, z)
    z.store(v == 257)
    g.store(v > 1e30)


def test_a_compile_time_number_meeting_bf16_in_a_comparison_is_rounded_to_bf16():
    x = torch.tensor([256.0, 258.0, 1e30, 2e30], dtype=torch.bfloat16)
    with st.backend("interpret"):
        _, z, g = compare_bf16(st.from_torch(x), out(4, st.bool_), out(4, st.bool_)).sync()
    assert z.unpartition().to_torch().tolist() == [True, False, False, False]
    assert g.unpartition().to_torch().tolist() == [False, False, False, True]
    src = compare_bf16.source(st.from_torch(x), out(4, st.bool_), out(4, st.bool_))
    assert "(v == tl.full((), 257.0, tl.float32).to(tl.bfloat16))" in src


@st.kernel
def int8_extremum(x: st.In[st.int8], z: st.Out[st.i32]):
    v = sl.load_like(x, z)
    z.store((sl.maximum(v, 100) + 100).astype(st.i32))


def test_an_extremum_with_a_compile_time_int_keeps_the_tiles_int_type():
    got = both(int8_extremum, lambda: [t([0, 120, -128], torch.int8), out(3, st.i32)], 1, 1)[0]
    assert got.tolist() == [-56, -36, -56]              # int8 + 100 wraps


# ---- bf16 constants -----------------------------------------------------------------------------

@st.kernel
def bf16_constants(x: st.In[st.bf16], z: st.Out[st.bf16], f: st.Out[st.bf16],
                   F: st.Const[float]):
    v = sl.load_like(x, z)
    z.store(sl.where(v > 0.0, F, v))
    f.store(sl.full(f.shape, 4e-7, st.bf16))


def test_small_bf16_constants_keep_their_value():
    args = lambda: [t([1.0, -1.0], torch.bfloat16), out(2, st.bf16), out(2, st.bf16), 1e-30]
    with st.backend("interpret"):
        z, f = bf16_constants(*args()).sync()[1:3]
    tiny = torch.tensor(1e-30).bfloat16()
    assert torch.equal(z.unpartition().to_torch(), torch.stack([tiny, torch.tensor(-1.0).bfloat16()]))
    assert f.unpartition().to_torch().tolist() == [S.rounded(4e-7, st.bf16)] * 2
    ttir = bf16_constants.options(tma=False).compile(*args()).asm["ttir"]
    assert "1.000000e-30 : f32" in ttir and "4.000000e-07 : f32" in ttir


# ---- shifts of bools ----------------------------------------------------------------------------

@st.kernel
def bool_shift(b: st.In[st.bool_], k: st.In[st.int8], z: st.Out[st.i32], s: st.Out[st.f32]):
    v = (~sl.load_like(b, z)) << (sl.load_like(k, z) & 7)
    z.store(v.astype(st.i32))
    s.store(v.astype(st.f32))       # as an int8 -> float conversion (sl.sin's argument)


def test_a_bool_shifted_by_an_int8_is_an_int8_shift():
    args = lambda: [t([False, False, True], torch.bool), t([7, 6, 1], torch.int8),
                    out(3, st.i32), out(3)]
    z, s = both(bool_shift, args, 2, 2)
    assert z.tolist() == [-128, 64, 0]                  # 1 << 7 wraps in int8
    assert s.tolist() == [-128.0, 64.0, 0.0]


@st.kernel
def negated_shift(x: st.In[st.int8], z: st.Out[st.int8]):
    a = sl.load_like(x, z)
    z.store(-(a >> (a & 7)))


def test_a_shift_of_int8_stays_int8_so_its_negation_wraps():
    args = lambda: [t([-128, -127, 5, 127], torch.int8), out(4, st.int8)]
    (z,) = both(negated_shift, args, 1, 1)
    assert z.tolist() == [-128, 64, 0, 0]               # -(-128) wraps in int8
    # Triton's interpreter never widens the shift helper's result, the GPU compiler would if
    # the helper let it: the negation must be an int8 subtraction in the compiled IR.
    ir = negated_shift.compile(*args()).asm["ttir"]
    negations = [line for line in ir.splitlines() if "arith.subi" in line]
    assert negations and all("xi8>" in line for line in negations), negations


@st.kernel
def roots(x: st.In[st.f32], z: st.Out[st.f32], w: st.Out[st.f32]):
    a = sl.load_like(x, z)
    z.store(sl.rsqrt(a))
    w.store(sl.sqrt(a))


def test_sqrt_and_rsqrt_take_a_subnormal_argument_as_zero_as_the_gpu_does():
    args = lambda: [t([3.3e-39, -1e-40, 1.2e-38, 4.0]), out(4), out(4)]
    z, w = both(roots, args, 1, 2)
    assert z[:2].tolist() == [math.inf, -math.inf] and z[3] == 0.5
    assert 9.1e18 < z[2] < 9.2e18                        # 1.2e-38 is normal
    assert w[:2].tolist() == [0.0, -0.0] and torch.signbit(w[1]) and w[3] == 2.0
    ptx = roots.options(tma=False).compile(*args()).asm["ptx"]
    assert "rsqrt.approx.ftz.f32" in ptx and "sqrt.approx.ftz.f32" in ptx


# ---- bf16 extrema -------------------------------------------------------------------------------

@st.kernel
def bf16_extremum_product(x: st.In[st.bf16], y: st.In[st.bf16], z: st.Out[st.bf16]):
    a, b = sl.load_like(x, z), sl.load_like(y, z)
    z.store(min(a, b) * b * b)


def test_an_extremum_of_bf16_tiles_stays_bf16_so_later_products_round_in_bf16():
    x = torch.tensor([1.0, 3.0, 1.1, -2.5], dtype=torch.bfloat16)
    y = torch.tensor([1.1, 1.3, 1.7, 1.9], dtype=torch.bfloat16)
    args = lambda: [st.from_torch(x.clone()), st.from_torch(y.clone()), out(4, st.bf16)]
    with st.backend("interpret"):
        got = bf16_extremum_product(*args()).sync()[2].unpartition().to_torch()
    once = torch.minimum(x, y).float() * y.float()
    assert torch.equal(got, (once.bfloat16().float() * y.float()).bfloat16())
    ttir = bf16_extremum_product.options(tma=False).compile(*args()).asm["ttir"]
    assert [line for line in ttir.splitlines() if "arith.mulf" in line and "bf16" in line]
