"""A mypy plugin that reads the kernel parameter grammar: ``plugins = ["safetile.mypy_plugin"]``.

``st.In[st.f32, 2]`` is not a type expression (a dtype is a value and a rank an int), so a type
checker alone rejects it. With this plugin mypy reads each annotation as the view the
parameter is in the kernel body:

- ``st.In[...]`` -> ``st.In`` (``x.load(...)``, ``x.shape``: see ``help(st.In)``),
- ``st.Out[...]`` -> ``st.Out`` (``z.store(...)``, ``z.index``, ``z.partition(...)`` ...),
- ``st.Ptr[...]`` -> ``st.Ptr``,
- ``st.Const[int]`` -> ``int`` (``float``, ``bool``; ``st.Const[st.dtype]`` -> ``st.DType``),

so misspelt view methods and wrong arities are reported, while tiles stay ``Any``. It checks
the shape of the annotation (one or two arguments, an int literal rank); the dtypes and the
rest of the grammar are checked when the decorator runs. Pyright has no plugins: there, these
annotations are reported as invalid type forms (``reportInvalidTypeForm``).
"""
from __future__ import annotations

from typing import Callable

from mypy.plugin import AnalyzeTypeContext, Plugin
from mypy.types import RawExpressionType, Type

PARAMS = "safetile.kernel.params"
VIEWS = {f"{PARAMS}.{name}": name for name in ("In", "Out", "Ptr")}
CONST = f"{PARAMS}.Const"


def _view(fullname: str, name: str) -> Callable[[AnalyzeTypeContext], Type]:
    def analyze(ctx: AnalyzeTypeContext) -> Type:
        args = ctx.type.args
        if not 1 <= len(args) <= 2:
            ctx.api.fail(f"st.{name}[dtype] or st.{name}[dtype, rank] takes one or two "
                         f"arguments, got {len(args)}", ctx.context)
        elif len(args) == 2 and not (isinstance(args[1], RawExpressionType)
                                     and args[1].base_type_name == "builtins.int"):
            ctx.api.fail(f"the rank of st.{name}[dtype, rank] is an int literal", ctx.context)
        return ctx.api.named_type(fullname, [])
    return analyze


def _const(ctx: AnalyzeTypeContext) -> Type:
    args = ctx.type.args
    if len(args) != 1:
        ctx.api.fail("st.Const takes one type: int, float, bool or st.dtype", ctx.context)
        return ctx.api.named_type("builtins.object", [])
    return ctx.api.analyze_type(args[0])


class SafetilePlugin(Plugin):
    def get_type_analyze_hook(self, fullname: str):
        if fullname in VIEWS:
            return _view(fullname, VIEWS[fullname])
        if fullname == CONST:
            return _const
        return None


def plugin(version: str) -> type[Plugin]:
    return SafetilePlugin
