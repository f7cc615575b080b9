"""Quality of RidgeFill prefill against exact prefill of the same prompts (`ridgefill eval`).

Tasks (each on every domain: corpora from ridgefill.data and/or the user's --text files):
  kl       KL(exact ‖ RidgeFill) and top-1 agreement of the next-token distributions over the tail tokens.
  longdep  NLL of the tail tokens, all of them and the *key* tokens: those whose NLL with the full prompt is
           lower by more than `key_gap` nats than with the tail alone (they depend on distant context).
  needle   a pass key placed at depths inside the filled region (never in the tail), question at the end,
           greedy answer checked; accuracy per length × depth for each mode.
  splice   kl and longdep for the runtime's splice modes (exact K, exact V, both, exact key scale): how much of
           the gap each error source accounts for.  With `needle` also requested, needle runs for them too.
  guard    only the out-of-distribution guard's verdict and score per prompt (one RidgeFill prefill each, no exact
           runs): how often the guard would fall back on a domain, cheaply enough for large samples.
Prompts never come from the text the maps were fitted on: for the corpus named in the map file's calib_source,
the documents calibration read are skipped (`held_out`).
Means carry 95% cluster-bootstrap intervals that resample prompts (the tail tokens of a prompt share one
filled cache), accuracies Wilson intervals.
"""
from __future__ import annotations

import json
import os
import random
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import data
from .errors import RidgefillError
from .stats import bootstrap_mean, fmt_ci, wilson

TASKS = ("kl", "longdep", "needle", "splice", "guard")
SPLICE_MODES = ("k", "v", "kscale", "kv")
NEEDLE = "\n\nIMPORTANT: the pass key is {key}.\n\n"
QUESTION = "\n\nQuestion: what is the pass key?\nAnswer: the pass key is"


@dataclass
class EvalConfig:
    model: str
    maps: str | None = None
    tasks: list[str] = field(default_factory=lambda: ["kl", "longdep"])
    lengths: list[int] = field(default_factory=lambda: [2048])
    tail_tokens: int = 256
    sink_tokens: int = 4
    prompts: int = 4                       # prompts per length and domain (kl, longdep, splice, guard)
    skip_tokens: int = 0                   # prompts start this many tokens into each (held-out) text
    domains: list[str] = field(default_factory=lambda: ["brown", "shakespeare"])
    texts: list[str] = field(default_factory=list)
    depths: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])
    needle_trials: int = 4                 # pass keys per length × depth cell
    key_gap: float = 1.0
    compare: list[str] = field(default_factory=list)  # other map files of the model, each a mode "maps:<name>"
    guard: bool = False                    # add the mode "guard": RidgeFill with the out-of-distribution guard
    guard_period: int | None = None        # positions between the guard's checks (None: the runtime's 1024)
    band_layers: int | None = None         # the windowed band (None: the maps' own; 0: none)
    band_window: int | None = None
    band_full_layers: list[int] | None = None  # band layers that attend to every position (None: the maps' own)
    threads: int | None = None
    seed: int = 0


@contextmanager
def _quality_only():
    """eval measures quality only: that a band without flash attention saves no time does not concern it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "a band of .* saves nothing", RuntimeWarning)
        yield


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


class Evaluator:
    """One model, one context; runs a prompt in a mode: "exact", "ridgefill" (without the guard), "guard"
    (RidgeFill with the out-of-distribution guard), "splice-<m>" or "maps:<name>"."""

    def __init__(self, cfg: EvalConfig):
        from .modelfile import check_gguf
        from .runtime import Llama
        check_gguf(cfg.model)
        bad = [t for t in cfg.tasks if t not in TASKS]
        if bad or not cfg.tasks:
            raise RidgefillError(f"unknown task {', '.join(bad) or '(none)'}; tasks: {', '.join(TASKS)}")
        if not (isinstance(cfg.skip_tokens, int) and cfg.skip_tokens >= 0):
            raise RidgefillError(f"--skip-tokens must be a whole number >= 0, not {cfg.skip_tokens!r}")
        n_ctx = max(cfg.lengths) + 16
        # splice attributes cleanly only when the filled region is one ubatch (cpp/ridgefill.h)
        n_ubatch = n_ctx if "splice" in cfg.tasks else 512
        self.cfg = cfg
        threads = cfg.threads or os.cpu_count() or 1
        with _quality_only():
            self.llm = Llama(str(cfg.model), maps_path=cfg.maps, tail_tokens=cfg.tail_tokens,
                             sink_tokens=cfg.sink_tokens, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ubatch,
                             n_threads=threads, n_threads_batch=threads, verbose=False, guard=False,
                             guard_period=cfg.guard_period, band_layers=cfg.band_layers,
                             band_window=cfg.band_window, band_full_layers=cfg.band_full_layers)
        n_train = self.llm._model.n_ctx_train()
        for n in cfg.lengths:
            if n > n_train:
                raise RidgefillError(f"length {n} is beyond the model's context ({n_train})")
            if cfg.tail_tokens + cfg.sink_tokens >= n:
                raise RidgefillError(f"--tail-tokens {cfg.tail_tokens} + sink {cfg.sink_tokens} leaves no filled "
                                     f"region in a {n}-token prompt")
        self.bos = [self.llm.token_bos()] if self.llm.token_bos() >= 0 else []
        self.maps = self.llm.maps_path
        self.compare = {}                     # mode "maps:<name>" -> map file
        for path in cfg.compare:
            check_gguf(path)
            name = f"maps:{Path(path).stem}"
            if name in self.compare:
                raise RidgefillError(f"--compare-maps: two files named {Path(path).stem}")
            self.compare[name] = str(path)

    def set_mode(self, mode: str) -> None:
        maps = self.compare.get(mode, self.maps)
        if mode != "exact" and maps != self.llm.maps_path:
            with _quality_only():
                self.llm.load_maps(maps)
        self.llm.set_splice(mode.removeprefix("splice-") if mode.startswith("splice-") else None)
        self.llm.set_ridgefill(mode != "exact")
        self.llm.set_guard(mode == "guard")

    def tail_logits(self, toks: list[int], mode: str) -> np.ndarray:
        self.set_mode(mode)
        return self.llm.prompt_logits(toks, len(toks) - self.cfg.tail_tokens)

    def answer(self, toks: list[int], mode: str, n: int = 8) -> str:
        """Greedy continuation of the prompt (decode steps are exact in every mode)."""
        from llama_cpp import llama_cpp as C
        self.set_mode(mode)
        logits = self.llm.prompt_logits(toks, len(toks) - 1)[-1]
        out = []
        for _ in range(n):
            t = int(logits.argmax())
            if C.llama_vocab_is_eog(self.llm._model.vocab, t):
                break
            out.append(t)
            self.llm.eval([t])
            logits = np.ctypeslib.as_array(C.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.llm.n_vocab(),))
        return self.llm.detokenize(out).decode("utf-8", errors="ignore")

    def tokens(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=False, special=False)


def calibration_reading(maps_path: str) -> tuple[str, int, str] | None:
    """(corpus, text tokens, reading order) that `ridgefill calibrate` read for a map file calibrated on a corpus,
    else None.

    Calibration reads the corpus's documents in its reading order (map files older than the key: sequential) into
    chunks of calib_ctx tokens (BOS + text), fits on calib_tokens rows and holds out val_tokens rows, each chunk
    without its sink_tokens first rows."""
    from .ggufio import read_maps
    m = read_maps(maps_path)
    src, ctx, val = m.extra.get("calib_source", ""), m.extra.get("calib_ctx"), m.extra.get("val_tokens")
    if not str(src).startswith("corpus:") or ctx is None or val is None:
        return None
    rows_per_chunk = int(ctx) - m.sink_tokens
    n_chunks = -(-(m.calib_tokens + int(val)) // rows_per_chunk)
    order = str(m.extra.get("calib_read_order", "sequential"))
    return str(src)[len("corpus:"):], n_chunks * int(ctx), order     # BOS included: never too few


def held_out(ev: "Evaluator", name: str, progress=lambda s: None) -> str:
    """The text of corpus `name` without the documents any of the evaluated map files was calibrated on."""
    from .calibrate import read_documents
    readings = [r for r in map(calibration_reading, [ev.maps, *ev.compare.values()]) if r and r[0] == name]
    if not readings:
        return data.text(name)
    docs = [d.text for d in data.corpus(name)]
    seen: set[int] = set()
    for _, need, order in readings:
        seen.update(read_documents(docs, ev.tokens, need, order)[1])
    if len(seen) >= len(docs):
        raise RidgefillError(f"{name}: the maps were calibrated on all of it; evaluate on another domain")
    progress(f"{name}: skipping {len(seen)} of its {len(docs)} documents, which the maps were calibrated on")
    return "\n\n".join(t for i, t in enumerate(docs) if i not in seen)


def domains(cfg: EvalConfig, ev: "Evaluator", progress=lambda s: None) -> dict[str, str]:
    out = {name: held_out(ev, name, progress) for name in cfg.domains}
    for f in cfg.texts:
        p = Path(f)
        if not p.is_file():
            raise RidgefillError(f"--text {f}: no such file")
        out[f"file:{p.name}"] = p.read_text(encoding="utf-8", errors="replace")
    if not out:
        raise RidgefillError("no text to evaluate on (give --domains and/or --text FILE)")
    return out


def windows(ev: Evaluator, text: str, length: int, count: int, name: str) -> list[list[int]]:
    """`count` prompts of `length` tokens (BOS first), evenly spaced through the text after its first
    cfg.skip_tokens tokens."""
    skip = ev.cfg.skip_tokens
    need = skip + count * (length - len(ev.bos))
    toks = ev.tokens(text[: need * 8])[skip:]
    if len(toks) < length - len(ev.bos):
        raise RidgefillError(f"{name}: the text has {len(toks)} tokens, fewer than one {length}-token prompt")
    step = max(1, (len(toks) - (length - len(ev.bos))) // max(1, count - 1)) if count > 1 else 0
    starts = sorted({min(i * step, len(toks) - (length - len(ev.bos))) for i in range(count)})
    return [ev.bos + toks[s:s + length - len(ev.bos)] for s in starts]


# ---- kl, longdep and splice: metrics of tail logits ---------------------------------------------------

def _tail_metrics(ev: Evaluator, prompts: list[list[int]], modes: list[str]) -> dict:
    """Per-token arrays over all prompts: exact NLL, tail-only NLL, and per mode KL, top-1 agreement, NLL."""
    T = ev.cfg.tail_tokens
    acc = {"group": [], "nll_exact": [], "nll_tail_only": [], "modes": {m: {"kl": [], "top1": [], "nll": []} for m in modes},
           "guard": []}
    for i, toks in enumerate(prompts):
        n = len(toks)
        targets = np.asarray(toks[n - T + 1:])                       # predicted by tail rows 0..T-2
        ex = _log_softmax(ev.tail_logits(toks, "exact"))[:-1]
        nll_ex = -ex[np.arange(T - 1), targets]
        # the tail without its context: row k again predicts targets[k]
        alone = _log_softmax(ev.tail_logits(ev.bos + toks[n - T:], "exact"))[:-1]
        nll_alone = -alone[np.arange(T - 1), targets]
        acc["group"].append(np.full(T - 1, i))  # the sampling unit: the prompt
        acc["nll_exact"].append(nll_ex)
        acc["nll_tail_only"].append(nll_alone)
        p = np.exp(ex)
        for m in modes:
            lp = _log_softmax(ev.tail_logits(toks, m))[:-1]
            if m == "guard":
                acc["guard"].append(_guard_verdict(ev))
            acc["modes"][m]["kl"].append((p * (ex - lp)).sum(-1))
            acc["modes"][m]["top1"].append((lp.argmax(-1) == ex.argmax(-1)).astype(np.float64))
            acc["modes"][m]["nll"].append(-lp[np.arange(T - 1), targets])
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0)  # noqa: E731
    out = {k: cat(acc[k]) for k in ("group", "nll_exact", "nll_tail_only")}
    out["modes"] = {m: {k: cat(v) for k, v in d.items()} for m, d in acc["modes"].items()}
    out["guard"] = acc["guard"]
    return out


def _summarize(arr: dict, key_gap: float, seed: int) -> dict:
    g = arr["group"]
    key = (arr["nll_tail_only"] - arr["nll_exact"]) > key_gap
    res = {"tokens": int(len(g)), "key_tokens": int(key.sum()),
           "nll_exact": bootstrap_mean(arr["nll_exact"], g, seed=seed),
           "nll_exact_key": bootstrap_mean(arr["nll_exact"][key], g[key], seed=seed), "modes": {}}
    _, gi = np.unique(g, return_inverse=True)
    per_prompt = lambda v: (np.bincount(gi, weights=v) / np.bincount(gi)).tolist()  # noqa: E731
    for m, d in arr["modes"].items():
        res["modes"][m] = {
            "kl": bootstrap_mean(d["kl"], g, seed=seed),
            "kl_prompts": per_prompt(d["kl"]),              # each prompt's mean over its tail, in prompt order
            "top1": bootstrap_mean(d["top1"], g, seed=seed),
            "nll": bootstrap_mean(d["nll"], g, seed=seed),
            "nll_diff": bootstrap_mean(d["nll"] - arr["nll_exact"], g, seed=seed),
            "nll_key": bootstrap_mean(d["nll"][key], g[key], seed=seed),
            "nll_key_diff": bootstrap_mean((d["nll"] - arr["nll_exact"])[key], g[key], seed=seed),
        }
    if arr.get("guard"):
        res["guard"] = _guard_summary(arr["guard"])
    return res


# ---- guard: verdicts only -----------------------------------------------------------------------------

def _guard_verdict(ev: Evaluator) -> dict:
    """The guard's verdict on the prompt just run in mode "guard"."""
    g = ev.llm.guard_result()
    filled, _ = ev.llm.ridgefill_counts()
    return {"verdict": g["guard"], "max_score": g["max_score"], "checks": g["checks"], "filled": filled,
            "fell_back_at": g["fell_back_at"], "threshold": g["threshold"]}


def _guard_summary(per: list[dict]) -> dict:
    fell = sum(p["verdict"] == "fell_back" for p in per)
    return {"prompts": per, "fell_back": wilson(fell, len(per)), "fell_back_n": fell,
            "max_scores": [p["max_score"] for p in per], "threshold": per[-1]["threshold"]}


def run_guard(ev: Evaluator, prompts: list[list[int]]) -> dict:
    """The guard's verdict and largest check score on each prompt (RidgeFill prefill with the guard, nothing else)."""
    per = []
    for toks in prompts:
        ev.tail_logits(toks, "guard")
        per.append(_guard_verdict(ev))
        if per[-1]["verdict"] == "off":
            raise RidgefillError(f"{ev.maps} has no guard data (no ridgefill.guard.* keys): recalibrate it with "
                                 "this version of `ridgefill calibrate` to evaluate the guard")
    return _guard_summary(per)


# ---- needle -----------------------------------------------------------------------------------------

def needle_prompt(ev: Evaluator, hay: list[int], length: int, depth: float, key: str) -> tuple[list[int], int]:
    """A `length`-token prompt: haystack with the needle starting at `depth` of the filled region, question last.

    Returns the tokens and the needle's first position."""
    cfg = ev.cfg
    nd, q = ev.tokens(NEEDLE.format(key=key)), ev.tokens(QUESTION)
    n_hay = length - len(ev.bos) - len(nd) - len(q)
    lo, hi = cfg.sink_tokens, length - cfg.tail_tokens - len(nd)       # needle wholly inside the filled region
    if hi <= lo or len(hay) < n_hay:
        raise RidgefillError(f"a {length}-token needle prompt has no room for the needle before the tail")
    pos = lo + round(depth * (hi - lo))
    at = pos - len(ev.bos)
    toks = ev.bos + hay[:at] + nd + hay[at:n_hay] + q
    assert len(toks) == length
    return toks, pos


def run_needle(ev: Evaluator, text: str, modes: list[str], progress) -> dict:
    cfg = ev.cfg
    rng = random.Random(cfg.seed)
    hay_all = ev.tokens(text[: (max(cfg.lengths) + 2000 * cfg.needle_trials) * 8])
    cells, per_trial = [], {m: [] for m in modes}
    for length in cfg.lengths:
        for depth in cfg.depths:
            hits = {m: 0 for m in modes}
            for t in range(cfg.needle_trials):
                key = str(rng.randrange(10000, 100000))
                off = rng.randrange(0, max(1, len(hay_all) - length))
                toks, pos = needle_prompt(ev, hay_all[off:], length, depth, key)
                for m in modes:
                    ok = key in ev.answer(toks, m).split("\n")[0]
                    hits[m] += ok
                    per_trial[m].append(float(ok))
            cells.append({"length": length, "depth": depth, "trials": cfg.needle_trials, "hits": hits})
            progress(f"  needle {length:6d} tokens, depth {depth:.2f}: " +
                     ", ".join(f"{m} {hits[m]}/{cfg.needle_trials}" for m in modes))
    total = {m: (sum(c["hits"][m] for c in cells), sum(c["trials"] for c in cells)) for m in modes}
    ex = np.asarray(per_trial["exact"])
    diff = {m: bootstrap_mean(np.asarray(per_trial[m]) - ex, np.arange(len(ex)), seed=cfg.seed)
            for m in modes if m != "exact"}  # paired: the same prompts
    return {"cells": cells, "accuracy": {m: wilson(*total[m]) for m in modes}, "diff_from_exact": diff}


# ---- the whole evaluation ---------------------------------------------------------------------------------

def run(cfg: EvalConfig, progress=print) -> dict:
    ev = Evaluator(cfg)
    modes = (["ridgefill"] + (["guard"] if cfg.guard else []) +
             ([f"splice-{m}" for m in SPLICE_MODES] if "splice" in cfg.tasks else []) + list(ev.compare))
    result = {"config": asdict(cfg), "model": str(cfg.model), "maps": ev.llm.maps_path,
              "split_layer": ev.llm.split_layer, "band": list(ev.llm.band),
              "band_full_layers": list(ev.llm.band_full_layers), "domains": {}}
    for name, text in domains(cfg, ev, progress).items():
        dom = result["domains"][name] = {}
        if "guard" in cfg.tasks:
            for length in cfg.lengths:
                progress(f"{name}: guard verdicts on {cfg.prompts} prompts of {length} tokens")
                dom[f"guard@{length}"] = run_guard(ev, windows(ev, text, length, cfg.prompts, name))
        if {"kl", "longdep", "splice"} & set(cfg.tasks):
            for length in cfg.lengths:
                progress(f"{name}: {cfg.prompts} prompts of {length} tokens, modes exact, {', '.join(modes)}")
                arr = _tail_metrics(ev, windows(ev, text, length, cfg.prompts, name), modes)
                dom[f"tail@{length}"] = _summarize(arr, cfg.key_gap, cfg.seed)
        if "needle" in cfg.tasks:
            progress(f"{name}: needle, lengths {cfg.lengths}, depths {cfg.depths}, {cfg.needle_trials} keys per cell")
            dom["needle"] = run_needle(ev, text, ["exact"] + modes, progress)
    return result


def report(result: dict) -> str:
    """The result as plain-text tables (also Markdown-compatible)."""
    cfg = result["config"]
    band = result.get("band") or [0, 0]
    out = [f"model {Path(result['model']).name}, split layer {result['split_layer']}"
           + (f" (band: layers {result['split_layer'] - band[0]}..{result['split_layer'] - 1}, window {band[1]}"
              + (f"; unwindowed {', '.join(map(str, result['band_full_layers']))}"
                 if result.get("band_full_layers") else "") + ")" if band[0] else "")
           + f", tail {cfg['tail_tokens']}, sink {cfg['sink_tokens']}; means with 95% bootstrap intervals, "
           f"accuracies with Wilson intervals", ""]
    for name, dom in result["domains"].items():
        for key, t in dom.items():
            if key.startswith("guard@"):
                sc = np.asarray(t["max_scores"])
                out += [f"### {name}, {key[6:]}-token prompts: guard (threshold {t['threshold']:.2f})", "",
                        f"fell back on {t['fell_back_n']}/{len(sc)} prompts ({fmt_ci(t['fell_back'], 2)}); largest "
                        f"check score per prompt: median {np.median(sc):.2f}, range {sc.min():.2f}–{sc.max():.2f}", ""]
            if not key.startswith("tail@"):
                continue
            out += [f"### {name}, {key[5:]}-token prompts ({t['tokens']} tail tokens, {t['key_tokens']} key tokens)", "",
                    "| mode | KL(exact‖mode) nats | top-1 agree | NLL tail (exact "
                    f"{t['nll_exact'][0]:.3f}) Δ | NLL key tokens (exact {t['nll_exact_key'][0]:.3f}) Δ |",
                    "|---|---|---|---|---|"]
            for m, r in t["modes"].items():
                out.append(f"| {m} | {fmt_ci(r['kl'], 4)} | {fmt_ci(r['top1'], 3)} | {fmt_ci(r['nll_diff'], 3)} "
                           f"| {fmt_ci(r['nll_key_diff'], 3)} |")
            if "guard" in t:
                gd = t["guard"]
                out += ["", f"guard: fell back on {gd['fell_back_n']}/{len(gd['prompts'])} prompts "
                        f"({fmt_ci(gd['fell_back'], 2)}); largest check score per prompt: "
                        + ", ".join(f"{x:.2f}" for x in gd["max_scores"])]
            others = [m for m in t["modes"] if m not in ("ridgefill", "guard")]
            if others:
                base = t["modes"]["ridgefill"]["kl"][0]
                out += ["", "gap closed (KL): " + ", ".join(
                    f"{m.removeprefix('splice-')} {100 * (1 - t['modes'][m]['kl'][0] / base):.0f}%"
                    for m in others if base > 0)]
            out.append("")
        if "needle" in dom:
            nd = dom["needle"]
            modes = list(nd["accuracy"])
            out += [f"### {name}, needle", "", "| length | depth | " + " | ".join(modes) + " |",
                    "|---|---|" + "---|" * len(modes)]
            for c in nd["cells"]:
                out.append(f"| {c['length']} | {c['depth']:.2f} | " +
                           " | ".join(f"{c['hits'][m]}/{c['trials']}" for m in modes) + " |")
            out.append("| all | | " + " | ".join(fmt_ci(nd["accuracy"][m], 2) for m in modes) + " |")
            out.append("| Δ vs exact | | | " + " | ".join(fmt_ci(nd["diff_from_exact"][m], 2) for m in modes[1:]) + " |")
            out.append("")
    return "\n".join(out)


def save(result: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=1) + "\n")


def plot(result: dict, path: str | Path) -> None:
    """Needle heatmaps per mode side by side, and KL per domain and mode."""
    from .plots import pyplot
    plt = pyplot()
    needle = [(n, d["needle"]) for n, d in result["domains"].items() if "needle" in d]
    tails = [(n, k, t) for n, d in result["domains"].items() for k, t in d.items() if k.startswith("tail@")]
    n_rows = len(needle) + (1 if tails else 0)
    n_cols = max([len(nd["accuracy"]) for _, nd in needle] + [1])
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(3.2 * n_cols, 2.8 * n_rows), squeeze=False)
    for r, (name, nd) in enumerate(needle):
        lengths = sorted({c["length"] for c in nd["cells"]})
        depths = sorted({c["depth"] for c in nd["cells"]})
        for c_i, m in enumerate(nd["accuracy"]):
            grid = np.full((len(depths), len(lengths)), np.nan)
            for c in nd["cells"]:
                grid[depths.index(c["depth"]), lengths.index(c["length"])] = c["hits"][m] / c["trials"]
            ax = axes[r][c_i]
            ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
            ax.set_xticks(range(len(lengths)), [str(x) for x in lengths])
            ax.set_yticks(range(len(depths)), [f"{x:g}" for x in depths])
            ax.set_title(f"{name}: {m}", fontsize=9)
            ax.set_xlabel("prompt tokens")
            ax.set_ylabel("needle depth")
        for c_i in range(len(nd["accuracy"]), n_cols):
            axes[r][c_i].axis("off")
    if tails:
        ax = axes[-1][0]
        labels = [f"{n}\n{k[5:]}" for n, k, _ in tails]
        modes = list(tails[0][2]["modes"])
        w = 0.8 / len(modes)
        for j, m in enumerate(modes):
            ax.bar(np.arange(len(tails)) + j * w, [t["modes"][m]["kl"][0] for _, _, t in tails], w, label=m,
                   yerr=[[t["modes"][m]["kl"][0] - t["modes"][m]["kl"][1] for _, _, t in tails],
                         [t["modes"][m]["kl"][2] - t["modes"][m]["kl"][0] for _, _, t in tails]])
        ax.set_xticks(np.arange(len(tails)) + 0.4 - w / 2, labels, fontsize=7)
        ax.set_ylabel("tail KL(exact‖mode), nats")
        ax.legend(fontsize=7)
        for c_i in range(1, n_cols):
            axes[-1][c_i].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
