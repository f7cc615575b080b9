"""The main job on the small model: calibrate → export → exact vs RidgeFill prefill, bindings and server.

1. fit maps for one split layer on the Brown corpus (`ridgefill calibrate`),
2. write the augmented model (`ridgefill export`),
3. run one long prompt (Brown prose, other samples than the calibration's) exactly and with RidgeFill
   (the out-of-distribution guard on, as by default), interleaved, through `ridgefill.Llama` and through
   `ridgefill-server`, and one prompt of Python source, which the guard sends to the exact path,
4. print time to first token for both and how close RidgeFill's next-token distribution is,
5. a small bench (TTFT of the fill against length, with the FLOP limit) and eval on Shakespeare (another
   register: tail KL, needle accuracy both ways), then a summary table; plots and JSON go to the work directory.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from . import data, models
from ._lib import fork_identity
from .errors import RidgefillError
from .modelfile import check_gguf

QUESTION = "\n\nQuestion: What is this text about? Answer:"


def build_prompt(tokenize, detokenize, n_tokens: int, corpus: str = "brown") -> str:
    """About `n_tokens` tokens of real text from the second half of `corpus` (calibration reads from its start)
    followed by a question."""
    text = data.text(corpus)
    text = text[len(text) // 2:]
    body = tokenize(text[: n_tokens * 8].encode(), add_bos=False, special=False)
    n_q = len(tokenize(QUESTION.encode(), add_bos=False, special=False))
    return detokenize(body[: max(1, n_tokens - n_q - 1)]).decode("utf-8", errors="ignore") + QUESTION


def _next_token_probs(llm) -> np.ndarray:
    from llama_cpp import llama_cpp as C
    logits = np.ctypeslib.as_array(C.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).astype(np.float64)
    p = np.exp(logits - logits.max())
    return p / p.sum()


def run(model: str | None = None, n_prompt: int = 4096, threads: int | None = None, split_layer: int = 20,
        calib_tokens: int = 8192, tail_tokens: int = 1024, workdir: str | Path = "out") -> dict:
    from .calibrate import CalibConfig, calibrate
    from .ggufio import diagnostics_table, export
    from .runtime import Llama
    from .server import Server

    model_path = Path(check_gguf(model)) if model else models.fetch("smollm2-135m")
    threads = threads or os.cpu_count() or 1
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

    n_ctx = n_prompt + 64
    llm = Llama(str(augmented), tail_tokens=tail_tokens, n_ctx=n_ctx, n_batch=2048, n_ubatch=512,
                n_threads=threads, n_threads_batch=threads, verbose=False)
    prompt = build_prompt(llm.tokenize, llm.detokenize, n_prompt)
    tokens = llm.tokenize(prompt.encode())
    print(f"\n== prefill: {len(tokens)}-token prompt (Brown prose, other samples than the calibration's), tail "
          f"{tail_tokens}, {threads} threads")

    llm.set_ridgefill(False)
    llm.eval(tokens[:32])  # warm-up
    ttft, probs, counts = {}, {}, {}
    for mode in (False, True, False, True):  # interleaved; the second run of each counts
        llm.set_ridgefill(mode)
        llm.reset()  # a fresh prefill each time
        t0 = time.perf_counter()
        llm.eval(tokens)
        ttft[mode] = time.perf_counter() - t0
        probs[mode] = _next_token_probs(llm)
        counts[mode] = llm.ridgefill_counts()
    verdict = llm.guard_result()
    # the out-of-distribution guard on text unlike the calibration prose: Python source of the same length
    foreign = llm.tokenize(build_prompt(llm.tokenize, llm.detokenize, n_prompt, "python-code").encode())
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(foreign)
    foreign_ttft, foreign_verdict, foreign_filled = time.perf_counter() - t0, llm.guard_result(), llm.ridgefill_counts()[0]
    p, q = probs[False], probs[True]
    kl = float((p * (np.log(p + 1e-30) - np.log(q + 1e-30))).sum())
    same_top = int(p.argmax() == q.argmax())
    text = {}
    for mode in (False, True):
        llm.set_ridgefill(mode)
        llm.reset()  # a fresh prefill each time
        text[mode] = llm.create_completion(prompt, max_tokens=16, temperature=0.0)["choices"][0]["text"]
    del llm

    with Server(augmented, "-c", str(n_ctx), "-b", "2048", "-t", str(threads), "-np", "1", "-fa", "off",
                "--ridgefill", "--ridgefill-tail", str(tail_tokens)) as srv:
        srv.post("/completion", {"prompt": "Hello", "n_predict": 1})  # warm-up
        srv_t = {}
        for mode in (False, True):
            t0 = time.perf_counter()
            res = srv.post("/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0.0,
                                           "cache_prompt": False, "ridgefill": mode})
            srv_t[mode] = (time.perf_counter() - t0, res["timings"])

    print(f"\n{'':32s} {'exact':>9s} {'RidgeFill':>10s} {'speedup':>8s}")
    print(f"{'TTFT, ridgefill.Llama (s)':32s} {ttft[False]:9.2f} {ttft[True]:10.2f} {ttft[False] / ttft[True]:7.2f}x")
    print(f"{'TTFT, ridgefill-server (s)':32s} {srv_t[False][0]:9.2f} {srv_t[True][0]:10.2f} "
          f"{srv_t[False][0] / srv_t[True][0]:7.2f}x")
    print(f"{'prompt tokens filled / exact':32s} {'0 / ' + str(counts[False][1]):>9s} "
          f"{str(counts[True][0]) + ' / ' + str(counts[True][1]):>10s}")
    print(f"\nnext-token KL(exact || RidgeFill) = {kl:.4f} nats, same top-1 token: {'yes' if same_top else 'no'}")
    print(f"guard on this prompt: {verdict['guard']} (largest check score {verdict['max_score']:.2f}, threshold "
          f"{verdict['threshold']:.2f})")
    print(f"guard on {len(foreign)} tokens of Python source: {foreign_verdict['guard']} (score "
          f"{foreign_verdict['max_score']:.2f}), {foreign_filled} tokens filled, TTFT {foreign_ttft:.2f} s")
    print(f"greedy continuation, exact:     {text[False]!r}")
    print(f"greedy continuation, RidgeFill: {text[True]!r}")

    from . import bench, evaluate
    from .stats import fmt_ci
    lengths = sorted({min(2048, n_prompt), n_prompt})
    print(f"\n== bench: lengths {lengths}, tail {tail_tokens}, interleaved")
    print(bench.HEADER)
    b = bench.run(str(augmented), None, lengths, tail_tokens, 4, 1, threads)
    bench.save(b, workdir / "bench.json")
    print("\n== eval: tail KL on 2 Shakespeare prompts of 1024 tokens (tail 256); needle at 3 depths × 2 keys")
    q = evaluate.run(evaluate.EvalConfig(model=str(augmented), tasks=["kl", "needle"], lengths=[1024],
                                         tail_tokens=256, prompts=2, domains=["shakespeare"],
                                         depths=[0.25, 0.5, 0.75], needle_trials=2, threads=threads))
    evaluate.save(q, workdir / "eval.json")
    plots = []
    try:
        bench.plot(b, workdir / "bench.png")
        evaluate.plot(q, workdir / "eval.png")
        plots = [str(workdir / "bench.png"), str(workdir / "eval.png")]
    except RidgefillError as e:  # matplotlib missing
        print(f"(no plots: {e})")
    t = q["domains"]["shakespeare"]["tail@1024"]["modes"]["ridgefill"]
    nd = q["domains"]["shakespeare"]["needle"]["accuracy"]
    n_trials = sum(c["trials"] for c in q["domains"]["shakespeare"]["needle"]["cells"])
    print(f"\n== summary: {model_path.name}, split layer {split_layer}, tail {tail_tokens}, {threads} threads")
    print(f"{'':40s} {'exact':>9s} {'RidgeFill':>10s} {'ratio':>7s}")
    print(f"{'TTFT ' + str(len(tokens)) + ' tokens, ridgefill.Llama (s)':40s} {ttft[False]:9.2f} {ttft[True]:10.2f} "
          f"{ttft[False] / ttft[True]:6.2f}x")
    print(f"{'TTFT ' + str(len(tokens)) + ' tokens, ridgefill-server (s)':40s} {srv_t[False][0]:9.2f} "
          f"{srv_t[True][0]:10.2f} {srv_t[False][0] / srv_t[True][0]:6.2f}x")
    for r in b["rows"]:
        print(f"{'TTFT ' + str(r['length']) + ' tokens, bench (s)':40s} {r['exact_s']:9.2f} {r['ridgefill_s']:10.2f} "
              f"{r['ratio']:6.2f}x  (FLOP limit {r['limit']:.2f}x)")
    print(f"{'tail KL(exact || RidgeFill), nats':40s} {'':9s} {fmt_ci(t['kl'], 4)}")
    print(f"{'tail top-1 agreement':40s} {'':9s} {fmt_ci(t['top1'], 3)}")
    print(f"{'guard: Brown prompt / Python source':40s} {verdict['guard']:>9s} {foreign_verdict['guard']:>10s}")
    print(f"{'needle accuracy (' + str(n_trials) + ' keys, 1024 tokens)':40s} {nd['exact'][0]:9.2f} "
          f"{nd['ridgefill'][0]:10.2f}")
    if plots:
        print("plots: " + ", ".join(plots))
    return {"prompt_tokens": len(tokens), "ttft_exact_s": ttft[False], "ttft_ridgefill_s": ttft[True],
            "server_ttft_exact_s": srv_t[False][0], "server_ttft_ridgefill_s": srv_t[True][0], "kl": kl,
            "tail_kl": t["kl"][0], "needle_exact": nd["exact"][0], "needle_ridgefill": nd["ridgefill"][0],
            "guard": verdict["guard"], "guard_foreign": foreign_verdict["guard"]}
