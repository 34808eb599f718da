"""Every kernel of the element-wise, norm, rope, softmax, embedding and argmax ops, and the
KV append under programmatic launch, compiles for sm_90 (H200) on this CPU machine, from the
Triton source the code generator writes."""
import re

import pytest

import safetile as st
from safetile.ops.argmax import argmax_final_kernel, argmax_partial_kernel
from safetile.ops.elementwise import add_kernel, mul_kernel, silu_mul_kernel
from safetile.ops.embedding import embedding_kernel
from safetile.ops.kv_cache import kv_append_kernel
from safetile.ops.norm import add_rmsnorm_kernel, rmsnorm_kernel
from safetile.ops.rope import rope_kernel
from safetile.ops.softmax import softmax_kernel, softmax_online_kernel
from safetile.ops.unsafe_twins import add_unsafe_kernel

N = 1 << 20
BF = st.bf16


def z(shape, dtype=st.f32):
    return st.zeros(shape, dtype=dtype, device="cpu")


def out(shape, tile, dtype=st.f32):
    return st.empty(shape, dtype=dtype, device="cpu").partition(tile)


CASES = {
    "mul": lambda: mul_kernel.compile(z((N,), BF), z((N,), BF), out((N,), (4096,), BF)),
    "silu_mul": lambda: silu_mul_kernel.compile(z((4, 9728), BF), z((4, 9728), BF),
                                                out((4, 9728), (1, 4096), BF)),
    "rmsnorm": lambda: rmsnorm_kernel.options(num_warps=8).compile(
        z((3, 2560), BF), z((2560,), BF), out((3, 2560), (1, 4096), BF), 1e-6),
    "add_rmsnorm": lambda: add_rmsnorm_kernel.options(num_warps=8).compile(
        z((3, 2560), BF), z((3, 2560), BF), z((2560,), BF), out((3, 2560), (1, 4096), BF),
        out((3, 2560), (1, 4096), BF), 1e-6),
    "rope": lambda: rope_kernel.compile(z((5, 32, 128), BF), z((5,), st.i32), z((64,)),
                                        out((5, 32, 128), (1, 32, 128), BF)),
    "softmax": lambda: softmax_kernel.compile(z((8, 1000), BF), out((8, 1000), (4, 1024), BF)),
    "softmax_online": lambda: softmax_online_kernel.compile(
        z((1, 151936)), out((1, 151936), (1, 262144)), 4096),
    "embedding": lambda: embedding_kernel.compile(z((3,), st.i64), z((1000, 2560), BF),
                                                  out((3, 2560), (1, 4096), BF)),
    "argmax_partial": lambda: argmax_partial_kernel.compile(
        z((151936,), BF), out((149,), (1,)), out((149,), (1,), st.i64), 1024),
    "kv_append_pdl": lambda: kv_append_kernel.options(pdl=True, trigger_early=True).compile(
        z((8, 128), BF), z((8, 128), BF), z((1,), st.i32), out((8, 8218, 128), (1, 8192, 128), BF),
        out((8, 8218, 128), (1, 8192, 128), BF), 8218),
    "argmax_final": lambda: argmax_final_kernel.compile(
        z((149,)), z((149,), st.i64), out((1,), (1,), st.i64), 256),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_for_sm90(name):
    assert ".target sm_90" in CASES[name]().asm["ptx"]


def _globals(ptx: str, op: str) -> list:
    return re.findall(rf"{op}\.global[\w.]*", ptx)


def test_safe_add_streams_like_its_unsafe_twin():
    """Same tiling, same 128-bit global accesses, and no barrier: In reads carry no token."""
    safe = add_kernel.options(num_warps=8).compile(z((N,)), z((N,)), out((N,), (4096,))).asm["ptx"]
    raw = add_unsafe_kernel.options(grid=(N // 4096,), num_warps=8).compile(
        z((N,)), z((N,)), z((N,)), N, 4096).asm["ptx"]
    for op in ("ld", "st"):
        assert _globals(safe, op) == _globals(raw, op)
        assert set(_globals(safe, op)) == {f"{op}.global.v4.b32"}
    assert "bar.sync" not in safe
