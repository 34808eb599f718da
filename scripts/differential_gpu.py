"""Differential run on a GPU: generated kernels on the ``triton`` backend against the CPU
executor (the same generator as tests/differential, with a fixed seed).

    PYTHONPATH=src python3 scripts/differential_gpu.py --cases 2000 --seed 0

Prints the number of cases, of kernels the type check refused (there should be none: the
generator keeps to accepted constructs), and of disagreements, each with its kernel source,
and exits non-zero if any case disagreed. The comparison allows what the semantics leave
open (lang/semantics.py): math functions and float sums to a relative tolerance, the sign
of a zero from maximum/minimum, and, on the GPU, a relative 4e-6 on fp32 results (fused
multiply-adds; division is IEEE on both backends).
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "differential"))

import backends as be  # noqa: E402
import diffcases as dc  # noqa: E402
import safetile as st  # noqa: E402


def run(n: int, seed: int = 0, directory: Path | None = None, quiet: bool = False):
    """Run ``n`` cases; returns (cases compared, disagreements)."""
    directory = Path(directory or tempfile.mkdtemp(prefix="safetile_differential_"))
    rng = random.Random(seed)
    compared, refused, bad = 0, 0, []
    for i in range(n):
        case_seed = rng.randrange(2**31)
        case = dc.build(case_seed, rng.choice([1, 2]), rng.randint(1, 3), rng.randint(2, 5),
                        rng.randint(1, 3))
        kernel = dc.kernel_of(case, directory, f"case_{case_seed}")
        ni, no = len(case.inputs), len(case.exprs)
        try:
            want = be.run_cpu(kernel, dc.arguments(case), ni, no)
        except st.KernelDefinitionError:
            refused += 1
            continue
        got = be.run_gpu(kernel, dc.arguments(case, device="cuda"), ni, no)
        compared += 1
        for e, a, b in zip(case.exprs, got, want):
            if not be.agree(e, a, b, gpu=True):
                bad.append((case_seed, e.src, a, b, case.source))
                if not quiet:
                    print(f"DISAGREEMENT in case {case_seed}: {e.src}\n{case.source}"
                          f"GPU: {a.flatten()[:16]}\nCPU: {b.flatten()[:16]}\n")
    if not quiet:
        print(f"{compared} cases compared ({refused} refused by the type check), "
              f"{len(bad)} disagreements")
    return compared, bad


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    _, bad = run(a.cases, a.seed)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
