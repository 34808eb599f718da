"""Shared helpers of the safetile.lang tests (test_lang_ops*.py): dtypes, tolerances, inputs
and outputs on the CPU executor."""
import pytest
import torch

import safetile as st

DTYPES = [st.f32, st.f16, st.bf16]
DTYPE_IDS = [d.name for d in DTYPES]
# A few units in the last place of each dtype, for reductions and products.
TOL = {st.f32: 1e-5, st.f16: 4e-3, st.bf16: 3e-2}


@pytest.fixture(autouse=True)
def cpu_executor():
    with st.backend("interpret", seed=3):
        yield


def rand(shape, dtype, seed=0, positive=False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g)
    if positive:
        t = t.abs() + 0.1
    return t.to(dtype.torch)


def In(t: torch.Tensor):
    return st.from_torch(t.clone())


def Out(shape, dtype, tile):
    return st.empty(shape, dtype=dtype, device="cpu").partition(tile)


def result(p) -> torch.Tensor:
    return p.unpartition().to_torch()


def rounded(fp32_value: torch.Tensor, dtype) -> torch.Tensor:
    return fp32_value.to(dtype.torch)


def assert_within_one_ulp(actual, expected, dtype):
    """Equal up to one unit in the last place of ``dtype``: torch's vectorized and scalar
    code paths for transcendental functions may differ by one fp32 ulp, which can also flip
    the rounding of a half-precision result."""
    assert actual.dtype == expected.dtype
    ulp = {st.f32: 2.0 ** -23, st.f16: 2.0 ** -10, st.bf16: 2.0 ** -7}[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), rtol=ulp, atol=1e-30)


def assert_close(actual, expected, dtype):
    torch.testing.assert_close(actual.float(), expected.float(), rtol=TOL[dtype], atol=TOL[dtype])
