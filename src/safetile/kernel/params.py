"""The parameter grammar of ``@st.kernel``: ``In``, ``Out``, ``Const``, ``Ptr`` and scalars."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..dtypes import DType, dtype_members


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter. ``kind`` is one of In, Out, Const, Ptr, int, float."""

    kind: str
    dtypes: tuple = ()                 # admissible DTypes for In/Out/Ptr
    rank: Optional[int] = None         # None: any rank
    const_type: Any = None             # int | float | bool | DType for Const

    def describe(self) -> str:
        if self.kind in ("int", "float"):
            return self.kind
        if self.kind == "Const":
            return f"st.Const[{getattr(self.const_type, '__name__', self.const_type)}]"
        d = " | ".join(repr(x) for x in self.dtypes)
        r = f", {self.rank}" if self.rank is not None else ""
        return f"st.{self.kind}[{d}{r}]"


class _TensorParam:
    kind = ""

    def __class_getitem__(cls, item) -> ParamSpec:
        args = item if isinstance(item, tuple) else (item,)
        if not 1 <= len(args) <= 2:
            raise TypeError(f"st.{cls.kind}[dtype] or st.{cls.kind}[dtype, rank], got {item!r}")
        dtypes = dtype_members(args[0])
        rank = args[1] if len(args) == 2 else None
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 1):
            raise TypeError(f"st.{cls.kind} rank must be a positive int, got {rank!r}")
        return ParamSpec(cls.kind, dtypes, rank)


class In(_TensorParam):
    """A shared, read-only tensor: the host passes a ``Tensor`` or a ``Shared``."""
    kind = "In"


class Out(_TensorParam):
    """This program's owned tile of a ``Partition``; all Outs share one grid."""
    kind = "Out"


class Ptr(_TensorParam):
    """A raw pointer to a whole tensor, held exclusively; only in ``unsafe=True`` kernels."""
    kind = "Ptr"


class Const:
    """A compile-time constant: ``st.Const[int]``, ``[float]``, ``[bool]`` or ``[st.dtype]``."""

    def __class_getitem__(cls, item) -> ParamSpec:
        if item not in (int, float, bool, DType):
            raise TypeError(f"st.Const takes int, float, bool or st.dtype, got {item!r}")
        return ParamSpec("Const", const_type=item)


SCALARS = {int: ParamSpec("int"), float: ParamSpec("float")}


def parse_annotation(annotation) -> ParamSpec:
    """Turn an evaluated annotation into a ParamSpec, or raise TypeError saying why."""
    if isinstance(annotation, ParamSpec):
        return annotation
    if annotation in SCALARS:
        return SCALARS[annotation]
    if annotation in (In, Out, Ptr):
        raise TypeError(f"st.{annotation.kind} needs an element type: st.{annotation.kind}[st.f32]")
    raise TypeError(
        f"{annotation!r} is not a kernel parameter type; use st.In[dtype], st.Out[dtype], "
        f"st.Const[int|float|bool|st.dtype], st.Ptr[dtype] (unsafe kernels), int or float")
