"""The warning for an op that is built and then dropped without being run.

A launch is lazy: ``add(x, y, z)`` only builds a ``DeviceOp``. Dropping it unrun leaves the
outputs unwritten, so, like asyncio's "coroutine was never awaited", the op warns when it is
collected (``st.UnrunOpWarning``, a ``RuntimeWarning``, shown by default) and names the line
that built it.

The building line costs one frame lookup per launch (``sys._getframe``, no stack walk),
except that frames of safetile itself are skipped, so an op built by a library function
(``safetile.ops.add``) names the caller's line. No traceback is formatted unless the op is
dropped unrun.
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
    """``(filename, lineno)`` of the first frame outside safetile, from ``depth`` frames up
    (``depth=2``: the caller of the function that calls this)."""
    f = sys._getframe(depth)
    while f.f_code.co_filename.startswith(PACKAGE_DIR) and f.f_back is not None:
        f = f.f_back
    return f.f_code.co_filename, f.f_lineno


def warn_unrun(what: str, site) -> None:
    """Warn that ``what`` (e.g. "kernel 'add' (f.py:3)") was built at ``site`` and dropped."""
    filename, lineno = site if site is not None else ("<unknown>", 0)
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
