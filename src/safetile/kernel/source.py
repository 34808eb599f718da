"""A kernel's source: its parsed AST, file and line mapping, and name resolution.

The checker and the code generator both resolve names through ``Scope``, so the two never
disagree about what ``sl.exp`` or ``BLOCK`` means.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
import types
from dataclasses import dataclass
from typing import Any, Optional

from ..dtypes import DType
from ..errors import KernelDefinitionError

ALLOWED_PY_BUILTINS = {"range", "min", "max", "abs", "float"}


@dataclass
class Resolved:
    """What a name or attribute chain in a kernel body denotes."""

    kind: str        # param | local | builtin | load_like | dtype | const | function | pybuiltin | module
    value: Any = None


class KernelSource:
    """The AST of one decorated function with file:line mapping."""

    def __init__(self, fn):
        self.fn = fn
        self.filename = inspect.getsourcefile(fn) or "<unknown>"
        try:
            lines, self.first_line = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise KernelDefinitionError(
                f"cannot read the source of {fn.__qualname__}: kernels must be defined in a file",
                self.filename, 0, "source") from e
        tree = ast.parse(textwrap.dedent("".join(lines)))
        node = tree.body[0]
        if not isinstance(node, ast.FunctionDef):
            raise KernelDefinitionError("@st.kernel decorates a plain `def` function",
                                        self.filename, self.first_line, "source")
        self.tree: ast.FunctionDef = node

    def line(self, node: ast.AST) -> int:
        """The file line of ``node``."""
        return self.first_line + getattr(node, "lineno", 1) - 1

    def error(self, node: ast.AST, rule: str, message: str) -> KernelDefinitionError:
        return KernelDefinitionError(message, self.filename, self.line(node), rule)


class Scope:
    """Resolves names of a kernel body against its parameters, locals and globals."""

    def __init__(self, fn, params: dict, local_names: set):
        self.params = params                       # name -> ParamSpec (empty for functions)
        self.locals = local_names
        self.globals = dict(fn.__globals__)
        # Module attributes resolve once (the checker resolves every one when the decorator
        # runs), so that both backends see them as they were then.
        self._attrs: dict = {}
        if fn.__closure__:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                try:
                    self.globals[name] = cell.cell_contents
                except ValueError:
                    pass

    def resolve(self, node: ast.AST) -> Optional[Resolved]:
        if isinstance(node, ast.Name):
            if node.id in self.params:
                return Resolved("param", node.id)
            if node.id in self.locals:
                return Resolved("local", node.id)
            if node.id in self.globals:
                return classify(self.globals[node.id])
            if node.id in ALLOWED_PY_BUILTINS:
                return Resolved("pybuiltin", node.id)
            if hasattr(builtins, node.id):
                return Resolved("forbidden_builtin", node.id)
            return None
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if base is not None and base.kind == "module":
                key = (id(base.value), node.attr)
                if key not in self._attrs:
                    if not hasattr(base.value, node.attr):
                        return None
                    self._attrs[key] = classify(getattr(base.value, node.attr))
                return self._attrs[key]
        return None


def classify(value) -> Resolved:
    from ..lang import load_like
    from ..lang.ops import builtin_of
    # only safetile.lang's own operations: anything else claiming to be one would paste its
    # "Triton spelling" into generated code
    b = builtin_of(value)
    if b is not None:
        return Resolved("builtin", b)
    if value is load_like:
        return Resolved("load_like", value)
    if isinstance(value, DType):
        from ..dtypes import ALL
        return Resolved("dtype", value) if any(value is d for d in ALL) else \
            Resolved("other", value)
    if isinstance(value, (int, float)):
        # the plain value: a subclass's own methods (its repr is what code generation would
        # spell) are never consulted; bool cannot be subclassed
        if type(value) is not bool:
            value = int.__int__(value) if isinstance(value, int) else float.__float__(value)
        return Resolved("const", value)
    if getattr(value, "__safetile_function__", False):
        return Resolved("function", value)
    if isinstance(value, types.ModuleType):
        return Resolved("module", value)
    return Resolved("other", value)


def assigned_names(fn_node: ast.FunctionDef) -> set:
    """Names bound inside the body (assignments and loop targets): the locals."""
    names = set()
    for node in ast.walk(fn_node):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names
