#!/usr/bin/env bash
# docs/maps.md: input vs kv maps, with and without context features, per split layer, on the same prompts
# (2 CPU cores).  Maps are calibrated on 32K tokens of Brown (chunks of 1024) into build/maps; every variant of
# a split layer is then evaluated on the same 16 prompts per domain (ridgefill eval --compare-maps).
#   scripts/maps_report.sh calibrate 15 20     calibrate the variants of splits 15 and 20
#   scripts/maps_report.sh eval 15 20          tail KL / NLL at 2K prompts, 256 tail, three domains
#   scripts/maps_report.sh needle 15 MAPS...   pass keys at 2K prompts (64 keys) for exact and the given maps
source "$(dirname "$0")/report-env.sh"
OUT=docs/data M=build/maps
VARIANTS=${VARIANTS:-"input-c0 kv-c0 kv-c1 kv-c2 input-c1"}
PROMPTS=${PROMPTS:-16}
mkdir -p "$OUT" "$M"
what=$1; shift
case $what in
calibrate)
    for s in "$@"; do for v in $VARIANTS; do
        f=$M/$TAG-s$s-$v.gguf
        [ -f "$f" ] || "${RF[@]}" calibrate "$FILE" -s "$s" -n 32768 -c 1024 --map-kind "${v%-c*}" \
            --context-tokens "${v#*-c}" -o "$f" --no-progress
    done; done ;;
eval)
    for s in "$@"; do
        set -- $VARIANTS
        first=$M/$TAG-s$s-$1.gguf; shift
        others=$(for v in "$@"; do printf '%s,' "$M/$TAG-s$s-$v.gguf"; done)
        "${RF[@]}" eval "$FILE" --maps "$first" --compare-maps "${others%,}" --task kl,longdep --lengths 2048 \
            --tail-tokens 256 --prompts "$PROMPTS" --domains brown,shakespeare,python-code \
            --json "$OUT/maps-$TAG-s$s-2k.json" | tee "$OUT/maps-$TAG-s$s-2k.md"
    done ;;
needle)
    s=$1; first=$2; shift 2
    others=$(printf '%s,' "$@")
    "${RF[@]}" eval "$FILE" --maps "$first" ${others:+--compare-maps "${others%,}"} --task needle --lengths 2048 \
        --tail-tokens 256 --depths 0.1,0.3,0.5,0.7,0.9 --needle-trials 12 --domains shakespeare \
        --json "$OUT/maps-$TAG-s$s-needle.json" | tee "$OUT/maps-$TAG-s$s-needle.md" ;;
*) echo "usage: $0 calibrate|eval|needle SPLIT..." >&2; exit 2 ;;
esac
