"""Definition-time rules of @st.kernel: a bad kernel fails when the decorator runs.

Each error is a KernelDefinitionError whose message starts with the file and line of the
offending code and names the rule it broke. Every bad kernel below marks its offending line
with a `# <- rule` comment; the test finds that line in this file and checks the message.
"""
import inspect

import pytest

import safetile as st
import safetile.lang as sl

THIS_FILE = inspect.getsourcefile(lambda: None)


def plain_helper(t):
    return t * 2


@st.function
def twice(t):
    return t * 2


def marked_line(marker: str) -> int:
    """The line of this file that carries the comment ``# <- marker``."""
    lines = [i for i, text in enumerate(open(THIS_FILE).read().splitlines(), 1)
             if text.rstrip().endswith(f"# <- {marker}")]
    assert len(lines) == 1, f"marker {marker!r} must occur once, found {lines}"
    return lines[0]


def assert_definition_error(excinfo, rule: str, marker: str):
    e = excinfo.value
    line = marked_line(marker)
    assert e.rule == rule
    assert e.filename == THIS_FILE
    assert e.lineno == line
    assert str(e).startswith(f"{THIS_FILE}:{line}: [{rule}]")


def test_store_through_an_in_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            x.store(z.load())  # <- store-through-in
    assert_definition_error(ei, "in-read-only", "store-through-in")
    assert "read-only" in str(ei.value)


def test_indexed_assignment_to_an_in_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            x[0] = 1.0  # <- subscript-store-in
    assert_definition_error(ei, "in-read-only", "subscript-store-in")


def test_subscript_store_into_an_out_is_a_free_index_store():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            z[0] = sl.load_like(x, z)  # <- subscript-store-out
    assert_definition_error(ei, "free-index-store", "subscript-store-out")
    assert "z.partition(shape).store(tile, sub_index)" in str(ei.value)


def test_store_with_an_index_is_a_free_index_store():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(sl.load_like(x, z), (0,))  # <- store-with-index
    assert_definition_error(ei, "free-index-store", "store-with-index")


def test_sub_partition_store_needs_its_sub_index():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            sub = z.partition((4,))
            sub.store(x.load((0,), (4,)))  # <- sub-store-no-index
    assert_definition_error(ei, "free-index-store", "sub-store-no-index")


def sub_partition_in_a_tuple():
    @st.kernel
    def bad(z: st.Out[st.f32]):
        a, b = z.partition((2,)), 1  # <- sub-in-tuple
        z.store(1.0)


def sub_partition_in_a_list():
    @st.kernel
    def bad(z: st.Out[st.f32]):
        c = [z.partition((2,)), 1]  # <- sub-in-list
        z.store(1.0)


def sub_partition_as_an_argument():
    @st.kernel
    def bad(z: st.Out[st.f32]):
        z.store(sl.maximum(z.partition((2,)), 1.0))  # <- sub-as-argument


@pytest.mark.parametrize("define,marker", [(sub_partition_in_a_tuple, "sub-in-tuple"),
                                           (sub_partition_in_a_list, "sub-in-list"),
                                           (sub_partition_as_an_argument, "sub-as-argument")])
def test_a_sub_partition_outside_a_one_name_binding_or_an_inline_store_is_rejected(define,
                                                                                     marker):
    with pytest.raises(st.KernelDefinitionError) as ei:
        define()
    assert_definition_error(ei, "statement", marker)


def test_an_unknown_attribute_of_an_inline_sub_partition_names_it():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(z: st.Out[st.f32]):
            z.store(z.partition((2,)).grid)  # <- inline-sub-attribute
    assert_definition_error(ei, "call", "inline-sub-attribute")
    assert "'z.partition((2,))' (sub) has no attribute 'grid'" in str(ei.value)


def test_assignment_to_a_parameter_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32], n: int):
            n = n + 1  # <- assign-param
            z.store(sl.load_like(x, z))
    assert_definition_error(ei, "param-assignment", "assign-param")
    assert "'n'" in str(ei.value)


def test_augmented_assignment_to_a_parameter_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32], n: int):
            n += 1  # <- augassign-param
            z.store(sl.load_like(x, z))
    assert_definition_error(ei, "param-assignment", "augassign-param")


def test_unknown_annotation_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32],
                z: list):  # <- unknown-annotation
            pass
    assert_definition_error(ei, "annotation", "unknown-annotation")
    assert "st.In[dtype]" in str(ei.value)


def test_missing_annotation_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32],
                z):  # <- missing-annotation
            pass
    assert_definition_error(ei, "annotation", "missing-annotation")


def test_in_without_dtype_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In,  # <- bare-in
                z: st.Out[st.f32]):
            pass
    assert_definition_error(ei, "annotation", "bare-in")
    assert "st.In[st.f32]" in str(ei.value)


def test_in_of_a_python_type_is_a_definition_error_naming_the_parameter():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[int],  # <- in-of-int
                z: st.Out[st.f32]):
            pass
    assert_definition_error(ei, "annotation", "in-of-int")
    assert "parameter 'x'" in str(ei.value)


def test_const_of_an_unsupported_type_is_a_definition_error():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32],
                n: st.Const[str]):  # <- const-of-str
            pass
    assert_definition_error(ei, "annotation", "const-of-str")
    assert "st.Const takes int, float, bool or st.dtype" in str(ei.value)


def test_a_const_union_with_an_unsupported_kind_is_a_definition_error():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(z: st.Out[st.f32],
                n: st.Const[int | str]):  # <- const-union-of-str
            pass
    assert_definition_error(ei, "annotation", "const-union-of-str")
    assert "parameter 'n'" in str(ei.value)
    assert "got int | str (str is none of them)" in str(ei.value)


def test_a_rank_that_is_not_a_positive_int_is_a_definition_error():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32, 0],  # <- rank-zero
                z: st.Out[st.f32]):
            pass
    assert_definition_error(ei, "annotation", "rank-zero")


@pytest.mark.parametrize("spec", [("sub", (st.f32,)), ("In", ()), ("Out", (st.f32,), 0),
                                  ("Const", (), None, (str,)), ("int", (st.f32,))])
def test_a_parameter_spec_built_by_hand_is_a_definition_error(spec):
    hand_made = type(st.In[st.f32])(*spec)
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(z: st.Out[st.f32], s: hand_made):  # <- hand-made-spec
            z.store(1.0)
    assert_definition_error(ei, "annotation", "hand-made-spec")
    assert "not made by st.In" in str(ei.value)


def test_ptr_parameter_in_a_safe_kernel_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(p: st.Ptr[st.f32],  # <- ptr-in-safe
                z: st.Out[st.f32]):
            pass
    assert_definition_error(ei, "ptr-needs-unsafe", "ptr-in-safe")
    assert "unsafe=True" in str(ei.value)


def test_atomic_in_a_safe_kernel_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            sl.atomic_add(x, sl.arange(4), 1.0)  # <- atomic-in-safe
    assert_definition_error(ei, "atomic-needs-unsafe", "atomic-in-safe")


def test_store_ptr_in_a_safe_kernel_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            sl.store_ptr(x, sl.arange(4), 1.0)  # <- store-ptr-in-safe
    assert_definition_error(ei, "unsafe-op", "store-ptr-in-safe")


def test_calling_a_plain_python_function_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(plain_helper(sl.load_like(x, z)))  # <- plain-call
    assert_definition_error(ei, "call", "plain-call")
    assert "@st.function" in str(ei.value)


def test_calling_a_python_builtin_outside_the_language_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            print(x.shape[0])  # <- builtin-call
            z.store(sl.load_like(x, z))
    assert_definition_error(ei, "call", "builtin-call")


def test_calling_an_st_function_is_accepted():
    @st.kernel
    def good(x: st.In[st.f32], z: st.Out[st.f32]):
        z.store(twice(sl.load_like(x, z)))
    assert twice in good._info.functions


def test_safe_kernel_without_an_out_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32],  # <- no-out
                y: st.In[st.f32]):
            t = x.load((0,), (4,))
    assert_definition_error(ei, "no-out", "no-out")
    assert "st.Out" in str(ei.value)


def test_while_loop_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            while True:  # <- while
                pass
    assert_definition_error(ei, "statement", "while")


def test_unknown_name_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(sl.load_like(x, z) * undefined_scale)  # noqa: F821  # <- unknown-name
    assert_definition_error(ei, "name", "unknown-name")


def test_unknown_sl_operation_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(sl.softplus(sl.load_like(x, z)))  # <- unknown-sl-op
    assert_definition_error(ei, "call", "unknown-sl-op")
    assert "`sl.softplus` does not exist in safetile.lang" in str(ei.value)


def test_st_function_body_is_checked_too():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.function
        def bad(t):
            return plain_helper(t)  # <- function-body
    assert_definition_error(ei, "call", "function-body")


def test_a_kernel_defined_in_a_nested_function_reports_its_own_line():
    def make():
        @st.kernel
        def inner(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(plain_helper(sl.load_like(x, z)))  # <- nested-def
    with pytest.raises(st.KernelDefinitionError) as ei:
        make()
    assert_definition_error(ei, "call", "nested-def")


def test_arange_written_as_tritons_start_and_end_is_rejected_naming_the_difference():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(z: st.Out[st.i32]):
            z.store(sl.arange(0, 4))  # <- arange-start-end
    assert_definition_error(ei, "call", "arange-start-end")
    assert "unlike tl.arange(start, end)" in str(ei.value)


def test_a_store_used_as_a_value_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            stored = z.store(sl.load_like(x, z))  # <- store-as-value
    assert_definition_error(ei, "statement", "store-as-value")
    assert "a store is a statement of its own" in str(ei.value)


def test_a_sub_partition_that_is_neither_bound_nor_stored_through_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            z.partition((4,))  # <- bare-partition
            z.store(sl.load_like(x, z))
    assert_definition_error(ei, "statement", "bare-partition")


@st.kernel
def copy_kernel(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z))


@pytest.mark.parametrize("stages", [0, 65, 2**31])
def test_num_stages_outside_one_to_64_is_an_argument_error(stages):
    with pytest.raises(st.ArgumentError, match=r"num_stages must be an int in \[1, 64\]"):
        copy_kernel.options(num_stages=stages)


def test_compile_for_a_target_that_is_not_a_gpu_target_is_an_argument_error():
    @st.kernel
    def copy(x: st.In[st.f32], z: st.Out[st.f32]):
        z.store(sl.load_like(x, z))
    args = (st.zeros((8,), device="cpu"), st.empty((8,), device="cpu").partition((8,)))
    with pytest.raises(st.ArgumentError, match="target must be a triton GPUTarget"):
        copy.compile(*args, target="sm_80")


def test_slicing_a_tile_with_bounds_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32, 2], z: st.Out[st.f32, 2]):
            t = sl.load_like(x, z)
            z.store(t[:, :1])  # <- tile-slice
    assert_definition_error(ei, "tile-slice", "tile-slice")


def test_adding_axes_with_none_and_colon_is_allowed():
    @st.kernel
    def good(x: st.In[st.f32], z: st.Out[st.f32, 2]):
        row = x.load(z.index[1], z.shape[1])
        z.store(sl.broadcast_to(row[None, :], z.shape))
    assert good.name == "good"


def test_comprehensions_and_lambdas_are_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            parts = [sl.load_like(x, z) for _ in range(2)]  # <- comprehension
            z.store(parts[0])
    assert_definition_error(ei, "expression", "comprehension")


def test_walrus_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store((t := sl.load_like(x, z)) * t)  # <- walrus
    assert_definition_error(ei, "expression", "walrus")


def test_a_sub_partition_bound_in_two_branches_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(z: st.Out[st.f32], wide: st.Const[bool], flag: int):
            if flag > 0:
                s = z.partition((16,))
            else:
                s = z.partition((32,))  # <- sub-rebound
            s.store(sl.zeros((16,), st.f32), (0,))
    assert_definition_error(ei, "view-rebinding", "sub-rebound")


def test_a_tile_assigned_over_a_view_name_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(z: st.Out[st.f32]):
            s = z.partition((16,))
            s = sl.zeros((16,), st.f32)  # <- view-overwritten
            z.store(s)
    assert_definition_error(ei, "view-rebinding", "view-overwritten")


def test_a_bare_annotation_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            t: int  # <- bare-annotation
            z.store(sl.load_like(x, z))
    assert_definition_error(ei, "statement", "bare-annotation")


def test_a_view_hidden_in_a_tuple_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            pair = (z, x)  # <- view-in-tuple
            z.store(sl.load_like(x, z))
    assert_definition_error(ei, "view-value", "view-in-tuple")


def test_a_view_passed_to_a_helper_by_keyword_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(twice(t=x))  # <- view-keyword
    assert_definition_error(ei, "view-value", "view-keyword")


def test_load_like_takes_an_in_then_an_out():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(sl.load_like(z, x))  # <- load-like-order
    assert_definition_error(ei, "call", "load-like-order")
