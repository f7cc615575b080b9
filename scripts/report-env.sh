# Sourced by the report scripts (maps_report.sh, guard_report.sh): the CLI to run (the installed one, or the
# source tree with RIDGEFILL_SRC=1), the model file and its short tag.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RF=(.venv/bin/ridgefill)
[ -n "${RIDGEFILL_SRC:-}" ] && RF=(env PYTHONPATH=python .venv/bin/python -m ridgefill)
MODEL=${MODEL:-smollm2-135m}
FILE=$("${RF[@]}" fetch-models "$MODEL" | cut -d' ' -f2)
TAG=${MODEL%%-*}
