"""Every numbered example runs as a script, checks itself against torch and exits 0.

Without a GPU the examples run on the CPU executor; on the GPU machine the same test runs them
through the triton backend.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py"))


def test_the_foundation_examples_are_present():
    names = {p.name for p in EXAMPLES}
    assert {"01_vector_add.py", "02_softmax.py", "03_matmul.py"} <= names


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_and_matches_torch(script):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{script.name} failed:\n{proc.stdout}\n{proc.stderr}"
    assert "matches torch" in proc.stdout
    assert "MISMATCH" not in proc.stdout
