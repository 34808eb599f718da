"""Habits from Triton, torch and Python meet errors that say what safetile takes instead."""
import pathlib

import pytest
import torch

import safetile as st
import safetile.lang as sl

import support
from support import add

cpu_executor = support.cpu_executor(seed=0)


@st.kernel
def scale(x: st.In[st.f32], z: st.Out[st.f32], k: float):
    z.store(sl.load_like(x, z) * k)


@st.kernel
def window(x: st.In[st.f32], z: st.Out[st.f32], BLOCK: st.Const[int]):
    z.store(x.load(z.index, (BLOCK,)))


@st.kernel(unsafe=True)
def bump(counts: st.Ptr[st.i32]):
    sl.atomic_add(counts, sl.arange(4), 1)


def part(n=4):
    return st.empty((n,)).partition((2,))


# -- launching ---------------------------------------------------------------------------------

def test_tritons_grid_subscript_is_told_the_grid_is_the_out_partition():
    with pytest.raises(st.LaunchError) as e:
        add[(2,)]
    text = str(e.value)
    assert "kernel 'add'" in text and "is launched by calling it, add(...)" in text
    assert "not with Triton's add[grid](...)" in text and ".partition(tile_shape)" in text


def test_a_grid_subscript_on_a_kernel_without_out_names_the_grid_option():
    with pytest.raises(st.LaunchError, match=r"give the grid as bump\.options\(grid=\(n,\)\)"):
        bump[(1,)]


# -- st.unsafe without its parentheses ---------------------------------------------------------

def test_with_st_unsafe_without_parentheses_says_to_call_it():
    with pytest.raises(st.UnsafeError) as e:
        with st.unsafe:
            pass
    assert "`with st.unsafe:` opens no block" in str(e.value)
    assert "`with st.unsafe():`" in str(e.value)


def test_st_unsafe_as_a_bare_decorator_says_to_call_it_and_where_unsafe_kernels_come_from():
    with pytest.raises(st.UnsafeError) as e:
        @st.unsafe
        def launch_all():
            pass
    assert "st.unsafe() takes no arguments" in str(e.value)
    assert "`@st.unsafe()`" in str(e.value) and "@st.kernel(unsafe=True)" in str(e.value)


def test_st_unsafe_with_parentheses_still_marks_a_launch():
    with st.unsafe():
        (counts,) = bump.options(grid=(1,))(st.zeros((4,), dtype=st.i32)).sync()
    assert counts.to_torch().tolist() == [1, 1, 1, 1]


# -- a Shared value asked for a Tensor's methods -----------------------------------------------

def test_a_shared_value_asked_to_partition_is_told_try_partition():
    with pytest.raises(AttributeError) as e:
        st.ones((4,)).share().partition((2,))
    assert ".try_partition(tile_shape)" in str(e.value) and "read-only" in str(e.value)


def test_a_shared_value_asked_for_a_view_is_told_to_unwrap_it_first():
    with pytest.raises(AttributeError, match=r"\.try_unwrap\(\).*then call \.view\(\) on it"):
        st.ones((4,)).share().view((2, 2))


def test_a_shared_value_lacking_another_name_says_only_that():
    with pytest.raises(AttributeError) as e:
        st.ones((4,)).share().sizes
    assert str(e.value) == "'Shared' object has no attribute 'sizes'"


# -- Python builtins in a kernel body ----------------------------------------------------------

def test_print_in_a_kernel_says_to_store_the_values_into_an_out():
    with pytest.raises(st.KernelDefinitionError) as e:
        @st.kernel
        def show(x: st.In[st.f32], z: st.Out[st.f32]):
            print(sl.load_like(x, z))
    assert e.value.rule == "call" and "Python builtin 'print'" in str(e.value)
    assert "store the values into an Out and read them on the host" in str(e.value)


def test_int_in_a_kernel_says_to_convert_with_astype():
    with pytest.raises(st.KernelDefinitionError, match=r"'int'.*\.astype\(st\.i32\)"):
        @st.kernel
        def truncate(x: st.In[st.f32], z: st.Out[st.i32]):
            z.store(int(sl.load_like(x, z)))


def test_builtin_max_of_one_tile_names_the_reduction():
    @st.kernel
    def peak(x: st.In[st.f32], z: st.Out[st.f32]):
        z.store(sl.load_like(x, z) * max(sl.load_like(x, z)))

    with pytest.raises(st.KernelDefinitionError, match=r"max\(\) takes two or more values .*"
                                                       r"the largest element of a tile is "
                                                       r"sl\.max\(t, axis\)"):
        peak(st.ones((4,)), part())


def test_the_builtins_a_body_may_call_are_listed_in_the_language_docstring():
    doc = " ".join(sl.__doc__.split())
    assert "``min``, ``max`` and ``abs`` (element-wise on tiles" in doc and "``float``" in doc


# -- scalar parameters given something else ----------------------------------------------------

def test_a_torch_scalar_for_a_float_parameter_is_told_to_pass_its_item():
    with pytest.raises(st.LaunchError) as e:
        scale(st.ones((4,)), part(), torch.tensor(2.0))
    assert "parameter 'k': expects a float, got torch.Tensor tensor(2.)" in str(e.value)
    assert "t.item()" in str(e.value)


def test_a_tensor_for_a_scalar_parameter_is_told_to_declare_an_in():
    with pytest.raises(st.LaunchError) as e:
        scale(st.ones((4,)), part(), st.ones((1,)))
    assert "got st.Tensor" in str(e.value) and "declare this parameter st.In[dtype]" in str(e.value)


def test_a_whole_float_for_a_const_int_is_told_the_int_to_pass():
    with pytest.raises(st.LaunchError, match=r"'BLOCK': st\.Const\[int\] got float 2\.0; "
                                             r"pass the int 2$"):
        window(st.ones((4,)), part(), 2.0)


# -- tile coordinates --------------------------------------------------------------------------

def test_an_index_axis_past_the_outs_rank_names_the_entries_it_has():
    @st.kernel
    def second_axis(x: st.In[st.f32], z: st.Out[st.f32]):
        z.store(x.load((z.index[1],), z.shape))

    with pytest.raises(st.KernelDefinitionError) as e:
        second_axis(st.ones((4,)), part())
    assert "`z.index[1]`: index 1 is out of range: `z.index` has 1 entry, one per axis of 'z'" \
        in str(e.value)


def test_arithmetic_on_the_whole_index_tuple_says_to_compute_on_its_entries():
    @st.kernel
    def shifted(x: st.In[st.f32], z: st.Out[st.f32]):
        z.store(x.load(z.index + 1, z.shape))

    with pytest.raises(st.KernelDefinitionError) as e:
        shifted(st.ones((4,)), part())
    assert "`z.index` is a tuple of 1, not an operand" in str(e.value)
    assert "compute on its entries (`z.index[0] + 1`)" in str(e.value)


def test_a_stored_tile_of_the_wrong_shape_names_the_out_and_both_shapes():
    @st.kernel
    def transposed(x: st.In[st.f32, 2], z: st.Out[st.f32, 2]):
        z.store(x.load(z.index, z.shape).T)

    with pytest.raises(st.KernelDefinitionError) as e:
        transposed(st.ones((4, 4)), st.empty((4, 4)).partition((4, 2)))
    assert "`x.load(z.index, z.shape).T`: a tile of shape (2, 4) cannot be stored into the " \
           "owned tile of Out 'z', of shape (4, 2)" in str(e.value)


# -- kernels and helpers --------------------------------------------------------------------------

def test_a_kernel_called_from_a_kernel_body_is_told_kernels_launch_from_the_host():
    with pytest.raises(st.KernelDefinitionError) as e:
        @st.kernel
        def twice(x: st.In[st.f32], z: st.Out[st.f32]):
            add(x, x, z)
    assert "'add' is an @st.kernel: kernels are launched from the host" in str(e.value)
    assert "@st.function helper" in str(e.value) and "decorate it" not in str(e.value)


# -- an op asked for its output, or passed on, before it has run -------------------------------

def running_add():
    return add(st.ones((4,)), st.ones((4,)), part())


@pytest.mark.parametrize("name", ["result", "wait", "run", "get", "value", "output",
                                  "block_until_ready"])
def test_a_futures_name_on_an_op_says_the_output_comes_from_sync(name):
    op = running_add()
    with pytest.raises(AttributeError) as e:
        getattr(op, name)
    text = str(e.value)
    assert f"'KernelOp' object has no attribute '{name}'" in text
    assert "take the output from op.sync()" in text and "`x, y, z = op.sync()`" in text
    assert "`x, y, z = await op` in a coroutine" in text and "st.submit(op)" in text
    op.sync()


def test_a_chained_op_asked_for_its_result_names_its_own_type():
    op = running_add().then(lambda x, y, z: add(x, y, z))
    with pytest.raises(AttributeError, match=r"^'ThenOp' object has no attribute 'result'.*"
                                             r"op\.sync\(\)"):
        op.result()
    op.sync()


def test_another_missing_name_on_an_op_stays_a_plain_attribute_error():
    op = running_add()
    with pytest.raises(AttributeError) as e:
        op.sizes
    assert str(e.value) == "'KernelOp' object has no attribute 'sizes'"
    op.sync()


def test_an_unrun_op_passed_to_a_kernel_says_to_pass_its_output_or_chain_with_then():
    op = running_add()
    with pytest.raises(st.LaunchError) as e:
        add(op.last(), st.ones((4,)), part())
    text = str(e.value)
    assert "parameter 'x'" in text and "got an op that has not run (a safetile.MapOp)" in text
    assert "pass what op.sync() returns" in text and "`x, y, z = op.sync()`" in text
    assert "op.then(add) (its output values become add's arguments)" in text
    op.sync()


def test_an_unrun_op_for_a_scalar_parameter_says_to_pass_its_output():
    op = running_add()
    with pytest.raises(st.LaunchError) as e:
        scale(st.ones((4,)), part(), op)
    text = str(e.value)
    assert "parameter 'k': expects a float, got an op that has not run (a safetile.KernelOp)" \
        in text
    assert "pass what op.sync() returns" in text and "op.then(scale)" in text
    op.sync()


def test_an_unrun_op_given_to_a_library_op_says_to_pass_its_output():
    op = running_add()
    with pytest.raises(st.ArgumentError) as e:
        st.ops.softmax(op.last())
    text = str(e.value)
    assert "ops.softmax: x: expected an st.Tensor or st.Shared, got an op that has not run" in text
    assert "pass what op.sync() returns" in text and "op.then(lambda *values: ...)" in text
    op.sync()


def test_the_guide_runs_a_kernel_by_unpacking_every_argument():
    guide = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    assert "x, y, z = add(x, y, z).sync()" in guide
    assert "'tuple' object has no attribute 'unpartition'" in guide
