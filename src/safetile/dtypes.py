"""Element types: one object per dtype, mapping to torch and Triton."""
from __future__ import annotations

import torch

from .errors import ArgumentError


class DType:
    """A safetile element type (``st.float32`` ...)."""

    __slots__ = ("name", "torch", "triton_name", "itemsize", "is_float")

    def __init__(self, name: str, torch_dtype: torch.dtype, triton_name: str):
        set_ = object.__setattr__
        set_(self, "name", name)
        set_(self, "torch", torch_dtype)
        set_(self, "triton_name", triton_name)   # attribute of triton.language, e.g. "bfloat16"
        set_(self, "itemsize", torch.empty((), dtype=torch_dtype).element_size())
        set_(self, "is_float", torch_dtype.is_floating_point)

    def __setattr__(self, name, value):
        from .errors import FrozenError
        raise FrozenError(f"{self!r} is immutable (generated code spells it by name)")

    __delattr__ = __setattr__

    def __repr__(self) -> str:
        return f"st.{self.name}"

    def __or__(self, other) -> "DTypeSet":
        """``st.f32 | st.bf16``: several admissible types (``st.In[st.f32 | st.bf16]``)."""
        return DTypeSet(dtype_members(self) + dtype_members(other))

    def __ror__(self, other) -> "DTypeSet":
        return DTypeSet(dtype_members(other) + dtype_members(self))

    def __reduce__(self):
        return (from_name, (self.name,))


class DTypeSet:
    """Several admissible element types: ``st.In[st.f32 | st.bf16]`` specializes per dtype."""

    def __init__(self, members):
        self.members = tuple(dict.fromkeys(members))

    def __or__(self, other) -> "DTypeSet":
        return DTypeSet(self.members + dtype_members(other))

    __ror__ = __or__

    def __contains__(self, d) -> bool:
        return d in self.members

    def __repr__(self) -> str:
        return " | ".join(repr(d) for d in self.members)


def dtype_members(d) -> tuple:
    """The dtypes a DType or DTypeSet stands for."""
    if isinstance(d, DType):
        return (d,)
    if isinstance(d, DTypeSet):
        return d.members
    raise ArgumentError(f"expected a safetile dtype (st.float32, ...), got {d!r}")


float32 = DType("float32", torch.float32, "float32")
float16 = DType("float16", torch.float16, "float16")
bfloat16 = DType("bfloat16", torch.bfloat16, "bfloat16")
int32 = DType("int32", torch.int32, "int32")
int64 = DType("int64", torch.int64, "int64")
int8 = DType("int8", torch.int8, "int8")
bool_ = DType("bool_", torch.bool, "int1")

f32, f16, bf16, i32, i64 = float32, float16, bfloat16, int32, int64

ALL = (float32, float16, bfloat16, int32, int64, int8, bool_)
_BY_NAME = {d.name: d for d in ALL}
_BY_TORCH = {d.torch: d for d in ALL}


def from_name(name: str) -> DType:
    return _BY_NAME[name]


def from_torch(dtype: torch.dtype) -> DType:
    """The safetile dtype of a torch dtype; ``ArgumentError`` if safetile has none."""
    try:
        return _BY_TORCH[dtype]
    except KeyError:
        supported = ", ".join(d.name for d in ALL)
        hint = ""
        if dtype is torch.float64:
            hint = ("; convert first, e.g. t.float() or, for numpy's default float64 arrays, "
                    "a.astype(np.float32)")
        raise ArgumentError(f"torch dtype {dtype} has no safetile dtype (supported: "
                            f"{supported}){hint}") from None
