"""K/V maps and context features in the runtime: what the maps predict, where predecessors come from, and the
files the loader refuses.  Real engine, real SmolLM2 and Gemma 3 (qwen3 on the synthetic model)."""
import numpy as np
import pytest
from conftest import _calibrated, logits_last, n_threads
from gguf import GGUFReader

import ridgefill
from ridgefill import kvproj
from ridgefill._lib import lib
from ridgefill.errors import RidgefillError
from ridgefill.ggufio import copy_gguf, read_maps
from ridgefill.modelfile import open_gguf

CTX = dict(n_ctx=2048, n_batch=2048, n_ubatch=512, n_threads=n_threads(), verbose=False)
S = 20  # split layer of maps_kv20


def features(h: np.ndarray, rows: slice, C: int) -> np.ndarray:
    """f_t = [h_t, h_{t-1}, .., h_{t-C}] for the rows of h (one sequence, from position 0)."""
    idx = np.arange(h.shape[0])[rows]
    return np.concatenate([h[idx - j] for j in range(C + 1)], axis=1).astype(np.float64)


def run(model, maps, toks, n_ubatch=512, n_batch=2048, layers=(21, 25, 29), split=S, tail=1):
    """A fresh prefill of toks; returns (h at the split layer, {layer: predicted rows}, counts, last logits)."""
    llm = ridgefill.Llama(str(model), maps_path=str(maps), tail_tokens=tail, sink_tokens=4,
                          **dict(CTX, n_batch=n_batch, n_ubatch=n_ubatch))
    assert lib().llama_ridgefill_capture_layer_input(llm.ctx, split, True)
    llm.capture_predicted(True)
    llm.reset()
    llm.eval(toks)
    n = min(len(toks), n_batch)  # layer inputs and predictions are those of the last decode
    h = np.ctypeslib.as_array(lib().llama_ridgefill_layer_input(llm.ctx, split), shape=(n, llm.n_embd())).copy()
    return h, {l: llm.predicted(l) for l in layers}, llm.ridgefill_counts(), logits_last(llm)


def test_kv_maps_with_context_predict_what_numpy_does(smollm2, maps_kv20, prose_tokens):
    m = read_maps(maps_kv20)
    assert (m.map_kind, m.context_tokens) == ("kv", 2)
    llm = ridgefill.Llama(str(smollm2), maps_path=str(maps_kv20), **CTX)
    assert (llm.map_kind, llm.context_tokens) == ("kv", 2)
    del llm
    n = 296
    h, pred, counts, _ = run(smollm2, maps_kv20, prose_tokens[:n], n_ubatch=100)   # 3 ubatches
    assert counts == (n - 5, 5)                                    # 4 sink rows and 1 tail row are exact
    f = features(h, slice(4, n - 1), 2)                            # predecessors cross the sink and ubatch cuts
    for l, got in pred.items():
        assert got.shape == (n - 5, 384)                           # [K (3 heads x 64); V]
        want = f @ m.weights[l].T.astype(np.float64) + m.biases[l]
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * np.abs(want).max())
        without = features(h, slice(4, n - 1), 0) @ m.weights[l][:, :576].T + m.biases[l]
        assert not np.allclose(got, without, atol=1e-2 * np.abs(want).max())  # the predecessors count
    # the measuring scripts' K/V of a map file (kvproj.predicted) are the runtime's
    kvw = kvproj.load(open_gguf(smollm2), list(pred))
    for l, got in pred.items():
        k, v = kvproj.predicted(kvw[l], m.map_kind, m.weights[l], m.biases[l], f)
        assert k.shape == (n - 5, 3, 64)
        np.testing.assert_allclose(np.concatenate([k.reshape(n - 5, -1), v], 1), got, rtol=1e-3,
                                   atol=1e-4 * np.abs(got).max())


def test_context_features_do_not_depend_on_where_the_prompt_is_cut(smollm2, maps_kv20, prose_tokens):
    toks = prose_tokens[:700]
    base_h, base, counts, base_logits = run(smollm2, maps_kv20, toks, n_ubatch=512, tail=100)
    assert counts == (700 - 104, 104)
    for ub in (64, 37):                                            # other ubatch cuts: the same K/V bit for bit
        h, pred, c, logits = run(smollm2, maps_kv20, toks, n_ubatch=ub, tail=100)
        assert c == counts
        np.testing.assert_array_equal(h, base_h)
        for l in base:
            np.testing.assert_array_equal(pred[l], base[l])
        np.testing.assert_array_equal(logits, base_logits)
    for nb in (250, 97):                                           # several decodes: states carried across them
        _, _, c, logits = run(smollm2, maps_kv20, toks, n_ubatch=64, n_batch=nb, tail=100)
        assert c == counts
        np.testing.assert_array_equal(logits, base_logits)


def test_tokens_without_carried_predecessors_are_exact(smollm2, maps_kv20, maps20, prose_tokens):
    """A reused prefix ending where no state was kept: the first C new tokens are computed exactly."""
    first, second = prose_tokens[:300], prose_tokens[:200] + prose_tokens[600:700]
    for maps, C in ((maps20, 0), (maps_kv20, 2)):
        llm = ridgefill.Llama(str(smollm2), maps_path=str(maps), tail_tokens=1, sink_tokens=4, **CTX)
        llm.create_completion(first, max_tokens=1)                 # keeps the states of positions 298, 299
        llm.create_completion(second, max_tokens=1)                # reuses 200 cells: nothing kept for 198, 199
        assert llm.ridgefill_counts() == (100 - 1 - C, 1 + C)      # counts are per prompt
        assert llm.filled_ranges == ([(4, 299)] if C == 0 else [(4, 200), (202, 299)])
        llm.reset()                                                # a fresh prompt fills from the sink again
        llm.create_completion(second, max_tokens=1)
        assert llm.ridgefill_counts()[0] == 300 - 4 - 1
    # a loaded state carries no states either: the next tokens' predecessors are computed again, exactly
    llm.reset()
    llm.create_completion(first, max_tokens=1)
    llm.load_state(llm.save_state())
    llm.create_completion(first + prose_tokens[600:700], max_tokens=1)
    assert llm.ridgefill_counts() == (100 - 1 - 2, 1 + 2)
    # positions shifted or divided (context shift): the sequence's kept states are dropped, even for an empty range
    from llama_cpp import llama_cpp as C
    for change in (lambda mem: C.llama_memory_seq_add(mem, 0, 0, 0, 0), lambda mem: C.llama_memory_seq_div(mem, 0, 0, 0, 1)):
        llm.reset()
        llm.create_completion(first, max_tokens=1)
        llm.create_completion(first + prose_tokens[600:700], max_tokens=1)
        assert llm.ridgefill_counts() == (100 - 1, 1)                  # states kept: every new token filled
        change(C.llama_get_memory(llm.ctx))
        llm.create_completion(first + prose_tokens[600:800], max_tokens=1)
        assert llm.ridgefill_counts() == (100 - 1 - 2, 1 + 2)


def test_kv_maps_fill_the_cache_well(smollm2, maps_kv20, maps20, prose_tokens):
    """End to end, one prompt: kv maps with context features are no worse than input maps at split 20."""
    toks = prose_tokens[:1100]
    llm = ridgefill.Llama(str(smollm2), maps_path=str(maps20), tail_tokens=256, **CTX)
    llm.set_ridgefill(False)
    exact = llm.prompt_logits(toks, 1100 - 256)
    llm.set_ridgefill(True)
    inp = llm.prompt_logits(toks, 1100 - 256)
    kvllm = ridgefill.Llama(str(smollm2), maps_path=str(maps_kv20), tail_tokens=256, **CTX)
    kvllm.set_ridgefill(False)          # maps that read predecessors: exact graphs also copy out rows of h ...
    np.testing.assert_array_equal(kvllm.prompt_logits(toks, 1100 - 256), exact)   # ... and stay exact
    kvllm.set_ridgefill(True)
    kv = kvllm.prompt_logits(toks, 1100 - 256)

    def kl(a, b):
        la, lb = (x - x.max(-1, keepdims=True) for x in (a.astype(np.float64), b.astype(np.float64)))
        la, lb = la - np.log(np.exp(la).sum(-1, keepdims=True)), lb - np.log(np.exp(lb).sum(-1, keepdims=True))
        return float((np.exp(la) * (la - lb)).sum(-1).mean())
    assert kl(exact, kv) < 0.1 and kl(exact, kv) < 1.5 * kl(exact, inp)


def test_gemma3_and_qwen3_kv_maps(gemma3, qwen3_synthetic, prose_tokens, tmp_path_factory):
    d = tmp_path_factory.mktemp("kvmaps")
    g = _calibrated(gemma3, 12, 2048, d / "gemma3-kv.gguf", map_kind="kv", context_tokens=1)
    q = _calibrated(qwen3_synthetic, 20, 2048, d / "qwen3-kv.gguf", map_kind="kv", context_tokens=1)
    from ridgefill import data
    gtoks = ridgefill.Llama(str(gemma3), maps_path=str(g), **CTX).tokenize(data.text("shakespeare")[:20000].encode())
    for model, maps, toks, split, layers in ((gemma3, g, gtoks[:700], 12, (13, 17)),    # 13 sliding, 17 global
                                             (qwen3_synthetic, q, prose_tokens[:300], 20, (21, 29))):
        m = read_maps(maps)
        h, pred, counts, _ = run(model, maps, toks, n_ubatch=128, layers=layers, split=split)
        n = len(toks)
        assert counts == (n - 5, 5)
        for l, got in pred.items():
            want = features(h, slice(4, n - 1), 1) @ m.weights[l].T.astype(np.float64) + m.biases[l]
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


def relabelled(src, out, **keys):
    """A copy of a map file with some ridgefill.* keys given other values (the old ones renamed away)."""
    def add(w):
        for k, v in keys.items():
            (w.add_string if isinstance(v, str) else w.add_uint32)("ridgefill." + k, v)
    copy_gguf(GGUFReader(src), out, rename_key=lambda k: "old." + k if k[len("ridgefill."):] in keys else k, add_keys=add)
    return out


def test_bad_kv_files_are_refused_by_the_runtime(smollm2, maps_kv20, tmp_path):
    cases = [({"map_kind": "foo"}, "map_kind 'foo' is not one this build knows"),
             ({"format_version": 4}, "format_version 4 is not one this build reads"),
             ({"context_tokens": 3}, "context_tokens 3 outside 0..2"),
             ({"context_tokens": 1}, r"expected f32/f16/q8_0 \[1152, 384\]"),      # the tensors are for 2
             ({"map_kind": "input"}, r"expected f32/f16/q8_0 \[1728, 576\]"),
             ({"sink_tokens": 1}, "sink_tokens 1 is below context_tokens 2")]
    for i, (keys, msg) in enumerate(cases):
        bad = relabelled(maps_kv20, tmp_path / f"bad{i}.gguf", **keys)
        with pytest.raises(RidgefillError, match=msg):
            ridgefill.Llama(str(smollm2), maps_path=str(bad), n_ctx=256, verbose=False)


def test_old_input_map_files_load_as_input_maps(smollm2, maps20, tmp_path, prose_tokens):
    """A map file written before map kinds (no format_version/map_kind/context_tokens) gives today's results."""
    old = tmp_path / "old.gguf"
    drop = ("ridgefill.format_version", "ridgefill.map_kind", "ridgefill.context_tokens")
    copy_gguf(GGUFReader(maps20), old, rename_key=lambda k: "dropped." + k if k in drop else k)
    a = ridgefill.Llama(str(smollm2), maps_path=str(old), tail_tokens=256, **CTX)
    b = ridgefill.Llama(str(smollm2), maps_path=str(maps20), tail_tokens=256, **CTX)
    assert (a.map_kind, a.context_tokens) == ("input", 0)
    np.testing.assert_array_equal(a.prompt_logits(prose_tokens[:800], 700), b.prompt_logits(prose_tokens[:800], 700))
    assert read_maps(old).map_kind == "input"


def test_server_with_kv_maps(smollm2, maps_kv20, prose_tokens):
    """ridgefill-server with kv maps and context features: /props, timings, and a chat-like next request."""
    import requests

    from ridgefill.server import Server
    tail, sink = 200, 4
    first, more = prose_tokens[1:900], prose_tokens[900:1200]
    with Server(smollm2, "-c", "4096", "-b", "2048", "-t", str(n_threads()), "-np", "1", "-fa", "off",
                "--ridgefill-maps", str(maps_kv20), "--ridgefill-tail", str(tail), "--ridgefill-sink", str(sink)) as srv:
        rf = srv.get("/props")["ridgefill"]
        assert (rf["map_kind"], rf["context_tokens"], rf["split_layer"]) == ("kv", 2, 20)

        def complete(tokens, **body):
            r = requests.post(srv.url + "/completion", json={"prompt": tokens, "n_predict": 4, "temperature": 0.0,
                                                              **body}, timeout=600)
            assert r.status_code == 200, r.text
            return r.json()
        one = complete(first, n_predict=1)                       # the one sampled token is not decoded
        n1 = one["timings"]["prompt_n"]
        assert one["timings"]["ridgefill_filled_n"] == n1 - tail - sink
        two = complete(first + more)                             # reuses the first prompt's cells
        t = two["timings"]
        n2, reused = t["prompt_n"] + t["cache_n"], t["cache_n"]
        assert n1 - 8 <= reused <= n1
        # the states of the reused prefix's last positions were kept: every new token before the tail is filled
        assert t["ridgefill_filled_n"] == n2 - tail - reused
        exact = complete(first + more, ridgefill=False, cache_prompt=False)
        assert exact["timings"]["ridgefill_filled_n"] == 0


def test_eval_compares_map_files_on_the_same_prompts(smollm2, maps20, maps_kv20, tmp_path):
    import json

    from conftest import run_cli
    out = tmp_path / "cmp.json"
    r = run_cli("ridgefill", "eval", str(smollm2), "--maps", str(maps20), "--compare-maps", str(maps_kv20),
                "--task", "kl", "--lengths", "400", "--tail-tokens", "64", "--prompts", "2", "--domains",
                "shakespeare", "-t", str(n_threads()), "--json", str(out))
    assert r.returncode == 0, r.stderr
    modes = json.loads(out.read_text())["domains"]["shakespeare"]["tail@400"]["modes"]
    assert set(modes) == {"ridgefill", f"maps:{maps_kv20.stem}"}
    assert modes["ridgefill"]["kl"][0] != modes[f"maps:{maps_kv20.stem}"]["kl"][0]
    assert f"maps:{maps_kv20.stem}" in r.stdout
