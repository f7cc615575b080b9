"""Where a prefill's CPU time goes, by kernel, for exact and each map file: does attention cost what it computes?

    python scripts/attention_profile.py MODEL --maps A.gguf,B.gguf [--length 8192] [--tail-tokens 1024] [-r 2]
        [--json OUT.json]
    python scripts/attention_profile.py MODEL --rotate --maps A.gguf,B.gguf [-r 3] [--json OUT.json]
    python scripts/attention_profile.py OUT.json --table

Each mode (exact, then each map file with the band it records) runs in its own process under `perf record`
(flash attention on, 2048/512 batches, as `ridgefill bench -fa on`); the CPU samples are put in three groups by the
function they hit: attention (the CPU flash-attention kernels, their softmax and F16 conversion), weight products
(matrix products and the quantization of their inputs) and other.  Beside them, the work each mode asks for: the
products with weights (`bench.flop_parts`) and attention counted the way the tiled CPU kernel computes it, whole
64 x 64 tiles of query rows by keys, every tile with a key some row of it may see (`tile_attention`).  The ratio of
the two groups' samples over the ratio of the two works, rho, is what a computed attention FLOP costs against a
weight FLOP in that run: if it is the same for every mode, the kernel's time follows the tiles it computes and a
key it skips costs nothing.  A ratio within one run is immune to the machine's speed changing between runs, which
wall-clock ratios of single runs are not.  With --rotate every mode runs in one process instead, rotated as
`ridgefill bench --compare-maps` rotates them, and each run's samples (taken between its start and end on
CLOCK_MONOTONIC) give the seconds it spent in each group: the medians per mode, and each group's seconds per TFLOP
of its work, say which part of the time one setting loses against another in the same run.  Needs perf and the
unstripped libggml-cpu.so of the build (build/*/bin/).  Used for docs/maps.md, "What a skipped key costs" and
"Where the bands' time goes, in one process".
"""
import argparse
import bisect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
from attention_cost import fill_parts  # noqa: E402
from ridgefill.bench import Shape, flop_parts  # noqa: E402

TILE = 64                      # GGML_FA_TILE_Q = GGML_FA_TILE_KV in the pinned ggml-cpu
N_BATCH, N_UBATCH = 2048, 512  # bench's


def ubatches(n: int, plan: tuple[int, int] | None) -> list[tuple[int, int, bool]]:
    """(first position, rows, filled) of each ubatch: batches of N_BATCH, cut where a token's path changes and
    into N_UBATCH rows (the runtime's split)."""
    cuts = sorted({0, n, *(plan or ())})
    out = []
    for b in range(0, n, N_BATCH):
        for lo, hi in zip(cuts, cuts[1:]):
            lo, hi = max(lo, b), min(hi, b + N_BATCH)
            filled = plan is not None and plan[0] <= lo < plan[1]
            for u in range(lo, hi, N_UBATCH):
                out.append((u, min(N_UBATCH, hi - u), filled))
    return out


def tiles(a: int, b: int, window: int = 0, sink: int = 0) -> int:
    """Key tiles computed for a query tile of rows at positions a..b: those with a key some row may see (causal,
    and with a window only the sink and each row's `window` latest positions)."""
    last = b // TILE
    if not window:
        return last + 1
    first = max(0, a - window + 1) // TILE
    return last - first + 1 + (1 if sink and first > 0 else 0)


def tile_attention(shape: Shape, n: int, fill: dict | None, tail: int, sink: int) -> float:
    """Attention FLOPs as the tiled kernel computes them (2 products of d_q per query-key pair, whole tiles)."""
    split = fill["split_layer"] if fill else shape.n_layer
    plan = (sink, n - tail) if fill and n - tail > sink else None
    band, window = (fill["band_layers"], fill["band_window"]) if fill else (0, 0)
    full = set(fill.get("band_full_layers", [])) if fill else set()
    d_q = shape.n_head * shape.head_dim
    total = 0
    for u, rows, filled in ubatches(n, plan):
        for q in range(0, rows, TILE):
            a, b = u + q, u + min(q + TILE, rows) - 1
            for il in range(shape.n_layer if not filled else split):
                windowed = filled and band and window and il >= split - band and il not in full
                total += TILE * TILE * tiles(a, b, window if windowed else 0, sink)
    return 2.0 * 2 * d_q * total


GROUPS = (("attention", re.compile(r"flash_attn|soft_max|fp16_to_fp32")),
          ("weights", re.compile(r"vec_dot|mul_mat|quantize_row|gemm|gemv|tinyBLAS")))


def symbols(lib: Path) -> tuple[list[int], list[str]]:
    out = subprocess.run(["nm", "-C", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    syms = sorted((int(p[0], 16), p[2]) for p in (ln.split(" ", 2) for ln in out.splitlines())
                  if len(p) == 3 and p[1] in "tTwW")
    if not syms:
        sys.exit(f"{lib}: no symbols (stripped); point --lib at the build's copy")
    return [s for s, _ in syms], [n for _, n in syms]


def groups(data: Path, syms: tuple[list[int], list[str]], window: tuple[float, float] | None = None) -> dict[str, float]:
    """Percent of the samples in each group (of those between two CLOCK_MONOTONIC times, with `window`)."""
    when = ["--time", f"{window[0]:.6f},{window[1]:.6f}"] if window else []
    rep = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "sym", "--stdio", *when],
                         capture_output=True, text=True, check=True).stdout
    out = {"attention": 0.0, "weights": 0.0, "other": 0.0}
    for line in rep.splitlines():
        m = re.match(r"\s*([0-9.]+)%\s+\[.\]\s+(\S+.*?)\s*(-\s+-\s*)?$", line)
        if not m:
            continue
        name = m.group(2)
        if name.startswith("0x"):   # a local function of libggml-cpu: name it from the unstripped copy
            name = syms[1][max(0, bisect.bisect_right(syms[0], int(name, 16)) - 1)]
        group = next((g for g, rx in GROUPS if rx.search(name)), "other")
        out[group] += float(m.group(1))
    return out


def fill_of(llm) -> dict:
    """What the loaded maps fill (split, kind, band), as `tile_attention` and `parts` read it."""
    return {"split_layer": llm.split_layer, "band_layers": llm.band[0], "band_window": llm.band[1],
            "band_full_layers": list(llm.band_full_layers), "map_kind": llm.map_kind,
            "context_tokens": llm.context_tokens}


def parts(shape: Shape, n: int, fill: dict | None, tail: int, sink: int) -> tuple[float, float]:
    """`bench.flop_parts` of exact (fill None) or of a fill."""
    return flop_parts(shape, n) if fill is None else fill_parts(shape, fill, n, tail, sink)


def perf_run(a, data: Path, record: list[str], child: list[str]) -> tuple[list[str], dict]:
    """This script as a child under `perf record` (samples to `data`): its output lines and its RESULT."""
    p = subprocess.run(["perf", "record", *record, "-F", "499", "-o", str(data), "--", sys.executable, __file__,
                        a.model, *child, "--length", str(a.length), "--tail-tokens", str(a.tail_tokens),
                        "--sink-tokens", str(a.sink_tokens), "-r", str(a.repeats)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    lines = p.stdout.splitlines()
    res = next((json.loads(ln[7:]) for ln in lines if ln.startswith("RESULT ")), None)
    if p.returncode or res is None:
        sys.exit(f"the profiled run ({' '.join(child)}) failed:\n{p.stderr[-2000:]}")
    return lines, res


def child(model: str, maps: str, n: int, tail: int, sink: int, repeats: int, exact: bool) -> None:
    from ridgefill import data
    from ridgefill.runtime import Llama
    llm = Llama(model, ridgefill=not exact, maps_path=maps, tail_tokens=tail, sink_tokens=sink, n_ctx=n,
                n_batch=N_BATCH, n_ubatch=N_UBATCH, verbose=False, flash_attn=True, guard=False)
    tokens = llm.tokenize(data.text("shakespeare")[: n * 8].encode())[:n]
    llm.eval(tokens[:64])
    secs = []
    for _ in range(repeats):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(tokens)
        secs.append(time.perf_counter() - t0)
    print("RESULT " + json.dumps({"seconds": secs, "fill": None if exact else fill_of(llm)}), flush=True)


def child_rotated(model: str, files: list[str], n: int, tail: int, sink: int, repeats: int) -> None:
    """Exact and every map file on one context, rotated as `ridgefill bench --compare-maps` rotates them; each run's
    window is printed on CLOCK_MONOTONIC, the clock `perf record -k CLOCK_MONOTONIC` stamps its samples with."""
    from ridgefill import data
    from ridgefill.bench import rotate
    from ridgefill.runtime import Llama
    llm = Llama(model, maps_path=files[0], tail_tokens=tail, sink_tokens=sink, n_ctx=n, n_batch=N_BATCH,
                n_ubatch=N_UBATCH, verbose=False, flash_attn=True, guard=False)
    tokens = llm.tokenize(data.text("shakespeare")[: n * 8].encode())[:n]
    fills = {}
    for f in files:
        llm.load_maps(f)
        fills[f] = fill_of(llm)
    loaded = [files[-1]]
    llm.set_ridgefill(False)
    llm.eval(tokens[:64])

    def once(mode: str) -> None:
        if mode != "exact" and loaded[0] != mode:
            llm.load_maps(mode)
            loaded[0] = mode
        llm.set_ridgefill(mode != "exact")
        llm.reset()
        t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
        llm.eval(tokens)
        print("WINDOW " + json.dumps([mode, t0, time.clock_gettime(time.CLOCK_MONOTONIC)]), flush=True)
    rotate(("exact", *files), repeats, once)
    print("RESULT " + json.dumps({"fills": fills}), flush=True)


def rotated(a, syms, shape: Shape) -> list[dict]:
    """All modes in one process, rotated; each run's samples by group, in seconds (share of the run's samples times
    its wall time); per mode the medians over repeats."""
    import statistics
    files = a.maps.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        lines, res = perf_run(a, data, ["-k", "CLOCK_MONOTONIC"], ["--maps", a.maps, "--child-rotated"])
        runs: dict[str, list[dict]] = {}
        for ln in lines:
            if ln.startswith("WINDOW "):
                mode, t0, t1 = json.loads(ln[7:])
                share = groups(data, syms, (t0, t1))
                runs.setdefault(mode, []).append({"seconds": t1 - t0, **{g: share[g] / 100 * (t1 - t0) for g in share}})
    rows = []
    for mode in ["exact", *files]:
        fill, n = (None if mode == "exact" else res["fills"][mode]), a.length
        w = parts(shape, n, fill, a.tail_tokens, a.sink_tokens)[0]
        med = {k: statistics.median(r[k] for r in runs[mode]) for k in runs[mode][0]}
        rows.append({"maps": mode, "fill": fill, "runs": runs[mode], "median": med, "weight_flops": w,
                     "tile_attention_flops": tile_attention(shape, n, fill, a.tail_tokens, a.sink_tokens)})
    return rows


def rotated_table(rows: list[dict]) -> str:
    """Markdown: per mode the median seconds of each group, and each group's seconds per TFLOP of its work."""
    out = ["| mode | s | weights s | s / weight TFLOP | attention s | s / tile-attention TFLOP | other s |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["median"]
        out.append(f"| {Path(r['maps']).name} | {m['seconds']:.2f} | {m['weights']:.2f} | "
                   f"{m['weights'] / r['weight_flops'] * 1e12:.2f} | {m['attention']:.2f} | "
                   f"{m['attention'] / r['tile_attention_flops'] * 1e12:.2f} | {m['other']:.2f} |")
    return "\n".join(out)


def table(rows: list[dict]) -> str:
    """Markdown: each mode's attention time against exact's (attention over weight samples, times its weight
    FLOPs), beside its tile-counted attention against exact's; rho; and the *cost-model speed* against exact, weights
    plus exact's rho times the tile-counted attention: what the mode would gain if its attention cost what exact's
    does per computed FLOP (a limit like the FLOP limit, in the units this CPU's kernels run at)."""
    ex = rows[0]
    cost = lambda r: r["weight_flops"] + ex["rho"] * r["tile_attention_flops"]  # noqa: E731
    out = ["| mode | s (min) | attention : weight samples | attention TFLOP, model / tiles | tile attention vs exact "
           "| attention time vs exact | rho | cost-model speed |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rel_t = r["tile_attention_flops"] / ex["tile_attention_flops"]
        # attention samples per weight FLOP against exact's: the kernel's time, with a weight FLOP's cost as the unit
        ratio = r["share"]["attention"] / r["share"]["weights"]
        rel_s = ratio * r["weight_flops"] / (ex["share"]["attention"] / ex["share"]["weights"] * ex["weight_flops"])
        out.append(f"| {Path(r['maps']).name} | {min(r['seconds']):.2f} | {ratio:.3f} | "
                   f"{r['attention_flops'] / 1e12:.2f} / {r['tile_attention_flops'] / 1e12:.2f} | {rel_t:.3f} | "
                   f"{rel_s:.3f} | {r['rho']:.2f} | {cost(ex) / cost(r):.3f}× |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="the model file, or with --table a JSON this script wrote")
    ap.add_argument("--maps", help="comma-separated map files (exact is always run first)")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--tail-tokens", type=int, default=1024)
    ap.add_argument("--sink-tokens", type=int, default=4)
    ap.add_argument("-r", "--repeats", type=int, default=2)
    ap.add_argument("--lib", default=None, help="unstripped libggml-cpu.so (default: build/*/bin/)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-exact", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-rotated", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rotate", action="store_true",
                    help="run every mode in one process, rotated as `ridgefill bench --compare-maps` does")
    ap.add_argument("--table", action="store_true", help="print the table of a JSON this script wrote (MODEL)")
    a = ap.parse_args()
    if a.child_rotated:
        return child_rotated(a.model, a.maps.split(","), a.length, a.tail_tokens, a.sink_tokens, a.repeats)
    if a.table:
        res = json.loads(Path(a.model).read_text())
        return print(rotated_table(res["rows"]) if res.get("rotated") else table(res["rows"]))
    if not a.maps:
        ap.error("--maps is required")
    if a.child:
        return child(a.model, a.child, a.length, a.tail_tokens, a.sink_tokens, a.repeats, a.child_exact)
    lib = Path(a.lib) if a.lib else next(iter(sorted(ROOT.glob("build/*/bin/libggml-cpu.so"))), None)
    if lib is None:
        sys.exit("no build/*/bin/libggml-cpu.so: pass --lib")
    syms = symbols(lib)
    shape = Shape.of(a.model)
    if a.rotate:
        rows = rotated(a, syms, shape)
        print(rotated_table(rows))
        if a.json:
            Path(a.json).write_text(json.dumps({"model": a.model, "length": a.length, "tail_tokens": a.tail_tokens,
                                                "sink_tokens": a.sink_tokens, "repeats": a.repeats, "rotated": True,
                                                "rows": rows}, indent=1))
        return
    rows = []
    files = a.maps.split(",")
    for maps in ["exact", *files]:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "perf.data"
            _, res = perf_run(a, data, [], ["--maps", "-", "--child", files[0] if maps == "exact" else maps,
                                            *(["--child-exact"] if maps == "exact" else [])])
            share = groups(data, syms)
        fill, n = res["fill"], a.length
        w, model_attn = parts(shape, n, fill, a.tail_tokens, a.sink_tokens)
        t_attn = tile_attention(shape, n, fill, a.tail_tokens, a.sink_tokens)
        rho = (share["attention"] / share["weights"]) / (t_attn / w)
        rows.append({"maps": maps, "fill": fill, "seconds": res["seconds"], "share": share, "weight_flops": w,
                     "attention_flops": model_attn, "tile_attention_flops": t_attn, "rho": rho})
        print(f"{Path(maps).name}: {min(res['seconds']):.1f} s; samples attention {share['attention']:.1f}%, "
              f"weights {share['weights']:.1f}%, other {share['other']:.1f}%; rho {rho:.2f}", flush=True)
    print()
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "length": a.length, "tail_tokens": a.tail_tokens,
                                            "sink_tokens": a.sink_tokens, "repeats": a.repeats, "rows": rows},
                                           indent=1))


if __name__ == "__main__":
    main()
