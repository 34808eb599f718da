"""On the GPU: the largest accepted shapes write exactly their tensors (sentinels around them
stay intact), and the index families that used to wrap now cannot (lang/semantics.py).

Each Out lives in the middle of a larger buffer whose margins hold a sentinel byte; after the
launch every element of the Out holds the value written and every margin byte is unchanged.
"""
import pytest
import torch

import safetile as st
import safetile.lang as sl
from safetile.lang.semantics import MAX_DIM

pytestmark = pytest.mark.gpu

MARGIN = 1 << 20
SENTINEL = 0x5A


@st.kernel
def fill_ones(z: st.Out[st.int8]):
    z.store(sl.full(z.shape, 1, st.int8))


def _framed(shape):
    n = 1
    for d in shape:
        n *= d
    buf = torch.full((n + 2 * MARGIN,), SENTINEL, dtype=torch.int8, device="cuda")
    return buf, buf[MARGIN:MARGIN + n].view(shape)


def _check(buf, shape):
    n = buf.numel() - 2 * MARGIN
    torch.cuda.synchronize()
    assert bool((buf[:MARGIN] == SENTINEL).all()), "a store landed before the tensor"
    assert bool((buf[MARGIN + n:] == SENTINEL).all()), "a store landed after the tensor"
    assert bool((buf[MARGIN:MARGIN + n] == 1).all()), "an element was not written"


@pytest.mark.parametrize("shape,tile", [
    ((MAX_DIM,), (1024,)),                  # the largest dimension
    ((MAX_DIM - 3,), (1024,)),              # ... with a masked edge tile
    ((1, MAX_DIM - 5), (1, 1024)),          # the shape of the report, at the limit
    ((2048, 2**20 - 1), (8, 128)),          # element offsets up to about 2**31
])
def test_the_largest_accepted_outs_write_exactly_their_elements(shape, tile):
    buf, view = _framed(shape)
    (z,) = fill_ones(st.from_torch(view).partition(tile)).sync()
    _check(buf, shape)


@st.kernel
def coordinates(z: st.Out[st.i32, 2]):
    z.store(sl.full(z.shape, sl.bid(0) * 1000 + sl.bid(1), st.i32))


def test_a_grouped_order_with_a_huge_group_writes_every_tile_once():
    shape, tile = (4096, 4096), (64, 64)
    p = st.full(shape, -1, dtype=st.i32, device="cuda").partition(tile, order="grouped",
                                                                   group_size=2**31 - 1)
    (z,) = coordinates(p).sync()
    got = z.unpartition().to_torch().cpu()
    rows, cols = torch.arange(4096)[:, None] // 64, torch.arange(4096)[None, :] // 64
    assert torch.equal(got, (rows * 1000 + cols).int())     # no tile left at -1


@st.kernel
def gather(x: st.In[st.f32, 1], idx: st.In[st.i32, 1], z: st.Out[st.f32, 1]):
    z.store(x.load((idx.load_scalar((0,)),), z.shape, padding=-1.0))


@pytest.mark.parametrize("index", [2**30, -2**31, 2**31 - 1])
def test_a_wrapping_tile_index_reads_padding_on_the_gpu(index):
    x = st.from_torch(torch.arange(16, dtype=torch.float32, device="cuda"))
    i = st.from_torch(torch.tensor([index], dtype=torch.int32, device="cuda"))
    *_, z = gather(x, i, st.empty((4,), device="cuda").partition((4,))).sync()
    assert z.unpartition().to_torch().tolist() == [-1.0] * 4


@st.kernel
def sub_store(j: st.In[st.i32, 1], z: st.Out[st.f32, 1]):
    z.store(sl.zeros(z.shape, st.f32))
    z.partition((2,)).store(sl.full((2,), 7.0, st.f32), (j.load_scalar((0,)),))


@pytest.mark.parametrize("j", [-2**31, 2**31 - 1, 4])
def test_a_sub_index_outside_the_slab_writes_nothing_on_the_gpu(j):
    idx = st.from_torch(torch.tensor([j], dtype=torch.int32, device="cuda"))
    _, z = sub_store(idx, st.empty((8,), device="cuda").partition((8,))).sync()
    assert z.unpartition().to_torch().tolist() == [0.0] * 8


@st.kernel
def arith(a: st.In[st.i32], b: st.In[st.i32], f: st.In[st.f32], q: st.Out[st.i32],
          r: st.Out[st.i32], c: st.Out[st.i32], amax: st.Out[st.i32]):
    x, y = sl.load_like(a, q), sl.load_like(b, q)
    q.store(x // y)
    r.store(x % y)
    c.store(sl.load_like(f, q).astype(st.i32))
    amax.store(sl.argmax(sl.reshape(sl.load_like(f, q), (1, 8)), 1) + sl.zeros(q.shape, st.i32))


def test_division_casts_and_argmax_follow_the_semantics_on_the_gpu():
    xs = [7, -7, 7, -7, 0, -2**31, 5, 100]
    ys = [2, 2, -2, -2, 0, -1, 3, 0]
    fs = [1.5, -1.5, float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 2.0]
    t = lambda v, d=torch.int32: st.from_torch(torch.tensor(v, dtype=d, device="cuda"))
    outs = [st.empty((8,), dtype=st.i32, device="cuda").partition((8,)) for _ in range(4)]
    *_, q, r, c, amax = arith(t(xs), t(ys), t(fs, torch.float32), *outs).sync()
    res = [o.unpartition().to_torch().cpu().tolist() for o in (q, r, c, amax)]
    wq = [x // y if y else 0 for x, y in zip(xs, ys)]
    wq[5] = -2**31                                    # INT_MIN // -1 wraps
    assert res[0] == wq
    assert res[1] == [x % y if y else x for x, y in zip(xs, ys)]
    assert res[2] == [1, -1, 0, 2**31 - 1, -2**31, 2**31 - 1, -2**31, 2]
    assert res[3] == [3] * 8                          # inf at 3; NaN skipped
