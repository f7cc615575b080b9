#!/usr/bin/env python3
"""Were the guard's fallbacks on in-domain text right?  The unguarded tail KL of the prompts a verdict run sent to
the exact path, beside as many prompts of the same run that passed (docs/results.md, "Which in-domain prompts fall
back").

Takes an `ridgefill eval --task guard` JSON file, rebuilds the same prompts (eval's own windows of the same held-out
text) and runs exact and RidgeFill (no guard) on the chosen ones.

    python scripts/guard_prompt_kl.py MODEL.gguf docs/data/guard-verdicts6-smollm2-s20-brown-410000-2048.json --passed 8
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill import evaluate  # noqa: E402
from ridgefill.stats import bootstrap_mean, fmt_ci  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="GGUF model file")
    ap.add_argument("verdicts", help="ridgefill eval --task guard --json output")
    ap.add_argument("--passed", type=int, default=8, help="passing prompts to compare (evenly spread over the run)")
    ap.add_argument("--json")
    args = ap.parse_args()
    r = json.loads(Path(args.verdicts).read_text())
    c = r["config"]
    (name, d), = r["domains"].items()
    (key, g), = d.items()
    length = int(key.split("@")[1])
    cfg = evaluate.EvalConfig(model=args.model, maps=r["maps"], tasks=["kl"], lengths=[length],
                              tail_tokens=c["tail_tokens"], sink_tokens=c["sink_tokens"], prompts=c["prompts"],
                              skip_tokens=c["skip_tokens"], domains=[name], guard_period=c["guard_period"])
    ev = evaluate.Evaluator(cfg)
    prompts = evaluate.windows(ev, evaluate.held_out(ev, name), length, cfg.prompts, name)
    assert len(prompts) == len(g["prompts"]), "the verdict file's prompts cannot be rebuilt"
    fell = [i for i, p in enumerate(g["prompts"]) if p["verdict"] == "fell_back"]
    passed = [i for i, p in enumerate(g["prompts"]) if p["verdict"] == "passed"]
    passed = [passed[j] for j in np.linspace(0, len(passed) - 1, min(args.passed, len(passed))).round().astype(int)]
    rows, kls = [], {"fell_back": [], "passed": []}
    for i in fell + passed:
        arr = evaluate._tail_metrics(ev, [prompts[i]], ["ridgefill"])
        kl = float(arr["modes"]["ridgefill"]["kl"].mean())
        v = g["prompts"][i]
        kls[v["verdict"]].append(arr["modes"]["ridgefill"]["kl"])
        text = ev.llm.detokenize(prompts[i][len(ev.bos):len(ev.bos) + 24]).decode("utf-8", "replace")
        rows.append({"prompt": i, "verdict": v["verdict"], "max_score": v["max_score"], "kl": kl, "starts": text})
        print(f"prompt {i}: {v['verdict']}, score {v['max_score']:.2f}, tail KL {kl:.4f}", file=sys.stderr)
    summary = {}
    for k, parts in kls.items():
        if parts:
            vals = np.concatenate(parts)
            groups = np.concatenate([np.full(len(p), j) for j, p in enumerate(parts)])
            summary[k] = bootstrap_mean(vals, groups)
    print(f"{name}, {len(prompts)} prompts of {length} from {c['skip_tokens']} tokens in, maps {r['maps']} "
          f"(threshold {g['threshold']:.2f}): unguarded tail KL per prompt\n")
    print("| prompt | verdict | largest score | tail KL, RidgeFill | begins |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['prompt']} | {row['verdict']} | {row['max_score']:.2f} | {row['kl']:.4f} | "
              f"{row['starts'].strip()[:70].replace('|', '/')!r} |")
    print()
    for k, m in summary.items():
        print(f"{k}: {len(kls[k])} prompts, tail KL {fmt_ci(m, 4)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"verdicts": args.verdicts, "rows": rows, "summary": summary},
                                              indent=1) + "\n")


if __name__ == "__main__":
    main()
