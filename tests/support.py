"""Helpers shared by the CPU tests of the kernel library: inputs, wrapping, the executor."""
import gc

import pytest
import torch

import safetile as st
import safetile.lang as sl
from safetile import ops
from safetile.tensor import active_holds

FLOAT_DTYPES = [st.f32, st.f16, st.bf16]
FLOAT_IDS = [d.name for d in FLOAT_DTYPES]


def rand(shape, dtype, seed, scale=1.0) -> torch.Tensor:
    """Seeded standard-normal values (times ``scale``) rounded to ``dtype``; never all zeros."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype.torch)


def wrap(t: torch.Tensor) -> st.Tensor:
    """A safetile Tensor owning a copy of ``t`` (so the test keeps ``t`` as its reference)."""
    return st.from_torch(t.clone())


# (q heads, kv heads, head_dim) of the decode prologue tests: a group of 4 (Qwen3-4B's), 5
# (padded to 8, as Qwen3-14B's), 1 (no grouping), and head_dims 128, 64 and 32
PROLOGUE_SHAPES = [(8, 2, 128), (10, 2, 64), (4, 4, 32)]
PROLOGUE_SHAPE_IDS = ["group4", "group5", "group1"]
ROPE_THETA = 1e6


def position(p: int) -> st.Tensor:
    """A decode position as the (1,) int32 device tensor the decode ops read."""
    return st.from_torch(torch.tensor([p], dtype=torch.int32))


def prologue_inputs(hq, hkv, d, dtype, max_seq, seed=0) -> tuple:
    """``(qkv, q_norm_weight, k_norm_weight, k_cache, v_cache)`` of the decode prologue."""
    qkv = rand((hq + 2 * hkv) * d, dtype, seed, 2.0)
    qw, kw = rand(d, dtype, seed + 1), rand(d, dtype, seed + 2)
    kc, vc = rand((hkv, max_seq, d), dtype, seed + 3), rand((hkv, max_seq, d), dtype, seed + 4)
    return qkv, qw, kw, kc, vc


def prologue_arguments(max_seq: int, seed: int, hq=4, hkv=2, d=32) -> dict:
    """The decode prologue's arguments by parameter name, as float32 torch tensors (a test
    changes one, then wraps them all)."""
    qkv, qw, kw, kc, vc = prologue_inputs(hq, hkv, d, st.f32, max_seq, seed)
    return dict(qkv=qkv, q_norm_weight=qw, k_norm_weight=kw,
                pos=torch.tensor([1], dtype=torch.int32),
                inv_freq=ops.inv_freq_table(d, ROPE_THETA, "cpu").to_torch(), k_cache=kc,
                v_cache=vc)


def prologue_chain(qkv, qw, kw, kc, vc, p: int, d: int):
    """The unfused reference of the decode prologues on the CPU: ops.qk_norm_rope_kv_append,
    then the one-split ops.decode_attention; returns (out, k_cache, v_cache)."""
    q, k_cache, v_cache = ops.qk_norm_rope_kv_append(
        wrap(qkv), wrap(qw), wrap(kw), position(p), ops.inv_freq_table(d, ROPE_THETA, "cpu"),
        wrap(kc), wrap(vc)).sync()
    out = ops.decode_attention(q, k_cache, v_cache, position(p), length_offset=1,
                               num_splits=1).sync()
    return out, k_cache, v_cache


def grouped_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      rows: int) -> torch.Tensor:
    """fp32 attention of q (Hq, D) over the first ``rows`` rows of the caches (Hkv, S, D),
    each kv head serving Hq / Hkv q heads."""
    group, d = q.shape[0] // k_cache.shape[0], q.shape[1]
    keys = k_cache[:, :rows].float().repeat_interleave(group, 0)
    values = v_cache[:, :rows].float().repeat_interleave(group, 0)
    w = torch.softmax(torch.einsum("hd,hnd->hn", q.float(), keys) / d ** 0.5, -1)
    return torch.einsum("hn,hnd->hd", w, values)


def cpu_executor(seed: int):
    """An autouse fixture running every test of a module on the CPU executor with ``seed``."""
    @pytest.fixture(autouse=True)
    def fixture():
        with st.backend("interpret", seed=seed):
            yield
    return fixture


def triton_backend():
    """An autouse fixture running every test of a module on the ``triton`` backend."""
    @pytest.fixture(autouse=True)
    def fixture():
        with st.backend("triton"):
            yield
    return fixture


def cuda_bf16(shape, seed: int, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
    """Seeded normal values on the GPU, ``* scale + offset``, rounded to bf16."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * scale + offset).to(torch.bfloat16)


# -- shared by the device-layer tests ------------------------------------------------------------

@st.kernel
def add(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32]):
    """z = x + y, one owned tile per program."""
    z.store(sl.load_like(x, z) + sl.load_like(y, z))


def holds_left() -> list:
    """The borrows still held once garbage is gone (``active_holds()``). A full collection
    costs a tenth of a second in a large test process, so it runs only when something is
    held: one that frees nothing cannot empty the list."""
    held = active_holds()
    if held:
        gc.collect()
        held = active_holds()
    return held


def no_leftover_holds():
    """An autouse fixture asserting that every test hands back all storage borrows."""
    @pytest.fixture(autouse=True)
    def fixture():
        yield
        assert holds_left() == [], "a test leaked a borrow hold"
    return fixture


def vec(*values) -> st.Tensor:
    """A small fp32 Tensor holding ``values``."""
    return st.from_torch(torch.tensor(values, dtype=torch.float32))


def out(n: int = 4) -> st.Partition:
    """An uninitialized fp32 output of ``n`` elements in tiles of 2."""
    return st.empty((n,)).partition((2,))
