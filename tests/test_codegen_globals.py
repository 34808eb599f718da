"""Numbers a kernel takes from its module or closure are used by their plain value.

A subclass of int or float (numpy's float64 is one) may override ``repr``, ``__index__`` or
arithmetic; the generated source spells the number itself, never the object's own rendering,
so no global can put text into a kernel. These tests compile for sm_90 without a GPU.
"""
import numpy as np
import torch

import safetile as st
import safetile.lang as sl


class Spelled(int):
    """An int whose repr is Triton statements (a store 1000 elements past the tile)."""

    def __repr__(self):
        return ("4))\n    tl.store(_st_z_ptr + tl.arange(0, 4) + 1000, tl.full((4,), 6.0, "
                "tl.float32))\n    _unused = ((0")


class Halved(float):
    def __repr__(self):
        return "0.5) + tl.full((4,), 9.0, tl.float32) * 0 + (0.0"


FOUR = Spelled(4)
HALF = Halved(0.5)
WIDE = np.float64(0.25)


@st.kernel
def scale_by_global_int(z: st.Out[st.f32]):
    z.store(sl.full((4,), 1.0, st.f32) * FOUR)


@st.kernel
def fill_with_global_float(z: st.Out[st.f32]):
    z.store(sl.full((4,), HALF, st.f32) + WIDE)


def out():
    return st.zeros((16,), device="cpu").partition((4,))


def test_an_int_subclass_global_is_spelled_as_its_value():
    source = scale_by_global_int.source(out())
    assert "1000" not in source and "tl.store(_st_z_ptr" not in source
    scale_by_global_int.compile(out())


def test_a_float_subclass_global_is_spelled_as_its_value():
    source = fill_with_global_float.source(out())
    assert "9.0" not in source
    fill_with_global_float.compile(out())


def test_subclass_globals_compute_their_plain_values():
    (z,) = scale_by_global_int(out()).sync()
    assert torch.equal(z.unpartition().to_torch(), torch.full((16,), 4.0))
    (z,) = fill_with_global_float(out()).sync()
    assert torch.equal(z.unpartition().to_torch(), torch.full((16,), 0.75))
