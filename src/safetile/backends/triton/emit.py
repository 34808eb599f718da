"""Kernel AST -> Triton source, with the token ordering of owned tiles.

Tokens: each ``Out`` has an ordering chain. A load of an owned tile after a store to it, and a
store after any earlier access of it, get a CTA barrier (``tl.debug_barrier()``) in between,
because different threads hold different elements of a tile. Reads of ``In`` views carry no
token and no barrier. Across control flow the analysis is conservative: a loop body starts from
the join of the state before the loop and at the end of its body; an ``if`` joins its branches.
Each tile of ``for t in z.tiles()`` starts a fresh chain, since distinct tiles are disjoint; a
barrier before such a loop orders what came before it (a program visits its tiles again when
the loop runs again).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from ...lang.views import IN_METHODS
from .constants import stored_as
from .expressions import BINOP_SPELLING
from .helper_names import name_helpers
from .prelude import HEADER
from .spec import VariantKey
from .views import ViewEmitter


@dataclass
class Generated:
    """A generated module: its source and how to lay out launch arguments."""

    source: str
    entry: str
    layout: list                 # ("ptr"|"shape"|"stride"|"const"|"scalar"|"tile"|"desc", ...)


def _join(a: dict, b: dict) -> dict:
    keys = set(a) | set(b)
    return {k: a.get(k, frozenset()) | b.get(k, frozenset()) for k in keys}


def helper_touches_memory(helper, seen=None) -> bool:
    """Whether an ``@st.function`` helper may read or write memory: views cannot be passed
    to helpers, so only through the pointer builtins, in its body or in a helper it calls."""
    seen = seen if seen is not None else set()
    if id(helper) in seen:
        return False
    seen.add(id(helper))
    scope = helper._info.scope
    for n in ast.walk(helper._src.tree):
        if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute)):
            r = scope.resolve(n.func)
            if r is None:
                continue
            if r.kind == "builtin" and (r.value.unsafe or r.value.name == "load_ptr"):
                return True
            if r.kind == "function" and helper_touches_memory(r.value, seen):
                return True
    return False


class Emitter(ViewEmitter):
    """Translates one kernel (and the @st.function helpers it calls) for one variant."""

    def __init__(self, kernel, key: VariantKey, program):
        self.kernel = kernel
        self.src = kernel._src
        self.info = kernel._info
        self.scope = kernel._info.scope
        self.key = key
        self.specs = {a.name: a for a in key.args}
        self.outs = [a for a in key.args if a.kind == "Out"]
        self.lead = self.outs[0] if self.outs else None
        self.persistent = bool(self.lead and self.lead.persistent)
        self.helpers: dict[str, str] = {}
        self.descs: dict[tuple, str] = {}      # (param, block) -> descriptor arg name
        self.subs: dict[str, tuple] = {}       # sub view name -> (out, shape exprs)
        self.tmp = 0
        self.accesses: list = []               # (out name, "load"|"store") in the statement
        self.in_tile_loop = False
        self.shape_reads: set = set()           # (In, dim) whose length the body reads
        self.tma_outs = self.tma_store_outs()
        self.program = program                 # the variant's types (kernel/types.py)
        self.typed = self.program.kernel
        self.placeholders: dict = {}           # helper instance key -> placeholder name

    def block(self, body, state, indent) -> tuple[list, dict]:
        lines = []
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue
            out, state = self.stmt(stmt, state, indent)
            lines += out
        return lines or [indent + "pass"], state

    def barrier_check(self, state, accesses):
        """Which accesses of this statement need a barrier before them, and the owned-tile
        accesses not yet ordered by a barrier after it (``state``: those before it). A
        barrier orders every access before it, so after one only this statement's count."""
        need = []
        seen = {k: set(v) for k, v in state.items()}
        for out, kind in accesses:
            prev = seen.setdefault(out, set())
            need.append("store" in prev or (kind == "store" and bool(prev)))
            prev.add(kind)
        if any(need):
            seen = {}
            for out, kind in accesses:
                seen.setdefault(out, set()).add(kind)
        return need, {k: frozenset(v) for k, v in seen.items()}

    def stmt(self, node, state, ind) -> tuple[list, dict]:
        self.accesses = []
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "store" and \
                self.view_kind(node.value.func.value) in ("Out", "tile", "sub"):
            return self.store_stmt(node.value, state, ind)
        if isinstance(node, ast.Assign):
            if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and \
                    node.targets[0].id in self.info.views:
                call = node.value
                out = self.specs[self.out_name(call.func.value)]
                self.subs[node.targets[0].id] = (out.name, self.parts(call.args[0], len(out.tile)))
                return [], state
            if self.compile_time_binding(node):
                return [], state
            targets = " = ".join(self.target(t) for t in node.targets)
            if self.constexpr_alias(node):
                targets += ": tl.constexpr"
            text = f"{ind}{targets} = {self.expr(node.value)}"
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and self.compile_time_binding(node):
            return [], state
        elif isinstance(node, ast.AugAssign):
            op = self.binop(node, BINOP_SPELLING[type(node.op)], node.target, node.value)
            text = f"{ind}{self.target(node.target)} = {op}"
        elif isinstance(node, ast.AnnAssign):
            text = f"{ind}{self.target(node.target)} = {self.expr(node.value)}"
        elif isinstance(node, ast.Expr):
            text = f"{ind}{self.expr(node.value)}"
        elif isinstance(node, ast.Pass):
            return [f"{ind}pass"], state
        elif isinstance(node, ast.Return):
            return [f"{ind}return {self.expr(node.value) if node.value else ''}"], state
        elif isinstance(node, ast.If):
            return self.if_stmt(node, state, ind)
        elif isinstance(node, ast.For):
            return self.for_stmt(node, state, ind)
        else:
            raise self.fail(node, f"`{type(node).__name__}` cannot be compiled")
        need, state = self.barrier_check(state, self.accesses)
        pre = [f"{ind}tl.debug_barrier()  # token: read of an owned tile after a store"] if any(need) else []
        return pre + [text], state

    def target(self, node) -> str:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Tuple):            # one level of plain names (kernel/types.py)
            return ", ".join(e.id for e in node.elts) + ("," if len(node.elts) == 1 else "")
        raise self.fail(node, f"cannot assign to `{ast.unparse(node)}`")

    def store_stmt(self, call, state, ind):
        f = call.func
        kind = self.view_kind(f.value)
        out = self.specs[self.out_name(f.value)]
        r = len(out.tile)
        value = stored_as(self.expr(call.args[0]), self.tp(call.args[0]), out.dtype)
        value_accesses = list(self.accesses)
        need, state = self.barrier_check(state, value_accesses + [(out.name, "store")])
        lines = []
        if any(need[:-1]):
            lines.append(f"{ind}tl.debug_barrier()  # token: read of an owned tile after a store")
        if need[-1]:
            tmp = self.new_tmp()
            lines.append(f"{ind}{tmp} = {value}")
            lines.append(f"{ind}tl.debug_barrier()  # token: store after an access of the owned tile")
            value = tmp
        if kind == "sub":
            helper = self.use(f"_st_substore{r}")
            sub = f.value if isinstance(f.value, ast.Call) else f.value.id
            lines.append(f"{ind}{helper}({self.sub_args(sub, out, r, call.args[1])}, {value})")
        elif out.name in self.tma_outs:
            d = self.descs.setdefault((out.name, tuple(out.tile)), f"_st_{out.name}_d{len(self.descs)}")
            helper = self.use(f"_st_dstore{r}")
            lines.append(f"{ind}{helper}({d}, {', '.join(self.idx(k) for k in range(r))}, "
                         f"{', '.join(f'_st_{out.name}_t{k}' for k in range(r))}, {value})")
        else:
            helper = self.use(f"_st_store{r}")
            lines.append(f"{ind}{helper}({self.tensor_args(out.name, r)}, "
                         f"{', '.join(self.idx(k) for k in range(r))}, "
                         f"{', '.join(f'_st_{out.name}_t{k}' for k in range(r))}, {value})")
        return lines, state

    def if_stmt(self, node, state, ind):
        taken = self.compile_time_condition(node.test)
        if taken is not None:
            # A compile-time condition (a literal, Const or closure constant, or arithmetic and
            # comparisons of them): only the taken branch is emitted, so the other branch's
            # loads make no descriptors or helpers (and, as for the type check, it does not
            # exist: it is never typed).
            branch = node.body if taken else node.orelse
            return self.block(branch, state, ind) if branch else ([], state)
        self.accesses = []
        test = self.expr(node.test)
        need, state = self.barrier_check(state, self.accesses)
        lines = [f"{ind}tl.debug_barrier()  # token: read of an owned tile after a store"] if any(need) else []
        body, s1 = self.block(node.body, state, ind + "    ")
        lines += [f"{ind}if {test}:"] + body
        s2 = state
        if node.orelse:
            orelse, s2 = self.block(node.orelse, state, ind + "    ")
            lines += [f"{ind}else:"] + orelse
        return lines, _join(s1, s2)

    def for_stmt(self, node, state, ind):
        it = node.iter
        if isinstance(it.func, ast.Attribute) and it.func.attr == "tiles":
            return self.tiles_loop(node, state, ind)
        self.accesses = []
        args = ", ".join(self.expr(a) for a in it.args)           # evaluated once, before the loop
        need, state = self.barrier_check(state, self.accesses)
        pre = [f"{ind}tl.debug_barrier()  # token: read of an owned tile after a store"] \
            if any(need) else []
        if not pre and any("store" in v for v in state.values()) and \
                not self.stores_owned(node.body):
            # A body that stores no owned tile: one barrier before the loop orders the
            # stores before it, instead of one in every iteration.
            pre = [f"{ind}tl.debug_barrier()  # token: reads of owned tiles after a store"]
            state = self.barrier_check({}, self.accesses)[1]     # the range's own, after it
        _, end = self.block(node.body, state, ind + "    ")        # first pass: loop-carried state
        entry = _join(state, end)
        body, end = self.block(node.body, entry, ind + "    ")
        innermost = not any(isinstance(n, ast.For) for s in node.body for n in ast.walk(s))
        # A hand-written persistent loop, `range(sl.bid(0), n, sl.num_blocks(0))`, in a kernel
        # with no Out (an unsafe twin walking its tiles itself) takes the same
        # scheduling hints as a `tiles()` loop, so the twin is scheduled like the safe kernel.
        hints = ""
        if self.lead is None and len(it.args) == 3:
            start, _, step = (self.expr(a) for a in it.args)
            if start == "tl.program_id(0)" and step == "tl.num_programs(0)":
                hints = "".join(f", {h}=True" for h in ("flatten", "warp_specialize")
                                if getattr(self.key, h))
        if hints:
            loop = f"tl.range({args}{hints})"
        elif self.key.loop_stages and innermost and self.touches_memory(node):
            # (a loop of prefetches or arithmetic has no loads to pipeline)
            loop = f"tl.range({args}, num_stages={int(self.key.loop_stages)})"
        else:
            loop = f"range({args})"
        return pre + [f"{ind}for {node.target.id} in {loop}:"] + body, _join(state, end)

    def stores_owned(self, stmts) -> bool:
        """Whether ``stmts`` store to an owned tile (views cannot be passed to helpers, so
        every such store is a ``.store`` call on an Out, its tile or a sub-partition)."""
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
                   n.func.attr == "store" and
                   self.view_kind(n.func.value) in ("Out", "tile", "sub")
                   for s_ in stmts for n in ast.walk(s_))

    def tiles_loop(self, node, state, ind):
        if not self.persistent:
            body, end = self.block(node.body, state, ind)
            return body, end
        if self.in_tile_loop:
            raise self.fail(node, "`tiles()` loops cannot nest")
        # A program visits each of its tiles once per loop, but it comes back to them when the
        # loop runs again (inside a range loop, or a second tiles() loop): one barrier before
        # the loop orders the accesses before it, and each visit then starts a fresh chain.
        pre = [f"{ind}tl.debug_barrier()  # token: tiles visited again after earlier accesses"] \
            if any(state.values()) else []
        self.in_tile_loop = True
        coords = self.coords("_st_t", ind + "    ")
        body, end = self.block(node.body, {}, ind + "    ")
        self.in_tile_loop = False
        hints = "".join(f", {h}=True" for h in ("flatten", "warp_specialize") if getattr(self.key, h))
        loop = f"tl.range(tl.program_id(0), _st_ntiles, tl.num_programs(0){hints})" if hints else \
            "range(tl.program_id(0), _st_ntiles, tl.num_programs(0))"
        head = f"{ind}for _st_t in {loop}:"
        return pre + [head] + coords + body, _join({} if pre else state, end)

    def early_access(self, call) -> bool:
        """Whether ``call`` may run before the programmatic-launch wait: an L2 prefetch of an
        In view (it delivers no value), or a load of an In named in the ``early`` option (the
        launcher drops programmatic launch whenever the previous launch of the execution may
        write one of those, so nothing running concurrently writes what they read)."""
        f = call.func
        if not (isinstance(f, ast.Attribute) and self.view_kind(f.value) == "In"):
            return False
        if f.attr == "prefetch":
            return True
        return f.attr in IN_METHODS and isinstance(f.value, ast.Name) and \
            f.value.id in self.key.early

    def touches_memory(self, stmt) -> bool:
        """Whether a statement may read or write memory other than through an early access
        (``early_access``): any other view method call (loads, stores, sub-partitions,
        ``tiles()``), ``load_like``, the pointer operations, and calls of ``@st.function``
        helpers that use them. Shapes, tile indices, program ids and tile arithmetic touch
        only registers."""
        for n in ast.walk(stmt):
            if not isinstance(n, ast.Call):
                continue
            f = n.func
            if isinstance(f, ast.Attribute) and self.view_kind(f.value) is not None:
                if not self.early_access(n):
                    return True
                continue
            r = self.scope.resolve(f) if isinstance(f, (ast.Name, ast.Attribute)) else None
            if r is None:
                continue
            if r.kind == "load_like" or (r.kind == "function" and helper_touches_memory(r.value)):
                return True
            if r.kind == "builtin" and (r.value.unsafe or r.value.name == "load_ptr"):
                return True
        return False

    def generate(self) -> Generated:
        ind = "    "
        stmts = self.src.tree.body
        pre, rest = [], list(stmts)
        if self.key.pdl:
            # The leading statements whose only memory accesses are early ones run before
            # the wait: a prefetch only warms L2 (it delivers no value, so it cannot observe
            # what the previous grid writes), loads of `early` Ins read nothing that grid
            # writes (the launcher's check), and index arithmetic reads nothing.
            k = 0
            while k < len(stmts) and not self.touches_memory(stmts[k]):
                k += 1
            if any(isinstance(n, ast.Call) and self.early_access(n)
                   for s_ in stmts[:k] for n in ast.walk(s_)):
                pre, rest = stmts[:k], stmts[k:]
        head, state = self.block(pre, {}, ind) if pre else ([], {})
        body, _ = self.block(rest, state, ind)
        body = head + body
        # Triton passes an int argument equal to 1 as a Python constant, where arithmetic no
        # longer wraps or rounds as int32 does: `int` parameters and the In lengths the body
        # reads are bound once to int32 values (folded away when the argument is not 1).
        prologue = [f"{ind}{a.name} = {a.name} + tl.zeros((), tl.int32)"
                    for a in self.key.args if a.kind == "int"]
        prologue += [f"{ind}_st_{n}_len{k} = _st_{n}_n{k} + tl.zeros((), tl.int32)"
                     for n, k in sorted(self.shape_reads)]
        if self.key.pdl:
            # Programmatic dependent launch: this grid may start while the previous one runs.
            # The wait comes before every load and store but the early accesses (index
            # arithmetic, L2 prefetches and loads of `early` Ins precede it), so no access of
            # this program can see (or overwrite) memory that grid still writes; then the next
            # PDL grid may be scheduled (it waits the same way, so when it starts, every grid
            # before this one has completed). With `trigger_early` the signal comes first
            # instead: the next grid's early loads overlap this whole grid (the launcher
            # checks them against every grid that may still run), its stores still wait.
            signal = f"{ind}_st_gdc_launch_dependents()"
            wait = [f"{ind}_st_gdc_wait()"] + ([] if self.key.trigger_early else [signal])
            if self.key.trigger_early:
                prologue.append(signal)
            if head:
                body = head + wait + body[len(head):]
            else:
                prologue += wait
        if self.lead is not None:
            r = len(self.lead.tile)
            for k in range(r):
                prologue.append(f"{ind}_st_g{k} = tl.cdiv(_st_{self.lead.name}_n{k}, _st_{self.lead.name}_t{k})")
            if self.persistent:
                prologue.append(f"{ind}_st_ntiles = " + " * ".join(f"_st_g{k}" for k in range(r)))
            else:
                prologue += self.coords("tl.program_id(0)", ind)
        params, layout = [], []
        for a in self.key.args:
            if a.kind in ("In", "Out"):
                r = a.rank
                params.append(f"_st_{a.name}_ptr")
                layout.append(("ptr", a.name))
                for k in range(r):
                    params.append(f"_st_{a.name}_n{k}")
                    layout.append(("shape", a.name, k))
                for k in range(r):
                    params.append(f"_st_{a.name}_s{k}")
                    layout.append(("stride", a.name, k))
                if a.kind == "Out":
                    for k in range(r):
                        params.append(f"_st_{a.name}_t{k}: tl.constexpr")
                        layout.append(("tile", a.name, k))
                for (pname, blk), dname in self.descs.items():
                    if pname == a.name:
                        params.append(dname)
                        layout.append(("desc", a.name, blk))
            elif a.kind == "Ptr":
                params.append(f"_st_{a.name}_ptr")
                layout.append(("ptr", a.name))
            elif a.kind == "Const":
                params.append(f"{a.name}: tl.constexpr")
                layout.append(("const", a.name))
            else:
                params.append(a.name)
                layout.append(("scalar", a.name))
        entry = self.src.tree.name             # the checked def's name, an identifier
        funcs = self.function_sources()
        text = [HEADER]
        if self.key.pdl:
            text.append("from triton.language.extra.cuda import gdc_wait as _st_gdc_wait, "
                        "gdc_launch_dependents as _st_gdc_launch_dependents\n")
        text += list(self.helpers.values())
        text += funcs
        text.append(f"\n@triton.jit\ndef {entry}({', '.join(params)}):")
        text += prologue + body
        source = name_helpers(self.program, self.placeholders, "\n".join(text) + "\n")
        return Generated(source, entry, layout)

    def helper_name(self, call) -> str:
        """The (placeholder) name of the helper instance ``call`` calls; ``name_helpers``
        gives the final names once every instance is emitted."""
        inst = self.typed.calls[id(call)]
        p = self.placeholders.get(inst.key)
        if p is None:
            p = self.placeholders[inst.key] = f"_stf@{len(self.placeholders)}@"
        return p

    def function_sources(self) -> list[str]:
        """One Triton function per helper instance (a helper and an argument signature)."""
        out, done = [], set()
        while True:
            todo = [i for i in self.program.helpers.values()
                    if i.key in self.placeholders and i.key not in done]
            if not todo:
                return out
            for inst in todo:
                done.add(inst.key)
                out.append(FunctionEmitter(inst, self).generate(self.placeholders[inst.key]))

class FunctionEmitter(Emitter):
    """Translates an @st.function helper for one argument signature: tiles and scalars only,
    no views."""

    def __init__(self, inst, parent: Emitter):
        fn = inst.fn
        self.kernel = parent.kernel
        self.src, self.info, self.scope = fn._src, fn._info, fn._info.scope
        self.key, self.specs, self.outs, self.lead, self.persistent = parent.key, {}, [], None, False
        self.helpers, self.descs, self.subs = parent.helpers, {}, {}
        self.tmp, self.accesses, self.in_tile_loop = 0, [], False
        self.fn = fn
        self.program, self.typed, self.placeholders = parent.program, inst.body, parent.placeholders

    def generate(self, name: str) -> str:
        body, _ = self.block(self.src.tree.body, {}, "    ")
        args = ", ".join(a.arg for a in self.src.tree.args.args)
        return f"\n@triton.jit\ndef {name}({args}):\n" + "\n".join(body) + "\n"


def generate(kernel, key: VariantKey, program) -> Generated:
    """Generate the Triton module for ``kernel`` specialized on ``key``; ``program``: the
    kernel's types for ``key`` (``kernel.types.check``)."""
    return Emitter(kernel, key, program).generate()
