"""Prompt-processing speed of GGUF files side by side: one process, the models loaded once, rounds interleaved.

    python scripts/prompt_speed.py A.gguf B.gguf [--tokens 512] [--rounds 5] [-t THREADS] [--kl]

Each round decodes the same `--tokens` tokens of Shakespeare from position 0 in every model (one batch, as
calibration and a prefill do); the median seconds per model and each model's speed relative to the first are printed.
`--kl` adds, for every model, the mean KL(first‖model) of the next-token distributions at those positions and how
often the top-1 token agrees with the first model's.
Used for docs/results.md, "The tests' model" (the package's Q4_1 SmolLM2 against its Q8_0 re-encoding).
"""
import argparse
import os
import statistics
import time

import numpy as np
from llama_cpp import Llama
from llama_cpp import llama_cpp as C

from ridgefill import data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("--kl", action="store_true", help="next-token KL and top-1 agreement against the first model")
    a = ap.parse_args()
    llms = [Llama(model_path=m, n_ctx=a.tokens, n_batch=a.tokens, n_ubatch=a.tokens, n_threads=a.threads,
                  n_threads_batch=a.threads, verbose=False) for m in a.models]
    toks = llms[0].tokenize(data.text("shakespeare")[:8 * a.tokens].encode())[:a.tokens]
    secs = [[] for _ in llms]
    for r in range(a.rounds + 1):                                  # round 0 warms up
        for llm, s in zip(llms, secs):
            C.llama_memory_clear(C.llama_get_memory(llm.ctx), True)
            arr = (C.llama_token * len(toks))(*toks)
            t = time.perf_counter()
            if C.llama_decode(llm.ctx, C.llama_batch_get_one(arr, len(toks))) != 0:
                raise SystemExit("llama_decode failed")
            if r:
                s.append(time.perf_counter() - t)
    base = statistics.median(secs[0])
    print(f"{a.tokens} tokens, {a.threads} threads, median of {a.rounds} interleaved rounds")
    kl = [""] * len(llms)
    if a.kl:
        del llms
        logp = [log_probs(m, toks, a.threads) for m in a.models]
        kl = [f" {(np.exp(logp[0]) * (logp[0] - q)).sum(-1).mean():.5f} | {(logp[0].argmax(-1) == q.argmax(-1)).mean():.3f} |"
              for q in logp]
    print("| model | s | tokens/s | speed vs first |" + (" KL(first‖model) | top-1 agree |" if a.kl else ""))
    print("|---|---|---|---|" + ("---|---|" if a.kl else ""))
    for m, s, k in zip(a.models, secs, kl):
        med = statistics.median(s)
        print(f"| {os.path.basename(m)} | {med:.3f} | {a.tokens / med:.0f} | {base / med:.2f}x |" + k)


def log_probs(model: str, toks: list[int], threads: int) -> np.ndarray:
    llm = Llama(model_path=model, n_ctx=len(toks), n_batch=len(toks), n_threads=threads, logits_all=True,
                verbose=False)
    llm.eval(toks)
    x = np.asarray(llm.scores[:len(toks)], dtype=np.float64)
    x -= x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


if __name__ == "__main__":
    main()
