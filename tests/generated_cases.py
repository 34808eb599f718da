"""Launches of the library's kernels whose generated Triton source is recorded in
``tests/data/generated_source.json`` (``test_generated_source.py`` keeps it unchanged).

Each case is a name and a function returning ``(kernel, args)``; ``kernel.source(*args)`` is
its generated source. Run ``python tests/generated_cases.py`` to record them again, only
after a deliberate change of the code generator.
"""
import json
import pathlib

import safetile as st
from safetile.ops.argmax import argmax_final_kernel, argmax_partial_kernel
from safetile.ops.early_attention import _kernel as early_attention_kernel
from safetile.ops.decode_attention import (DEFAULT_MASKED, WHOLE_STAGES, _split_kernel,
                                           decode_merge_kernel, decode_whole_kernel)
from safetile.ops.elementwise import add_kernel, mul_kernel, silu_mul_kernel
from safetile.ops.embedding import embedding_kernel
from safetile.ops.fused_gemv import (configured, gemv_add_kernel, rmsnorm_gemv_kernel,
                                     silu_mul_gemv_add_kernel)
from safetile.ops.gemv import _kernel as gemv_kernel
from safetile.ops.gemv import choose_config
from safetile.ops.gemv_argmax import rmsnorm_gemv_argmax_kernel
from safetile.ops.matmul import MatmulConfig, _configured, _kernels
from safetile.ops.norm import add_rmsnorm_kernel, rmsnorm_kernel
from safetile.ops.qk_rope_append import _kernel as qk_rope_kernel
from safetile.ops.prologue_attention import _kernel as prologue_attention_kernel
from safetile.ops.qk_rope_append import qk_norm_rope_append_kernel
from safetile.ops.rope import rope_kernel
from safetile.ops.softmax import softmax_kernel, softmax_online_kernel

GOLDEN = pathlib.Path(__file__).parent / "data" / "generated_source.json"
BF = st.bf16


def z(shape, dtype=BF):
    return st.zeros(shape, dtype=dtype, device="cpu")


def out(shape, tile, dtype=BF, **kw):
    return st.empty(shape, dtype=dtype, device="cpu").partition(tile, **kw)


def _fused(factory, n, k, args):
    c = choose_config(n, k, pdl=True)
    blocks = -(-k // c.bk)
    return configured(factory.__name__, factory(c.bk, c.head), c), args(c, blocks)


CASES = {
    "add": lambda: (add_kernel, (z((1 << 20,)), z((1 << 20,)), out((1 << 20,), (4096,)))),
    "mul": lambda: (mul_kernel, (z((1 << 20,)), z((1 << 20,)), out((1 << 20,), (4096,)))),
    "silu_mul": lambda: (silu_mul_kernel, (z((4, 9728)), z((4, 9728)),
                                           out((4, 9728), (1, 4096)))),
    "rmsnorm": lambda: (rmsnorm_kernel.options(num_warps=8),
                        (z((3, 2560)), z((2560,)), out((3, 2560), (1, 4096)), 1e-6)),
    "add_rmsnorm": lambda: (add_rmsnorm_kernel.options(num_warps=8),
                            (z((3, 2560)), z((3, 2560)), z((2560,)), out((3, 2560), (1, 4096)),
                             out((3, 2560), (1, 4096)), 1e-6)),
    "rope": lambda: (rope_kernel, (z((5, 32, 128)), z((5,), st.i32), z((64,), st.f32),
                                   out((5, 32, 128), (1, 32, 128)))),
    "softmax": lambda: (softmax_kernel, (z((8, 1000)), out((8, 1000), (4, 1024)))),
    "softmax_online": lambda: (softmax_online_kernel, (z((1, 151936), st.f32),
                                                       out((1, 151936), (1, 262144), st.f32),
                                                       4096)),
    "embedding": lambda: (embedding_kernel, (z((3,), st.i64), z((1000, 2560)),
                                             out((3, 2560), (1, 4096)))),
    "argmax_partial": lambda: (argmax_partial_kernel, (z((151936,)), out((149,), (1,), st.f32),
                                                       out((149,), (1,), st.i64), 1024)),
    "argmax_final": lambda: (argmax_final_kernel, (z((149,), st.f32), z((149,), st.i64),
                                                   out((1,), (1,), st.i64), 256)),
    "matmul_persistent": lambda: (_configured(_kernels(64, True)[0], MatmulConfig(128, 256, 64, 8, 3)),
                                  (z((512, 256)), z((512, 256)),
                                   out((512, 512), (128, 256), order="grouped", group_size=8,
                                       persistent=132), 0)),
    "gemv_pipelined": lambda: (gemv_kernel(256).options(loop_stages=4, num_warps=4),
                               (z((256, 2048)), z((2048,)), out((256,), (16,)), 8)),
    "gemv_prefetch_pdl": lambda: (
        gemv_kernel(512, PREFETCH=2).options(loop_stages=4, num_warps=4, tma=False, pdl=True),
        (z((2560, 4096)), z((4096,)), out((2560,), (4,)), 8)),
    "rmsnorm_gemv_qkv": lambda: _fused(rmsnorm_gemv_kernel, 6144, 2560, lambda c, b: (
        z((2560,)), z((2560,)), z((6144, 2560)), out((6144,), (c.bn,)), 1e-6, b, 4096)),
    "gemv_add_o": lambda: _fused(gemv_add_kernel, 2560, 4096, lambda c, b: (
        z((2560, 4096)), z((4096,)), z((2560,)), out((2560,), (c.bn,)), b)),
    "silu_mul_gemv_add_down": lambda: _fused(silu_mul_gemv_add_kernel, 2560, 9728, lambda c, b: (
        z((2560, 9728)), z((2, 9728)), z((2560,)), out((2560,), (c.bn,)), b)),
    "rmsnorm_gemv_argmax_lm_head": lambda: _fused(
        rmsnorm_gemv_argmax_kernel, 151936, 2560, lambda c, b: (
            z((2560,)), z((2560,)), z((151936, 2560)), out((151936,), (c.bn,)),
            out((18992,), (1,), st.f32), out((18992,), (1,), st.i64), 1e-6, b, 4096)),
    "qk_norm_rope_append": lambda: (qk_rope_kernel(qk_norm_rope_append_kernel, 4, True), (
        z((48, 128)), z((128,)), z((128,)), z((1,), st.i32), z((64,), st.f32),
        out((8, 4, 128), (1, 4, 128)), out((8, 4096, 128), (1, 4096, 128)),
        out((8, 4096, 128), (1, 4096, 128)), 1e-6, 4, 32, 8)),
    "prologue_attention": lambda: (prologue_attention_kernel(4, WHOLE_STAGES, True, True), (
        z((48, 128)), z((128,)), z((128,)), z((1,), st.i32), z((64,), st.f32),
        out((8, 4096, 128), (1, 4096, 128)), out((8, 4096, 128), (1, 4096, 128)),
        out((8, 4, 128), (1, 16, 128)), 1e-6, 0.1, 4096, 4, 32, 8, 64)),
    "early_attention": lambda: (early_attention_kernel(8, 1, True, False), (
        z((8, 4096, 128)), z((8, 4096, 128)), z((1,), st.i32), z((128,)), z((128,)),
        z((64,), st.f32), z((48, 128)), out((8, 4, 128), (1, 16, 128)),
        out((8, 1, 128), (1, 1, 128)), 1e-6, 0.1, 4, 32, 8, 64, 4, True)),
    "decode_split": lambda: (_split_kernel(4, 3, pdl=True, trigger_early=True), (
        z((32, 128)), z((8, 4096, 128)), z((8, 4096, 128)), z((1,), st.i32),
        out((8, 16, 4, 128), (1, 1, 16, 128), st.f32),
        out((8, 16, 4, 1), (1, 1, 16, 1), st.f32), 0.1, 64, 1, True, 0, DEFAULT_MASKED)),
    "decode_whole": lambda: (decode_whole_kernel.options(
        num_warps=4, num_stages=WHOLE_STAGES, pdl=True, trigger_early=True), (
        z((32, 128)), z((8, 4096, 128)), z((8, 4096, 128)), z((1,), st.i32),
        out((8, 4, 128), (1, 16, 128)), 0.1, 64, 1)),
    "decode_merge": lambda: (decode_merge_kernel, (
        z((8, 16, 4, 128), st.f32), z((8, 16, 4, 1), st.f32), out((32, 128), (4, 128)), 4, 16)),
}


def generated_source(name: str) -> str:
    kernel, args = CASES[name]()
    return kernel.source(*args)


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({n: generated_source(n) for n in sorted(CASES)}, indent=1,
                                 sort_keys=True) + "\n")
    print(f"recorded {len(CASES)} kernels in {GOLDEN}")
