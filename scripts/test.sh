#!/usr/bin/env bash
# The test suite: build/install the fork, then run pytest on the real engine and real models.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec .venv/bin/python -m pytest tests -ra --durations=25 "$@"
