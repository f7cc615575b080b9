#!/usr/bin/env python3
"""The figures of docs/scale.md.

    python scripts/scale_figures.py sizes                       # model files vs maps, every shape (instant)
    python scripts/scale_figures.py calibrate MODEL -s 8 -n 2048 -c 512 --map-type q8_0 -o maps.gguf
                                                                # one calibrate run: time per phase, peak RSS
    python scripts/scale_figures.py solve-time --d 4096 --late 15   # one λ of the search, and the solve, alone

The models are ridgefill.synthetic ones (random weights: speed, memory and plumbing only, never quality).
`calibrate` prints one JSON object: seconds per phase (load, forward, moments, solve, diagnostics, write),
seconds per 1K tokens of the pass, peak RSS (getrusage; and sampled every 0.2 s, split into anonymous and
file-backed memory), the map file's size against synthetic.maps_bytes.  MB = 10^6 bytes.
"""
import argparse
import json
import os
import resource
import tempfile
import threading
from pathlib import Path

from ridgefill import synthetic
from ridgefill.bench import Shape
from ridgefill.calibrate import CalibConfig, calibrate
from ridgefill.modelfile import open_gguf

MAP_TYPES = ("f32", "f16", "q8_0")
MB = 1e6


def sizes() -> str:
    """Markdown: per real shape, the model file (q4_0, q8_0) and its maps at the middle split layer."""
    head = ("| shape | d | layers | model q4_0 MB | model q8_0 MB | split | late layers | maps f32 MB | maps f16 MB "
            "| maps q8_0 MB | q8_0 maps / q4_0 model | q8_0 maps / q8_0 model "
            "| lowest split with q8_0 maps ≤ 10% of the q4_0 / q8_0 model |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    with tempfile.TemporaryDirectory() as tmp:
        for spec in synthetic.SPECS.values():
            if spec.name.startswith("tiny-"):
                continue
            s = spec.shape
            model = {t: synthetic.write(spec, Path(tmp) / f"{t}.gguf", t, weights=False).stat().st_size
                     for t in ("q4_0", "q8_0")}
            split = s.n_layer // 2
            maps = {t: synthetic.maps_bytes(s, split, t) for t in MAP_TYPES}
            lowest = [next(k for k in range(1, s.n_layer) if synthetic.maps_bytes(s, k, "q8_0") <= 0.10 * model[t])
                      for t in ("q4_0", "q8_0")]
            rows.append(f"| {spec.name} | {s.d} | {s.n_layer} | {model['q4_0'] / MB:,.0f} | {model['q8_0'] / MB:,.0f} "
                        f"| {split} | {s.n_layer - split - 1} | {maps['f32'] / MB:,.0f} | {maps['f16'] / MB:,.0f} "
                        f"| {maps['q8_0'] / MB:,.1f} | {maps['q8_0'] / model['q4_0']:.1%} "
                        f"| {maps['q8_0'] / model['q8_0']:.1%} | {lowest[0]} / {lowest[1]} |")
    return "\n".join(rows)


class PeakRss:
    """Samples /proc/self/status every 0.2 s: the peak of RSS and of its anonymous and file-backed parts (the
    file-backed part is the model's mapped weights: clean pages the kernel can drop)."""

    def __init__(self):
        self.peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.wait(0.2):
            for line in Path("/proc/self/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in self.peak:
                    self.peak[key] = max(self.peak[key], int(value.split()[0]) * 1024)

    def stop(self) -> dict:
        self.done.set()
        self.thread.join()
        return self.peak


def measure(args) -> dict:
    cfg = CalibConfig(model=Path(args.model), split_layer=args.split_layer, tokens=args.tokens, ctx=args.ctx,
                      lam=args.ridge_lambda if args.ridge_lambda == "auto" else float(args.ridge_lambda),
                      map_type=args.map_type, threads=args.threads, progress=False)
    sampler = PeakRss()
    m = calibrate(cfg, args.output)
    sampled = sampler.stop()
    shape = Shape.of(args.model)
    x = m.extra
    n_fed = -(-args.tokens // args.ctx) * args.ctx          # tokens through the model (whole chunks)
    data = sum(int(t.n_bytes) for t in open_gguf(args.output).tensors)
    return {"model": os.path.basename(args.model), "model_mb": round(Path(args.model).stat().st_size / MB),
            "d": shape.d, "n_layer": shape.n_layer, "split_layer": m.split_layer, "late_layers": len(m.late_layers),
            "tokens": args.tokens, "ctx": args.ctx, "threads": args.threads, "lambda": args.ridge_lambda,
            "seconds": {k[:-2]: round(v, 2) for k, v in x.items() if k.endswith("_s")},
            "pass_s_per_1k_tokens": round(1000 * (x["forward_s"] + x["moments_s"]) / n_fed, 2),
            "forward_s_per_1k_tokens": round(1000 * x["forward_s"] / n_fed, 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB),
            "sampled_peak_mb": {k: round(v / MB) for k, v in sampled.items()},
            "moments_mb": round(2 * 8 * (len(m.late_layers) + 1) * shape.d ** 2 / MB),
            "map_file_bytes": Path(args.output).stat().st_size, "map_tensor_bytes": data,
            "maps_bytes": synthetic.maps_bytes(shape, m.split_layer, args.map_type)}


def solve_time(d: int, late: int) -> dict:
    """Seconds of one λ value of ridge.pick_lambda and of the final ridge.solve, on moments of random rows (the
    arithmetic does not depend on the values): what the λ search costs at width d with `late` late layers."""
    import time

    import numpy as np

    from ridgefill import ridge
    rng = np.random.default_rng(0)
    train, val = ridge.Moments(d, late), ridge.Moments(d, late)
    for m in (train, val):
        h = rng.standard_normal((512, d), dtype=np.float32)
        m.add(h, h[None] + rng.standard_normal((late, 512, d), dtype=np.float32))
    t = time.perf_counter()
    ridge.pick_lambda(train, val, "identity", grid=(0.01,))
    one = time.perf_counter() - t
    t = time.perf_counter()
    ridge.solve(train, 0.01, "identity", dtype=np.float32)
    final = time.perf_counter() - t
    return {"d": d, "late_layers": late, "one_lambda_s": round(one, 1), "solve_s": round(final, 1),
            "search_and_solve_s": round(len(ridge.LAMBDA_GRID) * one + final)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("sizes")
    st = sub.add_parser("solve-time")
    st.add_argument("--d", type=int, required=True)
    st.add_argument("--late", type=int, required=True)
    c = sub.add_parser("calibrate")
    c.add_argument("model")
    c.add_argument("-s", "--split-layer", type=int, required=True)
    c.add_argument("-n", "--tokens", type=int, default=2048)
    c.add_argument("-c", "--ctx", type=int, default=512)
    c.add_argument("--map-type", default="q8_0", choices=MAP_TYPES)
    c.add_argument("--lambda", dest="ridge_lambda", default="auto", help="auto (held-out search) or a number")
    c.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    c.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    if args.cmd == "sizes":
        print(sizes())
    else:
        print(json.dumps(solve_time(args.d, args.late) if args.cmd == "solve-time" else measure(args)))
