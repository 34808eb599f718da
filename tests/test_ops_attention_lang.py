"""``x.load_at(offset, shape, padding)``: In loads at an element offset (used by the KV append).

The box may start anywhere, negative offsets included; elements outside the tensor read as
``padding`` on the CPU executor and in the generated Triton (masked on every side).
"""
import pytest
import torch

import safetile as st
import safetile.lang as sl


@st.kernel
def window(x: st.In[st.f32, 2], start: st.In[st.i32, 1], z: st.Out[st.f32, 2]):
    """Row block i of z = the (R, C) box of x starting at row start[0] + i*R - 3, column -1."""
    i, _ = z.index
    s = start.load_scalar((0,))
    z.store(x.load_at((s + i * z.shape[0] - 3, -1), (z.shape[0], z.shape[1]), padding=-7.0))


def expected(x: torch.Tensor, start: int, rows: int, tile_rows: int, cols: int) -> torch.Tensor:
    out = torch.full((rows, cols), -7.0)
    for r in range(rows):
        src = start + (r // tile_rows) * tile_rows + r % tile_rows - 3
        for c in range(cols):
            sc = c - 1
            if 0 <= src < x.shape[0] and 0 <= sc < x.shape[1]:
                out[r, c] = x[src, sc]
    return out


@pytest.mark.parametrize("start", [0, 2, 5, 11])
def test_load_at_reads_the_box_at_an_element_offset_with_padding(start):
    x = torch.randn(13, 6)
    with st.backend("interpret", seed=1):
        _, _, z = window(st.from_torch(x.clone()),
                         st.from_torch(torch.tensor([start], dtype=torch.int32)),
                         st.empty((16, 8), device="cpu").partition((4, 8))).sync()
    assert torch.equal(z.unpartition().to_torch(), expected(x, start, 16, 4, 8))


def test_load_at_generates_a_masked_helper_that_compiles_for_sm90():
    args = (st.empty((13, 6), device="cpu"), st.zeros((1,), dtype=st.i32, device="cpu"),
            st.empty((16, 8), device="cpu").partition((4, 8)))
    src = window.source(*args)
    assert "def _st_loadat2(" in src
    assert "(o0 >= 0) & (o0 < n0)" in src and "(o1 >= 0) & (o1 < n1)" in src
    assert "other=pad" in src and 'float("-7.0")' not in src and "-7.0" in src
    window.compile(*args)
