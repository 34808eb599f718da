"""The API can be discovered from Python: explicit exports, help() with signatures, the grammar."""
import importlib
import inspect
import pydoc
import types

import safetile as st
import safetile.lang as sl
import safetile.ops as ops
from safetile.lang.ops import BUILTINS


def text(obj) -> str:
    return " ".join(pydoc.render_doc(obj, renderer=pydoc.plaintext).split())


def public_names(module) -> set:
    return {n for n, v in vars(module).items()
            if not n.startswith("_") and not isinstance(v, types.ModuleType)}


def test_safetile_exports_its_api_explicitly():
    assert len(st.__all__) == len(set(st.__all__))
    for name in st.__all__:
        assert hasattr(st, name), name
    assert {"kernel", "In", "Out", "Const", "Ptr", "Tensor", "Partition", "Shared", "zeros",
            "from_torch", "DeviceOp", "graph_scope", "UnrunOpWarning"} <= set(st.__all__)
    star: dict = {}
    exec("from safetile import *", star)
    assert set(star) - {"__builtins__"} == set(st.__all__)


def test_every_error_and_warning_class_is_exported_as_st_name():
    import inspect
    from safetile import errors
    for name, cls in vars(errors).items():
        if inspect.isclass(cls) and issubclass(cls, (errors.SafetileError, Warning)) and \
                cls.__module__ == errors.__name__:
            assert getattr(st, name) is cls and name in st.__all__, name


def test_help_on_safetile_lists_the_api_not_only_the_dtypes():
    doc = text(st)
    for name in ("kernel(fn=None, *, unsafe=False, **options)", "class Tensor", "class Partition",
                 "class Shared", "class DeviceOp", "zeros(shape", "from_torch(t", "graph_scope(",
                 "docs/guide.md"):
        assert name in doc, name


def test_safetile_lang_exports_every_tile_operation():
    assert set(BUILTINS) | {"load_like"} <= set(sl.__all__)
    assert set(sl.__all__) <= set(dir(sl))


def test_safetile_ops_exports_every_public_op():
    assert set(ops.__all__) == public_names(ops)


def test_help_on_st_kernel_carries_the_grammar_and_the_return_convention():
    doc = text(st.kernel)
    assert "kernel(fn=None, *, unsafe=False, **options)" in doc
    for part in ("st.In[dtype, rank]", "st.Out[dtype, rank]", "st.Const[int | float | bool | st.dtype]",
                 "``int``, ``float``: runtime scalars", "st.Ptr[dtype]", "with st.unsafe():",
                 "hands every argument back in parameter order, scalars included",
                 ".unpartition()", "KernelDefinitionError", "@st.kernel def scale("):
        assert part in doc, part


def test_help_on_the_parameter_types_lists_what_they_do_in_the_body():
    doc_in, doc_out = text(st.In), text(st.Out)
    for method in ("load(self, index", "load_at(self, offset", "load_scalar(self, index",
                   "prefetch(self, index"):
        assert method in doc_in, method
    for method in ("store(self, tile", "partition(self, sub_shape", "tiles(self)", "load(self)"):
        assert method in doc_out, method
    assert "Partition" in doc_out and "unpartition" in doc_out
    assert "Const" in text(st.Const) and "compile-time" in text(st.Const)


def test_tile_operations_show_their_real_signatures():
    assert str(inspect.signature(sl.sum)) == "(t, axis=None)"
    assert str(inspect.signature(sl.mma)) == "(a, b, acc)"
    assert str(inspect.signature(sl.load_ptr)) == "(p, offsets, mask=None, other=0)"
    assert "sum(t, axis=None)" in text(sl.sum) and "fp32" in text(sl.sum)
    for name in BUILTINS:
        fn = getattr(sl, name)
        assert inspect.isfunction(fn) and fn.__doc__, name


def test_the_kernel_package_is_importable_beside_the_decorator():
    params = importlib.import_module("safetile.kernel.params")
    import safetile.kernel.launch as launch        # the `as` form resolves through st.kernel
    import safetile.kernel.params
    assert safetile.kernel.params is params and st.kernel.launch is launch
    assert params.In is st.In

    @st.kernel
    def copy(x: st.In[st.f32], z: st.Out[st.f32]):
        z.store(sl.load_like(x, z))

    @st.kernel(num_warps=4)
    def copy4(x: st.In[st.f32], z: st.Out[st.f32]):
        z.store(sl.load_like(x, z))

    assert isinstance(copy, st.Kernel) and copy4.opts == {"num_warps": 4}
    assert inspect.isroutine(st.kernel)
    try:
        st.kernel.no_such_module
    except AttributeError as e:
        assert "no_such_module" in str(e)
    else:
        raise AssertionError("st.kernel.no_such_module resolved")


def test_st_ops_is_the_kernel_library_without_importing_it_first():
    """``import safetile as st; st.ops.add(...)`` in a fresh process: ``safetile.ops`` loads
    on first use of ``st.ops`` (not at ``import safetile``)."""
    import os
    import subprocess
    import sys
    code = ("import sys, safetile as st\n"
            "assert 'safetile.ops' not in sys.modules\n"
            "z = st.ops.add(st.ones((4,), device='cpu'), st.ones((4,), device='cpu')).sync()\n"
            "assert z.to_torch().tolist() == [2.0] * 4 and st.ops is sys.modules['safetile.ops']\n"
            "try:\n    st.no_such_name\nexcept AttributeError:\n    pass\n"
            "else:\n    raise SystemExit('st.no_such_name did not raise')\n")
    env = dict(os.environ, SAFETILE_BACKEND="interpret")
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
