"""``LaunchCache``: everything one kernel remembers between launches, in one declared place.

* ``variants``: ``VariantKey -> Variant`` (generated source, Triton function, binaries); the
  key holds the launch options, so a kernel and its ``options()`` copies share this dict;
* ``by_facts``: the same variants found by cheap facts of the arguments (``facts``), which
  with the kernel's options determine the ``VariantKey``: a launch builds a key only once
  per new kind of arguments;
* ``plans``: ``LaunchPlan``s (``kernel/plan.py``) by the identity of the first tensor
  argument, emptied when they pass ``PLAN_CACHE``;
* ``programs``: the typed bodies (``kernel/types.py``) by what typing depends on, which the
  options are not (shared like ``variants``);
* ``typed``: the kinds of arguments the kernel's types were checked for;
* ``holder`` and ``moved_into``: the texts a launch's borrows and moves name.

* ``copies``: the kernel's ``options()`` copies by their options, so that an op configuring
  its kernel on every call launches one copy with warm caches (shared, like ``variants``).

Everything but ``variants``, ``programs`` and ``copies`` belongs to one set of options:
``Kernel.options`` makes a new cache sharing only those three.
"""
from __future__ import annotations

import math

from ..backends.triton.compile import Variant
from ..backends.triton.spec import ArgSpec, VariantKey, tma_ok
from ..dtypes import from_torch
from . import types as _types

#: Plans cached per kernel (and options) before the cache is emptied.
PLAN_CACHE = 1024
#: ``options()`` copies kept per kernel before they are forgotten.
COPY_CACHE = 256


def canonical_const(v):
    """A Const value as variants are keyed on it: every NaN is one key (NaN != NaN would
    make a new variant per launch), and -0.0 is 0.0 (a compile-time zero is +0.0 in kernel
    code, lang/semantics.py)."""
    if type(v) is float:
        if v != v:
            return math.nan
        if v == 0.0:
            return 0.0
    return v


def const_fact(v) -> tuple:
    """A Const value as the caches key it: with its type, since ``1``, ``1.0`` and ``True``
    are equal (and hash alike) but are three variants of an ``st.Const[int | float | bool]``."""
    return type(v), canonical_const(v)


def variant_key(kernel, bound) -> VariantKey:
    """Everything the generated source of ``kernel`` depends on, for these arguments.
    ``facts`` must determine it (with the options): a fact added here is added there."""
    specs = []
    for b in bound:
        kind = b.spec.kind
        if kind in ("In", "Out", "Ptr"):
            dtype, rank = from_torch(b.torch.dtype), b.torch.dim()
            if kind == "Out":
                o = b.order
                # A group of at least grid[0] tile-rows is one group: the map is the same, and
                # group_size * grid[1] then stays within the tile count (no int32 wrap).
                specs.append(ArgSpec(b.name, kind, dtype, rank, tile=b.tile, order=o.kind,
                                     group_size=min(o.group_size, o.grid[0])
                                     if o.kind == "grouped" else 0,
                                     persistent=o.persistent is not None, tma=tma_ok(b.torch)))
            else:
                specs.append(ArgSpec(b.name, kind, dtype, rank, tma=kind == "In" and tma_ok(b.torch)))
        elif kind == "Const":
            specs.append(ArgSpec(b.name, kind, value=canonical_const(b.value),
                                 value_type=type(b.value)))
        else:
            specs.append(ArgSpec(b.name, kind))
    o = kernel.opts
    return VariantKey(tuple(specs), o.get("tma", True), o.get("num_warps"), o.get("num_stages"),
                      bool(o.get("flatten", False)), bool(o.get("warp_specialize", False)),
                      o.get("loop_stages"), bool(o.get("tma_store", False)),
                      bool(o.get("pdl", False)), o.get("early", ()),
                      bool(o.get("trigger_early", False)))


def facts(bound) -> tuple:
    """Cheap facts of the arguments that determine ``variant_key`` (the options aside)."""
    key = []
    for b in bound:
        t = b.torch
        if t is None:
            key.append(const_fact(b.value) if b.spec.kind == "Const" else None)
        elif b.tile is not None:                          # Out (TMA store fitness too)
            key.append((t.dtype, t.dim(), b.tile, b.order, t.dim() >= 2 and tma_ok(t)))
        elif b.spec.kind == "In" and t.dim() >= 2:        # TMA fitness depends on layout
            key.append((t.dtype, t.dim(), tma_ok(t)))
        else:
            key.append((t.dtype, t.dim()))
    return tuple(key)


def _type_facts(bound) -> tuple:
    """What the kernel's types depend on: dtype, rank, tile, persistence, Const values."""
    return tuple((b.torch.dtype, b.torch.dim(), b.tile,
                  b.order.persistent is not None if b.order is not None else None)
                 if b.torch is not None else
                 (const_fact(b.value) if b.spec.kind == "Const" else None)
                 for b in bound)


_PLAIN = frozenset({int, bool, float, str, type(None)})


def _plain_key(opts: dict):
    """``opts`` as a sorted tuple of ``(name, type, value)``, or None unless every name is a
    str and every value a plain scalar or a tuple of them. A tuple's items are keyed with
    their types too: ``(True,) == (1,) == (1.0,)``, but only ``(1,)`` is a valid grid."""
    for k, v in opts.items():
        t = type(v)
        if type(k) is not str or (t not in _PLAIN and not (
                t is tuple and all(type(x) in _PLAIN for x in v))):
            return None
    return tuple(sorted((k, type(v), tuple((type(x), x) for x in v) if type(v) is tuple else v)
                        for k, v in opts.items()))


class LaunchCache:
    """The launch caches of one kernel with one set of options (see the module docstring)."""

    __slots__ = ("variants", "programs", "copies", "by_facts", "plans", "plan_at", "typed",
                 "holder", "moved_into")

    def __init__(self, kernel, variants: dict | None = None, programs: dict | None = None,
                 copies: dict | None = None):
        self.variants: dict = {} if variants is None else variants
        self.programs: dict = {} if programs is None else programs
        self.copies: dict = {} if copies is None else copies
        self.by_facts: dict = {}
        self.plans: dict = {}
        self.plan_at: int | None = None      # the position of the tensor plans are keyed by
        self.typed: set = set()
        self.holder = f"kernel '{kernel.name}'"
        self.moved_into = {n: f"kernel '{kernel.name}' ({kernel.where}) as argument '{n}'"
                           for n in kernel.params}

    def for_options(self, kernel) -> "LaunchCache":
        """A fresh cache for ``kernel``, an ``options()`` copy, sharing the variants, the typed
        bodies and the copies."""
        return LaunchCache(kernel, self.variants, self.programs, self.copies)

    def copy(self, opts: dict, make, normalize):
        """The ``options()`` copy with options ``opts``: ``make(plain)`` builds it on first
        use from ``plain = normalize(opts)``. Only plain values key the cache (a subclass's
        ``==`` and ``hash`` could make two sets of options one key), each with its type, so
        ``num_warps=4.0`` is never ``num_warps=4``'s copy; other options are keyed by their
        normalized form."""
        key = _plain_key(opts)
        if key is None:
            opts = normalize(opts)
            key = _plain_key(opts)
            if key is None:                       # a grid of other objects: refused at launch
                return make(opts)
        k = self.copies.get(key)
        if k is None:
            if len(self.copies) >= COPY_CACHE:
                self.copies.clear()
            k = self.copies[key] = make(normalize(opts))
        return k

    def variant(self, kernel, bound) -> Variant:
        """The ``Variant`` of ``kernel`` for these bound arguments (made on first use)."""
        f = facts(bound)
        v = self.by_facts.get(f)
        if v is None:
            key = variant_key(kernel, bound)
            v = self.variants.get(key)
            if v is None:
                v = self.variants[key] = Variant(kernel, key,
                                                 _types.check(kernel, key, self.programs))
            self.by_facts[f] = v
        return v

    def type_check(self, kernel, bound) -> None:
        """Refuse the launch if the kernel does not type for these arguments: checked once
        per kind of arguments, a set lookup afterwards."""
        f = _type_facts(bound)
        if f not in self.typed:
            _types.check(kernel, variant_key(kernel, bound), self.programs)
            self.typed.add(f)

    def plan(self, args: tuple, choice):
        """The cached plan that applies to ``args`` under backend ``choice``, or None."""
        at = self.plan_at
        if at is None or at >= len(args):
            return None
        plan = self.plans.get(id(args[at]))
        if plan is None or (plan.choice is not choice and plan.choice != choice):
            return None
        return plan if plan.matches(args) else None

    def remember(self, args: tuple, plan) -> None:
        """Cache ``plan`` for launches with these very arguments."""
        if not plan.tensors:
            return
        if self.plan_at is None:
            self.plan_at = plan.tensors[0][0]
        if len(self.plans) >= PLAN_CACHE:
            self.plans.clear()
        self.plans[id(args[self.plan_at])] = plan
