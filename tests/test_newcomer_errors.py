"""The mistakes a new user makes get errors that name the value, the line and what to do."""
import asyncio
import traceback
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import safetile as st
import safetile.lang as sl
from safetile import ops

from support import add

pytestmark = pytest.mark.usefixtures("cpu")


@pytest.fixture
def cpu():
    with st.backend("interpret", seed=0):
        yield


def line_of(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}"))


@st.kernel
def scale(x: st.In[st.f32], z: st.Out[st.f32], k: float):
    z.store(sl.load_like(x, z) * k)


def part(n=4):
    return st.empty((n,)).partition((2,))


# -- torch and numpy values passed where safetile values go ---------------------------------------

def test_a_torch_tensor_as_an_in_is_named_torch_tensor_and_wrapped_with_from_torch():
    with pytest.raises(st.LaunchError) as e:
        add(torch.ones(4), st.ones((4,)), part())
    text = str(e.value)
    assert "parameter 'x'" in text and "got a torch.Tensor" in text
    assert "expects an st.Tensor or st.Shared" in text and "st.from_torch(t)" in text


def test_a_torch_tensor_as_an_out_is_told_to_wrap_and_partition():
    with pytest.raises(st.LaunchError, match=r"got a torch\.Tensor; wrap it with "
                                             r"st\.from_torch\(t\)\.partition\(tile_shape\)"):
        add(st.ones((4,)), st.ones((4,)), torch.empty(4))


def test_an_unpartitioned_tensor_as_an_out_is_told_to_partition():
    with pytest.raises(st.LaunchError, match=r"expects an st\.Partition, got an st\.Tensor; "
                                             r"partition it first"):
        add(st.ones((4,)), st.ones((4,)), st.empty((4,)))


def test_a_numpy_array_is_told_to_use_from_numpy():
    with pytest.raises(st.LaunchError, match=r"got a numpy\.ndarray; copy it in with "
                                             r"st\.from_numpy\(a\)"):
        add(st.ones((4,)), np.ones(4, np.float32), part())


def test_a_python_list_is_told_to_become_a_tensor_first():
    with pytest.raises(st.LaunchError, match=r"got a list; build a tensor from it first, "
                                             r"e\.g\. st\.from_torch\(torch\.tensor\(values"):
        scale([1.0, 2.0, 3.0, 4.0], part(), 2.0)


def test_a_library_op_given_a_torch_tensor_says_the_same():
    with pytest.raises(st.ArgumentError, match=r"got a torch\.Tensor; wrap it with st\.from_torch"):
        ops.add(torch.ones(4), st.ones((4,)))
    with pytest.raises(st.ArgumentError, match=r"out: expected an st\.Tensor, got a torch\.Tensor"):
        ops.add(st.ones((4,)), st.ones((4,)), out=torch.ones(4))


# -- a Partition asked for a Tensor's methods -----------------------------------------------------

def test_a_handle_given_to_a_torch_function_is_told_to_take_a_copy_with_to_torch():
    for call in (lambda: torch.add(st.ones((4,)), 1), lambda: torch.ones(4) * st.ones((4,)),
                 lambda: torch.exp(st.ones((4,)).share())):
        with pytest.raises(st.errors.ArgumentError) as e:     # not "must be Tensor, not Tensor"
            call()
        assert "not a torch.Tensor: take a torch copy with .to_torch()" in str(e.value)
    with pytest.raises(TypeError, match=r"st.Partition.*\.unpartition\(\)\.to_torch\(\)"):
        torch.sum(part())


@pytest.mark.parametrize("expr", [lambda x: -x, lambda x: abs(x), lambda x: x < 1,
                                  lambda x: 0 >= x, lambda x: ~x])
def test_unary_operators_and_comparisons_on_a_handle_say_to_compute_in_a_kernel(expr):
    with pytest.raises(st.ArgumentError, match=r"host arithmetic.*compute on it in a kernel"):
        expr(st.ones((4,)))


@pytest.mark.parametrize("read", [bool, len, int, float, lambda x: [0, 1][x],
                                  lambda x: "yes" if x else "no"],
                         ids=["bool", "len", "int", "float", "index", "if"])
@pytest.mark.parametrize("handle", [lambda: st.ones((1,)), lambda: part(),
                                    lambda: st.ones((1,)).share()],
                         ids=["Tensor", "Partition", "Shared"])
def test_a_handle_has_no_host_value_and_says_how_to_read_one(read, handle):
    # (without a refusal, bool() of a handle was True and len() a bare TypeError)
    with pytest.raises(st.ArgumentError, match=r"has no host value .*\.shape.*to_torch\(\)"):
        read(handle())


def test_numpy_given_a_handle_says_to_take_a_numpy_copy():
    import numpy as np
    with pytest.raises(st.ArgumentError, match=r"numpy was given an st\.Tensor.*\.numpy\(\)"):
        np.asarray(st.ones((4,)))
    with pytest.raises(st.ArgumentError, match=r"\.unpartition\(\)\.numpy\(\)"):
        np.array(part())
    assert np.asarray(st.ones((4,)).numpy()).tolist() == [1.0] * 4


def test_partition_to_torch_says_to_unpartition_first():
    p = part()
    with pytest.raises(AttributeError, match=r"call \.unpartition\(\) first") as e:
        p.to_torch()
    shown = "".join(traceback.format_exception_only(e.type, e.value))
    assert "Did you mean" not in shown                       # not the private '_torch'
    assert "_torch" not in shown.replace("to_torch", "")
    assert not hasattr(p, "numpy")
    assert p.unpartition().to_torch().shape == (4,)


# -- graph.update() says what differs ------------------------------------------------------------

def test_graph_update_names_the_argument_and_the_shapes_that_differ():
    g = scale(st.ones((4,)), part(4), 2.0).graph()
    with pytest.raises(st.GraphCaptureError,
                       match=r"launch 0 \(kernel 'scale'\), argument 'x': shape \(4,\) recorded, "
                             r"\(8,\) given"):
        g.update(scale(st.ones((8,)), part(8), 2.0))


def test_graph_update_names_a_different_number_of_launches():
    g = scale(st.ones((4,)), part(), 2.0).graph()
    with pytest.raises(st.GraphCaptureError, match=r"records 1 launch\(es\) \['scale'\], the new "
                                                   r"ops 2"):
        g.update(st.zip(scale(st.ones((4,)), part(), 2.0), scale(st.ones((4,)), part(), 2.0)))


# -- sync inside a running event loop ------------------------------------------------------------

def test_sync_inside_a_running_event_loop_warns_to_await_instead():
    async def main():
        scale(st.ones((4,)), part(), 2.0).sync()  # sync-in-loop

    with pytest.warns(st.BlockingSyncWarning, match="await op") as seen:
        asyncio.run(main())
    assert (seen[0].filename, seen[0].lineno) == (__file__, line_of("sync-in-loop"))


def test_await_and_sync_outside_a_loop_do_not_warn():
    async def main():
        return await scale(st.ones((4,)), part(), 2.0)

    with warnings.catch_warnings():
        warnings.simplefilter("error", st.BlockingSyncWarning)
        asyncio.run(main())
        scale(st.ones((4,)), part(), 2.0).sync()


# -- a then / map callback of the wrong arity -----------------------------------------------------

def test_a_then_callback_of_the_wrong_arity_is_told_what_it_receives():
    x = st.ones((4,))
    with pytest.raises(st.ArgumentError) as e:
        scale(x, part(), 2.0).then(lambda x, z: scale(x, z, 3.0)).sync()
    text = str(e.value)
    assert "cannot take the 3 value(s) it receives" in text
    assert "every argument of kernel 'scale', in parameter order, scalars included (x, z, k)" in text
    assert "lambda x, z, k: ..." in text
    assert isinstance(e.value, TypeError)
    assert len(e.value.recovered) == 3 and x.to_torch().tolist() == [1, 1, 1, 1]


def test_a_map_callback_of_the_wrong_arity_is_told_what_it_receives():
    with pytest.raises(st.ArgumentError, match=r"`map` callback <lambda>\(z\) cannot take the 3"):
        scale(st.ones((4,)), part(), 2.0).map(lambda z: z).sync()


def test_a_type_error_raised_inside_a_callback_is_left_alone():
    def callback(x, z, k):
        return len(k)

    with pytest.raises(TypeError, match="has no len") as e:
        scale(st.ones((4,)), part(), 2.0).then(callback).sync()
    assert not isinstance(e.value, st.ArgumentError)


# -- errors raised while the CPU executor runs a kernel body ---------------------------------------

@st.kernel
def mismatched(x: st.In[st.f32], z: st.Out[st.f32]):
    a = x.load(z.index, (4,))
    b = x.load(z.index, (2,))
    z.store(a + b)  # broadcast-mismatch


@st.kernel
def branchy(x: st.In[st.f32], z: st.Out[st.f32]):
    t = sl.load_like(x, z)
    if t > 0:  # tile-as-bool
        z.store(t)


@st.function
def halve(t):
    return t * sl.full((2,), 0.5, st.f32)  # helper-line


@st.kernel
def calls_helper(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(halve(sl.load_like(x, z)))


def test_a_broadcasting_mismatch_names_the_kernel_line_and_how_to_fix_it():
    x = st.ones((8,))
    with pytest.raises(st.KernelDefinitionError) as e:      # the launch's type check
        mismatched(x, st.empty((8,)).partition((4,)))
    text = str(e.value)
    assert text.startswith(f"{__file__}:{line_of('broadcast-mismatch')}: [type] `a + b`")
    assert "sl.broadcast_to" in text
    assert len(e.value.recovered) == 2                       # the arguments are not lost
    assert x.to_torch().tolist() == [1.0] * 8                # nothing was moved


def test_a_tile_used_as_a_condition_names_the_line_and_suggests_sl_where():
    with pytest.raises(st.KernelDefinitionError) as e:
        branchy(st.ones((4,)), part())
    text = str(e.value)
    assert text.startswith(f"{__file__}:{line_of('tile-as-bool')}: [type] an `if` takes")
    assert "sl.where(cond, a, b)" in text


def test_an_error_in_a_helper_names_the_helpers_line():
    with pytest.raises(st.KernelDefinitionError) as e:
        calls_helper(st.ones((8,)), st.empty((8,)).partition((4,)))
    assert str(e.value).startswith(f"{__file__}:{line_of('helper-line')}: [type] ")


@st.kernel
def divide(x: st.In[st.i32], y: st.In[st.i32], z: st.Out[st.i32]):
    z.store(sl.load_like(x, z) // sl.load_like(y, z))  # divide-by-zero


def test_an_error_only_the_run_can_see_names_the_kernel_line_and_the_program():
    x = st.from_torch(torch.arange(4, dtype=torch.int32))
    with pytest.raises(st.errors.DivisionByZeroError) as e:
        divide(x, st.zeros((4,), dtype=st.i32), st.empty((4,), dtype=st.i32).partition((2,))).sync()
    assert str(e.value).startswith(f"{__file__}:{line_of('divide-by-zero')}: in kernel 'divide', "
                                   f"program ")
    assert len(e.value.recovered) == 3


def test_a_division_by_an_edge_tiles_padding_is_told_how_to_keep_those_lanes_valid():
    x, y = st.full((10,), 7, dtype=st.i32), st.full((10,), 3, dtype=st.i32)
    with pytest.raises(st.errors.DivisionByZeroError, match=r"program 1 .*padding=1.*"
                                                           r"sl\.where\(ok, b, 1\)"):
        divide(x, y, st.empty((10,), dtype=st.i32).partition((8,))).sync()


def test_a_race_keeps_its_type_and_gains_the_line_of_the_store():
    @st.kernel(unsafe=True)
    def collide(p: st.Ptr[st.f32]):
        sl.store_ptr(p, sl.arange(4), sl.full((4,), 1.0, st.f32))  # racing-store

    with pytest.raises(st.RaceError) as e:
        with st.unsafe():
            collide.options(grid=(2,))(st.zeros((4,))).sync()
    text = str(e.value)
    assert text.startswith(f"{__file__}:{line_of('racing-store')}: kernel 'collide': program ")


def test_a_constant_tile_shape_that_is_not_a_power_of_two_fails_at_definition():
    with pytest.raises(st.KernelDefinitionError) as e:
        @st.kernel
        def rows(x: st.In[st.f32, 2], z: st.Out[st.f32, 2]):
            z.store(x.load(z.index, (4, 100)))  # odd-shape
    assert e.value.rule == "tile-shape" and e.value.lineno == line_of("odd-shape")
    assert "100 (axis 1) is not a power of two" in str(e.value) and "use 64 or 128" in str(e.value)


def test_constant_shapes_from_globals_and_arithmetic_are_checked_too():
    with pytest.raises(st.KernelDefinitionError, match=r"sl.arange size 6 is not a power"):
        @st.kernel
        def ramp(z: st.Out[st.i32]):
            z.store(sl.arange(2 * 3))
    with pytest.raises(st.KernelDefinitionError, match=r"partition size 3 \(axis 0\)"):
        @st.kernel
        def sub(z: st.Out[st.f32, 2]):
            z.partition((3, 8)).store(sl.zeros((4, 8), st.f32), (0, 0))


def test_shapes_known_only_at_launch_are_left_to_the_launch():
    @st.kernel
    def window(x: st.In[st.f32], z: st.Out[st.f32], n: st.Const[int]):
        z.store(sl.zeros(z.shape, st.f32) + sl.sum(x.load(0, (n,)), 0))

    x, z, n = window(st.ones((8,)), st.empty((8,)).partition((8,)), 4).sync()
    assert z.unpartition().to_torch().tolist() == [4.0] * 8
    with pytest.raises(st.KernelDefinitionError, match=r"\[type\] load shape \(3,\).*powers of two"):
        window(st.ones((8,)), st.empty((8,)).partition((8,)), 3)


# -- a store converts to the Out's dtype (the documented rule) -------------------------------------

@st.kernel
def store_fp32(x: st.In[st.f32], z: st.Out[st.bf16]):
    z.store(sl.load_like(x, z) * 1.0)


@st.kernel
def store_cast(x: st.In[st.f32], z: st.Out[st.bf16]):
    z.store((sl.load_like(x, z) * 1.0).astype(st.bf16))


def test_a_float_tile_stored_into_a_bf16_out_rounds_as_astype_does():
    values = torch.tensor([1.00390625, 1.01171875, -3.14159265, 1e-3, 65504.0, 3e38])
    _, implicit = store_fp32(st.from_torch(values.clone()),
                             st.empty((6,), dtype=st.bf16).partition((8,))).sync()
    _, explicit = store_cast(st.from_torch(values.clone()),
                             st.empty((6,), dtype=st.bf16).partition((8,))).sync()
    implicit, explicit = implicit.unpartition().to_torch(), explicit.unpartition().to_torch()
    assert torch.equal(implicit, explicit)
    assert torch.equal(implicit, values.to(torch.bfloat16))        # round to nearest even


def test_the_store_rule_is_documented_where_stores_are():
    for doc in (st.Out.__doc__, st.Out.store.__doc__, sl.__doc__):
        doc = " ".join(doc.split())
        assert "bf16" in doc and "nearest even" in doc and "astype" in doc



# -- Triton and torch habits inside a kernel body -------------------------------------------------

def test_a_triton_or_torch_function_in_a_kernel_names_the_sl_operation_instead():
    import triton.language as tl                            # noqa: F401 (a kernel's global)
    with pytest.raises(st.KernelDefinitionError) as triton_exp:
        @st.kernel
        def exp(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(tl.exp(sl.load_like(x, z)))  # triton-exp
    with pytest.raises(st.KernelDefinitionError) as torch_exp:
        @st.kernel
        def exp(x: st.In[st.f32], z: st.Out[st.f32]):  # noqa: F811
            z.store(torch.exp(sl.load_like(x, z)))
    assert triton_exp.value.lineno == line_of("triton-exp")
    for e in (triton_exp, torch_exp):
        assert e.value.rule == "call" and "not a kernel operation; use sl.exp" in str(e.value)
        assert "@st.function" not in str(e.value)            # torch.exp cannot be decorated


def test_tritons_program_id_is_told_to_use_sl_bid():
    import triton.language as tl                            # noqa: F401 (a kernel's global)
    with pytest.raises(st.KernelDefinitionError) as triton_spelling:
        @st.kernel
        def first(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(sl.load_like(x, z) + tl.program_id(0))
    with pytest.raises(st.KernelDefinitionError) as sl_spelling:
        @st.kernel
        def first(x: st.In[st.f32], z: st.Out[st.f32]):  # noqa: F811
            z.store(sl.load_like(x, z) + sl.program_id(0))
    for e in (triton_spelling, sl_spelling):
        assert "use sl.bid(axis)" in str(e.value)


def test_tritons_keyword_spellings_are_told_the_positional_call_to_write():
    @st.kernel
    def first(x: st.In[st.f32], z: st.Out[st.f32]):
        z.store(sl.load_like(x, z) + sl.bid(axis=0))
    with pytest.raises(st.KernelDefinitionError, match=r"write `sl\.bid\(0\)`"):
        first(st.ones((4,)), part())

    @st.kernel
    def dot(a: st.In[st.f32], b: st.In[st.f32], z: st.Out[st.f32]):
        acc = sl.zeros(z.shape, st.f32)
        z.store(sl.mma(a.load((0, 0), (16, 16)), b.load((0, 0), (16, 16)), acc=acc))
    with pytest.raises(st.KernelDefinitionError, match=r"takes `acc` positionally: write "
                                                       r"`sl\.mma\(.*, acc\)`"):
        dot(st.ones((16, 16)), st.ones((16, 16)), st.empty((16, 16)).partition((16, 16)))


def test_a_helper_defined_below_its_kernel_is_told_to_come_first():
    with pytest.raises(st.KernelDefinitionError, match="name 'defined_later' is not defined "
                                                       "where the kernel is decorated.*above it"):
        @st.kernel
        def early(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(defined_later(sl.load_like(x, z)))  # noqa: F821


def test_a_helper_loading_through_views_is_told_to_take_the_tile():
    with pytest.raises(st.KernelDefinitionError, match="an @st.function helper takes tiles"):
        @st.function
        def load_helper(x, z):
            return sl.load_like(x, z)


def test_a_triton_or_torch_dtype_in_a_kernel_is_told_the_safetile_dtype():
    import triton.language as tl                            # noqa: F401 (a kernel's global)
    with pytest.raises(st.KernelDefinitionError, match="use st.float32"):
        @st.kernel
        def zeros(z: st.Out[st.f32]):
            z.store(sl.zeros(z.shape, tl.float32))
    with pytest.raises(st.KernelDefinitionError, match="use st.bfloat16"):
        @st.kernel
        def zeros(z: st.Out[st.f32]):  # noqa: F811
            z.store(sl.zeros(z.shape, torch.bfloat16))


def test_a_runtime_int_parameter_used_as_a_tile_size_is_told_to_become_a_const():
    @st.kernel
    def window(x: st.In[st.f32], z: st.Out[st.f32], BLOCK: int):
        z.store(x.load(z.index[0], (BLOCK,)))  # runtime-block

    x = st.ones((8,))
    with pytest.raises(st.KernelDefinitionError) as e:
        window(x, st.empty((8,)).partition((4,)), 4)
    assert e.value.lineno == line_of("runtime-block")
    assert "got `BLOCK`, a st.int32 scalar" in str(e.value)
    assert "declare it `BLOCK: st.Const[int]` (Triton's tl.constexpr)" in str(e.value)


def test_indexing_a_tile_by_element_says_how_to_load_or_pick_elements_instead():
    @st.kernel
    def last_column(x: st.In[st.f32, 2], z: st.Out[st.f32, 2]):
        t = x.load((z.index[0], 0), z.shape)
        z.store(t + t[:, -1][:, None])  # element-index

    with pytest.raises(st.KernelDefinitionError) as e:
        last_column(st.ones((4, 8)), st.empty((4, 8)).partition((2, 8)))
    assert e.value.lineno == line_of("element-index")
    assert "`t[:, -1]`: tiles are indexed only with `:` and None" in str(e.value)
    assert "x.load_scalar(index)" in str(e.value)
    assert "sl.sum(sl.where(sl.arange(n) == i, t, 0), 0)" in str(e.value)
