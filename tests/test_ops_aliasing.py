"""Which tensors an op may share between its arguments, on the CPU executor.

One tensor (a Tensor or a Shared handle) may feed several inputs of any op; an output may
overlap no input and no other output. An op of several launches refuses such an output when
it is built, as one launch does, before any of its launches has written anything.
"""
import gc

import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import position as i32
from support import ROPE_THETA as THETA
from support import rand, wrap

cpu_executor = support.cpu_executor(seed=8)
no_leftover_holds = support.no_leftover_holds()


# ---- one tensor for several inputs ------------------------------------------------------------

def test_matmul_accepts_one_tensor_for_both_operands():
    t = rand((16, 16), st.f32, 0)
    a = wrap(t)
    c = ops.matmul(a, a).sync()
    torch.testing.assert_close(c.to_torch(), t @ t, rtol=1e-5, atol=1e-5)
    assert torch.equal(a.to_torch(), t)


def test_matmul_accepts_one_shared_handle_for_both_operands_and_hands_it_back_unwrappable():
    t = rand((16, 16), st.f32, 1)
    s = wrap(t).share()
    c = ops.matmul(s, s, weight=True).sync()
    torch.testing.assert_close(c.to_torch(), t @ t.T, rtol=1e-5, atol=1e-5)
    assert torch.equal(s.try_unwrap().to_torch(), t)


def test_add_accepts_one_shared_handle_for_both_inputs():
    t = rand(100, st.f32, 2)
    s = wrap(t).share()
    assert torch.equal(ops.add(s, s).sync().to_torch(), t + t)


def test_flash_attention_accepts_one_tensor_for_q_k_and_v():
    t = rand((2, 20, 16), st.f32, 3)
    x = wrap(t)
    out = ops.flash_attention(x, x, x, block_m=16, block_n=16).sync()
    want = torch.nn.functional.scaled_dot_product_attention(t, t, t, is_causal=True)
    torch.testing.assert_close(out.to_torch(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("splits", [1, 2])
def test_decode_attention_accepts_one_shared_handle_for_k_and_v(splits):
    q, kv = rand((4, 16), st.f32, 4), rand((2, 40, 16), st.f32, 5)
    s = wrap(kv).share()
    got = ops.decode_attention(wrap(q), s, s, i32(30), block_n=16, num_splits=splits).sync()
    want = ops.decode_attention(wrap(q), wrap(kv), wrap(kv), i32(30), block_n=16,
                                num_splits=splits).sync()
    assert torch.equal(got.to_torch(), want.to_torch())


@pytest.mark.parametrize("many", [False, True], ids=["kv_append", "kv_append_many"])
def test_kv_append_accepts_one_tensor_for_k_new_and_v_new(many):
    new = rand((2, 3, 16) if many else (2, 16), st.f32, 6)
    x = wrap(new)
    append = ops.kv_append_many if many else ops.kv_append
    k, v = append(x, x, i32(5), st.zeros((2, 20, 16)), st.zeros((2, 20, 16))).sync()
    rows = new if many else new[:, None]
    assert torch.equal(k.to_torch()[:, 5:5 + rows.shape[1]], rows)
    assert torch.equal(v.to_torch(), k.to_torch())


def test_qk_norm_rope_kv_append_accepts_one_shared_norm_weight_for_q_and_k():
    args = support.prologue_arguments(max_seq=16, seed=7)
    weight = wrap(args["q_norm_weight"]).share()
    q, _, _ = ops.qk_norm_rope_kv_append(
        wrap(args["qkv"]), weight, weight, i32(1), ops.inv_freq_table(32, THETA, "cpu"),
        wrap(args["k_cache"]), wrap(args["v_cache"])).sync()
    want, _, _ = ops.qk_norm_rope_kv_append(
        wrap(args["qkv"]), wrap(args["q_norm_weight"]), wrap(args["q_norm_weight"]), i32(1),
        ops.inv_freq_table(32, THETA, "cpu"), wrap(args["k_cache"]),
        wrap(args["v_cache"])).sync()
    assert torch.equal(q.to_torch(), want.to_torch())


def test_an_op_given_one_shared_handle_for_two_inputs_makes_no_other_handle():
    s = wrap(rand(64, st.f32, 20)).share()
    op = ops.add(s, s)
    op.sync()
    assert s.num_handles == 1
    assert s.try_unwrap().shape == (64,)                   # while the op object lives


@pytest.mark.parametrize("config", [
    ops.MatmulConfig(16, 16, 16, 4, 2, split_k=2),
    ops.MatmulConfig(16, 16, 16, 4, 2, head_rows=16, tail=ops.MatmulConfig(16, 16, 16, 4, 2))],
    ids=["split_k", "head_tail"])
def test_a_matmul_of_several_launches_given_one_shared_handle_makes_no_other_handle(config):
    t = rand((48, 48), st.f32, 21)
    s = wrap(t).share()
    op = ops.matmul(s, s, config=config, weight=True)
    c = op.sync()
    torch.testing.assert_close(c.to_torch(), t @ t.T, rtol=1e-5, atol=1e-5)
    assert s.num_handles == 1 and s.try_unwrap().shape == (48, 48)


def test_a_graph_of_an_op_given_one_shared_handle_for_two_inputs_replays_and_pins_no_handle():
    t = rand(64, st.f32, 22)
    s, out = wrap(t).share(), st.zeros((64,))
    g = ops.add(s, s, out=out).graph()
    assert s.num_handles == 1
    g.launch().sync()
    assert torch.equal(out.to_torch(), t + t)
    back = s.try_unwrap()                                   # while the graph lives
    ops.copy(wrap(torch.ones(64)), out=back).sync()
    g.launch().sync()                                       # reads the bytes as they are now
    assert torch.equal(out.to_torch(), torch.full((64,), 2.0))


def test_an_input_tensor_stays_readable_but_not_writable_while_its_op_is_pending():
    t = rand((16, 16), st.f32, 19)
    a = wrap(t)
    op = ops.matmul(a, wrap(t))
    assert torch.equal(a.to_torch(), t)
    with pytest.raises(st.AliasError):
        ops.add(wrap(t), wrap(t), out=a)
    op.sync()
    ops.add(wrap(t), wrap(t), out=a).sync()


# ---- outputs overlapping inputs: refused before anything runs ---------------------------------

def one_launch_overlaps() -> dict:
    """Ops of one launch, each given an output overlapping one of its own arguments, by the
    message naming the op and both arguments (the kernels call them otherwise)."""
    x, w = wrap(rand((4, 16), st.f32, 20)), wrap(rand(16, st.f32, 21))
    buf, k = st.empty((4, 16)), wrap(rand((2, 40, 16), st.f32, 22))
    return {
        "ops.add: the output out overlaps the input x": lambda: ops.add(x, x, out=x),
        "ops.add_rmsnorm: the output out overlaps the output residual_out":
            lambda: ops.add_rmsnorm(x, x, w, out=buf, residual_out=buf),
        "ops.gemv: the output out overlaps the input x": lambda: ops.gemv(
            wrap(rand((16, 16), st.f32, 23)), w, out=w),
        "ops.decode_attention: the output out overlaps the input k_cache": lambda:
            ops.decode_attention(x, k, wrap(rand((2, 40, 16), st.f32, 24)), i32(9),
                                 out=k[0, :4], num_splits=1),
    }


@pytest.mark.parametrize("message", list(one_launch_overlaps()))
def test_an_op_of_one_launch_names_itself_and_its_own_arguments_for_an_overlap(message):
    with pytest.raises(st.AliasError, match=message):
        one_launch_overlaps()[message]()


def test_an_op_that_names_an_overlap_keeps_the_refused_launch_s_arguments_as_recovered():
    x = wrap(rand((64,), st.f32, 3))
    with pytest.raises(st.AliasError, match="ops.copy") as e:
        ops.copy(x, x)
    assert e.value.recovered is not None and len(e.value.recovered) == 2


def test_qk_norm_rope_kv_append_refuses_a_q_out_in_the_cache_on_the_two_kernel_path():
    args = support.prologue_arguments(max_seq=100, seed=9)
    k_cache = wrap(args["k_cache"])
    with pytest.raises(st.AliasError, match="q_out"):
        ops.qk_norm_rope_kv_append(
            wrap(args["qkv"]), wrap(args["q_norm_weight"]), wrap(args["k_norm_weight"]),
            i32(8), ops.inv_freq_table(32, THETA, "cpu"), k_cache, wrap(args["v_cache"]),
            q_out=k_cache[0, 7:11], block_s=64)
    assert torch.equal(k_cache.to_torch(), args["k_cache"])


@pytest.mark.parametrize("target", ["q", "k_cache"])
def test_decode_attention_on_the_split_path_refuses_an_out_overlapping_an_input(target):
    q, k = wrap(rand((4, 16), st.f32, 10)), wrap(rand((2, 200, 16), st.f32, 11))
    out = q if target == "q" else k[0, :4]
    with pytest.raises(st.AliasError, match=target):
        ops.decode_attention(q, k, wrap(rand((2, 200, 16), st.f32, 12)), i32(100), out=out,
                             num_splits=4)


def test_matmul_split_k_refuses_an_out_aliasing_a():
    a = wrap(rand((16, 16), st.f32, 13))
    cfg = ops.MatmulConfig(16, 16, 16, 4, 2, split_k=2)
    with pytest.raises(st.AliasError, match="out"):
        ops.matmul(a, wrap(torch.eye(16)), out=a, config=cfg, workspace=st.empty((32, 16)))


def test_matmul_head_tail_refuses_an_out_overlapping_a_before_writing_any_row():
    t = rand((48, 16), st.f32, 14)
    big = wrap(t)
    cfg = ops.MatmulConfig(16, 16, 16, 4, 2, head_rows=16,
                           tail=ops.MatmulConfig(16, 16, 16, 4, 2))
    with pytest.raises(st.AliasError, match="out"):
        ops.matmul(big[16:48], wrap(torch.eye(16)), out=big[0:32], config=cfg)
    assert torch.equal(big.to_torch(), t)


def expanded(rows: int, cols: int):
    """A (rows, cols) tensor whose rows are one row of memory (torch's expand)."""
    return st.from_torch(torch.zeros(1, cols).expand(rows, cols))


def test_an_op_refuses_an_out_whose_elements_overlap_naming_the_op_and_out():
    with pytest.raises(st.ArgumentError, match=r"ops\.add: out: its elements overlap"):
        ops.add(wrap(rand((4, 16), st.f32, 30)), wrap(rand((4, 16), st.f32, 31)),
                out=expanded(4, 16))


def test_split_decode_attention_refuses_an_overlapping_out_when_built():
    ws = ops.DecodeWorkspace(1, 4, 16, 2)
    with pytest.raises(st.ArgumentError, match=r"ops\.decode_attention: out: its elements"):
        ops.decode_attention(wrap(rand((4, 16), st.f32, 32)), wrap(rand((1, 40, 16), st.f32, 33)),
                             wrap(rand((1, 40, 16), st.f32, 34)), i32(30), out=expanded(4, 16),
                             workspace=ws, num_splits=2, block_n=16)
    assert ws.partial._is_live()                        # nothing was moved into an op


def test_split_k_matmul_refuses_an_overlapping_workspace():
    cfg = ops.MatmulConfig(16, 16, 16, 4, 2, split_k=2)
    with pytest.raises(st.ArgumentError, match=r"ops\.matmul: workspace: its elements overlap"):
        ops.matmul(wrap(rand((16, 16), st.f32, 35)), wrap(torch.eye(16)), config=cfg,
                   workspace=expanded(32, 16))


def test_argmax_refuses_an_out_inside_its_workspace():
    ws = ops.argmax_workspace(3000, device="cpu")
    with pytest.raises(st.AliasError, match="out"):
        ops.argmax(wrap(rand(3000, st.f32, 15)), out=ws.indices[0:1], workspace=ws)


def test_rmsnorm_gemv_argmax_refuses_a_token_inside_its_workspace():
    w = wrap(rand((300, 64), st.f32, 16))
    ws = ops.gemv_argmax_workspace(w)
    with pytest.raises(st.AliasError, match="token"):
        ops.rmsnorm_gemv_argmax(wrap(rand(64, st.f32, 17)), wrap(rand(64, st.f32, 18)), w,
                                token=ws.indices[0:1], workspace=ws)


# ---- an op of several launches borrows what its later launches write, from when it is built ---

def _argmax():
    out = st.empty((1,), dtype=st.i64, device="cpu")
    return ops.argmax(wrap(rand(3000, st.f32, 20)), out=out), out, out


def _rmsnorm_gemv_argmax():
    token = st.empty((1,), dtype=st.i64, device="cpu")
    return ops.rmsnorm_gemv_argmax(wrap(rand(64, st.f32, 21)), wrap(rand(64, st.f32, 22)),
                                   wrap(rand((300, 64), st.f32, 23)), token=token), token, token


def _decode_attention_splits():
    out = st.empty((4, 16), device="cpu")
    return ops.decode_attention(wrap(rand((4, 16), st.f32, 24)),
                                wrap(rand((2, 200, 16), st.f32, 25)),
                                wrap(rand((2, 200, 16), st.f32, 26)), i32(100), out=out,
                                num_splits=4), out, out


def _matmul_split_k():
    out = st.empty((16, 16), device="cpu")
    return ops.matmul(wrap(rand((16, 48), st.f32, 27)), wrap(rand((48, 16), st.f32, 28)),
                      out=out, config=ops.MatmulConfig(16, 16, 16, 4, 2, split_k=2),
                      workspace=st.empty((32, 16), device="cpu")), out, out


def _matmul_head_tail():
    out = st.empty((48, 16), device="cpu")
    cfg = ops.MatmulConfig(16, 16, 16, 4, 2, head_rows=16, tail=ops.MatmulConfig(16, 16, 16, 4, 2))
    return ops.matmul(wrap(rand((48, 16), st.f32, 29)), wrap(rand((16, 16), st.f32, 30)),
                      out=out, config=cfg), out[16:48], out


def _qk_norm_rope_kv_append_long_cache():
    args = support.prologue_arguments(max_seq=100, seed=31)
    k_cache = wrap(args["k_cache"])
    return ops.qk_norm_rope_kv_append(
        wrap(args["qkv"]), wrap(args["q_norm_weight"]), wrap(args["k_norm_weight"]), i32(8),
        ops.inv_freq_table(32, THETA, "cpu"), k_cache, wrap(args["v_cache"]),
        block_s=64), k_cache, k_cache


def _sample():
    out = st.empty((1,), dtype=st.i32, device="cpu")
    return ops.sample(wrap(rand(1200, st.f32, 32)), ops.sampling_params(0.9, 20, 0.95, device="cpu"),
                      ops.sampling_key(3, device="cpu"), i32(0), out=out), out, out


# Each makes (the op, what only a later launch of it writes, the output handle it was given).
SEVERAL_LAUNCHES = {f.__name__.lstrip("_"): f for f in (
    _argmax, _rmsnorm_gemv_argmax, _decode_attention_splits, _matmul_split_k, _matmul_head_tail,
    _qk_norm_rope_kv_append_long_cache, _sample)}


def _write_through(view) -> None:
    """A launch writes ``view``'s bytes and the host reads them back: nothing borrows them."""
    src = st.full(tuple(view.shape), 7, dtype=view.dtype, device="cpu")
    assert (ops.copy(src, view).sync().to_torch() == 7).all()


@pytest.mark.parametrize("name", SEVERAL_LAUNCHES)
def test_an_op_of_several_launches_keeps_the_host_from_taking_what_a_later_launch_writes(name):
    op, written, _ = SEVERAL_LAUNCHES[name]()
    view = written.view(tuple(written.shape))
    with pytest.raises(st.BorrowError, match="later launch"):
        view.into_torch()
    with pytest.raises(st.BorrowError, match="later launch"):
        view.to_torch()
    op.sync()
    _write_through(view)                            # the borrow ended with the op


@pytest.mark.parametrize("name", SEVERAL_LAUNCHES)
def test_an_op_of_several_launches_dropped_unrun_frees_what_a_later_launch_would_write(name):
    op, written, _ = SEVERAL_LAUNCHES[name]()
    with pytest.warns(st.UnrunOpWarning):
        del op
        gc.collect()
    _write_through(written.view(tuple(written.shape)))


def test_an_op_of_several_launches_is_refused_when_built_if_an_op_in_flight_reads_its_output():
    out = st.zeros((1,), dtype=st.i64, device="cpu")
    x = wrap(rand(3000, st.f32, 33))
    reader = ops.copy(out, st.empty((1,), dtype=st.i64, device="cpu"))   # in flight: reads out
    with pytest.raises(st.AliasError, match="later launch"):
        ops.argmax(x, out=out)
    assert int(reader.sync().to_torch()[0]) == 0
    assert int(ops.argmax(x, out=out).sync().to_torch()[0]) == int(torch.argmax(x.to_torch()))


def test_an_op_of_several_launches_chained_after_the_op_writing_its_input_runs_in_that_execution():
    x, y = rand(3000, st.f32, 34), rand(3000, st.f32, 35)
    out = st.empty((1,), dtype=st.i64, device="cpu")
    op = ops.add(wrap(x), wrap(y), out=st.empty((3000,), device="cpu"))
    assert op.then(lambda s: ops.argmax(s, out=out)).sync() is out
    assert int(out.to_torch()[0]) == int(torch.argmax(x + y))


def test_an_op_of_several_launches_recorded_in_a_graph_scope_replays_into_its_output():
    x = wrap(rand(3000, st.f32, 36))
    out = st.empty((1,), dtype=st.i64, device="cpu")
    ws = ops.argmax_workspace(3000, device="cpu")
    with st.graph_scope() as s:
        s.record(ops.argmax(x, out=out, workspace=ws))
    s.launch().sync()
    assert int(out.to_torch()[0]) == int(torch.argmax(x.to_torch()))


@pytest.mark.parametrize("read", ["key", "counter"])
def test_sample_keeps_the_host_from_taking_the_key_and_counter_that_only_a_later_launch_reads(read):
    inputs = dict(key=ops.sampling_key(3, device="cpu"), counter=i32(0))
    op = ops.sample(wrap(rand(1200, st.f32, 37)), ops.sampling_params(0.9, 20, 0.95, device="cpu"),
                    inputs["key"], inputs["counter"])
    view = inputs[read].view(tuple(inputs[read].shape))
    with pytest.raises(st.BorrowError, match="later launch"):
        view.into_torch()
    op.sync()
    _write_through(view)                            # the borrow ended with the op


@pytest.mark.parametrize("name", SEVERAL_LAUNCHES)
def test_an_op_of_several_launches_runs_after_the_caller_moves_the_output_handle_it_was_given(name):
    want_op, _, want = SEVERAL_LAUNCHES[name]()
    want_op.sync()
    op, _, handle = SEVERAL_LAUNCHES[name]()
    moved = handle.partition((1,) * handle.ndim)       # as it may after building one launch
    op.sync()
    assert torch.equal(moved.unpartition().to_torch(), want.to_torch())


def test_sample_writes_the_workspace_it_was_built_with_when_a_field_is_reassigned_before_it_runs():
    ws = ops.sampler_workspace(1200, device="cpu")
    op = ops.sample(wrap(rand(1200, st.f32, 38)), ops.sampling_params(0.9, 20, 0.95, device="cpu"),
                    ops.sampling_key(3, device="cpu"), i32(0), workspace=ws)
    ws.counts = st.zeros(tuple(ws.counts.shape), device="cpu")
    taken = ws.counts.into_torch()                  # no op reserved these bytes
    op.sync()
    assert not taken.any()


@pytest.mark.parametrize("field", ["values", "indices"])
def test_argmax_reads_the_workspace_it_was_built_with_when_a_field_is_reassigned_before_it_runs(
        field):
    x = rand(3000, st.f32, 39)
    ws = ops.argmax_workspace(3000, device="cpu", block=256)       # the max is in block 1
    op = ops.argmax(wrap(x), workspace=ws)
    setattr(ws, field, st.zeros(tuple(getattr(ws, field).shape), dtype=getattr(ws, field).dtype,
                                device="cpu"))
    assert int(op.sync().to_torch()[0]) == int(torch.argmax(x))


def test_sample_runs_after_the_caller_moves_the_shared_key_it_was_given():
    logits, params = wrap(rand(1200, st.f32, 38)), ops.sampling_params(0.9, 20, 0.95, device="cpu")
    want = int(ops.sample(logits, params, ops.sampling_key(3, device="cpu"), i32(0)).sync()
               .to_torch()[0])
    key = ops.sampling_key(3, device="cpu").share()
    op = ops.sample(logits, params, key, i32(0))
    elsewhere = ops.copy(key, st.empty((2,), dtype=key.dtype, device="cpu"))   # moves `key`
    assert int(op.sync().to_torch()[0]) == want
    elsewhere.sync()
    key.try_unwrap()                       # the op's own handle of the key is released


def test_a_sample_dropped_unrun_releases_its_own_handle_of_a_shared_key():
    key = ops.sampling_key(3, device="cpu").share()
    op = ops.sample(wrap(rand(1200, st.f32, 39)), ops.sampling_params(0.9, 20, 0.95, device="cpu"),
                    key, i32(0))
    with pytest.warns(st.UnrunOpWarning):
        del op
        gc.collect()
    key.try_unwrap()
