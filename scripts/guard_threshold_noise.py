"""How much of the guard's threshold is the luck of which held-out windows calibrate it (docs/results.md).

Calibrates the same maps again with other seeds (the seed picks only the held-out windows the guard and the
diagnostics sample; W and b do not change), and once with every held-out window, and prints each threshold with the
share of prompts that would fall back under it, read off per-prompt largest check scores of `ridgefill eval --task
guard` runs with the same maps (exact at or below the threshold those runs used, a lower bound above it: ≥).

    python scripts/guard_threshold_noise.py SmolLM2.gguf -s 20 --seeds 0,1,2,3 \
        --verdicts docs/data/guard-order-seq-smollm2-s20-brown-*-2048.json docs/data/guard-order-seq-smollm2-s20-email-*.json
"""
import argparse
import json
from pathlib import Path

import numpy as np

from ridgefill.calibrate import CalibConfig, calibrate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("-s", "--split-layer", type=int, required=True)
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--verdicts", nargs="+", required=True)
    a = ap.parse_args()
    per = {}                                            # domain -> (largest scores, threshold those runs used)
    for f in a.verdicts:
        for name, d in json.loads(Path(f).read_text())["domains"].items():
            for key, g in d.items():
                if key.startswith("guard@"):
                    s, t = per.get(name, ([], g["threshold"]))
                    per[name] = (s + g["max_scores"], t)
    runs = [(f"seed {x}, 32 windows", dict(seed=int(x))) for x in a.seeds.split(",")]
    runs.append(("every held-out window", dict(diag_tokens=4096)))   # 128 >= the 93 windows of 3 chunks
    print("| held-out windows | largest window score | threshold | " +
          " | ".join(f"{n}: fall back" for n in per) + " |")
    print("|---|---|---|" + "---|" * len(per))
    for label, extra in runs:
        m = calibrate(CalibConfig(model=a.model, split_layer=a.split_layer, corpus="brown", tokens=32768, ctx=1024,
                                  progress=False, **extra))
        g = m.guard
        cells = []
        for name, (s, used) in per.items():
            k = int((np.asarray(s) > g.threshold).sum())
            cells.append(f"{'≥ ' if g.threshold > used + 1e-6 else ''}{k}/{len(s)}")
        print(f"| {label} ({len(g.scores)}) | {g.scores[-1]:.2f} | {g.threshold:.2f} | " + " | ".join(cells) + " |",
              flush=True)


if __name__ == "__main__":
    main()
