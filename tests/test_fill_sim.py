"""scripts/fill_sim.py replays the runtime's fill in numpy: docs/maps.md's offline measurements rest on it."""
import sys

import numpy as np

from conftest import ROOT, n_threads

sys.path.insert(0, str(ROOT / "scripts"))
import fill_sim  # noqa: E402


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    lp, lq = fill_sim.log_softmax(p_logits), fill_sim.log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def _model_and_acts(smollm2, maps20, toks):
    """The numpy model, the map file's sink, and every layer's exact input for toks, captured through the fork."""
    from ridgefill.calibrate import LayerInputs
    from ridgefill.ggufio import read_maps
    model = fill_sim.NumpyLlama(str(smollm2))
    runner = LayerInputs(smollm2, list(range(model.n_layer)), len(toks) + 40, n_threads())
    return model, read_maps(maps20).sink_tokens, runner.run(np.asarray(toks, dtype=np.int32))


def test_fill_sim_replays_the_runtime(smollm2, maps20, prose_tokens):
    """With exact K/V the numpy tail reproduces the fork's layer inputs; with a map file its tail logits are the
    runtime's RidgeFill logits, far closer to them than the fill moves the logits."""
    import ridgefill
    toks, tail, s = prose_tokens[:600], 100, 20
    model, sink, acts = _model_and_acts(smollm2, maps20, toks)
    v = fill_sim.parse_variant(str(maps20))
    sim_exact, got, check = fill_sim.run_prompt(model, s, acts, tail, sink, [v])
    assert check < 0.03                                       # numpy vs ggml arithmetic (Q4_1 weights)

    llm = ridgefill.Llama(str(smollm2), maps_path=str(maps20), tail_tokens=tail, n_ctx=640, n_batch=640,
                          n_ubatch=640, n_threads=n_threads(), n_threads_batch=n_threads(), verbose=False,
                          guard=False)
    llm.set_ridgefill(False)
    rt_exact = llm.prompt_logits(toks, len(toks) - tail)
    llm.set_ridgefill(True)
    rt_fill = llm.prompt_logits(toks, len(toks) - tail)
    assert llm.ridgefill_counts() == (len(toks) - tail - sink, tail + sink)
    fill_effect = _kl(rt_exact, rt_fill)
    assert fill_effect > 1e-3                                  # the fill moves the logits measurably
    assert _kl(rt_exact, sim_exact) < 0.2 * fill_effect        # the numpy model is the fork's ...
    assert _kl(rt_fill, got[v.name]) < 0.2 * fill_effect       # ... and so is its fill
    assert abs(_kl(sim_exact, got[v.name]) - fill_effect) < 0.25 * fill_effect


def test_fill_sim_variants_parse():
    vs, bases = fill_sim.parse_variants(["input-c1", "input-c1@k17-18+v20+m21", "mix8-kv-c0"])
    assert [b.name for b in bases] == ["input-c1", "mix8-kv-c0"]
    assert vs[1].base is vs[0] and vs[1].exact_k == {17, 18} and vs[1].exact_v == {20} and vs[1].hidden == {21}
    assert (vs[2].kind, vs[2].C, vs[2].mix) == ("kv", 0, 8)


def test_fill_sim_band(smollm2, maps20, prose_tokens):
    """An exact band (window 0) in front of split-20 maps is split 20; a band computed in numpy with a window wider
    than the prompt is the exact band; a narrow window changes the fill; the FLOP limits order accordingly."""
    toks, tail = prose_tokens[:1100], 100
    model, sink, acts = _model_and_acts(smollm2, maps20, toks)
    s20 = fill_sim.parse_variant(str(maps20))
    band, wide, narrow = (fill_sim.parse_variant(f"band5{w}-{maps20}") for w in ("", "w100000", "w32"))
    assert (band.band, band.window, wide.window, narrow.window) == (5, 0, 100000, 32)
    ex20, got20, _ = fill_sim.run_prompt(model, 20, acts, tail, sink, [s20])
    unwindowed = fill_sim.parse_variant(f"band5w32f15.16.17.18.19-{maps20}")     # every band layer left unwindowed
    assert unwindowed.full == frozenset(range(15, 20))
    ex15, got15, _ = fill_sim.run_prompt(model, 15, acts, tail, sink, [band, wide, narrow, unwindowed])
    ref = _kl(ex20, got20[s20.name])
    assert ref > 1e-3
    assert _kl(ex15, ex20) < 0.02 * ref and _kl(got15[band.name], got20[s20.name]) < 0.02 * ref   # numpy vs ggml
    assert _kl(got15[wide.name], got15[band.name]) < 0.02 * ref    # the band's layers in numpy: 512-row blocks
    assert _kl(got15[narrow.name], got15[band.name]) > 0.02 * ref
    assert _kl(got15[unwindowed.name], got15[band.name]) < 0.02 * ref
    shape = fill_sim.bench.Shape.of(str(smollm2))
    limit = lambda v, s: fill_sim.flop_limit(shape, v, s, len(toks), tail, sink)  # noqa: E731
    assert limit(band, 15) == limit(s20, 20) and limit(wide, 15) == limit(s20, 20)
    assert abs(limit(unwindowed, 15) / limit(s20, 20) - 1) < 1e-12
    assert limit(s20, 20) < limit(narrow, 15) < limit(fill_sim.parse_variant(str(maps20)), 15)


def test_fill_sim_window_sees_the_sink_and_w_latest_keys(smollm2):
    """The windowed attention (by blocks of rows) equals full attention row by row with every key outside the sink
    and the row's w latest positions hidden."""
    model = fill_sim.NumpyLlama(str(smollm2))
    rng = np.random.default_rng(0)
    n, sink, w, lo = 1100, 4, 37, 4
    x = rng.standard_normal((n, model.d)).astype(np.float32)
    K, V = model.kv(3, x)
    xn = fill_sim.rms_norm(x[lo:], model.layers[3].attn_norm, model.eps)
    pos = np.arange(lo, n)
    got = model.attend(3, xn, pos, K, V, window=(w, sink))
    for r in (0, 30, 36, 37, 500, 511, 512, 1095):
        p = pos[r]
        want = model.attend(3, xn[r:r + 1], pos[r:r + 1], K, V, hidden=slice(sink, max(sink, p - w + 1)))
        np.testing.assert_allclose(got[r], want[0], rtol=1e-4, atol=1e-5)


def test_fill_sim_strided_window_weights_the_far_keys(smollm2):
    """A window with a stride also sees every stride-th key before the window (from the sink on), each with
    +ln(stride) in its score: full attention row by row under that additive mask.  Stride 1 is the full attention."""
    model = fill_sim.NumpyLlama(str(smollm2))
    rng = np.random.default_rng(1)
    n, sink, w, lo = 1100, 4, 37, 4
    x = rng.standard_normal((n, model.d)).astype(np.float32)
    K, V = model.kv(3, x)
    L = model.layers[3]
    xn = fill_sim.rms_norm(x[lo:], L.attn_norm, model.eps)
    pos = np.arange(lo, n)
    q = model.rope((xn @ L.wq.T).reshape(len(xn), model.n_head, model.hd), pos)
    Kr = model.rope(K, np.arange(n))
    for stride in (8, 5):
        got = model.attend(3, xn, pos, K, V, window=(w, sink, stride))
        for r in (0, 40, 512, 700, 1095):
            p, j = pos[r], np.arange(n)
            far = (j >= sink) & (j <= p - w) & (j % stride == 0)
            mask = np.where((j <= p) & ((j < sink) | (j > p - w)), 0, np.where(far, np.log(stride), -np.inf))
            want = model.softmax_av(q[r:r + 1], Kr, V, mask[None, :].astype(np.float32)).reshape(1, -1) @ L.wo.T
            np.testing.assert_allclose(got[r], want[0], rtol=1e-4, atol=1e-5)
    full = model.attend(3, xn, pos, K, V)
    np.testing.assert_allclose(model.attend(3, xn, pos, K, V, window=(w, sink, 1)), full, rtol=1e-4, atol=1e-5)


def test_fill_sim_unwindowed_heads(smollm2):
    """bandBwWhN: the query heads of the chosen kv heads attend to every earlier key, the others keep the window;
    the heads chosen are those whose window changes the residual stream most (head_scores); FLOPs count them."""
    model = fill_sim.NumpyLlama(str(smollm2))
    rng = np.random.default_rng(2)
    n, sink, w, lo, g = 1100, 4, 37, 4, model.n_head // model.n_kv
    x = rng.standard_normal((n, model.d)).astype(np.float32)
    K, V = model.kv(3, x)
    xn = fill_sim.rms_norm(x[lo:], model.layers[3].attn_norm, model.eps)
    pos = np.arange(lo, n)
    full = model.attend_heads(3, xn, pos, K, V)
    win = model.attend_heads(3, xn, pos, K, V, window=(w, sink))
    got = model.attend_heads(3, xn, pos, K, V, window=(w, sink), full_heads=frozenset({1}))
    np.testing.assert_allclose(got[:, g:2 * g], full[:, g:2 * g], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.delete(got, np.s_[g:2 * g], axis=1), np.delete(win, np.s_[g:2 * g], axis=1))
    every = model.attend(3, xn, pos, K, V, window=(w, sink), full_heads=frozenset(range(model.n_kv)))
    np.testing.assert_allclose(every, model.attend(3, xn, pos, K, V), rtol=1e-4, atol=1e-5)

    acts = np.stack([x] * 6)                    # layer inputs of layers 0..5 (the same rows: a shape check)
    scores = fill_sim.head_scores(model, 3, 2, w, sink, acts)
    assert scores.shape == (2, model.n_kv) and (scores > 0).all()
    assert fill_sim.head_scores(model, 3, 2, n, sink, acts).sum() == 0     # a window over the whole text: no change
    v = fill_sim.parse_variant("band2w37h2-input-c0")
    assert (v.band, v.window, v.heads, v.stride) == (2, 37, 2, 0)
    picked = fill_sim.select_heads(v, np.array([[1.0, 5.0, 0.5], [4.0, 0.1, 0.2]]), 3)
    assert picked == {3: frozenset({1}), 4: frozenset({0})}
    assert fill_sim.parse_variant("band10w512x8h3f12-input-c0").heads == 3

    shape = fill_sim.bench.Shape.of(str(smollm2))
    limit = lambda spec: fill_sim.flop_limit(shape, fill_sim.parse_variant(spec), 10, 8192, 1024, 4)  # noqa: E731
    all_heads, all_layers = f"band10w1024h{10 * model.n_kv}-input-c0", "band10w1024f" + ".".join(
        str(l) for l in range(10, 20)) + "-input-c0"
    assert abs(limit(all_heads) / limit(all_layers) - 1) < 1e-12
    assert limit(all_layers) < limit("band10w1024h6-input-c0") < limit("band10w1024h3-input-c0") \
        < limit("band10w1024-input-c0")


def test_kl_ratio_reads_fill_sim_json(tmp_path):
    """scripts/kl_ratio.py pairs fill_sim's variants prompt by prompt and refuses runs over other prompts."""
    import json
    import subprocess
    run = {"length": 8192, "tail_tokens": 1024, "skip_tokens": 0,
           "kl": {"brown": {"a": [0.01, 0.02, 0.03, 0.04], "b": [0.02, 0.04, 0.06, 0.08]}}}
    (tmp_path / "r.json").write_text(json.dumps(run))
    run["kl"]["brown"] = {"a": [0.01, 0.02]}
    (tmp_path / "other.json").write_text(json.dumps(run))
    script = [sys.executable, str(ROOT / "scripts" / "kl_ratio.py")]
    out = subprocess.run(script + [f"{tmp_path}/r.json:a", f"{tmp_path}/r.json:b", "--digits", "3"],
                         capture_output=True, text=True, check=True).stdout
    assert "| 2.000 [2.000, 2.000] | 2.00–2.00 | 4/4 |" in out
    bad = subprocess.run(script + [f"{tmp_path}/r.json:a", f"{tmp_path}/other.json:a"], capture_output=True, text=True)
    assert bad.returncode != 0 and "other prompts" in bad.stderr
    bad = subprocess.run(script + [f"{tmp_path}/r.json:a", f"{tmp_path}/r.json:c"], capture_output=True, text=True)
    assert bad.returncode != 0 and "no variant 'c'" in bad.stderr
