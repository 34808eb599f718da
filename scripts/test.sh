#!/usr/bin/env bash
# The test command: set up the environment (scripts/env.sh), then run the whole test suite.
# Tests marked `gpu` skip themselves without a CUDA GPU. Extra arguments go to pytest.
# pytest's exit code passes through unchanged (5, "no tests collected", is a failure).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
source "$here/env.sh" || { echo "[test] environment setup failed" >&2; exit 1; }
cd "$SAFETILE_ROOT" || exit 1

exec "$SAFETILE_PYTHON" -m pytest -q "$@"
