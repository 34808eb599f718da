"""How to name a wrong argument in an error, and what to do instead.

torch and safetile both have a class called ``Tensor``: messages name every value with its
module (``torch.Tensor``, ``st.Tensor``), so "expects a Tensor, got Tensor" cannot happen.
"""
from __future__ import annotations

from .partition import Partition
from .shared import Shared
from .tensor import Tensor

_OURS = {Tensor: "st.Tensor", Shared: "st.Shared", Partition: "st.Partition"}


def type_name(v) -> str:
    """``v``'s type as a user writes it: ``torch.Tensor``, ``numpy.ndarray``, ``st.Shared``."""
    t = type(v)
    if t in _OURS:
        return _OURS[t]
    module = t.__module__.split(".")[0]
    if module == "builtins":
        return t.__qualname__
    return f"{module}.{t.__qualname__}"


def a_type_name(v) -> str:
    """``type_name(v)`` with its article: "a torch.Tensor", "an st.Tensor", "an int"."""
    name = type_name(v)
    return f"{'an' if name.startswith('st.') or name[0] in 'aeiouAEIOU' else 'a'} {name}"


def _is_torch(v) -> bool:
    return type(v).__module__.split(".")[0] == "torch" and hasattr(v, "dim")


def _is_numpy(v) -> bool:
    return type(v).__module__.split(".")[0] == "numpy" and hasattr(v, "ndim")


def how_to_pass(v, want: str) -> str:
    """What to do with ``v`` so it can be passed where ``want`` is expected: ``"input"`` (a
    Tensor or Shared), ``"output"`` (a Partition, a kernel's Out) or ``"tensor"`` (a Tensor:
    a library op's ``out=``, a raw pointer). Empty when there is nothing to suggest."""
    then = ".partition(tile_shape)" if want == "output" else ""
    if _is_torch(v):
        return (f"wrap it with st.from_torch(t){then} (safetile then owns t's storage; "
                f"st.from_torch(t.clone()) leaves t to you)")
    if _is_numpy(v):
        return f"copy it in with st.from_numpy(a){then}"
    if isinstance(v, (list, tuple)) and not any(isinstance(e, Tensor) for e in v):
        # Host data enters a launch only as a Tensor the caller holds, to get it back from.
        return (f"build a tensor from it first, e.g. st.from_torch(torch.tensor(values, "
                f"dtype=torch.float32)){then}")
    if want == "output" and isinstance(v, Tensor):
        return "partition it first: tensor.partition(tile_shape)"
    if want == "output" and isinstance(v, Shared):
        return ("a Shared value is read-only; take it back with .try_partition(tile_shape) "
                "once no other handle holds it")
    if want != "output" and isinstance(v, Partition):
        return "call .unpartition() first to get the Tensor back"
    if want == "tensor" and isinstance(v, Shared):
        return "a Shared value is read-only; take it back with .try_unwrap()"
    return ""


def how_to_pass_number(v, want: str) -> str:
    """What to pass instead of ``v`` for an ``int`` or ``float`` (``want``) parameter, or ""."""
    if (_is_torch(v) or _is_numpy(v)) and v.ndim == 0:
        return "pass the Python number it holds: t.item()"
    if _is_torch(v) or _is_numpy(v) or isinstance(v, (Tensor, Shared)):
        return ("a scalar parameter takes a host number; to read a tensor's values in the "
                "kernel, declare this parameter st.In[dtype] instead")
    if want == "int" and isinstance(v, float) and v.is_integer():
        return f"pass the int {int(v)}"
    return ""
