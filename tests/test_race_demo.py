"""The attention-permutation race (examples/race_demo.py), and why the safe form cannot have it.

(a) The unsafe kernel picks its destination and two programs write one tile: the CPU executor
    raises RaceError naming both programs and an element.
(b) The safe kernel owns its tile: clean and equal to torch under any program order.
Writing the bug in the safe API fails at definition (KernelDefinitionError with file:line and
rule), and a host partition cannot be made to overlap another argument (AliasError before
launch). Bad kernels mark their offending line with ``# <- marker``.
"""
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import safetile as st
import safetile.lang as sl

ROOT = Path(__file__).resolve().parent.parent
THIS_FILE = inspect.getsourcefile(lambda: None)


def _load_demo():
    spec = importlib.util.spec_from_file_location("race_demo", ROOT / "examples" / "race_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = _load_demo()
SHAPE = demo.CPU_SHAPE
H, S, D = SHAPE["heads"], SHAPE["seq"], SHAPE["dim"]
A, B = demo.SWAP


def marked_line(marker: str) -> int:
    lines = [i for i, text in enumerate(open(THIS_FILE).read().splitlines(), 1)
             if text.rstrip().endswith(f"# <- {marker}")]
    assert len(lines) == 1, f"marker {marker!r} must occur once, found {lines}"
    return lines[0]


def assert_definition_error(excinfo, rule: str, marker: str):
    e, line = excinfo.value, marked_line(marker)
    assert (e.rule, e.filename, e.lineno) == (rule, THIS_FILE, line)
    assert str(e).startswith(f"{THIS_FILE}:{line}: [{rule}]")


def inputs():
    return demo.make_inputs(SHAPE, device="cpu")


def run_safe(src: list[int], seed: int) -> torch.Tensor:
    q, k, v = inputs()
    src_t = st.from_torch(torch.tensor(src, dtype=torch.int32))
    with st.backend("interpret", seed=seed):
        *_, part, _, _ = demo.launch_safe(q, k, v, src_t, st.zeros((S, H * D), device="cpu"),
                                          SHAPE).sync()
    return part.unpartition().to_torch()


def reference(src: list[int]) -> torch.Tensor:
    q, k, v = inputs()
    return demo.reference(q.to_torch(), k.to_torch(), v.to_torch(), src)


def rel_err(got, want) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


# -- (a) the unsafe form --------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_unsafe_form_raises_race_error_naming_two_programs_and_an_element(seed):
    q, k, v = inputs()
    out = st.zeros((S, H * D), device="cpu")
    with pytest.raises(st.RaceError) as e:
        with st.backend("interpret", seed=seed):
            demo.launch_unsafe(q, k, v, out, SHAPE).sync()
    msg = str(e.value)
    m = re.fullmatch(r"\S+race_demo\.py:\d+: "
                     r"kernel 'attention_unsafe': program (\d+) writes element \((\d+), (\d+)\) "
                     r"of 'out' \(offset (\d+)\); program (\d+) also (?:writes|reads) it", msg)
    assert m, msg
    p1, row, col, offset, p2 = (int(x) for x in m.groups())
    # the two programs attend heads a and b of the same query block ...
    (h1, b1), (h2, b2) = demo.head_block(p1, SHAPE), demo.head_block(p2, SHAPE)
    assert {h1, h2} == {A, B} and b1 == b2
    # ... and the element lies in that block's rows of destination head a, which both write
    assert b1 * SHAPE["block_m"] <= row < (b1 + 1) * SHAPE["block_m"]
    assert col // D == A and offset == row * H * D + col


def test_unsafe_form_without_a_collision_passes_the_sanitizer_and_matches_torch():
    q, k, v = inputs()
    out = st.zeros((S, H * D), device="cpu")
    with st.backend("interpret", seed=0):                 # a == b: every head stays in place
        *_, out, _, _, _, _, _, _ = demo.launch_unsafe(q, k, v, out, SHAPE, swap=(A, A)).sync()
    assert rel_err(out.to_torch(), reference(list(range(H)))) < 1e-5


def test_unsafe_form_needs_an_unsafe_block_at_launch():
    q, k, v = inputs()
    with pytest.raises(st.UnsafeError, match=r"attention_unsafe.*with st.unsafe\(\)"):
        demo.attention_unsafe.options(grid=(H * S // SHAPE["block_m"],))(
            q, k, v, st.zeros((S, H * D), device="cpu"), A, B, 0.125, D, 16, 16)


# -- (b) the safe form ----------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_safe_form_is_clean_and_matches_torch(seed):
    src = demo.inverse(demo.swapped_heads(H, A, B))
    assert rel_err(run_safe(src, seed), reference(src)) < 1e-5


def test_safe_form_is_bitwise_identical_across_program_orders():
    src = demo.inverse(demo.swapped_heads(H, A, B))
    first = run_safe(src, 0)
    assert all(torch.equal(first, run_safe(src, seed)) for seed in (1, 2, 3))


def test_the_same_slip_in_the_safe_form_is_a_deterministic_wrong_answer():
    slip = demo.botched_swap(H, A, B)
    assert slip == [0, 1, 1, 3]
    first = run_safe(slip, 0)
    assert all(torch.equal(first, run_safe(slip, seed)) for seed in (1, 2))
    assert rel_err(first, reference(slip)) < 1e-5                     # what it was told to do
    intended = reference(demo.inverse(demo.swapped_heads(H, A, B)))
    assert rel_err(first, intended) > 0.1                             # which a check catches


# -- writing the bug in the safe API is impossible --------------------------------------------

def test_choosing_a_destination_by_indexed_assignment_fails_at_definition():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def permuted(q: st.In[st.f32, 2], dest: st.In[st.i32, 1], out: st.Out[st.f32, 2]):
            d = dest.load_scalar((out.index[0],))
            out[d] = q.load(out.index, out.shape)  # <- indexed-destination
    assert_definition_error(ei, "free-index-store", "indexed-destination")
    assert "a safe kernel cannot choose where to write" in str(ei.value)


def test_passing_a_destination_index_to_store_fails_at_definition():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def permuted(q: st.In[st.f32, 2], dest: st.In[st.i32, 1], out: st.Out[st.f32, 2]):
            d = dest.load_scalar((out.index[0],))
            out.store(q.load(out.index, out.shape), (d, 0))  # <- store-with-index
    assert_definition_error(ei, "free-index-store", "store-with-index")
    assert "takes exactly the tile: the destination is the owned tile" in str(ei.value)


def test_store_ptr_in_a_safe_kernel_fails_at_definition():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def permuted(q: st.In[st.f32, 2], out: st.Out[st.f32, 2]):
            offsets = sl.arange(16)
            sl.store_ptr(out, offsets, q.load(out.index, out.shape))  # <- store-ptr
    assert_definition_error(ei, "unsafe-op", "store-ptr")
    assert "only in @st.kernel(unsafe=True)" in str(ei.value)


def test_a_pointer_output_in_a_safe_kernel_fails_at_definition():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def permuted(q: st.In[st.f32, 2], z: st.Out[st.f32, 2],
                     out: st.Ptr[st.f32]):  # <- ptr-param
            z.store(q.load(z.index, z.shape))
    assert_definition_error(ei, "ptr-needs-unsafe", "ptr-param")


@st.kernel
def sub_tile_at(x: st.In[st.f32, 2], where: st.In[st.i32, 1], out: st.Out[st.f32, 2]):
    halves = out.partition((out.shape[0] // 2, out.shape[1]))
    i = where.load_scalar((0,))
    halves.store(sl.zeros((out.shape[0] // 2, out.shape[1]), st.f32), (i, 0))


def test_a_data_dependent_sub_tile_index_cannot_leave_the_owned_tile():
    x = st.zeros((S, D), device="cpu")
    where = st.from_torch(torch.tensor([2], dtype=torch.int32))   # sub-grid is (2, 1)
    with pytest.raises(st.OutOfBoundsError, match=r"sub-tile index \(2, 0\) of 'out' is outside "
                                                  r"the owned slab's sub-grid \(2, 1\)"):
        with st.backend("interpret", seed=0):
            sub_tile_at(x, where, st.zeros((S, D), device="cpu").partition((16, D))).sync()


# -- a host partition cannot be made to overlap ------------------------------------------------

@st.kernel
def two_outputs(x: st.In[st.f32, 2], y: st.Out[st.f32, 2], z: st.Out[st.f32, 2]):
    t = sl.load_like(x, y)
    y.store(t)
    z.store(t * 2)


def test_two_overlapping_out_partitions_raise_alias_error_before_launch():
    x = st.zeros((S, D), device="cpu")
    base = st.zeros((S + 16, D), device="cpu")
    y, z = base[0:S], base[16:S + 16]            # rows 16..S-1 would be in both
    with pytest.raises(st.AliasError) as e:
        two_outputs(x, y.partition((16, D)), z.partition((16, D)))
    msg = str(e.value)
    assert msg.startswith("kernel 'two_outputs': Out 'y' overlaps Out 'z'"), msg
    assert f"bytes [0, {S * D * 4}) and [{16 * D * 4}, {(S + 16) * D * 4})" in msg
    assert x.shape == (S, D)                      # nothing was moved: x is still usable


def test_an_output_that_is_a_view_of_an_input_raises_alias_error_before_launch():
    q, k, v = inputs()
    src = st.from_torch(torch.arange(H, dtype=torch.int32))
    out = q.view(S, H * D)                        # the output would overwrite q while it is read
    with pytest.raises(st.AliasError) as e:
        demo.launch_safe(q, k, v, src, out, SHAPE)
    assert str(e.value).startswith("kernel 'attention_safe': Out 'out' overlaps In 'q'")
    assert "same storage" in str(e.value)
    assert q.shape == (H, S, D)


def test_a_self_overlapping_tensor_cannot_be_launched_as_an_out_partition():
    x = st.zeros((S, D), device="cpu")
    rows_share_memory = st.from_torch(torch.zeros(S + D).as_strided((S, D), (1, 1)))
    with pytest.raises(st.LaunchError, match=r"parameter 'y': the partitioned tensor has "
                                             r"overlapping elements \(strides \(1, 1\)\)"):
        two_outputs(x, rows_share_memory.partition((16, D)),
                    st.zeros((S, D), device="cpu").partition((16, D)))


# -- the plain-Triton twin and the GPU code, checked without a GPU ------------------------------

TWIN_SCRIPT = """
import json, sys, torch
sys.path.insert(0, {examples!r})
import race_demo as rd
s = rd.CPU_SHAPE
H, S, D = s["heads"], s["seq"], s["dim"]
q, k, v = (t.to_torch() for t in rd.make_inputs(s, device="cpu"))
want = rd.reference(q, k, v, list(range(H))).view(S, H, D)
result = {{}}
for name, swap in (("no_swap", (1, 1)), ("buggy_swap", (1, 2))):
    out = torch.zeros(S, H * D)
    rd.launch_twin(q, k, v, out, s, swap)
    o = out.view(S, H, D)
    # for each destination head: the source head it holds, or None
    result[name] = [next((h for h in range(H)
                          if (o[:, j].double() - want[:, h]).abs().max() < 1e-4), None)
                    for j in range(H)]
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def twin_under_triton_interpreter():
    """Run the Triton twin under Triton's own interpreter (CPU tensors), in a subprocess."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    code = TWIN_SCRIPT.format(examples=str(ROOT / "examples"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_triton_twin_computes_the_same_attention(twin_under_triton_interpreter):
    assert twin_under_triton_interpreter["no_swap"] == list(range(H))


def test_triton_interpreter_runs_the_buggy_twin_without_complaint(twin_under_triton_interpreter):
    held = twin_under_triton_interpreter["buggy_swap"]
    assert held[B] is None                       # destination b is never written (zeros)
    assert held[A] in (A, B)                     # destination a: whichever program wrote last
    assert [held[j] for j in range(H) if j not in (A, B)] == [j for j in range(H) if j not in (A, B)]


def _sm90_ptx(kernel, *args) -> str:
    return kernel.compile(*args).asm["ptx"]


def test_gpu_shape_kernels_compile_for_sm90_with_wgmma():
    s = demo.GPU_SHAPE
    heads, seq, dim = s["heads"], s["seq"], s["dim"]
    q, k, v = demo.make_inputs(s, device="cpu")
    out = st.zeros((seq, heads * dim), device="cpu")
    grid = (heads * seq // s["block_m"],)
    unsafe = demo.attention_unsafe.options(grid=grid)
    assert "wgmma" in _sm90_ptx(unsafe, q, k, v, out, A, B, 0.125, dim, s["block_m"], s["block_n"])
    src = st.from_torch(torch.arange(heads, dtype=torch.int32))
    part = out.partition((s["block_m"], dim))
    assert "wgmma" in _sm90_ptx(demo.attention_safe, q, k, v, src, part, 0.125, s["block_n"])


def test_triton_twin_compiles_for_sm90_with_wgmma():
    import triton
    from triton.backends.compiler import GPUTarget
    s = demo.GPU_SHAPE
    signature = {"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32", "out_ptr": "*fp32",
                 "a": "i32", "b": "i32", "scale": "fp32", "H": "i32", "S": "i32",
                 "D": "constexpr", "BM": "constexpr", "BN": "constexpr"}
    constants = {"D": s["dim"], "BM": s["block_m"], "BN": s["block_n"]}
    compiled = triton.compile(triton.compiler.ASTSource(demo.triton_twin, signature, constants),
                              target=GPUTarget("cuda", 90, 32))
    assert "wgmma" in compiled.asm["ptx"]


# -- the script ---------------------------------------------------------------------------------

def test_the_example_exits_zero_on_the_cpu():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "race_demo.py"), "--cpu"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RaceError" in r.stdout and "race_demo: as expected" in r.stdout


@pytest.mark.gpu
def test_on_the_gpu_the_safe_form_is_bitwise_identical_across_runs():
    assert demo.gpu_demo(runs=5, write=False)
