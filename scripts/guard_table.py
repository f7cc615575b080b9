"""docs/results.md's guard table from `ridgefill eval --guard` JSON files (scripts/guard_report.sh eval).
"KL / in-domain KL" divides by the Brown KL of the first file that has Brown, or with --reference by the in-domain
KL of the calibration corpus as a whole: the mean of the Brown KLs of the given files (samples of 16 prompts from
places spread over the corpus, which is stored genre by genre), printed with a 95% interval from the places' own
intervals (a stratified mean: normal approximation, each place's half-width / 1.96 as its standard error).

    python scripts/guard_table.py docs/data/guard-smollm2-s20-2k.json [...]
    python scripts/guard_table.py --reference B1.json,B2.json,B3.json,B4.json B1.json ... OTHER.json ...
"""
import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill.stats import fmt_ci  # noqa: E402


def rows(path: str):
    r = json.loads(Path(path).read_text())
    skip = r["config"].get("skip_tokens", 0)
    for name, d in r["domains"].items():
        name += f" (from {skip // 1000}K)" if skip else ""          # a later place of the same text
        t = next(v for k, v in d.items() if k.startswith("tail@"))
        kl, kg, g = t["modes"]["ridgefill"]["kl"], t["modes"]["guard"]["kl"], t["guard"]
        yield (r["split_layer"], name, kl, kg, g, len(g["prompts"]),
               t["modes"]["ridgefill"]["nll_key_diff"], t["modes"]["guard"]["nll_key_diff"])


def reference(paths) -> tuple[float, float, float]:
    """The stratified mean of the Brown tail KLs of `paths` (one place of the corpus each), with its interval."""
    kls = [row[2] for p in paths for row in rows(p) if row[1].startswith("brown")]
    if len(kls) != len(paths):
        sys.exit("guard_table.py: every --reference file must hold one Brown sample")
    m = sum(k[0] for k in kls) / len(kls)
    se = math.sqrt(sum(((k[2] - k[1]) / 2 / 1.96) ** 2 for k in kls)) / len(kls)
    return m, m - 1.96 * se, m + 1.96 * se


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--reference", type=lambda v: v.split(","), default=None, metavar="FILE,FILE,...",
                    help="Brown samples from several places: their mean KL is the in-domain reference")
    args = ap.parse_args(argv)
    table = [row for p in args.files for row in rows(p)]
    if args.reference:
        ref = reference(args.reference)
        base = ref[0]
        print(f"in-domain reference: Brown over {len(args.reference)} places, tail KL {fmt_ci(ref, 3)}\n")
    else:
        base = next((kl[0] for _, name, kl, *_ in table if name.startswith("brown")), None)
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
