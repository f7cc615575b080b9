#!/usr/bin/env python3
"""Do the needle's own rows decide retrieval? (docs/maps.md, "Which rows retrieval needs")

At split 15 SmolLM2 loses every pass key in the filled region, and exact keys everywhere (splice=k) restore it.
This asks whether the needle's own rows are enough: the needle is placed right after the sink (depth 0 of the
filled region), and each prompt is answered exactly, by RidgeFill with the maps' sink (the needle filled), and by
RidgeFill with the sink moved past the needle (the needle's rows exact; every other row filled as before).

    python scripts/needle_rows.py MODEL.gguf --maps build/maps/smollm2-s15-input-c1.gguf --lengths 1024,2048 --keys 24
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill import data, evaluate  # noqa: E402
from ridgefill._lib import lib  # noqa: E402
from ridgefill.stats import bootstrap_mean, fmt_ci, wilson  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="GGUF model file")
    ap.add_argument("--maps", required=True)
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--keys", type=int, default=24, help="pass keys per length")
    ap.add_argument("--tail-tokens", type=int, default=256)
    ap.add_argument("--domain", default="shakespeare")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    model = args.model
    cfg = evaluate.EvalConfig(model=model, maps=args.maps, tasks=["needle"], lengths=lengths,
                              tail_tokens=args.tail_tokens, depths=[0.0], seed=args.seed)
    ev = evaluate.Evaluator(cfg)
    sink = ev.llm.sink_tokens
    rng = random.Random(args.seed)
    hay_all = ev.tokens(data.text(args.domain)[: (max(lengths) + 2000 * args.keys) * 8])
    n_needle = len(ev.tokens(evaluate.NEEDLE.format(key="12345")))
    modes = ["exact", "needle filled", "needle exact"]
    hits = {m: [] for m in modes}

    def answer(toks, mode, sink_tokens):
        lib().llama_ridgefill_set_sink_tokens(ev.llm.ctx, sink_tokens)
        ev.llm.sink_tokens = sink_tokens
        return ev.answer(toks, mode)

    for length in lengths:
        for _ in range(args.keys):
            key = str(rng.randrange(10000, 100000))
            off = rng.randrange(0, max(1, len(hay_all) - length))
            toks, pos = evaluate.needle_prompt(ev, hay_all[off:], length, 0.0, key)
            assert pos == sink
            got = {"exact": answer(toks, "exact", sink),
                   "needle filled": answer(toks, "ridgefill", sink),
                   "needle exact": answer(toks, "ridgefill", pos + n_needle + 1)}
            for m in modes:
                hits[m].append(float(key in got[m].split("\n")[0]))
        print(f"{length} tokens: " + ", ".join(f"{m} {int(sum(hits[m][-args.keys:]))}/{args.keys}" for m in modes),
              file=sys.stderr)
    ex = np.asarray(hits["exact"])
    # needle_rows: the positions [first, end) that "needle exact" adds to the exact rows
    out = {"model": str(model), "maps": args.maps, "split_layer": ev.llm.split_layer, "lengths": lengths,
           "keys_per_length": args.keys, "needle_rows": [sink, sink + n_needle + 1], "domain": args.domain,
           "accuracy": {m: wilson(int(sum(hits[m])), len(hits[m])) for m in modes},
           "diff_from_exact": {m: bootstrap_mean(np.asarray(hits[m]) - ex, np.arange(len(ex)), seed=args.seed)
                               for m in modes[1:]}}
    n = len(ex)
    print(f"split {out['split_layer']}, {Path(args.maps).stem}, needle at positions {sink}..{sink + n_needle - 1} "
          f"(rows exact in 'needle exact': 0..{sink + n_needle}), {n} keys ({args.lengths} tokens, {args.domain})\n")
    print("| mode | keys found | Δ vs exact |\n|---|---|---|")
    for m in modes:
        d = "" if m == "exact" else fmt_ci(out["diff_from_exact"][m], 2)
        print(f"| {m} | {int(sum(hits[m]))}/{n} = {fmt_ci(out['accuracy'][m], 2)} | {d} |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
