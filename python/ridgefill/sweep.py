"""The speed–quality map (`ridgefill sweep`): split layers × tail lengths, each measured for speed and quality.

For every split layer the maps are calibrated once (or taken from the work directory); for every tail the TTFT
ratio comes from `bench.run` (interleaved, one process) and the quality from `evaluate` (tail KL, NLL of key
tokens, optionally needle) at the same prompt length.  The frontier is the set of settings no other setting beats
on both speedup and KL; for each KL budget the recommendation is the fastest setting within it.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import bench, evaluate
from .errors import RidgefillError

BUDGETS = (0.01, 0.02, 0.05, 0.1, 0.2)


@dataclass
class SweepConfig:
    model: str
    split_layers: list[int]
    tails: list[int]
    length: int = 4096
    sink_tokens: int = 4
    calib_tokens: int = 8192
    corpus: str = "brown"
    prompts: int = 2
    domains: list[str] = field(default_factory=lambda: ["shakespeare"])
    repeats: int = 1
    needle: bool = False
    depths: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75])
    needle_trials: int = 2
    threads: int | None = None
    workdir: str = "out/sweep"


def maps_for(cfg: SweepConfig, split_layer: int, progress) -> Path:
    from .calibrate import CalibConfig, calibrate
    from .ggufio import read_maps
    path = Path(cfg.workdir) / f"{Path(cfg.model).stem}.s{split_layer}.n{cfg.calib_tokens}.maps.gguf"
    if path.is_file():
        read_maps(path)  # validates; a damaged file is an error, not silently recalibrated
        return path
    progress(f"calibrating split layer {split_layer} ({cfg.calib_tokens} tokens of {cfg.corpus}) -> {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    calibrate(CalibConfig(model=cfg.model, split_layer=split_layer, corpus=cfg.corpus, tokens=cfg.calib_tokens,
                          ctx=min(1024, cfg.calib_tokens // 4), threads=cfg.threads, progress=False), path)
    return path


def frontier(points: list[dict]) -> list[dict]:
    """Points not dominated: no other point is at least as fast with at most the KL, and better in one."""
    def dominated(p):
        return any(q is not p and q["speedup"] >= p["speedup"] and q["kl"] <= p["kl"]
                   and (q["speedup"] > p["speedup"] or q["kl"] < p["kl"]) for q in points)
    return sorted((p for p in points if not dominated(p)), key=lambda p: p["kl"])


def recommend(points: list[dict], budgets=BUDGETS) -> list[dict]:
    out = []
    for b in budgets:
        ok = [p for p in points if p["kl"] <= b]
        best = max(ok, key=lambda p: p["speedup"]) if ok else None
        out.append({"kl_budget": b, "setting": None if best is None else
                    {"split_layer": best["split_layer"], "tail_tokens": best["tail_tokens"],
                     "speedup": best["speedup"], "kl": best["kl"]}})
    return out


def run(cfg: SweepConfig, progress=print) -> dict:
    if not cfg.split_layers or not cfg.tails:
        raise RidgefillError("give at least one split layer and one tail length")
    for t in cfg.tails:
        if t + cfg.sink_tokens >= cfg.length:
            raise RidgefillError(f"tail {t} + sink {cfg.sink_tokens} is not shorter than the prompt ({cfg.length})")
    threads = cfg.threads or os.cpu_count() or 1
    points = []
    for s in cfg.split_layers:
        maps = maps_for(cfg, s, progress)
        for tail in cfg.tails:
            b = bench.run(cfg.model, str(maps), [cfg.length], tail, cfg.sink_tokens, cfg.repeats, threads,
                          progress=lambda _: None)["rows"][0]
            ecfg = evaluate.EvalConfig(model=cfg.model, maps=str(maps), lengths=[cfg.length], tail_tokens=tail,
                                       sink_tokens=cfg.sink_tokens, prompts=cfg.prompts, domains=cfg.domains,
                                       tasks=["kl", "longdep"] + (["needle"] if cfg.needle else []),
                                       depths=cfg.depths, needle_trials=cfg.needle_trials, threads=threads)
            q = evaluate.run(ecfg, progress=lambda _: None)
            tails = [t for d in q["domains"].values() for k, t in d.items() if k.startswith("tail@")]
            n_tok = sum(t["tokens"] for t in tails)
            pt = {"split_layer": s, "tail_tokens": tail, "speedup": b["ratio"], "limit": b["limit"],
                  "exact_s": b["exact_s"], "ridgefill_s": b["ridgefill_s"],
                  "kl": sum(t["modes"]["ridgefill"]["kl"][0] * t["tokens"] for t in tails) / n_tok,
                  "top1": sum(t["modes"]["ridgefill"]["top1"][0] * t["tokens"] for t in tails) / n_tok,
                  "nll_key_diff": sum(t["modes"]["ridgefill"]["nll_key_diff"][0] * t["tokens"] for t in tails) / n_tok}
            if cfg.needle:
                acc = [d["needle"]["accuracy"] for d in q["domains"].values()]
                pt["needle_exact"] = sum(a["exact"][0] for a in acc) / len(acc)
                pt["needle_ridgefill"] = sum(a["ridgefill"][0] for a in acc) / len(acc)
            points.append(pt)
            progress(format_point(pt))
    return {"config": asdict(cfg), "points": points, "frontier": frontier(points), "recommend": recommend(points)}


HEADER = f"{'split':>5s} {'tail':>5s} {'speedup':>8s} {'limit':>6s} {'KL':>7s} {'top-1':>6s} {'ΔNLL key':>9s}"


def format_point(p: dict) -> str:
    extra = f"  needle {p['needle_exact']:.2f}/{p['needle_ridgefill']:.2f}" if "needle_exact" in p else ""
    return (f"{p['split_layer']:5d} {p['tail_tokens']:5d} {p['speedup']:7.2f}x {p['limit']:5.2f}x {p['kl']:7.4f} "
            f"{p['top1']:6.3f} {p['nll_key_diff']:9.3f}{extra}")


def report(result: dict) -> str:
    c = result["config"]
    lines = [f"speed–quality sweep of {Path(c['model']).name} at {c['length']} tokens "
             f"(maps: {c['calib_tokens']} tokens of {c['corpus']}; quality on {', '.join(c['domains'])})", "",
             "| split layer | tail | speedup | FLOP limit | tail KL | top-1 | ΔNLL key tokens | frontier |",
             "|---|---|---|---|---|---|---|---|"]
    front = {(p["split_layer"], p["tail_tokens"]) for p in result["frontier"]}
    for p in result["points"]:
        lines.append(f"| {p['split_layer']} | {p['tail_tokens']} | {p['speedup']:.2f}× | {p['limit']:.2f}× "
                     f"| {p['kl']:.4f} | {p['top1']:.3f} | {p['nll_key_diff']:+.3f} "
                     f"| {'●' if (p['split_layer'], p['tail_tokens']) in front else ''} |")
    lines += ["", "| KL budget | recommended setting |", "|---|---|"]
    for r in result["recommend"]:
        s = r["setting"]
        lines.append(f"| ≤ {r['kl_budget']} | " + ("none measured within budget (exact prefill)" if s is None else
                     f"split layer {s['split_layer']}, tail {s['tail_tokens']}: {s['speedup']:.2f}×, KL {s['kl']:.4f}")
                     + " |")
    return "\n".join(lines)


def save(result: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=1) + "\n")


def plot(result: dict, path: str | Path) -> None:
    from .plots import pyplot
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for s in sorted({p["split_layer"] for p in result["points"]}):
        pts = [p for p in result["points"] if p["split_layer"] == s]
        ax.scatter([p["kl"] for p in pts], [p["speedup"] for p in pts], label=f"split layer {s}")
        for p in pts:
            ax.annotate(f"tail {p['tail_tokens']}", (p["kl"], p["speedup"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    f = result["frontier"]
    ax.plot([p["kl"] for p in f], [p["speedup"] for p in f], "k--", lw=1, label="frontier")
    ax.set_xlabel("tail KL(exact‖RidgeFill), nats")
    ax.set_ylabel("TTFT speedup (exact / RidgeFill)")
    ax.set_title(f"{Path(result['config']['model']).name}, {result['config']['length']} tokens", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
