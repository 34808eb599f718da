"""The registry of holds in flight: lasting Shared borrows and the other holds answer alike.

A Shared value's read borrow sits in an address-sorted index of its own (registry.Disjoint);
every conflict it could cause must still be found, and none invented.
"""
import pytest
import torch
from hypothesis import given, settings, strategies as hs

from safetile.errors import AliasError
from safetile.tensor import acquire, active_holds, from_torch
from safetile.tensor.borrows import Hold
from safetile.tensor.overlap import Extent, _overlap
from safetile.tensor.registry import SMALL, Registry


@pytest.fixture(autouse=True)
def no_leftover_holds():
    yield
    assert active_holds() == [], "a test leaked a borrow hold"


def write(t: torch.Tensor):
    acquire("kernel 'fill'", writes=[("z", t)]).release()


def test_a_write_into_one_of_many_shared_values_is_refused_naming_it():
    base = torch.zeros(400 * 64)
    shared = [from_torch(base[i * 64:(i + 1) * 64]).share() for i in range(400)]
    with pytest.raises(AliasError, match="held by the shared value"):
        write(base[137 * 64 + 5:137 * 64 + 9])
    del shared


def test_a_write_between_shared_values_is_accepted():
    base = torch.zeros(3 * 64)
    shared = [from_torch(base[0:64]).share(), from_torch(base[128:192]).share()]
    write(base[64:128])
    del shared


def test_a_write_across_the_boundary_of_two_shared_values_is_refused():
    base = torch.zeros(2 * 64)
    shared = [from_torch(base[0:64]).share(), from_torch(base[64:128]).share()]
    with pytest.raises(AliasError):
        write(base[60:68])
    del shared


def test_a_write_to_the_other_elements_of_an_interleaved_shared_value_is_accepted():
    base = torch.zeros(64)
    shared = from_torch(base[0::2]).share()
    write(base[1::2])
    with pytest.raises(AliasError):
        write(base[2:3])
    del shared


def test_overlapping_shared_values_each_keep_their_bytes_read_only():
    base = torch.zeros(64)
    first, second = from_torch(base[0:40]).share(), from_torch(base[20:64]).share()
    del first
    with pytest.raises(AliasError):
        write(base[30:34])
    with pytest.raises(AliasError):
        write(base[50:54])
    write(base[0:20])
    del second
    write(base)


def test_a_shared_value_over_an_earlier_one_keeps_all_its_bytes_read_only():
    base = torch.zeros(64)
    inner = from_torch(base[20:30]).share()
    outer = from_torch(base[10:50]).share()
    with pytest.raises(AliasError):
        write(base[40:44])
    del inner, outer


def test_a_dropped_shared_value_frees_its_bytes_among_many():
    base = torch.zeros(10 * 64)
    shared = [from_torch(base[i * 64:(i + 1) * 64]).share() for i in range(10)]
    del shared[3]
    write(base[3 * 64:4 * 64])
    with pytest.raises(AliasError):
        write(base[4 * 64:4 * 64 + 1])
    del shared


def test_a_read_of_shared_bytes_is_accepted_while_they_are_shared():
    base = torch.zeros(64)
    shared = from_torch(base).share()
    acquire("kernel 'sum'", reads=[("x", base[3:9])]).release()
    del shared


# -- the registry against a scan of every hold ---------------------------------------------

BASE = torch.zeros(256)

views = hs.builds(
    lambda start, length, step, w: (BASE[start:start + length * step:step], w),
    hs.integers(0, 200), hs.integers(1, 24), hs.sampled_from([1, 1, 2, 3]), hs.booleans())
steps = hs.lists(hs.tuples(hs.sampled_from(["add", "lasting", "lasting", "remove"]), views,
                           hs.integers(0, 1000)), max_size=3 * SMALL + 10)


def scan(holds: dict, x: Extent):
    """The conflicts of ``x`` by definition: a write meets any held extent it overlaps, a
    read only held writes."""
    return [(e, h) for h, extents in holds.items() for e in extents
            if (x.write or e.write) and _overlap(x, e)]


@settings(max_examples=500, deadline=None)
@given(steps, hs.lists(views, min_size=1, max_size=8))
def test_the_registry_finds_exactly_the_conflicts_a_scan_of_every_hold_finds(ops, queries):
    reg, holds = Registry(), {}
    for kind, (t, w), pick in ops:
        if kind == "remove":
            if holds:
                h = list(holds)[pick % len(holds)]
                reg.remove(h)
                del holds[h]
            continue
        lasting = kind == "lasting"
        e = Extent(t, "x", w and not lasting)         # a lasting borrow is a read
        h = Hold("h")
        reg.add(h, (e,), lasting)
        holds[h] = (e,)
    for t, w in queries:
        x = Extent(t, "q", w)
        expected = scan(holds, x)
        found = reg.conflict(x)
        assert (found is None) == (not expected)
        if found is not None:
            assert found in expected
        near = reg.near(x.lo, x.hi)
        assert all(pair in near for pair in expected)
