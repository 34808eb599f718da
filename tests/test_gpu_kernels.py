"""The example kernels and the tricky tile cases on the triton backend (needs a CUDA GPU).

These exercise the generated Triton code for real: TMA loads and stores, wgmma, edge-tile
masks, gathers and sub-partition stores. GPU math functions are approximations (`ex2.approx`,
`rsqrt.approx`, ...), so fp32 comparisons allow a few ulp; bf16 allows one bf16 ulp.
"""
import importlib.util
from pathlib import Path

import pytest
import torch

import safetile as st
import safetile.lang as sl

import support

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DTYPES = [st.f32, st.bf16]
DTYPE_IDS = [d.name for d in DTYPES]


triton_backend = support.triton_backend()


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu(t: torch.Tensor) -> st.Tensor:
    return st.from_torch(t.cuda())


def rand(shape, dtype, seed) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype.torch)


def empty(shape, dtype, tile, **kw):
    return st.empty(shape, dtype=dtype, device="cuda").partition(tile, **kw)


def result(p) -> torch.Tensor:
    return p.unpartition().to_torch().cpu()


def test_vector_add_matches_torch_exactly():
    add = load_example("01_vector_add").add
    n = (1 << 20) + 123
    x, y = rand((n,), st.f32, 1), rand((n,), st.f32, 2)
    _, _, z = add(gpu(x), gpu(y), empty((n,), st.f32, (1024,))).sync()
    assert torch.equal(result(z), x + y)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_softmax_matches_torch(dtype):
    softmax = load_example("02_softmax").softmax
    x = rand((37, 1000), dtype, 3)
    _, z = softmax(gpu(x), empty((37, 1000), dtype, (4, 1024))).sync()
    tol = 1e-5 if dtype is st.f32 else 1e-2
    torch.testing.assert_close(result(z).float(), torch.softmax(x.float(), 1), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_matmul_matches_torch(dtype):
    matmul = load_example("03_matmul").matmul.options(num_warps=4)
    a, b = rand((256, 160), dtype, 4), rand((160, 192), dtype, 5)
    c = empty((256, 192), st.f32, (64, 64), order="grouped", group_size=4)
    _, _, c, _ = matmul(gpu(a), gpu(b), c, 32).sync()
    expected = a.double() @ b.double()
    err = ((result(c).double() - expected).norm() / expected.norm()).item()
    assert err < 1e-2                                   # fp32 operands run as TF32


def test_matmul_with_edge_tiles_on_every_side():
    matmul = load_example("03_matmul").matmul
    a, b = rand((200, 100), st.bf16, 6), rand((100, 136), st.bf16, 7)
    _, _, c, _ = matmul(gpu(a), gpu(b), empty((200, 136), st.f32, (64, 64)), 32).sync()
    torch.testing.assert_close(result(c), a.float() @ b.float(), rtol=1e-2, atol=1e-2)


@st.kernel
def scale_copy(x: st.In[st.floats], z: st.Out[st.floats]):
    z.store(sl.load_like(x, z) * 2.0 + 1.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,tile", [((1000,), (128,)), ((37, 50), (16, 32)),
                                        ((3, 45, 70), (2, 16, 32))], ids=["1d", "2d", "3d"])
def test_edge_tiles_store_only_inside_the_tensor(shape, tile, dtype):
    x = rand(shape, dtype, 8)
    # The output is a slice of a larger buffer filled with a sentinel: an edge tile that wrote
    # past the tensor would overwrite the sentinel around it.
    buffer = st.from_torch(torch.full(tuple((s // 16 + 2) * 16 for s in shape), 7.0,
                                      dtype=dtype.torch, device="cuda"))
    inner = buffer
    for dim, size in enumerate(shape):
        inner = inner.slice(dim, 0, size)
    _, z = scale_copy(gpu(x), inner.partition(tile)).sync()
    expected = ((x.float() * 2.0).to(dtype.torch).float() + 1.0).to(dtype.torch)
    assert torch.equal(result(z), expected)
    around = buffer.to_torch().cpu()
    around[tuple(slice(0, size) for size in shape)] = 7.0
    assert torch.equal(around, torch.full_like(around, 7.0))


@st.kernel
def padded_row_max(x: st.In[st.floats, 2], z: st.Out[st.floats, 2], BC: st.Const[int]):
    t = x.load((z.index[0], 0), (z.shape[0], BC), padding=float("-inf"))
    z.store(sl.max(t, 1)[:, None])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_padding_value_fills_lanes_outside_the_tensor(dtype):
    x = -(rand((10, 100), dtype, 9).abs() + 0.5)            # all negative: zero padding would win
    _, z, _ = padded_row_max(gpu(x), empty((10, 1), dtype, (4, 1)), 128).sync()
    assert torch.equal(result(z)[:, 0], x.amax(1))


@st.kernel
def embedding(ids: st.In[st.i32, 1], table: st.In[st.floats, 2], z: st.Out[st.floats, 2]):
    t, j = z.index
    row = ids.load_scalar((t,))
    z.store(table.load((row, j), (1, z.shape[1])))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gather_rows_at_data_dependent_indices(dtype):
    table = rand((50, 200), dtype, 10)
    ids = torch.tensor([3, 0, 49, 3, 7, 12, 12, 1], dtype=torch.int32)
    _, _, z = embedding(gpu(ids), gpu(table), empty((8, 200), dtype, (1, 64))).sync()
    assert torch.equal(result(z), table[ids.long()])


@st.kernel
def sub_scatter(x: st.In[st.floats, 2], perm: st.In[st.i32, 1], z: st.Out[st.floats, 2]):
    i = z.index[0]
    rows = z.partition((16, z.shape[1]))
    for j in range(4):
        k = perm.load_scalar((j,))
        rows.store(x.load((i * 4 + j, 0), (16, z.shape[1])), (k, 0))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_sub_partition_stores_at_data_dependent_sub_indices(dtype):
    x = rand((120, 64), dtype, 11)                          # last slab (rows 64..127) is partial
    perm = [2, 0, 3, 1]
    _, _, z = sub_scatter(gpu(x), gpu(torch.tensor(perm, dtype=torch.int32)),
                          empty((120, 64), dtype, (64, 64))).sync()
    padded = torch.zeros((128, 64), dtype=x.dtype)         # rows past the end read as 0
    padded[:120] = x
    expected = torch.empty_like(padded)
    for slab in range(2):
        for j, k in enumerate(perm):
            src, dst = slab * 64 + 16 * j, slab * 64 + 16 * k
            expected[dst:dst + 16] = padded[src:src + 16]
    assert torch.equal(result(z), expected[:120])


def unary_kernel(op):
    @st.kernel
    def apply(x: st.In[st.floats], z: st.Out[st.floats]):
        z.store(op(sl.load_like(x, z)))
    return apply


UNARY = [(sl.exp, torch.exp, False), (sl.exp2, torch.exp2, False), (sl.log, torch.log, True),
         (sl.log2, torch.log2, True), (sl.sqrt, torch.sqrt, True), (sl.rsqrt, torch.rsqrt, True),
         (sl.sin, torch.sin, False), (sl.cos, torch.cos, False), (sl.tanh, torch.tanh, False),
         (sl.sigmoid, torch.sigmoid, False), (sl.abs, torch.abs, False)]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op,ref,positive", UNARY, ids=[u[0].name for u in UNARY])
def test_unary_math_matches_torch(op, ref, positive, dtype):
    x = rand((3000,), dtype, 12)
    if positive:
        x = x.abs() + 0.1
    _, z = unary_kernel(op)(gpu(x), empty((3000,), dtype, (1024,))).sync()
    tol = 1e-4 if dtype is st.f32 else 1.6e-2
    torch.testing.assert_close(result(z).float(), ref(x.float()).to(dtype.torch).float(),
                               rtol=tol, atol=tol)


@st.kernel
def fifth_power(x: st.In[st.floats | st.i32], z: st.Out[st.floats | st.i32]):
    z.store(sl.load_like(x, z) ** 5)


@pytest.mark.parametrize("dtype", [st.f32, st.bf16, st.i32], ids=["float32", "bfloat16", "int32"])
def test_a_power_is_its_rounded_multiplications_exactly_as_on_the_cpu_executor(dtype):
    g = torch.Generator().manual_seed(14)
    x = torch.randn(3000, generator=g).to(dtype.torch) if dtype.is_float else \
        torch.randint(-300, 300, (3000,), generator=g, dtype=torch.int32)
    _, z = fifth_power(gpu(x), empty((3000,), dtype, (1024,))).sync()
    with st.backend("interpret"):
        _, want = fifth_power(st.from_torch(x.clone()),
                              st.empty((3000,), dtype=dtype, device="cpu").partition((1024,))).sync()
    assert torch.equal(result(z), want.unpartition().to_torch())


@st.kernel
def times_k(x: st.In[st.i32], z: st.Out[st.f32], k: st.Const[int | float]):
    z.store((sl.load_like(x, z) * k).astype(st.f32))


def test_a_union_const_compiles_an_int_and_an_equal_float_apart():
    x = gpu(torch.full((1024,), 2**30, dtype=torch.int32))
    seen = []
    for k in (2, 2.0, 2):               # equal values: int32 arithmetic wraps, f32 does not
        _, z, _ = times_k(x, empty((1024,), st.f32, (256,)), k).sync()
        seen.append(result(z).unique().tolist())
    assert seen == [[-2.0**31], [2.0**31], [-2.0**31]]


@st.kernel
def row_sums_bf16(x: st.In[st.floats, 2], z: st.Out[st.floats, 2]):
    z.store(sl.sum(x.load((z.index[0], 0), (z.shape[0], 256)), 1)[:, None])


def test_bf16_row_sum_matches_torch():
    x = rand((16, 256), st.bf16, 13)
    _, z = row_sums_bf16(gpu(x), empty((16, 1), st.bf16, (16, 1))).sync()
    torch.testing.assert_close(result(z)[:, 0].float(), x.float().sum(1).to(torch.bfloat16).float(),
                               rtol=1.6e-2, atol=1.6e-2)
