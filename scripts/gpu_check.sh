#!/usr/bin/env bash
# The whole GPU check in one command, for the device machine (its image's python3, nothing
# installed): examples on the triton backend, the `gpu`-marked tests, then the benchmarks.
# Logs and result JSON go to $OUT when it is set (else /tmp/safetile-gpu).
# Usage: bash scripts/gpu_check.sh [bench_name ...]   (default: every benchmarks/bench_*.py)
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp/safetile-gpu}"
mkdir -p "$out"
status=0

echo "== examples (triton backend)"
for f in examples/[0-9][0-9]_*.py examples/race_demo.py; do
  [ -f "$f" ] || continue
  python3 "$f" >"$out/$(basename "$f" .py).log" 2>&1 || { echo "FAIL $f"; status=1; }
  tail -n 3 "$out/$(basename "$f" .py).log"
done

echo "== pytest -m gpu"
python3 -m pytest -m gpu -q -p no:cacheprovider >"$out/pytest_gpu.log" 2>&1 || status=1
tail -n 15 "$out/pytest_gpu.log"

benches=("$@")
[ ${#benches[@]} -eq 0 ] && benches=($(ls benchmarks/bench_*.py 2>/dev/null | xargs -n1 basename | sed 's/\.py$//'))
for b in "${benches[@]}"; do
  echo "== $b"
  python3 "benchmarks/$b.py" >"$out/$b.log" 2>&1 || { echo "FAIL $b"; status=1; }
  tail -n 25 "$out/$b.log"
done
exit $status
