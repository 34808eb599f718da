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


@st.kernel
def store_in_a_loop(x: st.In[st.f32, 2], z: st.Out[st.f32, 2], n: int):
    t = sl.load_like(x, z)
    for k in range(n):
        z.store(t * k)


def test_tma_store_refused_when_a_loop_repeats_the_store():
    # Two asynchronous bulk stores to one box are not ordered by a CTA barrier.
    x = st.randn((64, 64))
    src = store_in_a_loop.options(tma_store=True).source(
        x, st.empty((64, 64)).partition((32, 32)), 3)
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
    w = st.randn((256, 2048), dtype=st.bf16)
    x = st.randn((2048,), dtype=st.bf16)
    y = st.empty((256,), dtype=st.bf16).partition((16,))
    k = gemv_kernel(256).options(loop_stages=4, num_warps=4)
    assert "num_stages=4)" in k.source(w, x, y, 8)
    compiled = k.compile(w, x, st.empty((256,), dtype=st.bf16).partition((16,)), 8)
    assert compiled.metadata.shared >= 3 * 16 * 256 * 2       # >= 3 buffered W blocks


def test_gemv_prefetches_its_first_weight_blocks_before_the_pdl_wait():
    w = st.randn((2560, 4096), dtype=st.bf16)
    x = st.randn((4096,), dtype=st.bf16)
    k = gemv_kernel(512, PREFETCH=2).options(loop_stages=4, num_warps=4, tma=False, pdl=True)
    ptx = k.compile(w, x, st.empty((2560,), dtype=st.bf16).partition((4,)), 8).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert "prefetch.global.L2" in ptx[:wait] and "prefetch.global.L2" not in ptx[wait:]
    assert "ld.global" not in ptx[:wait] and "cp.async" not in ptx[:wait]


def test_gemv_loads_its_first_weight_blocks_before_the_pdl_wait_with_early_w():
    w = st.randn((2560, 4096), dtype=st.bf16)
    x = st.randn((4096,), dtype=st.bf16)
    k = gemv_kernel(512).options(loop_stages=4, num_warps=4, tma=False, pdl=True, early=("w",))
    ptx = k.compile(w, x, st.empty((2560,), dtype=st.bf16).partition((4,)), 8).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert "ld.global" in ptx[:wait]            # the two early W blocks
    assert "cp.async" not in ptx[:wait]         # the pipelined loop (and x) after the wait


def test_gemv_with_head_0_loads_nothing_before_the_pdl_wait():
    w = st.randn((2560, 4096), dtype=st.bf16)
    x = st.randn((4096,), dtype=st.bf16)
    k = gemv_kernel(512, HEAD=0).options(loop_stages=4, num_warps=4, tma=False, pdl=True,
                                         early=("w",))
    ptx = k.compile(w, x, st.empty((2560,), dtype=st.bf16).partition((4,)), 8).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert "ld.global" not in ptx[:wait] and "cp.async" not in ptx[:wait]


# ---- the unsafe twin: the same kernel but for the store ------------------------------------

def _twin(cfg, weight=True):
    from safetile.ops import unsafe_matmul
    return _configured(unsafe_matmul._kernels(cfg.bm, cfg.bn, cfg.bk, cfg.group_size,
                                              weight)[0], cfg).options(grid=(16,))


def twin_args():
    a = st.randn((512, 256), dtype=st.bf16)
    w = st.randn((512, 256), dtype=st.bf16)
    return a, w, st.empty((512, 512), dtype=st.bf16), 512, 512, 0


def test_twin_takes_the_safe_kernels_loop_hints_and_pdl():
    cfg = MatmulConfig(128, 256, 64, 8, 3, warp_specialize=True, pdl=True)
    safe = _configured(_kernels(64, True)[0], cfg).source(*big_args())
    with st.unsafe():
        raw = _twin(cfg).source(*twin_args())
    for src in (safe, raw):
        assert "tl.num_programs(0), warp_specialize=True)" in src
        assert "_st_gdc_wait()" in src
    assert "_st_dstore2(" in safe and "tl.store(_st_c_ptr + " in raw


def _counts(ptx):
    """Instructions of each kind in ``ptx`` (a predicate such as ``@%p1`` stripped)."""
    keys = ["wgmma.mma_async", "cp.async.bulk.tensor.2d.shared::cluster.global",
            "cp.async.bulk.tensor.2d.global.shared::cta", "st.global", "bar.sync", "mbarrier"]
    ops = [line.split()[1] if line.startswith("@") else line.split()[0]
           for line in (raw.strip() for raw in ptx.splitlines())
           if line and not line.startswith(("//", ".")) and len(line.split()) > 1]
    return {k: sum(op.startswith(k) for op in ops) for k in keys}


def test_twin_ptx_differs_from_the_safe_kernel_only_in_the_store():
    # With the TMA store the safe kernel writes C with one bulk tensor copy per tile and no
    # st.global; the twin writes plain st.global. With tma_store off the safe kernel's
    # instruction mix is the twin's: the price of safety is then only address arithmetic.
    from dataclasses import replace
    cfg = MatmulConfig(128, 256, 64, 8, 3, warp_specialize=True)
    tma = _counts(_configured(_kernels(64, True)[0], cfg).compile(*big_args()).asm["ptx"])
    plain = _counts(_configured(_kernels(64, True)[0], replace(cfg, tma_store=False))
                    .compile(*big_args()).asm["ptx"])
    with st.unsafe():
        raw = _counts(_twin(cfg).compile(*twin_args()).asm["ptx"])
    assert tma["cp.async.bulk.tensor.2d.global.shared::cta"] >= 1 and tma["st.global"] == 0
    assert raw["cp.async.bulk.tensor.2d.global.shared::cta"] == 0 and raw["st.global"] > 0
    assert plain == raw
    assert tma["wgmma.mma_async"] == raw["wgmma.mma_async"] > 0
