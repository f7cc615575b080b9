"""Time to first token, exact vs RidgeFill, measured side by side in one process.

For each prompt length the two modes run interleaved (A/B, then B/A, ...) on the same
prompt, so drifts of the machine hit both alike; the ratio is taken per repeat.  The
analytic limit is the ratio of prefill FLOPs (see `flops`), what a perfect
implementation would reach.  With other map files of the same model (`compare`), exact and
every fill rotate (exact, A, B; A, B, exact; ...), so two settings are compared in one run.

`run_chat` measures a conversation through a server's prompt cache instead: each turn
extends the previous prompt, so only the new part is prefilled, exactly or with RidgeFill.
"""
from __future__ import annotations

import json
import statistics
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import data
from .errors import RidgefillError
from .ggufio import field_value
from .modelfile import open_gguf


@dataclass
class Shape:
    n_layer: int
    d: int
    n_head: int
    n_kv: int
    head_dim: int
    d_ff: int
    n_vocab: int
    n_ctx_train: int

    @classmethod
    def of(cls, model: str | Path) -> "Shape":
        r = open_gguf(model)
        a = field_value(r, "general.architecture")
        n_head = int(field_value(r, f"{a}.attention.head_count"))
        d = int(field_value(r, f"{a}.embedding_length"))
        hd = int(field_value(r, f"{a}.attention.key_length", d // n_head))
        vocab = len(r.get_field("tokenizer.ggml.tokens").data)
        return cls(int(field_value(r, f"{a}.block_count")), d, n_head,
                   int(field_value(r, f"{a}.attention.head_count_kv")), hd,
                   int(field_value(r, f"{a}.feed_forward_length")), vocab, int(field_value(r, f"{a}.context_length")))


def flops(s: Shape, n: int, split_layer: int | None = None, tail: int = 0, sink: int = 0,
          map_kind: str = "input", context_tokens: int = 0, band_layers: int = 0, band_window: int = 0,
          band_full: int = 0) -> float:
    """Prefill FLOPs of an n-token prompt; with split_layer, tokens in [sink, n - tail) take the approximate path.

    Exact layer, per token at position p: Q/K/V/O projections, attention over p+1 keys, gated FFN.
    Approximate layer >= split, per token: at the split layer its own K/V projections; in every later layer the
    map, from (1 + context_tokens)·d features, to the layer input (then its K/V projections) or to K/V directly.
    The output head runs for the last token only.
    A band (band_layers > 0): the band_layers layers below the split run in full on approximate tokens, but a
    token at position p attends to the sink keys and its band_window latest ones instead of all p+1, except in
    band_full of them (unwindowed), which attend to all p+1 as exact layers do.
    """
    return sum(flop_parts(s, n, split_layer, tail, sink, map_kind, context_tokens, band_layers, band_window,
                          band_full))


def flop_parts(s: Shape, n: int, split_layer: int | None = None, tail: int = 0, sink: int = 0,
               map_kind: str = "input", context_tokens: int = 0, band_layers: int = 0, band_window: int = 0,
               band_full: int = 0) -> tuple[float, float]:
    """`flops` in two parts: (weights, attention) — the matrix products with weights (projections, FFN, maps,
    output head) and attention's products with keys and values, which a CPU may run at another rate."""
    d_q, d_kv = s.n_head * s.head_dim, s.n_kv * s.head_dim
    proj = 2 * (s.d * d_q + 2 * s.d * d_kv + d_q * s.d + 3 * s.d * s.d_ff)
    attn_sum = lambda a, b: 2 * 2 * d_q * (b * (b + 1) - a * (a + 1)) / 2  # noqa: E731  Σ_{p=a}^{b-1} (p+1) keys
    n_approx = max(0, n - tail - sink) if split_layer is not None else 0
    weights = 2 * s.d * s.n_vocab + s.n_layer * n * proj
    attn = s.n_layer * attn_sum(0, n)
    if n_approx:
        late = s.n_layer - split_layer
        d_f = (1 + context_tokens) * s.d
        kv_proj = 2 * 2 * s.d * d_kv
        if map_kind == "kv":
            per_token = kv_proj + (late - 1) * 2 * d_f * 2 * d_kv
        else:
            per_token = late * kv_proj + (late - 1) * 2 * d_f * s.d
        weights += n_approx * (per_token - late * proj)
        attn -= late * attn_sum(sink, sink + n_approx)
        if band_layers and band_window:     # the j-th filled token skips max(0, j - band_window) keys
            m = max(0, n_approx - band_window)
            attn -= (band_layers - band_full) * 2 * 2 * d_q * m * (m + 1) / 2
    return float(weights), float(attn)


@dataclass
class Row:
    length: int
    exact_s: float
    ridgefill_s: float
    ratio: float
    ratio_min: float
    ratio_max: float
    exact_tok_s: float
    ridgefill_tok_s: float
    limit: float
    of_limit: float
    filled: int
    exact_runs: list[float] = field(default_factory=list)       # seconds, each repeat, in repeat order
    ridgefill_runs: list[float] = field(default_factory=list)


def rotate(modes: tuple, repeats: int, once) -> dict:
    """`once(mode)` for each mode and repeat, the order rotated by one each repeat (two modes: exact/RidgeFill,
    then RidgeFill/exact, ...), so each mode runs in each place alike; the results by mode, in repeat order."""
    out = {m: [] for m in modes}
    for r in range(repeats):
        k = r % len(modes)
        for mode in modes[k:] + modes[:k]:
            out[mode].append(once(mode))
    return out


def alternate(repeats: int, once) -> dict[bool, list]:
    """`once(ridgefill)` for each repeat, exact first in even repeats and RidgeFill first in odd ones."""
    return rotate((False, True), repeats, once)


def row(n: int, exact: list[float], rf: list[float], limit: float, filled: int) -> Row:
    """One length's row from the seconds of each repeat, paired by repeat (the ratio is taken per repeat)."""
    ratios = [e / f for e, f in zip(exact, rf)]
    ratio, t_exact, t_rf = statistics.median(ratios), statistics.median(exact), statistics.median(rf)
    return Row(n, t_exact, t_rf, ratio, min(ratios), max(ratios), n / t_exact, n / t_rf, limit,
               (ratio - 1) / (limit - 1) if limit > 1 else float("nan"), filled, list(exact), list(rf))


def interleaved(n: int, repeats: int, limit: float, once) -> Row:
    """Time `once(ridgefill)` -> (seconds, filled tokens) exact/RidgeFill, then RidgeFill/exact, ...; one row."""
    runs = alternate(repeats, once)
    return row(n, [dt for dt, _ in runs[False]], [dt for dt, _ in runs[True]], limit, runs[True][-1][1])


def run(model: str, maps_path: str | None, lengths: list[int], tail: int, sink: int, repeats: int,
        threads: int | None, n_batch: int = 2048, n_ubatch: int = 512, progress=print, *, n_gpu_layers: int = 0,
        flash_attn: bool = False, band_layers: int | None = None, band_window: int | None = None,
        band_full_layers: list[int] | None = None, compare: list[str] = ()) -> dict:
    """Exact vs RidgeFill; with `compare` (other map files of the same model), exact and every map file rotated
    on one context (`_rotated`), each file with the band it records."""
    from .runtime import Llama
    if compare and (band_layers, band_window, band_full_layers) != (None, None, None):
        raise RidgefillError("--compare-maps times each file with the band it records: record a band in its file "
                             "(calibrate --band-layers) instead of --band-layers/--band-window/--band-full-layers")
    shape = Shape.of(model)
    if max(lengths) > shape.n_ctx_train:
        raise RidgefillError(f"length {max(lengths)} is beyond the model's context ({shape.n_ctx_train})")
    n_ctx = max(lengths)
    # the fill itself, without the out-of-distribution guard (run_guard measures it): the guard may send a
    # prompt of another register to the exact path, and the speed of the fill is what is measured here
    llm = Llama(str(model), maps_path=maps_path, tail_tokens=tail, sink_tokens=sink, n_ctx=n_ctx,
                n_batch=n_batch, n_ubatch=n_ubatch, n_threads=threads, n_threads_batch=threads, verbose=False,
                n_gpu_layers=n_gpu_layers, flash_attn=flash_attn, guard=False, band_layers=band_layers,
                band_window=band_window, band_full_layers=band_full_layers)
    tokens = llm.tokenize(data.text("shakespeare")[: max(lengths) * 8].encode())
    if len(tokens) < max(lengths):
        raise RidgefillError("not enough text for the longest prompt")
    for n in lengths:
        if tail >= n:
            raise RidgefillError(f"--tail-tokens {tail} is not shorter than the prompt ({n} tokens)")
    return _rotated(llm, shape, [llm.maps_path, *compare], tokens, lengths, tail, sink, repeats, threads, n_batch,
                    n_ubatch, progress)


def _fill(llm, shape: Shape, lengths: list[int], tail: int, sink: int) -> dict:
    """What the loaded maps fill: their file, split, band, and the FLOP limit at each length."""
    return {"maps": llm.maps_path, "split_layer": llm.split_layer, "map_kind": llm.map_kind,
            "context_tokens": llm.context_tokens, "band_layers": llm.band[0],
            "band_window": llm.band[1], "band_full_layers": list(llm.band_full_layers), "maps_bytes": llm.maps_bytes,
            "limits": {n: flops(shape, n) / flops(shape, n, llm.split_layer, tail, sink, llm.map_kind,
                                                  llm.context_tokens, *llm.band, band_full=len(llm.band_full_layers))
                       for n in lengths}}


def _rotated(llm, shape: Shape, maps: list[str], tokens: list[int], lengths: list[int], tail: int, sink: int,
             repeats: int, threads: int | None, n_batch: int, n_ubatch: int, progress=print) -> dict:
    """Exact and each map file on the same prompt, the order rotated each repeat (exact, A; A, exact; ... and with
    more files exact, A, B; A, B, exact; ...), on one context: a file is loaded before its run, outside the timed
    prefill.  Each fill gets a row against exact (ratios paired by repeat); beside other files, also `vs_first`, the
    median over repeats of the first file's seconds over its own: how much faster than the first fill it is."""
    names = [Path(m).name for m in maps]
    if len(set(names)) < len(names):
        raise RidgefillError(f"--compare-maps: a map file is given twice ({', '.join(names)})")
    fills = []
    for path in maps:
        if llm.maps_path != path:
            llm.load_maps(path)
        fills.append(_fill(llm, shape, lengths, tail, sink))
    loaded = [len(maps) - 1]
    llm.set_ridgefill(False)
    llm.eval(tokens[:64])                                   # warm-up
    rows: list[list[dict]] = [[] for _ in maps]
    for n in lengths:
        def once(mode: int | None) -> tuple[float, int]:
            if mode is not None and loaded[0] != mode:
                llm.load_maps(maps[mode])
                loaded[0] = mode
            llm.set_ridgefill(mode is not None)
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(tokens[:n])
            return time.perf_counter() - t0, llm.ridgefill_counts()[0]
        runs = rotate((None, *range(len(maps))), repeats, once)
        exact, first = [dt for dt, _ in runs[None]], [dt for dt, _ in runs[0]]
        for i, f in enumerate(fills):
            secs = [dt for dt, _ in runs[i]]
            r = row(n, exact, secs, f["limits"][n], runs[i][-1][1])
            rows[i].append(asdict(r))
            if len(maps) == 1:
                progress(format_row(r))
                continue
            vs = [a / b for a, b in zip(first, secs)]
            rows[i][-1].update(vs_first=statistics.median(vs), vs_first_min=min(vs), vs_first_max=max(vs))
            progress(f"{format_row(r)} {rows[i][-1]['vs_first']:8.2f}x  {names[i]}")
    plain = [{k: v for k, v in f.items() if k != "limits"} for f in fills]
    out = {"model": llm.model_path, "tail_tokens": tail, "sink_tokens": sink, "repeats": repeats, "threads": threads,
           "n_batch": n_batch, "n_ubatch": n_ubatch, **plain[0], "rows": rows[0]}
    if len(maps) > 1:
        out["compare"] = [{**f, "rows": rs} for f, rs in zip(plain[1:], rows[1:])]
    return out


def run_guard(model: str, maps_path: str | None, lengths: list[int], tail: int, sink: int, repeats: int,
              threads: int | None, domain: str = "brown", progress=print, period: int | None = None) -> dict:
    """What the out-of-distribution guard costs: exact, RidgeFill without the guard and with it, on the same
    prompt from `domain`, the three modes rotated each repeat (exact, rf, guard; rf, guard, exact; ...)."""
    from .runtime import Llama
    shape = Shape.of(model)
    llm = Llama(str(model), maps_path=maps_path, tail_tokens=tail, sink_tokens=sink, n_ctx=max(lengths),
                n_batch=2048, n_ubatch=512, n_threads=threads, n_threads_batch=threads, verbose=False,
                guard_period=period)
    tokens = llm.tokenize(data.text(domain)[: max(lengths) * 8].encode())
    if len(tokens) < max(lengths):
        raise RidgefillError(f"not enough {domain} text for the longest prompt")
    llm.set_ridgefill(False)
    llm.eval(tokens[:64])                                   # warm-up
    modes = ("exact", "ridgefill", "guard")
    rows = []
    for n in lengths:
        times: dict[str, list[float]] = {m: [] for m in modes}
        verdict, filled = None, {}
        for r in range(repeats):
            for m in modes[r % 3:] + modes[:r % 3]:
                llm.set_ridgefill(m != "exact")
                llm.set_guard(m == "guard")
                llm.reset()
                t0 = time.perf_counter()
                llm.eval(tokens[:n])
                times[m].append(time.perf_counter() - t0)
                filled[m] = llm.ridgefill_counts()[0]
                if m == "guard":
                    verdict = llm.guard_result()
        med = {m: statistics.median(t) for m, t in times.items()}
        r_rf = statistics.median([e / f for e, f in zip(times["exact"], times["ridgefill"])])
        r_g = statistics.median([e / g for e, g in zip(times["exact"], times["guard"])])
        cost = statistics.median([g / f - 1 for f, g in zip(times["ridgefill"], times["guard"])])
        rows.append({"length": n, "exact_s": med["exact"], "ridgefill_s": med["ridgefill"], "guard_s": med["guard"],
                     "ratio": r_rf, "guard_ratio": r_g, "kept": (r_g - 1) / (r_rf - 1) if r_rf > 1 else float("nan"),
                     "guard_cost": cost, "filled": filled["ridgefill"], "guard_filled": filled["guard"],
                     "verdict": verdict["guard"], "max_score": verdict["max_score"], "checks": verdict["checks"]})
        progress(f"{n:7d} exact {med['exact']:7.2f} s  rf {med['ridgefill']:7.2f} s ({r_rf:.2f}x)  guard "
                 f"{med['guard']:7.2f} s ({r_g:.2f}x, {100 * rows[-1]['kept']:.0f}% of the speedup kept, guard "
                 f"time +{100 * cost:.1f}%); {verdict['guard']} after {verdict['checks']} checks, max score "
                 f"{verdict['max_score']:.2f}")
    return {"model": str(model), "maps": llm.maps_path, "split_layer": llm.split_layer, "tail_tokens": tail,
            "sink_tokens": sink, "repeats": repeats, "threads": threads, "domain": domain,
            "guard_threshold": llm.guard_result()["threshold"], "rows": rows}


def _server_ridgefill(url: str) -> tuple[dict, dict, int | None]:
    """/props of a running ridgefill-server, its `ridgefill` object and a slot's context; an error if the server
    cannot be reached or runs without maps."""
    import urllib.error

    from .server import http_get
    try:
        props = http_get(url, "/props")
    except (urllib.error.URLError, OSError) as e:
        raise RidgefillError(f"cannot reach a server at {url}: {e}") from None
    rf = props.get("ridgefill") or {}
    if rf.get("split_layer", -1) < 0:
        raise RidgefillError(f"the server at {url} has no RidgeFill maps (start ridgefill-server with --ridgefill)")
    return props, rf, (props.get("default_generation_settings") or {}).get("n_ctx")


def run_server(url: str, lengths: list[int], tail: int | None, repeats: int, model: str | None = None,
               progress=print) -> dict:
    """The same measurement through a running ridgefill-server: /completion with n_predict 1, the request's
    wall time as TTFT, `"ridgefill": false` and `{"tail_tokens": tail, "guard": false}` interleaved, prompt cache
    off (the fill without the out-of-distribution guard, as in `run`)."""
    from .server import http_post
    props, rf, n_ctx = _server_ridgefill(url)
    tail = tail or rf["tail_tokens"]
    model = model or props.get("model_path")
    shape = Shape.of(model) if model and Path(model).is_file() else None
    n_ctx = n_ctx or max(lengths)
    if max(lengths) >= n_ctx:
        raise RidgefillError(f"length {max(lengths)} does not fit the server's context ({n_ctx}; start it with -c)")
    text = data.text("shakespeare")[: max(lengths) * 8]
    tokens = http_post(url, "/tokenize", {"content": text, "add_special": True})["tokens"]
    rows = []
    http_post(url, "/completion", {"prompt": tokens[:32], "n_predict": 1, "cache_prompt": False})  # warm-up
    for n in lengths:
        if tail + rf["sink_tokens"] >= n:
            raise RidgefillError(f"tail {tail} is not shorter than the prompt ({n} tokens)")
        def once(mode: bool) -> tuple[float, int]:
            t0 = time.perf_counter()
            res = http_post(url, "/completion", {"prompt": tokens[:n], "n_predict": 1, "cache_prompt": False,
                                                 "temperature": 0.0,
                                                 "ridgefill": {"tail_tokens": tail, "guard": False} if mode else False})
            return time.perf_counter() - t0, res["timings"].get("ridgefill_filled_n", 0)
        limit = (flops(shape, n) / flops(shape, n, rf["split_layer"], tail, rf["sink_tokens"], rf.get("map_kind") or "input",
                                         max(0, rf.get("context_tokens", 0)), max(0, rf.get("band_layers", 0)),
                                         max(0, rf.get("band_window", 0)), len(rf.get("band_full_layers") or []))
                 if shape else float("nan"))
        rows.append(interleaved(n, repeats, limit, once))
        progress(format_row(rows[-1]))
    return {"model": str(model), "server": url, "maps": rf.get("maps"), "split_layer": rf["split_layer"],
            "band_layers": rf.get("band_layers", 0), "band_window": rf.get("band_window", 0),
            "band_full_layers": rf.get("band_full_layers") or [], "tail_tokens": tail,
            "sink_tokens": rf["sink_tokens"], "repeats": repeats, "threads": None,
            "maps_bytes": rf.get("maps_bytes", 0), "rows": [asdict(r) for r in rows]}


HEADER = (f"{'length':>7s} {'exact s':>8s} {'rf s':>8s} {'speedup':>8s} {'(min-max)':>13s} "
          f"{'exact t/s':>9s} {'rf t/s':>8s} {'limit':>6s} {'of limit':>8s}")


def format_row(r: Row) -> str:
    return (f"{r.length:7d} {r.exact_s:8.2f} {r.ridgefill_s:8.2f} {r.ratio:7.2f}x {r.ratio_min:5.2f}-{r.ratio_max:<5.2f}"
            f"   {r.exact_tok_s:9.0f} {r.ridgefill_tok_s:8.0f} {r.limit:5.2f}x {100 * r.of_limit:7.0f}%")


def save(result: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=1) + "\n")


def markdown(result: dict) -> str:
    """A result of `run`, `run_server`, `run_chat` or `run_guard` as a Markdown table."""
    if "turns" in result:
        return chat_markdown(result)
    if "domain" in result:
        return _table(f"`{Path(result['model']).name}`, split layer {result['split_layer']}, tail "
                      f"{result['tail_tokens']}, {result['domain']} prompts, {result['repeats']} rotated repeats",
                      ["prompt", "exact s", "RidgeFill s", "RidgeFill+guard s", "speedup", "with guard",
                       "speedup kept", "guard time", "verdict (checks, max score)"],
                      [[r["length"], f"{r['exact_s']:.2f}", f"{r['ridgefill_s']:.2f}", f"{r['guard_s']:.2f}",
                        f"{r['ratio']:.2f}×", f"{r['guard_ratio']:.2f}×", f"{100 * r['kept']:.0f}%",
                        f"+{100 * r['guard_cost']:.1f}%", f"{r['verdict']} ({r['checks']}, {r['max_score']:.2f})"]
                       for r in result["rows"]])
    return _table(f"`{Path(result['model']).name}`, split layer {result['split_layer']}, tail {result['tail_tokens']}, "
                  f"sink {result['sink_tokens']}, {result['repeats']} interleaved repeats, threads "
                  f"{result['threads'] or 'all'}, maps {result['maps_bytes'] / 2**20:.1f} MiB",
                  ["prompt", "exact TTFT s", "RidgeFill TTFT s", "speedup (min–max)", "exact tok/s", "RidgeFill tok/s",
                   "FLOP limit", "of limit", "filled tokens"],
                  [[r["length"], f"{r['exact_s']:.2f}", f"{r['ridgefill_s']:.2f}",
                    f"{r['ratio']:.2f}× ({r['ratio_min']:.2f}–{r['ratio_max']:.2f})", f"{r['exact_tok_s']:.0f}",
                    f"{r['ridgefill_tok_s']:.0f}", f"{r['limit']:.2f}×", f"{100 * r['of_limit']:.0f}%", r["filled"]]
                   for r in result["rows"]]) + (compare_markdown(result) if "compare" in result else "")


def _fill_name(f: dict) -> str:
    band = ""
    if f["band_layers"]:
        full = f"; {','.join(map(str, f['band_full_layers']))} unwindowed" if f["band_full_layers"] else ""
        band = f", band {f['split_layer'] - f['band_layers']}–{f['split_layer'] - 1} W={f['band_window']}{full}"
    return f"`{Path(f['maps']).name}` (split {f['split_layer']}{band})"


def compare_markdown(result: dict) -> str:
    """`run` with compare maps: every fill against exact and against the first, same runs, rotated."""
    fills = [result, *result["compare"]]
    return "\n\n" + _table(
        f"Each fill against exact and against the first (`vs first`: the first fill's seconds over this one's, median "
        f"over the {result['repeats']} rotated repeats)",
        ["fill", "prompt", "TTFT s", "speedup (min–max)", "FLOP limit", "of limit", "vs first (min–max)"],
        [[_fill_name(f), r["length"], f"{r['ridgefill_s']:.2f}", f"{r['ratio']:.2f}× ({r['ratio_min']:.2f}–"
          f"{r['ratio_max']:.2f})", f"{r['limit']:.2f}×", f"{100 * r['of_limit']:.0f}%",
          f"{r['vs_first']:.3f}× ({r['vs_first_min']:.3f}–{r['vs_first_max']:.3f})"]
         for f in fills for r in f["rows"]])


def _table(caption: str, header: list[str], rows: list[list]) -> str:
    return "\n".join([caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(map(str, row)) + " |" for row in rows)])


def plot(result: dict, path: str | Path) -> None:
    """TTFT against prompt length for both modes; speedup against length with the analytic limit (`run_chat`:
    per turn)."""
    if "turns" in result:
        return plot_chat(result, path)
    rows = result["rows"]
    n = [r["length"] for r in rows]
    plt, fig, a, b = _ab_figure(rows, n, "prompt tokens", ("exact_s", "ridgefill_s"), "TTFT, s (median)",
                                ("exact", f"RidgeFill (split {result['split_layer']})"), "speedup (exact / RidgeFill)")
    b.plot(n, [r["limit"] for r in rows], "k--", label="FLOP limit")
    for f in result.get("compare", []):
        line = b.plot(n, [r["ratio"] for r in f["rows"]], "s-", label=f"split {f['split_layer']}"
                      + (f", band {f['band_layers']}" if f["band_layers"] else "") + f" ({Path(f['maps']).stem})")
        b.plot(n, [r["limit"] for r in f["rows"]], "--", color=line[0].get_color(), lw=0.8)
        a.plot(n, [r["ridgefill_s"] for r in f["rows"]], "s-", color=line[0].get_color())
    _save(plt, fig, f"{Path(result['model']).name}, tail {result['tail_tokens']}", path)


def _ab_figure(rows: list[dict], x: list, xlabel: str, keys: tuple[str, str], ylabel: str, labels: tuple[str, str],
               ratio_ylabel: str):
    """Two panels against x: both modes' `keys` of the rows, and the ratio exact/RidgeFill (median, min–max)."""
    from .plots import pyplot
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    for key, label in zip(keys, labels):
        a.plot(x, [r[key] for r in rows], "o-", label=label)
    b.errorbar(x, [r["ratio"] for r in rows], yerr=[[r["ratio"] - r["ratio_min"] for r in rows],
                                                   [r["ratio_max"] - r["ratio"] for r in rows]],
               fmt="o-", capsize=3, label="measured (min–max)")
    b.axhline(1.0, color="grey", lw=0.5)
    for ax, label in ((a, ylabel), (b, ratio_ylabel)):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
    return plt, fig, a, b


def _save(plt, fig, title: str, path: str | Path) -> None:
    for ax in fig.axes:
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- chat: a conversation through the server's prompt cache -------------------------------------------

@dataclass
class Turn:
    """One request of a simulated conversation, as the server timed it."""
    tokens: int        # the whole prompt (BOS included), by /tokenize
    prompt_ms: float   # timings.prompt_ms: prefill of what the cache did not hold, the TTFT measure
    wall_ms: float     # the whole request: prefill, n_predict tokens, HTTP
    prompt_n: int      # tokens processed
    cache_n: int       # tokens reused from the slot's cache
    filled_n: int      # of prompt_n, filled approximately


@dataclass
class ChatRow:
    turn: int
    tokens: int
    exact_ms: float
    ridgefill_ms: float
    ratio: float
    ratio_min: float
    ratio_max: float
    exact_wall_ms: float
    ridgefill_wall_ms: float
    exact_prompt_n: int
    ridgefill_prompt_n: int
    exact_cache_n: int
    ridgefill_cache_n: int
    filled_n: int


def prose_pieces(url: str, count: int, tokens: int) -> list[str]:
    """`count` consecutive pieces of Shakespeare of `tokens` tokens each, as text, cut by the server's tokenizer."""
    from .server import http_post
    text = data.text("shakespeare")[: count * tokens * 8]
    toks = http_post(url, "/tokenize", {"content": text, "add_special": False})["tokens"]
    if len(toks) < count * tokens:
        raise RidgefillError(f"not enough text for {count} pieces of {tokens} tokens")
    return [http_post(url, "/detokenize", {"tokens": toks[i * tokens:(i + 1) * tokens]})["content"]
            for i in range(count)]


def conversation(url: str, pieces: list[str], body: dict, n_predict: int = 16) -> list[Turn]:
    """One fresh conversation through /completion with the prompt cache: turn t's prompt is turn t-1's prompt, its
    answer and pieces[t]. A unique first line keeps it from sharing a prefix with any other conversation."""
    from .server import http_post
    prompt, turns = f"{uuid.uuid4().hex} conversation\n\n", []
    for piece in pieces:
        prompt += piece
        n = len(http_post(url, "/tokenize", {"content": prompt, "add_special": True})["tokens"])
        t0 = time.perf_counter()
        res = http_post(url, "/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0,
                                             "cache_prompt": True, **body})
        wall, t = time.perf_counter() - t0, res["timings"]
        turns.append(Turn(n, t["prompt_ms"], 1e3 * wall, t["prompt_n"], t["cache_n"], t.get("ridgefill_filled_n", 0)))
        prompt += res["content"] + "\n\n"
    return turns


def chat_row(i: int, exact: list[Turn], rf: list[Turn]) -> ChatRow:
    """Turn i (from 0) over the repeats: medians, and the ratio exact/RidgeFill of prompt_ms per repeat."""
    ratios = [e.prompt_ms / r.prompt_ms for e, r in zip(exact, rf)]
    med = lambda turns, key: statistics.median(getattr(t, key) for t in turns)  # noqa: E731
    count = lambda turns, key: statistics.median_low(getattr(t, key) for t in turns)  # noqa: E731
    return ChatRow(i + 1, count(exact, "tokens"), med(exact, "prompt_ms"), med(rf, "prompt_ms"),
                   statistics.median(ratios), min(ratios), max(ratios), med(exact, "wall_ms"), med(rf, "wall_ms"),
                   count(exact, "prompt_n"), count(rf, "prompt_n"), count(exact, "cache_n"), count(rf, "cache_n"),
                   count(rf, "filled_n"))


def run_chat(url: str, turns: int, turn_tokens: int, tail: int | None, repeats: int, n_predict: int = 16,
             progress=print) -> dict:
    """A `turns`-turn conversation with the prompt cache on, exact (`"ridgefill": false`) and RidgeFill
    (`true`, or `{"tail_tokens": tail}`), each repeat a fresh conversation per mode, interleaved like `run`.
    TTFT is the server's timings.prompt_ms; the ratio exact/RidgeFill is taken per turn and repeat."""
    from .server import http_post
    props, rf, n_ctx = _server_ridgefill(url)
    need = turns * (turn_tokens + n_predict + 4) + 16
    if n_ctx and need >= n_ctx:
        raise RidgefillError(f"{turns} turns of {turn_tokens} tokens (~{need}) do not fit the server's context "
                             f"({n_ctx}; start it with -c)")
    pieces = prose_pieces(url, turns, turn_tokens)
    bodies = {False: {"ridgefill": False},
              True: {"ridgefill": {"tail_tokens": tail, "guard": False} if tail else {"guard": False}}}
    http_post(url, "/completion", {"prompt": pieces[0][:200], "n_predict": 1, "cache_prompt": False})  # warm-up

    def once(mode: bool) -> list[Turn]:
        conv = conversation(url, pieces, bodies[mode], n_predict)
        progress(f"  {'RidgeFill' if mode else 'exact':9s} TTFT per turn, ms: "
                 + " ".join(f"{t.prompt_ms:.0f}" for t in conv))
        return conv

    runs = alternate(repeats, once)
    rows = [chat_row(i, [c[i] for c in runs[False]], [c[i] for c in runs[True]]) for i in range(turns)]
    return {"model": props.get("model_path"), "server": url, "maps": rf.get("maps"), "split_layer": rf["split_layer"],
            "tail_tokens": tail or rf["tail_tokens"], "sink_tokens": rf["sink_tokens"], "repeats": repeats,
            "turns": turns, "turn_tokens": turn_tokens, "n_predict": n_predict, "maps_bytes": rf.get("maps_bytes", 0),
            "rows": [asdict(r) for r in rows],
            "runs": {name: [[asdict(t) for t in conv] for conv in runs[mode]]
                     for name, mode in (("exact", False), ("ridgefill", True))}}


CHAT_HEADER = (f"{'turn':>4s} {'tokens':>6s} {'exact ms':>9s} {'rf ms':>8s} {'ratio':>6s} {'(min-max)':>11s} "
               f"{'cache_n exact':>13s} {'cache_n rf':>10s} {'filled_n':>8s}")
LATER_TURNS_TARGET = 0.95


def format_chat_row(r: ChatRow) -> str:
    return (f"{r.turn:4d} {r.tokens:6d} {r.exact_ms:9.0f} {r.ridgefill_ms:8.0f} {r.ratio:5.2f}x "
            f"{r.ratio_min:5.2f}-{r.ratio_max:<5.2f} {r.exact_cache_n:13d} {r.ridgefill_cache_n:10d} {r.filled_n:8d}")


def chat_targets(result: dict) -> list[str]:
    """Turn 1 against exact (the usual speedup); every later turn's ratio against LATER_TURNS_TARGET."""
    rows = result["rows"]
    lines = [f"turn 1: {rows[0]['ratio']:.2f}x exact/RidgeFill on {rows[0]['tokens']} tokens (the usual speedup)"]
    if len(rows) > 1:
        low = [f"turn {r['turn']} {r['ratio']:.2f}x" for r in rows[1:] if r["ratio"] < LATER_TURNS_TARGET]
        lines.append(f"later turns, ratio >= {LATER_TURNS_TARGET}: " + (f"NOT met ({', '.join(low)})" if low else "met"))
    return lines


def chat_markdown(result: dict) -> str:
    return _table(f"`{Path(result['model'] or '?').name}` through the server, split layer {result['split_layer']}, "
                  f"tail {result['tail_tokens']}, {result['turns']} turns of {result['turn_tokens']} new tokens, "
                  f"n_predict {result['n_predict']}, {result['repeats']} interleaved repeats",
                  ["turn", "prompt tokens", "exact TTFT ms", "RidgeFill TTFT ms", "exact/RidgeFill (min–max)",
                   "cache_n exact", "cache_n RidgeFill", "filled"],
                  [[r["turn"], r["tokens"], f"{r['exact_ms']:.0f}", f"{r['ridgefill_ms']:.0f}",
                    f"{r['ratio']:.2f}× ({r['ratio_min']:.2f}–{r['ratio_max']:.2f})", r["exact_cache_n"],
                    r["ridgefill_cache_n"], r["filled_n"]] for r in result["rows"]])


def plot_chat(result: dict, path: str | Path) -> None:
    """TTFT per turn for both modes; the ratio per turn with the later turns' target."""
    rows = result["rows"]
    t = [r["turn"] for r in rows]
    plt, fig, a, b = _ab_figure(rows, t, "turn", ("exact_ms", "ridgefill_ms"), "TTFT (prompt_ms), ms (median)",
                                ("exact, prompt cache", f"RidgeFill (split {result['split_layer']}), prompt cache"),
                                "exact / RidgeFill TTFT")
    b.axhline(LATER_TURNS_TARGET, color="k", ls="--", lw=0.8, label=f"later-turn target {LATER_TURNS_TARGET}")
    for ax in (a, b):
        ax.set_xticks(t)
    _save(plt, fig, f"{Path(result['model'] or '?').name}, {result['turn_tokens']} new tokens a turn, "
                    f"tail {result['tail_tokens']}", path)
