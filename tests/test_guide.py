"""docs/guide.md is executed: every code block runs, and every output block matches.

- ```python blocks run in order, in one namespace (a block continues the ones before it), each
  from a file of its own so that kernels have a source file; errors name it ``example.py``.
- A ```text block right after a python block is that block's output (stdout and stderr);
  ``...`` stands for any text.
- ```toml blocks must parse, and the mypy plugins they name must import.
Any other kind of block fails the test: nothing in the guide goes unchecked.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.S | re.M)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

RUNNER = r'''
import contextlib, gc, io, json, sys, traceback
paths = json.loads(sys.argv[1])
namespace = {"__name__": "__guide__"}
outputs = []
for path in paths:
    buffer, failed = io.StringIO(), False
    code = compile(open(path).read(), path, "exec")
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        try:
            exec(code, namespace)
            gc.collect()                  # an op dropped in this block warns in this block
        except BaseException:
            traceback.print_exc()
            failed = True
    outputs.append({"path": path, "output": buffer.getvalue(), "failed": failed})
    if failed:
        break
print(json.dumps(outputs))
'''


def blocks():
    """``(kind, code, line)`` of every fenced block of the guide."""
    text = GUIDE.read_text()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def matches(expected: str, got: str) -> bool:
    pattern = ".*?".join(re.escape(part) for part in expected.strip().split("..."))
    return re.fullmatch(pattern, got.strip(), re.S) is not None


def test_the_guide_is_linked_from_the_readme():
    assert "](docs/guide.md)" in (ROOT / "README.md").read_text()


def test_every_block_of_the_guide_is_of_a_checked_kind():
    kinds = {kind for kind, _, _ in blocks()}
    assert kinds <= {"python", "text", "toml"}, kinds
    assert sum(kind == "python" for kind, _, _ in blocks()) >= 10


def test_the_guide_covers_what_a_new_user_needs():
    headings = [line for line in GUIDE.read_text().splitlines() if line.startswith("## ")]
    text = " ".join(headings).lower()
    for topic in ("first kernel", "edge tiles", "reductions", "sub-partition", "device op",
                  "reading an error", "sanitizer"):
        assert topic in text, topic


def test_the_toml_blocks_parse_and_name_importable_plugins():
    for kind, code, line in blocks():
        if kind != "toml":
            continue
        config = tomllib.loads(code)
        for plugin in config.get("tool", {}).get("mypy", {}).get("plugins", []):
            __import__(plugin)


def test_every_python_block_runs_and_prints_what_the_guide_shows(tmp_path):
    found = blocks()
    python = [(i, code, line) for i, (kind, code, line) in enumerate(found) if kind == "python"]
    paths = []
    for n, (_, code, _) in enumerate(python):
        directory = tmp_path / f"block{n:02d}"
        directory.mkdir()
        path = directory / "example.py"
        path.write_text(code)
        paths.append(str(path))
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    env["SAFETILE_BACKEND"] = "interpret"          # the outputs shown are the CPU executor's
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(paths)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    outputs = json.loads(proc.stdout.strip().splitlines()[-1])
    for (i, code, line), result in zip(python, outputs):
        got = result["output"]
        for path in paths:                        # a kernel may come from an earlier block
            got = got.replace(path, "example.py")
        assert not result["failed"], f"guide.md:{line}: the block failed:\n{got}"
        follows = found[i + 1] if i + 1 < len(found) else None
        if follows is not None and follows[0] == "text":
            assert matches(follows[1], got), (f"guide.md:{follows[2]}: the block at line {line} "
                                              f"printed:\n{got}\nbut the guide shows:\n{follows[1]}")
        else:
            assert got.strip() == "", f"guide.md:{line}: the block printed, unshown:\n{got}"
    assert len(outputs) == len(python), "the run stopped early"
