"""Code generation proven without a GPU: kernels compile for the H200 (sm_90) on this machine.

`kernel.compile(*args)` runs Triton's full pipeline down to PTX and a cubin for sm_90 with
Triton's bundled ptxas. The PTX shows what the generated code really does: tensor-descriptor
(TMA) loads, and `wgmma` for bf16 matrix products. Each compile costs 0.1-2 s, so the op
families share a few kernels.
"""
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import safetile as st
import safetile.lang as sl
from safetile.kernel.launch import variant_for

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TMA_LOAD = re.compile(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global")


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu(shape, dtype=st.f32):
    return st.randn(shape, dtype=dtype, device="cpu", seed=0)


def out(shape, dtype, tile, **kw):
    return st.empty(shape, dtype=dtype, device="cpu").partition(tile, **kw)


# ---- the examples -------------------------------------------------------------------------------

def test_vector_add_example_compiles_for_sm90():
    add = load_example("01_vector_add").add
    n = (1 << 16) + 123
    ptx = add.compile(cpu((n,)), cpu((n,)), out((n,), st.f32, (1024,))).asm["ptx"]
    assert ".target sm_90" in ptx
    assert "ld.global" in ptx and "st.global" in ptx


@pytest.mark.parametrize("dtype", [st.f32, st.bf16], ids=["float32", "bfloat16"])
def test_softmax_example_compiles_for_sm90(dtype):
    softmax = load_example("02_softmax").softmax
    compiled = softmax.compile(cpu((37, 1000), dtype), out((37, 1000), dtype, (4, 1024)))
    assert ".target sm_90" in compiled.asm["ptx"]
    assert compiled.asm["cubin"]


def test_bf16_matmul_example_uses_tma_loads_and_wgmma():
    matmul = load_example("03_matmul").matmul.options(num_warps=4)
    a, b = cpu((256, 128), st.bf16), cpu((128, 256), st.bf16)
    c = out((256, 256), st.f32, (64, 64), order="grouped", group_size=4)
    source = matmul.source(a, b, c, 32)
    ptx = matmul.compile(a, b, c, 32).asm["ptx"]
    assert ".load([" in source                              # tensor-descriptor loads in the source
    assert TMA_LOAD.search(ptx), "loads of A and B should use TMA (cp.async.bulk.tensor)"
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", ptx)


def test_f32_matmul_example_compiles_for_sm90():
    matmul = load_example("03_matmul").matmul
    a, b = cpu((200, 100)), cpu((100, 136))
    ptx = matmul.compile(a, b, out((200, 136), st.f32, (64, 64)), 32).asm["ptx"]
    assert ".target sm_90" in ptx


def test_tma_option_off_uses_plain_masked_loads():
    matmul = load_example("03_matmul").matmul.options(num_warps=4, tma=False)
    a, b = cpu((128, 128), st.bf16), cpu((128, 128), st.bf16)
    c = out((128, 128), st.f32, (64, 64))
    source = matmul.source(a, b, c, 32)
    assert ".load([" not in source
    ptx = matmul.compile(a, b, c, 32).asm["ptx"]
    assert not TMA_LOAD.search(ptx)
    assert "wgmma.mma_async" in ptx


# ---- generated source on disk -------------------------------------------------------------------

def test_generated_source_is_a_real_file_in_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SAFETILE_CACHE_DIR", str(tmp_path))

    @st.kernel
    def cached_copy(x: st.In[st.f32], z: st.Out[st.f32]):
        z.store(sl.load_like(x, z) + 1.0)

    args = (cpu((100,)), out((100,), st.f32, (32,)))
    variant = variant_for(cached_copy, args, {})
    assert variant.path.parent == tmp_path
    assert variant.path.read_text() == cached_copy.source(*args)
    assert "@triton.jit\ndef cached_copy(" in variant.path.read_text()
    jit_source = inspect.getsource(variant.jit.fn)               # Triton reads it this way too
    assert jit_source.startswith("@triton.jit\ndef cached_copy(")
    assert inspect.getsourcefile(variant.jit.fn) == str(variant.path)


def test_source_does_not_move_its_arguments():
    add = load_example("01_vector_add").add
    x, y, z = cpu((64,)), cpu((64,)), out((64,), st.f32, (32,))
    add.source(x, y, z)
    x.to_torch(), y.to_torch(), z.unpartition()                 # all still usable


# ---- every op family has a valid Triton spelling ------------------------------------------------

@st.function
def softsign(t):
    return t / (1.0 + sl.abs(t))


@st.kernel
def elementwise_family(x: st.In[st.floats, 2], y: st.In[st.floats, 2], z: st.Out[st.floats, 2],
                       w: st.Out[st.f32, 2], q: st.Out[st.i32, 2], n: int, s: float,
                       DT: st.Const[st.dtype]):
    a = sl.load_like(x, z)
    b = sl.load_like(y, z)
    u = sl.exp(a) + sl.exp2(b) - sl.log(sl.abs(a) + 1.0) * sl.log2(sl.abs(b) + 1.0)
    u = u + sl.sqrt(sl.abs(a)) + sl.rsqrt(sl.abs(b) + 1.0) + sl.sin(a) * sl.cos(b)
    u = u + sl.tanh(a) + sl.sigmoid(b) + sl.maximum(a, b) - sl.minimum(a, b) + softsign(a)
    u = sl.where(a < b, u, -u) * s
    if n > 0:
        u = u / 2.0
    for k in range(n):
        u = u + sl.full(z.shape, 1.0, DT)
    z.store(u)
    w.store(sl.where((a >= b) & (a != b), 1.0, 0.0) + sl.zeros(w.shape, st.f32) +
            (a > 0).astype(st.f32))
    ii = sl.arange(16)[:, None] + sl.zeros(q.shape, st.i32) + sl.bid(0) * sl.num_blocks(0)
    q.store(ii // 3 + ii % 5 + sl.cdiv(x.shape[0], 7) + (a <= b).astype(st.i32) +
            (a == b).astype(st.i32))


@st.kernel
def reduction_family(x: st.In[st.floats, 2], ids: st.In[st.i32, 1], z: st.Out[st.floats, 2],
                     r: st.Out[st.f32, 2], am: st.Out[st.i32, 2]):
    i, j = z.index
    t = x.load((i, j), (16, 32), padding=float("-inf"))
    row = ids.load_scalar((i,))
    g = x.load((row, 0), (1, 32))
    total = sl.sum(t, 1)[:, None] + sl.max(t, 1)[:, None] - sl.min(t, 0)[None, :]
    sq = sl.reshape(t, (32, 16))
    z.store(total + sl.transpose(sq) + sq.T + sl.broadcast_to(g, (16, 32)))
    a16 = t.astype(st.bf16)
    b16 = sq.astype(st.bf16)
    r.store(sl.mma(a16, b16, sl.zeros((16, 16), st.f32)) + sl.matmul(a16, b16) + (a16 @ b16))
    am.store(sl.argmax(t, 1)[:, None] + sl.argmin(t, 1)[:, None])


@st.kernel
def cube_family(x: st.In[st.floats, 3], z: st.Out[st.floats, 3]):
    i0, i1, i2 = z.index
    z.store(sl.permute(x.load(z.index, (2, 16, 16)), (0, 2, 1)))
    halves = z.partition((2, 8, 16))
    for k in range(2):
        halves.store(x.load((i0, i1 * 2 + k, i2), (2, 8, 16)), (0, k, 0))


@st.kernel(unsafe=True)
def pointer_family(p: st.Ptr[st.f32], q: st.Ptr[st.i32], n: int):
    offs = sl.bid(0) * 64 + sl.arange(64)
    m = offs < n
    v = sl.load_ptr(p, offs, mask=m, other=0.0)
    sl.store_ptr(p, offs, v * 2.0, mask=m)
    sl.atomic_add(q, sl.zeros((64,), st.i32), 1, mask=m)


def ahead_kernel(HEAD: int):
    @st.kernel
    def ahead(x: st.In[st.f32], z: st.Out[st.f32]):
        t = sl.load_like(x, z)
        if HEAD == 2:                      # a compile-time condition from a closure constant
            t = t + softsign(t)
        z.store(t * 2.0 if HEAD > 0 else softsign(t))
    return ahead


def test_only_the_branch_a_compile_time_condition_takes_is_emitted():
    x, z = cpu((64,)), out((64,), st.f32, (32,))
    plain = ahead_kernel(0).source(x, z)
    assert "_stf_softsign" in plain and "if " not in plain.split("def ahead(")[1]
    assert "HEAD" not in plain and " * 2.0" not in plain
    both = ahead_kernel(2).source(x, z)
    assert both.count("_stf_softsign(") == 2 and " * 2.0" in both      # def + one call
    ahead_kernel(2).compile(x, z)


def test_elementwise_ops_compile_in_bf16():
    x, y = cpu((64, 64), st.bf16), cpu((64, 64), st.bf16)
    args = (x, y, out((64, 64), st.bf16, (16, 32)), out((64, 64), st.f32, (16, 32)),
            out((64, 64), st.i32, (16, 32)), 3, 0.5, st.bf16)
    source = elementwise_family.source(*args)
    assert "libdevice.tanh(" in source                           # tanh goes through libdevice
    assert "_st_m_exp(" in source                                # halves computed in fp32
    assert "def _stf_softsign(" in source                        # @st.function helper emitted
    assert ".target sm_90" in elementwise_family.compile(*args).asm["ptx"]


def test_reductions_products_and_shape_ops_compile_in_bf16():
    args = (cpu((64, 64), st.bf16), st.zeros((4,), dtype=st.i32, device="cpu"),
            out((64, 64), st.bf16, (16, 32)), out((64, 32), st.f32, (16, 16)),
            out((64, 64), st.i32, (16, 32)))
    source = reduction_family.source(*args)
    assert "_st_sum(t, 1)" in source                             # bf16 sums accumulate in fp32
    assert "x.dtype.is_bf16()" in source
    ptx = reduction_family.options(num_warps=4).compile(*args).asm["ptx"]
    assert ".target sm_90" in ptx


@st.kernel
def power_family(x: st.In[st.bf16 | st.i32], z: st.Out[st.bf16 | st.i32]):
    z.store(sl.load_like(x, z) ** 5)


@pytest.mark.parametrize("dtype", [st.bf16, st.i32], ids=["bfloat16", "int32"])
def test_a_power_compiles_for_sm90_through_its_helper(dtype):
    args = (st.zeros((1024,), dtype=dtype, device="cpu"), out((1024,), dtype, (256,)))
    assert "_st_pow(" in power_family.source(*args)
    assert ".target sm_90" in power_family.compile(*args).asm["ptx"]


def test_3d_permute_and_sub_partition_stores_compile():
    args = (cpu((8, 64, 64), st.f16), out((8, 64, 64), st.f16, (2, 16, 16)))
    assert "_st_substore3(" in cube_family.source(*args)
    assert ".target sm_90" in cube_family.compile(*args).asm["ptx"]


def test_raw_pointer_ops_compile_in_an_unsafe_kernel():
    k = pointer_family.options(grid=(4,))
    args = (st.zeros((200,), device="cpu"), st.zeros((1,), dtype=st.i32, device="cpu"), 200)
    ptx = k.compile(*args).asm["ptx"]
    assert "atom.global" in ptx or "red.global" in ptx
