#!/usr/bin/env bash
# The main job: set up the environment (scripts/env.sh), then run every numbered example
# (examples/[0-9][0-9]_*.py, in order) or the example paths given as arguments, then (in a
# full run) grout: `grout generate --model tiny`. Each example checks its own results. Without
# a GPU the examples and grout run on the CPU executor (safetile and grout pick their default
# backend and device); with one, on the GPU. Exits non-zero if any example or the grout run
# fails.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
source "$here/env.sh" || { echo "[run] environment setup failed" >&2; exit 1; }
cd "$SAFETILE_ROOT" || exit 1

full=1
if [ "$#" -gt 0 ]; then
    examples=("$@")
    full=0
else
    shopt -s nullglob
    examples=(examples/[0-9][0-9]_*.py)
    shopt -u nullglob
fi
if [ "${#examples[@]}" -eq 0 ]; then
    echo "[run] no examples found (examples/[0-9][0-9]_*.py)" >&2
    exit 1
fi

passed=0
failed=()
# run_one NAME CMD...: run CMD under a banner, record it as passed or failed.
run_one() {
    local name="$1" start rc secs
    shift
    echo
    echo "=============================================================="
    echo "== $name"
    echo "=============================================================="
    start=$(date +%s.%N)
    "$@"
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [ "$rc" -eq 0 ]; then
        echo "[run] OK   $name (${secs}s)"
        passed=$((passed + 1))
    else
        echo "[run] FAIL $name (exit $rc, ${secs}s)"
        failed+=("$name")
    fi
}

for ex in "${examples[@]}"; do
    run_one "$ex" "$SAFETILE_PYTHON" "$ex"
done
if [ "$full" -eq 1 ]; then
    run_one "grout generate --model tiny" "$SAFETILE_PYTHON" -m grout generate \
        --model tiny --prompt "Hello, world" --max-new-tokens 8
fi

echo
echo "examples and grout: $passed passed, ${#failed[@]} failed"
if [ "${#failed[@]}" -gt 0 ]; then
    printf '[run] failed: %s\n' "${failed[@]}"
    exit 1
fi
