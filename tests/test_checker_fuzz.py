"""The checks never crash: random kernel bodies, well-formed or not, are either accepted or
refused with a ``KernelDefinitionError`` naming file:line, at definition or at launch (the
per-variant type check); an accepted kernel runs on the CPU executor or fails with a
safetile error; the code generator and the CPU executor refuse exactly the same kernels."""
import importlib.util
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import safetile as st

EXPRS = [
    "a", "b", "n", "C", "1", "-2", "0.5", "float('inf')", "True", "None", "'s'", "z.shape",
    "z.index", "z.index[0]", "x.shape[0]", "x.shape", "a + b", "a * n", "a // 2", "a % b",
    "a ** 2", "-a", "~a", "not a", "a and b", "a if n else b", "a < b < C", "a is b",
    "sl.exp(a)", "sl.sum(a, 0)", "sl.max(a)", "sl.argmax(a, 0)", "sl.where(a > 0, a, b)",
    "sl.maximum(a, b)", "min(a, b, n)", "max(1, 2)", "abs(a)", "float(n)", "float(C)",
    "a.astype(st.i32)", "a.astype(st.bool_)", "a.T", "a[None, :]", "a[1:2]", "a.dtype",
    "sl.arange(8)", "sl.full((8,), 1.0, st.f32)", "sl.zeros(z.shape, st.f32)",
    "sl.reshape(a, (2, 4))", "sl.mma(a, a, a)", "sl.cdiv(n, 3)", "sl.bid(0)",
    "sl.num_blocks(0)", "x.load(z.index, z.shape)", "x.load((n,), (8,))", "x.load_scalar((n,))",
    "x.load_at((n,), (8,))", "z.load()", "sl.load_like(x, z)", "sl.load_like(z, x)",
    "lambda q: q", "[q for q in range(3)]", "{1: 2}", "(q := 3)", "f'{a}'", "x", "z",
    "z.partition((2,))", "ident(a)", "ident(z)", "ident(z.partition((2,)))", "sl.nothing(a)",
    "st.f32", "st.f32(a)", "range(3)", "len(a)", "a.foo", "a.astype(7)", "x[0]",
    "sl.full((3,), 1, st.f32)", "sl.where(a, 1, 2.5)", "a @ a", "a << n", "a >> 40",
]
STMTS = [
    "a = {e}", "b = {e}", "a = a + {e}", "a += {e}", "z.store({e})", "{e}",
    "for i in range({e}):\n        a = a + i", "if {e}:\n        b = a\n    else:\n        b = a",
    "if {e}:\n        c = a", "z.partition((2,)).store({e}, (0,))", "z.store({e}, 0)",
    "x.prefetch((0,), (8,))", "x = {e}", "z[0] = {e}", "del a", "while {e}:\n        pass",
    "return {e}", "assert {e}", "with {e}:\n        pass", "try:\n        pass\n    except "
    "Exception:\n        pass", "global a", "def inner():\n        pass", "for t in z.tiles():"
    "\n        t.store({e})", "a, b = {e}", "pass",
]
HEADER = """import safetile as st
import safetile.lang as sl


@st.function
def ident(t):
    return t


@st.kernel
def k(x: st.In[st.f32], z: st.Out[st.f32], n: int, C: st.Const[int]):
    a = sl.load_like(x, z)
    b = a * 2.0
"""
_count = itertools.count()


@given(hs.lists(hs.tuples(hs.sampled_from(STMTS), hs.sampled_from(EXPRS)), min_size=1,
                max_size=5))
@settings(max_examples=250, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_the_checks_accept_or_refuse_with_a_definition_error_and_never_crash(tmp_path_factory,
                                                                            body):
    lines = ["    " + s.format(e=e) for s, e in body]
    path = tmp_path_factory.mktemp("fuzz") / f"fuzz_{next(_count)}.py"
    path.write_text(HEADER + "\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except st.KernelDefinitionError as e:
        assert str(e).startswith(f"{path}:") and e.rule != "internal", str(e)
        return
    except SyntaxError:
        return                                   # not Python: nothing for the checker to see
    kernel = module.k

    def args():
        return [st.zeros((8,), device="cpu"), st.empty((8,), device="cpu").partition((8,)), 1, 3]
    generated = cpu = None
    try:
        kernel.source(*args())
    except st.KernelDefinitionError as e:
        assert str(e).startswith(f"{path}:") and e.rule != "internal", str(e)
        generated = str(e)
    try:
        with st.backend("interpret"):
            kernel(*args()).sync()
    except st.KernelDefinitionError as e:
        cpu = str(e)
    except st.SafetileError:
        pass
    assert generated == cpu                      # the two backends refuse the same kernels
