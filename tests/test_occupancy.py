"""The ``max_programs_per_sm`` launch option: the shared-memory padding that caps residency."""
import pytest
import torch

import safetile as st
from safetile.device import launcher
from safetile.device.occupancy import padded_shared
from safetile.errors import ArgumentError
from safetile.kernel.launch import _variant, bind

from support import add

H200_SM_SHARED, RESERVED = 233472, 1024


@pytest.mark.parametrize("cap", [1, 2, 5, 6, 7, 16])
def test_the_padding_fits_cap_programs_on_an_sm_and_not_one_more(cap):
    per_program = padded_shared(1024, cap, H200_SM_SHARED, RESERVED) + RESERVED
    assert cap * per_program <= H200_SM_SHARED < (cap + 1) * per_program


def test_a_kernel_that_already_needs_more_shared_memory_is_not_padded():
    assert padded_shared(100_000, 5, H200_SM_SHARED, RESERVED) == 100_000


def test_a_cap_below_one_is_refused_by_the_padding():
    with pytest.raises(ValueError, match="at least 1"):
        padded_shared(0, 0, H200_SM_SHARED, RESERVED)


@pytest.mark.parametrize("cap", [0, -1, 2.5, "4"])
def test_launch_options_refuse_a_cap_that_is_not_a_positive_int(cap):
    with pytest.raises(ArgumentError, match="max_programs_per_sm"):
        add.options(max_programs_per_sm=cap)


def test_kernels_with_different_caps_get_different_variants():
    x, y, z = st.zeros((8,)), st.zeros((8,)), st.empty((8,)).partition((4,))
    capped = add.options(max_programs_per_sm=4)
    a = _variant(capped, bind(capped, (x, y, z), {}))
    b = _variant(add, bind(add, (x, y, z), {}))
    assert a.key.max_programs_per_sm == 4 and b.key.max_programs_per_sm is None
    assert a is not b


@pytest.mark.gpu
def test_a_capped_kernel_asks_for_the_padded_shared_memory_and_computes_the_same():
    st.set_backend("triton")
    x, y = st.randn((1 << 16,), seed=1), st.randn((1 << 16,), seed=2)
    z = st.empty((1 << 16,))
    got = add.options(max_programs_per_sm=2)(x, y, z.partition((1024,))).sync()
    assert torch.equal(got[2].unpartition().to_torch(), x.to_torch() + y.to_torch())
    capped = add.options(max_programs_per_sm=2)
    bound = bind(capped, (x, y, st.empty((1 << 16,)).partition((1024,))), {})
    L = launcher.launcher_for(capped, bound)
    args, spec = L.args(bound)
    shared = L.binary(spec, args, (64,)).packed_metadata[2]
    props = torch.cuda.get_device_properties(0)
    assert 2 * shared <= props.shared_memory_per_multiprocessor < 3 * (shared + RESERVED)
