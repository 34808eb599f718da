"""What the matmul and gemv kernels compile to, checked without a GPU (sm_90 target).

Also the codegen features they rely on: the opt-in TMA store of an owned tile (and when it
is refused), scheduling hints on loops, and compile-time ``if``.
"""
import safetile as st
import safetile.lang as sl
from safetile.ops.gemv import _kernel as gemv_kernel
from safetile.ops.matmul import MatmulConfig, _configured, _kernels

BIG = MatmulConfig(128, 256, 64, 8, 3)


def big_args():
    a = st.randn((512, 256), dtype=st.bf16)
    w = st.randn((512, 256), dtype=st.bf16)
    c = st.empty((512, 512), dtype=st.bf16).partition((128, 256), order="grouped",
                                                       group_size=8, persistent=132)
    return a, w, c, 0


def test_linear_kernel_uses_descriptor_loads_and_a_descriptor_store():
    tiles, _ = _kernels(64, True)
    src = _configured(tiles, BIG).source(*big_args())
    assert "_st_dstore2(" in src
    assert ".load([" in src and "_st_load2(" not in src
    assert "if True" not in src                       # the layout branch is resolved statically


def test_linear_kernel_compiles_to_wgmma_with_tma_both_ways():
    tiles, _ = _kernels(64, True)
    ptx = _configured(tiles, BIG).compile(*big_args()).asm["ptx"]
    assert "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx     # TMA loads
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx         # TMA store


@st.kernel
def store_then_reload(x: st.In[st.f32, 2], z: st.Out[st.f32, 2]):
    z.store(sl.load_like(x, z))
    z.store(z.load() * 2.0)


@st.kernel
def store_once(x: st.In[st.f32, 2], z: st.Out[st.f32, 2]):
    z.store(sl.load_like(x, z) * 2.0)


def test_tma_store_is_opt_in():
    x = st.randn((64, 64))
    src = store_once.source(x, st.empty((64, 64)).partition((32, 32)))
    assert "_st_dstore2(" not in src and "_st_store2(" in src


def test_tma_store_of_a_single_store():
    x = st.randn((64, 64))
    src = store_once.options(tma_store=True).source(x, st.empty((64, 64)).partition((32, 32)))
    assert "_st_dstore2(" in src


def test_tma_store_refused_when_the_owned_tile_is_read_back():
    # An asynchronous TMA store is not ordered by the token barrier before z.load().
    x = st.randn((64, 64))
    src = store_then_reload.options(tma_store=True).source(
        x, st.empty((64, 64)).partition((32, 32)))
    assert "_st_dstore2(" not in src and "tl.debug_barrier()" in src


def test_tma_store_refused_for_boxes_wider_than_256():
    x = st.randn((8, 1024))
    src = store_once.options(tma_store=True).source(x, st.empty((8, 1024)).partition((8, 512)))
    assert "_st_dstore2(" not in src


def test_persistent_loop_hints():
    tiles, _ = _kernels(64, True)
    src = tiles.options(flatten=True, warp_specialize=True).source(*big_args())
    assert "tl.range(tl.program_id(0), _st_ntiles, tl.num_programs(0), flatten=True, " \
           "warp_specialize=True)" in src


def test_loop_stages_pipelines_the_gemv_k_loop():
    w = st.randn((256, 512), dtype=st.bf16)
    x = st.randn((512,), dtype=st.bf16)
    y = st.empty((256,), dtype=st.bf16).partition((16,))
    k = gemv_kernel(256).options(loop_stages=4, num_warps=4)
    assert "num_stages=4)" in k.source(w, x, y)
    compiled = k.compile(w, x, st.empty((256,), dtype=st.bf16).partition((16,)))
    assert compiled.metadata.shared >= 3 * 16 * 256 * 2       # >= 3 buffered W blocks
