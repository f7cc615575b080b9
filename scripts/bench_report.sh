#!/usr/bin/env bash
# The TTFT measurements of docs/results-ttft.md: exact vs RidgeFill, interleaved, on 2 CPU cores.
# Needs maps from scripts/calibration_report.py (SmolLM2) and calibrates Gemma 3 maps itself.
set -euo pipefail
cd "$(dirname "$0")/.."
RF=.venv/bin/ridgefill
[ -x "$RF" ] || RF=ridgefill
SMOL=$("$RF" fetch-models smollm2-135m | cut -d' ' -f2)
GEMMA=$("$RF" fetch-models gemma3-270m | cut -d' ' -f2)
mkdir -p docs/data build/maps
for s in 20 15; do
    "$RF" bench "$SMOL" --maps build/maps/smollm2-135m-s$s-identity.gguf --lengths 2048,4096,8192 \
        --tail-tokens 1024 --repeats 2 --json docs/data/bench-smollm2-s$s.json
done
[ -f build/maps/gemma3-270m-s12.gguf ] || "$RF" calibrate "$GEMMA" -s 12 -n 16384 -c 1024 -o build/maps/gemma3-270m-s12.gguf --no-progress
"$RF" bench "$GEMMA" --maps build/maps/gemma3-270m-s12.gguf --lengths 2048,4096 --tail-tokens 1024 --repeats 2 \
    --json docs/data/bench-gemma3-s12.json
