#!/usr/bin/env bash
# The quality measurements of docs/results.md: exact vs RidgeFill on the same prompts, 2 CPU cores.
# SmolLM2 maps come from scripts/calibration_report.py (build/maps); Gemma 3 maps are calibrated here.
# About an hour on 2 cores. `scripts/quality_report.sh 8k needle` runs only the steps whose names contain a word.
set -euo pipefail
cd "$(dirname "$0")/.."
RF=.venv/bin/ridgefill
[ -x "$RF" ] || RF=ridgefill
SMOL=$("$RF" fetch-models smollm2-135m | cut -d' ' -f2)
GEMMA=$("$RF" fetch-models gemma3-270m | cut -d' ' -f2)
OUT=docs/data
ONLY=("$@")
mkdir -p "$OUT" build/maps
for s in 12 9; do
    [ -f build/maps/gemma3-270m-s$s.gguf ] || "$RF" calibrate "$GEMMA" -s $s -n 16384 -c 1024 -o build/maps/gemma3-270m-s$s.gguf --no-progress
done
run() {
    local name=$1; shift
    if [ ${#ONLY[@]} -gt 0 ]; then
        local pat hit=0
        for pat in "${ONLY[@]}"; do [[ "$name" == *"$pat"* ]] && hit=1; done
        [ $hit = 1 ] || return 0
    fi
    "$RF" eval "$@" --json "$OUT/eval-$name.json" --plot "$OUT/eval-$name.png" | tee "$OUT/eval-$name.md"
}
S20=build/maps/smollm2-135m-s20-identity.gguf
S15=build/maps/smollm2-135m-s15-identity.gguf
G12=build/maps/gemma3-270m-s12.gguf
G9=build/maps/gemma3-270m-s9.gguf
# tail KL, long-range NLL and the splice attribution at 2K (the filled region in one ubatch)
run smollm2-s20-2k "$SMOL" --maps $S20 --task kl,longdep,splice --lengths 2048 --tail-tokens 256 --prompts 2 --domains brown,shakespeare
run smollm2-s15-2k "$SMOL" --maps $S15 --task kl,longdep,splice --lengths 2048 --tail-tokens 256 --prompts 2 --domains brown,shakespeare
run gemma3-s12-2k "$GEMMA" --maps $G12 --task kl,longdep,splice --lengths 2048 --tail-tokens 256 --prompts 1 --domains brown,shakespeare
run gemma3-s9-2k "$GEMMA" --maps $G9 --task kl,longdep --lengths 2048 --tail-tokens 256 --prompts 1 --domains brown,shakespeare
# the target configuration: 8K prompts, 1K tail; prose of another register and source code
run smollm2-s20-8k "$SMOL" --maps $S20 --task kl,longdep --lengths 8192 --tail-tokens 1024 --prompts 1 --domains shakespeare,python-code
run smollm2-s15-8k "$SMOL" --maps $S15 --task kl,longdep --lengths 8192 --tail-tokens 1024 --prompts 1 --domains shakespeare,python-code
# needle in Shakespeare, exact and RidgeFill
for m in "smollm2-s20 $SMOL $S20" "smollm2-s15 $SMOL $S15" "gemma3-s12 $GEMMA $G12"; do
    set -- $m
    run $1-needle "$2" --maps "$3" --task needle --lengths 1024,2048 --tail-tokens 256 --depths 0.25,0.5,0.75 \
        --needle-trials 3 --domains shakespeare
done
