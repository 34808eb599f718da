"""Helpers shared by the CPU tests of the kernel library: inputs, wrapping, the executor."""
import pytest
import torch

import safetile as st

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
