"""The race the safe API rules out: an attention kernel that permutes its output.

Attention over heads, each program computing one (head, query-block) tile, writes its result
in (seq, head, dim) layout with two heads trading places. Two forms of that kernel:

(a) unsafe: the kernel computes its destination from its program id and stores through a raw
    pointer. The swap is written as two sequential tests, and the second one looks at the
    already-swapped value, so heads ``a`` and ``b`` both land on destination ``a`` and
    destination ``b`` is never written. ``triton_twin`` is the same kernel in plain Triton.
(b) safe: each program owns one (query-block, head) tile of the output partition, so the
    destination is not the kernel's to choose. The permutation moves to the reads: the
    program for destination head ``j`` loads q, k and v of source head ``src[j]``.

On the CPU (always): (a) under the interpret backend raises ``RaceError`` naming the two
programs and an element both write; (b) is clean under several program orders and matches
torch. On CUDA (``--gpu``, or by default when CUDA is present): (a) and its Triton twin run 20
times each on identical inputs and the fraction of output elements that differ from the first
run is reported; (b) runs 20 times and must be bitwise identical. The numbers go to
benchmarks/results/race_demo.json. Exits non-zero on any unexpected result.
"""
from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

import safetile as st
import safetile.lang as sl

# Small enough for the CPU executor, which runs every program as Python.
CPU_SHAPE = dict(heads=4, seq=64, dim=32, block_m=16, block_n=16)
# Many programs (32 heads x 16 query blocks), each writing a whole 64x64 tile: the two
# colliding programs are neighbours in launch order, so they run at the same time.
GPU_SHAPE = dict(heads=32, seq=1024, dim=64, block_m=64, block_n=64)
SWAP = (1, 2)           # the two heads that trade places in the output
RUNS = 20


# -- the attention both safetile forms share -------------------------------------------------

@st.function
def online_softmax_step(qt, kt, vt, row_max, row_sum, acc, scale):
    """One key block of the online softmax: the updated (row_max, row_sum, acc)."""
    s = sl.matmul(qt, kt.T) * scale
    new_max = sl.maximum(row_max, sl.max(s, 1))
    alpha = sl.exp(row_max - new_max)
    p = sl.exp(s - new_max[:, None])
    return new_max, row_sum * alpha + sl.sum(p, 1), sl.mma(p, vt, acc * alpha[:, None])


# -- (a) unsafe: the kernel picks its destination ------------------------------------------

@st.kernel(unsafe=True)
def attention_unsafe(q: st.In[st.f32, 3], k: st.In[st.f32, 3], v: st.In[st.f32, 3],
                     out: st.Ptr[st.f32], a: int, b: int, scale: float,
                     D: st.Const[int], BM: st.Const[int], BN: st.Const[int]):
    """Program ``h + H * m`` attends query block ``m`` of head ``h`` and writes it to
    ``out[m*BM:(m+1)*BM, dest, :]`` of a contiguous (seq, heads, dim) buffer."""
    H = q.shape[0]
    h = sl.bid(0) % H
    m = sl.bid(0) // H
    qt = sl.reshape(q.load((h, m, 0), (1, BM, D)), (BM, D))
    row_max = sl.full((BM,), float("-inf"), st.f32)
    row_sum = sl.zeros((BM,), st.f32)
    acc = sl.zeros((BM, D), st.f32)
    for n in range(k.shape[1] // BN):                  # online softmax over key blocks
        kt = sl.reshape(k.load((h, n, 0), (1, BN, D)), (BN, D))
        vt = sl.reshape(v.load((h, n, 0), (1, BN, D)), (BN, D))
        row_max, row_sum, acc = online_softmax_step(qt, kt, vt, row_max, row_sum, acc, scale)
    # Heads a and b trade places. BUG: the second test reads the already-swapped value
    # (it should test h == b), so head a goes back to a and head b goes to a as well.
    dest = sl.where(h == a, b, h)
    dest = sl.where(dest == b, a, dest)
    rows = m * BM + sl.arange(BM)
    offsets = (rows[:, None] * H + dest) * D + sl.arange(D)[None, :]
    sl.store_ptr(out, offsets, acc / row_sum[:, None])


@triton.jit
def triton_twin(q_ptr, k_ptr, v_ptr, out_ptr, a, b, scale, H, S,
                D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """``attention_unsafe`` in plain Triton, with the same destination bug.

    q, k, v are contiguous (heads, seq, dim); out is a contiguous (seq, heads, dim) buffer.
    """
    h = tl.program_id(0) % H
    m = tl.program_id(0) // H
    rows = m * BM + tl.arange(0, BM)
    cols = tl.arange(0, D)
    base = h * S * D
    qt = tl.load(q_ptr + base + rows[:, None] * D + cols[None, :])
    row_max = tl.full((BM,), float("-inf"), tl.float32)
    row_sum = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    for n in range(0, S // BN):
        keys = n * BN + tl.arange(0, BN)
        kt = tl.load(k_ptr + base + keys[:, None] * D + cols[None, :])
        vt = tl.load(v_ptr + base + keys[:, None] * D + cols[None, :])
        s = tl.dot(qt, tl.trans(kt)) * scale
        new_max = tl.maximum(row_max, tl.max(s, 1))
        alpha = tl.exp(row_max - new_max)
        p = tl.exp(s - new_max[:, None])
        row_sum = row_sum * alpha + tl.sum(p, 1)
        acc = tl.dot(p, vt, acc * alpha[:, None])
        row_max = new_max
    dest = tl.where(h == a, b, h)
    dest = tl.where(dest == b, a, dest)          # BUG: should test h == b
    offsets = (rows[:, None] * H + dest) * D + cols[None, :]
    tl.store(out_ptr + offsets, acc / row_sum[:, None])


# -- (b) safe: the destination is the owned tile ----------------------------------------------

@st.kernel
def attention_safe(q: st.In[st.f32, 3], k: st.In[st.f32, 3], v: st.In[st.f32, 3],
                   src: st.In[st.i32, 1], out: st.Out[st.f32, 2], scale: float,
                   BN: st.Const[int]):
    """``out`` is the (seq, heads * dim) output partitioned into (BM, dim) tiles: tile
    ``(m, j)`` is query block ``m`` of destination head ``j``, which attends source head
    ``src[j]``. Choosing what to *read* is free; where to write is the owned tile."""
    m, j = out.index
    BM = out.shape[0]
    D = out.shape[1]
    h = src.load_scalar((j,))
    qt = sl.reshape(q.load((h, m, 0), (1, BM, D)), (BM, D))
    row_max = sl.full((BM,), float("-inf"), st.f32)
    row_sum = sl.zeros((BM,), st.f32)
    acc = sl.zeros((BM, D), st.f32)
    for n in range(k.shape[1] // BN):
        kt = sl.reshape(k.load((h, n, 0), (1, BN, D)), (BN, D))
        vt = sl.reshape(v.load((h, n, 0), (1, BN, D)), (BN, D))
        row_max, row_sum, acc = online_softmax_step(qt, kt, vt, row_max, row_sum, acc, scale)
    out.store(acc / row_sum[:, None])


# -- host side ------------------------------------------------------------------------------

def swapped_heads(heads: int, a: int, b: int) -> list[int]:
    """The intended permutation: destination head of each head (a and b trade places)."""
    dest = list(range(heads))
    dest[a], dest[b] = dest[b], dest[a]
    return dest


def botched_swap(heads: int, a: int, b: int) -> list[int]:
    """The unsafe kernel's slip applied on the host: ``[0, 1, 1, 3]`` for a, b = 1, 2."""
    out = []
    for h in range(heads):
        d = b if h == a else h
        out.append(a if d == b else d)
    return out


def inverse(perm: list[int]) -> list[int]:
    """``src`` with ``src[perm[h]] == h``: which head each destination reads."""
    src = [0] * len(perm)
    for h, d in enumerate(perm):
        src[d] = h
    return src


def make_inputs(shape: dict, device=None, seed: int = 0):
    """q, k, v of shape (heads, seq, dim), fp32, reproducible."""
    dims = (shape["heads"], shape["seq"], shape["dim"])
    return tuple(st.randn(dims, device=device, seed=seed + i) for i in range(3))


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, src: list[int]) -> torch.Tensor:
    """(seq, heads * dim): destination head j holds attention of source head src[j] (fp64)."""
    q, k, v = q.double(), k.double(), v.double()
    o = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(q.shape[2]), dim=-1) @ v
    heads, seq, dim = o.shape
    return o[src].transpose(0, 1).reshape(seq, heads * dim)


def _check_shape(shape: dict) -> None:
    if shape["seq"] % shape["block_m"] or shape["seq"] % shape["block_n"]:
        raise ValueError(f"seq {shape['seq']} must be a multiple of the blocks in {shape}")


def launch_unsafe(q, k, v, out, shape: dict, swap=SWAP) -> st.DeviceOp:
    """(a): ``out`` is a (seq, heads * dim) Tensor the kernel writes through a raw pointer."""
    _check_shape(shape)
    grid = (shape["heads"] * (shape["seq"] // shape["block_m"]),)
    with st.unsafe():
        return attention_unsafe.options(grid=grid)(
            q, k, v, out, swap[0], swap[1], 1 / math.sqrt(shape["dim"]),
            shape["dim"], shape["block_m"], shape["block_n"])


def launch_safe(q, k, v, src, out, shape: dict) -> st.DeviceOp:
    """(b): ``src`` is an int32 Tensor (source head of each destination head)."""
    _check_shape(shape)
    part = out.partition((shape["block_m"], shape["dim"]))
    return attention_safe(q, k, v, src, part, 1 / math.sqrt(shape["dim"]), shape["block_n"])


def launch_twin(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                shape: dict, swap=SWAP) -> None:
    """(a) in plain Triton on torch tensors; ``out`` is (seq, heads * dim), contiguous."""
    _check_shape(shape)
    heads, seq = shape["heads"], shape["seq"]
    grid = (heads * (seq // shape["block_m"]),)
    triton_twin[grid](q, k, v, out, swap[0], swap[1], 1 / math.sqrt(shape["dim"]), heads, seq,
                      D=shape["dim"], BM=shape["block_m"], BN=shape["block_n"])


def head_block(program: int, shape: dict) -> tuple[int, int]:
    """(head, query block) of a program of the unsafe kernel (program = h + heads * m)."""
    return program % shape["heads"], program // shape["heads"]


def explain_race(error: st.RaceError, shape: dict) -> tuple[list[int], str]:
    """The programs a RaceError names, and what they and the element mean here."""
    text = str(error)
    progs = [int(p) for p in re.findall(r"program (\d+)", text)]
    who = ", ".join(f"program {p} = (head {h}, query block {m})"
                    for p, (h, m) in ((p, head_block(p, shape)) for p in progs))
    element = re.search(r"element \((\d+), (\d+)\)", text)
    if element is None:
        return progs, f"{who}; no element named in: {text}"
    row, col = (int(x) for x in element.groups())
    where = f"query {row}, destination head {col // shape['dim']}, dim {col % shape['dim']}"
    return progs, f"{who}; element = {where}"


# -- on the CPU: the sanitizer finds the race, the safe form is clean ---------------------------

def cpu_demo(seeds=(0, 1, 2)) -> bool:
    shape, (a, b) = CPU_SHAPE, SWAP
    q, k, v = make_inputs(shape, device="cpu")
    qt, kt, vt = q.to_torch(), k.to_torch(), v.to_torch()
    heads, seq, dim = shape["heads"], shape["seq"], shape["dim"]
    ok = True

    print(f"(a) unsafe kernel, heads {a} and {b} swapped, on the CPU executor:")
    for seed in seeds:
        out = st.zeros((seq, heads * dim), device="cpu")
        try:
            with st.backend("interpret", seed=seed):
                launch_unsafe(q, k, v, out, shape).sync()
        except st.RaceError as e:
            progs, meaning = explain_race(e, shape)
            print(f"  seed {seed}: RaceError: {e}\n    [{meaning}]")
            if len(set(progs)) != 2:
                print("    UNEXPECTED: the error should name two programs")
                ok = False
        else:
            print(f"  seed {seed}: UNEXPECTED: no RaceError")
            ok = False

    print("(b) safe kernel (destination = owned tile, permutation on the reads):")
    src = inverse(swapped_heads(heads, a, b))
    want = reference(qt, kt, vt, src)
    results = []
    for seed in seeds:
        src_t = st.from_torch(torch.tensor(src, dtype=torch.int32))
        with st.backend("interpret", seed=seed):
            *_, part, _, _ = launch_safe(q, k, v, src_t, st.zeros((seq, heads * dim),
                                                                   device="cpu"), shape).sync()
        got = part.unpartition().to_torch()
        err = ((got.double() - want).norm() / want.norm()).item()
        results.append(got)
        good = err < 1e-5
        ok &= good
        print(f"  seed {seed}: clean; relative error vs torch {err:.1e}"
              f"{'' if good else '  MISMATCH'}")
    same = all(torch.equal(results[0], r) for r in results[1:])
    ok &= same
    print(f"  identical across program orders: {same}")

    # The same slip, made where the safe form leaves room for it (which head to read), is a
    # wrong answer that is the same on every run: a reference check catches it every time.
    slip = botched_swap(heads, a, b)
    print(f"(b) safe kernel reading heads {slip} (the same slip, now in the reads):")
    outs = []
    for seed in seeds:
        src_t = st.from_torch(torch.tensor(slip, dtype=torch.int32))
        with st.backend("interpret", seed=seed):
            *_, part, _, _ = launch_safe(q, k, v, src_t, st.zeros((seq, heads * dim),
                                                                   device="cpu"), shape).sync()
        outs.append(part.unpartition().to_torch())
    same = all(torch.equal(outs[0], r) for r in outs[1:])
    wrong = ((outs[0].double() - want).norm() / want.norm()).item() > 1e-2
    ok &= same and wrong
    print(f"  clean, identical across program orders: {same}; differs from the intended "
          f"output: {wrong}")
    return ok


# -- on the GPU: how often does the race change the output? ------------------------------------

def _differing(runs: list[torch.Tensor]) -> list[float]:
    """Fraction of elements of each later run that differ from the first run."""
    first = runs[0]
    return [(r != first).float().mean().item() for r in runs[1:]]


def _summary(fractions: list[float]) -> dict:
    return dict(min=min(fractions), median=statistics.median(fractions), max=max(fractions),
                per_run=fractions)


def _pct(s: dict) -> str:
    return f"{100 * s['min']:.2f}% / {100 * s['median']:.2f}% / {100 * s['max']:.2f}%"


def gpu_demo(runs: int = RUNS, write: bool = True) -> bool:
    """Run (a), its twin and (b) ``runs`` times each; with ``write``, record race_demo.json."""
    shape, (a, b) = GPU_SHAPE, SWAP
    heads, seq, dim = shape["heads"], shape["seq"], shape["dim"]
    q, k, v = make_inputs(shape, device="cuda")
    qt, kt, vt = q.to_torch(), k.to_torch(), v.to_torch()
    tol = 1e-2                                   # tl.dot on fp32 uses TF32
    ok = True
    # The last writer of destination a is either head a or head b: outside destinations a
    # and b the output must match the reference, which checks the kernels themselves.
    keep = [j for j in range(heads) if j not in (a, b)]
    want = reference(qt, kt, vt, inverse(swapped_heads(heads, a, b))).view(seq, heads, dim)

    def check_rest(name, got):
        err = ((got.view(seq, heads, dim)[:, keep].double() - want[:, keep]).norm()
               / want[:, keep].norm()).item()
        if not err < tol:
            print(f"  {name}: UNEXPECTED relative error {err:.2e} on the uncontested heads")
        return err < tol

    unsafe_runs = []
    for _ in range(runs):
        out = st.zeros((seq, heads * dim), device="cuda")
        q, k, v, out, *_ = launch_unsafe(q, k, v, out, shape).sync()
        unsafe_runs.append(out.to_torch())
    twin_runs = []
    for _ in range(runs):
        out_t = torch.zeros(seq, heads * dim, device="cuda")
        launch_twin(qt, kt, vt, out_t, shape)
        torch.cuda.synchronize()
        twin_runs.append(out_t.clone())
    ok &= check_rest("safetile unsafe", unsafe_runs[0]) & check_rest("triton twin", twin_runs[0])

    src = inverse(swapped_heads(heads, a, b))
    safe_runs = []
    for _ in range(runs):
        src_t = st.from_torch(torch.tensor(src, dtype=torch.int32, device="cuda"))
        q, k, v, _, part, *_ = launch_safe(q, k, v, src_t, st.zeros((seq, heads * dim),
                                                                      device="cuda"), shape).sync()
        safe_runs.append(part.unpartition().to_torch())
    safe_err = ((safe_runs[0].double() - reference(qt, kt, vt, src)).norm()
                / reference(qt, kt, vt, src).norm()).item()
    identical = all(torch.equal(safe_runs[0], r) for r in safe_runs[1:])
    ok &= identical and safe_err < tol

    unsafe_s, twin_s = _summary(_differing(unsafe_runs)), _summary(_differing(twin_runs))
    contested = 1 / heads          # destination a, written by two programs per query block
    print(f"on {torch.cuda.get_device_name()}: {heads} heads x {seq // shape['block_m']} "
          f"query blocks = {heads * seq // shape['block_m']} programs, {runs} runs each")
    print(f"  elements differing from run 1 (min / median / max); at most {100 * contested:.2f}% "
          f"(destination head {a}) can differ:")
    print(f"    (a) safetile unsafe kernel : {_pct(unsafe_s)}")
    print(f"    (a) plain Triton twin      : {_pct(twin_s)}")
    if max(unsafe_s["max"], twin_s["max"]) == 0:
        print("    the race did not change the output in these runs (the two writers did not "
              "overlap in time); the CPU executor reports it regardless")
    print(f"  (b) safe kernel: {runs} runs bitwise identical: {identical}; relative error vs "
          f"torch {safe_err:.1e}")

    if not write:
        return ok
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from harness import write_results
    path = write_results("race_demo", {
        "shape": shape, "swap": list(SWAP), "runs": runs,
        "programs": heads * seq // shape["block_m"],
        "max_differing_fraction": contested,
        "differing_fraction": {"safetile_unsafe": unsafe_s, "triton_twin": twin_s},
        "race_visible": max(unsafe_s["max"], twin_s["max"]) > 0,
        "safe": {"bitwise_identical": identical, "relative_error": safe_err},
        "ok": bool(ok),
    })
    print(f"  results: {path}")
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="run the GPU part (needs CUDA)")
    parser.add_argument("--cpu", action="store_true", help="run only the CPU part")
    args = parser.parse_args(argv)
    if args.gpu and not torch.cuda.is_available():
        print("race_demo: --gpu needs a CUDA GPU")
        return 2
    ok = cpu_demo()
    if not args.cpu and (args.gpu or torch.cuda.is_available()):
        ok &= gpu_demo()
    print(f"race_demo: {'as expected' if ok else 'UNEXPECTED RESULT'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
