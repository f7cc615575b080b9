#!/usr/bin/env bash
# Creates .venv (if missing) and builds + installs the fork into it: the patched
# libllama/ggml, llama-server and the llama_cpp bindings in one CMake build, plus
# the ridgefill package.  The build directory (build/) persists, and ccache is used
# when installed, so re-runs only rebuild what changed.  Sourced by demo.sh/test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
fi
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
mkdir -p build
echo "building the fork (first build: about 10 min on 2 cores; log: build/pip-install.log)"
if ! .venv/bin/python -m pip install -v ".[test,plot]" > build/pip-install.log 2>&1; then
    grep -E "error|Error|ERROR" build/pip-install.log | tail -n 40 >&2
    echo "setup.sh: building/installing the fork failed; see build/pip-install.log" >&2
    exit 1
fi
grep -E "^\s+\[[0-9]+/[0-9]+\]" build/pip-install.log | tail -n 1 || true
.venv/bin/ridgefill --version
