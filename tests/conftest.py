"""Test configuration: tests marked `gpu` skip themselves when no CUDA GPU is present."""

import gc

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip_gpu)


def pytest_collection_finish(session):
    """What the test modules imported (torch, transformers, ...) lives for the whole run:
    frozen out of the collector's reach, so that the many full collections the tests make
    (every leak check) walk only what the tests themselves build."""
    gc.collect()
    gc.freeze()
