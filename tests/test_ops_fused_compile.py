"""The fused decode kernels compile for sm_90 (H200) on this CPU machine, at Qwen3-4B's
shapes and default configs, and keep the gemv's early weight loads under PDL."""
import re

import pytest

import safetile as st
from safetile.ops.gemv import _kernel as gemv_kernel
from safetile.ops.gemv import choose_config
from safetile.ops.fused_gemv import (configured, gemv_add_kernel, rmsnorm_gemv_kernel,
                                     silu_mul_gemv_add_kernel)
from safetile.ops.gemv_argmax import rmsnorm_gemv_argmax_kernel
from safetile.ops.qk_rope_append import _kernel as qk_rope_kernel
from safetile.ops.qk_rope_append import qk_norm_rope_append_kernel

BF = st.bf16


def z(shape, dtype=BF):
    return st.zeros(shape, dtype=dtype, device="cpu")


def out(shape, tile, dtype=BF):
    return st.empty(shape, dtype=dtype, device="cpu").partition(tile)


def cfg(n, k, swiglu=False):
    return choose_config(n, k, pdl=True, swiglu=swiglu)


def blocks(c, k):
    return -(-k // c.bk)


# (kernel factory, arguments, the plain gemv's (N, K)) at Qwen3-4B's projections
CASES = {
    "rmsnorm_gemv_qkv": (rmsnorm_gemv_kernel, (6144, 2560), lambda c: (
        z((2560,)), z((2560,)), z((6144, 2560)), out((6144,), (c.bn,)), 1e-6,
        blocks(c, 2560), 4096)),
    "gemv_add_o": (gemv_add_kernel, (2560, 4096), lambda c: (
        z((2560, 4096)), z((4096,)), z((2560,)), out((2560,), (c.bn,)), blocks(c, 4096))),
    "silu_mul_gemv_add_down": (silu_mul_gemv_add_kernel, (2560, 9728), lambda c: (
        z((2560, 9728)), z((2, 9728)), z((2560,)), out((2560,), (c.bn,)),
        blocks(c, 9728))),
    "silu_mul_gemv_add_flat_down_32b": (
        lambda bk, head: silu_mul_gemv_add_kernel(bk, head, True), (5120, 25600), lambda c: (
            z((5120, 25600)), z((2 * 25600,)), z((5120,)), out((5120,), (c.bn,)),
            blocks(c, 25600))),
    "rmsnorm_gemv_argmax_lm_head": (rmsnorm_gemv_argmax_kernel, (151936, 2560), lambda c: (
        z((2560,)), z((2560,)), z((151936, 2560)), out((151936,), (c.bn,)),
        out((18992,), (1,), st.f32), out((18992,), (1,), st.i64), 1e-6, blocks(c, 2560),
        4096)),
}


def early_loads(ptx: str) -> list:
    return re.findall(r"ld\.global[\w.]*", ptx[:ptx.index("griddepcontrol.wait")])


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_gemv_compiles_with_the_gemvs_early_weight_loads(name):
    factory, (n, k), args = CASES[name]
    c = cfg(n, k, swiglu=name.startswith("silu_mul"))
    ptx = configured(name, factory(c.bk, c.head), c).compile(*args(c)).asm["ptx"]
    assert ".target sm_90" in ptx
    plain = gemv_kernel(c.bk, c.head).options(
        num_warps=c.num_warps, loop_stages=c.num_stages, tma=False, pdl=True,
        early=("w",) if c.head else ()).compile(
        z((n, k)), z((k,)), out((n,), (c.bn,)), blocks(c, k)).asm["ptx"]
    # the same weight blocks start before the PDL wait as in ops.gemv (none with head 0)
    assert early_loads(ptx) == early_loads(plain)
    assert bool(early_loads(ptx)) == bool(c.head)


def qk_rope_args() -> tuple:
    """The attention prologue's arguments at Qwen3-4B's shapes, a 4096-row cache."""
    return (z((48, 128)), z((128,)), z((128,)), z((1,), st.i32), z((64,), st.f32),
            out((8, 4, 128), (1, 4, 128)), out((8, 4096, 128), (1, 4096, 128)),
            out((8, 4096, 128), (1, 4096, 128)), 1e-6, 4, 32, 8)


def test_qk_norm_rope_append_compiles_and_reads_qkv_only_after_the_pdl_wait():
    args = qk_rope_args()
    k = qk_rope_kernel(qk_norm_rope_append_kernel, 4, True)
    src = k.source(*args)
    wait = src.index("_st_gdc_wait()")
    assert all(m.start() > wait for m in re.finditer(r"_st_loadat2\(_st_qkv_ptr", src))
    assert src.index("_st_q_weight_ptr, _st_q_weight_n0, _st_q_weight_s0, 0") < wait
    ptx = k.compile(*args).asm["ptx"]
    assert ".target sm_90" in ptx and early_loads(ptx)


def test_the_prologue_with_trigger_early_signals_first_and_still_waits_before_its_stores():
    args = qk_rope_args()
    src = qk_rope_kernel(qk_norm_rope_append_kernel, 4, True, True).source(*args)
    body = src.split("def qk_norm_rope_append_kernel(")[1]
    signal, wait = body.index("_st_gdc_launch_dependents()"), body.index("_st_gdc_wait()")
    assert signal < wait < body.index("_st_substore")
    plain = qk_rope_kernel(qk_norm_rope_append_kernel, 4, True).source(*args)
    body = plain.split("def qk_norm_rope_append_kernel(")[1]
    assert body.index("_st_gdc_wait()") < body.index("_st_gdc_launch_dependents()")


def test_decode_split_without_early_reads_waits_before_every_load():
    # After a KV append (which writes q and the cache) the split keeps programmatic launch
    # only if none of its reads precede the wait.
    from safetile.ops.decode_attention import DEFAULT_MASKED, _split_kernel
    args = (z((32, 128)), z((8, 4096, 128)), z((8, 4096, 128)), z((1,), st.i32),
            out((8, 16, 4, 128), (1, 1, 16, 128), st.f32), out((8, 16, 4, 1), (1, 1, 16, 1),
                                                             st.f32), 0.1, 64, 1, True, 0,
            DEFAULT_MASKED)
    early = _split_kernel(4, 3, pdl=True, trigger_early=True).source(*args)
    late = _split_kernel(4, 3, pdl=True, trigger_early=True, early=False).source(*args)
    assert early.index("_st_gdc_wait()") > early.index("_st_scalar1(_st_length_ptr")
    assert late.index("_st_gdc_wait()") < late.index("_st_scalar1(_st_length_ptr")
