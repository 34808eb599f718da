"""Library ops given an input of a dtype their kernels cannot take: an ArgumentError naming
the op and its own argument, raised before anything is launched (never the kernel's
parameter name)."""
import pytest

import safetile as st
from safetile import ops

import support

cpu_executor = support.cpu_executor(seed=3)

K = 64


def f(*shape):
    return st.zeros(shape, device="cpu")


def i(*shape):
    return st.zeros(shape, dtype=st.i32, device="cpu")


def prologue(op, **kw):
    # 4 q heads and 2 kv heads of 32, every float input int32
    return op(i(256), i(32), i(32), i(1), ops.inv_freq_table(32, device="cpu"), **kw)


DTYPE_CASES = {
    "add: x": lambda: ops.add(i(64), i(64)),
    "mul: x": lambda: ops.mul(i(64), i(64)),
    "silu_mul: gate": lambda: ops.silu_mul(i(64), i(64)),
    "embedding: ids": lambda: ops.embedding(f(2), f(10, 16)),
    "embedding: table": lambda: ops.embedding(i(2), i(10, 16)),
    "rmsnorm: x": lambda: ops.rmsnorm(i(2, K), i(K)),
    "add_rmsnorm: x": lambda: ops.add_rmsnorm(i(2, K), i(2, K), i(K)),
    "rope: x": lambda: ops.rope(i(3, 2, 16), i(3), f(8)),
    "rope: positions": lambda: ops.rope(f(3, 2, 16), f(3), f(8)),
    "rope: inv_freq": lambda: ops.rope(f(3, 2, 16), i(3), i(8)),
    "softmax: x": lambda: ops.softmax(i(2, K)),
    "argmax: x": lambda: ops.argmax(i(300)),
    "flash_attention: q": lambda: ops.flash_attention(i(2, 8, 16), i(2, 8, 16), i(2, 8, 16)),
    "decode_attention: q": lambda: ops.decode_attention(i(4, 16), i(2, 64, 16),
                                                        i(2, 64, 16), i(1)),
    "decode_attention_split: q": lambda: ops.decode_attention_split(
        i(4, 16), i(2, 64, 16), i(2, 64, 16), i(1), ops.DecodeWorkspace(2, 2, 16, 2, "cpu")),
    "kv_append: k_new": lambda: ops.kv_append(i(2, 16), i(2, 16), i(1), i(2, 20, 16),
                                              i(2, 20, 16)),
    "kv_append_many: k_new": lambda: ops.kv_append_many(i(2, 3, 16), i(2, 3, 16), i(1),
                                                        i(2, 20, 16), i(2, 20, 16)),
    "sample: logits": lambda: ops.sample(i(100), ops.sampling_params(1.0, device="cpu"),
                                         ops.sampling_key(0, device="cpu"), i(1)),
    "rmsnorm_gemv: w": lambda: ops.rmsnorm_gemv(i(K), i(K), i(16, K)),
    "gemv_add: w": lambda: ops.gemv_add(i(16, K), i(K), f(16)),
    "gemv_add: residual": lambda: ops.gemv_add(f(16, K), f(K), i(16)),
    "silu_mul_gemv_add: w": lambda: ops.silu_mul_gemv_add(i(16, K), i(2 * K), f(16)),
    "silu_mul_gemv_add: residual": lambda: ops.silu_mul_gemv_add(f(16, K), f(2 * K), i(16)),
    "rmsnorm_gemv_argmax: w": lambda: ops.rmsnorm_gemv_argmax(i(K), i(K), i(300, K)),
    "qk_norm_rope: qkv": lambda: prologue(ops.qk_norm_rope, kv_heads=2),
    "qk_norm_rope_kv_append: qkv": lambda: prologue(
        ops.qk_norm_rope_kv_append, k_cache=i(2, 16, 32), v_cache=i(2, 16, 32)),
    "qk_norm_rope_append_attention: qkv": lambda: prologue(
        ops.qk_norm_rope_append_attention, k_cache=i(2, 16, 32), v_cache=i(2, 16, 32)),
    "qk_norm_rope_attention: qkv": lambda: prologue(
        ops.qk_norm_rope_attention, k_cache=i(2, 16, 32), v_cache=i(2, 16, 32)),
}


@pytest.mark.parametrize("case", sorted(DTYPE_CASES))
def test_an_input_of_a_dtype_the_kernels_cannot_take_names_the_op_and_its_argument(case):
    with pytest.raises(st.ArgumentError, match=rf"ops\.{case} must be st\.\w+.*, got st\."):
        DTYPE_CASES[case]()


def test_linear_names_itself_and_its_x_and_w_in_its_argument_errors():
    with pytest.raises(st.ArgumentError, match=r"ops\.linear: x and w must be matrices"):
        ops.linear(f(8, K), f(16, K, 1))
    with pytest.raises(st.ArgumentError, match=r"ops\.linear: x \(8, 64\) \(M, K\) and w "):
        ops.linear(f(8, K), f(16, 32))
    with pytest.raises(st.ArgumentError, match=r"ops\.linear: x and w's dtype must be"):
        ops.linear(i(8, K), i(16, K))
