"""The ``early`` launch option: with ``pdl=True``, loads of the named In parameters in the
body's leading statements run before the programmatic-launch wait, and a launch whose
previous launch (same execution or graph) may write those bytes goes without programmatic
launch."""
import pytest
import torch

import safetile as st
import safetile.lang as sl
from safetile.errors import ArgumentError


@st.kernel
def weighted(w: st.In[st.f32], x: st.In[st.f32], z: st.Out[st.f32]):
    """z = w * x, with w's tile loaded first (the early load)."""
    wt = w.load(z.index, z.shape)
    z.store(wt * x.load(z.index, z.shape))


@st.kernel
def copy(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(x.load(z.index, z.shape))


def vec(n=8, seed=0):
    return st.randn((n,), device="cpu", seed=seed)


def out(n=8):
    return st.empty((n,), device="cpu").partition((4,))


def body(src: str, name: str) -> list[str]:
    return [ln.strip() for ln in src.split(f"def {name}(")[1].split("\n")[1:] if ln.strip()]


def test_an_early_in_load_precedes_the_wait_and_the_other_loads_follow_it():
    lines = body(weighted.options(pdl=True, early=("w",)).source(vec(), vec(), out()), "weighted")
    wait = lines.index("_st_gdc_wait()")
    assert any(ln.startswith("wt = ") for ln in lines[:wait])
    assert all("_st_x_ptr" not in ln for ln in lines[:wait])


def test_without_early_every_load_follows_the_wait():
    lines = body(weighted.options(pdl=True).source(vec(), vec(), out()), "weighted")
    wait = lines.index("_st_gdc_wait()")
    assert all("load" not in ln for ln in lines[:wait])


def test_early_names_only_in_parameters():
    with pytest.raises(ArgumentError, match="early=.*In parameter names"):
        weighted.options(pdl=True, early=("z",))
    with pytest.raises(ArgumentError, match="early="):
        weighted.options(pdl=True, early="w")


def test_in_one_execution_an_early_launch_after_a_known_launch_keeps_programmatic_launch():
    w, x, src, scratch, z = vec(seed=1), vec(seed=2), vec(seed=3), out(), out()
    second = weighted.options(pdl=True, early=("w",))(w, x, z)
    with st.backend("interpret", seed=0):
        st.zip(copy(src, scratch), second).sync()
    assert not second.serial


def test_the_first_launch_of_an_execution_goes_in_plain_order():
    # Whatever ran before it on the stream was not launched by this execution.
    op = weighted.options(pdl=True, early=("w",))(vec(seed=1), vec(seed=2), out())
    with st.backend("interpret", seed=0):
        op.sync()
    assert op.serial


def test_after_a_callback_a_launch_goes_in_plain_order():
    # The callback may have enqueued work safetile does not see (torch ops, allocation).
    w, x, src, scratch = vec(seed=1), vec(seed=2), vec(seed=3), st.empty((8,), device="cpu")
    launched = []

    def second(*_):
        launched.append(weighted.options(pdl=True, early=("w",))(w, x, out()))
        return launched[-1]

    with st.backend("interpret", seed=0):
        copy(src, scratch.partition((4,))).then(second).sync()
    assert launched[0].serial


def test_a_graph_checks_the_launch_recorded_just_before():
    w, x, src, z1, z2 = vec(seed=1), vec(seed=2), vec(seed=3), out(), out()
    with st.graph_scope() as scope:
        _, wp = scope.record(copy(src, w.partition((4,))))
        w = wp.unpartition()
        scope.record(weighted.options(pdl=True, early=("w",))(w, x, z1))
        scope.record(weighted.options(pdl=True, early=("w",))(x, w, z2))
    first, after_write, after_read = scope.graph.records
    assert after_write.serial and not after_read.serial


def test_after_a_launch_of_no_programs_a_launch_goes_in_plain_order():
    # The launcher enqueues nothing for an empty grid: on the stream, the launch before it
    # (here one writing w) is what a programmatic launch would overlap.
    w, x, src = st.empty((8,), device="cpu"), vec(seed=2), vec(seed=3)
    empty = copy(st.empty((0,), device="cpu"), st.empty((0,), device="cpu").partition((4,)))
    built = []

    def after(src, wp):
        built.append(weighted.options(pdl=True, early=("w",))(wp.unpartition(), x, out()))
        return st.zip(empty, built[0])

    with st.backend("interpret", seed=0):
        copy.options(pdl=True)(src, w.partition((4,))).then(after).sync()
    assert built[0].serial


def test_a_graph_recorded_after_a_launch_of_no_programs_goes_in_plain_order():
    w, x, src, z = st.empty((8,), device="cpu"), vec(seed=2), vec(seed=3), out()
    e_in, e_out = st.empty((0,), device="cpu"), st.empty((0,), device="cpu")
    with st.graph_scope() as scope:
        _, wp = scope.record(copy.options(pdl=True)(src, w.partition((4,))))
        scope.record(copy(e_in, e_out.partition((4,))))
        scope.record(weighted.options(pdl=True, early=("w",))(wp.unpartition(), x, z))
    assert scope.graph.records[-1].serial


def test_the_first_launch_of_a_graph_goes_in_plain_order():
    # What runs before a replay is not known when the graph is recorded.
    w, x, z = vec(seed=1), vec(seed=2), out()
    g = weighted.options(pdl=True, early=("w",))(w, x, z).graph()
    assert g.records[0].serial


def test_early_loads_compute_the_same_on_the_cpu_executor():
    w, x = vec(seed=1), vec(seed=2)
    want = w.to_torch() * x.to_torch()
    with st.backend("interpret", seed=1):
        _, _, z = weighted.options(pdl=True, early=("w",))(w, x, out()).sync()
    assert torch.equal(z.unpartition().to_torch(), want)


@st.function
def doubled(t):
    return t + t


@st.kernel
def doubled_weights(w: st.In[st.f32], x: st.In[st.f32], z: st.Out[st.f32]):
    wt = doubled(w.load(z.index, z.shape))
    z.store(wt * x.load(z.index, z.shape))


def test_a_helper_without_pointer_operations_does_not_stop_the_early_statements():
    src = doubled_weights.options(pdl=True, early=("w",)).source(vec(), vec(), out())
    lines = body(src, "doubled_weights")
    assert any(ln.startswith("wt = ") for ln in lines[:lines.index("_st_gdc_wait()")])


# ---- trigger_early: the next grid may start with this one ------------------------------------

def test_trigger_early_signals_before_anything_and_still_waits_before_the_stores():
    lines = body(copy.options(pdl=True, trigger_early=True).source(vec(), out()), "copy")
    assert lines.index("_st_gdc_launch_dependents()") < lines.index("_st_gdc_wait()")
    plain = body(copy.options(pdl=True).source(vec(), out()), "copy")
    assert plain.index("_st_gdc_wait()") < plain.index("_st_gdc_launch_dependents()")


@pytest.mark.parametrize("middle_signals_early", [True, False])
def test_early_loads_are_checked_against_every_launch_that_may_still_run(middle_signals_early):
    # a writes w; b (in between) writes elsewhere; c loads w early. If b signals at its
    # start, c may start while a still runs, so c must go in plain order.
    w, x, src, other, z = vec(seed=1), vec(seed=2), vec(seed=3), out(), out()
    first = copy.options(pdl=True, trigger_early=True)
    middle = copy.options(pdl=True, trigger_early=middle_signals_early)
    with st.graph_scope() as scope:
        _, wp = scope.record(first(src, w.partition((4,))))
        scope.record(middle(x, other))
        scope.record(weighted.options(pdl=True, early=("w",))(wp.unpartition(), x, z))
    assert scope.graph.records[2].serial is middle_signals_early


def test_a_long_chain_of_early_signalling_launches_is_cut_by_a_plain_launch():
    from safetile.kernel.kernel_op import MAX_RUNNING
    k = copy.options(pdl=True, trigger_early=True)
    srcs = [vec(seed=i) for i in range(MAX_RUNNING + 4)]
    outs = [out() for _ in srcs]
    with st.graph_scope() as scope:
        for s_, o in zip(srcs, outs):
            scope.record(k(s_, o))
    serial = [r.serial for r in scope.graph.records]
    # the first launch of a graph goes in plain order, then the chain grows to the cut
    assert serial[:MAX_RUNNING + 2] == [True] + [False] * MAX_RUNNING + [True]
    assert all(len(r._running) <= MAX_RUNNING for r in scope.graph.records)


def test_a_graph_inlined_into_another_recording_starts_in_plain_order():
    # Its launches were checked against its own chain only: its first launch must not
    # overlap whatever the outer recording put before it.
    signal = copy.options(pdl=True, trigger_early=True)
    inner = signal(vec(seed=1), out()).graph()
    x, z = vec(seed=2), out()
    with st.graph_scope() as scope:
        scope.record(signal(x, z))
        scope.record(inner.launch())
    assert scope.graph.records[1] is inner.records[0] and inner.records[0].serial


# ---- the early names the launcher checks are the ones the variant loads early ----------------

def launch_after_a_writer_of_w(kernel) -> bool:
    """Record a write of ``w`` and then ``kernel`` (loading ``w`` early); whether that launch
    goes in plain order."""
    w, x, src, z = vec(seed=1), vec(seed=2), vec(seed=3), out()
    with st.graph_scope() as scope:
        _, wp = scope.record(copy(src, w.partition((4,))))
        scope.record(kernel(wp.unpartition(), x, z))
    return scope.graph.records[-1].serial


def test_an_early_tuple_subclass_cannot_hide_its_names_from_the_launch_check():
    class Hiding(tuple):
        def __contains__(self, item):
            return False

    k = weighted.options(pdl=True, early=Hiding(("w",)))
    assert type(k.opts["early"]) is tuple
    assert launch_after_a_writer_of_w(k)


def test_an_early_name_of_a_str_subclass_cannot_hide_from_the_launch_check():
    class Unequal(str):
        def __eq__(self, other):
            return False
        __hash__ = str.__hash__

    k = weighted.options(pdl=True, early=(Unequal("w"),))
    assert [type(n) for n in k.opts["early"]] == [str]
    assert launch_after_a_writer_of_w(k)


def test_a_kernels_options_cannot_be_changed_in_place():
    k = weighted.options(pdl=True, early=("w",))
    with pytest.raises(TypeError):
        k.opts["early"] = ()
    with pytest.raises(TypeError):
        weighted.opts["pdl"] = "maybe"
    assert weighted.options(pdl=True, early=("w",)).opts["early"] == ("w",)
    assert launch_after_a_writer_of_w(k)


@pytest.mark.parametrize("early", [("nope",), ("z",), 5, "w"])
def test_the_decorator_checks_early_as_options_does(early):
    with pytest.raises(ArgumentError, match="early="):
        @st.kernel(pdl=True, early=early)
        def k(w: st.In[st.f32], z: st.Out[st.f32]):
            z.store(w.load(z.index, z.shape))


def test_an_early_list_given_to_the_decorator_is_copied_when_the_kernel_is_defined():
    names = ["w"]

    @st.kernel(pdl=True, early=names)
    def weighted_early(w: st.In[st.f32], x: st.In[st.f32], z: st.Out[st.f32]):
        wt = w.load(z.index, z.shape)
        z.store(wt * x.load(z.index, z.shape))

    names.clear()
    assert weighted_early.opts["early"] == ("w",)
    assert launch_after_a_writer_of_w(weighted_early)


@pytest.mark.gpu
def test_after_a_launch_on_the_cpu_executor_a_gpu_launch_goes_in_plain_order():
    # The CPU executor runs on the host: on the stream, the launch before it is what a
    # programmatic launch would overlap.
    built = []

    def after(src, wp):
        with st.backend("interpret", seed=0):
            on_the_host = copy(vec(seed=4), out())
        built.append(weighted.options(pdl=True, early=("w",))(
            wp.unpartition(), st.randn((8,), device="cuda", seed=2),
            st.empty((8,), device="cuda").partition((4,))))
        return st.zip(on_the_host, built[0])

    with st.backend("triton"):
        w, src = st.empty((8,), device="cuda"), st.randn((8,), device="cuda", seed=3)
        copy.options(pdl=True)(src, w.partition((4,))).then(after).sync()
    assert built[0].serial
