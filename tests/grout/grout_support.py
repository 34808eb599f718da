"""Helpers shared by grout's tests."""
import os
import subprocess
import sys
from pathlib import Path


def run_cli(*args, timeout=600):
    """``python -m grout ARGS`` in a subprocess on the CPU: (returncode, stdout, stderr)."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "grout", *args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr
