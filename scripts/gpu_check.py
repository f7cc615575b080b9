#!/usr/bin/env python3
"""The GPU check (run by scripts/gpu_check.sh on a machine with an NVIDIA GPU and a CUDA build of the fork).

    python scripts/gpu_check.py --models DIR [--out DIR] [--lengths 16384,32768] [--shapes llama-3.2-1b,llama-3.1-8b]

1. Same engine, two devices: for each tiny random-weight model of the kit (llama, qwen3, gemma3 graphs; maps
   calibrated on this machine by `gpu_check.sh kit`) and flash attention off and on, the CPU (-ngl 0) and the GPU
   (-ngl 99) runs of one 1,024-token prompt (DIR holds tiny-*.gguf and tiny-*.maps.gguf) are compared: RidgeFill off, the greedy tokens of 16 decode steps are
   equal; RidgeFill on, the filled/exact counts are equal, the sequence's K/V cells (the state that
   llama_state_seq_get_data serialises, dominated by the filled cells, predicted from the maps) agree to a relative
   error below KV_TOL, and the tail's last logits agree (same argmax, max difference below 2% of the largest).
2. TTFT exact vs RidgeFill at --lengths on the shapes of Llama-3.2-1B and Llama-3.1-8B (zero weights, random
   maps: speed only), -ngl 99, flash attention on and off, interleaved (ridgefill bench's loop).
Prints one table per part and writes gpu_check.json and gpu_check.md into --out. Exit 1 if a check fails.
--smoke: everything at toy sizes and -ngl 0 on both sides (a CPU test of this script, not of a GPU).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

KV_TOL = 0.02          # relative L2 error of the serialised K/V cells (f16), CPU vs GPU
N_PROMPT, TAIL, N_DECODE = 1024, 128, 16


def kv_state(llm) -> np.ndarray:
    from llama_cpp import llama_cpp as C
    n = C.llama_state_seq_get_size(llm.ctx, 0)
    buf = (ctypes.c_uint8 * n)()
    C.llama_state_seq_get_data(llm.ctx, buf, n, 0)
    return np.frombuffer(bytes(buf), dtype=np.float16).astype(np.float32)


def one_device(model: Path, maps: Path, tokens: list[int], ngl: int, fa: bool) -> dict:
    import ridgefill
    llm = ridgefill.Llama(str(model), maps_path=str(maps), tail_tokens=TAIL, n_ctx=2048, n_batch=2048,
                          n_ubatch=512, n_gpu_layers=ngl, flash_attn=fa, verbose=False)
    llm.set_ridgefill(False)
    greedy = []
    for i, t in enumerate(llm.generate(tokens, temp=0.0, top_k=1)):
        greedy.append(int(t))
        if i + 1 == N_DECODE:
            break
    llm.reset()
    llm.set_ridgefill(True)
    llm.eval(tokens)
    from llama_cpp import llama_cpp as C
    last = np.ctypeslib.as_array(C.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()
    out = dict(greedy=greedy, counts=llm.ridgefill_counts(), kv=kv_state(llm), logits=last,
               placement=llm.placement(llm.split_layer + 1, map=True))
    del llm
    return out


def compare(model: Path, maps: Path, ngl: int) -> list[dict]:
    import ridgefill
    from ridgefill import data
    vocab = ridgefill.Llama.__mro__[1](model_path=str(model), vocab_only=True, verbose=False)
    tokens = vocab.tokenize(data.text("shakespeare")[: N_PROMPT * 8].encode())[:N_PROMPT]
    rows = []
    for fa in (False, True):
        cpu, gpu = one_device(model, maps, tokens, 0, fa), one_device(model, maps, tokens, ngl, fa)
        finite = np.isfinite(cpu["kv"]) & np.isfinite(gpu["kv"])
        kv_err = float(np.linalg.norm((gpu["kv"] - cpu["kv"])[finite]) / max(np.linalg.norm(cpu["kv"][finite]), 1e-30))
        dl = float(np.abs(gpu["logits"] - cpu["logits"]).max() / max(np.abs(cpu["logits"]).max(), 1e-30))
        row = dict(model=model.stem, flash_attn="on" if fa else "off", device=gpu["placement"],
                   same_tokens=cpu["greedy"] == gpu["greedy"], counts_cpu=cpu["counts"], counts_gpu=gpu["counts"],
                   kv_rel_err=kv_err, kv_size_equal=len(cpu["kv"]) == len(gpu["kv"]), logits_rel_diff=dl,
                   same_argmax=int(cpu["logits"].argmax()) == int(gpu["logits"].argmax()))
        row["ok"] = bool(row["same_tokens"] and tuple(row["counts_cpu"]) == tuple(row["counts_gpu"])
                         and row["counts_cpu"][0] > 0 and row["kv_size_equal"] and kv_err < KV_TOL
                         and row["same_argmax"] and dl < 0.02)
        rows.append(row)
    return rows


def bench_rows(shapes: list[str], lengths: list[int], ngl: int, work: Path, repeats: int) -> list[dict]:
    from ridgefill import bench, synthetic
    rows = []
    for name in shapes:
        model, maps = work / f"{name}.gguf", work / f"{name}.maps.gguf"
        if not model.exists():
            synthetic.write(name, model, "q8_0", weights=False)   # zero weights: speed only
        split = synthetic.SPECS[name].shape.n_layer // 2
        if not maps.exists():
            synthetic.write_maps(model, split, maps, "f16")
        for fa in (True, False):
            t0 = time.time()
            r = bench.run(str(model), str(maps), lengths, 1024 if max(lengths) > 2048 else 64, 4, repeats, None,
                          progress=lambda *a: None, n_gpu_layers=ngl, flash_attn=fa)
            for row in r["rows"]:
                rows.append(dict(shape=name, flash_attn="on" if fa else "off", split_layer=split, **row))
            print(f"  {name} fa={'on' if fa else 'off'}: {time.time() - t0:.0f} s", file=sys.stderr)
    return rows


def md_tables(checks: list[dict], speed: list[dict]) -> str:
    out = ["| model | flash attn | maps on | same greedy tokens (off) | filled/exact CPU | GPU | K/V rel. err | "
           "tail logits rel. diff | ok |", "|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        out.append(f"| {c['model']} | {c['flash_attn']} | {c['device']} | {c['same_tokens']} | "
                   f"{c['counts_cpu'][0]}/{c['counts_cpu'][1]} | {c['counts_gpu'][0]}/{c['counts_gpu'][1]} | "
                   f"{c['kv_rel_err']:.2e} | {c['logits_rel_diff']:.2e} | {'yes' if c['ok'] else '**NO**'} |")
    out += ["", "| shape | flash attn | split | tokens | exact TTFT s | RidgeFill TTFT s | speedup (min–max) | "
            "FLOP limit |",
            "|---|---|---|---|---|---|---|---|"]
    for s in speed:
        out.append(f"| {s['shape']} | {s['flash_attn']} | {s['split_layer']} | {s['length']} | "
                   f"{s['exact_s']:.3f} | {s['ridgefill_s']:.3f} | {s['ratio']:.2f}× ({s['ratio_min']:.2f}–"
                   f"{s['ratio_max']:.2f}) | {s['limit']:.2f}× |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, type=Path, help="tiny-*.gguf with tiny-*.maps.gguf beside them")
    ap.add_argument("--out", type=Path, default=Path("gpu-check-out"))
    ap.add_argument("--lengths", default="16384,32768")
    ap.add_argument("--shapes", default="llama-3.2-1b,llama-3.1-8b")
    ap.add_argument("-r", "--repeats", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="toy sizes, CPU on both sides: tests this script only")
    args = ap.parse_args()
    ngl = 0 if args.smoke else 99
    lengths = [int(x) for x in args.lengths.split(",")] if not args.smoke else [512]
    shapes = args.shapes.split(",") if not args.smoke else ["tiny-llama"]
    args.out.mkdir(parents=True, exist_ok=True)
    from llama_cpp import llama_cpp as C
    print(f"system: {C.llama_print_system_info().decode()}")
    if not args.smoke and not C.llama_supports_gpu_offload():
        sys.exit("gpu_check: this build has no GPU backend (build with gpu_check.sh build)")
    checks = []
    for model in sorted(args.models.glob("tiny-*.gguf")):
        if model.name.endswith(".maps.gguf"):
            continue
        checks += compare(model, model.with_name(model.stem + ".maps.gguf"), ngl)
    print(md_tables(checks, []).split("\n\n")[0])
    speed = bench_rows(shapes, lengths, ngl, args.out if args.smoke else Path(os.environ.get("TMPDIR", "/tmp")),
                       args.repeats)
    md = md_tables(checks, speed)
    print(md.split("\n\n")[1])
    (args.out / "gpu_check.json").write_text(json.dumps(dict(checks=checks, speed=speed), indent=1, default=str))
    (args.out / "gpu_check.md").write_text(md + "\n")
    if not checks or not all(c["ok"] for c in checks):
        sys.exit("gpu_check: a CPU/GPU comparison failed (see the table)")


if __name__ == "__main__":
    main()
