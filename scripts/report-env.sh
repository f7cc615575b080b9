# Sourced by the report scripts (maps_report.sh, guard_report.sh): the CLI to run (the installed one, or the
# source tree with RIDGEFILL_SRC=1), the model file and its short tag.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RF=(.venv/bin/ridgefill)
[ -n "${RIDGEFILL_SRC:-}" ] && RF=(env PYTHONPATH=python .venv/bin/python -m ridgefill)
MODEL=${MODEL:-smollm2-135m}
FILE=$("${RF[@]}" fetch-models "$MODEL" | cut -d' ' -f2)
TAG=${MODEL%%-*}
# WIDE=1: the same weights stored as F32 (ridgefill.ggufio.requantize), so no matmul rounds its activations to the
# 8 bits a quantized one does on the CPU; its own maps and outputs are tagged "<tag>-f32". WIDE=F16 (or BF16): the
# weights stored so, whose CPU matmuls round activations to that type instead; tagged "<tag>-f16"
if [ -n "${WIDE:-}" ]; then
    type=$WIDE; [ "$type" = 1 ] && type=F32
    case $type in F32|F16|BF16) ;; *) echo "WIDE=$WIDE: expected 1 (F32), F16 or BF16" >&2; exit 2 ;; esac
    wide=build/$TAG-${type,,}.gguf
    [ -f "$wide" ] || .venv/bin/python -c "import sys; from ridgefill.ggufio import requantize
requantize(sys.argv[1], sys.argv[2], to=sys.argv[3], only=('Q4_1', 'Q8_0'))" "$FILE" "$wide" "$type"
    FILE=$wide TAG=$TAG-${type,,}
fi
