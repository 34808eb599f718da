"""``with st.unsafe():``: an unsafe=True kernel launches (and its graph replays) only inside a
block open on the launching code's own call stack, whatever the block's wrapper, nesting or
thread."""
import threading

import pytest
import torch

import safetile as st
import safetile.lang as sl


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


@st.kernel
def fill_twos(z: st.Out[st.f32]):
    z.store(sl.full(z.shape, 2.0, st.f32))


def test_a_replay_cannot_be_pointed_at_a_graph_of_unsafe_kernels_after_its_check():
    buf = st.zeros((8,), device="cpu")
    with st.backend("interpret"):
        with st.unsafe():
            unsafe_graph = scatter_ones.options(grid=(1,))(buf, 5).graph()
        replay = fill_twos(st.empty((2,), device="cpu").partition((2,))).graph().launch()
        with pytest.raises(AttributeError):
            replay.replayed = unsafe_graph        # launch() checked the safe graph only
        replay.sync()
    assert buf.to_torch().sum().item() == 0        # the unsafe graph never ran
