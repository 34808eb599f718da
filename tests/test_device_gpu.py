"""DeviceOps on the GPU: sync, then, await without blocking the loop, CUDA graphs, streams."""
import asyncio
import time

import pytest
import torch

import safetile as st
import safetile.lang as sl
from safetile.device.aio import run_async
from safetile.tensor import active_holds

pytestmark = pytest.mark.gpu


@st.kernel
def add(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) + sl.load_like(y, z))


@st.kernel
def fma(x: st.In[st.f32], z: st.Out[st.f32], a: float):
    z.store(z.load() * a + sl.load_like(x, z))


@st.kernel
def spin(x: st.In[st.f32], z: st.Out[st.f32], n: int):
    acc = sl.load_like(x, z)
    for i in range(n):
        acc = acc * 0.999 + 0.001
    z.store(acc)


def cuda(t):
    return st.from_torch(t.cuda())


def test_sync_and_a_then_chain_match_torch():
    xt, yt = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    x, y = st.from_torch(xt.clone()), st.from_torch(yt.clone())
    op = add(x, y, st.empty((5000,), device="cuda").partition((1024,)))
    op = op.then(lambda x, y, z: fma(x, z, 0.5))
    for _ in range(98):
        op = op.then(lambda x, z, a: fma(x, z, 0.5))
    out = op.sync()
    ref = xt + yt
    for _ in range(99):
        ref = ref * 0.5 + xt
    assert torch.allclose(out[1].unpartition().to_torch(), ref, rtol=1e-5, atol=1e-5)


def _spin_n_for(ms: float) -> int:
    n = 200_000
    x, z = st.ones((1024,), device="cuda"), st.empty((1024,), device="cuda").partition((1024,))
    x, z, _ = spin(x, z, n).sync()                        # compile this specialization
    t0 = time.perf_counter()
    spin(x, z, n).sync()
    took = time.perf_counter() - t0
    return max(1000, int(n * (ms / 1e3) / max(took, 1e-6)))


def test_await_does_not_block_the_loop_while_a_long_kernel_runs():
    n = _spin_n_for(50)
    ticks = []

    async def ticker(stop):
        while not stop.is_set():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.001)

    async def main():
        stop = asyncio.Event()
        task = asyncio.create_task(ticker(stop))
        await asyncio.sleep(0)
        x, z = st.ones((1024,), device="cuda"), st.empty((1024,), device="cuda").partition((1024,))
        t0 = time.perf_counter()
        await spin(x, z, n)
        elapsed = time.perf_counter() - t0
        stop.set()
        await task
        return t0, elapsed

    t0, elapsed = asyncio.run(main())
    during = [t for t in ticks if t0 < t < t0 + elapsed]
    assert elapsed > 0.02, elapsed
    assert len(during) >= 10, f"{len(during)} ticks in {elapsed * 1e3:.1f} ms"


def test_many_awaits_complete_with_correct_results():
    xt = torch.randn(1024, device="cuda")

    async def one(i):
        _, _, z = await add(st.from_torch(xt.clone()), st.full((1024,), float(i), device="cuda"),
                            st.empty((1024,), device="cuda").partition((256,)))
        return z

    async def main():
        return await asyncio.gather(*(one(i) for i in range(200)))

    for i, z in enumerate(asyncio.run(main())):
        assert torch.equal(z.unpartition().to_torch(), xt + i)


def test_a_submitted_op_hands_its_values_back_when_its_loop_stops_before_resolving_it():
    """The loop stops with the op's completion still to come, and is closed without running
    again: the op's borrows end and its values come back all the same."""
    x, y = cuda(torch.randn(4096)), cuda(torch.randn(4096))
    z = st.empty((4096,), device="cuda").partition((1024,))
    loop = asyncio.new_event_loop()

    async def main():
        return st.submit(add(x, y, z))         # not awaited

    fut = loop.run_until_complete(main())
    deadline = time.monotonic() + 30
    while active_holds() and time.monotonic() < deadline:
        time.sleep(0.01)
    loop.close()
    assert active_holds() == [] and not fut.done()
    assert torch.equal(z.unpartition().to_torch(), x.to_torch() + y.to_torch())


def test_an_op_submitted_as_its_loop_stops_hands_its_values_back_when_the_loop_is_closed():
    """The op is submitted in the loop's last iteration, so the call that hands its batch to
    the reactor is still queued when the loop is closed (which drops it): its borrows end and
    its values come back all the same."""
    x, y = cuda(torch.randn(4096)), cuda(torch.randn(4096))
    z = st.empty((4096,), device="cuda").partition((1024,))
    loop = asyncio.new_event_loop()
    futs = []

    def last_iteration():
        loop.stop()
        futs.append(st.submit(add(x, y, z)))

    loop.call_soon(last_iteration)
    loop.run_forever()
    loop.close()
    deadline = time.monotonic() + 30
    while active_holds() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert active_holds() == [] and not futs[0].done()
    assert torch.equal(z.unpartition().to_torch(), x.to_torch() + y.to_torch())


def test_submitted_futures_gather_without_tasks_and_hand_values_back():
    xt = torch.randn(1024, device="cuda")

    async def main():
        futs = [st.submit(add(st.from_torch(xt.clone()), st.full((1024,), float(i), device="cuda"),
                              st.empty((1024,), device="cuda").partition((256,))))
                for i in range(100)]
        assert all(asyncio.isfuture(f) for f in futs)
        return await asyncio.gather(*futs)

    for i, (_, _, z) in enumerate(asyncio.run(main())):
        assert torch.equal(z.unpartition().to_torch(), xt + i)
    assert active_holds() == []                # every borrow ended at completion


def _pipeline(x, y, z):
    return add(x, y, z).then(lambda x, y, z: fma(x, z, 1.5)).then(lambda x, z, a: fma(x, z, -0.25))


def test_graph_replay_matches_eager_bit_for_bit():
    torch.manual_seed(0)
    xt, yt = torch.randn(70000, device="cuda"), torch.randn(70000, device="cuda")
    _, z_eager, _ = _pipeline(st.from_torch(xt.clone()), st.from_torch(yt.clone()),
                              st.empty((70000,), device="cuda").partition((4096,))).sync()
    g = _pipeline(st.from_torch(xt.clone()), st.from_torch(yt.clone()),
                  st.zeros((70000,), device="cuda").partition((4096,))).graph()
    _, z_graph, _ = g.launch().sync()
    assert torch.equal(z_graph.unpartition().to_torch(), z_eager.unpartition().to_torch())


def test_graph_scope_replays_a_write_then_a_read_and_update_refreshes_inputs():
    x, y = cuda(torch.arange(8.0)), cuda(torch.ones(8))
    z, w = st.zeros((8,), device="cuda"), st.zeros((8,), device="cuda")
    with st.graph_scope() as s:
        x, y, zp = s.record(add(x, y, z.partition((4,))))
        z = zp.unpartition()
        z, w_p, _ = s.record(fma(z, w.partition((4,)), 0.0))
    s.launch().sync()
    assert w_p.unpartition().to_torch().tolist() == (torch.arange(8.0) + 1).tolist()

    g = add(x, y, st.empty((8,), device="cuda").partition((4,))).graph()
    _, y, out = g.launch().sync()
    g.update(add(cuda(torch.full((8,), 5.0)), y, out.unpartition().partition((4,))))
    _, _, out = g.launch().sync()
    assert out.unpartition().to_torch().tolist() == [6.0] * 8


def test_replays_can_be_awaited_and_chained():
    z = st.zeros((1024,), device="cuda")
    one = st.ones((1024,), device="cuda")
    g = fma(one, z.partition((256,)), 1.0).graph()

    async def main():
        await g.launch().then(lambda *v: g.launch())

    asyncio.run(main())
    assert torch.equal(g.output[1].unpartition().to_torch(), torch.full((1024,), 2.0, device="cuda"))


def test_ops_on_explicit_streams_and_the_default_stream_policy():
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    before = torch.cuda.current_stream()
    a = add(cuda(torch.ones(4096)), cuda(torch.ones(4096)), st.empty((4096,), device="cuda").partition((1024,)))
    b = add(cuda(torch.ones(4096)), cuda(torch.full((4096,), 2.0)), st.empty((4096,), device="cuda").partition((1024,)))
    _, _, za = a.sync(stream=s1)
    _, _, zb = b.sync(stream=s2)
    assert torch.cuda.current_stream() == before
    assert torch.equal(za.unpartition().to_torch(), torch.full((4096,), 2.0, device="cuda"))
    assert torch.equal(zb.unpartition().to_torch(), torch.full((4096,), 3.0, device="cuda"))


@st.kernel
def copy(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z))


def test_an_op_on_another_stream_runs_after_its_arguments_fills_on_the_current_one():
    n = 1 << 22
    x = st.ones((n,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)             # the current stream is busy for a while
    z = st.zeros((n,), device="cuda")            # its fill waits behind the sleep
    _, z = copy(x, z.partition((1024,))).sync(stream=torch.cuda.Stream())
    assert z.unpartition().to_torch().sum().item() == n


def test_unchained_ops_awaited_on_two_streams_both_finish():
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    async def main():
        ops = [add(cuda(torch.ones(4096)), cuda(torch.full((4096,), float(i))),
                   st.empty((4096,), device="cuda").partition((1024,))) for i in range(2)]
        return await asyncio.gather(run_async(ops[0], s1), run_async(ops[1], s2))

    (_, _, z0), (_, _, z1) = asyncio.run(main())
    assert torch.equal(z0.unpartition().to_torch(), torch.full((4096,), 1.0, device="cuda"))
    assert torch.equal(z1.unpartition().to_torch(), torch.full((4096,), 2.0, device="cuda"))


def test_a_misaligned_pointer_gets_its_own_binary_and_a_correct_result():
    base = torch.arange(2049.0, device="cuda")
    ones = cuda(torch.ones(2048))
    _, _, z = add(st.from_torch(base[:2048]), ones, st.empty((2048,), device="cuda").partition((1024,))).sync()
    assert torch.equal(z.unpartition().to_torch(), base[:2048] + 1)
    _, _, z = add(st.from_torch(base[1:]), cuda(torch.ones(2048)),
                  st.empty((2048,), device="cuda").partition((1024,))).sync()
    assert torch.equal(z.unpartition().to_torch(), base[1:] + 1)


@st.kernel
def times(x: st.In[st.f32], z: st.Out[st.f32], k: int):
    z.store(sl.load_like(x, z) * k)


class _Int(int):
    pass


def test_int_subclass_arguments_get_binaries_of_their_own_values():
    # Triton specializes an int argument on == 1 and on divisibility by 16: a subclass
    # value must not reuse the binary another value was specialized for
    for k in (1, _Int(1), _Int(3), _Int(16), _Int(17)):
        x, z, _ = times(st.ones((64,), device="cuda"),
                        st.empty((64,), device="cuda").partition((64,)), k).sync()
        assert z.unpartition().to_torch()[0].item() == float(int.__int__(k))


def test_a_dtype_set_through_the_callers_torch_tensor_leaves_a_cached_gpu_launch_as_it_was():
    base = torch.ones(64, device="cuda")
    x, z = st.from_torch(base), st.empty((64,), device="cuda").partition((64,))
    x, z, _ = times(x, z, 2).sync()
    base.data = base.view(torch.int32)          # the caller's tensor, not the handle's view
    x, z, _ = times(x, z, 2).sync()
    assert x.dtype is st.f32 and z.unpartition().to_torch()[0].item() == 2.0
