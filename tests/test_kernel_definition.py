"""Definition-time rules of @st.kernel: a bad kernel fails when the decorator runs.

Each error is a KernelDefinitionError whose message starts with the file and line of the
offending code and names the rule it broke. Every bad kernel below marks its offending line
with a `# <- rule` comment; the test finds that line in this file and checks the message.
"""
import inspect

import pytest
import torch

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


def test_a_rank_that_is_not_a_positive_int_is_a_definition_error():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32, 0],  # <- rank-zero
                z: st.Out[st.f32]):
            pass
    assert_definition_error(ei, "annotation", "rank-zero")


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


@st.kernel(unsafe=True)
def scatter_ones(p: st.Ptr[st.f32], n: int):
    offs = sl.arange(8)
    sl.store_ptr(p, offs, sl.full((8,), 1.0, st.f32), mask=offs < n)


def test_unsafe_kernel_launch_outside_unsafe_block_raises_unsafe_error():
    buf = st.zeros((8,), device="cpu")
    with st.backend("interpret"), pytest.raises(st.UnsafeError, match=r"with st.unsafe\(\)"):
        scatter_ones.options(grid=(1,))(buf, 5)
    # nothing was moved: the buffer is still usable
    assert buf.to_torch().sum().item() == 0


def test_unsafe_kernel_runs_inside_unsafe_block():
    buf = st.zeros((8,), device="cpu")
    with st.backend("interpret"), st.unsafe():
        op = scatter_ones.options(grid=(1,))(buf, 5)
    buf, n = op.sync()
    assert n == 5
    assert torch.equal(buf.to_torch(), torch.tensor([1.0] * 5 + [0.0] * 3))


def test_a_generator_suspended_inside_an_unsafe_block_does_not_mark_its_caller():
    def inside():
        with st.unsafe():
            yield
    suspended = inside()
    next(suspended)                            # suspended inside its block
    buf = st.zeros((8,), device="cpu")
    with st.backend("interpret"), pytest.raises(st.UnsafeError):
        scatter_ones.options(grid=(1,))(buf, 5)
    suspended.close()


def test_blocks_closed_out_of_order_leave_nothing_marked():
    def inside():
        with st.unsafe():
            yield
    suspended = inside()
    with st.unsafe():
        next(suspended)                        # the generator's block opens inside ours
    suspended.close()                          # and closes after it
    with st.backend("interpret"), pytest.raises(st.UnsafeError):
        scatter_ones.options(grid=(1,))(st.zeros((8,), device="cpu"), 5)


def test_an_unsafe_block_may_be_entered_through_a_wrapper_or_as_a_decorator():
    import contextlib

    @contextlib.contextmanager
    def allowed():
        with st.unsafe():
            yield

    @st.unsafe()
    def decorated(buf):
        return scatter_ones.options(grid=(1,))(buf, 5)
    with st.backend("interpret"):
        with allowed():
            scatter_ones.options(grid=(1,))(st.zeros((8,), device="cpu"), 5).sync()
        with contextlib.ExitStack() as stack:
            stack.enter_context(st.unsafe())
            scatter_ones.options(grid=(1,))(st.zeros((8,), device="cpu"), 5).sync()
        buf, _ = decorated(st.zeros((8,), device="cpu")).sync()
    assert buf.to_torch().sum().item() == 5


def test_one_unsafe_object_entered_twice_marks_each_block_and_nothing_after():
    allowed = st.unsafe()
    with st.backend("interpret"):
        with allowed:
            with allowed:
                scatter_ones.options(grid=(1,))(st.zeros((8,), device="cpu"), 5).sync()
            scatter_ones.options(grid=(1,))(st.zeros((8,), device="cpu"), 5).sync()
        with pytest.raises(st.UnsafeError):
            scatter_ones.options(grid=(1,))(st.zeros((8,), device="cpu"), 5)


def test_one_unsafe_object_closed_out_of_order_closes_each_entrys_own_block():
    allowed = st.unsafe()

    def inside():
        with allowed:
            yield
            yield scatter_ones.options(grid=(1,))(st.zeros((8,), device="cpu"), 5).sync()
    first, second = inside(), inside()
    next(first), next(second)
    first.close()                                # the first entry ends before the second's
    with st.backend("interpret"):
        buf, _ = next(second)                    # still inside its own block
    second.close()
    assert buf.to_torch().sum().item() == 5


def test_one_unsafe_object_shared_by_threads_marks_only_each_threads_block():
    import threading
    allowed, entered, leave, seen = st.unsafe(), threading.Event(), threading.Event(), []

    def block_then_launch():
        with st.backend("interpret"):
            try:
                with allowed:
                    entered.set()
                    leave.wait(5)
                scatter_ones.options(grid=(1,))(st.zeros((8,), device="cpu"), 5)
                seen.append("launched after its block")
            except Exception as e:
                seen.append(type(e).__name__)
    other = threading.Thread(target=block_then_launch)
    other.start()
    entered.wait(5)
    with allowed:
        pass                                     # this thread's entry, closed first
    leave.set()
    other.join()
    assert seen == ["UnsafeError"]


def test_a_graph_of_unsafe_kernels_is_replayed_only_inside_an_unsafe_block():
    buf = st.zeros((8,), device="cpu")
    with st.backend("interpret"), st.unsafe():
        g = scatter_ones.options(grid=(1,))(buf, 5).graph()
        g.launch().sync()
    with st.backend("interpret"), pytest.raises(st.UnsafeError, match="replays unsafe=True"):
        g.launch()


@pytest.mark.parametrize("stages", [0, 65, 2**31])
def test_num_stages_outside_one_to_64_is_an_argument_error(stages):
    with pytest.raises(st.ArgumentError, match=r"num_stages must be an int in \[1, 64\]"):
        scatter_ones.options(num_stages=stages)


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
