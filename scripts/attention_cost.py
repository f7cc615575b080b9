"""What a FLOP of attention costs against a FLOP of the weights' matrix products, from one `ridgefill bench` run.

    python scripts/attention_cost.py BENCH.json [--fit-lengths 1024,2048,...]

The exact prefill's seconds at several prompt lengths are fitted, least squares through the origin, as
c_w·W(n) + c_a·A(n), with W and A the FLOP model's two parts (`bench.flop_parts`: products with weights, which grow
with n, and attention, which grows with n²).  With c_a/c_w known, each fill of the run (`--maps`, `--compare-maps`)
gets a *cost-weighted limit*, (c_w·W + c_a·A) of exact over the same of the fill, beside the FLOP limit and the
measured ratio.  A fill that saves mostly attention (a windowed band) is worth less than its FLOPs when c_a < c_w.
Used for docs/maps.md, "Band 4–21 against split 15 in one run, and why the band reaches less of its FLOP limit".
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill.bench import Shape, flop_parts  # noqa: E402


def fit(shape: Shape, lengths: list[int], seconds: list[float]) -> tuple[float, float]:
    """(c_w, c_a): seconds per weight FLOP and per attention FLOP of exact prefill, least squares through 0."""
    X = np.array([flop_parts(shape, n) for n in lengths])
    c, *_ = np.linalg.lstsq(X, np.asarray(seconds, dtype=float), rcond=None)
    return float(c[0]), float(c[1])


def fill_parts(shape: Shape, fill: dict, n: int, tail: int, sink: int) -> tuple[float, float]:
    return flop_parts(shape, n, fill["split_layer"], tail, sink, fill.get("map_kind", "input"),
                      fill.get("context_tokens", 0), fill["band_layers"], fill["band_window"],
                      len(fill["band_full_layers"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json")
    ap.add_argument("--fit-lengths", default=None, help="lengths whose exact seconds are fitted (default: all)")
    a = ap.parse_args()
    res = json.loads(Path(a.bench_json).read_text())
    shape = Shape.of(res["model"])
    fills = [res, *res.get("compare", [])]
    rows = res["rows"]
    use = [int(x) for x in a.fit_lengths.split(",")] if a.fit_lengths else [r["length"] for r in rows]
    fitted = [r for r in rows if r["length"] in use]
    if len(fitted) < 2:
        sys.exit("need exact seconds at two lengths or more")
    cw, ca = fit(shape, [r["length"] for r in fitted], [r["exact_s"] for r in fitted])
    print(f"exact prefill fitted on lengths {', '.join(str(r['length']) for r in fitted)}: "
          f"{cw * 1e12:.2f} s per TFLOP of weights, {ca * 1e12:.2f} s per TFLOP of attention "
          f"(an attention FLOP costs {ca / cw:.2f} of a weight FLOP)")
    print("| length | exact s | fitted | weights : attention (exact) |")
    print("|---|---|---|---|")
    for r in rows:
        w, at = flop_parts(shape, r["length"])
        print(f"| {r['length']} | {r['exact_s']:.2f} | {cw * w + ca * at:.2f} | {w / (w + at):.2f} : "
              f"{at / (w + at):.2f} |")
    print()
    print("| fill | length | measured | FLOP limit | of it | cost-weighted limit | of it |")
    print("|---|---|---|---|---|---|---|")
    tail, sink = res["tail_tokens"], res["sink_tokens"]
    for f in fills:
        name = Path(f["maps"]).name
        for r in f["rows"]:
            n = r["length"]
            we, ae = flop_parts(shape, n)
            wf, af = fill_parts(shape, f, n, tail, sink)
            cost = (cw * we + ca * ae) / (cw * wf + ca * af)
            print(f"| {name} | {n} | {r['ratio']:.2f}× | {r['limit']:.2f}× | {100 * (r['ratio'] - 1) / (r['limit'] - 1):.0f}% "
                  f"| {cost:.2f}× | {100 * (r['ratio'] - 1) / (cost - 1):.0f}% |")


if __name__ == "__main__":
    main()
