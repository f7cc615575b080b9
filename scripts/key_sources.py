#!/usr/bin/env python3
"""Where the keys right after the split get their error: attention or the FFN of the layers in between.

A late layer l's input is x_l = h_s + Σ_{j=s}^{l-1} (a_j + m_j): the attention outputs a_j (which mix other
tokens) and the FFN outputs m_j (per token, nonlinear) of the layers between the split and l.  A map from h_s
alone must guess both.  This fits ridge maps to layer l's K and V from feature sets that add exact parts of that
sum (computed from exact activations: oracles, not runtime features) and from the runtime's context features, and
reports the held-out relative error of each — what is left when the attention is known, when the FFN is known, and
how much of the attention the previous tokens' states stand for.

    python scripts/key_sources.py SmolLM2.gguf --split-layer 15 --layers 16,17,18 --calib-tokens 32768
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fill_sim import NumpyLlama  # noqa: E402
from ridgefill import calibrate, ridge  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--split-layer", "-s", type=int, default=15)
    ap.add_argument("--layers", default="16,17,18")
    ap.add_argument("--calib-tokens", type=int, default=32768)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--sink-tokens", type=int, default=4)
    args = ap.parse_args()
    s, sink = args.split_layer, args.sink_tokens
    targets = [int(x) for x in args.layers.split(",")]
    model = NumpyLlama(args.model)
    top = max(targets)
    runner = calibrate.LayerInputs(Path(args.model), list(range(s, top + 1)), args.ctx, os.cpu_count())
    cfg = calibrate.CalibConfig(model=Path(args.model), split_layer=s, tokens=args.calib_tokens, ctx=args.ctx)
    chunks = calibrate.token_budget(runner, cfg)
    is_val = calibrate.val_chunks(len(chunks), 0.1)

    def feature_sets(x, a, m, l):
        """x[j]: inputs of layers s..top; a[j], m[j]: attention / FFN outputs of layer s+j; for target l."""
        h = x[0]
        n_mid = l - s
        prev = np.concatenate([h[:1], h[:-1]])
        prev2 = np.concatenate([h[:2], h[:-2]])
        A = sum(a[:n_mid])
        M = sum(m[:n_mid])
        return {
            "h_t": h,
            "h_t, h_t-1": np.concatenate([h, prev], 1),
            "h_t, h_t-1, h_t-2": np.concatenate([h, prev, prev2], 1),
            "h_t + attention (exact)": np.concatenate([h, A], 1),
            "h_t + FFN (exact)": np.concatenate([h, M], 1),
            "h_t, h_t-1 + FFN (exact)": np.concatenate([h, prev, M], 1),
            "h_t, h_t-1 + attention (exact)": np.concatenate([h, prev, A], 1),
        }

    mom = {}
    for ci, (chunk, held) in enumerate(zip(chunks, is_val)):
        acts = runner.run(chunk)                          # inputs of layers s..top
        a = [model.attn(s + j, acts[j]) for j in range(top - s)]
        m = [acts[j + 1] - acts[j] - a[j] for j in range(top - s)]
        for l in targets:
            k, v = model.kv(l, acts[l - s])
            y = np.stack([k.reshape(len(k), -1), v.reshape(len(v), -1)])[:, sink:]
            for name, f in feature_sets(acts, a, m, l).items():
                key = (l, name)
                if key not in mom:
                    mom[key] = (ridge.Moments(f.shape[1], 2, y.shape[2]), ridge.Moments(f.shape[1], 2, y.shape[2]))
                mom[key][1 if held else 0].add(f[sink:], y)
        print(f"chunk {ci + 1}/{len(chunks)}", file=sys.stderr, end="\r")
    print(file=sys.stderr)
    print(f"split {s}: held-out relative error of K / V of layer l, ridge from each feature set "
          f"({args.calib_tokens} Brown tokens, λ per target on held-out chunks)\n")
    names = list(dict.fromkeys(name for _, name in mom))
    print("| features | " + " | ".join(f"K l{l} | V l{l}" for l in targets) + " |")
    print("|---|" + "---|---|" * len(targets))
    for name in names:
        cells = []
        for l in targets:
            train, val = mom[(l, name)]
            lams, _ = ridge.pick_lambda(train, val, "zero")
            W, b = ridge.solve(train, lams, "zero")
            err = np.sqrt(ridge.sse(val, W, b) / val.sxx)
            cells += [f"{err[0]:.3f}", f"{err[1]:.3f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
