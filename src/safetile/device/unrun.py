"""The warning for an op that is built and then dropped without being run.

A launch is lazy: ``add(x, y, z)`` only builds a ``DeviceOp``. Dropping it unrun leaves the
outputs unwritten, so, like asyncio's "coroutine was never awaited", the op warns when it is
collected (``st.UnrunOpWarning``, a ``RuntimeWarning``, shown by default) and names the line
that built it.

The building site costs one frame lookup per launch (``sys._getframe``: the code object and
the instruction offset, no line-table decoding, no stack walk), except that frames of
safetile itself are skipped, so an op built by a library function (``safetile.ops.add``)
names the caller's line. Nothing is formatted unless the op is dropped unrun.
"""
from __future__ import annotations

import os
import sys
import warnings

from ..errors import UnrunOpWarning

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

# One registry per file, as the warnings module keeps per module: the "default" action then
# shows a site's warning once, not once per op dropped in a loop.
_registries: dict = {}


def building_site(depth: int = 2) -> tuple:
    """``(code, lasti)`` of the first frame outside safetile, from ``depth`` frames up
    (``depth=2``: the caller of the function that calls this). The line number is derived
    from them only when a warning names it (``f_lineno`` would decode the line table on
    every launch)."""
    f = sys._getframe(depth)
    code = f.f_code
    while code.co_filename.startswith(PACKAGE_DIR) and f.f_back is not None:
        f = f.f_back
        code = f.f_code
    return code, f.f_lasti


def _line(code, lasti: int) -> int:
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


def warn_unrun(what: str, site) -> None:
    """Warn that ``what`` (e.g. "kernel 'add' (f.py:3)") was built at ``site`` and dropped."""
    if site is None:
        filename, lineno = "<unknown>", 0
    else:
        filename, lineno = site[0].co_filename, _line(*site)
    message = (f"{what}, built at {filename}:{lineno}, was dropped without being run: nothing "
               f"was computed and its outputs were not written (its arguments are handed "
               f"back). Run it with op.sync() or `await op`, chain it with op.then(...) or "
               f"st.zip(...), or record it into a graph")
    try:
        warnings.warn_explicit(message, UnrunOpWarning, filename, lineno,
                               registry=_registries.setdefault(filename, {}))
    except UnrunOpWarning:
        raise
    except Exception:            # interpreter shutdown: the warnings machinery may be gone
        pass
