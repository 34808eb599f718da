"""Rules of a kernel's or helper's ``def`` line and names (``KernelDefinitionError``).

- names generated code gives a meaning of its own cannot be bound by kernel code: ``tl``,
  ``triton``, ``libdevice``, ``float``, ``range``, and anything starting with ``_st_`` or
  ``_stf_`` (every name generated code makes has one of these prefixes), so no user name
  shadows them (``_start`` or ``_state`` stay free);
- parameters are plain positional ones without defaults (the launch passes every argument);
- a helper returns once, in its last statement (Triton cannot return from inside a branch of
  a runtime ``if`` or a loop).
"""
from __future__ import annotations

import ast

RESERVED_NAMES = frozenset({"tl", "triton", "libdevice", "float", "range"})
RESERVED_PREFIXES = ("_st_", "_stf_")


def reserved(name: str) -> bool:
    """Whether ``name`` may not be bound in kernel code."""
    return name.startswith(RESERVED_PREFIXES) or name in RESERVED_NAMES


def reserved_message(name: str) -> str:
    return (f"'{name}' is reserved for generated code (names starting with '_st_' or '_stf_', "
            f"and {sorted(RESERVED_NAMES)}); choose another name")


def check_signature(src, is_function: bool) -> None:
    """Check the ``def`` of ``src`` (a ``KernelSource``)."""
    tree = src.tree
    if reserved(tree.name):
        raise src.error(tree, "name", reserved_message(tree.name))
    for arg in tree.args.args:
        if reserved(arg.arg):
            raise src.error(arg, "name", reserved_message(arg.arg))
    if tree.args.vararg or tree.args.kwarg or tree.args.kwonlyargs or tree.args.posonlyargs:
        raise src.error(tree, "statement", "kernels take plain positional parameters only")
    if tree.args.defaults:
        raise src.error(tree.args.defaults[0], "statement",
                        "parameters take no default values: pass every argument (a helper's "
                        "constant can be a module constant or a Const of the kernel)")
    if is_function:
        last = tree.body[-1] if tree.body else None
        for r in ast.walk(tree):
            if isinstance(r, ast.Return) and r is not last:
                raise src.error(r, "statement", "a helper returns once, in its last statement "
                                                "(no `return` inside `if` or loops)")
