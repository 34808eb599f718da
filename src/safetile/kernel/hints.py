"""What to write instead of a call the kernel language does not have.

Kernel bodies are often written from Triton, torch, math or numpy habits (`tl.exp`,
`torch.exp`, `tl.program_id`). Those modules' functions are not kernel operations (a
`@st.function` cannot wrap them), so the advice names the `sl` operation that computes the
same thing, where there is one, rather than suggesting to decorate or inline the callee.
"""
from __future__ import annotations

import ast
import types

# Modules whose functions a kernel author may reach for by habit.
FOREIGN_MODULES = ("triton", "torch", "math", "numpy", "cmath")
# Of those, the ones whose calls are scalar host math (math.sqrt(2.0)): often a constant.
HOST_MATH = ("math", "numpy", "cmath")

# Triton (and torch) spellings whose safetile operation has another name.
RENAMED = {
    "program_id": "sl.bid(axis), or the owned tile's index z.index[axis]",
    "num_programs": "sl.num_blocks(axis)",
    "dot": "sl.mma(a, b, acc) (acc + a @ b) or sl.matmul(a, b)",
    "zeros_like": "sl.zeros(t.shape, t.dtype)",
    "full_like": "sl.full(t.shape, value, t.dtype)",
    "trans": "sl.transpose(t) (or t.T)",
    "view": "sl.reshape(t, shape)",
    "amax": "sl.max(t, axis)",
    "amin": "sl.min(t, axis)",
    "clamp": "sl.minimum(sl.maximum(t, lo), hi)",
    "fdiv": "`a / b`",
    "store": "z.store(tile) on an st.Out parameter",
    "load": "x.load(index, shape) or sl.load_like(x, z)",
}


# Triton's dtype names and safetile's for them.
TRITON_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int32": "int32",
                 "int64": "int64", "int8": "int8", "int1": "bool_"}


def foreign_dtype_message(value) -> str:
    """``"; use st.float32"`` for a Triton or torch dtype (a kernel's dtypes are safetile's),
    else ``""``."""
    module = type(value).__module__ or ""
    name = getattr(value, "name", None) if module.startswith("triton") else None
    if module == "torch" and type(value).__name__ == "dtype":
        name = str(value).removeprefix("torch.")
        name = {"bool": "int1", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"
                }.get(name, name)
    ours = TRITON_DTYPES.get(name)
    return f"; kernels take safetile's dtypes: use st.{ours}" if ours else ""


# Python builtins a kernel author reaches for, and what the kernel language has instead.
BUILTINS = {
    "print": "a program cannot print; store the values into an Out and read them on the host "
             "after op.sync()",
    "int": "convert a tile or runtime scalar with .astype(st.i32); divide compile-time ints "
           "with //",
    "bool": "compare instead (t != 0), or convert with .astype(st.bool_)",
    "len": "a view's or tile's sizes are its .shape (x.shape[0], t.shape[0])",
    "sum": "reduce a tile with sl.sum(t, axis)",
    "round": "there is no rounding operation; convert with .astype(...) (floats to ints "
             "truncate)",
    "divmod": "use // and %",
    "enumerate": "loops are `for i in range(...)`",
    "zip": "loops are `for i in range(...)`",
}


def builtin_message(name: str) -> str:
    """The message for a call to a Python builtin that is not part of the kernel language."""
    hint = BUILTINS.get(name, "see help(safetile.lang) for the tile operations")
    return f"Python builtin '{name}' is not part of the kernel language; {hint}"


def sl_spelling(attr: str) -> str | None:
    """The kernel-language spelling of an operation named `attr` elsewhere, if it has one."""
    from ..lang import __all__ as operations
    if attr in RENAMED:
        return RENAMED[attr]
    if attr in operations and not attr[0].isupper():
        return f"sl.{attr}"
    return None


def foreign_module(scope, func: ast.AST) -> types.ModuleType | None:
    """The Triton/torch/math/numpy module a call `mod.name(...)` goes to, else None."""
    if not isinstance(func, ast.Attribute):
        return None
    base = scope.resolve(func.value)
    if base is None or base.kind != "module":
        return None
    if base.value.__name__.split(".")[0] not in FOREIGN_MODULES:
        return None
    return base.value


def unknown_call_message(scope, func: ast.AST) -> str:
    """The message for a call to something that is neither a kernel operation nor a helper."""
    from .kernel import Kernel
    name = ast.unparse(func)
    module = foreign_module(scope, func)
    resolved = scope.resolve(func)
    if resolved is not None and isinstance(resolved.value, Kernel):
        return (f"'{name}' is an @st.kernel: kernels are launched from the host, not called "
                f"from a kernel body; to share code between kernels, put it in an "
                f"@st.function helper that both call")
    if module is None:
        return (f"call to '{name}', which is not an @st.function nor a safetile.lang "
                f"operation; decorate it with @st.function or inline it")
    instead = sl_spelling(func.attr)
    use = f"use {instead}" if instead else "kernel bodies call only safetile.lang operations " \
                                           "(help(safetile.lang)) and @st.function helpers"
    if module.__name__.split(".")[0] in HOST_MATH:
        use += "; a value known on the host is computed before the launch and passed in"
    return f"`{name}` is {module.__name__}'s, not a kernel operation; {use}"


def missing_operation_message(func: ast.Attribute, module: types.ModuleType) -> str:
    """The message for `sl.name` (or another allowed module's name) that does not exist."""
    instead = sl_spelling(func.attr)
    hint = f"use {instead}" if instead else "see its docstring for the operations it has"
    return f"`{ast.unparse(func)}` does not exist in {module.__name__}; {hint}"


# Triton and torch habits index a tile by element (`t[0]`, `t[:, -1]`); a tile holds no
# per-element access, so the advice names the two ways to get those elements.
TILE_ELEMENT_HINT = ("; to read a narrower slice or one element, load it from the input "
                     "(x.load(index, smaller_shape), x.load_scalar(index)); to pick element "
                     "i of a tile, mask and reduce: sl.sum(sl.where(sl.arange(n) == i, t, 0), 0)")


def undefined_message(name: str) -> str:
    """A name the kernel's globals lack when the decorator runs (defined below it, say)."""
    return (f"name '{name}' is not defined where the kernel is decorated: a kernel reads its "
            f"globals when the decorator runs, so a helper or constant it uses is defined "
            f"above it")


def load_like_message(in_helper: bool) -> str:
    """``sl.load_like`` given anything but an In view and an Out view (in a helper: views)."""
    helper = ("; views stay in the kernel: an @st.function helper takes tiles and scalars, so "
              "load in the kernel and pass the tile" if in_helper else "")
    return (f"sl.load_like(x, z) takes an In view x and an Out view z (the tile of x at z's "
            f"position and shape){helper}")


def global_message(name: str, value) -> str:
    """A global of a kind a kernel cannot use."""
    return (f"global '{name}' ({type(value).__name__}) cannot be used in a kernel: only "
            f"int/float/bool constants, dtypes, safetile.lang and @st.function helpers"
            f"{foreign_dtype_message(value)}")


def positional_message(node: ast.Call, what: str, sig, keyword: str, keywords) -> str:
    """A call passing ``keyword`` by name to ``what`` (signature ``sig``), which takes it
    positionally (by name only ``keywords``): the call to write instead, where one can be
    written (the keywords fill the parameters after the positional arguments, no gap)."""
    given = {k.arg: k.value for k in node.keywords}
    names = list(sig.parameters)[len(node.args):len(node.args) + len(given)]
    instead = ""
    if set(names) == set(given):
        args = [ast.unparse(a) for a in node.args] + [ast.unparse(given[n]) for n in names]
        instead = f": write `{ast.unparse(node.func)}({', '.join(args)})`"
    by_name = f"; by name it takes only {', '.join(keywords)}" if keywords else ""
    return f"`{ast.unparse(node)}`: {what}{sig} takes `{keyword}` positionally{instead}{by_name}"
