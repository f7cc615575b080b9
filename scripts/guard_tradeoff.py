"""docs/results.md's guard trade-off table from `ridgefill eval --task guard` JSON files (guard_report.sh verdicts):
per file the share of prompts that fall back at several thresholds, read off each prompt's largest check score.

Exact for thresholds at or below the one the run used (a prompt that fell back there falls back at any lower one;
a prompt that passed ran all its checks, so its largest score is known); above it, a prompt that fell back before
its last check stopped checking, so the share is then a lower bound (marked ≥).

    python scripts/guard_tradeoff.py docs/data/guard-verdicts-smollm2-s20-*.json
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill.stats import fmt_ci, wilson  # noqa: E402

THRESHOLDS = (1.34, 1.5, 1.67, 1.8, 2.0)


def main(paths):
    print("| split | domain | prompt / tail | prompts | " + " | ".join(f"falls back at {t:g}" for t in THRESHOLDS) + " |")
    print("|---|---|---|---|" + "---|" * len(THRESHOLDS))
    for p in paths:
        r = json.loads(Path(p).read_text())
        for name, d in r["domains"].items():
            for key, g in d.items():
                if not key.startswith("guard@"):
                    continue
                s, n, used = g["max_scores"], len(g["max_scores"]), g["threshold"]
                most = max(q["checks"] for q in g["prompts"])
                cut_short = any(q["verdict"] == "fell_back" and q["checks"] < most for q in g["prompts"])
                cells = []
                for t in THRESHOLDS:
                    k = sum(x > t for x in s)
                    mark = "≥" if t > used + 1e-6 and cut_short else ""
                    cells.append(f"{mark}{k}/{n} ({fmt_ci(wilson(k, n), 2)})")
                print(f"| {r['split_layer']} | {name} | {key[6:]} / {r['config']['tail_tokens']} | {n} | "
                      + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
