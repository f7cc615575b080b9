"""The guard replayed offline: every check window's error on eval's prompts, so check rules can be compared on the
same prompts without a runtime run per rule (docs/results.md, "Pooling the checks").

`collect` runs each prompt exactly (the fork, capturing layer inputs, as `ridgefill calibrate` does) and stores,
for 32-row windows starting at origin + j·GRID (origin: the first row after the sink; up to the tail), the maps'
Σ|ŷ−y|² and Σ|y|² per late layer, computed by the calibration's own code (calibrate.guard_sums).  The runtime's
canary rows after the probe attend to cells the maps filled, these rows to exact ones: `compare` prints both on
prompts `ridgefill eval --task guard` ran, to show how far that matters.  `rules` applies check rules to stored
prompts: "largest" (the rule before pooling: fall back when one check scores above the threshold), "all" (the
score of all canary rows so far, Σnum/Σden per layer) and "runtime" (guard.pooled: the larger of "all" and the
last two checks' pool).  (scripts/guard_design.py, the earlier study, compares canary placements threshold-free;
this replays the runtime's decision against the calibrated threshold.)

    python scripts/guard_sim.py collect SmolLM2.gguf --maps M.gguf --domains brown --lengths 8192 \\
        --tail-tokens 1024 --prompts 24 --skip-tokens 560000 -o build/guard-sim/brown-8k.npz
    python scripts/guard_sim.py compare build/guard-sim/brown-8k.npz docs/data/guard-verdicts4-...json --period 1024
    python scripts/guard_sim.py rules build/guard-sim/*.npz
"""
import argparse
import json
from pathlib import Path

import numpy as np

from ridgefill import evaluate, guard
from ridgefill.calibrate import LayerInputs, guard_sums
from ridgefill.errors import RidgefillError
from ridgefill.ggufio import read_maps
from ridgefill.ridge import context_features

GRID = 256


def collect(a) -> None:
    m = read_maps(a.maps)
    if m.map_kind != "input" or m.guard is None:
        raise RidgefillError(f"{a.maps}: input maps with guard data only")
    late, C, sink = m.late_layers, m.context_tokens, a.sink_tokens
    W = np.stack([m.weights[l] for l in late])
    b = np.stack([m.biases[l] for l in late])
    cfg = evaluate.EvalConfig(model=a.model, maps=a.maps, tasks=["guard"], lengths=[a.length],
                              tail_tokens=a.tail_tokens, sink_tokens=sink, prompts=a.prompts,
                              skip_tokens=a.skip_tokens, domains=a.domains.split(","))
    ev = evaluate.Evaluator(cfg)
    texts = evaluate.domains(cfg, ev, print)
    runner = LayerInputs(Path(a.model), [m.split_layer, *late], a.length, None)
    n_fill = a.length - a.tail_tokens - sink                  # rows the maps would fill
    offsets = np.arange(0, n_fill - guard.WINDOW + 1, GRID)
    out = {"num": [], "den": [], "domain": []}
    for name, text in texts.items():
        for i, toks in enumerate(evaluate.windows(ev, text, a.length, a.prompts, name)):
            acts = runner.run(np.asarray(toks, dtype=np.int32))
            f = context_features(acts[0], C, sink)            # rows sink.. of the prompt
            rows = np.concatenate([f.reshape(len(f), C + 1, -1), acts[1:, sink:].transpose(1, 0, 2)], axis=1)
            win = np.stack([rows[o:o + guard.WINDOW] for o in offsets])
            num, den = guard_sums("input", None, W, b, win, C)
            out["num"].append(num)
            out["den"].append(den)
            out["domain"].append(name)
            print(f"{name} {i + 1}: probe score {guard.scores(num[:1], den[:1], m.guard.layer_error)[0]:.2f}",
                  flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    np.savez(a.out, num=np.asarray(out["num"]), den=np.asarray(out["den"]), domain=np.asarray(out["domain"]),
             offsets=offsets, layer_error=m.guard.layer_error, threshold=m.guard.threshold,
             heldout_scores=m.guard.scores, length=a.length, tail_tokens=a.tail_tokens, maps=str(a.maps),
             skip_tokens=a.skip_tokens)


def checks(offsets: np.ndarray, period: int) -> np.ndarray:
    """Indices into offsets of the runtime's checks: the probe, then every `period` rows (0: the probe only)."""
    want = [0] if period == 0 else list(range(0, int(offsets[-1]) + 1, period))
    return np.asarray([int(np.flatnonzero(offsets == o)[0]) for o in want])


def largest(num, den, le, idx) -> np.ndarray:
    """Per prompt: the largest score of its checks (the runtime's rule)."""
    return (num[:, idx] / den[:, idx] / le).mean(-1).max(-1)


def pooled_all(num, den, le, idx) -> np.ndarray:
    """Per prompt: the largest score of all canary rows so far (after check k: Σnum/Σden over checks 0..k)."""
    return (np.cumsum(num[:, idx], axis=1) / np.cumsum(den[:, idx], axis=1) / le).mean(-1).max(-1)


def runtime(num, den, le, idx) -> np.ndarray:
    """Per prompt: the largest score after any check under the runtime's rule (guard.pooled)."""
    return np.asarray([guard.pooled(n[idx], d[idx], le).max() for n, d in zip(num, den)])


def load(paths):
    runs = [dict(np.load(p, allow_pickle=False)) for p in paths]
    return [(Path(p).stem, r) for p, r in zip(paths, runs)]


def compare(a) -> None:
    r = dict(np.load(a.npz))
    per = [p for d in json.loads(Path(a.verdicts).read_text())["domains"].values()
           for k, g in d.items() if k.startswith("guard@") for p in g["prompts"]]
    sim = largest(r["num"], r["den"], r["layer_error"], checks(r["offsets"], a.period))
    probe = largest(r["num"], r["den"], r["layer_error"], checks(r["offsets"], 0))
    print("| prompt | runtime: verdict | runtime: largest check | replay: largest check | replay: probe |")
    print("|---|---|---|---|---|")
    for i, (p, s, q) in enumerate(zip(per, sim, probe)):
        print(f"| {i + 1} | {p['verdict']} | {p['max_score']:.3f} | {s:.3f} | {q:.3f} |")
    rt = np.asarray([p["max_score"] for p in per])
    ok = np.asarray([p["verdict"] == "passed" for p in per])   # a prompt that fell back had no later checks
    one = np.asarray([p["checks"] == 1 for p in per])
    for label, x, y in (("probe, prompts with one check", rt[one], probe[one]),
                        ("largest check, prompts that passed", rt[ok], sim[ok])):
        if len(x):
            dev = np.abs(np.asarray(x) - y)
            print(f"{label}: largest |runtime - replay| {dev.max():.3f}, median {np.median(dev):.3f}")


def rules(a) -> None:
    periods = [int(x) for x in a.periods.split(",")]
    runs = load(a.npz)
    t = float(runs[0][1]["threshold"])
    print(f"threshold {t:.2f} (of {runs[0][1]['maps']}); per cell: prompts over it under the rules largest / all / "
          f"runtime, of all prompts (checks per prompt)\n")
    print("| prompts | " + " | ".join(f"period {p}" for p in periods) + " |")
    print("|---|" + "---|" * len(periods))
    for name, r in runs:
        le = r["layer_error"]
        cells = []
        for p in periods:
            idx = checks(r["offsets"], p)
            n = [int((rule(r["num"], r["den"], le, idx) > t).sum()) for rule in (largest, pooled_all, runtime)]
            cells.append(f"{' / '.join(map(str, n))} of {len(r['num'])} ({len(idx)})")
        print(f"| {name} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("model")
    c.add_argument("--maps", required=True)
    c.add_argument("--domains", default="brown")
    c.add_argument("--lengths", dest="length", type=int, default=2048)
    c.add_argument("--tail-tokens", type=int, default=256)
    c.add_argument("--sink-tokens", type=int, default=4)
    c.add_argument("--prompts", type=int, default=16)
    c.add_argument("--skip-tokens", type=int, default=0)
    c.add_argument("-o", "--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("npz")
    c.add_argument("verdicts")
    c.add_argument("--period", type=int, default=2048)
    c = sub.add_parser("rules")
    c.add_argument("npz", nargs="+")
    c.add_argument("--periods", default="0,2048,1024,512")
    a = ap.parse_args()
    {"collect": collect, "compare": compare, "rules": rules}[a.cmd](a)


if __name__ == "__main__":
    main()
