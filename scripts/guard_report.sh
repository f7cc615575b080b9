#!/usr/bin/env bash
# docs/results.md "Out-of-distribution guard": maps calibrated on Brown (32K tokens, chunks of 1024), then per split
# layer the tail KL without and with the guard and how often it falls back, on 16 prompts per domain (2K prompts,
# 256-token tail), and the guard's cost in TTFT (1K tail, exact / RidgeFill / RidgeFill+guard rotated: 8K Brown prompts,
# 4K Python source).
#   scripts/guard_report.sh calibrate 20 15
#   scripts/guard_report.sh eval 20 15
#   scripts/guard_report.sh eval-each 15     # the same, one file per domain (guard-TAG-sS-2k-DOMAIN.json)
#   scripts/guard_report.sh cost 20
#   scripts/guard_report.sh verdicts 20 15   # the guard's scores alone on a second sample, disjoint from eval's
#                                            # (Brown and e-mail, 2K and 8K prompts): the margin's validation
#   scripts/guard_report.sh reference 15 20  # Brown in four places (its genres are stored in order), tail KL
#                                            # without and with the guard: the in-domain KL of the corpus as a whole
#   scripts/guard_report.sh readorder 20     # calibration's reading order: maps of Brown's first documents
#                                            # (sequential) vs documents spread over it, guard verdicts on the same
#                                            # prompts (held out from both), checks every 1024
source "$(dirname "$0")/report-env.sh"
OUT=docs/data M=build/maps/guard
DOMAINS=${DOMAINS:-brown,shakespeare,python-code,spanish,french-tech,portuguese-tech,email}
PROMPTS=${PROMPTS:-16}
mkdir -p "$OUT" "$M"
what=$1; shift
case $what in
calibrate)
    for s in "$@"; do
        f=$M/$TAG-s$s.gguf
        [ -f "$f" ] || "${RF[@]}" calibrate "$FILE" -s "$s" -n 32768 -c 1024 -o "$f" --no-progress
    done ;;
eval)
    for s in "$@"; do
        "${RF[@]}" eval "$FILE" --maps "$M/$TAG-s$s.gguf" --guard --task kl,longdep --lengths 2048 --tail-tokens 256 \
            --prompts "$PROMPTS" --domains "$DOMAINS" --json "$OUT/guard-$TAG-s$s-2k.json" | tee "$OUT/guard-$TAG-s$s-2k.md"
    done ;;
eval-each)
    for s in "$@"; do for d in ${DOMAINS//,/ }; do
        "${RF[@]}" eval "$FILE" --maps "$M/$TAG-s$s.gguf" --guard --task kl,longdep --lengths 2048 --tail-tokens 256 \
            --prompts "$PROMPTS" --domains "$d" --json "$OUT/guard-$TAG-s$s-2k-$d.json" > "$OUT/guard-$TAG-s$s-2k-$d.md"
    done; done ;;
cost)
    for s in "$@"; do for dl in brown:8192 python-code:4096; do
        d=${dl%:*}
        "${RF[@]}" bench "$FILE" --maps "$M/$TAG-s$s.gguf" --guard-cost --domain "$d" --lengths "${dl#*:}" \
            --tail-tokens 1024 -r 3 --json "$OUT/guard-cost-$TAG-s$s-$d.json" > "$OUT/guard-cost-$TAG-s$s-$d.md"
    done; done ;;
verdicts)
    # sample B: Brown from 30K tokens into its held-out documents (past eval's 16 prompts of sample A), e-mail
    # from 120K tokens in (sample A spans its first 112K); 2K prompts with a 256 tail, 8K prompts with a 1K tail
    for s in "$@"; do for spec in brown:30000:2048:256:64 email:120000:2048:256:32 brown:30000:8192:1024:24 \
                                  email:120000:8192:1024:16; do
        IFS=: read -r d skip len tail n <<< "$spec"
        "${RF[@]}" eval "$FILE" --maps "$M/$TAG-s$s.gguf" --task guard --domains "$d" --skip-tokens "$skip" \
            --lengths "$len" --tail-tokens "$tail" --prompts "$n" --json "$OUT/guard-verdicts-$TAG-s$s-$d-$len.json" \
            > "$OUT/guard-verdicts-$TAG-s$s-$d-$len.md"
    done; done ;;
reference)
    for s in "$@"; do for skip in 0 300000 600000 900000; do
        f=$OUT/guard-$TAG-s$s-2k-brown-$skip
        [ "$skip" = 0 ] && f=$OUT/guard-$TAG-s$s-2k-brown-heldout
        [ -f "$f.json" ] || "${RF[@]}" eval "$FILE" --maps "$M/$TAG-s$s.gguf" --guard --task kl,longdep --domains brown \
            --skip-tokens "$skip" --lengths 2048 --tail-tokens 256 --prompts 16 --json "$f.json" > "$f.md"
    done; done ;;
readorder)
    S=build/maps/guard-spread
    mkdir -p "$S"
    for s in "$@"; do
        [ -f "$M/$TAG-s$s-seq.gguf" ] || "${RF[@]}" calibrate "$FILE" -s "$s" -n 32768 -c 1024 --read-order sequential \
            -o "$M/$TAG-s$s-seq.gguf" --no-progress
        [ -f "$S/$TAG-s$s.gguf" ] || "${RF[@]}" calibrate "$FILE" -s "$s" -n 32768 -c 1024 --read-order spread \
            -o "$S/$TAG-s$s.gguf" --no-progress
        # Brown in four places (its genres are stored in order) and e-mail
        for spec in brown:0:2048:256:16 brown:300000:2048:256:16 brown:600000:2048:256:16 brown:900000:2048:256:16 \
                    email:900000:2048:256:32; do
            IFS=: read -r d skip len tail n <<< "$spec"
            for o in spread seq; do
                if [ $o = spread ]; then a=$S/$TAG-s$s.gguf b=$M/$TAG-s$s-seq.gguf; else a=$M/$TAG-s$s-seq.gguf b=$S/$TAG-s$s.gguf; fi
                "${RF[@]}" eval "$FILE" --maps "$a" --compare-maps "$b" --task guard --guard-period 1024 --domains "$d" \
                    --skip-tokens "$skip" --lengths "$len" --tail-tokens "$tail" --prompts "$n" \
                    --json "$OUT/guard-order-$o-$TAG-s$s-$d-$skip-$len.json" > "$OUT/guard-order-$o-$TAG-s$s-$d-$skip-$len.md"
            done
        done
        # and the tail KL of both map files on the same held-out prompts: press (the genre sequential read) and
        # cg58-cn13 (belles lettres to fiction)
        for skip in 0 600000; do
            "${RF[@]}" eval "$FILE" --maps "$S/$TAG-s$s.gguf" --compare-maps "$M/$TAG-s$s-seq.gguf" --task kl \
                --domains brown --skip-tokens $skip --lengths 2048 --tail-tokens 256 --prompts 16 \
                --json "$OUT/guard-order-kl-$TAG-s$s-brown-$skip-2048.json" > "$OUT/guard-order-kl-$TAG-s$s-brown-$skip-2048.md"
        done
    done ;;
*) echo "usage: $0 calibrate|eval|eval-each|cost|verdicts|reference|readorder SPLIT..." >&2; exit 2 ;;
esac
