"""docs/results.md's guard table from `ridgefill eval --guard` JSON files (scripts/guard_report.sh eval).
"KL / in-domain KL" divides by the Brown KL of the first file that has Brown.

    python scripts/guard_table.py docs/data/guard-smollm2-s20-2k.json [...]
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill.stats import fmt_ci  # noqa: E402


def rows(path: str):
    r = json.loads(Path(path).read_text())
    for name, d in r["domains"].items():
        t = next(v for k, v in d.items() if k.startswith("tail@"))
        kl, kg, g = t["modes"]["ridgefill"]["kl"], t["modes"]["guard"]["kl"], t["guard"]
        yield (r["split_layer"], name, kl, kg, g, len(g["prompts"]),
               t["modes"]["ridgefill"]["nll_key_diff"], t["modes"]["guard"]["nll_key_diff"])


def main(paths):
    table = [row for p in paths for row in rows(p)]
    base = next((kl[0] for _, name, kl, *_ in table if name == "brown"), None)
    if base is None:
        sys.exit("guard_table.py: none of the files has Brown, the in-domain reference of the KL ratio")
    print("| split | domain | prompts | tail KL, RidgeFill | tail KL, RidgeFill+guard | KL / in-domain KL | fell back | "
          "key-token ΔNLL, RidgeFill → +guard | largest check score per prompt (median, range) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s, name, kl, kg, g, n, dk, dg in table:
        sc = sorted(g["max_scores"])
        print(f"| {s} | {name} | {n} | {fmt_ci(kl, 3)} | {fmt_ci(kg, 3)} | {kl[0] / base:.1f}× | "
              f"{g['fell_back_n']}/{n} ({fmt_ci(g['fell_back'], 2)}) | {dk[0]:+.2f} → {dg[0]:+.2f} | "
              f"{sc[len(sc) // 2]:.2f} ({sc[0]:.2f}–{sc[-1]:.2f}) |")


if __name__ == "__main__":
    main(sys.argv[1:])
