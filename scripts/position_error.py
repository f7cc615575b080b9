#!/usr/bin/env python3
"""How the maps' K/V error grows with the position in the prompt (docs/maps.md, "Calibration context").

Calibration sees positions below its chunk length (--ctx, default 1024) while the maps fill prompts of 8K and
more.  This decodes long held-out windows once, exactly, and measures for each map file the relative error of the
K and V the maps give (kv maps directly, input maps through the layer's own projections) per position bucket,
averaged over the late layers; the sampling unit is the window.

    python scripts/position_error.py MODEL MAPS.gguf [MAPS2.gguf ...] --length 4096 --windows 4 --domain shakespeare

With --band-layers B --band-window W the maps read what a windowed band passes them (as the runtime fills a prompt
with that band; ridgefill.calibrate.LayerInputs), the targets stay exact.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill import data, kvproj, ridge  # noqa: E402
from ridgefill.calibrate import LayerInputs  # noqa: E402
from ridgefill.ggufio import read_maps  # noqa: E402
from ridgefill.modelfile import open_gguf  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("maps", nargs="+", help="map files of one split layer")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--domain", default="shakespeare")
    ap.add_argument("--buckets", default="0,512,1024,2048,3072,4096")
    ap.add_argument("--band-layers", type=int, default=0, help="features through a windowed band of B layers")
    ap.add_argument("--band-window", type=int, default=1024)
    ap.add_argument("--json")
    args = ap.parse_args()
    maps = {Path(p).stem: read_maps(p) for p in args.maps}
    s = {m.split_layer for m in maps.values()}
    assert len(s) == 1, "map files of one split layer"
    s = s.pop()
    any_map = next(iter(maps.values()))
    late = any_map.late_layers
    sink = max(m.sink_tokens for m in maps.values())
    reader = open_gguf(args.model)
    kvw = {l: kvproj.load(reader, [l])[l] for l in late}
    band = (args.band_layers, args.band_window, sink) if args.band_layers else ()
    runner = LayerInputs(Path(args.model), [s, *late], args.length, os.cpu_count(), *band)
    text = data.text(args.domain)
    toks = runner.tokenize(text[: args.windows * args.length * 8])
    step = (len(toks) - args.length) // max(1, args.windows - 1)
    edges = [int(x) for x in args.buckets.split(",")]
    # err[name][window] = (bucket, K sse, K ss, V sse, V ss) summed over layers
    err = {name: np.zeros((args.windows, len(edges) - 1, 4)) for name in maps}
    for w in range(args.windows):
        chunk = np.asarray(runner.bos + toks[w * step:w * step + args.length - len(runner.bos)], dtype=np.int32)
        acts = runner.run(chunk)
        h = acts[0]
        for name, m in maps.items():
            f = ridge.context_features(h, m.context_tokens, sink).astype(np.float32)
            pos = np.arange(sink, len(h))
            for i, l in enumerate(late):
                k, v = kvproj.project(kvw[l], acts[1 + i, sink:])
                kh, vh = kvproj.predicted(kvw[l], m.map_kind, m.weights[l], m.biases[l], f)
                for b in range(len(edges) - 1):
                    sel = (pos >= edges[b]) & (pos < edges[b + 1])
                    if sel.any():
                        err[name][w, b] += [((kh[sel] - k[sel]) ** 2).sum(), (k[sel] ** 2).sum(),
                                            ((vh[sel] - v[sel]) ** 2).sum(), (v[sel] ** 2).sum()]
        print(f"window {w + 1}/{args.windows} done", file=sys.stderr)
    out = {"model": args.model, "split_layer": s, "length": args.length, "windows": args.windows,
           "domain": args.domain, "buckets": edges, "band_layers": args.band_layers,
           "band_window": args.band_window if args.band_layers else 0, "maps": {}}
    print(f"relative K / V error by position, mean over layers {late[0]}..{late[-1]} "
          f"({args.windows} windows of {args.length} tokens of {args.domain}; range over windows"
          + (f"; features through a band of {args.band_layers} layers, window {args.band_window})" if band else ")"))
    print("| maps | calib ctx | " + " | ".join(f"{edges[b]}–{edges[b + 1]}" for b in range(len(edges) - 1)) + " |")
    print("|---|---|" + "---|" * (len(edges) - 1))
    for name, e in err.items():
        k_rel = np.sqrt(e[..., 0] / np.maximum(e[..., 1], 1e-30))  # (windows, buckets)
        v_rel = np.sqrt(e[..., 2] / np.maximum(e[..., 3], 1e-30))
        out["maps"][name] = {"calib_ctx": maps[name].extra.get("calib_ctx"), "k_rel": k_rel.tolist(),
                             "v_rel": v_rel.tolist()}
        cells = [f"K {k_rel[:, b].mean():.3f} [{k_rel[:, b].min():.3f}–{k_rel[:, b].max():.3f}], "
                 f"V {v_rel[:, b].mean():.3f}" for b in range(len(edges) - 1)]
        print(f"| {name} | {maps[name].extra.get('calib_ctx')} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
