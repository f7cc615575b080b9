"""The measuring instruments end to end at tiny sizes: eval, bench (--plot, --server), sweep."""
import json

import numpy as np
import pytest
from conftest import n_threads, run_cli

from ridgefill.evaluate import EvalConfig, Evaluator, _summarize, needle_prompt
from ridgefill.server import Server
from ridgefill.sweep import frontier, recommend

T = str(n_threads())


def test_eval_all_tasks_tiny(smollm2, maps20, tmp_path):
    out, png = tmp_path / "eval.json", tmp_path / "eval.png"
    r = run_cli("ridgefill", "eval", str(smollm2), "--maps", str(maps20), "--task", "kl,longdep,splice",
                "--task", "needle", "--lengths", "320", "--tail-tokens", "64", "--prompts", "1",
                "--domains", "shakespeare", "--depths", "0.5", "--needle-trials", "1", "-t", T,
                "--json", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "gap closed (KL)" in r.stdout and "| Δ vs exact |" in r.stdout
    res = json.loads(out.read_text())
    assert res["split_layer"] == 20
    tail = res["domains"]["shakespeare"]["tail@320"]
    assert tail["tokens"] == 63 and 0 <= tail["key_tokens"] <= 63
    modes = tail["modes"]
    assert set(modes) == {"ridgefill", "splice-k", "splice-v", "splice-kscale", "splice-kv"}
    for key in ("kl", "top1", "nll", "nll_diff", "nll_key", "nll_key_diff"):
        lo_mid_hi = modes["ridgefill"][key]
        assert len(lo_mid_hi) == 3
    kl, lo, hi = modes["ridgefill"]["kl"]
    assert 0 < lo <= kl <= hi
    assert modes["ridgefill"]["kl_prompts"] == pytest.approx([kl])   # one prompt: its mean is the mean
    assert modes["splice-kv"]["kl"][0] < 1e-9 and modes["splice-kv"]["top1"][0] == 1.0   # kv: exact
    nd = res["domains"]["shakespeare"]["needle"]
    assert nd["cells"][0]["hits"]["splice-kv"] == nd["cells"][0]["hits"]["exact"]
    assert set(nd["accuracy"]) == {"exact", "ridgefill", "splice-k", "splice-v", "splice-kscale", "splice-kv"}
    assert nd["diff_from_exact"]["splice-kv"][0] == 0
    assert png.stat().st_size > 10_000


def test_kl_per_prompt_follows_the_prompt_order():
    """eval --json's kl_prompts: each prompt's mean tail KL, in prompt order (that of the guard's verdicts)."""
    g = np.array([0, 0, 1, 1, 1, 2])
    kl = np.array([1.0, 3.0, 0.5, 0.5, 2.0, 7.0])
    arr = {"group": g, "nll_exact": np.zeros(6), "nll_tail_only": np.zeros(6),
           "modes": {"ridgefill": {"kl": kl, "top1": np.ones(6), "nll": np.zeros(6)}}, "guard": []}
    assert _summarize(arr, 1.0, 0)["modes"]["ridgefill"]["kl_prompts"] == pytest.approx([2.0, 1.0, 7.0])


def test_eval_on_the_users_text(smollm2, maps20, tmp_path):
    mine = tmp_path / "mine.txt"
    mine.write_text(" ".join(f"Entry {i}: the value of item {i} is {i * 7 % 13}." for i in range(400)))
    r = run_cli("ridgefill", "eval", str(smollm2), "--maps", str(maps20), "--task", "kl", "--lengths", "320",
                "--tail-tokens", "64", "--prompts", "1", "--text", str(mine), "-t", T)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "file:mine.txt" in r.stdout and "shakespeare" not in r.stdout   # --text alone replaces the domains


@pytest.mark.parametrize("args, message", [
    (["--lengths", "9000"], "beyond the model's context (8192)"),
    (["--lengths", "300", "--tail-tokens", "300"], "leaves no filled region"),
    (["--task", "perplexity"], "unknown task perplexity"),
    (["--text", "/nonexistent.txt"], "--text /nonexistent.txt: no such file"),
])
def test_eval_bad_arguments(smollm2, maps20, args, message):
    base = ["ridgefill", "eval", str(smollm2), "--maps", str(maps20), "--prompts", "1"]
    if "--task" not in args:
        base += ["--task", "kl"]
    r = run_cli(*base, *args)
    assert r.returncode == 1 and message in r.stderr, r.stderr[-2000:]


def test_eval_model_without_maps(smollm2):
    r = run_cli("ridgefill", "eval", str(smollm2), "--task", "kl", "--lengths", "300", "--tail-tokens", "64")
    assert r.returncode == 1 and "ridgefill" in r.stderr.lower() and "maps" in r.stderr, r.stderr[-2000:]


def test_needle_lies_in_the_filled_region(smollm2, maps20):
    ev = Evaluator(EvalConfig(model=str(smollm2), maps=str(maps20), tasks=["needle"], lengths=[600],
                              tail_tokens=128, threads=n_threads()))
    hay = ev.tokens("All the world's a stage, and all the men and women merely players. " * 200)
    for depth in (0.0, 0.5, 1.0):
        toks, pos = needle_prompt(ev, hay, 600, depth, "12345")
        n_needle = len(ev.tokens("\n\nIMPORTANT: the pass key is 12345.\n\n"))
        assert len(toks) == 600 and 4 <= pos and pos + n_needle <= 600 - 128


def test_bench_plot_and_server(smollm2, maps20, tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    r = run_cli("ridgefill", "bench", str(smollm2), "--maps", str(maps20), "--lengths", "384", "--tail-tokens", "96",
                "-r", "1", "-t", T, "--json", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads(out.read_text())["rows"][0]
    assert row["filled"] == 384 - 96 - 4 and row["limit"] > 1 and png.stat().st_size > 10_000
    assert row["ratio"] == row["exact_runs"][0] / row["ridgefill_runs"][0]   # each repeat's seconds are kept
    with Server(smollm2, "-c", "1024", "-t", T, "-np", "1", "--ridgefill", "--ridgefill-maps", str(maps20),
                "--ridgefill-tail", "96") as srv:
        out2 = tmp_path / "bench-server.json"
        r = run_cli("ridgefill", "bench", "--server", srv.url, "--lengths", "384", "-r", "1", "--json", str(out2))
        assert r.returncode == 0, r.stderr[-3000:]
        res = json.loads(out2.read_text())
        assert res["split_layer"] == 20 and res["tail_tokens"] == 96
        assert res["rows"][0]["filled"] == 384 - 96 - 4 and res["rows"][0]["limit"] > 1   # model read from /props
        assert len(res["rows"][0]["exact_runs"]) == len(res["rows"][0]["ridgefill_runs"]) == 1
        r = run_cli("ridgefill", "bench", "--server", srv.url, "--lengths", "2048", "-r", "1")
        assert r.returncode == 1 and "does not fit the server's context" in r.stderr
    r = run_cli("ridgefill", "bench", "--server", "http://127.0.0.1:9", "--lengths", "384")
    assert r.returncode == 1 and "cannot reach a server" in r.stderr


def test_rotation_puts_each_mode_in_each_place():
    from ridgefill.bench import alternate, rotate
    order = []
    runs = rotate(("exact", "a", "b"), 4, lambda m: order.append(m) or len(order))
    assert order == ["exact", "a", "b", "a", "b", "exact", "b", "exact", "a", "exact", "a", "b"]
    assert runs == {"exact": [1, 6, 8, 10], "a": [2, 4, 9, 11], "b": [3, 5, 7, 12]}
    order.clear()
    alternate(3, lambda m: order.append(m))
    assert order == [False, True, True, False, False, True]


def test_bench_compare_maps(smollm2, maps20, maps_kv20, tmp_path):
    """--compare-maps: exact and three fills rotated on one context; every fill is paired with the same exact runs,
    and vs_first is the first fill's seconds over its own, per repeat."""
    import dataclasses
    import statistics

    from ridgefill.ggufio import read_maps, write_maps
    band = tmp_path / "band20.gguf"
    write_maps(band, dataclasses.replace(read_maps(maps20), band_layers=10, band_window=64))
    out, png = tmp_path / "cmp.json", tmp_path / "cmp.png"
    r = run_cli("ridgefill", "bench", str(smollm2), "--maps", str(maps20), "--compare-maps", f"{band},{maps_kv20}",
                "--lengths", "384", "--tail-tokens", "96", "-r", "4", "-t", T, "-fa", "on", "--json", str(out),
                "--plot", str(png))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    first, (b, kv) = res["rows"][0], res["compare"]
    assert res["split_layer"] == 20 and res["band_layers"] == 0 and res["maps"] == str(maps20)
    assert (b["maps"], b["band_layers"], b["band_window"]) == (str(band), 10, 64)
    assert kv["maps"] == str(maps_kv20) and kv["band_layers"] == 0
    assert b["rows"][0]["limit"] > first["limit"]                  # the window skips keys at 384 tokens
    for f in (first, b["rows"][0], kv["rows"][0]):
        assert f["filled"] == 384 - 96 - 4 and len(f["ridgefill_runs"]) == 4
        assert f["exact_runs"] == first["exact_runs"]               # one set of exact runs, shared
        ratios = [e / x for e, x in zip(f["exact_runs"], f["ridgefill_runs"])]
        assert f["ratio"] == statistics.median(ratios)
        assert f["vs_first"] == statistics.median(
            [a / x for a, x in zip(first["ridgefill_runs"], f["ridgefill_runs"])])
    assert first["vs_first"] == 1.0
    assert "vs first" in r.stdout and "band20.gguf` (split 20, band 10–19 W=64)" in r.stdout
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("extra, message", [
    (["--server", "http://127.0.0.1:9"], "--compare-maps runs in-process"),
    (["--guard-cost"], "not with --guard-cost"),
    (["--band-layers", "5"], "with the band it records"),
    (["--compare-maps", "{maps}"], "is given twice"),
])
def test_bench_compare_maps_bad_arguments(smollm2, maps20, maps_kv20, extra, message):
    args = [a.format(maps=maps20) for a in extra]
    if "--compare-maps" not in args:
        args += ["--compare-maps", str(maps_kv20)]
    r = run_cli("ridgefill", "bench", str(smollm2), "--maps", str(maps20), "--lengths", "384", "--tail-tokens", "96",
                "-r", "1", *args)
    assert r.returncode == 1 and message in r.stderr, r.stderr[-2000:]


def test_frontier_and_recommendation_by_hand():
    pts = [{"split_layer": 15, "tail_tokens": 256, "speedup": 1.6, "kl": 0.15},
           {"split_layer": 20, "tail_tokens": 256, "speedup": 1.3, "kl": 0.04},
           {"split_layer": 20, "tail_tokens": 1024, "speedup": 1.2, "kl": 0.05},   # dominated by (20, 256)
           {"split_layer": 25, "tail_tokens": 256, "speedup": 1.1, "kl": 0.01}]
    assert [(p["split_layer"], p["tail_tokens"]) for p in frontier(pts)] == [(25, 256), (20, 256), (15, 256)]
    rec = {r["kl_budget"]: r["setting"] for r in recommend(pts, budgets=(0.005, 0.02, 0.05, 0.2))}
    assert rec[0.005] is None
    assert rec[0.02]["split_layer"] == 25 and rec[0.05]["split_layer"] == 20 and rec[0.2]["split_layer"] == 15


def test_sweep_tiny(smollm2, tmp_path):
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    r = run_cli("ridgefill", "sweep", str(smollm2), "--split-layers", "26", "--tail-tokens", "64,128",
                "--length", "320", "--calib-tokens", "1024", "--prompts", "1", "-t", T,
                "--workdir", str(tmp_path / "w"), "--json", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert len(res["points"]) == 2 and res["frontier"] and len(res["recommend"]) == 5
    for p in res["points"]:
        assert p["speedup"] > 0 and p["kl"] >= 0 and p["limit"] > 1
    assert "recommended setting" in r.stdout and png.stat().st_size > 10_000
    assert len(list((tmp_path / "w").glob("*.maps.gguf"))) == 1


@pytest.mark.parametrize("cmd, message", [
    (["bench", "{model}", "--maps", "{maps}", "--lengths", "9000"], "beyond the model's context (8192)"),
    (["bench", "{model}", "--maps", "{maps}", "--lengths", "512", "--tail-tokens", "512"], "is not shorter than the prompt"),
    (["bench", "{model}", "--lengths", "512"], "maps"),
    (["bench"], "give MODEL, or --server URL"),
    (["sweep", "{model}", "--split-layers", "20", "--tail-tokens", "400", "--length", "400"], "is not shorter than the prompt"),
    (["sweep", "{model}", "--split-layers", "40", "--length", "400", "--tail-tokens", "64"], "outside 1..29"),
])
def test_bench_and_sweep_bad_arguments(smollm2, maps20, tmp_path, cmd, message):
    args = [a.format(model=smollm2, maps=maps20) for a in cmd]
    r = run_cli("ridgefill", *args, *(["--workdir", str(tmp_path)] if cmd[0] == "sweep" else []))
    assert r.returncode == 1 and message in r.stderr, r.stderr[-2000:]


def test_eval_prompts_never_come_from_the_calibration_text(smollm2, maps20):
    """maps20 was calibrated on Brown's first documents: eval's Brown prompts skip them.
    Checked against the chunks calibration itself builds (calibrate.token_budget), 16-token windows."""
    from ridgefill import data, evaluate
    from ridgefill.calibrate import CalibConfig, LayerInputs, token_budget
    ev = Evaluator(EvalConfig(model=str(smollm2), maps=str(maps20), tasks=["kl"], lengths=[512], tail_tokens=64,
                              prompts=4, domains=["brown"], threads=n_threads()))
    chunks = token_budget(LayerInputs(smollm2, [20], 512, n_threads()),
                          CalibConfig(model=smollm2, split_layer=20, corpus="brown", tokens=6144, ctx=512))
    grams = lambda seqs: {tuple(s[i:i + 16]) for s in seqs for i in range(1, len(s) - 16)}  # noqa: E731
    seen = grams([list(map(int, c)) for c in chunks])
    lines = []
    text = evaluate.domains(ev.cfg, ev, lines.append)["brown"]
    assert lines and "which the maps were calibrated on" in lines[0]
    assert not grams(evaluate.windows(ev, text, 512, 4, "brown")) & seen
    assert grams(evaluate.windows(ev, data.text("brown"), 512, 4, "brown")) & seen    # without the rule: overlap
    # another corpus is not touched; --skip-tokens moves the sample, disjoint from the first
    assert evaluate.domains(EvalConfig(model="", domains=["shakespeare"]), ev)["shakespeare"] == data.text("shakespeare")
    first = evaluate.windows(ev, text, 512, 4, "brown")
    ev.cfg.skip_tokens = len(ev.tokens(text[:4 * 511 * 8]))   # past all the text the first sample spreads over
    assert not grams(evaluate.windows(ev, text, 512, 4, "brown")) & grams(first)


def test_eval_skips_what_each_map_file_read_in_its_own_reading_order(maps20, tmp_path):
    """Each map file's documents are skipped in its own reading order (map files older than calib_read_order read
    the first documents: sequential); with --compare-maps the prompts skip the documents of both files."""
    from types import SimpleNamespace

    from ridgefill import data, evaluate
    from ridgefill.calibrate import read_documents
    from ridgefill.ggufio import read_maps, write_maps
    m = read_maps(maps20)
    assert m.extra["calib_read_order"] == "sequential"
    old, spread_file = tmp_path / "old.gguf", tmp_path / "spread.gguf"
    m.extra["calib_read_order"] = "spread"                 # the rule reads only the metadata
    write_maps(spread_file, m)
    del m.extra["calib_read_order"]
    write_maps(old, m)
    corpus, need, order = evaluate.calibration_reading(str(old))
    assert (corpus, order) == ("brown", "sequential") and evaluate.calibration_reading(str(spread_file))[2] == "spread"
    docs = [d.text for d in data.corpus("brown")]
    tok = lambda t: t.split()  # noqa: E731  (any tokenizer: the rule only counts)
    spread, seq = (read_documents(docs, tok, need, o)[1] for o in ("spread", "sequential"))
    assert seq == list(range(len(seq))) and set(spread) != set(seq)
    kept = lambda maps, compare: evaluate.held_out(SimpleNamespace(maps=str(maps), compare=compare, tokens=tok),  # noqa: E731
                                                   "brown")
    assert kept(old, {}) == kept(maps20, {}) == "\n\n".join(docs[len(seq):])
    both = kept(spread_file, {"old": str(old)})
    assert both == "\n\n".join(t for i, t in enumerate(docs) if i not in set(spread) | set(seq))
