#!/usr/bin/env python3
"""Run one install of the fork on SmolLM2 and print what it computed, to compare two installs (docs/scale.md).

    python scripts/wheel_check.py MODEL MAPS -o a.json          # under one install (e.g. the CPU wheel)
    /other/venv/bin/python scripts/wheel_check.py MODEL MAPS -o b.json   # under another (e.g. the CUDA wheel)
    python scripts/wheel_check.py --compare a.json b.json       # same tokens, counts, guard; logits within noise

It runs the bindings (`ridgefill.Llama`, RidgeFill off and on, guard on) and the server binary (`llama-server
--version`) of the install whose Python runs it, on the CPU (n_gpu_layers=0): it shows that a wheel is complete
and linked (every library loads, the patched runtime is there) and computes what the CPU wheel computes. On a
machine without a GPU a CUDA wheel's backend finds no device and ggml runs on the CPU, so the two must agree.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np


def run(model: str, maps: str, n_prompt: int) -> dict:
    import llama_cpp

    import ridgefill
    from ridgefill.data import text as corpus_text

    text = corpus_text("brown")[:40_000]  # the maps' calibration corpus: the guard passes
    llm = ridgefill.Llama(model, maps_path=maps, tail_tokens=256, sink_tokens=4, n_ctx=2048, n_batch=2048,
                          n_ubatch=512, n_gpu_layers=0, logits_all=False, verbose=False)
    tokens = llm.tokenize(text.encode(), add_bos=True)[:n_prompt]
    libs = sorted(p.name for p in (Path(llama_cpp.__file__).parent / "lib").glob("*.so*"))
    out = {"llama_cpp": llama_cpp.__file__, "ridgefill": ridgefill.__file__, "libs": libs}
    for name, on in (("exact", False), ("ridgefill", True)):
        llm.set_ridgefill(on)
        llm.reset()
        llm.eval(tokens)
        last = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        logits = np.ctypeslib.as_array(last, shape=(llm.n_vocab(),)).astype(np.float64)
        counts = llm.ridgefill_counts()
        guard = llm.guard_result() if on else None
        llm.reset()
        greedy = llm.create_completion(tokens, max_tokens=16, temperature=0.0)["choices"][0]["text"]
        out[name] = {"counts": list(counts), "guard": guard, "argmax": int(logits.argmax()),
                     "logits": logits.tolist(), "greedy": greedy}
    server = Path(ridgefill.__file__).parent / "bin" / "llama-server"
    v = subprocess.run([str(server), "--version"], capture_output=True, text=True)
    out["server_version"] = (v.stdout + v.stderr).strip().splitlines()[-2:]
    return out


def compare(a: dict, b: dict) -> int:
    bad = 0
    for name in ("exact", "ridgefill"):
        x, y = a[name], b[name]
        la, lb = np.array(x["logits"]), np.array(y["logits"])
        rel = float(np.abs(la - lb).max() / np.abs(la).max())
        same = (x["counts"] == y["counts"] and x["argmax"] == y["argmax"] and x["greedy"] == y["greedy"]
                and (x["guard"] or {}).get("guard") == (y["guard"] or {}).get("guard"))
        ok = same and rel < 1e-3
        bad += not ok
        print(f"{name:9s} counts {x['counts']} vs {y['counts']}  argmax {x['argmax']} vs {y['argmax']}  "
              f"greedy equal {x['greedy'] == y['greedy']}  guard {(x['guard'] or {}).get('guard')} vs "
              f"{(y['guard'] or {}).get('guard')}  max |dlogit|/max|logit| {rel:.2e}  {'ok' if ok else 'DIFFERENT'}")
    for k, x in (("a", a), ("b", b)):
        print(f"{k}: {x['llama_cpp']}\n   {' '.join(x['libs'])}\n   " + " / ".join(x["server_version"]))
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="MODEL MAPS, or with --compare two JSON files")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--prompt-tokens", type=int, default=1500)
    ap.add_argument("-o", "--out")
    a = ap.parse_args()
    if a.compare:
        sys.exit(1 if compare(*(json.loads(Path(f).read_text()) for f in a.files)) else 0)
    out = run(*a.files, a.prompt_tokens)
    Path(a.out).write_text(json.dumps(out)) if a.out else print(json.dumps(out))


if __name__ == "__main__":
    main()
