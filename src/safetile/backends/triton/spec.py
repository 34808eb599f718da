"""What one compiled variant of a kernel is specialized on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ...dtypes import DType


@dataclass(frozen=True)
class ArgSpec:
    """The launch-time facts about one parameter that change the generated code."""

    name: str
    kind: str                          # In | Out | Const | Ptr | int | float
    dtype: Optional[DType] = None
    rank: Optional[int] = None
    tile: Optional[tuple] = None       # Out: tile shape
    order: str = "row_major"           # Out: program order
    group_size: int = 0                # Out: grouped order
    persistent: bool = False           # Out: programs iterate over several tiles
    value: Any = None                  # Const: the value
    value_type: Any = None             # Const: its type (1 == 1.0 == True, three variants)
    tma: bool = False                  # In loads / Out stores: the layout fits a tensor descriptor


@dataclass(frozen=True)
class VariantKey:
    """Everything a generated source depends on."""

    args: tuple                        # ArgSpec per parameter, in order
    tma: bool = True
    num_warps: Optional[int] = None
    num_stages: Optional[int] = None
    flatten: bool = False              # persistent tiles loop: tl.range(..., flatten=True)
    warp_specialize: bool = False      # persistent tiles loop: tl.range(..., warp_specialize=True)
    loop_stages: Optional[int] = None  # innermost range loops: tl.range(..., num_stages=n)
    tma_store: bool = False            # the owned tile's single store through a descriptor
    pdl: bool = False                  # programmatic dependent launch: wait first, then signal
    early: tuple = ()                  # pdl: In parameters whose leading loads precede the wait
    trigger_early: bool = False        # pdl: signal the next grid at the start, not after the wait


TMA_MAX_RANK = 5


def tma_ok(t) -> bool:
    """Whether torch tensor ``t`` can be read or written through a tensor descriptor: rank 2
    to 5, unit last stride, 16-byte aligned base and positive row strides (a broadcast
    dimension's zero stride is no layout a descriptor describes), and not bool (Triton's
    descriptors have no 1-bit element type)."""
    if not 2 <= t.dim() <= TMA_MAX_RANK or t.stride(-1) != 1 or t.data_ptr() % 16 or \
            t.dtype is torch.bool:
        return False
    size = t.element_size()
    return all(s > 0 and (s * size) % 16 == 0 for s in t.stride()[:-1])
