"""Host values on CUDA tensors (run on the GPU machine; skipped elsewhere)."""
import pytest
import torch

from safetile import dtypes
from safetile.errors import AliasError, BorrowError, MovedError
from safetile.tensor import (acquire, active_holds, default_device, from_dlpack, from_torch,
                             overlaps, randn, zeros)

pytestmark = pytest.mark.gpu


def test_default_device_is_cuda_when_present(monkeypatch):
    monkeypatch.delenv("SAFETILE_DEVICE", raising=False)
    default_device.cache_clear()
    try:
        assert default_device().type == "cuda"
        assert zeros(4).device.type == "cuda"
    finally:
        default_device.cache_clear()


def test_cuda_overlap_checks_match_the_cpu_rules():
    base = zeros((64, 64), device="cuda")
    assert overlaps(base[:, 0::2]._torch, base[:, 2::4]._torch)
    assert not overlaps(base[:, 0::2]._torch, base[:, 1::2]._torch)
    assert not overlaps(base[:32]._torch, base[32:]._torch)
    with pytest.raises(AliasError, match="Out 'z' overlaps In 'x'"):
        acquire("kernel 'k'", reads=[("x", base._torch)], writes=[("z", base[3]._torch)])


def test_cuda_and_cpu_tensors_never_overlap_and_holds_are_per_device():
    before = len(active_holds())     # values other tests still share (tracebacks keep them)
    g = zeros(8, device="cuda")
    c = zeros(8, device="cpu")
    assert not overlaps(g._torch, c._torch)
    with acquire("kernel 'k'", writes=[("z", g._torch)]):
        acquire("kernel 'j'", writes=[("z", c._torch)]).release()
        with pytest.raises(BorrowError):
            g.to_torch()
    assert len(active_holds()) == before


def test_cuda_host_copies_are_copies():
    t = randn((16,), dtype=dtypes.bfloat16, device="cuda", seed=1)
    a = t.numpy()
    assert str(a.dtype) == "float32" and a.shape == (16,)
    c = t.to_torch()
    assert c.device.type == "cuda" and c.data_ptr() != t._torch.data_ptr()


def test_cuda_randn_seed_is_reproducible():
    a = randn((256,), device="cuda", seed=3).to_torch()
    b = randn((256,), device="cuda", seed=3).to_torch()
    assert torch.equal(a, b)


def test_cuda_dlpack_round_trip_is_zero_copy():
    t = zeros((8, 8), device="cuda")
    other = torch.from_dlpack(t)
    assert other.data_ptr() == t._torch.data_ptr() and other.device.type == "cuda"
    back = from_dlpack(t)
    assert back._torch.data_ptr() == t._torch.data_ptr()


def test_cuda_partition_moves_and_restores():
    t = from_torch(torch.zeros(100, device="cuda"))
    p = t.partition((32,))
    assert p.grid == (4,) and p.device.type == "cuda"
    with pytest.raises(MovedError):
        t.device
    assert p.unpartition().device.type == "cuda"
