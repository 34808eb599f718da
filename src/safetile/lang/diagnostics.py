"""Errors raised while a kernel body runs on the CPU executor name the user's line.

The executor runs the body as Python over torch tiles, so a mistake surfaces deep inside
safetile or torch (a broadcasting ``RuntimeError``, a tile used as a Python bool). ``locate``
rewrites such an error to start with the ``file:line`` of the innermost frame of kernel code
(the kernel or an ``@st.function`` helper), the kernel and the program, and adds what to do.
safetile's own errors keep their type (a ``RaceError`` stays one); torch's ``RuntimeError``
becomes an ``ArgumentError`` (also a ``TypeError`` and a ``ValueError``).
"""
from __future__ import annotations

import os
import re

import torch

from ..errors import ArgumentError, SafetileError

_SAFETILE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_BROADCAST = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)"
                        r"|shape mismatch|cannot be broadcast|not broadcastable")
#: What to do about tiles whose shapes do not broadcast (the type check and the executor).
BROADCAST_HINT = ("tile shapes must be equal or broadcast (size-1 axes stretch): load both "
                  "with the same shape, add an axis with t[:, None], or use sl.broadcast_to")
#: What to do about a tile used where one value is needed (an `if`, a bound, an index).
TILE_AS_VALUE_HINT = ("for an element-wise choice use sl.where(cond, a, b); to decide on the "
                      "whole tile reduce it first (sl.max(t, 0), sl.sum(t, 0))")
_TORCH_HINT = ("check the operands' shapes and dtypes (t.shape, t.dtype; t.astype(...) "
               "converts)")


_LIBRARY_DIRS = (_SAFETILE_DIR, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


def user_line(error: BaseException):
    """``(filename, lineno)`` of the innermost traceback frame outside safetile and torch."""
    found = None
    tb = error.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith(_LIBRARY_DIRS):
            found = (filename, tb.tb_lineno)
        tb = tb.tb_next
    return found


def locate(error: Exception, kernel_name: str, program: str) -> Exception:
    """The error to raise for ``error``, raised by the body of kernel ``kernel_name`` while
    running ``program`` (e.g. "program 3 (tile (0, 3))"): the same object with its message
    prefixed by the kernel line, or an ``ArgumentError`` for torch's ``RuntimeError``."""
    if getattr(error, "_st_located", False):
        return error
    site = user_line(error)
    where = f"{site[0]}:{site[1]}: " if site else ""
    named = f"kernel '{kernel_name}'" in str(error)     # RaceError & co. name it already
    prefix = where if named else f"{where}in kernel '{kernel_name}', {program}: "
    if isinstance(error, RuntimeError) and not isinstance(error, SafetileError):
        text = str(error).strip().splitlines()[0]
        hint = BROADCAST_HINT if _BROADCAST.search(text) else _TORCH_HINT
        new = ArgumentError(f"{prefix}{text}; {hint}")
        new.__cause__ = error
        new._st_located = True
        return new
    if len(error.args) == 1 and isinstance(error.args[0], str):
        error.args = (prefix + error.args[0],)
    elif hasattr(error, "add_note"):
        error.add_note(prefix.rstrip(": ") or f"in kernel '{kernel_name}'")
    try:
        error._st_located = True
    except AttributeError:
        pass
    return error
