#!/usr/bin/env bash
# The main job on the small model, from nothing: build/install, fetch the model, run it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec .venv/bin/ridgefill demo "$@"
