"""The examples type-check under mypy with safetile's plugin (the configuration in pyproject.toml).

The plugin reads ``st.In[st.f32, 2]`` and the rest of the parameter grammar as the views the
parameters are in the body, so a misspelt view method fails the check.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BAD_KERNEL = '''
import safetile as st
import safetile.lang as sl


@st.kernel
def rows(x: st.In[st.f32, 2], z: st.Out[st.f32, "2"], n: st.Const[int]):
    z.stor(x.load(z.index))
    label: str = n
'''


@pytest.fixture(scope="module")
def mypy(tmp_path_factory):
    cache = tmp_path_factory.mktemp("mypy-cache")

    def run(*paths) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
        return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache),
                               "--no-error-summary", *map(str, paths)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return run


def test_the_examples_type_check(mypy):
    proc = mypy(ROOT / "examples")
    assert proc.returncode == 0, f"mypy on examples/:\n{proc.stdout}{proc.stderr}"


def test_the_check_reports_misused_views_and_annotations(mypy, tmp_path):
    bad = tmp_path / "bad_kernel.py"
    bad.write_text(BAD_KERNEL)
    proc = mypy(bad)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert '"Out" has no attribute "stor"' in proc.stdout
    assert 'Missing positional argument "shape" in call to "load"' in proc.stdout
    assert "the rank of st.Out[dtype, rank] is an int literal" in proc.stdout
    assert 'expression has type "int", variable has type "str"' in proc.stdout   # Const[int]


def test_the_package_is_marked_typed():
    assert (ROOT / "src" / "safetile" / "py.typed").is_file()
    assert 'safetile = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()
