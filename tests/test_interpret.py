"""The CPU executor: seeded shuffled program order, bounds checks and race detection.

Unsafe kernels can write anywhere through a raw pointer, so they are how these tests provoke
what safe kernels cannot express: two programs writing one element, one program reading
another's write, and accesses outside a tensor.
"""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import safetile as st
import safetile.lang as sl

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def zeros(n, dtype=st.f32):
    return st.zeros((n,), dtype=dtype, device="cpu")


def run_unsafe(kernel, *args, seed=0, grid):
    with st.backend("interpret", seed=seed), st.unsafe():
        return kernel.options(grid=grid)(*args).sync()


@st.kernel(unsafe=True)
def record_order(counter: st.Ptr[st.i32], order: st.Ptr[st.i32]):
    ticket = sl.atomic_add(counter, sl.zeros((1,), st.i32), 1)
    sl.store_ptr(order, sl.zeros((1,), st.i32) + sl.bid(0), ticket)


def program_order(seed: int, n: int = 16) -> list[int]:
    """The position at which each program ran, as recorded by the kernel itself."""
    _, order = run_unsafe(record_order, zeros(1, st.i32), zeros(n, st.i32), seed=seed, grid=(n,))
    return order.to_torch().tolist()


def test_programs_run_in_a_shuffled_order():
    ran_at = program_order(seed=0)
    assert sorted(ran_at) == list(range(16))          # every program ran exactly once
    assert ran_at != list(range(16))


def test_program_order_depends_on_the_seed():
    assert program_order(seed=0) != program_order(seed=1)


def test_the_same_seed_gives_the_same_order():
    assert program_order(seed=5) == program_order(seed=5)


# ---- bounds -------------------------------------------------------------------------------------

@st.kernel(unsafe=True)
def read_past_the_end(p: st.Ptr[st.f32], q: st.Ptr[st.f32], n: int):
    offs = sl.bid(0) * 8 + sl.arange(8)
    sl.store_ptr(q, offs, sl.load_ptr(p, offs + n))


@pytest.mark.parametrize("seed", ["3", 1.5, None, True, [1]])
def test_a_seed_that_is_not_an_int_is_refused_when_the_backend_is_chosen(seed):
    with pytest.raises(st.ArgumentError,
                       match=r"seed \(the CPU executor.s program order\) must be an int"):
        with st.backend("interpret", seed=seed):
            pass
    with pytest.raises(st.ArgumentError,
                       match=r"seed \(the CPU executor.s program order\) must be an int"):
        st.set_backend("interpret", seed=seed)


def test_a_numpy_integer_seed_orders_programs_as_the_same_int():
    assert program_order(np.int64(5)) == program_order(5)


def test_out_of_bounds_pointer_load_names_kernel_program_and_offset():
    with pytest.raises(st.OutOfBoundsError) as ei:
        run_unsafe(read_past_the_end, zeros(16), zeros(16), 3, grid=(2,))
    msg = str(ei.value)
    assert "kernel 'read_past_the_end'" in msg
    assert "program 1" in msg                          # program 0 reads 3..10, in bounds
    assert "element offset 16" in msg and "'p'" in msg


def test_masked_off_lanes_are_not_bounds_checked():
    @st.kernel(unsafe=True)
    def masked_tail(p: st.Ptr[st.f32], n: int):
        offs = sl.arange(16)
        sl.store_ptr(p, offs, sl.full((16,), 1.0, st.f32), mask=offs < n)

    p, _ = run_unsafe(masked_tail, zeros(10), 10, grid=(1,))
    assert torch.equal(p.to_torch(), torch.ones(10))


@st.kernel(unsafe=True)
def store_past_the_end(p: st.Ptr[st.f32]):
    sl.store_ptr(p, sl.arange(8) + sl.bid(0) * 8 - 4, sl.full((8,), 1.0, st.f32))


def test_out_of_bounds_pointer_store_is_caught_before_it_writes():
    p = zeros(16)
    with pytest.raises(st.OutOfBoundsError, match=r"program 0.*element offset -4"):
        run_unsafe(store_past_the_end, p, grid=(2,))


# ---- races --------------------------------------------------------------------------------------

@st.kernel(unsafe=True)
def all_write_element_0(p: st.Ptr[st.f32]):
    sl.store_ptr(p, sl.zeros((1,), st.i32), sl.full((1,), 1.0, st.f32) * sl.bid(0))


def racing_programs(seed: int) -> str:
    with pytest.raises(st.RaceError) as ei:
        run_unsafe(all_write_element_0, zeros(4), seed=seed, grid=(8,))
    return str(ei.value)


def test_two_programs_writing_one_element_raise_race_error():
    msg = racing_programs(seed=0)
    assert "kernel 'all_write_element_0'" in msg
    assert "element (0,) of 'p'" in msg
    assert msg.count("program ") == 2                   # both programs are named


def test_the_programs_named_by_a_race_depend_on_the_seed():
    assert len({racing_programs(seed) for seed in range(4)}) > 1


@st.kernel(unsafe=True)
def read_neighbour(p: st.Ptr[st.f32], q: st.Ptr[st.f32], n: int):
    me = sl.zeros((1,), st.i32) + sl.bid(0)
    sl.store_ptr(p, me, sl.full((1,), 1.0, st.f32))
    sl.store_ptr(q, me, sl.load_ptr(p, (me + 1) % n))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reading_an_element_another_program_writes_raises_race_error(seed):
    # Whichever program runs first, the read and the write of one element by two programs
    # meet: a read after the write, or a write after the read.
    with pytest.raises(st.RaceError) as ei:
        run_unsafe(read_neighbour, zeros(4), zeros(4), 4, seed=seed, grid=(4,))
    msg = str(ei.value)
    assert "kernel 'read_neighbour'" in msg and "of 'p'" in msg
    assert msg.count("program ") == 2


@st.kernel(unsafe=True)
def own_elements(p: st.Ptr[st.f32]):
    offs = sl.bid(0) * 4 + sl.arange(4)
    sl.store_ptr(p, offs, sl.load_ptr(p, offs) + 1.0)
    sl.store_ptr(p, offs, sl.load_ptr(p, offs) * 3.0)


def test_a_program_may_reread_and_rewrite_its_own_elements():
    p, = run_unsafe(own_elements, zeros(16), grid=(4,))
    assert torch.equal(p.to_torch(), torch.full((16,), 3.0))


@st.kernel(unsafe=True)
def count_into_one_cell(p: st.Ptr[st.f32]):
    sl.atomic_add(p, sl.zeros((4,), st.i32), sl.full((4,), 1.0, st.f32))


def test_atomic_updates_of_one_element_are_not_a_race():
    p, = run_unsafe(count_into_one_cell, zeros(1), grid=(5,))
    assert p.to_torch().item() == 20.0


@st.kernel(unsafe=True)
def read_while_another_counts(p: st.Ptr[st.f32], out: st.Ptr[st.f32]):
    if sl.bid(0) == 0:
        sl.store_ptr(out, sl.arange(1), sl.load_ptr(p, sl.arange(1)))
    else:
        sl.atomic_add(p, sl.arange(1), sl.full((1,), 1.0, st.f32))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_read_of_an_element_another_program_updates_atomically_is_a_race_in_any_order(seed):
    with pytest.raises(st.RaceError, match=r"program [01] (reads|atomically updates) element "
                                           r"\(0,\) of 'p'.*program [01] also "
                                           r"(atomically updates|reads) it"):
        run_unsafe(read_while_another_counts, zeros(4), zeros(1), seed=seed, grid=(2,))


@st.kernel(unsafe=True)
def count_then_read_back(p: st.Ptr[st.f32], out: st.Ptr[st.f32]):
    sl.atomic_add(p, sl.arange(1), sl.full((1,), 1.0, st.f32))
    sl.store_ptr(out, sl.arange(1), sl.load_ptr(p, sl.arange(1)))


def test_a_program_may_read_back_its_own_atomic_update():
    p, out = run_unsafe(count_then_read_back, zeros(4), zeros(1), grid=(1,))
    assert out.to_torch().tolist() == [1.0]


# ---- safe kernels never race ------------------------------------------------------------------

def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", range(4))
def test_example_kernels_give_identical_results_under_any_program_order(seed):
    add = load_example("01_vector_add").add
    softmax = load_example("02_softmax").softmax
    matmul = load_example("03_matmul").matmul
    x, y = st.randn((300,), device="cpu", seed=1), st.randn((300,), device="cpu", seed=2)
    a, b = st.randn((40, 24), device="cpu", seed=3), st.randn((24, 36), device="cpu", seed=4)
    m = st.randn((9, 20), device="cpu", seed=5)
    with st.backend("interpret", seed=seed):
        *_, z = add(x, y, st.empty((300,), device="cpu").partition((64,))).sync()
        _, s = softmax(m, st.empty((9, 20), device="cpu").partition((2, 32))).sync()
        *_, c, _ = matmul(a, b, st.empty((40, 36), device="cpu").partition(
            (16, 16), order="grouped", group_size=2), 16).sync()
    assert torch.equal(z.unpartition().to_torch(), x.to_torch() + y.to_torch())
    torch.testing.assert_close(s.unpartition().to_torch(), torch.softmax(m.to_torch(), 1))
    torch.testing.assert_close(c.unpartition().to_torch(), a.to_torch() @ b.to_torch(),
                               rtol=1e-5, atol=1e-5)


@st.kernel(unsafe=True)
def reserve_slots(counter: st.Ptr[st.i32], out: st.Ptr[st.i32]):
    if sl.bid(0) == 0:
        slots = sl.atomic_add(counter, sl.zeros((4,), st.i32), 1)    # one ticket per lane
        sl.store_ptr(out, slots, sl.arange(4) + 100)
    else:
        sl.store_ptr(out, sl.zeros((1,), st.i32) + 2, sl.full((1,), 7, st.i32))


@st.kernel(unsafe=True)
def take_tickets(counter: st.Ptr[st.i32], out: st.Ptr[st.i32]):
    sl.store_ptr(out, sl.arange(4), sl.atomic_add(counter, sl.zeros((4,), st.i32), 1))


def test_lanes_of_one_atomic_add_on_one_element_each_get_their_own_old_value():
    with st.unsafe(), st.backend("interpret", seed=0):
        counter, out = take_tickets.options(grid=(1,))(
            st.zeros((1,), dtype=st.i32, device="cpu"),
            st.zeros((4,), dtype=st.i32, device="cpu")).sync()
    assert counter.to_torch().tolist() == [4]
    assert sorted(out.to_torch().tolist()) == [0, 1, 2, 3]


@pytest.mark.parametrize("seed", range(3))
def test_a_race_on_slots_reserved_by_one_atomic_add_is_reported(seed):
    with st.unsafe(), st.backend("interpret", seed=seed), pytest.raises(st.RaceError,
                                                                       match="element \\(2,\\)"):
        reserve_slots.options(grid=(2,))(st.zeros((1,), dtype=st.i32, device="cpu"),
                                         st.zeros((8,), dtype=st.i32, device="cpu")).sync()


@pytest.mark.parametrize("body, message", [
    ("sl.store_ptr(p, sl.arange(4).astype(st.f32) * 1.5, sl.full((4,), 1.0, st.f32))",
     "pointer offsets are ints"),
    ("sl.store_ptr(p, sl.arange(4), sl.full((4,), 1.0, st.f32), mask=sl.arange(4) % 2)",
     "mask is bool"),
    ("sl.store_ptr(p, sl.arange(1), sl.full((1,), 1.0, st.f32), mask=sl.arange(4) < 2)",
     "broadcasts to the offsets' shape"),
    ("sl.store_ptr(p, sl.arange(4), sl.load_ptr(p, sl.arange(4), sl.arange(4) < 2, "
     "sl.full((4,), 9.0, st.f32)))", "compile-time number"),
], ids=["float offsets", "int mask", "wider mask", "tile other"])
def test_pointer_ops_take_only_what_both_backends_compute_alike(tmp_path, body, message):
    path = tmp_path / "pointer_kernel.py"
    path.write_text("import safetile as st\nimport safetile.lang as sl\n\n\n"
                    "@st.kernel(unsafe=True, grid=(1,))\n"
                    f"def k(p: st.Ptr[st.f32]):\n    {body}\n")
    spec = importlib.util.spec_from_file_location("pointer_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with st.unsafe(), st.backend("interpret"), pytest.raises(st.KernelDefinitionError,
                                                             match=message):
        module.k(st.zeros((8,), device="cpu")).sync()
