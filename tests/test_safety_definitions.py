"""The weak spots of definitions closed: the checker never crashes, kernels are plain
functions, no public API pastes text into generated code, the unsafe flag is fixed, and
generated names cannot collide with user names. Each refusal is a typed error."""
import functools

import numpy as np
import pytest

import safetile as st
import safetile.lang as sl
from safetile.kernel import checker
from safetile.lang import ops as lang_ops


def test_an_inline_sub_partition_passed_to_a_helper_is_a_definition_error_not_a_crash():
    @st.function
    def ident(t):
        return t
    with pytest.raises(st.KernelDefinitionError, match=r"\[call\] views \(`z.partition\(\(2,\)\)`\)"):
        @st.kernel
        def k(z: st.Out[st.f32]):
            ident(z.partition((2,)))


def test_a_rule_that_fails_unexpectedly_still_gives_a_definition_error_with_file_and_line(
        monkeypatch):
    def broken(self, node):
        raise AttributeError("a rule's own bug")
    monkeypatch.setattr(checker.BodyChecker, "visit_Assign", broken)
    with pytest.raises(st.KernelDefinitionError, match=r"test_safety_definitions.py:\d+: "
                                                       r"\[internal\]"):
        @st.kernel
        def k(x: st.In[st.f32], z: st.Out[st.f32]):
            t = sl.load_like(x, z)
            z.store(t)


def test_kernels_and_helpers_must_be_plain_functions():
    def body(x: st.In[st.f32], z: st.Out[st.f32]):
        z.store(sl.load_like(x, z))

    @functools.wraps(body)
    def wrapper(*a):
        return body(*a)
    with pytest.raises(st.KernelDefinitionError, match="plain `def`"):
        st.kernel(wrapper)
    with pytest.raises(st.KernelDefinitionError, match="plain `def`"):
        st.function(functools.partial(body))


def test_no_public_api_adds_an_operation_or_changes_how_one_is_spelled():
    assert not hasattr(lang_ops, "builtin")
    with pytest.raises(TypeError):
        lang_ops.BUILTINS["evil"] = sl.exp                # read-only mapping
    with pytest.raises(st.errors.FrozenError):
        lang_ops.BUILTINS["exp"].triton = "__import__('os').system('true')"
    fake = lang_ops.Builtin(lambda x: x, "__import__('os').getcwd", False, False)

    with pytest.raises(st.KernelDefinitionError, match="not an @st.function nor a safetile.lang"):
        @st.kernel
        def k(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(fake(sl.load_like(x, z)))


def test_what_codegen_emits_for_an_operation_never_rests_on_the_sl_functions_attributes(
        monkeypatch):
    # sl.exp is a plain function (for help() and signatures): its attributes can be set, so
    # none of them is read; an operation is known by the function's identity
    monkeypatch.setattr(sl.exp, "triton", "__import__('os').getcwd", raising=False)

    @st.kernel
    def k(x: st.In[st.f32], z: st.Out[st.f32]):
        z.store(sl.exp(sl.load_like(x, z)))
    src = k.source(st.zeros((4,), device="cpu"), st.empty((4,), device="cpu").partition((4,)))
    assert "_st_m_exp(" in src and "getcwd" not in src

    @functools.wraps(sl.exp)
    def lookalike(x):
        return x
    with pytest.raises(st.KernelDefinitionError, match="not an @st.function nor a safetile.lang"):
        @st.kernel
        def k2(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(lookalike(sl.load_like(x, z)))


def test_dtypes_are_fixed_and_only_safetiles_own_dtypes_enter_a_kernel():
    with pytest.raises(st.errors.FrozenError):
        st.f32.triton_name = "float32); import os; (tl.float32"
    fake = st.DType("evil", st.f32.torch, "float32); import os; (tl.float32")
    with pytest.raises(st.KernelDefinitionError, match="cannot be used"):
        @st.kernel
        def k(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(sl.load_like(x, z).astype(fake))


@st.kernel
def cast_to(x: st.In[st.f32], z: st.Out[st.f32], D: st.Const[st.dtype]):
    z.store(sl.load_like(x, z).astype(D).astype(st.f32))


def test_a_const_dtype_argument_must_be_one_of_safetiles_dtypes():
    fake = st.DType("evil", st.f32.torch, "load")
    with st.backend("interpret"), pytest.raises(st.LaunchError, match="Const"):
        cast_to(st.zeros((4,)), st.zeros((4,)).partition((4,)), fake)


def test_the_generated_entry_is_the_checked_defs_name_not_a_renamed_function():
    def k(x: st.In[st.f32], z: st.Out[st.f32]):
        z.store(sl.load_like(x, z))
    k.__name__ = "k(): pass\nimport os\ndef x"
    kern = st.kernel(k)
    src = kern.source(st.zeros((4,), device="cpu"), st.empty((4,), device="cpu").partition((4,)))
    assert "\ndef k(_st_x_ptr" in src and "import os" not in src


@st.kernel(unsafe=True)
def raw_copy(p: st.Ptr[st.f32], n: int):
    sl.store_ptr(p, sl.arange(4), sl.zeros((4,), st.f32), mask=sl.arange(4) < n)


def test_the_unsafe_flag_is_fixed_where_the_kernel_is_defined():
    with pytest.raises(st.errors.FrozenError, match="'unsafe' is fixed"):
        raw_copy.unsafe = False
    with pytest.raises(st.errors.FrozenError):
        del raw_copy.unsafe
    with pytest.raises(st.errors.FrozenError):
        raw_copy.fn = lambda p, n: None
    with st.backend("interpret"), pytest.raises(st.UnsafeError):
        raw_copy.options(grid=(1,))(st.zeros((4,), device="cpu"), 4)


def test_names_that_only_begin_like_generated_ones_are_free():
    @st.function
    def _state(t):
        return t + 1.0

    @st.kernel
    def k(x: st.In[st.f32], z: st.Out[st.f32]):
        _start = sl.load_like(x, z)
        z.store(_state(_start))
    with st.backend("interpret"):
        _, z = k(st.zeros((4,)), st.empty((4,)).partition((4,))).sync()
    assert z.unpartition().to_torch().tolist() == [1.0] * 4


@pytest.mark.parametrize("source,rule", [
    ("def k(x: st.In[st.f32], z: st.Out[st.f32]):\n    tl = sl.load_like(x, z)\n    z.store(tl)",
     "name"),
    ("def k(_stf_x: st.In[st.f32], z: st.Out[st.f32]):\n    z.store(sl.load_like(_stf_x, z))",
     "name"),
    ("def tl(x: st.In[st.f32], z: st.Out[st.f32]):\n    z.store(sl.load_like(x, z))", "name"),
    ("def k(x: st.In[st.f32], z: st.Out[st.f32]):\n    float = 2\n    z.store(sl.load_like(x, z))",
     "name"),
    ("def k(x: st.In[st.f32], z: st.Out[st.f32]):\n    t = sl.load_like(x, z)\n"
     "    z.store(t if 0 < t < 1 else t)", "expression"),
    ("def k(x: st.In[st.f32], z: st.Out[st.f32]):\n    t = sl.load_like(x, z)\n"
     "    z.store(t if t is t else t)", "expression"),
], ids=["local-tl", "param-_stf", "kernel-named-tl", "local-float", "chained-compare", "is"])
def test_names_generated_code_uses_and_comparisons_it_cannot_express_are_refused(tmp_path,
                                                                                 source, rule):
    path = tmp_path / "k.py"
    path.write_text("import safetile as st\nimport safetile.lang as sl\n\n@st.kernel\n" + source
                    + "\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("k_mod", path)
    with pytest.raises(st.KernelDefinitionError) as e:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert e.value.rule == rule and str(e.value).startswith(f"{path}:")


def test_helpers_take_no_defaults_and_return_once_at_the_end():
    with pytest.raises(st.KernelDefinitionError, match="no default values"):
        @st.function
        def scale(x, k=2.0):
            return x * k
    with pytest.raises(st.KernelDefinitionError, match="returns once"):
        @st.function
        def early(x, n):
            if n > 0:
                return x
            return x * 2.0


def test_bad_host_inputs_are_typed_errors():
    with pytest.raises(st.ArgumentError, match="negative dimension"):
        st.zeros((-1,))
    with pytest.raises(st.ArgumentError, match="st.from_numpy"):
        st.from_numpy(np.array(["a", "b"]))
    with pytest.raises(st.ArgumentError, match="st.full"):
        st.full((2,), "x")
    with pytest.raises(st.ArgumentError, match="st.arange"):
        st.arange(0, 4, 0)
    with pytest.raises(st.ArgumentError, match="not a device"):
        st.zeros((2,), device="no-such-device")



def test_a_tiles_loop_cannot_rebind_an_out_parameter():
    with pytest.raises(st.KernelDefinitionError,
                       match=r"\[param-assignment\] assignment to parameter 'w' \(Out\)"):
        @st.kernel
        def k(z: st.Out[st.f32], w: st.Out[st.f32]):
            for w in z.tiles():
                w.store(sl.full((4,), 5.0, st.f32))


def test_a_tiles_loop_cannot_rebind_a_scalar_or_in_parameter():
    with pytest.raises(st.KernelDefinitionError, match=r"parameter 'n' \(int\)"):
        @st.kernel
        def k(z: st.Out[st.f32], n: int):
            for n in z.tiles():
                n.store(sl.full((4,), 5.0, st.f32))
    with pytest.raises(st.KernelDefinitionError, match=r"parameter 'x' \(In\)"):
        @st.kernel
        def k2(x: st.In[st.f32], z: st.Out[st.f32]):
            for x in z.tiles():
                x.store(sl.full((4,), 5.0, st.f32))


def test_a_tiles_loop_cannot_bind_a_reserved_name():
    with pytest.raises(st.KernelDefinitionError, match=r"\[name\].*'tl'"):
        @st.kernel
        def k(z: st.Out[st.f32]):
            for tl in z.tiles():
                tl.store(sl.full((4,), 5.0, st.f32))


def test_a_local_bound_to_a_string_or_a_module_is_refused_before_either_backend_runs():
    @st.kernel
    def named(z: st.Out[st.f32]):
        q = "abc"
        z.store(sl.full((4,), 1.0, st.f32))

    @st.kernel
    def aliased(z: st.Out[st.f32]):
        q = sl
        z.store(sl.full((4,), 1.0, st.f32))
    for k, what in ((named, "a string"), (aliased, "a module")):
        with pytest.raises(st.KernelDefinitionError, match=rf"`q = \.\.\.` binds {what}"):
            k(st.zeros((8,)).partition((4,))).sync()


def test_a_helper_that_calls_itself_is_refused_as_recursion():
    with pytest.raises(st.KernelDefinitionError, match=r"\[call\] helper 'again' calls itself"):
        @st.function
        def again(a):
            return again(a)


def test_a_kernel_decorated_twice_is_refused_naming_its_file_and_line():
    with pytest.raises(st.KernelDefinitionError,
                       match=r"test_safety_definitions\.py:\d+: \[source\] @st.kernel decorates"):
        @st.kernel
        @st.kernel
        def k(z: st.Out[st.f32]):
            z.store(z.load())
