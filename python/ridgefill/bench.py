"""Time to first token, exact vs RidgeFill, measured side by side in one process.

For each prompt length the two modes run interleaved (A/B, then B/A, ...) on the same
prompt, so drifts of the machine hit both alike; the ratio is taken per repeat.  The
analytic limit is the ratio of prefill FLOPs (see `flops`), what a perfect
implementation would reach.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gguf import GGUFReader

from . import data
from .errors import RidgefillError
from .ggufio import field_value


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
        r = GGUFReader(model)
        a = field_value(r, "general.architecture")
        n_head = int(field_value(r, f"{a}.attention.head_count"))
        d = int(field_value(r, f"{a}.embedding_length"))
        hd = int(field_value(r, f"{a}.attention.key_length", d // n_head))
        vocab = len(r.get_field("tokenizer.ggml.tokens").data)
        return cls(int(field_value(r, f"{a}.block_count")), d, n_head,
                   int(field_value(r, f"{a}.attention.head_count_kv")), hd,
                   int(field_value(r, f"{a}.feed_forward_length")), vocab, int(field_value(r, f"{a}.context_length")))


def flops(s: Shape, n: int, split_layer: int | None = None, tail: int = 0, sink: int = 0) -> float:
    """Prefill FLOPs of an n-token prompt; with split_layer, tokens in [sink, n - tail) take the approximate path.

    Exact layer, per token at position p: Q/K/V/O projections, attention over p+1 keys, gated FFN.
    Approximate layer >= split: the map (d×d, none at the split layer itself) and K/V projections only.
    The output head runs for the last token only.
    """
    d_q, d_kv = s.n_head * s.head_dim, s.n_kv * s.head_dim
    proj = 2 * (s.d * d_q + 2 * s.d * d_kv + d_q * s.d + 3 * s.d * s.d_ff)
    attn_sum = lambda a, b: 2 * 2 * d_q * (b * (b + 1) - a * (a + 1)) / 2  # noqa: E731  Σ_{p=a}^{b-1} (p+1) keys
    n_approx = max(0, n - tail - sink) if split_layer is not None else 0
    total = 2 * s.d * s.n_vocab
    total += s.n_layer * (n * proj + attn_sum(0, n))
    if n_approx:
        late = s.n_layer - split_layer
        saved = late * (n_approx * proj + attn_sum(sink, sink + n_approx))
        cost = n_approx * (2 * 2 * s.d * d_kv * late + 2 * s.d * s.d * (late - 1))
        total += cost - saved
    return float(total)


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


def interleaved(n: int, repeats: int, limit: float, once) -> Row:
    """Time `once(ridgefill)` -> (seconds, filled tokens) exact/RidgeFill, then RidgeFill/exact, ...; one row."""
    times, filled = {False: [], True: []}, 0
    for r in range(repeats):
        for mode in ((False, True) if r % 2 == 0 else (True, False)):
            dt, f = once(mode)
            times[mode].append(dt)
            filled = f if mode else filled
    ratios = [e / f for e, f in zip(times[False], times[True])]
    ratio, t_exact, t_rf = statistics.median(ratios), statistics.median(times[False]), statistics.median(times[True])
    return Row(n, t_exact, t_rf, ratio, min(ratios), max(ratios), n / t_exact, n / t_rf, limit,
               (ratio - 1) / (limit - 1) if limit > 1 else float("nan"), filled)


def run(model: str, maps_path: str | None, lengths: list[int], tail: int, sink: int, repeats: int,
        threads: int | None, n_batch: int = 2048, n_ubatch: int = 512, progress=print) -> dict:
    from .runtime import Llama
    shape = Shape.of(model)
    if max(lengths) > shape.n_ctx_train:
        raise RidgefillError(f"length {max(lengths)} is beyond the model's context ({shape.n_ctx_train})")
    n_ctx = max(lengths)
    llm = Llama(str(model), maps_path=maps_path, tail_tokens=tail, sink_tokens=sink, n_ctx=n_ctx,
                n_batch=n_batch, n_ubatch=n_ubatch, n_threads=threads, n_threads_batch=threads, verbose=False)
    tokens = llm.tokenize(data.text("shakespeare")[: max(lengths) * 8].encode())
    if len(tokens) < max(lengths):
        raise RidgefillError("not enough text for the longest prompt")
    rows = []
    llm.set_ridgefill(False)
    llm.eval(tokens[:64])                                   # warm-up
    for n in lengths:
        if tail >= n:
            raise RidgefillError(f"--tail-tokens {tail} is not shorter than the prompt ({n} tokens)")
        def once(mode: bool) -> tuple[float, int]:
            llm.set_ridgefill(mode)
            t0 = time.perf_counter()
            llm.eval(tokens[:n])
            return time.perf_counter() - t0, llm.ridgefill_counts()[0]
        limit = flops(shape, n) / flops(shape, n, llm.split_layer, tail, sink)
        rows.append(interleaved(n, repeats, limit, once))
        progress(format_row(rows[-1]))
    return {"model": str(model), "maps": llm.maps_path, "split_layer": llm.split_layer, "tail_tokens": tail,
            "sink_tokens": sink, "repeats": repeats, "threads": threads, "n_batch": n_batch, "n_ubatch": n_ubatch,
            "maps_bytes": llm.maps_bytes, "rows": [asdict(r) for r in rows]}


def run_server(url: str, lengths: list[int], tail: int | None, repeats: int, model: str | None = None,
               progress=print) -> dict:
    """The same measurement through a running ridgefill-server: /completion with n_predict 1, the request's
    wall time as TTFT, `"ridgefill": false` and `{"tail_tokens": tail}` interleaved, prompt cache off."""
    import urllib.error

    from .server import http_get, http_post
    try:
        props = http_get(url, "/props")
    except (urllib.error.URLError, OSError) as e:
        raise RidgefillError(f"cannot reach a server at {url}: {e}") from None
    rf = props.get("ridgefill") or {}
    if rf.get("split_layer", -1) < 0:
        raise RidgefillError(f"the server at {url} has no RidgeFill maps (start ridgefill-server with --ridgefill)")
    tail = tail or rf["tail_tokens"]
    model = model or props.get("model_path")
    shape = Shape.of(model) if model and Path(model).is_file() else None
    n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx") or max(lengths)
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
                                                 "ridgefill": {"tail_tokens": tail} if mode else False})
            return time.perf_counter() - t0, res["timings"].get("ridgefill_filled_n", 0)
        limit = (flops(shape, n) / flops(shape, n, rf["split_layer"], tail, rf["sink_tokens"])) if shape else float("nan")
        rows.append(interleaved(n, repeats, limit, once))
        progress(format_row(rows[-1]))
    return {"model": str(model), "server": url, "maps": rf.get("maps"), "split_layer": rf["split_layer"],
            "tail_tokens": tail, "sink_tokens": rf["sink_tokens"], "repeats": repeats, "threads": None,
            "maps_bytes": rf.get("maps_bytes", 0), "rows": [asdict(r) for r in rows]}


HEADER = (f"{'length':>7s} {'exact s':>8s} {'rf s':>8s} {'speedup':>8s} {'(min-max)':>13s} "
          f"{'exact t/s':>9s} {'rf t/s':>8s} {'limit':>6s} {'of limit':>8s}")


def format_row(r: Row) -> str:
    return (f"{r.length:7d} {r.exact_s:8.2f} {r.ridgefill_s:8.2f} {r.ratio:7.2f}x {r.ratio_min:5.2f}-{r.ratio_max:<5.2f}"
            f"   {r.exact_tok_s:9.0f} {r.ridgefill_tok_s:8.0f} {r.limit:5.2f}x {100 * r.of_limit:7.0f}%")


def save(result: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=1) + "\n")


def markdown(result: dict) -> str:
    """A result of `run` as a Markdown table."""
    lines = [f"`{Path(result['model']).name}`, split layer {result['split_layer']}, tail {result['tail_tokens']}, "
             f"sink {result['sink_tokens']}, {result['repeats']} interleaved repeats, threads {result['threads'] or 'all'}, "
             f"maps {result['maps_bytes'] / 2**20:.1f} MiB", "",
             "| prompt | exact TTFT s | RidgeFill TTFT s | speedup (min–max) | exact tok/s | RidgeFill tok/s "
             "| FLOP limit | of limit | filled tokens |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['length']} | {r['exact_s']:.2f} | {r['ridgefill_s']:.2f} | {r['ratio']:.2f}× "
                     f"({r['ratio_min']:.2f}–{r['ratio_max']:.2f}) | {r['exact_tok_s']:.0f} | {r['ridgefill_tok_s']:.0f} "
                     f"| {r['limit']:.2f}× | {100 * r['of_limit']:.0f}% | {r['filled']} |")
    return "\n".join(lines)


def plot(result: dict, path: str | Path) -> None:
    """TTFT against prompt length for both modes; speedup against length with the analytic limit."""
    from .plots import pyplot
    plt = pyplot()
    rows = result["rows"]
    n = [r["length"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    a.plot(n, [r["exact_s"] for r in rows], "o-", label="exact")
    a.plot(n, [r["ridgefill_s"] for r in rows], "o-", label=f"RidgeFill (split {result['split_layer']})")
    a.set_xlabel("prompt tokens")
    a.set_ylabel("TTFT, s (median)")
    a.legend(fontsize=8)
    b.errorbar(n, [r["ratio"] for r in rows], yerr=[[r["ratio"] - r["ratio_min"] for r in rows],
                                                   [r["ratio_max"] - r["ratio"] for r in rows]],
               fmt="o-", capsize=3, label="measured (min–max)")
    b.plot(n, [r["limit"] for r in rows], "k--", label="FLOP limit")
    b.axhline(1.0, color="grey", lw=0.5)
    b.set_xlabel("prompt tokens")
    b.set_ylabel("speedup (exact / RidgeFill)")
    b.legend(fontsize=8)
    fig.suptitle(f"{Path(result['model']).name}, tail {result['tail_tokens']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
