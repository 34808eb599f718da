"""Names of the ``@st.function`` helpers in a generated module.

The emitter writes each helper instance (a helper and an argument signature, from the
per-variant type check) under a placeholder ``_stf@<n>@``; ``name_helpers`` then gives the
final names: ``_stf_<name>`` for each helper, with a numbered suffix for a second helper of
the same name or a second signature that compiles differently. Helpers therefore never
merge (two helpers made by one factory share a ``__name__``) and never meet a user's name
(names starting with ``_st_`` or ``_stf_`` are reserved).
"""
from __future__ import annotations

import re

_HELPER_DEF = re.compile(r"\n@triton\.jit\ndef (_stf@\d+@)\(.*?(?=\n@triton\.jit\n|\Z)", re.S)


def name_helpers(program, placeholders: dict, source: str) -> str:
    """``source`` with every placeholder replaced by its helper's final name (and a
    definition that compiles exactly like an earlier one of the same helper dropped)."""
    by_key = {i.key: i for i in program.helpers.values()}
    defs = {m.group(1): m.group(0) for m in _HELPER_DEF.finditer(source)}
    final, used, seen = {}, set(), {}
    for key, p in sorted(placeholders.items(), key=lambda kv: int(kv[1][5:-1])):
        fn = by_key[key].fn
        text = defs[p].replace(p, "@self@")
        same = seen.get((id(fn), text))
        if same is not None:                      # compiles identically: one definition
            final[p] = same
            source = source.replace(defs[p], "")
            continue
        base = name = f"_stf_{fn._src.tree.name}"
        k = 1
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        final[p] = seen[(id(fn), text)] = name
    return re.sub(r"_stf@\d+@", lambda m: final[m.group(0)], source)
