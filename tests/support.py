"""Helpers shared by the CPU tests of the kernel library: inputs, wrapping, the executor."""
import gc

import pytest
import torch

import safetile as st
import safetile.lang as sl
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


def cpu_executor(seed: int):
    """An autouse fixture running every test of a module on the CPU executor with ``seed``."""
    @pytest.fixture(autouse=True)
    def fixture():
        with st.backend("interpret", seed=seed):
            yield
    return fixture


# -- shared by the device-layer tests ------------------------------------------------------------

@st.kernel
def add(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32]):
    """z = x + y, one owned tile per program."""
    z.store(sl.load_like(x, z) + sl.load_like(y, z))


def no_leftover_holds():
    """An autouse fixture asserting that every test hands back all storage borrows."""
    @pytest.fixture(autouse=True)
    def fixture():
        yield
        gc.collect()
        assert active_holds() == [], "a test leaked a borrow hold"
    return fixture


def vec(*values) -> st.Tensor:
    """A small fp32 Tensor holding ``values``."""
    return st.from_torch(torch.tensor(values, dtype=torch.float32))


def out(n: int = 4) -> st.Partition:
    """An uninitialized fp32 output of ``n`` elements in tiles of 2."""
    return st.empty((n,)).partition((2,))
