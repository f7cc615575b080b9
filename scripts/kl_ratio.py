"""Tail KL of fills measured on the same prompts, as ratios to a reference, with prompts resampled.

    python scripts/kl_ratio.py REF.json:MODE OTHER.json:MODE ... [--domain brown] [--length 8192]

Each argument is a `ridgefill eval --json` file and one of its modes ("ridgefill" or "maps:NAME"), or a
`scripts/fill_sim.py --json` file and one of its variants (runs of one file share their prompts). The runs must
have evaluated the same prompts (same domain, length, count, seed): their exact NLL must agree, else the script
refuses; `--exact-tolerance NATS` accepts a difference up to NATS in the mean exact NLL (the same prompts run on
another machine, whose kernels round differently) and prints it. The interval of a ratio of means resamples whole
prompts, the same draw for every mode (paired).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def load(arg: str, domain: str, length: int) -> tuple[str, dict, dict]:
    path, sep, mode = arg.partition(".json:")
    path += ".json"
    if not sep:
        sys.exit(f"{arg}: expected FILE.json:MODE")
    d = json.load(open(path))
    if "kl" in d:                       # fill_sim: per-prompt KL of each variant; the prompts are the file's
        per = d["kl"][domain]
        if mode not in per:
            sys.exit(f"{path}: no variant {mode!r} (variants: {', '.join(per)})")
        kl = np.asarray(per[mode])
        boot = kl[np.random.default_rng(0).integers(0, len(kl), size=(4000, len(kl)))].mean(-1)
        cell = {"tokens": [d["length"], d["tail_tokens"], d.get("skip_tokens", 0), len(kl)], "nll_exact": [0.0]}
        return f"{path}:{mode}", cell, {"kl_prompts": per[mode], "kl": [kl.mean(), *np.percentile(boot, [2.5, 97.5])]}
    cell = d["domains"][domain][f"tail@{length}"]
    if mode not in cell["modes"]:
        sys.exit(f"{path}: no mode {mode!r} (modes: {', '.join(cell['modes'])})")
    return f"{path}:{mode}", cell, cell["modes"][mode]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="FILE.json:MODE, the first is the reference")
    ap.add_argument("--domain", default="brown")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--boot", type=int, default=4000)
    ap.add_argument("--digits", type=int, default=2, help="decimals of the ratios")
    ap.add_argument("--exact-tolerance", type=float, default=0.0, metavar="NATS",
                    help="largest difference in mean exact NLL accepted between runs (runs on different machines)")
    a = ap.parse_args()
    runs = [load(r, a.domain, a.length) for r in a.runs]
    ref_cell = runs[0][1]
    for name, cell, _ in runs[1:]:
        diff = abs(cell["nll_exact"][0] - ref_cell["nll_exact"][0])
        if cell["tokens"] != ref_cell["tokens"] or diff > a.exact_tolerance:
            sys.exit(f"{name}: other prompts than {runs[0][0]} (exact NLL {cell['nll_exact'][0]:.6f} vs "
                     f"{ref_cell['nll_exact'][0]:.6f}, tail tokens {cell['tokens']} vs {ref_cell['tokens']})")
        if diff:
            print(f"{name}: exact NLL {cell['nll_exact'][0]:.6f} vs {ref_cell['nll_exact'][0]:.6f} "
                  f"({diff:.6f} nats apart, within --exact-tolerance)")
    kl = np.array([m["kl_prompts"] for _, _, m in runs])           # (modes, prompts)
    idx = np.random.default_rng(0).integers(0, kl.shape[1], size=(a.boot, kl.shape[1]))
    means = kl[:, idx].mean(-1)                                     # (modes, boot)
    print(f"{a.domain}, {a.length}-token prompts, {kl.shape[1]} prompts; ratios to {runs[0][0]}")
    print("| fill | KL | ratio of means [95%] | per prompt | prompts above the reference |")
    print("|---|---|---|---|---|")
    for i, (name, _, m) in enumerate(runs):
        lo, hi = np.percentile(means[i] / means[0], [2.5, 97.5])
        per = kl[i] / kl[0]
        print(f"| {name} | {m['kl'][0]:.4f} [{m['kl'][1]:.4f}, {m['kl'][2]:.4f}] | "
              f"{kl[i].mean() / kl[0].mean():.{a.digits}f} [{lo:.{a.digits}f}, {hi:.{a.digits}f}] | "
              f"{per.min():.2f}–{per.max():.2f} | "
              f"{int((kl[i] > kl[0]).sum())}/{kl.shape[1]} |")


if __name__ == "__main__":
    main()
