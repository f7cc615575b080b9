"""Which canary rows separate in-domain prompts from foreign ones best?  A design study for the guard, offline.

For each prompt the exact late-layer inputs of every row are computed once (exact prefill, layer inputs captured),
the maps' predictions are compared row by row, and guard statistics over different canary rows are read off:
the probe (the first W rows after the sink) for several W, and the probe plus W-row checks every P rows.  The
rows after the probe attend to exact cells here, where the runtime's checks attend to filled ones: exact for the
probe, an approximation for later checks.  Threshold-free comparison: the share of foreign prompts caught when
the threshold lets through all but 5% (or 10%) of the in-domain prompts.

  python scripts/guard_design.py MODEL MAPS --domain brown:30000:64 --domain email:120000:32 --json OUT.json
(domain:skip_tokens:prompts; prompts of --length tokens with the tail --tail-tokens exact, as `ridgefill eval`).
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from ridgefill import guard, ridge
from ridgefill.calibrate import LayerInputs
from ridgefill.evaluate import EvalConfig, Evaluator, held_out, windows
from ridgefill.ggufio import read_maps


def row_errors(runner: LayerInputs, m, toks: list[int], sink: int, n_fill: int) -> tuple[np.ndarray, np.ndarray]:
    """Per filled row and late layer: |ŷ−y|² and |y|² (input maps), rows sink .. sink+n_fill."""
    acts = runner.run(np.asarray(toks, dtype=np.int32))
    f = ridge.context_features(acts[0], m.context_tokens, sink)[:n_fill]
    num, den = [], []
    for i, l in enumerate(m.late_layers):
        y = acts[1 + i][sink:sink + n_fill].astype(np.float64)
        e = f @ m.weights[l].T.astype(np.float64) + m.biases[l] - y
        num.append((e ** 2).sum(1)), den.append((y ** 2).sum(1))
    return np.stack(num, 1), np.stack(den, 1)


def stat(num: np.ndarray, den: np.ndarray, layer_error: np.ndarray, rows: np.ndarray) -> float:
    """The guard's score (ridgefill.guard.scores) of one check over `rows`."""
    return float(guard.scores(num[rows].sum(0)[None], den[rows].sum(0)[None], layer_error)[0])


def designs(n_fill: int) -> dict[str, list[np.ndarray]]:
    """name -> the canary windows (row indices into the filled region) a prompt is checked on."""
    out = {f"probe {w}": [np.arange(w)] for w in (32, 64, 128, 256)}
    for p in (512, 1024):
        out[f"probe 32 + checks every {p}"] = [np.arange(s, s + 32) for s in range(0, n_fill - 32, p)]
        out[f"pooled 32 every {p}"] = [np.concatenate([np.arange(s, s + 32) for s in range(0, n_fill - 32, p)])]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model"), ap.add_argument("maps")
    ap.add_argument("--domain", action="append", required=True, help="name:skip_tokens:prompts (first: in-domain)")
    ap.add_argument("--length", type=int, default=2048), ap.add_argument("--tail-tokens", type=int, default=256)
    ap.add_argument("--sink-tokens", type=int, default=4), ap.add_argument("--json", required=True)
    a = ap.parse_args()
    m = read_maps(a.maps)
    if m.map_kind != "input":
        raise SystemExit("this study handles input maps")
    threads = os.cpu_count() or 1
    runner = LayerInputs(a.model, [m.split_layer, *m.late_layers], a.length + 16, threads)
    n_fill = a.length - a.tail_tokens - a.sink_tokens
    res = {"model": a.model, "maps": a.maps, "length": a.length, "tail_tokens": a.tail_tokens, "domains": {}}
    for spec in a.domain:
        name, skip, count = spec.split(":")
        ev = Evaluator(EvalConfig(model=a.model, maps=a.maps, tasks=["kl"], lengths=[a.length],
                                  tail_tokens=a.tail_tokens, sink_tokens=a.sink_tokens, prompts=int(count),
                                  domains=[name], skip_tokens=int(skip), threads=threads))
        scores = {d: [] for d in designs(n_fill)}
        for toks in windows(ev, held_out(ev, name, print), a.length, int(count), name):
            num, den = row_errors(runner, m, toks, a.sink_tokens, n_fill)
            for d, wins in designs(n_fill).items():
                scores[d].append(max(stat(num, den, m.guard.layer_error, w) for w in wins))
        res["domains"][name] = scores
        print(name, {d: round(float(np.median(s)), 2) for d, s in scores.items()}, flush=True)
        del ev
    names = list(res["domains"])
    base = res["domains"][names[0]]
    res["caught"] = {}
    for d in base:
        row = {}
        for fp in (0.05, 0.10):
            t = float(np.quantile(base[d], 1 - fp))
            row[f"threshold at {fp:.0%} in-domain fallback"] = t
            for other in names[1:]:
                row[f"{other} caught at {fp:.0%}"] = float(np.mean(np.asarray(res["domains"][other][d]) > t))
        res["caught"][d] = row
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    for d, row in res["caught"].items():
        print(f"{d:32s} " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
