#!/usr/bin/env bash
# The windowed band through the runtime (docs/maps.md, "The windowed band in the runtime").
#   band_report.sh calibrate          split-20 maps (input-c0, as maps_report.sh calibrates them) and the same maps
#                                     with a recorded band of B layers (default 10: layers 10-19), window W (256)
#   band_report.sh calibrate-fit      split-20 maps fitted on what the band passes them (4096-token chunks, so that
#                                     most rows reach past the window): calibrate --band-layers B --band-window W
#   band_report.sh eval8k DOMAIN      8K prompts, 1K tail, 16 prompts: the band against exact (FIT=1: with the
#                                     maps of calibrate-fit)
#                                     (COMPARE=MAPS,...: other map files beside it, e.g. split 20 without a band)
#   band_report.sh needle [LEN TAIL]  2K prompts, 256 tail (or LEN, TAIL), 60 pass keys (Shakespeare): band vs exact
#   band_report.sh server [s20]       TTFT through ridgefill-server at 8K, exact vs band (s20: the maps alone), interleaved
#                                     (L=16383: another prompt length; the server's context is L + 1; RUN=name: a
#                                     suffix for the output file, e.g. a rerun beside another setting's)
#   band_report.sh fa                 in-process TTFT at 8K: the band with flash attention on and off
#   band_report.sh compare [MAPS,..]  in-process TTFT at 8K, one run: exact, split 15's maps, the band and MAPS
#                                     rotated (R=8 repeats), each fill also timed against split 15's
# S=22 (any command): the maps from layer S instead of 20 (the band is still layers S-B..S-1: S=22 B=12 is band
# 10-21), files and outputs tagged s22
# F=10,11,14,15 (any command): the band with those band layers unwindowed (band_full_layers), recorded in its own
# map file (…-band10w1024f10.11.14.15.gguf) and named so in the outputs
# WIDE=1 (any command): SmolLM2's weights widened to F32 (report-env.sh), its own split-20 maps, outputs tagged
# smollm2-f32 — the band's KL without the 8-bit activation rounding of quantized CPU matmuls; WIDE=F16 or BF16:
# the weights in that type (their matmuls round activations to it), outputs tagged smollm2-f16 / smollm2-bf16
#   band_report.sh f32fit             (after WIDE=1 ... calibrate) the F32 model's maps, split 20 and band, marked
#                                     for the quantized model (its fingerprint): maps fitted without the rounding,
#                                     applied with it. F32FIT=1 (eval8k): the band from that file, and COMPARE
#                                     names the split-20 one
source "$(dirname "$0")/report-env.sh"
OUT=docs/data M=build/maps
W=${W:-256}
B=${B:-10}
PROMPTS=${PROMPTS:-16}
S=${S:-20}
SN=""; [ "$S" = 20 ] || SN=s$S
PLAIN=$M/$TAG-s$S-input-c0.gguf
BAND=$M/$TAG-s$S-input-c0-band${B}w$W.gguf
FITTED=$M/$TAG-s$S-input-c0-band${B}w$W-fit.gguf
NAME=${SN}b${B}w$W
F=${F:-}
if [ -n "$F" ]; then
    BAND=$M/$TAG-s$S-input-c0-band${B}w${W}f${F//,/.}.gguf NAME=${SN}b${B}w${W}f${F//,/.}
fi
if [ -n "${FIT:-}" ]; then BAND=$FITTED NAME=${SN}b${B}w$W-fit; fi
if [ -n "${F32FIT:-}" ]; then BAND=${BAND%.gguf}-f32fit.gguf NAME=$NAME-f32fit; fi
mkdir -p "$OUT" "$M"
what=$1; shift
case $what in
calibrate)
    [ -f "$PLAIN" ] || "${RF[@]}" calibrate "$FILE" -s "$S" -n 32768 -c 1024 -o "$PLAIN" --no-progress
    # the same maps with the band recorded (what `calibrate ... --band-layers B --band-window W` writes, without
    # calibrating twice)
    [ -f "$BAND" ] || .venv/bin/python -c "import dataclasses, sys; from ridgefill.ggufio import read_maps, write_maps
full = tuple(int(x) for x in sys.argv[5].split(',') if x)
write_maps(sys.argv[2], dataclasses.replace(read_maps(sys.argv[1]), band_layers=int(sys.argv[3]), band_window=int(sys.argv[4]),
                                            band_full_layers=full))" \
        "$PLAIN" "$BAND" "$B" "$W" "$F" ;;
calibrate-fit)
    [ -f "$FITTED" ] || "${RF[@]}" calibrate "$FILE" -s "$S" -n 32768 -c 4096 --band-layers "$B" --band-window "$W" \
        -o "$FITTED" --no-progress ;;
f32fit)
    for m in "$PLAIN" "$BAND"; do
        src=$M/$TAG-f32-${m#$M/$TAG-}
        [ -f "$src" ] || { echo "$src not found: run WIDE=1 W=$W ${F:+F=$F }$0 calibrate first" >&2; exit 1; }
        .venv/bin/python -c "import dataclasses, sys; from gguf import GGUFReader
from ridgefill.ggufio import fingerprint, read_maps, write_maps
write_maps(sys.argv[3], dataclasses.replace(read_maps(sys.argv[2]), base_fingerprint=fingerprint(GGUFReader(sys.argv[1]))))" \
            "$FILE" "$src" "${m%.gguf}-f32fit.gguf"
    done ;;
eval8k)
    d=$1
    "${RF[@]}" eval "$FILE" --maps "$BAND" ${COMPARE:+--compare-maps "$COMPARE"} --task kl,longdep --lengths 8192 \
        --tail-tokens 1024 --prompts "$PROMPTS" --domains "$d" \
        --json "$OUT/band-$TAG-$NAME-8k-$d.json" | tee "$OUT/band-$TAG-$NAME-8k-$d.md" ;;
needle)
    len=${1:-2048} tail=${2:-256} sfx=""
    [ "$len" = 2048 ] || sfx=-$((len / 1024))k
    "${RF[@]}" eval "$FILE" --maps "$BAND" ${COMPARE:+--compare-maps "$COMPARE"} --task needle --lengths "$len" \
        --tail-tokens "$tail" --depths 0.1,0.3,0.5,0.7,0.9 --needle-trials 12 --domains shakespeare \
        --json "$OUT/band-$TAG-$NAME-needle$sfx.json" | tee "$OUT/band-$TAG-$NAME-needle$sfx.md" ;;
server)
    port=${PORT:-8089} L=${L:-8191}
    if [ "${1:-}" = s20 ]; then BAND=$PLAIN NAME=s$S; fi
    # past SmolLM2's 8192 training positions the server caps the slot; a speed run raises the recorded length
    over=(); [ "$L" -ge 8192 ] && over=(--override-kv "llama.context_length=int:$((L + 1))")
    .venv/bin/ridgefill-server -m "$FILE" --ridgefill-maps "$BAND" --ridgefill-tail 1024 -c $((L + 1)) -np 1 "${over[@]}" \
        -t "$(nproc)" --port "$port" > build/band-server.log 2>&1 &
    pid=$!
    trap 'kill $pid' EXIT
    for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
    "${RF[@]}" bench "$FILE" --server "http://127.0.0.1:$port" --lengths "$L" -r 3 \
        --json "$OUT/bench-server-$TAG-$NAME-$(((L + 1) / 1024))k${RUN:+-$RUN}.json" ;;
fa)
    # in-process, 8K prompt, 1K tail: the band with flash attention on and off, split 20 alone with it off
    for run in "$BAND on $NAME-fa-on" "$BAND off $NAME-fa-off" "$PLAIN off s20-fa-off"; do
        set -- $run
        "${RF[@]}" bench "$FILE" --maps "$1" -fa "$2" --lengths 8192 --tail-tokens 1024 -r 2 \
            --json "$OUT/bench-$TAG-$3-8k.json"
    done ;;
compare)
    # in-process, 8K prompt (L), 1K tail, flash attention on: exact, split 15 alone, the band and the files given
    # (comma-separated) rotated on one context, R repeats; each fill's speed against split 15's in the same runs
    # (RUN=name: a suffix for the output files, e.g. the build measured)
    L=${L:-8192}
    out=$OUT/bench-compare-$TAG-s15-$NAME-$((L / 1024))k${RUN:+-$RUN}
    "${RF[@]}" bench "$FILE" --maps "$M/$TAG-s15-input-c0.gguf" --compare-maps "$BAND${1:+,$1}" -fa on \
        --lengths "$L" --tail-tokens 1024 -r "${R:-8}" --json "$out.json" | tee "$out.md" ;;
*) echo "usage: $0 calibrate|calibrate-fit|f32fit|eval8k DOMAIN|needle [LEN TAIL]|server [s20]|fa|compare [MAPS,..]" >&2
   exit 2 ;;
esac
