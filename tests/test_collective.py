"""Collectives (st.all_reduce, st.all_gather) over gloo, two processes on the loopback."""
import asyncio
import datetime
import os
import socket
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import safetile as st
from safetile.errors import (AliasError, ArgumentError, CollectiveError, GraphCaptureError,
                             MovedError)

import support

WORLD = 2
TIMEOUT_S = 60          # a whole test: spawn, rendezvous, work


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, port, body, results, gloo_timeout_s):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=gloo_timeout_s))
    try:
        results[rank] = ("ok", body(rank))
    except BaseException as e:
        results[rank] = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
        if body is not _survivor_after_peer_dies and dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(body, gloo_timeout_s=10):
    """Run ``body(rank)`` on two gloo ranks; returns each rank's (status, result)."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        port = _free_port()
        procs = [ctx.Process(target=_entry, args=(r, port, body, results, gloo_timeout_s))
                 for r in range(WORLD)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + TIMEOUT_S
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        return {r: results.get(r) for r in range(WORLD)}, [p.exitcode for p in procs]


def _ok(results):
    for r in range(WORLD):
        assert results[r] is not None and results[r][0] == "ok", f"rank {r}: {results[r]}"
    return [results[r][1] for r in range(WORLD)]


# -- bodies (module level: spawn pickles them by name) ------------------------------------

def _all_reduce_sums(rank):
    buf = st.from_torch(torch.arange(4, dtype=torch.float32) + 10 * rank)
    out = st.all_reduce(buf).sync()
    return out is buf, out.to_torch().tolist()


def _awaited_all_reduce(rank):
    async def main():
        buf = st.from_torch(torch.full((3,), float(rank + 1)))
        out = await st.all_reduce(buf, op="max")
        return out is buf, out.to_torch().tolist()
    return asyncio.run(main())


def _all_gather_concatenates(rank):
    x = st.from_torch(torch.full((2, 3), float(rank + 1)))
    out = st.empty((2 * WORLD, 3))
    rx, rout = st.all_gather(x, out).sync()
    return rx is x and rout is out, rout.to_torch()[:, 0].tolist()


def _in_flight_buffer_is_refused(rank):
    buf = st.from_torch(torch.ones(4))
    pending = st.all_reduce(buf)                  # buf moved into an unrun op
    try:
        st.all_reduce(buf)
        refused = None
    except MovedError as e:
        refused = "MovedError"
        assert e.recovered is buf
    # nothing was enqueued by the refusal: the next collective pairs with the peer's first
    out = pending.sync()
    return refused, out.to_torch().tolist()


def _overlapping_view_is_refused(rank):
    base = torch.ones(8)
    whole = st.from_torch(base)
    held = whole.share()                          # a read borrow of all 8 elements
    view = st.from_torch(base[2:6])               # another handle over the same bytes
    try:
        st.all_reduce(view)
        refused = None
    except AliasError:
        refused = "AliasError"
    moved = not view._is_live()
    held.try_unwrap()
    out = st.all_reduce(view).sync()              # nothing was moved: the view still works
    return refused, moved, out.to_torch().tolist()


def _graph_scope_refuses_a_collective(rank):
    buf = st.from_torch(torch.ones(4))
    try:
        with st.graph_scope() as s:
            s.record(st.all_reduce(buf))
        refused = None
    except GraphCaptureError:
        refused = "GraphCaptureError"
    return refused, buf._is_live()


def _survivor_after_peer_dies(rank):
    st.all_reduce(st.from_torch(torch.ones(4))).sync()   # both ranks are up
    if rank == 1:
        os._exit(3)                               # killed mid-run, no cleanup
    buf = st.from_torch(torch.ones(4))
    start = time.monotonic()
    try:
        st.all_reduce(buf).sync()
        return None
    except CollectiveError as e:
        return ("CollectiveError", time.monotonic() - start, buf is e.recovered,
                buf._is_live(), str(e))


no_leftover_holds = support.no_leftover_holds()


# -- tests ---------------------------------------------------------------------------------

def test_all_reduce_sums_across_ranks_and_hands_the_buffer_back():
    results, _ = run_ranks(_all_reduce_sums)
    for same, values in _ok(results):
        assert same
        assert values == [10.0, 12.0, 14.0, 16.0]


def test_an_awaited_all_reduce_hands_the_buffer_back():
    results, _ = run_ranks(_awaited_all_reduce)
    for same, values in _ok(results):
        assert same and values == [2.0, 2.0, 2.0]


def test_all_gather_places_each_rank_block_in_rank_order():
    results, _ = run_ranks(_all_gather_concatenates)
    for same, column in _ok(results):
        assert same
        assert column == [1.0, 1.0, 2.0, 2.0]


def test_a_buffer_in_flight_is_refused_before_anything_is_enqueued():
    results, _ = run_ranks(_in_flight_buffer_is_refused)
    for refused, values in _ok(results):
        assert refused == "MovedError"
        assert values == [2.0, 2.0, 2.0, 2.0]


def test_a_view_overlapping_a_held_borrow_is_refused_and_nothing_is_moved():
    results, _ = run_ranks(_overlapping_view_is_refused)
    for refused, moved, values in _ok(results):
        assert refused == "AliasError" and not moved
        assert values == [2.0, 2.0, 2.0, 2.0]


def test_recording_a_collective_into_a_graph_is_refused_and_hands_the_buffer_back():
    results, _ = run_ranks(_graph_scope_refuses_a_collective)
    for refused, live in _ok(results):
        assert refused == "GraphCaptureError" and live


def test_a_killed_peer_makes_the_survivor_fail_with_a_collective_error_in_bounded_time():
    results, exitcodes = run_ranks(_survivor_after_peer_dies, gloo_timeout_s=5)
    assert exitcodes[1] == 3
    status, outcome = results[0]
    assert status == "ok", outcome
    kind, elapsed, recovered, live, message = outcome
    assert kind == "CollectiveError" and recovered and live
    assert elapsed < 15
    assert "rank 0 of 2" in message


def _storage_shrunk_before_the_run(rank):
    base = torch.ones(4)
    op = st.all_reduce(st.from_torch(base))
    base.untyped_storage().resize_(0)            # through the caller's own torch alias
    try:
        op.sync()
        refused = None
    except ArgumentError as e:
        refused = ("past the end of its storage" in str(e), e.recovered is not None)
    # nothing was sent: the next collective pairs with the peer's
    return refused, st.all_reduce(st.from_torch(torch.ones(2))).sync().to_torch().tolist()


def test_a_collective_whose_buffer_storage_shrank_before_it_ran_is_refused_sending_nothing():
    for refused, total in _ok(run_ranks(_storage_shrunk_before_the_run)[0]):
        assert refused == (True, True) and total == [2.0, 2.0]


def _process_group_destroyed_before_the_run(rank):
    buf = st.from_torch(torch.ones(4))
    op = st.all_reduce(buf)
    dist.destroy_process_group()
    try:
        op.sync()
    except CollectiveError as e:
        return "destroyed" in str(e), e.recovered is buf, buf._is_live()


def test_a_collective_run_after_its_process_group_was_destroyed_is_a_collective_error():
    for outcome in _ok(run_ranks(_process_group_destroyed_before_the_run)[0]):
        assert outcome == (True, True, True)


def _called_by_a_rank_outside_the_group(rank):
    group = dist.new_group(ranks=[0])
    buf = st.from_torch(torch.ones(2))
    if rank == 0:
        return st.all_reduce(buf, group=group).sync().to_torch().tolist()
    try:
        st.all_reduce(buf, group=group)
    except ArgumentError as e:
        return "not a member of the group" in str(e), buf._is_live()


def test_a_rank_outside_a_subgroup_is_told_it_is_not_a_member():
    first, second = _ok(run_ranks(_called_by_a_rank_outside_the_group)[0])
    assert first == [1.0, 1.0] and second == (True, True)


def test_a_collective_without_a_process_group_is_refused():
    buf = st.from_torch(torch.ones(2))
    with pytest.raises(CollectiveError, match="init_process_group"):
        st.all_reduce(buf)
    assert buf._is_live()


@pytest.mark.parametrize("call", [lambda b: st.all_reduce(b, op=["sum"]),
                                  lambda b: st.all_reduce(b, group="world"),
                                  lambda b: st.all_gather(b, st.empty((2,)), group=0)],
                         ids=["unhashable op", "group name", "group number"])
def test_a_reduce_op_or_group_of_the_wrong_kind_is_an_argument_error(call):
    buf = st.from_torch(torch.ones(2))
    with pytest.raises(ArgumentError, match="op=|group="):
        call(buf)
    assert buf._is_live()


def test_a_partition_is_refused_with_a_hint_to_pass_the_tensor():
    p = st.from_torch(torch.ones(4)).partition((2,))
    with pytest.raises(ArgumentError, match="unpartition"):
        st.all_reduce(p)
    assert p._is_live()


def test_a_moved_buffer_is_refused_before_the_process_group_is_consulted():
    t = st.from_torch(torch.ones(4))
    p = t.partition((2,))
    with pytest.raises(MovedError):
        st.all_reduce(t)
    assert p._is_live()


# -- NCCL (one GPU: a group of one rank, which exercises the device path) --------------------

def _nccl_group_of_one():
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(_free_port())
    dist.init_process_group("nccl", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))


@pytest.mark.gpu
def test_nccl_all_reduce_runs_on_the_stream_and_hands_the_cuda_buffer_back():
    _nccl_group_of_one()
    try:
        buf = st.from_torch(torch.arange(8, dtype=torch.float32, device="cuda"))
        out = st.all_reduce(buf).sync()
        assert out is buf and out.to_torch().tolist() == list(range(8))
        cpu = st.from_torch(torch.ones(4))
        with pytest.raises(CollectiveError, match="nccl"):
            st.all_reduce(cpu)
        assert cpu._is_live()
    finally:
        dist.destroy_process_group()
