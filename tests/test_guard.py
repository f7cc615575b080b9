"""The out-of-distribution guard: canary rows decide, per prompt, whether the maps may fill it.

Real engine, real SmolLM2; maps fitted on Brown, as `calibrate` writes them (the `guarded20` fixture).
Foreign text: Python source (the standard library of this interpreter, no download)."""
import numpy as np
import pytest
import requests
from conftest import n_threads
from gguf import GGUFReader

import ridgefill
from ridgefill import data, guard, kvproj, ridge
from ridgefill.calibrate import LayerInputs
from ridgefill.errors import RidgefillError
from ridgefill.ggufio import copy_gguf, read_maps
from ridgefill.modelfile import open_gguf
from ridgefill.server import Server

CTX = dict(n_ctx=2048, n_batch=2048, n_ubatch=512, n_threads=n_threads(), verbose=False)
SINK, TAIL, W = 4, 256, guard.WINDOW
PERIOD = 1024          # the runtime's default guard period


@pytest.fixture(scope="module")
def texts(smollm2):
    """Token ids (BOS first): Brown prose from far past the calibration budget, and Python source."""
    from llama_cpp import Llama
    llm = Llama(model_path=str(smollm2), n_ctx=256, verbose=False, vocab_only=True)
    brown, code = data.text("brown"), data.text("python-code")
    tok = lambda s: llm.tokenize(s.encode(), add_bos=False)  # noqa: E731
    bos = [llm.token_bos()]
    out = {"prose": bos + tok(brown[len(brown) // 2:][:12000])[:1999], "code": bos + tok(code[200000:212000])[:1999],
           "code2": bos + tok(code[400000:412000])[:1999]}
    del llm
    return out


def llama(model, maps, **kw):
    return ridgefill.Llama(str(model), maps_path=str(maps), tail_tokens=TAIL, sink_tokens=SINK, **{**CTX, **kw})


def without_guard(maps, out):
    """A copy of a map file without the guard's keys, as files calibrated before the guard are."""
    copy_gguf(GGUFReader(maps), out, keep_key=lambda k: not k.startswith("ridgefill.guard."))
    return out


def test_calibration_stores_the_guard(guarded20):
    g = read_maps(guarded20).guard
    assert g is not None and g.window == W and g.rule == guard.RULE
    assert g.layer_error.shape == (9,) and (g.layer_error > 0).all()        # 9 late layers, one part each
    assert len(g.scores) >= 8 and 0.3 < np.median(g.scores) < 2.0         # about 1 on held-out text
    assert g.threshold == pytest.approx(guard.MARGIN * g.scores.max(), rel=1e-6)
    assert g.layer_error_q.shape == (9, 3)


def test_prose_passes_code_falls_back(smollm2, guarded20, texts):
    llm = llama(smollm2, guarded20)                                # the guard is on by default
    n = len(texts["prose"])
    llm.reset()
    llm.eval(texts["prose"])
    g = llm.guard_result()
    assert g["guard"] == "passed" and g["checks"] == 2, g        # the probe at 4 and a check at 4 + PERIOD
    assert g["threshold"] == pytest.approx(read_maps(guarded20).guard.threshold, rel=1e-6)
    assert llm.ridgefill_counts()[0] == n - SINK - TAIL - 2 * W  # their rows are exact
    assert llm.filled_ranges == [(SINK + W, SINK + PERIOD), (SINK + PERIOD + W, n - TAIL)]
    llm.reset()
    llm.eval(texts["code"])
    g = llm.guard_result()
    assert g["guard"] == "fell_back" and g["fell_back_at"] == SINK + W and g["score"] > g["threshold"], g
    assert llm.ridgefill_counts()[0] == 0 and llm.filled_ranges == []   # nothing approximate was ever stored


def numpy_window_sums(model, maps, toks, starts=(SINK,)) -> tuple[np.ndarray, np.ndarray]:
    """Σ|ŷ−y|² and Σ|y|² per late layer (and for kv maps K and V) on the rows [start, start+W) of each window,
    from exact activations: (n_windows, L·P) each."""
    m = read_maps(maps)
    C = m.context_tokens
    acts = LayerInputs(model, [m.split_layer, *m.late_layers], 2048, n_threads()).run(np.asarray(toks))
    kvw = kvproj.load(open_gguf(model), m.late_layers) if m.map_kind == "kv" else None
    num, den = [[] for _ in starts], [[] for _ in starts]
    for j, start in enumerate(starts):
        rows = np.arange(start, start + W)
        f = ridge.context_features(acts[0][:start + W], C, start)
        for i, l in enumerate(m.late_layers):
            x, y_hat = acts[1 + i][rows], f @ m.weights[l].T + m.biases[l]
            if kvw:
                k, v = kvproj.project(kvw[l], x)
                dk = m.kv_dims[0]
                parts = [(y_hat[:, :dk], k.reshape(len(rows), -1)), (y_hat[:, dk:], v)]
            else:
                parts = [(y_hat, x)]
            for a, b in parts:
                n_, d_ = guard.sums(a[None], b[None])
                num[j].append(n_[0]), den[j].append(d_[0])
    return np.array(num), np.array(den)


def numpy_probe_score(model, maps, toks) -> float:
    """The probe's score from exact activations: per late layer (and for kv maps K and V) Σ|ŷ−y|²/Σ|y|² on rows
    [sink, sink+W), over the held-out error, averaged."""
    return float(guard.scores(*numpy_window_sums(model, maps, toks), read_maps(maps).guard.layer_error)[0])


@pytest.mark.parametrize("which", ["input", "kv-c2", "gemma3"])
def test_the_runtime_scores_what_numpy_does(which, smollm2, gemma3, guarded20, maps_kv20, gemma_maps, texts):
    """The same statistic in the graph (canary rows) and in numpy: input maps, kv maps with two predecessors
    (the canaries' features gather them), and Gemma 3 (sliding-window and global layers)."""
    model, maps = {"input": (smollm2, guarded20), "gemma3": (gemma3, gemma_maps),
                   "kv-c2": (smollm2, maps_kv20)}[which]
    if which != "input":
        maps = maps.with_name(maps.stem + "-guarded.gguf")
    toks = texts["code"][:600]
    if which == "gemma3":
        from llama_cpp import Llama
        vocab = Llama(model_path=str(gemma3), n_ctx=256, verbose=False, vocab_only=True)
        toks = [vocab.token_bos()] + vocab.tokenize(data.text("python-code")[200000:206000].encode(),
                                                    add_bos=False)[:599]
        del vocab
    want = numpy_probe_score(model, maps, toks)
    llm = llama(model, maps, guard_period=0)
    llm.reset()
    llm.eval(toks)
    got = llm.guard_result()
    assert got["checks"] == 1 and got["score"] == pytest.approx(want, rel=2e-3)


def test_the_checks_pool_their_rows(smollm2, guarded20, texts):
    """After each check the prompt's score is that of all its canary rows so far (guard.pooled), not the last
    check's alone.  On prose with a check every 512 rows, the runtime's scores match numpy's pooled ones on the
    same four windows within 4% (later canaries attend to cells the maps filled in the runtime and to exact ones
    here: 2.4% apart on this prompt), and are far from the last check's alone (11% apart)."""
    starts = [SINK + k * 512 for k in range(4)]                   # the probe and three checks before the tail
    num, den = numpy_window_sums(smollm2, guarded20, texts["prose"], starts)
    le = read_maps(guarded20).guard.layer_error
    want, alone = guard.pooled(num, den, le), guard.scores(num, den, le)
    llm = llama(smollm2, guarded20, guard_period=512)
    llm.reset()
    llm.eval(texts["prose"])
    g = llm.guard_result()
    assert g["guard"] == "passed" and g["checks"] == 4, g
    assert g["score"] == pytest.approx(want[-1], rel=0.04) and g["max_score"] == pytest.approx(want.max(), rel=0.04)
    assert abs(g["score"] - want[-1]) < abs(g["score"] - alone[-1]) / 2, (g, want, alone)   # pooled, not the last


def test_guard_off_and_old_files_are_todays_path_bit_for_bit(smollm2, guarded20, texts, tmp_path):
    old = without_guard(guarded20, tmp_path / "old.gguf")
    n = len(texts["prose"])
    ref = llama(smollm2, old)
    assert ref.guard_result()["guard"] == "off"                  # no threshold in the file: off (a warning is logged)
    want = ref.prompt_logits(texts["prose"], n - TAIL)
    assert ref.ridgefill_counts()[0] == n - SINK - TAIL
    del ref
    llm = llama(smollm2, guarded20, guard=False)
    got = llm.prompt_logits(texts["prose"], n - TAIL)
    assert llm.guard_result()["guard"] == "off" and llm.ridgefill_counts()[0] == n - SINK - TAIL
    assert np.array_equal(got, want)


def test_a_fallback_equals_an_exact_run(smollm2, guarded20, texts):
    n = len(texts["code"])
    llm = llama(smollm2, guarded20)
    guarded = llm.prompt_logits(texts["code"], n - TAIL)
    assert llm.guard_result()["guard"] == "fell_back"
    llm.set_ridgefill(False)
    exact = llm.prompt_logits(texts["code"], n - TAIL)
    np.testing.assert_array_equal(guarded, exact)


def test_a_register_change_midway_is_caught_and_the_filled_cells_stay(smollm2, guarded20, texts):
    toks = texts["prose"][:1000] + texts["code"][1:1001]
    # checks at 4, 516 (prose), 1028 and 1540 (code): pooled with the prose check before it, the first code check
    # passes; the last two checks' rows, both code, do not (pooled over all four checks it passed: 1.61 < 1.78)
    llm = llama(smollm2, guarded20, guard_period=512)
    llm.reset()
    llm.eval(toks)
    g = llm.guard_result()
    assert g["guard"] == "fell_back" and g["checks"] == 4 and g["fell_back_at"] == SINK + 3 * 512 + W, g
    assert llm.filled_ranges == [(SINK + W, SINK + 512), (SINK + 512 + W, SINK + 1024), (SINK + 1024 + W, SINK + 1536)]
    assert llm.ridgefill_counts()[0] == 3 * (512 - W)
    # why the last two checks are a pool of their own: numpy's score over all four checks' rows is under the threshold
    num, den = numpy_window_sums(smollm2, guarded20, toks, [SINK + k * 512 for k in range(4)])
    m = read_maps(guarded20).guard
    over_all = guard.scores(num.sum(0)[None], den.sum(0)[None], m.layer_error)[0]
    assert over_all < m.threshold < guard.pooled(num, den, m.layer_error)[-1], over_all


def test_bad_settings_and_files_are_refused(smollm2, guarded20, tmp_path):
    llm = llama(smollm2, guarded20)
    with pytest.raises(RidgefillError, match="guard period 16"):
        llm.set_guard(True, period=16)                           # not longer than a check
    with pytest.raises(RidgefillError, match="guard period -1"):
        llm.set_guard(True, period=-1)
    del llm
    bad = tmp_path / "bad.gguf"
    copy_gguf(GGUFReader(guarded20), bad, keep_key=lambda k: k != "ridgefill.guard.layer_error",
              add_keys=lambda w: w.add_array("ridgefill.guard.layer_error", [0.1, 0.2]))
    with pytest.raises(RidgefillError, match="guard"):
        read_maps(bad)
    with pytest.raises(RidgefillError, match="guard's keys are malformed"):
        llama(smollm2, bad)


def test_the_server_reports_and_obeys_the_guard(smollm2, guarded20, texts):
    from llama_cpp import Llama
    vocab = Llama(model_path=str(smollm2), n_ctx=256, verbose=False, vocab_only=True)
    prose, code, code2 = (vocab.detokenize(texts[k][1:900]).decode(errors="ignore") for k in ("prose", "code", "code2"))
    del vocab
    period = 512                                                  # half the default: shorter prompts get a check
    with Server(smollm2, "-c", "2048", "-t", str(n_threads()), "-np", "1", "-fa", "off", "--metrics",
                "--ridgefill-maps", str(guarded20), "--ridgefill-tail", str(TAIL),
                "--ridgefill-guard-period", str(period)) as srv:
        props = srv.get("/props")["ridgefill"]
        assert props["guard"] is True and props["guard_period"] == period
        assert props["guard_threshold"] == pytest.approx(read_maps(guarded20).guard.threshold, rel=1e-6)

        def timings(prompt, **body):
            r = requests.post(srv.url + "/completion", json={"prompt": prompt, "n_predict": 1, "cache_prompt": False,
                                                             **body}, timeout=600)
            assert r.status_code == 200, r.text
            return r.json()["timings"]

        t = timings(prose)
        assert t["prompt_n"] - TAIL > SINK + period + W                              # the probe and one check
        assert t["ridgefill_guard"] == "passed" and t["ridgefill_filled_n"] == t["prompt_n"] - SINK - TAIL - 2 * W
        assert 0 < t["ridgefill_guard_score"] <= t["ridgefill_guard_threshold"]
        t = timings(code)
        assert t["ridgefill_guard"] == "fell_back" and t["ridgefill_filled_n"] == 0
        assert t["ridgefill_guard_fell_back_at"] == SINK + W and t["ridgefill_guard_score"] > t["ridgefill_guard_threshold"]
        t = timings(code, ridgefill={"guard": False})
        assert t["ridgefill_guard"] == "off" and t["ridgefill_filled_n"] == t["prompt_n"] - SINK - TAIL
        t = timings(code, ridgefill={"tail_tokens": 300, "guard": False})
        assert t["ridgefill_guard"] == "off" and t["ridgefill_filled_n"] == t["prompt_n"] - SINK - 300
        r = requests.post(srv.url + "/completion", json={"prompt": code, "n_predict": 1, "ridgefill": {"guard": 1}})
        assert r.status_code == 400 and "guard must be true or false" in r.text
        metrics = requests.get(srv.url + "/metrics", timeout=60).text
        assert "llamacpp:ridgefill_guard_passed_total 1" in metrics
        assert "llamacpp:ridgefill_guard_fell_back_total 1" in metrics
        assert "RidgeFill guard: the maps do not fit this prompt" in srv.log()

        # the fill record is what the runtime did: a fallback's cells and the probe's rows are exact, so an exact
        # request reuses them, here through the RAM prompt cache (each prompt displaces the other from the slot).
        # C is code not sent before that fails the first check (the guard's verdict depends on the probe's rows: a
        # header of English words in front of code moves its fallback to the second check, after filled rows)
        c, p = code2, "Guard record P.\n" + prose
        t = timings(c, cache_prompt=True)
        assert t["ridgefill_guard"] == "fell_back" and t["ridgefill_guard_fell_back_at"] == SINK + W, t
        assert t["cache_n"] == 0 and t["ridgefill_filled_n"] == 0
        n_c = t["prompt_n"]
        t = timings(p, cache_prompt=True)
        assert t["ridgefill_guard"] == "passed" and t["cache_n"] <= SINK              # a shared header at most
        t = timings(c, cache_prompt=True, ridgefill=False)
        assert t["cache_n"] == n_c - 1 and t["ridgefill_filled_n"] == 0        # all of C was computed exactly
        t = timings(p, cache_prompt=True)                                     # back from the RAM cache
        assert t["prompt_n"] == 1                                             # all of it reused
        t = timings(p, cache_prompt=True, ridgefill=False)                    # in the slot
        assert t["cache_n"] == SINK + W                                       # up to the first filled cell


def test_eval_shows_the_guard_as_a_mode(smollm2, guarded20, tmp_path):
    import json

    from conftest import run_cli
    out = tmp_path / "eval.json"
    r = run_cli("ridgefill", "eval", str(smollm2), "--maps", str(guarded20), "--guard", "--task", "kl",
                "--lengths", "768", "--tail-tokens", "128", "--prompts", "2", "--domains", "python-code",
                "-t", str(n_threads()), "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| guard |" in r.stdout and "guard: fell back on" in r.stdout
    g = json.loads(out.read_text())["domains"]["python-code"]["tail@768"]["guard"]
    assert len(g["prompts"]) == 2 and all(p["verdict"] in ("passed", "fell_back") for p in g["prompts"])


def test_bench_guard_cost_through_the_cli(smollm2, guarded20, tmp_path):
    import json

    from conftest import run_cli
    out = tmp_path / "cost.json"
    r = run_cli("ridgefill", "bench", str(smollm2), "--maps", str(guarded20), "--guard-cost", "--domain", "shakespeare",
                "--lengths", "768", "--tail-tokens", "128", "-r", "1", "--guard-period", "256", "-t", str(n_threads()),
                "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads(out.read_text())["rows"][0]
    assert row["exact_s"] > 0 and row["ridgefill_s"] > 0 and row["guard_s"] > 0
    # a passing prompt of 768 with a 128 tail is checked at 4, 260 and 516 (the filled region is [4, 640))
    if row["verdict"] == "passed":
        assert row["checks"] == 3 and row["guard_filled"] == row["filled"] - 3 * W
    else:
        assert row["checks"] >= 1 and row["guard_filled"] < row["filled"]
