"""Guards on the environment bootstrap.

A plain `pip install torch` (or any install that lets pip resolve torch unpinned) downloads a
multi-GB CUDA build. scripts/env.sh must therefore install torch==2.13.0 before anything else,
and every other install must leave torch alone.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pip_install_lines():
    lines = []
    for line in (ROOT / "scripts" / "env.sh").read_text().splitlines():
        code = line.strip()
        if code.startswith("#") or code.startswith("echo"):
            continue
        if re.search(r"\bpip\s+install\b", code):
            lines.append(code)
    return lines


def test_env_sh_installs_pinned_torch_before_anything_else():
    installs = _pip_install_lines()
    assert installs, "scripts/env.sh runs no pip install"
    assert "torch==2.13.0" in installs[0], f"first install is not pinned torch: {installs[0]!r}"
    triton = [i for i, line in enumerate(installs) if "triton" in line]
    assert triton and min(triton) > 0, "triton must be installed after torch"
    # Nothing after the torch line may name torch, and the package itself goes in --no-deps.
    for line in installs[1:]:
        assert not re.search(r"\btorch\b", line), f"later install names torch: {line!r}"
    editable = [line for line in installs if re.search(r"\s-e\s", line)]
    assert editable and all("--no-deps" in line for line in editable)


def test_pyproject_pins_triton_and_numpy():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"triton==3\.6\.0;\s*sys_platform\s*==\s*\'linux\'"', text)
    assert '"numpy<2.4"' in text
