"""Splice debug modes: with splice=kv the filled cache equals the exact one, so the tail's logits do too.

The reference is the exact run fed in the same ubatches as the RidgeFill run (sink rows, filled region,
tail): on Gemma 3 (Q4_K) the exact logits themselves move by up to ~0.5 when the same prompt is cut into
other ubatches, so comparing against a single-batch exact run would measure the kernels, not RidgeFill.
"""
import numpy as np
import pytest
from conftest import n_threads

import ridgefill
from ridgefill import data
from ridgefill.errors import RidgefillError

SINK, TAIL = 4, 256


def kl_mean(ref: np.ndarray, got: np.ndarray) -> float:
    def logp(x):
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    p, q = logp(ref), logp(got)
    return float((np.exp(p) * (p - q)).sum(-1).mean())


def exact_in_ubatches(llm: ridgefill.Llama, toks: list[int], cuts: list[int]) -> np.ndarray:
    """Tail logits of an exact run whose decode calls end at `cuts` (the RidgeFill run's ubatches)."""
    llm.set_ridgefill(False)
    llm.reset()
    rows, start = [], 0
    for end in cuts:
        llm._decode(toks[start:end], -1, lambda pos: pos >= len(toks) - TAIL, rows.append)
        start = end
    return np.concatenate(rows)


def spliced(llm: ridgefill.Llama, toks: list[int], mode: str | None) -> np.ndarray:
    llm.set_splice(mode)
    llm.set_ridgefill(True)
    out = llm.prompt_logits(toks, len(toks) - TAIL)
    assert llm.ridgefill_counts() == (len(toks) - TAIL - SINK, TAIL + SINK)
    return out


def check_kv_equals_exact(model, maps, n_tokens: int, n_ubatch: int) -> dict[str, float]:
    llm = ridgefill.Llama(str(model), maps_path=str(maps), tail_tokens=TAIL, sink_tokens=SINK, n_ctx=2048,
                          n_batch=2048, n_ubatch=n_ubatch, n_threads=n_threads(), verbose=False)
    toks = llm.tokenize(data.text("shakespeare")[:40000].encode())[:n_tokens]
    assert len(toks) == n_tokens
    exact_from = n_tokens - TAIL
    cuts = [SINK, *range(SINK + n_ubatch, exact_from, n_ubatch), exact_from, n_tokens]
    ref = exact_in_ubatches(llm, toks, cuts)
    kv = spliced(llm, toks, "kv")
    np.testing.assert_allclose(kv, ref, rtol=0, atol=1e-4)  # bit-identical on this machine
    approx = spliced(llm, toks, None)
    assert kl_mean(ref, approx) > 1e-3                   # ... while the maps alone are not exact
    return {"none": kl_mean(ref, approx)}


def test_llama_kv_splice_equals_exact_over_several_ubatches(smollm2, maps20):
    check_kv_equals_exact(smollm2, maps20, 1000, 256)   # three approximate ubatches


def test_gemma3_kv_splice_equals_exact_beyond_the_window(gemma3, gemma_maps):
    check_kv_equals_exact(gemma3, gemma_maps, 1100, 2048)  # 840 filled rows > 512 sliding window


def test_qwen3_kv_splice_equals_exact(qwen3_synthetic, qwen3_maps):
    check_kv_equals_exact(qwen3_synthetic, qwen3_maps, 700, 1024)


def test_unknown_splice_mode_is_refused(smollm2, maps20):
    """(What each mode does to the error is measured by `ridgefill eval --task splice`, tests/test_measure.py.)"""
    llm = ridgefill.Llama(str(smollm2), maps_path=str(maps20), n_ctx=256, verbose=False)
    with pytest.raises(RidgefillError, match="unknown splice mode 'q'"):
        llm.set_splice("q")
