#!/usr/bin/env python3
"""The speed–quality frontier of every measured map setting (docs/maps.md, "The frontier").

Reads the `ridgefill eval --compare-maps` results of scripts/maps_report.sh (one JSON per split layer: every
variant of that split on the same prompts) and puts each (split layer, variant) at its speed — the FLOP limit
flops(exact)/flops(RidgeFill) of `ridgefill.bench.flops` at the prompt and tail given — and its quality per domain:
tail KL(exact‖RidgeFill) and the key tokens' ΔNLL, with their intervals (which resample prompts).  A setting is
on the frontier of a domain when no other setting is at least as fast with a lower KL.

    python scripts/maps_frontier.py MODEL.gguf docs/data/maps-smollm2-s*-2k.json --length 8192 --tail 1024 \
        --plot docs/data/maps-frontier-smollm2.png
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill.bench import Shape, flops  # noqa: E402

VARIANT = re.compile(r"(input|kv)-c(\d)")


def settings(path: Path) -> list[dict]:
    """One row per (split, variant) of an eval JSON: name, kind, C and per domain (KL, key ΔNLL) triples."""
    r = json.loads(path.read_text())
    s = r["split_layer"]
    paths = {"ridgefill": r["maps"], **{f"maps:{Path(p).stem}": p for p in r["config"]["compare"]}}
    rows = []
    for mode, maps in paths.items():
        m = VARIANT.search(Path(maps).stem)
        if not m:
            raise SystemExit(f"{path}: cannot tell the variant of {maps} (expected ...-input-cN / -kv-cN)")
        q = {}
        for dom, per in r["domains"].items():
            (cell,) = per.values()
            q[dom] = (cell["modes"][mode]["kl"], cell["modes"][mode]["nll_key_diff"])
        rows.append({"split": s, "variant": m.group(0), "kind": m.group(1), "C": int(m.group(2)), "quality": q})
    return rows


def mark_frontier(rows: list[dict]) -> list[str]:
    """Set row["frontier"][domain]: no other setting of that domain is at least as fast with a lower KL."""
    domains = list(dict.fromkeys(d for row in rows for d in row["quality"]))
    for d in domains:
        have = [r for r in rows if d in r["quality"]]
        for r in have:
            kl = r["quality"][d][0][0]
            r.setdefault("frontier", {})[d] = not any(o["limit"] >= r["limit"] and o["quality"][d][0][0] < kl
                                                      for o in have if o is not r)
    return domains


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="the GGUF model (its shape gives the FLOP limits)")
    ap.add_argument("results", nargs="+", help="eval JSONs of scripts/maps_report.sh eval")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--tail", type=int, default=1024)
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--reference", default="20:input-c0",
                    help="SPLIT:VARIANT whose KL the plot marks per domain (default: today's recommended setting)")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args()
    shape = Shape.of(args.model)
    rows = [row for p in args.results for row in settings(Path(p))]
    for row in rows:
        row["limit"] = flops(shape, args.length) / flops(shape, args.length, row["split"], args.tail, args.sink,
                                                         row["kind"], row["C"])
    domains = mark_frontier(rows)
    rows.sort(key=lambda r: (-r["split"], r["variant"]))
    print(f"FLOP limit at {args.length} tokens, tail {args.tail}; quality at the eval's prompts "
          f"(● = on the domain's frontier)\n")
    print("| split | variant | FLOP limit | " + " | ".join(f"KL {d} | key ΔNLL {d}" for d in domains) + " |")
    print("|---|---|---|" + "---|---|" * len(domains))
    for r in rows:
        cells = []
        for d in domains:
            if d not in r["quality"]:
                cells += ["—", "—"]
                continue
            (kl, lo, hi), (dn, _, _) = r["quality"][d]
            cells += [f"{kl:.4f} [{lo:.4f}, {hi:.4f}]{' ●' if r['frontier'][d] else ''}", f"{dn:+.3f}"]
        print(f"| {r['split']} | {r['variant']} | {r['limit']:.2f}× | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"length": args.length, "tail": args.tail, "rows": rows}, indent=1) + "\n")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(domains), figsize=(5 * len(domains), 4.2), squeeze=False)
        marks = {"input": "o", "kv": "s"}
        for ax, d in zip(axes[0], domains):
            have = sorted((r for r in rows if d in r["quality"]), key=lambda r: r["limit"])
            for r in have:
                kl, lo, hi = r["quality"][d][0]
                ax.errorbar(r["limit"], kl, yerr=[[kl - lo], [hi - kl]], fmt=marks[r["kind"]],
                            color=f"C{r['C']}", ms=5, capsize=2)
                ax.annotate(f"{r['split']}", (r["limit"], kl), textcoords="offset points", xytext=(4, 3),
                            fontsize=7)
            ref = [r for r in have if f"{r['split']}:{r['variant']}" == args.reference]
            if ref:
                ax.axhline(ref[0]["quality"][d][0][0], color="grey", ls=":", lw=1)
                ax.annotate(f"split {args.reference.replace(':', ' ')}", (have[-1]["limit"], ref[0]["quality"][d][0][0]),
                            textcoords="offset points", xytext=(-60, -10), fontsize=7, color="grey")
            front = [r for r in have if r["frontier"][d]]
            ax.plot([r["limit"] for r in front], [r["quality"][d][0][0] for r in front], "k--", lw=0.8)
            ax.set_yscale("log")
            ax.set_xlabel(f"FLOP limit (×), {args.length} tokens, tail {args.tail}")
            ax.set_title(d)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("tail KL(exact‖RidgeFill), nats")
        handles = [plt.Line2D([], [], marker=marks[k], color=f"C{c}", ls="", label=f"{k}-c{c}")
                   for k in marks for c in (0, 1, 2)
                   if any(r["kind"] == k and r["C"] == c for r in rows)]
        fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8)
        fig.tight_layout(rect=(0, 0, 1, 0.92))
        fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
