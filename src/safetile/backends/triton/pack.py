"""The argument packer: what a generated kernel takes, from one launch's checked arguments.

The code generator lays out the generated function's parameters (``Generated.layout``: per
parameter ``(what, name[, extra])``). ``plan`` turns that layout into opcodes once per
variant; ``pack`` turns bound arguments into the argument list and the *specialization
key*: exactly the facts Triton specializes a compiled kernel on (pointer 16-byte alignment;
for ints: equal to 1, divisible by 16, fits in 32 bits), so a binary is never used for
arguments it was not compiled for. Every launch, ``kernel.compile`` and the tests' Triton
interpreter runs use this one packer.
"""
from __future__ import annotations

from ...dtypes import DType

PTR, SHAPE, STRIDE, TILE, DESC, CONST, SCALAR = range(7)
_OPCODE = {"ptr": PTR, "shape": SHAPE, "stride": STRIDE, "tile": TILE, "desc": DESC,
           "const": CONST}


def plan(layout, names: list) -> tuple:
    """Opcodes ``(op, argument position, extra)`` for a generated layout; ``names``: the
    kernel's parameter names in order."""
    return tuple((_OPCODE.get(entry[0], SCALAR), names.index(entry[1]),
                  entry[2] if len(entry) > 2 else None) for entry in layout)


def int_spec(v: int) -> int:
    """What Triton specializes an int argument on (see ``native_specialize_impl``)."""
    if v == 1:
        return 1                                          # becomes a constexpr
    wide = 0 if -2**31 <= v < 2**31 else 4
    return wide + (2 if v % 16 == 0 else 3)


def tl_value(v):
    """A Const value as Triton takes it (a safetile dtype becomes ``tl.<dtype>``)."""
    if isinstance(v, DType):
        import triton.language as tl
        return getattr(tl, v.triton_name)
    return v


def pack(ops: tuple, bound) -> tuple[list, tuple]:
    """The generated kernel's arguments for ``bound`` and their specialization key."""
    args, spec = [], []
    for op, i, extra in ops:
        b = bound[i]
        if op == PTR:
            t = b.torch
            args.append(t)
            spec.append(t.data_ptr() & 15 == 0)
        elif op == SHAPE:
            v = b.torch.shape[extra]
            args.append(v)
            spec.append(int_spec(v))
        elif op == STRIDE:
            v = b.torch.stride(extra)
            args.append(v)
            spec.append(int_spec(v))
        elif op == TILE:
            args.append(b.tile[extra])
        elif op == DESC:
            from triton.tools.tensor_descriptor import TensorDescriptor
            t = b.torch
            args.append(TensorDescriptor(t, list(t.shape), list(t.stride()), list(extra)))
        elif op == CONST:
            args.append(tl_value(b.value))
        else:
            v = b.value
            args.append(v)
            if type(v) is int:
                spec.append(int_spec(v))
    return args, tuple(spec)
