"""ridgefill.Llama across calls: prefix reuse under the fill-record rule, logprobs, saved states, maps
and settings the runtime must refuse (through the C++ loader, not only Python's)."""
import numpy as np
import pytest
from conftest import logits_last, n_threads
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from llama_cpp import Llama as StockLlama

import ridgefill
from ridgefill import ggufio
from ridgefill._lib import check, lib
from ridgefill.errors import RidgefillError
from ridgefill.modelfile import open_gguf

CTX = dict(n_ctx=2048, n_batch=2048, n_ubatch=512, n_threads=n_threads(), verbose=False)
TAIL = 128


@pytest.fixture(scope="module")
def prompts(smollm2, prose_tokens):
    vocab = StockLlama(model_path=str(smollm2), n_ctx=256, verbose=False, vocab_only=True)
    return [vocab.detokenize(prose_tokens[a:b]).decode(errors="ignore") for a, b in ((1, 700), (700, 1000))]


def exact_logits(model, tokens):
    stock = StockLlama(model_path=str(model), **CTX)
    stock.eval(tokens)
    return logits_last(stock)


def test_chat_turn_reuses_the_cache_and_an_exact_call_does_not(smollm2, maps20, prompts):
    llm = ridgefill.Llama(str(smollm2), maps_path=str(maps20), tail_tokens=TAIL, **CTX)
    first = llm.create_completion(prompts[0], max_tokens=8, temperature=0.0)
    n1 = first["usage"]["prompt_tokens"]
    assert llm.filled_ranges == [(4, n1 - TAIL)]
    turn2 = prompts[0] + first["choices"][0]["text"] + prompts[1]
    second = llm.create_completion(turn2, max_tokens=1, temperature=0.0)
    n2 = second["usage"]["prompt_tokens"]
    filled, exact = llm.ridgefill_counts()
    assert filled + exact < n2 - n1 + 16                     # only the new part was prefilled ...
    assert filled > 0 and llm.filled_ranges[0] == (4, n1 - TAIL)  # ... and its bulk filled
    assert llm.filled_ranges[-1][1] == n2 - TAIL

    llm.set_ridgefill(False)                                 # an exact call keeps only the sink rows
    tokens = llm.tokenize(turn2.encode())
    llm.create_completion(turn2, max_tokens=1, temperature=0.0)
    assert llm.ridgefill_counts() == (0, n2 - 4)
    assert llm.filled_ranges == []
    np.testing.assert_allclose(logits_last(llm), exact_logits(smollm2, tokens), rtol=1e-4, atol=2e-3)

    llm.set_ridgefill(True)                                  # exact cells serve an approximate call
    llm.create_completion(turn2, max_tokens=1, temperature=0.0)
    assert llm.ridgefill_counts() == (0, 0)                   # nothing to evaluate: the logits are live


def test_saved_state_carries_the_record(smollm2, maps20, prompts):
    llm = ridgefill.Llama(str(smollm2), maps_path=str(maps20), tail_tokens=TAIL, **CTX)
    llm.create_completion(prompts[0], max_tokens=1, temperature=0.0)
    state, filled = llm.save_state(), llm.filled_ranges
    llm.reset()
    llm.load_state(state)
    assert llm.filled_ranges == filled and filled
    llm.set_ridgefill(False)
    llm.create_completion(prompts[0], max_tokens=1, temperature=0.0)
    assert llm.ridgefill_counts()[1] == state.n_tokens - 4   # recomputed after the sink rows


def test_logprobs_exact_path_equals_stock(smollm2, maps20, prompts):
    kw = dict(max_tokens=4, temperature=0.0, logprobs=3)
    stock = StockLlama(model_path=str(smollm2), logits_all=True, **CTX)
    want = [stock.create_completion(prompts[0], **kw), stock.create_completion(prompts[1][:400], echo=True, **kw)]
    del stock
    llm = ridgefill.Llama(str(smollm2), maps_path=str(maps20), tail_tokens=TAIL, ridgefill=False, logits_all=True,
                          **CTX)
    got = [llm.create_completion(prompts[0], **kw), llm.create_completion(prompts[1][:400], echo=True, **kw)]
    for g, w in zip(got, want):
        assert g["choices"][0]["text"] == w["choices"][0]["text"]
        gl, wl = g["choices"][0]["logprobs"], w["choices"][0]["logprobs"]
        assert gl["tokens"] == wl["tokens"]
        np.testing.assert_allclose(np.array(gl["token_logprobs"][1:], dtype=float),
                                   np.array(wl["token_logprobs"][1:], dtype=float), atol=1e-4)


def test_logprobs_with_ridgefill_come_from_exact_rows(smollm2, maps20, prompts):
    llm = ridgefill.Llama(str(smollm2), maps_path=str(maps20), tail_tokens=TAIL, logits_all=True, **CTX)
    tokens = llm.tokenize(prompts[0].encode())
    n = len(tokens)
    out = llm.create_completion(prompts[0], max_tokens=3, temperature=0.0, logprobs=2)
    scores = llm.scores[:llm.n_tokens]
    assert np.isnan(scores[4:n - TAIL]).all()                        # filled rows have no logits ...
    assert np.isfinite(scores[:4]).all() and np.isfinite(scores[n - TAIL:]).all()  # ... every other row has
    ref = llm.prompt_logits(tokens, n - 1)[-1].astype(np.float64)    # a fresh RidgeFill prefill, last row
    logp = ref - ref.max() - np.log(np.exp(ref - ref.max()).sum())
    first = out["choices"][0]["logprobs"]["token_logprobs"][0]
    assert first == pytest.approx(logp.max(), abs=1e-3)


def test_sink_below_the_maps_is_refused(smollm2, maps20):
    with pytest.raises(RidgefillError, match="below the 4 the maps were calibrated with"):
        ridgefill.Llama(str(smollm2), maps_path=str(maps20), sink_tokens=2, n_ctx=256, verbose=False)
    llm = ridgefill.Llama(str(smollm2), maps_path=str(maps20), n_ctx=256, verbose=False)
    assert llm.sink_tokens == 4                                     # the maps' own by default
    with pytest.raises(RidgefillError, match="below the 4"):
        check(lib().llama_ridgefill_set_sink_tokens(llm.ctx, 3))
    check(lib().llama_ridgefill_set_sink_tokens(llm.ctx, 8))       # more exact rows are fine
    assert lib().llama_ridgefill_sink_tokens(llm.ctx) == 8


def rewrite_maps(src, out, *, keys=None, tensors=None):
    """A copy of a map file with keys replaced ({name: (value, GGUFValueType)}) and tensors transformed
    ({name: fn(array) -> array}), written without Python's validation so that the C++ loader is what checks."""
    from gguf import GGUFValueType
    r = open_gguf(src)
    w = GGUFWriter(out, arch=ggufio.field_value(r, "general.architecture"))
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or f.name in (keys or {}):
            continue
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    for name, (value, vtype) in (keys or {}).items():
        w.add_key_value(name, value, vtype)
    for t in r.tensors:
        data = np.array(t.data)
        data = (tensors or {}).get(t.name, lambda a: a)(data)
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type if t.tensor_type != GGMLQuantizationType.F32 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_cpp_loader_refuses_bad_maps(smollm2, maps20, tmp_path):
    from gguf import GGUFValueType
    nan = lambda a: np.where(np.arange(a.size).reshape(a.shape) == 3, np.nan, a).astype(a.dtype)  # noqa: E731
    cases = {
        "split-as-string": (dict(keys={"ridgefill.split_layer": ("20", GGUFValueType.STRING)}),
                            "key ridgefill.split_layer has GGUF type str, expected an integer"),
        "fingerprint-as-int": (dict(keys={"ridgefill.base_fingerprint": (7, GGUFValueType.UINT32)}),
                               "key ridgefill.base_fingerprint has GGUF type u32, expected a string"),
        "nan-bias": (dict(tensors={"ridgefill.blk.25.map.bias": nan}), "ridgefill.blk.25.map.bias holds NaN or Inf"),
        "short-bias": (dict(tensors={"ridgefill.blk.25.map.bias": lambda a: a[:-1]}),
                       "tensor ridgefill.blk.25.map.bias has type f32 and shape [575"),
        "negative-sink": (dict(keys={"ridgefill.sink_tokens": (-3, GGUFValueType.INT32)}), "sink_tokens -3 is negative"),
    }
    for name, (edit, message) in cases.items():
        bad = rewrite_maps(maps20, tmp_path / f"{name}.gguf", **edit)
        with pytest.raises(RidgefillError, match=message.replace("[", r"\[")):
            ridgefill.Llama(str(smollm2), maps_path=str(bad), n_ctx=256, verbose=False)


def test_python_reader_refuses_stray_tensors(maps20, tmp_path):
    from ridgefill.ggufio import copy_gguf
    stray = tmp_path / "stray.gguf"
    copy_gguf(GGUFReader(maps20), stray, extra_tensors=[("ridgefill.notes", np.zeros(4, np.float32),
                                                         GGMLQuantizationType.F32)])
    with pytest.raises(RidgefillError, match="unexpected tensor 'ridgefill.notes'"):
        ggufio.read_maps(stray)


def test_loading_maps_again_rebuilds_the_graph(smollm2, maps20, tmp_path, prose_tokens):
    """Graph reuse is keyed on the maps' load, not their address: after loading other maps on the same
    context the next prefill uses them (a freed and reallocated buffer may sit at the same address)."""
    half = rewrite_maps(maps20, tmp_path / "half.gguf",
                        tensors={f"ridgefill.blk.{l}.map.weight": (lambda a: (a * 0.5).astype(a.dtype))
                                 for l in range(21, 30)})
    fresh = ridgefill.Llama(str(smollm2), maps_path=str(half), tail_tokens=TAIL, **CTX)
    fresh.eval(prose_tokens[:600])
    want = logits_last(fresh)
    del fresh
    llm = ridgefill.Llama(str(smollm2), maps_path=str(maps20), tail_tokens=TAIL, **CTX)
    llm.eval(prose_tokens[:600])
    first = logits_last(llm)
    for _ in range(2):
        check(lib().llama_ridgefill_load_maps(llm.ctx, str(half).encode(), str(smollm2).encode()))
        llm.reset()
        llm.eval(prose_tokens[:600])
        np.testing.assert_array_equal(logits_last(llm), want)
    assert not np.array_equal(first, want)
