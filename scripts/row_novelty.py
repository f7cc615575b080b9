#!/usr/bin/env python3
"""Can a row's split-layer state tell that the maps will get its keys wrong? (docs/maps.md, "Which rows
retrieval needs")

Exact rows for the needle restore retrieval at split 15 (scripts/needle_rows.py); a runtime that chose rows to
compute exactly would need a signal available at the split.  This measures one: the row's novelty, the Mahalanobis
distance of its features f_t from the calibration features (mean μ, covariance Σ over the calibration rows,
q_t = (f_t − μ)ᵀ (Σ + εI)⁻¹ (f_t − μ), the ridge leverage up to scale: d² FLOPs per row).  On needle prompts decoded
exactly it compares, per row, q_t with the maps' relative key error (mean over the late layers), and says where
the needle's rows rank among the filled rows by each.

    python scripts/row_novelty.py MODEL.gguf --maps build/maps/smollm2-s15-input-c0.gguf --prompts 8 --length 2048
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill import data, evaluate, kvproj, ridge  # noqa: E402
from ridgefill.calibrate import CalibConfig, LayerInputs, token_budget  # noqa: E402
from ridgefill.ggufio import read_maps  # noqa: E402
from ridgefill.modelfile import open_gguf  # noqa: E402


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="GGUF model file")
    ap.add_argument("--maps", required=True)
    ap.add_argument("--calib-tokens", type=int, default=32768)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--tail-tokens", type=int, default=256)
    ap.add_argument("--domain", default="shakespeare")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    m = read_maps(args.maps)
    s, C, sink, late = m.split_layer, m.context_tokens, m.sink_tokens, m.late_layers
    reader = open_gguf(args.model)
    kvw = {l: kvproj.load(reader, [l])[l] for l in late}

    # calibration features: mean and covariance (the same text and chunks calibrate reads)
    calib = LayerInputs(Path(args.model), [s], 1024, os.cpu_count())
    cc = CalibConfig(model=Path(args.model), split_layer=s, tokens=args.calib_tokens, ctx=1024,
                     read_order=m.extra.get("calib_read_order", "sequential"))
    D = (C + 1) * calib.d
    n, sf, sff = 0, np.zeros(D), np.zeros((D, D))
    for chunk in token_budget(calib, cc):
        f = ridge.context_features(calib.run(chunk)[0], C, sink).astype(np.float64)
        n, sf, sff = n + len(f), sf + f.sum(0), sff + f.T @ f
    del calib
    mu = sf / n
    cov = sff / n - np.outer(mu, mu)
    prec = np.linalg.inv(cov + 1e-3 * np.trace(cov) / D * np.eye(D))

    runner = LayerInputs(Path(args.model), [s, *late], args.length, os.cpu_count())
    ev_tok = lambda t: runner.tokenize(t)  # noqa: E731
    rng = random.Random(args.seed)
    hay = ev_tok(data.text(args.domain)[: (args.length + 2000 * args.prompts) * 8])
    q_all, e_all, rows = [], [], []
    for p in range(args.prompts):
        key = str(rng.randrange(10000, 100000))
        nd, qu = ev_tok(evaluate.NEEDLE.format(key=key)), ev_tok(evaluate.QUESTION)
        n_hay = args.length - len(runner.bos) - len(nd) - len(qu)
        off = rng.randrange(0, len(hay) - n_hay)
        lo, hi = sink, args.length - args.tail_tokens - len(nd)
        pos = lo + round(rng.random() * (hi - lo))
        at = pos - len(runner.bos)
        toks = np.asarray(runner.bos + hay[off:off + at] + nd + hay[off + at:off + n_hay] + qu, dtype=np.int32)
        acts = runner.run(toks)
        filled = np.arange(sink, args.length - args.tail_tokens)
        f = ridge.context_features(acts[0], C, sink)[filled - sink].astype(np.float64)
        z = f - mu
        q = np.einsum("nd,de,ne->n", z, prec, z) / D
        sse, ss = np.zeros(len(filled)), np.zeros(len(filled))
        for i, l in enumerate(late):
            k, _ = kvproj.project(kvw[l], acts[1 + i, filled])
            kh, _ = kvproj.predicted(kvw[l], m.map_kind, m.weights[l], m.biases[l], f)
            rel = ((kh - k) ** 2).sum((1, 2)) / np.maximum((k ** 2).sum((1, 2)), 1e-30)
            sse += rel
        err = np.sqrt(sse / len(late))                      # per row: rms over layers of the relative key error
        is_needle = (filled >= pos) & (filled < pos + len(nd))
        pct = lambda v: np.searchsorted(np.sort(v), v, side="right") / len(v)  # noqa: E731  (rank percentile)
        rows.append({"key": key, "needle_at": pos, "spearman": spearman(q, err),
                     "needle_novelty_pct": pct(q)[is_needle].tolist(), "needle_err_pct": pct(err)[is_needle].tolist(),
                     "needle_tokens": [runner.llm.detokenize([t]).decode("utf-8", "replace") for t in nd]})
        q_all.append(q), e_all.append(err)
        print(f"prompt {p + 1}/{args.prompts}: spearman {rows[-1]['spearman']:.2f}", file=sys.stderr)
    q_all, e_all = np.concatenate(q_all), np.concatenate(e_all)
    top = {}
    for frac in (0.02, 0.05, 0.1, 0.2):
        sel = q_all >= np.quantile(q_all, 1 - frac)
        hi_err = e_all >= np.quantile(e_all, 1 - frac)
        top[frac] = {"err_share_of_selected": float(e_all[sel].mean() / e_all.mean()),
                     "recall_of_top_err": float((sel & hi_err).sum() / hi_err.sum())}
    out = {"maps": args.maps, "split_layer": s, "prompts": rows, "spearman_all": spearman(q_all, e_all), "top": top}
    print(f"split {s}, {Path(args.maps).stem}: {args.prompts} needle prompts of {args.length} ({args.domain}), "
          f"{len(q_all)} filled rows; Spearman(novelty, key error) = {out['spearman_all']:.2f}\n")
    print("| rows made exact by novelty | their mean key error / all rows' | share of the top rows by key error they hold |")
    print("|---|---|---|")
    for frac, t in top.items():
        print(f"| top {frac:.0%} | {t['err_share_of_selected']:.2f}× | {t['recall_of_top_err']:.0%} |")
    print("\nneedle rows: rank percentile among the prompt's filled rows, novelty / key error (median over prompts)")
    toks = rows[0]["needle_tokens"]
    nov = np.median([r["needle_novelty_pct"] for r in rows], axis=0)
    er = np.median([r["needle_err_pct"] for r in rows], axis=0)
    print("| token | " + " | ".join(repr(t)[1:-1] or "·" for t in toks) + " |")
    print("|---|" + "---|" * len(toks))
    print("| novelty | " + " | ".join(f"{x:.2f}" for x in nov) + " |")
    print("| key error | " + " | ".join(f"{x:.2f}" for x in er) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
