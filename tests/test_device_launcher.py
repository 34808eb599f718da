"""The Triton launch path: the variant cache, the argument packer and Triton's
specialization keys."""
import gc
import weakref

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

import safetile as st
import safetile.lang as sl
from safetile.backends.triton import launch as launcher
from safetile.backends.triton import pack
from safetile.kernel.cache import variant_key
from safetile.kernel.launch import bind, launch


@st.kernel
def add(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) + sl.load_like(y, z))


@st.kernel
def mm(a: st.In[st.floats, 2], z: st.Out[st.floats, 2], n: int, BK: st.Const[int]):
    z.store(a.load(z.index, z.shape))


def _variant(kernel, bound):
    return kernel._launches.variant(kernel, bound)


def _triton_spec(v):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    return native_specialize_impl(BaseBackend, v, False, True, True)


@settings(deadline=None, max_examples=300)
@given(hs.one_of(hs.integers(-2**63, 2**63 - 1), hs.sampled_from([0, 1, 16, -16, 2**31 - 16,
                                                                  2**31, -2**31, -2**31 - 16])))
def test_int_key_separates_exactly_what_triton_specializes_on(v):
    ty, attr = _triton_spec(v)
    key = pack.int_spec(v)
    assert (key == 1) == (ty == "constexpr")
    if ty != "constexpr":
        assert (key in (2, 6)) == (attr == "D")
        assert (key >= 4) == (ty == "i64")


def test_pointer_key_separates_16_byte_alignment():
    base = torch.zeros(64)
    x, y = st.from_torch(base[:32]), st.from_torch(base[1:33])
    out = st.empty((32,)).partition((16,))
    v = _variant(add, bind(add, (x, y, out), {}))
    _, aligned = pack.pack(v.packing, bind(add, (x, x, out), {}))
    _, shifted = pack.pack(v.packing, bind(add, (x, y, out), {}))
    assert aligned != shifted


def test_the_packer_lays_out_pointers_shapes_strides_tiles_and_scalars_in_the_generated_order():
    a = st.randn((8, 12))
    z = st.empty((8, 12)).partition((4, 4))
    bound = bind(mm.options(tma=False), (a, z, 17, 32), {})
    v = _variant(mm.options(tma=False), bound)
    args, spec = pack.pack(v.packing, bound)
    at, zt = bound[0].torch, bound[1].torch
    assert [what for what, *_ in v.generated.layout] == \
        ["ptr", "shape", "shape", "stride", "stride", "ptr", "shape", "shape", "stride",
         "stride", "tile", "tile", "scalar", "const"]
    assert args[0] is at and args[5] is zt
    assert args[1:5] == [8, 12, 12, 1] and args[6:10] == [8, 12, 12, 1]
    assert args[10:] == [4, 4, 17, 32]
    assert spec == (True, 3, 3, 3, 1, True, 3, 3, 3, 1, 3)


def test_the_packer_passes_tensor_descriptors_where_the_variant_loads_through_tma():
    a = st.randn((64, 64))
    z = st.empty((64, 64)).partition((32, 32))
    bound = bind(mm, (a, z, 5, 16), {})
    v = _variant(mm, bound)
    args, _ = pack.pack(v.packing, bound)
    descs = [x for x in args if type(x).__name__ == "TensorDescriptor"]
    assert [list(d.block_shape) for d in descs] == [[32, 32]]


def test_an_input_broadcast_along_rows_is_loaded_without_a_tensor_descriptor():
    a = st.from_torch(torch.randn(64).expand(64, 64))     # row stride 0
    z = st.empty((64, 64)).partition((32, 32))
    bound = bind(mm, (a, z, 5, 16), {})
    args, _ = pack.pack(_variant(mm, bound).packing, bound)
    assert not [x for x in args if type(x).__name__ == "TensorDescriptor"]


@pytest.mark.parametrize("shape,tile,dtype", [((16,), (4,), st.f32), ((8, 12), (4, 4), st.f32),
                                              ((8, 12), (4, 4), st.bf16)])
def test_the_variant_cache_returns_the_variant_the_launcher_would_build(shape, tile, dtype):
    a = st.randn(shape, dtype=dtype)
    z = st.empty(shape, dtype=dtype).partition(tile)
    args = (a, z, 5, 16) if len(shape) == 2 else (a, a, z)
    k = mm if len(shape) == 2 else add
    bound = bind(k, args, {})
    assert k._launches.variant(k, bound) is k._launches.variants[variant_key(k, bound)]


def test_an_out_whose_layout_cannot_take_a_tma_store_gets_its_own_variant():
    k = mm.options(tma_store=True)
    base = st.zeros((64, 68))
    aligned = st.empty((64, 64)).partition((32, 32))
    shifted = base.slice(1, 1, 65).partition((32, 32))       # rows 272 bytes apart, offset 4
    a = st.randn((64, 64))
    first = _variant(k, bind(k, (a, aligned, 5, 16), {}))
    bound = bind(k, (a, shifted, 5, 16), {})
    second = _variant(k, bound)
    assert second is k._launches.variants[variant_key(k, bound)] and second is not first
    assert "_st_dstore2(" in first.generated.source
    assert "_st_dstore2(" not in second.generated.source


def test_kernel_options_copies_get_their_own_variants():
    a = st.randn((8, 12))
    z = st.empty((8, 12)).partition((4, 4))
    bound = bind(mm, (a, z, 5, 16), {})
    assert _variant(mm.options(num_warps=8), bound) is not _variant(mm, bound)


def test_the_same_options_give_the_same_copy_with_its_warm_caches():
    k = mm.options(num_warps=8, num_stages=2)
    assert mm.options(num_stages=2, num_warps=8) is k
    assert k.options(num_warps=8) is k
    assert mm.options(num_warps=4) is not k and mm.options() is not mm
    assert mm.options(grid=1) is not mm.options(grid=True)    # equal, but of other types


def test_an_options_copy_launches_after_a_failed_launch_of_the_same_copy():
    k = add.options(num_warps=4)
    with pytest.raises(st.LaunchError, match="dtype"):
        k(st.ones((8,)), st.ones((8,), dtype=st.f16), st.empty((8,)).partition((4,)))
    z = add.options(num_warps=4)(st.ones((8,)), st.ones((8,)),
                                 st.empty((8,)).partition((4,))).sync()[2]
    assert torch.equal(z.unpartition().to_torch(), torch.full((8,), 2.0))


def test_a_repeat_launch_with_other_handles_is_checked_again():
    x, y = st.ones((8,)), st.ones((8,))
    z = st.empty((8,)).partition((4,))
    x, y, z = launch(add, (x, y, z), {}).sync()
    with pytest.raises(st.LaunchError, match="dtype"):
        launch(add, (x, st.ones((8,), dtype=st.f16), z), {})
    base = torch.zeros(8)
    with pytest.raises(st.AliasError):
        launch(add, (st.from_torch(base), y, st.from_torch(base).partition((4,))), {})


def test_a_repeat_launch_with_the_same_handles_still_checks_ownership():
    x, y = st.ones((8,)), st.ones((8,))
    z = st.empty((8,)).partition((4,))
    x, y, z = launch(add, (x, y, z), {}).sync()
    in_flight = launch(add, (x, y, z), {})
    with pytest.raises(st.MovedError, match="kernel 'add'"):
        launch(add, (x, y, z), {})
    in_flight.sync()
    launch(add, (x, y, z), {}).sync()


def test_an_empty_triton_hook_chain_counts_as_no_hook():
    import triton
    rt = triton.knobs.runtime
    assert not rt.launch_enter_hook.calls and not rt.launch_exit_hook.calls
    assert not launcher._hooked()

    def hook(metadata):
        pass

    rt.launch_enter_hook.add(hook)
    try:
        assert launcher._hooked()
    finally:
        rt.launch_enter_hook.remove(hook)


class _Launcher:
    """Stands in for Triton's CudaLauncher: reads ``launch_pdl`` at each call."""

    def __init__(self):
        self.launch_pdl = True
        self.calls = []

    def __call__(self, *args):
        self.calls.append(self.launch_pdl)


class _Compiled:
    """Stands in for a CompiledKernel, whose ``run`` is a read-only property."""

    def __init__(self):
        self._launcher = _Launcher()
        self.function, self.packed_metadata = 0, ()

    @property
    def run(self):
        return self._launcher


def test_a_serial_launch_through_the_general_entry_drops_pdl_and_a_plain_one_keeps_it():
    compiled = _Compiled()
    calls = compiled.run.calls                      # (the shallow copy shares the list)
    launcher._launch_general(compiled, (1,), 0, [], serial=True)
    launcher._launch_general(compiled, (1,), 0, [])
    assert calls == [False, True]
    assert compiled.run.launch_pdl                 # the binary's own launcher is untouched
    assert launcher._serial_launcher(compiled) is launcher._serial_launcher(compiled)


def test_a_binarys_serial_launcher_is_forgotten_with_the_binary():
    compiled = _Compiled()
    serial = weakref.ref(launcher._serial_launcher(compiled))
    del compiled
    gc.collect()
    assert serial() is None
