"""RidgeFill prefill in the runtime, through ridgefill.Llama, on SmolLM2 with maps from calibrate."""
import numpy as np
import pytest
from conftest import logits_last, n_threads
from llama_cpp import Llama as StockLlama

import ridgefill
from ridgefill._lib import lib
from ridgefill.errors import RidgefillError
from ridgefill.ggufio import read_maps
from ridgefill.modelfile import open_gguf

CTX = dict(n_ctx=2048, n_batch=2048, n_ubatch=512, n_threads=n_threads(), verbose=False)


@pytest.fixture(scope="module")
def rf(smollm2, maps20):
    return ridgefill.Llama(str(smollm2), maps_path=str(maps20), tail_tokens=256, sink_tokens=4, **CTX)


def test_off_is_bit_identical_to_stock(rf, smollm2, prose_tokens):
    stock = StockLlama(model_path=str(smollm2), **CTX)
    stock.eval(prose_tokens[:900])
    want = logits_last(stock)
    del stock
    rf.set_ridgefill(False)
    rf.reset()
    rf.eval(prose_tokens[:900])
    np.testing.assert_array_equal(logits_last(rf), want)
    assert rf.ridgefill_counts() == (0, 900)


def test_on_fills_all_but_sink_and_tail(rf, prose_tokens):
    rf.set_ridgefill(True, tail_tokens=256)
    rf.reset()
    rf.eval(prose_tokens[:900])
    assert rf.ridgefill_counts() == (900 - 256 - 4, 256 + 4)
    on = logits_last(rf)
    rf.set_ridgefill(False)
    rf.reset()
    rf.eval(prose_tokens[:900])
    off = logits_last(rf)
    assert not np.array_equal(on, off)           # the filled cache is approximate ...
    p, q = np.exp(off - off.max()), np.exp(on - on.max())
    p, q = p / p.sum(), q / q.sum()
    assert (p * np.log(p / q)).sum() < 0.5       # ... but close
    assert on.argmax() == off.argmax()


def test_prompt_shorter_than_sink_plus_tail_is_all_exact(rf, prose_tokens):
    rf.set_ridgefill(True, tail_tokens=256)
    rf.reset()
    rf.eval(prose_tokens[:200])
    assert rf.ridgefill_counts() == (0, 200)


def test_tail_boundary_inside_one_batch_and_chunked_prompts(rf, prose_tokens):
    """One 1,200-token batch crosses sink→approx→tail; the same prompt in 300-token batches matches it."""
    rf.set_ridgefill(True, tail_tokens=300)
    rf.reset()
    rf.eval(prose_tokens)
    one = logits_last(rf)
    assert rf.ridgefill_counts() == (1200 - 300 - 4, 304)
    rf.n_batch = 300          # the same prompt arriving in four batches
    rf.reset()
    rf.eval(prose_tokens)
    rf.n_batch = CTX["n_batch"]
    np.testing.assert_allclose(logits_last(rf), one, rtol=1e-4, atol=1e-3)
    assert rf.ridgefill_counts() == (1200 - 300 - 4, 304)


def test_decode_steps_are_exact_and_completion_works(rf, prose_tokens):
    rf.set_ridgefill(True, tail_tokens=256)
    rf.reset()
    prompt = rf.detokenize(prose_tokens[1:700]).decode(errors="ignore")
    out = rf.create_completion(prompt, max_tokens=6, temperature=0.0)
    n_prompt = out["usage"]["prompt_tokens"]
    n_approx, n_exact = rf.ridgefill_counts()
    assert n_approx == n_prompt - 256 - 4
    assert n_exact == 256 + 4 + out["usage"]["completion_tokens"] - 1  # the last sampled token is not evaluated


def test_predicted_layer_inputs_equal_the_maps(smollm2, maps20, prose_tokens):
    llm = ridgefill.Llama(str(smollm2), maps_path=str(maps20), tail_tokens=1, sink_tokens=4, **CTX)
    m = read_maps(maps20)
    h_, layers = lib(), [20, 21, 25, 29]
    for l in layers:
        assert h_.llama_ridgefill_capture_layer_input(llm.ctx, l, True)
    llm.set_ridgefill(True)
    llm.reset()
    toks = prose_tokens[:400]
    n = 296
    llm.eval(toks[:n])        # 4 sink rows, 291 approximate rows, 1 exact tail row
    got = {l: np.ctypeslib.as_array(h_.llama_ridgefill_layer_input(llm.ctx, l), shape=(n, 576)).copy() for l in layers}
    assert llm.ridgefill_counts() == (291, 5)
    h = got[20][4:n - 1].astype(np.float64)
    for l in (21, 25, 29):
        want = h @ m.weights[l].T.astype(np.float64) + m.biases[l]
        np.testing.assert_allclose(got[l][4:n - 1], want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
        assert not np.allclose(got[l][:4], got[20][:4] @ m.weights[l].T + m.biases[l], atol=1e-2)  # sink rows exact


def test_bad_maps_and_settings_are_refused(smollm2, gemma3, qwen2_smollm, maps20, tmp_path):
    with pytest.raises(RidgefillError, match="architecture qwen2 does not support RidgeFill yet"):
        ridgefill.Llama(str(qwen2_smollm), maps_path=str(maps20), n_ctx=256, verbose=False)
    with pytest.raises(RidgefillError, match="maps for a 30-layer model, this model has 18"):
        ridgefill.Llama(str(gemma3), maps_path=str(maps20), n_ctx=256, verbose=False)
    other = tmp_path / "other.gguf"             # same architecture and shapes, other weights
    data = bytearray(smollm2.read_bytes())
    t = next(t for t in open_gguf(smollm2).tensors if t.name == "blk.0.attn_k.weight")
    data[t.data_offset + 10] ^= 0xFF
    other.write_bytes(bytes(data))
    with pytest.raises(RidgefillError, match="maps for another model"):
        ridgefill.Llama(str(other), maps_path=str(maps20), n_ctx=256, verbose=False)
    with pytest.raises(RidgefillError, match="holds no RidgeFill maps"):
        ridgefill.Llama(str(smollm2), n_ctx=256, verbose=False)   # a plain model has no maps
    broken = tmp_path / "truncated.gguf"
    broken.write_bytes(maps20.read_bytes()[:100_000])
    with pytest.raises(RidgefillError, match="truncated"):
        ridgefill.Llama(str(smollm2), maps_path=str(broken), n_ctx=256, verbose=False)
    with pytest.raises(RidgefillError, match="tail_tokens must be >= 1"):
        ridgefill.Llama(str(smollm2), maps_path=str(maps20), tail_tokens=0, n_ctx=256, verbose=False)
    with pytest.raises(RidgefillError, match="sink_tokens must be >= 0"):
        ridgefill.Llama(str(smollm2), maps_path=str(maps20), sink_tokens=-1, n_ctx=256, verbose=False)


def test_augmented_model_loads_and_runs(smollm2, maps20, tmp_path, prose_tokens):
    from ridgefill.ggufio import export
    aug = tmp_path / "smollm2.ridgefill.gguf"
    export(smollm2, maps20, aug)
    plain = StockLlama(model_path=str(aug), **CTX)       # a stock load ignores the maps
    plain.eval(prose_tokens[:500])
    want = logits_last(plain)
    del plain
    llm = ridgefill.Llama(str(aug), tail_tokens=200, **CTX)
    assert llm.split_layer == 20
    llm.set_ridgefill(False)
    llm.reset()
    llm.eval(prose_tokens[:500])
    np.testing.assert_array_equal(logits_last(llm), want)
    llm.set_ridgefill(True)
    llm.reset()
    llm.eval(prose_tokens[:500])
    assert llm.ridgefill_counts() == (500 - 200 - 4, 204)


def test_gemma3_sliding_window_prompt(gemma3, gemma_maps):
    """Gemma 3: sliding-window (512) and global layers; a 1,500-token prompt crosses the window."""
    from ridgefill import data
    ctx = dict(CTX, n_ctx=2048)
    stock = StockLlama(model_path=str(gemma3), **ctx)
    toks = stock.tokenize(data.text("shakespeare")[:20000].encode())[:1500]
    stock.eval(toks)
    want = logits_last(stock)
    del stock
    llm = ridgefill.Llama(str(gemma3), maps_path=str(gemma_maps), tail_tokens=256, **ctx)
    llm.set_ridgefill(False)
    llm.reset()
    llm.eval(toks)
    np.testing.assert_array_equal(logits_last(llm), want)          # off: bit-identical to stock
    llm.set_ridgefill(True)
    llm.reset()
    llm.eval(toks)
    assert llm.ridgefill_counts() == (1500 - 256 - 4, 260)
    on = logits_last(llm)
    p, q = np.exp(want - want.max()), np.exp(on - on.max())
    p, q = p / p.sum(), q / q.sum()
    assert (p * np.log(p / q)).sum() < 0.5 and on.argmax() == want.argmax()
    llm.n_batch = 400                                               # the same prompt in four batches
    llm.reset()
    llm.eval(toks)
    np.testing.assert_allclose(logits_last(llm), on, rtol=1e-4, atol=1e-3)


def test_qwen3_synthetic(qwen3_synthetic, qwen3_maps, prose_tokens):
    """qwen3 (q/k norms before RoPE), on a synthetic model: off = stock, on = maps, chunked = one batch."""
    stock = StockLlama(model_path=str(qwen3_synthetic), **CTX)
    stock.eval(prose_tokens[:700])
    want = logits_last(stock)
    del stock
    llm = ridgefill.Llama(str(qwen3_synthetic), maps_path=str(qwen3_maps), tail_tokens=200, **CTX)
    llm.set_ridgefill(False)
    llm.reset()
    llm.eval(prose_tokens[:700])
    np.testing.assert_array_equal(logits_last(llm), want)
    h_ = lib()
    for l in (20, 27):
        assert h_.llama_ridgefill_capture_layer_input(llm.ctx, l, True)
    llm.set_ridgefill(True)
    llm.reset()
    llm.eval(prose_tokens[:700])
    assert llm.ridgefill_counts() == (700 - 200 - 4, 204)
    one = logits_last(llm)
    m = read_maps(qwen3_maps)
    llm.n_batch = 250                       # the last batch holds only tail rows; check the maps on a fresh run
    llm.reset()
    llm.eval(prose_tokens[:250])           # 4 sink + 46 approximate rows + 200 tail rows
    got = {l: np.ctypeslib.as_array(h_.llama_ridgefill_layer_input(llm.ctx, l), shape=(250, 576)).copy()
           for l in (20, 27)}
    llm.reset()
    llm.tail_tokens = 200
    llm.eval(prose_tokens[:700])
    np.testing.assert_allclose(logits_last(llm), one, rtol=1e-4, atol=1e-3)
    assert llm.ridgefill_counts() == (700 - 200 - 4, 204)
    h = got[20][4:46].astype(np.float64)
    want27 = h @ m.weights[27].T.astype(np.float64) + m.biases[27]
    np.testing.assert_allclose(got[27][4:46], want27, rtol=1e-3, atol=1e-3 * np.abs(want27).max())
