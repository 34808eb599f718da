"""What an op or a graph keeps is private: nothing public swaps its checked arguments or
hands out a torch alias of the memory it borrows."""
import ast
import dataclasses

import pytest
import torch

import safetile as st
from support import add, cpu_executor, no_leftover_holds, vec

_cpu = cpu_executor(seed=0)
_holds = no_leftover_holds()


def _op():
    return add(vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,)))


@pytest.mark.parametrize("field", ["values", "kernel", "backend", "grid", "serial"])
def test_a_built_op_s_arguments_and_launch_cannot_be_replaced(field):
    op = _op()
    other = st.empty((2,)).partition((2,))        # never checked against in-flight work
    with pytest.raises(AttributeError):
        setattr(op, field, (op.values[0], op.values[1], other))
    x, y, z = op.sync()                            # the checked arguments are the ones run
    assert z.unpartition().to_torch().tolist() == [4.0, 6.0]


def _torch_inside(value, depth=0):
    """Whether ``value`` is, or (in tuples, lists, dicts or dataclasses) holds, a torch
    tensor."""
    if isinstance(value, torch.Tensor):
        return True
    if depth > 3:
        return False
    if isinstance(value, (tuple, list)):
        return any(_torch_inside(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(_torch_inside(v, depth + 1) for v in value.values())
    if dataclasses.is_dataclass(value):
        return any(_torch_inside(getattr(value, f.name), depth + 1)
                   for f in dataclasses.fields(value))
    return False


def _public_values(obj):
    """The public data attributes and properties of ``obj`` (methods are not called)."""
    for name in dir(obj):
        if name.startswith("_") or callable(getattr(type(obj), name, None)):
            continue
        try:
            yield name, getattr(obj, name)
        except Exception:                  # a property refusing in this state (MovedError)
            continue


def test_no_public_attribute_of_an_op_or_graph_is_a_torch_alias_of_its_memory():
    op = _op()
    x, y, out = vec(1, 2), vec(3, 4), st.empty((2,))
    with st.graph_scope() as s:
        s.record(add(x, y, out.partition((2,))))
        leaks = [("scope", n) for n, v in _public_values(s) if _torch_inside(v)]
        leaks += [("scope.records[0]", n) for n, v in _public_values(s.records[0])
                  if _torch_inside(v)]
    replay = s.graph.launch()
    for what, obj in (("op", op), ("graph", s.graph), ("replay", replay)):
        leaks += [(what, n) for n, v in _public_values(obj) if _torch_inside(v)]
    assert leaks == []
    op.sync()
    replay.sync()


def test_a_kernel_s_checked_definition_cannot_be_changed_through_its_public_attributes():
    mutable = [name for name, value in _public_values(add)
               if isinstance(value, (dict, list, set, ast.AST))]
    assert mutable == []
    with pytest.raises(TypeError):
        add.params["z"] = add.params["x"]         # z an In: stores to a shared input
