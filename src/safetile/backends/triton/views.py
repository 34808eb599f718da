"""View operations -> Triton: In loads (masked or tensor-descriptor), owned-tile access,
sub-partitions, and the program -> tile mapping of partitions.
"""
from __future__ import annotations

import ast

from ...errors import LaunchError
from .constants import float_literal
from .expressions import ExpressionEmitter, _kw

TMA_MIN_INNER_BYTES = 16
LINE_BYTES = 128           # an L2 cache line: the prefetch granule
TMA_MAX_BOX = 256          # a tensor-map box has at most 256 elements along each axis


class ViewEmitter(ExpressionEmitter):
    """Adds the operations of In, Out and sub-partition views to expression translation."""

    def tma_store_outs(self) -> set:
        """Outs whose owned tile is written by a tensor-descriptor (TMA) store.

        A TMA store writes the whole box and drops elements outside the tensor, so edge
        tiles stay inside the partition, as the masked store does. It is asynchronous and its
        completion is not ordered by a CTA barrier, so it is used only where no token chain
        can need that order: the kernel stores the Out in exactly one statement, which no
        ``range`` loop repeats (each tile of a ``tiles()`` loop is a different box), and
        never reads it back (no ``z.load()``, no sub-partition views).
        """
        if not (self.key.tma and self.key.tma_store):
            return set()
        stores, other = {}, set()
        repeated = {id(n) for loop in ast.walk(self.src.tree) if isinstance(loop, ast.For)
                    and not (isinstance(loop.iter, ast.Call)
                             and isinstance(loop.iter.func, ast.Attribute)
                             and loop.iter.func.attr == "tiles")
                    for n in ast.walk(loop)}
        for node in ast.walk(self.src.tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            base = node.func.value
            kind = self.view_kind(base)
            if kind not in ("Out", "tile", "sub"):
                continue
            out = self.out_name(base)
            if node.func.attr == "tiles":
                continue
            if kind == "sub" or node.func.attr != "store" or id(node) in repeated:
                other.add(out)
            else:
                stores[out] = stores.get(out, 0) + 1
        for name, view in self.info.views.items():
            if view[0] == "sub":
                other.add(view[1])
        ok = set()
        for o in self.outs:
            t = o.tile
            if (o.tma and stores.get(o.name) == 1 and o.name not in other and len(t) >= 2
                    and t[-1] * o.dtype.itemsize >= TMA_MIN_INNER_BYTES
                    and all(d <= TMA_MAX_BOX for d in t)):
                ok.add(o.name)
        return ok

    def idx(self, k: int) -> str:
        if self.persistent and not self.in_tile_loop:
            raise LaunchError(
                f"kernel '{self.kernel.name}': Out '{self.lead.name}' is a persistent partition, "
                f"so owned tiles are only reachable inside `for t in {self.lead.name}.tiles():`")
        return f"_st_i{k}"

    def view_call(self, node, f, kind):
        name, method = getattr(f.value, "id", None), f.attr      # None: an inline partition
        if kind == "In":
            if method == "load":
                index = node.args[0] if node.args else _kw(node, "index")
                shape = node.args[1] if len(node.args) > 1 else _kw(node, "shape")
                pad = node.args[2] if len(node.args) > 2 else _kw(node, "padding")
                owned = isinstance(index, ast.Attribute) and index.attr == "index" and \
                    self.view_kind(index.value) in ("Out", "tile")
                return self.in_load(node, f.value, index, shape, pad, nonneg=owned)
            if method == "load_at":
                s = self.specs[name]
                offset = node.args[0] if node.args else _kw(node, "offset")
                shape = node.args[1] if len(node.args) > 1 else _kw(node, "shape")
                pad = node.args[2] if len(node.args) > 2 else _kw(node, "padding")
                e = ", ".join(self.parts(offset, s.rank))
                shp = ", ".join(self.parts(shape, s.rank))
                helper = self.use(f"_st_loadat{s.rank}")
                return f"{helper}({self.tensor_args(name, s.rank)}, {e}, {shp}, {self.pad(pad, s.dtype)})"
            if method == "prefetch":
                return self.in_prefetch(node, f.value)
            if method == "load_scalar":
                s = self.specs[name]
                index = node.args[0] if node.args else _kw(node, "index")
                pad = node.args[1] if len(node.args) > 1 else _kw(node, "padding")
                e = ", ".join(self.parts(index, s.rank))
                helper = self.use(f"_st_scalar{s.rank}")
                return f"{helper}({self.tensor_args(name, s.rank)}, {e}, {self.pad(pad, s.dtype)})"
        out = self.specs[self.out_name(f.value)]
        r = len(out.tile)
        if kind in ("Out", "tile") and method == "load":
            self.accesses.append((out.name, "load"))
            helper = self.use(f"_st_load{r}")
            return (f"{helper}({self.tensor_args(out.name, r)}, {', '.join(self.idx(k) for k in range(r))}, "
                    f"{', '.join(f'_st_{out.name}_t{k}' for k in range(r))}, 0, False)")
        if kind == "sub" and method == "load":
            self.accesses.append((out.name, "load"))
            helper = self.use(f"_st_subload{r}")
            sub = f.value if name is None else name
            return f"{helper}({self.sub_args(sub, out, r, node.args[0])}, 0)"
        raise self.fail(node, f"`{ast.unparse(node)}` must be a statement of its own")

    def pad(self, node, dtype) -> str:
        """A load's padding for a view of ``dtype`` (an int view's is an int literal: Triton
        rounds a float literal through fp32)."""
        if node is None:
            return "0"
        t = self.tp(node)                      # the value the type check took, if typed
        v = t.value if t is not None and t.kind == "const" else self.static_float(node)
        if v is None:
            raise self.fail(node, "padding must be a compile-time constant (a literal or Const)")
        is_int = not dtype.is_float and dtype.name != "bool_"
        return repr(int(v)) if is_int else float_literal(float(v))

    def tensor_args(self, name: str, r: int) -> str:
        return (f"_st_{name}_ptr, " + ", ".join(f"_st_{name}_n{k}" for k in range(r)) + ", " +
                ", ".join(f"_st_{name}_s{k}" for k in range(r)))

    def sub_args(self, sub, out, r: int, index_node) -> str:
        """Arguments of a sub-tile access; ``sub`` is the view's name or an inline
        ``z.partition(shape)`` call."""
        shape = self.parts(sub.args[0], r) if isinstance(sub, ast.Call) else self.subs[sub][1]
        j = self.parts(index_node, r)
        return (f"{self.tensor_args(out.name, r)}, {', '.join(self.idx(k) for k in range(r))}, "
                f"{', '.join(f'_st_{out.name}_t{k}' for k in range(r))}, {', '.join(j)}, "
                f"{', '.join(shape)}")

    def in_load(self, node, x, index, shape, pad, nonneg: bool) -> str:
        """A tile load of In ``x``. At the owned tile's index with its own shape (``nonneg``:
        ``sl.load_like``, ``x.load(z.index, z.shape)``) no coordinate can pass int32 (tile
        limits, lang/semantics.py); at any other index the generated code reads padding for
        a tile index whose box would pass it (``_st_iload``, ``_st_tmacoord``)."""
        s = self.specs[x.id]
        if s.kind != "In":
            raise self.fail(node, f"'{x.id}' is not an In parameter")
        block = self.static(shape)
        if isinstance(block, int):
            block = (block,)
        pad_s = self.pad(pad, s.dtype)
        idx = self.parts(index, s.rank)
        if nonneg:
            owned = isinstance(index, ast.Attribute) and \
                self.view_kind(index.value) in ("Out", "tile") and \
                tuple(block or ()) == tuple(self.specs[self.out_name(index.value)].tile)
        else:
            owned = False
        if (self.key.tma and s.tma and s.rank >= 2 and block is not None and pad_s in ("0", "0.0")
                and block[-1] * s.dtype.itemsize >= TMA_MIN_INNER_BYTES
                and all(b & (b - 1) == 0 and b <= TMA_MAX_BOX for b in block)):
            d = self.descs.setdefault((x.id, block), f"_st_{x.id}_d{len(self.descs)}")
            coords = ", ".join(f"({i}) * {b}" if owned or self.compile_time(e) else
                               f"{self.use('_st_tmacoord')}({i}, {b})"
                               for i, b, e in zip(idx, block, self.index_nodes(index, s.rank)))
            return f"{d}.load([{coords}])"
        shp = self.parts(shape, s.rank)
        nodes = self.index_nodes(index, s.rank)
        if not owned and block is not None and all(self.compile_time(e) for e in nodes) and \
                all(abs(self.tp(e).value) <= 2**31 // b - 1 for e, b in zip(nodes, block)):
            # a compile-time index whose box fits int32: the plain load, negatives masked
            helper = self.use(f"_st_load{s.rank}")
            return (f"{helper}({self.tensor_args(x.id, s.rank)}, {', '.join(idx)}, "
                    f"{', '.join(shp)}, {pad_s}, True)")
        if not owned:
            helper = self.use(f"_st_iload{s.rank}")
            return (f"{helper}({self.tensor_args(x.id, s.rank)}, {', '.join(idx)}, "
                    f"{', '.join(shp)}, {pad_s})")
        helper = self.use(f"_st_load{s.rank}")
        return (f"{helper}({self.tensor_args(x.id, s.rank)}, {', '.join(idx)}, {', '.join(shp)}, "
                f"{pad_s}, False)")

    def index_nodes(self, index, rank: int) -> list:
        """The AST node of each entry of an index (None where it has none of its own)."""
        if isinstance(index, (ast.Tuple, ast.List)):
            return list(index.elts)
        if rank == 1:
            return [index]
        return [None] * rank

    def compile_time(self, node) -> bool:
        t = self.tp(node) if node is not None else None
        return t is not None and t.kind == "const"

    def in_prefetch(self, node, x) -> str:
        """``x.prefetch(index, shape)``: an L2 prefetch of the tile ``load`` would read.

        One prefetch per 128-byte line: along the last axis the points step by a line's
        elements (``STEP``, known when the tile's last extent is a compile-time constant;
        else every element is its own point). Lanes outside the tensor are predicated off,
        so no address outside the view is ever touched."""
        s = self.specs[x.id]
        index = node.args[0] if node.args else _kw(node, "index")
        shape = node.args[1] if len(node.args) > 1 else _kw(node, "shape")
        block = self.static(shape)
        if isinstance(block, int):
            block = (block,)
        step = 1
        if isinstance(block, tuple) and len(block) == s.rank and block[-1] > 0:
            step = max(1, min(block[-1], LINE_BYTES // s.dtype.itemsize))
        idx = self.parts(index, s.rank)
        shp = self.parts(shape, s.rank)
        helper = self.use(f"_st_prefetch{s.rank}")
        return (f"{helper}({self.tensor_args(x.id, s.rank)}, {', '.join(idx)}, {', '.join(shp)}, "
                f"{step})")

    def coords(self, s: str, ind: str) -> list[str]:
        """Lines computing _st_i0.. (tile coordinates) from sequence position ``s``."""
        lead, r = self.lead, len(self.lead.tile)
        g = [f"_st_g{k}" for k in range(r)]
        if lead.order == "grouped":
            G = lead.group_size
            return [f"{ind}_st_gw = {G} * {g[1]}",
                    f"{ind}_st_fm = ({s} // _st_gw) * {G}",
                    f"{ind}_st_gs = tl.minimum({g[0]} - _st_fm, {G})",
                    f"{ind}_st_i0 = _st_fm + (({s} % _st_gw) % _st_gs)",
                    f"{ind}_st_i1 = ({s} % _st_gw) // _st_gs"]
        lines, rest = [], s
        for k in reversed(range(1, r)):
            lines.append(f"{ind}_st_i{k} = {rest} % {g[k]}")
            lines.append(f"{ind}_st_r{k} = {rest} // {g[k]}")
            rest = f"_st_r{k}"
        lines.append(f"{ind}_st_i0 = {rest}")
        return lines
