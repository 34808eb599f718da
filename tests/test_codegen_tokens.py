"""Token ordering in the generated source: barriers exactly where the owned tile's chain needs them.

Different threads of a CTA hold different elements of a tile, so a read of the owned tile after
a store to it (RAW), a store after a read (WAR) and a store after a store (WAW) must be
separated by a CTA barrier (`tl.debug_barrier()`). Reads of In views carry no token: a kernel
that only reads inputs and stores once has no barrier at all, and neither do two reads.
"""
import re

import safetile as st
import safetile.lang as sl

BARRIER = "tl.debug_barrier()"


def cpu(n=64):
    return st.randn((n,), device="cpu", seed=0)


def owned(n=64, tile=(16,)):
    return st.empty((n,), device="cpu").partition(tile)


def entry_body(source: str, name: str) -> list[str]:
    """The lines of the generated kernel function itself (the helpers above it excluded)."""
    lines = source.splitlines()
    start = next(i for i, text in enumerate(lines) if text.startswith(f"def {name}("))
    return lines[start + 1:]


def accesses(body: list[str], out: str) -> list[tuple[int, str]]:
    """(line number, "load"|"store") of every access of Out ``out`` in the kernel body."""
    found = []
    for i, text in enumerate(body):          # helpers take the Out's pointer or descriptor first
        for helper in re.findall(rf"\b(_st_[a-z]+)\d+\(_st_{out}_(?:ptr|d\d+)\b", text):
            found.append((i, "store" if helper.endswith("store") else "load"))
    return found


def barriers(body: list[str]) -> list[int]:
    return [i for i, text in enumerate(body) if BARRIER in text]


def barrier_between(body, first: int, second: int) -> bool:
    return any(first < b < second for b in barriers(body))


@st.kernel
def read_after_write(x: st.In[st.f32], z: st.Out[st.f32], w: st.Out[st.f32]):
    z.store(sl.load_like(x, z))
    w.store(z.load() + 1.0)


def test_load_of_the_owned_tile_after_a_store_gets_a_barrier():
    body = entry_body(read_after_write.source(cpu(), owned(), owned()), "read_after_write")
    (store, s_kind), (load, l_kind) = accesses(body, "z")
    assert (s_kind, l_kind) == ("store", "load")
    assert barrier_between(body, store, load)
    assert len(barriers(body)) == 1                   # w's first store needs none


@st.kernel
def write_after_read(x: st.In[st.f32], z: st.Out[st.f32]):
    t = z.load()
    z.store(t + sl.load_like(x, z))


def test_store_after_a_load_of_the_owned_tile_gets_a_barrier():
    body = entry_body(write_after_read.source(cpu(), owned()), "write_after_read")
    (load, l_kind), (store, s_kind) = accesses(body, "z")
    assert (l_kind, s_kind) == ("load", "store")
    assert barrier_between(body, load, store)


@st.kernel
def write_after_write(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z))
    z.store(sl.load_like(x, z) * 2.0)


def test_second_store_to_the_owned_tile_gets_a_barrier():
    body = entry_body(write_after_write.source(cpu(), owned()), "write_after_write")
    (first, k1), (second, k2) = accesses(body, "z")
    assert (k1, k2) == ("store", "store")
    assert barrier_between(body, first, second)
    assert len(barriers(body)) == 1


@st.kernel
def store_every_iteration(x: st.In[st.f32], z: st.Out[st.f32], n: int):
    for k in range(n):
        z.store(sl.load_like(x, z) * k)


def test_stores_in_consecutive_loop_iterations_are_separated():
    body = entry_body(store_every_iteration.source(cpu(), owned(), 3), "store_every_iteration")
    loop = next(i for i, text in enumerate(body) if text.strip().startswith("for k in range("))
    (store, kind), = accesses(body, "z")
    assert kind == "store"
    assert barrier_between(body, loop, store)         # the previous iteration's store came first


@st.kernel
def accumulate_in_place(x: st.In[st.f32], z: st.Out[st.f32], n: int):
    z.store(sl.zeros(z.shape, st.f32))
    for k in range(n):
        t = z.load()
        z.store(t + sl.load_like(x, z))


def test_load_and_store_in_a_loop_are_ordered_within_and_across_iterations():
    body = entry_body(accumulate_in_place.source(cpu(), owned(), 4), "accumulate_in_place")
    loop = next(i for i, text in enumerate(body) if text.strip().startswith("for k in range("))
    (init, k0), (load, k1), (store, k2) = accesses(body, "z")
    assert (k0, k1, k2) == ("store", "load", "store")
    assert barrier_between(body, loop, load)          # RAW: previous iteration's (or first) store
    assert barrier_between(body, load, store)         # WAR within the iteration


@st.kernel
def sub_tiles_in_a_loop(x: st.In[st.f32], z: st.Out[st.f32]):
    halves = z.partition((8,))
    for j in range(2):
        halves.store(x.load((z.index[0] * 2 + j,), (8,)), (j,))


def test_sub_partition_stores_in_a_loop_are_ordered():
    body = entry_body(sub_tiles_in_a_loop.source(cpu(), owned()), "sub_tiles_in_a_loop")
    loop = next(i for i, text in enumerate(body) if text.strip().startswith("for j in range("))
    (store, kind), = accesses(body, "z")
    assert kind == "store"
    assert barrier_between(body, loop, store)


@st.kernel
def reads_back_after_one_barrier(x: st.In[st.f32], z: st.Out[st.f32], w: st.Out[st.f32]):
    z.store(sl.load_like(x, z))
    a = z.load()
    b = z.load()
    w.store(a + b)


def test_a_barrier_orders_every_access_before_it_so_later_reads_need_none():
    body = entry_body(reads_back_after_one_barrier.source(cpu(), owned(), owned()),
                      "reads_back_after_one_barrier")
    (store, _), (first, _), (second, _) = accesses(body, "z")
    assert barrier_between(body, store, first)
    assert len(barriers(body)) == 1


@st.kernel
def reads_back_in_a_loop(x: st.In[st.f32], z: st.Out[st.f32], w: st.Out[st.f32], n: int):
    z.store(sl.load_like(x, z))
    halves = z.partition((8,))
    acc = sl.zeros((8,), st.f32)
    for j in range(n):
        acc = acc + halves.load((j,))
    w.store(sl.load_like(x, w) + sl.sum(acc, 0))


def test_a_loop_that_only_reads_back_gets_one_barrier_before_it():
    body = entry_body(reads_back_in_a_loop.source(cpu(), owned(), owned(), 2),
                      "reads_back_in_a_loop")
    loop = next(i for i, text in enumerate(body) if text.strip().startswith("for j in "))
    (store, _), (load, _) = accesses(body, "z")
    assert barrier_between(body, store, loop)
    assert not barrier_between(body, loop, load)
    assert len(barriers(body)) == 1


@st.kernel
def reads_inputs_only(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32], n: int):
    acc = sl.load_like(x, z)
    for k in range(n):
        acc = acc + sl.load_like(y, z) * sl.load_like(x, z)
    z.store(acc)


def test_no_barrier_when_only_in_views_are_read_and_the_tile_is_stored_once():
    source = reads_inputs_only.source(cpu(), cpu(), owned(), 3)
    assert BARRIER not in source


@st.kernel
def two_reads(x: st.In[st.f32], z: st.Out[st.f32], w: st.Out[st.f32]):
    a = z.load()
    b = z.load()
    w.store(a + b + sl.load_like(x, w))


def test_no_barrier_between_two_loads_of_the_owned_tile():
    body = entry_body(two_reads.source(cpu(), owned(), owned()), "two_reads")
    kinds = [k for _, k in accesses(body, "z")]
    assert kinds == ["load", "load"]
    assert barriers(body) == []


def test_examples_have_no_barriers():
    from test_codegen import load_example
    add = load_example("01_vector_add").add
    softmax = load_example("02_softmax").softmax
    matmul = load_example("03_matmul").matmul
    assert BARRIER not in add.source(cpu(), cpu(), owned())
    x2 = st.randn((8, 32), device="cpu")
    assert BARRIER not in softmax.source(x2, st.empty((8, 32), device="cpu").partition((4, 32)))
    a, b = st.randn((32, 32), device="cpu"), st.randn((32, 32), device="cpu")
    assert BARRIER not in matmul.source(a, b, st.empty((32, 32), device="cpu").partition((16, 16)), 16)


@st.kernel
def bound_from_owned_tile(z: st.Out[st.i32]):
    z.store(sl.full(z.shape, 3, st.i32))
    for i in range(sl.max(z.load(), 0)):
        z.store(z.load() + 1)


def test_a_load_in_a_loop_bound_is_ordered_after_an_earlier_store():
    src = bound_from_owned_tile.source(st.zeros((64,), dtype=st.i32).partition((64,)))
    head = src.index("for i in range(")
    before = src[:head]
    assert before.rstrip().splitlines()[-1].strip().startswith("tl.debug_barrier()")


def persistent(n=64, tile=(16,)):
    return st.zeros((n,), device="cpu").partition(tile, persistent=2)


@st.kernel
def tiles_in_a_range_loop(z: st.Out[st.f32], n: int):
    for i in range(n):
        for t in z.tiles():
            t.store(t.load() + 1.0)


@st.kernel
def two_tiles_loops(z: st.Out[st.f32]):
    for t in z.tiles():
        t.store(sl.full(t.shape, 1.0, st.f32))
    for u in z.tiles():
        u.store(u.load() + 1.0)


def test_a_tiles_loop_run_again_is_ordered_after_the_previous_visit():
    body = entry_body(tiles_in_a_range_loop.source(persistent(), 3), "tiles_in_a_range_loop")
    outer = next(i for i, text in enumerate(body) if "for i in range(" in text)
    tiles = next(i for i, text in enumerate(body) if "for _st_t in" in text)
    assert barrier_between(body, outer, tiles)
    (z,) = tiles_in_a_range_loop(persistent(), 3).sync()[:1]
    assert z.unpartition().to_torch().eq(3.0).all()


def test_a_second_tiles_loop_is_ordered_after_the_first():
    body = entry_body(two_tiles_loops.source(persistent()), "two_tiles_loops")
    (store, _), (load, kind), _ = accesses(body, "z")
    assert kind == "load" and barrier_between(body, store, load)
    two_tiles_loops.compile(persistent())


def test_a_tiles_loop_first_in_the_kernel_has_no_barrier_before_it():
    body = entry_body(two_tiles_loops.source(persistent()), "two_tiles_loops")
    first = next(i for i, text in enumerate(body) if "for _st_t in" in text)
    assert not any(b < first for b in barriers(body))
