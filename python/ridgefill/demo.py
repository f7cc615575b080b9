"""The main job on the small model: calibrate → export → one long prompt through the fork.

Maps are fitted on the Brown corpus and exported into an augmented GGUF; then a
long prompt runs through the fork's bindings and its server, timing the first
token.  The runtime that fills the cache from the maps (issue 4) is not there
yet, so the prompt is prefilled exactly; the comparison joins this command when
it lands.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from . import data, models
from ._lib import fork_identity
from .modelfile import check_gguf

QUESTION = "\n\nQuestion: Which play is this, and who speaks first? Answer:"


def build_prompt(tokenize, detokenize, n_tokens: int, corpus: str = "shakespeare") -> str:
    """About `n_tokens` tokens of real text followed by a question."""
    text = data.text(corpus)
    body = tokenize(text[: n_tokens * 8].encode(), add_bos=False, special=False)
    n_q = len(tokenize(QUESTION.encode(), add_bos=False, special=False))
    return detokenize(body[: max(1, n_tokens - n_q - 1)]).decode("utf-8", errors="ignore") + QUESTION


def run(model: str | None = None, n_prompt: int = 4096, threads: int | None = None, split_layer: int = 20,
        calib_tokens: int = 8192, workdir: str | Path = "out") -> dict:
    from llama_cpp import Llama

    from .calibrate import CalibConfig, calibrate
    from .ggufio import diagnostics_table, export
    from .server import Server

    model_path = Path(check_gguf(model)) if model else models.fetch("smollm2-135m")
    threads = threads or os.cpu_count() or 1
    n_ctx = n_prompt + 256
    ident = fork_identity()
    print(f"fork:   ridgefill {ident['version']} on {ident['upstream']}, patches {ident['patch_series']}")
    print(f"model:  {model_path.name}")

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    maps = workdir / f"{model_path.stem}.s{split_layer}.maps.gguf"
    augmented = workdir / f"{model_path.stem}.ridgefill.gguf"
    print(f"\n== calibrate: split_layer {split_layer}, {calib_tokens} tokens of the Brown corpus")
    m = calibrate(CalibConfig(model=model_path, split_layer=split_layer, corpus="brown", tokens=calib_tokens,
                              ctx=1024, threads=threads), maps)
    print(diagnostics_table(m))
    print(f"\n== export: {augmented}")
    export(model_path, maps, augmented)
    print(f"\n== prefill (exact; RidgeFill prefill joins here with the runtime)")

    llm = Llama(model_path=str(model_path), n_ctx=n_ctx, n_batch=2048, n_threads=threads, verbose=False)
    prompt = build_prompt(llm.tokenize, llm.detokenize, n_prompt)
    n_tok = len(llm.tokenize(prompt.encode()))
    print(f"prompt: {n_tok} tokens, {threads} threads\n")

    llm.create_completion("Hello", max_tokens=1)  # warm-up
    llm.reset()
    t0 = time.perf_counter()
    out = llm.create_completion(prompt, max_tokens=1, temperature=0.0)
    ttft_bindings = time.perf_counter() - t0
    del llm

    with Server(model_path, "-c", str(n_ctx), "-b", "2048", "-t", str(threads), "-np", "1", "-fa", "off") as srv:
        srv.post("/completion", {"prompt": "Hello", "n_predict": 1})  # warm-up
        t0 = time.perf_counter()
        res = srv.post("/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0.0, "cache_prompt": False})
        ttft_server = time.perf_counter() - t0
        props = srv.get("/props")

    rows = [("bindings (llama_cpp.Llama)", ttft_bindings, n_tok / ttft_bindings),
            ("ridgefill-server /completion", ttft_server, res["timings"]["prompt_per_second"])]
    print(f"{'path':30s} {'TTFT s':>8s} {'prompt tok/s':>13s}")
    for name, t, tps in rows:
        print(f"{name:30s} {t:8.2f} {tps:13.0f}")
    print(f"\nfirst token: bindings {out['choices'][0]['text']!r}, server {res['content']!r}")
    print(f"server /props ridgefill: {props.get('ridgefill')}")
    return {"prompt_tokens": n_tok, "ttft_bindings_s": ttft_bindings, "ttft_server_s": ttft_server}
