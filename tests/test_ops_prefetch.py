"""``ops.l2_prefetch``: L2 prefetch hints over a weight's leading rows, in a safe kernel.

It reads nothing into the program and changes no value: each program prefetches its rows in
line-wide steps (before the programmatic-launch wait under ``pdl``) and writes its first row
to its element of the receipt, the Out that sets the grid. The CPU executor runs the
programs, which write the receipt and skip the hints.
"""
import pytest
import torch

import safetile as st
from safetile import ops
from safetile.errors import ArgumentError
from safetile.ops.prefetch import PROGRAMS, l2_prefetch_kernel


def weight(rows=40, cols=300, dtype=st.bf16):
    return st.randn((rows, cols), dtype=dtype, device="cpu").share()


def test_the_receipt_holds_each_programs_first_row():
    w = weight(rows=600)                      # 600 rows over 256 programs: 4 a program
    receipt = ops.l2_prefetch(w).sync().into_torch()
    assert receipt.tolist() == list(range(0, 600, 4))


def test_rows_limits_the_programs_to_the_leading_rows():
    receipt = ops.l2_prefetch(weight(rows=40), rows=7).sync().into_torch()
    assert receipt.tolist() == list(range(7))


def test_a_weight_of_many_rows_is_spread_over_at_most_the_program_count():
    w = weight(rows=5000, cols=8)
    assert ops.l2_prefetch_receipt(w).shape == (-(-5000 // 32),)
    assert -(-5000 // 32) <= PROGRAMS


def test_a_preallocated_receipt_is_written_and_returned():
    w = weight()
    receipt = ops.l2_prefetch_receipt(w, 10)
    out = ops.l2_prefetch(w, 10, receipt=receipt).sync()
    assert out is receipt and receipt.into_torch().tolist() == list(range(10))


def test_a_shared_weight_is_usable_again_and_unchanged():
    w = weight()
    before = w.to_torch()
    ops.l2_prefetch(w).sync()
    ops.l2_prefetch(w).sync()                 # the Shared weight is held only while in flight
    assert torch.equal(w.to_torch(), before)


def test_a_tensor_weight_stays_live_after_the_op():
    w = st.randn((16, 64), dtype=st.f32, device="cpu")
    ops.l2_prefetch(w).sync()
    assert w.into_torch().shape == (16, 64)


@pytest.mark.parametrize("rows", [0, 41, -1, 2.5, True])
def test_rows_outside_the_weight_are_refused(rows):
    with pytest.raises(ArgumentError, match="rows must be an int from 1 to 40"):
        ops.l2_prefetch(weight(), rows)


def test_a_vector_is_refused():
    with pytest.raises(ArgumentError, match="2-D"):
        ops.l2_prefetch(st.randn((64,), device="cpu"))


def test_a_receipt_of_the_wrong_shape_is_refused():
    with pytest.raises(ArgumentError):
        ops.l2_prefetch(weight(), 10, receipt=st.empty((9,), dtype=st.i32, device="cpu"))


def _body(src: str) -> list[str]:
    return [ln.strip() for ln in src.split("def l2_prefetch_kernel(")[1].split("\n")[1:]]


def test_under_pdl_every_hint_precedes_the_wait_and_the_store_follows_it():
    args = (weight(rows=64, cols=4096),
            st.empty((4,), dtype=st.i32, device="cpu").partition((1,)), 16, 1024, 4)
    body = _body(l2_prefetch_kernel.options(pdl=True).source(*args))
    wait = body.index("_st_gdc_wait()")
    assert any(ln.startswith("_st_prefetch2(") for ln in body[:wait])
    assert not any("_st_prefetch2(" in ln for ln in body[wait:])
    assert any(ln.startswith("_st_store1(") for ln in body[wait:])
    assert not any("_st_load" in ln or "_st_store" in ln for ln in body[:wait])


def test_it_compiles_for_sm90():
    args = (st.zeros((2560, 4096), dtype=st.bf16, device="cpu"),
            st.empty((160,), dtype=st.i32, device="cpu").partition((1,)), 16, 1024, 4)
    ptx = l2_prefetch_kernel.options(pdl=True, trigger_early=True).compile(*args).asm["ptx"]
    assert "prefetch.global.L2" in ptx and "griddepcontrol.wait" in ptx
