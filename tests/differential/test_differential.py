"""The two backends implement one semantics: random kernels give equal results on both.

Each hypothesis example is one generated kernel (``diffcases.py``: In tiles of every dtype
with edge values, int/float parameters, Consts, expressions over the language's operators
and operations, edge tiles). It runs on the CPU executor and as its generated Triton source:
under Triton's interpreter for fp32, fp16 and ints, against an fp32 emulation of the
generated code for bf16 (and for ``sl.tanh``, which the interpreter cannot run), and on the
GPU when there is one. The results must be equal, with tolerances only where the semantics
document a rounding order (``lang/semantics.py``). Every kernel the type check accepts must
also compile for sm_90: nothing it accepts may fail in Triton.

A fixed number of examples, derandomized: the same cases on every run (about 90 s on CI).
``scripts/differential_gpu.py`` runs the same generator against a GPU.
"""
import ast
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import backends as be
import diffcases as dc
from safetile.lang import semantics as S

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

CASES = settings(max_examples=110, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def kernels_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("differential_kernels")


def build(seed, rank, n_inputs, n_exprs, depth, directory):
    case = dc.build(seed, rank, n_inputs, n_exprs, depth)
    return case, dc.kernel_of(case, directory, f"case_{seed}")


def mismatches(case, got, want, gpu=False) -> list:
    return [(e.src, a, b) for e, a, b in zip(case.exprs, got, want)
            if not be.agree(e, a, b, gpu=gpu)]


@given(seed=hs.integers(0, 2**31 - 1), rank=hs.sampled_from([1, 2]),
       n_inputs=hs.integers(1, 3), n_exprs=hs.integers(2, 5), depth=hs.integers(1, 3))
@CASES
def test_the_cpu_executor_and_the_generated_triton_agree(kernels_dir, seed, rank, n_inputs,
                                                         n_exprs, depth):
    case, kernel = build(seed, rank, n_inputs, n_exprs, depth, kernels_dir)
    ni, no = len(case.inputs), len(case.exprs)
    got = be.run_cpu(kernel, dc.arguments(case), ni, no, seed=seed % 4)
    if case.interpretable:
        want = be.run_interpreter(kernel, dc.arguments(case), ni, no)
    else:
        want = be.reference(case)
    assert not mismatches(case, got, want), (case.source, mismatches(case, got, want))
    kernel.compile(*dc.arguments(case))               # sm_90: what is accepted compiles


def test_the_reference_emulation_agrees_with_the_interpreter_where_both_apply(kernels_dir):
    # the fp32 emulation that checks bf16 is itself checked where the interpreter is right
    checked = 0
    for seed in range(12):
        case, kernel = build(10_000 + seed, 1 + seed % 2, 2, 4, 2, kernels_dir)
        if not case.interpretable:
            continue
        got = be.reference(case)
        want = be.run_interpreter(kernel, dc.arguments(case), len(case.inputs), len(case.exprs))
        assert not mismatches(case, got, want), case.source
        checked += 1
    assert checked >= 5


@pytest.mark.gpu
def test_the_gpu_and_the_cpu_executor_agree_on_generated_kernels(kernels_dir):
    sys.path.insert(0, str(SCRIPTS))
    import differential_gpu
    cases, disagreements = differential_gpu.run(200, seed=0, directory=kernels_dir, quiet=True)
    assert cases >= 150 and disagreements == [], disagreements[:3]


def test_every_generated_case_is_typed_by_the_rules_the_generator_steers_by(kernels_dir):
    # the type check and lang/semantics.py agree on each stored expression's type
    from safetile.kernel import types
    from safetile.kernel.cache import variant_key
    from safetile.kernel.launch import bind
    for seed in range(20):
        case, kernel = build(20_000 + seed, 1 + seed % 2, 3, 4, 3, kernels_dir)
        program = types.check(kernel, variant_key(kernel, bind(kernel, dc.arguments(case), {})),
                              {})
        stores = [n for n in kernel._src.tree.body[len(case.inputs):]]
        for stmt, want in zip(stores, case.out_dtypes):
            v = program.kernel.types[id(stmt.value.args[0])]
            have = v.dtype if v.runtime else S.weak_dtype(v.value)
            assert have is want, (ast.unparse(stmt), have, want)
