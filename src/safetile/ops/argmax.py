"""Vocabulary argmax in two stages, the greedy-sampling step of decode.

Stage 1: each program owns one entry of two small outputs and writes the max and the global
index of the max of its block of ``B`` logits. Stage 2: one program reduces those partials and
stores the token id. Both stages pick the first maximum (``tl.argmax`` breaks ties to the
left), and blocks are in index order, so ties go to the lowest index, as ``torch.argmax``.
A NaN counts as -inf (as in ``sl.argmax`` on both backends): it never beats a number, where
``torch.argmax`` returns a NaN's index; among entries that are all -inf or NaN the first
wins, so every entry NaN gives 0.

The partials live in a :class:`ArgmaxWorkspace` the caller may allocate once (decode graphs
must not allocate); the token id stays on the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from ..dtypes import DType
from ..tensor import Shared, Tensor, alloc
from . import host

BLOCK = 1024                  # logits per stage-1 program (about 150 programs for Qwen3)
MAX_BLOCKS = 16384            # partials one stage-2 program reduces


@st.kernel
def argmax_partial_kernel(x: st.In[st.floats, 1], values: st.Out[st.f32, 1],
                          indices: st.Out[st.i32 | st.i64, 1], B: st.Const[int]):
    """values[b], indices[b] = max and (global) first argmax of x[b*B : (b+1)*B]."""
    b = values.index[0]
    t = x.load((b,), (B,), padding=float("-inf")).astype(st.f32)
    values.store(sl.max(t, 0))
    indices.store(sl.argmax(t, 0) + b * B)


@st.kernel
def argmax_final_kernel(values: st.In[st.f32, 1], indices: st.In[st.i32 | st.i64, 1],
                        out: st.Out[st.i32 | st.i64, 1], NB: st.Const[int]):
    """out[0] = indices[first argmax of values] (NB: the partial count rounded up to 2^k)."""
    v = values.load((0,), (NB,), padding=float("-inf"))
    out.store(indices.load_scalar((sl.argmax(v, 0),)))


_PARTIAL = host.Configured(argmax_partial_kernel)
_FINAL = host.Configured(argmax_final_kernel)


@dataclass
class ArgmaxWorkspace:
    """Stage-1 partials for logits of ``n`` entries: one (max, index) pair per block."""

    values: Tensor
    indices: Tensor
    block: int

    @property
    def blocks(self) -> int:
        return self.values.shape[0]


def argmax_workspace(n: int, dtype: DType = st.i64, device=None,
                     block: int = BLOCK) -> ArgmaxWorkspace:
    """Allocate the partials :func:`argmax` needs for ``n`` logits (do it outside graphs);
    ``block``: logits per stage-1 program, a power of two."""
    n = host.check_int("ops.argmax_workspace: n", n, 1)
    block = host.check_pow2("ops.argmax_workspace: block", block)
    if dtype not in (st.i32, st.i64):
        raise ArgumentError(f"ops.argmax_workspace: the index dtype must be st.i32 or st.i64, "
                            f"got {dtype!r}")
    blocks = -(-n // block)
    if blocks > MAX_BLOCKS:
        raise ArgumentError(f"ops.argmax_workspace: argmax over {n} entries in blocks of "
                            f"{block} needs {blocks} partials (at most {MAX_BLOCKS}); use a "
                            f"larger block")
    return ArgmaxWorkspace(alloc.empty((blocks,), dtype=st.f32, device=device),
                           alloc.empty((blocks,), dtype=dtype, device=device), block)


def argmax(x, out=None, workspace: ArgmaxWorkspace | None = None, *, dtype: DType = st.i64,
           block: int = BLOCK):
    """The index of the largest entry of ``x`` (shape (n,) or (1, n), n >= 1; fp32, fp16 or
    bf16). A NaN counts as -inf (see the module docstring): all NaNs give 0.

    Returns a ``DeviceOp`` whose output is a (1,) tensor of ``dtype`` (int32 or int64;
    ``out``'s dtype when given) on x's device. ``block``: logits per stage-1 program, a power
    of two. Pass ``out`` and ``workspace`` (:func:`argmax_workspace`) to allocate nothing,
    e.g. inside a graph scope."""
    host.check_value("ops.argmax: x", x)
    host.check_dtype("ops.argmax: x", x, st.floats)
    if isinstance(x, Shared) and x.ndim != 1:
        raise ArgumentError(f"ops.argmax: a Shared x must be 1-D (n,) (a Shared handle is "
                            f"never reshaped), got shape {x.shape}; pass the Tensor, or share "
                            f"an (n,) view")
    if x.ndim == 2 and x.shape[0] == 1:
        x = x.view(-1)
    else:
        x = host.borrow(x)
    if x.ndim != 1:
        raise ArgumentError(f"ops.argmax: x must be (n,) or (1, n), got shape {x.shape}")
    n = x.shape[0]
    if n == 0:
        raise ArgumentError("ops.argmax: x is empty; the argmax of no values is undefined")
    block = host.check_pow2("ops.argmax: block", block)
    if out is not None:
        host.check_target("ops.argmax: out", out)
        dtype = out.dtype
    if dtype not in (st.i32, st.i64):
        what = "out's dtype" if out is not None else "dtype"
        raise ArgumentError(f"ops.argmax: {what} must be st.i32 or st.i64 (an index), got "
                            f"{dtype!r}")
    if workspace is None:
        host.not_given("ops.argmax: workspace")
        workspace = argmax_workspace(n, dtype, x.device, block)
    if not isinstance(workspace, ArgmaxWorkspace):
        raise ArgumentError(f"ops.argmax: workspace must be an ArgmaxWorkspace "
                            f"(ops.argmax_workspace), got {type(workspace).__name__}")
    host.check_workspace("ops.argmax", workspace, ("values", "indices"))
    # A numpy int block is taken as the int it holds (the launches compute with it).
    ws_block = host.check_pow2("ops.argmax: workspace.block", workspace.block)
    if workspace.values.ndim != 1 or tuple(workspace.indices.shape) != \
            tuple(workspace.values.shape) or workspace.blocks != -(-n // ws_block) or \
            workspace.indices.dtype is not dtype or workspace.values.dtype is not st.f32:
        raise ArgumentError(f"ops.argmax: the workspace holds values "
                            f"{tuple(workspace.values.shape)} {workspace.values.dtype!r} and "
                            f"indices {tuple(workspace.indices.shape)} "
                            f"{workspace.indices.dtype!r} for blocks of {ws_block}; {n} logits "
                            f"need ({-(-n // ws_block)},) st.float32 values and {dtype!r} "
                            f"indices: build it with ops.argmax_workspace")
    z = host.output("ops.argmax: out", out, (1,), dtype, x.device)
    # Two launches: the second writes ``out`` only after the first has run, through views
    # taken now (host.taken).
    ws, zv = host.taken(workspace, ("values", "indices")), host.owned_view(z, (1,))
    ws.block = ws_block
    host.check_disjoint("ops.argmax", {"x": x}, {"out": z, "workspace.values": ws.values,
                                                 "workspace.indices": ws.indices})
    stage1 = _PARTIAL(host.warps_for(ws.block))(
        x, ws.values.view(-1).partition((1,)), ws.indices.view(-1).partition((1,)),
        int(ws.block))
    nb = host.next_pow2(ws.blocks)

    def stage2(*_):
        return _FINAL(host.warps_for(nb))(*host.inputs(ws.values, ws.indices),
                                          zv.partition((1,)), nb)
    return host.reserving(host.returning(stage1.then(stage2), z), "ops.argmax", {"out": z})
