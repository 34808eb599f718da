"""The parameter grammar of ``@st.kernel``: ``In``, ``Out``, ``Const``, ``Ptr`` and scalars."""
from __future__ import annotations

import functools
import operator
import types
import typing
from dataclasses import dataclass
from typing import Optional

from ..dtypes import DType, dtype_members
from ..lang.views import InView, OutView, PtrView


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter. ``kind`` is one of In, Out, Const, Ptr, int, float."""

    kind: str
    dtypes: tuple = ()                 # admissible DTypes for In/Out/Ptr
    rank: Optional[int] = None         # None: any rank
    const_kinds: tuple = ()            # Const: the kinds it takes (int, float, bool, DType)

    def describe(self) -> str:
        if self.kind in ("int", "float"):
            return self.kind
        if self.kind == "Const":
            return f"st.Const[{' | '.join(getattr(k, '__name__', k) for k in self.const_kinds)}]"
        d = " | ".join(repr(x) for x in self.dtypes)
        r = f", {self.rank}" if self.rank is not None else ""
        return f"st.{self.kind}[{d}{r}]"


@dataclass(frozen=True)
class BadAnnotation:
    """A parameter annotation that broke the grammar (``st.In[int]``, ``st.Const[str]``).

    Subscripting returns it instead of raising, because an annotation is evaluated where the
    ``def`` runs, before ``@st.kernel`` sees the function: the decorator then reports
    ``message`` as a ``KernelDefinitionError`` naming the file, the line and the parameter."""

    message: str


class _TensorParam:
    kind = ""

    def __class_getitem__(cls, item) -> ParamSpec | BadAnnotation:
        args = item if isinstance(item, tuple) else (item,)
        if not 1 <= len(args) <= 2:
            return BadAnnotation(f"st.{cls.kind}[dtype] or st.{cls.kind}[dtype, rank], got "
                                 f"{item!r}")
        try:
            dtypes = dtype_members(args[0])
        except (TypeError, ValueError) as e:
            return BadAnnotation(f"st.{cls.kind}[...]: {e}")
        rank = args[1] if len(args) == 2 else None
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 1):
            return BadAnnotation(f"st.{cls.kind} rank must be a positive int, got {rank!r}")
        return ParamSpec(cls.kind, dtypes, rank)


class In(_TensorParam, InView):
    """``x: st.In[dtype]`` or ``st.In[dtype, rank]``: a shared, read-only input tensor.

    The host passes a ``Tensor`` or a ``Shared`` (``st.from_torch(t)`` wraps a torch tensor);
    it is held read-only while the op is in flight and handed back as it was. ``dtype`` may be
    a union (``st.f32 | st.bf16``, ``st.floats``): one compiled variant per dtype. In the
    body: ``x.shape[i]``, ``x.load(index, shape, padding=0)``, ``x.load_at(offset, shape)``,
    ``x.load_scalar(index)``, ``x.prefetch(index, shape)`` and ``sl.load_like(x, z)``::

        @st.kernel
        def copy(x: st.In[st.f32, 2], z: st.Out[st.f32, 2]):
            z.store(x.load(z.index, z.shape))
    """
    kind = "In"


class Out(_TensorParam, OutView):
    """``z: st.Out[dtype]`` or ``st.Out[dtype, rank]``: this program's owned tile of an output.

    The host passes a ``Partition`` (``st.empty(shape).partition(tile_shape)``; tiles need not
    divide the tensor, edge tiles are masked). All Outs of a kernel share one grid, and that
    grid is the launch grid: one program per tile. The op hands the ``Partition`` back; call
    ``.unpartition()`` for the ``Tensor``. In the body: ``z.shape`` (the tile shape),
    ``z.index``, ``z.load()``, ``z.store(tile)``, ``z.partition(sub_shape).store(tile,
    sub_index)`` and ``for t in z.tiles():``. A store converts the tile to the Out's dtype (an
    fp32 tile into a bf16 Out rounds to nearest even): write ``.astype(...)`` to show it.
    """
    kind = "Out"


class Ptr(_TensorParam, PtrView):
    """``p: st.Ptr[dtype]``: a raw pointer to a whole tensor, only in ``@st.kernel(unsafe=True)``.

    The host passes a contiguous ``Tensor``, held exclusively while in flight; the body reaches
    it with ``sl.load_ptr``, ``sl.store_ptr`` and ``sl.atomic_add`` at element offsets.
    """
    kind = "Ptr"


CONST_KINDS = (int, float, bool, DType)


class Const:
    """``n: st.Const[int]`` (or ``float``, ``bool``, ``st.dtype``): a compile-time constant.

    Each value compiles its own variant, so a ``Const`` may size tiles
    (``x.load(i, (n,))``) and pick dtypes (``t.astype(d)``). A union of those kinds
    (``st.Const[int | float]``) takes a value of any of them, and the body sees the value's
    own kind (``2`` an int, ``2.0`` a float: two variants). Runtime scalars are annotated
    plain ``int`` or ``float``.
    """

    def __class_getitem__(cls, item) -> ParamSpec | BadAnnotation:
        union = isinstance(item, types.UnionType) or typing.get_origin(item) is typing.Union
        kinds = typing.get_args(item) if union else (item,)
        bad = [k for k in kinds if k not in CONST_KINDS]
        if bad:
            names = ", ".join(getattr(k, "__name__", repr(k)) for k in bad)
            which = f" ({names} {'is' if len(bad) == 1 else 'are'} none of them)" if union else ""
            return BadAnnotation(f"st.Const takes int, float, bool or st.dtype, or a union of "
                                 f"them (st.Const[int | float]), got {item!r}{which}")
        return ParamSpec("Const", const_kinds=kinds)


SCALARS = {int: ParamSpec("int"), float: ParamSpec("float")}


def parse_annotation(annotation) -> ParamSpec:
    """Turn an evaluated annotation into a ParamSpec, or raise TypeError saying why."""
    if isinstance(annotation, ParamSpec):
        if not _from_grammar(annotation):
            raise TypeError(f"{annotation!r} was not made by st.In, st.Out, st.Const or st.Ptr; "
                            f"write the annotation with them (st.In[st.f32])")
        return annotation
    if isinstance(annotation, BadAnnotation):
        raise TypeError(annotation.message)
    if annotation in SCALARS:
        return SCALARS[annotation]
    if annotation in (In, Out, Ptr):
        raise TypeError(f"st.{annotation.kind} needs an element type: st.{annotation.kind}[st.f32]")
    raise TypeError(
        f"{annotation!r} is not a kernel parameter type; use st.In[dtype], st.Out[dtype], "
        f"st.Const[int|float|bool|st.dtype], st.Ptr[dtype] (unsafe kernels), int or float")


def _from_grammar(spec: ParamSpec) -> bool:
    """Whether ``spec`` is one the grammar makes: the grammar makes it again from its fields
    (a ParamSpec built by hand may break the grammar's rules)."""
    try:
        if spec.kind in ("int", "float"):
            remade = SCALARS[int if spec.kind == "int" else float]
        elif spec.kind == "Const":
            remade = Const[functools.reduce(operator.or_, spec.const_kinds)]
        else:
            kind = {"In": In, "Out": Out, "Ptr": Ptr}[spec.kind]
            dtypes = functools.reduce(operator.or_, spec.dtypes)
            remade = kind[dtypes] if spec.rank is None else kind[dtypes, spec.rank]
    except (KeyError, TypeError):             # a kind the grammar lacks, no dtypes or kinds
        return False
    return remade == spec
