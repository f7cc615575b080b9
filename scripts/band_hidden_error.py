"""Does the hidden state's error tell which band layers to leave unwindowed?  (a diagnostic, docs/maps.md)

    python scripts/band_hidden_error.py MODEL.gguf [--split-layer 20 --band-layers 10 --band-window 1024]
        [--ctx 8192 --chunks 1] [--variants "10,11;12,13;..."] --json OUT.json

A rule inside `calibrate` would see only calibration text, and the cheapest thing it can measure there is how far the
band moves the hidden states.  For each variant (a set of band layers left unwindowed; "" the fully windowed band)
this runs the runtime's band pass over calibration chunks (the maps' corpus, Brown, read as `calibrate` reads it)
and records, over the rows past the window, the relative squared error against the exact pass,
sum ||x_band - x_exact||^2 / sum ||x_exact||^2, of the split layer's input (what the maps read) and of every band
layer's input after the first (what the band's own K/V are computed from).  Compare its ranking with the tail KL's
(scripts/kl_ratio.py on the runtime evals): if they disagree, the rule needs the tail KL itself.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ridgefill.calibrate import CalibConfig, LayerInputs, token_budget  # noqa: E402

DEFAULT_VARIANTS = ";10,11;12,13;14,15;16,17;18,19;10,11,14,15;10,11,14,15,18,19"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--split-layer", type=int, default=20)
    ap.add_argument("--band-layers", type=int, default=10)
    ap.add_argument("--band-window", type=int, default=1024)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help="';'-separated sets of unwindowed band layers")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()
    s, B, W = a.split_layer, a.band_layers, a.band_window
    layers = [s, *range(s - B + 1, s)]                       # the split layer's input, then band layers' after the first
    runner = LayerInputs(a.model, layers, a.ctx, a.threads, B, W, 0, ())
    chunks = token_budget(runner, CalibConfig(model=a.model, split_layer=s, tokens=a.chunks * a.ctx, ctx=a.ctx))
    variants = [tuple(int(x) for x in v.split(",") if x) for v in a.variants.split(";")]
    llm, C, d = runner.llm, runner.C, runner.d

    def capture(n: int) -> np.ndarray:
        return np.stack([np.ctypeslib.as_array(runner._get(llm.ctx, l), shape=(n, d)) for l in layers])

    err = {v: [] for v in variants}
    for ch in chunks:
        n, rows = len(ch), slice(W + 1, len(ch) - 1)          # past the window; the last row runs exact
        t = time.time()
        llm.set_ridgefill(False)
        llm.reset()
        C.llama_memory_clear(C.llama_get_memory(llm.ctx), True)
        arr = (C.llama_token * n)(*map(int, ch))             # kept alive: the batch only points at it
        rc = C.llama_decode(llm.ctx, C.llama_batch_get_one(arr, n))
        if rc != 0:
            sys.exit(f"llama_decode failed with {rc}")
        exact = capture(n)[:, rows].copy()
        print(f"exact pass {time.time() - t:.0f} s", flush=True)
        for v in variants:
            llm.set_band(None, None, v)
            llm.set_ridgefill(True)
            llm.reset()
            llm.eval(ch)
            diff = capture(n)[:, rows] - exact
            e = (diff ** 2).sum((1, 2)) / (exact ** 2).sum((1, 2))
            err[v].append(e.tolist())
            print(f"unwindowed {v or '-'}: split input {e[0]:.4f}, band inputs " + " ".join(f"{x:.4f}" for x in e[1:]),
                  flush=True)
    out = {"model": a.model.name, "split_layer": s, "band_layers": B, "band_window": W, "ctx": a.ctx,
           "chunks": len(chunks), "layers": layers,
           "variants": {",".join(map(str, v)): err[v] for v in variants}}
    a.json.write_text(json.dumps(out, indent=1))
    base = np.mean([e[0] for e in err[()]]) if () in err else None
    base_sum = np.mean([sum(e[1:]) for e in err[()]]) if () in err else None
    print("| unwindowed | split input rel. error | closed | band inputs, summed | closed |")
    print("|---|---|---|---|---|")
    for v in variants:
        m, t = np.mean([e[0] for e in err[v]]), np.mean([sum(e[1:]) for e in err[v]])
        closed = (f"{100 * (1 - m / base):.0f}%", f"{100 * (1 - t / base_sum):.0f}%") if base else ("", "")
        print(f"| {','.join(map(str, v)) or 'none'} | {m:.4f} | {closed[0]} | {t:.3f} | {closed[1]} |")


if __name__ == "__main__":
    main()
