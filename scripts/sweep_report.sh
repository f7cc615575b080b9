#!/usr/bin/env bash
# The speed–quality sweep of docs/results.md: SmolLM2-135M, split layers 15 and 20 × tails 256 and 1024, 4K prompts.
# Run it alone on the machine (it times prefill).  Reuses the maps of scripts/calibration_report.py (32K Brown
# tokens, chunks of 1024: the same settings `ridgefill sweep --calib-tokens 32768` calibrates with).
set -euo pipefail
cd "$(dirname "$0")/.."
RF=.venv/bin/ridgefill
[ -x "$RF" ] || RF=ridgefill
SMOL=$("$RF" fetch-models smollm2-135m | cut -d' ' -f2)
mkdir -p out/sweep docs/data
for s in 15 20; do
    src=build/maps/smollm2-135m-s$s-identity.gguf
    dst=out/sweep/$(basename "$SMOL" .gguf).s$s.n32768.maps.gguf
    [ -f "$src" ] && [ ! -e "$dst" ] && ln -s "$PWD/$src" "$dst"
done
"$RF" sweep "$SMOL" --split-layers 15,20 --tail-tokens 256,1024 --length 4096 --calib-tokens 32768 \
    --prompts 1 --domains shakespeare --workdir out/sweep \
    --json docs/data/sweep-smollm2.json --plot docs/data/sweep-smollm2.png | tee docs/data/sweep-smollm2.md
