"""`ridgefill calibrate`, `export` and `info` on SmolLM2 with real text."""
import re
import shutil

import numpy as np
import pytest
from conftest import run_cli
from gguf import GGUFReader, GGUFValueType

from ridgefill import ggufio
from ridgefill.errors import RidgefillError
from ridgefill.ggufio import MapFile, read_maps, write_maps
from ridgefill.modelfile import open_gguf


def test_maps_beat_the_identity_baseline_on_held_out_text(maps20):
    m = read_maps(maps20)
    assert m.split_layer == 20 and m.late_layers == list(range(21, 30)) and m.prior == "identity"
    d = m.diagnostics
    for key in ggufio.DIAG_KEYS:
        assert np.isfinite(d[key]).all() and len(d[key]) == 9, key
    assert (d["r2"] > d["identity_r2"]).all()
    assert (d["rel_err"] < d["identity_rel_err"]).all()
    assert (d["k_rel_err"] < d["identity_k_rel_err"]).all()
    assert (d["v_rel_err"] < d["identity_v_rel_err"]).all()
    assert (d["r2"] > 0).all() and (d["k_norm_ratio"] > 0.5).all() and (d["k_norm_ratio"] < 1.5).all()
    assert m.calib_tokens > 4000 and m.extra["val_tokens"] > 0 and m.sink_tokens == 4
    assert m.base_fingerprint.startswith("sha256:")


def test_info_prints_metadata_and_the_table(maps20):
    r = run_cli("ridgefill", "info", str(maps20))
    assert r.returncode == 0, r.stderr
    assert "split_layer:      20" in r.stdout and "base_fingerprint: sha256:" in r.stdout
    rows = [l for l in r.stdout.splitlines() if re.match(r"\s+2[1-9]\s", l)]
    assert len(rows) == 9


def test_export_roundtrip(maps20, smollm2, tmp_path):
    out = tmp_path / "smollm2.ridgefill.gguf"
    r = run_cli("ridgefill", "export", str(smollm2), str(maps20), "-o", str(out))
    assert r.returncode == 0, r.stderr
    src, aug = open_gguf(smollm2), open_gguf(out)
    aug_tensors = {t.name: t for t in aug.tensors}
    for t in src.tensors:                       # every original tensor byte-identical
        a = aug_tensors[t.name]
        assert a.tensor_type == t.tensor_type and list(a.shape) == list(t.shape)
        assert a.data.tobytes() == t.data.tobytes(), t.name
    for key, f in src.fields.items():           # every original key unchanged
        if not key.startswith("GGUF."):
            assert aug.fields[key].contents() == f.contents(), key
    assert ggufio.fingerprint(aug) == ggufio.fingerprint(src)
    m, m2 = read_maps(maps20), read_maps(out)  # ridgefill tensors and keys round-trip
    for l in m.late_layers:
        np.testing.assert_array_equal(m.weights[l], m2.weights[l])
        np.testing.assert_array_equal(m.biases[l], m2.biases[l])
    assert m2.split_layer == 20 and m2.base_fingerprint == m.base_fingerprint
    np.testing.assert_array_equal(m.diagnostics["r2"], m2.diagnostics["r2"])
    assert "split_layer:      20" in run_cli("ridgefill", "info", str(out)).stdout


@pytest.mark.parametrize("map_type,tol", [("f16", 2e-3), ("q8_0", 2e-2)])
def test_compact_map_types_round_trip(maps20, tmp_path, map_type, tol):
    m = read_maps(maps20)
    m.map_type = map_type
    write_maps(tmp_path / "m.gguf", m)
    m2 = read_maps(tmp_path / "m.gguf")
    for l in m.late_layers:
        W = m.weights[l]
        assert np.abs(m2.weights[l] - W).max() <= tol * np.abs(W).max()


def test_maps_for_another_model_are_refused(maps20, gemma3, tmp_path):
    out = tmp_path / "x.gguf"
    with pytest.raises(RidgefillError, match="maps for another model"):
        ggufio.export(gemma3, maps20, out)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_bad_maps_are_refused(maps20, tmp_path):
    m = read_maps(maps20)
    m.weights[25][3, 3] = np.nan
    with pytest.raises(RidgefillError, match="layer 25: map holds NaN"):
        write_maps(tmp_path / "nan.gguf", m)
    assert not list(tmp_path.iterdir())
    # a map file whose data was damaged on disk (NaN written into a weight)
    bad = tmp_path / "damaged.gguf"
    shutil.copy(maps20, bad)
    r = GGUFReader(bad, "r+")
    t = next(t for t in r.tensors if t.name == "ridgefill.blk.22.map.weight")
    t.data[0, 0] = np.nan
    r.data.flush()
    del r
    with pytest.raises(RidgefillError, match="layer 22: map holds NaN"):
        read_maps(bad)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(maps20.read_bytes()[:-5000])
    with pytest.raises(RidgefillError, match="truncated"):
        read_maps(truncated)
    m = read_maps(maps20)
    m.weights[23] = m.weights[23][:, :-1]
    with pytest.raises(RidgefillError, match="layer 23: map shapes"):
        m.validate()
    del m.weights[23]
    with pytest.raises(RidgefillError, match="cover layers 21..29"):
        m.validate()


def calibrate_cli(model, *args, out=None):
    return run_cli("ridgefill", "calibrate", str(model), *args, "-o", str(out), "--no-progress", "-t", "2")


def test_the_spread_reading_order_covers_the_corpus_from_the_first_documents():
    """Brown is stored genre by genre (500 documents): the first documents read come from every part of it."""
    from ridgefill.calibrate import read_documents, reading_order
    for n in (1, 2, 3, 7, 500, 513):
        order = reading_order(n, "spread")
        assert sorted(order) == list(range(n)), n                    # each document once
    assert reading_order(5, "sequential") == [0, 1, 2, 3, 4]
    assert reading_order(500, "spread")[:4] == [0, 250, 125, 375]
    for k in (8, 13, 32):                                            # any prefix: gaps of at most 2·500/k
        first = sorted(reading_order(500, "spread")[:k])
        assert max(np.diff(first + [500])) <= 2 * 500 / k, k
    docs = [f"doc{i}" for i in range(10)]
    ids, read = read_documents(docs, lambda t: t.split(), 3, "spread")  # one token + a blank line each
    assert read == [0, 5, 2] and ids == ["doc0", "doc5", "doc2"]
    assert read_documents(docs, lambda t: t.split(), 3, "sequential")[1] == [0, 1, 2]
    with pytest.raises(RidgefillError, match="unknown reading order 'random'"):
        reading_order(3, "random")


def test_calibrate_records_its_reading_order(smollm2, tmp_path):
    out = tmp_path / "spread.gguf"
    r = calibrate_cli(smollm2, "-s", "20", "-n", "1024", "-c", "512", "--read-order", "spread", out=out)
    assert r.returncode == 0, r.stderr
    assert read_maps(out).extra["calib_read_order"] == "spread"
    assert "calib_read_order: spread" in run_cli("ridgefill", "info", str(out)).stdout
    r = calibrate_cli(smollm2, "-s", "20", "--read-order", "random", out=out)
    assert r.returncode == 2 and "--read-order: invalid choice: 'random'" in r.stderr


def test_bad_calibration_input_gives_a_clear_error(smollm2, tmp_path):
    out = tmp_path / "maps.gguf"
    short = tmp_path / "short.txt"
    short.write_text("Only a few words here.")
    notgguf = tmp_path / "model.gguf"
    notgguf.write_text("no model")
    cases = [
        ((tmp_path / "missing.gguf", "-s", "10"), "no such file"),
        ((notgguf, "-s", "10"), "not a GGUF file"),
        ((smollm2, "-s", "0"), "--split-layer 0 is outside 1..29"),
        ((smollm2, "-s", "30"), "--split-layer 30 is outside 1..29"),
        ((smollm2, "-s", "10", "--text", str(short), "-n", "4096"), "text too short"),
        ((smollm2, "-s", "10", "--text", str(tmp_path / "nope.txt")), "does not exist"),
        ((smollm2, "-s", "10", "--val-fraction", "0"), "--lambda auto needs held-out tokens"),
    ]
    for args, message in cases:
        r = calibrate_cli(*args, out=out)
        assert r.returncode == 1 and message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
        assert not out.exists()
    r = calibrate_cli(smollm2, "-s", "10", out=tmp_path / "no-such-dir" / "maps.gguf")
    assert r.returncode == 1 and "does not exist" in r.stderr
    r = run_cli("ridgefill", "calibrate", str(smollm2), "-s", "10", "-o", str(out), "--lambda", "big")
    assert r.returncode == 2 and "expected 'auto' or a number" in r.stderr
    assert list(tmp_path.iterdir()) == [short, notgguf] or set(tmp_path.iterdir()) == {short, notgguf}


def test_peak_memory_does_not_grow_with_the_token_budget(smollm2, tmp_path):
    peaks = []
    for tokens in (512, 2048):
        r = calibrate_cli(smollm2, "-s", "24", "-n", str(tokens), "-c", "256", out=tmp_path / f"m{tokens}.gguf")
        assert r.returncode == 0, r.stderr
        peaks.append(float(re.search(r"peak memory (\d+) MB", r.stdout).group(1)))
        assert "input maps, context_tokens 0, split_layer 24, prior identity" in r.stdout
    assert peaks[1] - peaks[0] < 25, peaks   # 4x the tokens, (almost) the same memory


# K/V maps and context features (ggufio format 2)

def test_kv_maps_with_context_round_trip(maps_kv20, tmp_path):
    m = read_maps(maps_kv20)
    assert (m.map_kind, m.context_tokens, m.kv_dims, m.format_version, m.prior) == ("kv", 2, (192, 192), 2, "zero")
    assert m.late_layers == list(range(21, 30)) and len(m.ridge_lambda) == 18 and m.extra["calib_ctx"] == 512
    for l in m.late_layers:
        assert m.weights[l].shape == (384, 1728) and m.biases[l].shape == (384,)
    r = GGUFReader(maps_kv20)
    fields = {k: r.fields[k] for k in r.fields if k.startswith("ridgefill.")}
    assert fields["ridgefill.format_version"].contents() == 2
    assert fields["ridgefill.map_kind"].contents() == "kv"
    assert fields["ridgefill.context_tokens"].contents() == 2
    assert fields["ridgefill.kv_dims"].contents() == [192, 192]
    for key in ("format_version", "context_tokens"):
        assert fields["ridgefill." + key].types == [GGUFValueType.UINT32], key
    assert fields["ridgefill.kv_dims"].types == [GGUFValueType.ARRAY, GGUFValueType.UINT32]
    t = next(t for t in r.tensors if t.name == "ridgefill.blk.25.map.weight")
    assert list(t.shape) == [1728, 384]                      # GGUF ne: [d_in, d_out]
    d = m.diagnostics
    for key in ggufio.KV_DIAG_KEYS:
        assert np.isfinite(d[key]).all() and len(d[key]) == 9, key
    assert (d["k_rel_err"] < d["identity_k_rel_err"]).all() and (d["v_rel_err"] < d["identity_v_rel_err"]).all()
    assert (d["k_r2"] > 0).all() and (d["k_norm_ratio"] > 0.5).all() and (d["k_norm_ratio"] < 1.5).all()
    text = ggufio.info_text(maps_kv20)
    for line in ("map_kind:         kv", "context_tokens:   2", "format_version:   2", "kv_dims:          192 192"):
        assert line in text, line
    assert len([l for l in text.splitlines() if re.match(r"\s+2[1-9]\s", l)]) == 9
    m.map_type = "f16"                                        # and written again
    write_maps(tmp_path / "f16.gguf", m)
    m2 = read_maps(tmp_path / "f16.gguf")
    assert (m2.map_kind, m2.context_tokens, m2.kv_dims) == ("kv", 2, (192, 192))
    np.testing.assert_array_equal(m2.ridge_lambda, m.ridge_lambda)
    np.testing.assert_array_equal(m2.biases[29], m.biases[29])


def test_kv_rows_predict_the_layers_own_k_then_v(maps_kv20, smollm2):
    """On new text: rows [0, 192) of W [h_t, h_t-1, h_t-2] + b are layer 25's K (kvproj, heads in order, no RoPE),
    rows [192, 384) its V; the features in another order predict much worse."""
    from conftest import n_threads

    from ridgefill import data, kvproj, ridge
    from ridgefill.calibrate import LayerInputs
    m = read_maps(maps_kv20)
    runner = LayerInputs(smollm2, [20, 25], ctx=512, threads=n_threads())
    toks = np.asarray(runner.bos + runner.tokenize(data.text("shakespeare")[5000:10000])[:299], dtype=np.int32)
    h, x = runner.run(toks)
    k, v = kvproj.project(kvproj.load(open_gguf(smollm2), [25])[25], x[4:])
    f = ridge.context_features(h, 2, 4)
    W, b = m.weights[25], m.biases[25]
    pred = f @ W.T + b
    err = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
    k_err, v_err = err(pred[:, :192], k.reshape(len(k), -1)), err(pred[:, 192:], v)
    assert k_err < 0.35 and v_err < 0.8, (k_err, v_err)
    assert k_err < 0.8 * m.diagnostics["identity_k_rel_err"][4]
    reversed_ = ridge.context_features(h[:, ::-1].copy(), 2, 4)[:, ::-1] @ W.T + b   # [h_t-2, h_t-1, h_t]
    assert err(reversed_[:, :192], k.reshape(len(k), -1)) > 1.5 * k_err


def test_bad_kv_and_context_settings_give_a_clear_error(smollm2, tmp_path):
    from ridgefill.calibrate import CalibConfig, calibrate
    out = tmp_path / "maps.gguf"
    base = dict(model=smollm2, split_layer=20, corpus="brown", tokens=1024, ctx=512, progress=False)
    cases = [(dict(context_tokens=3), "--context-tokens 3: must be in 0..2"),
             (dict(context_tokens=-1), "--context-tokens -1: must be in 0..2"),
             (dict(context_tokens=2, sink_tokens=1), "--sink-tokens 1 is less than --context-tokens 2"),
             (dict(map_kind="kv", prior="identity"), "--prior identity needs --map-kind input"),
             (dict(map_kind="qk"), "--map-kind 'qk': choose one of input, kv")]
    for config, message in cases:
        with pytest.raises(RidgefillError, match=re.escape(message)):
            calibrate(CalibConfig(**base, **config), out)
    for args, message in [(("--context-tokens", "3"), "--context-tokens 3: must be in 0..2"),
                          (("--map-kind", "kv", "--prior", "identity"), "--prior identity needs --map-kind input")]:
        r = calibrate_cli(smollm2, "-s", "20", *args, out=out)
        assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not list(tmp_path.iterdir())


def rewritten(src, out, drop=(), **keys):
    """A copy of a map file without the keys `drop` and with ridgefill.KEY = value for `keys` (u32 for ints)."""
    def add(w):
        for k, v in keys.items():
            if isinstance(v, int):
                w.add_uint32("ridgefill." + k, v)
            else:
                w.add_string("ridgefill." + k, v)
    drop = {"ridgefill." + k for k in (*drop, *keys)}
    ggufio.copy_gguf(GGUFReader(src), out, keep_key=lambda k: k not in drop, add_keys=add)
    return out


def test_bad_map_files_of_format_2_are_refused(maps20, maps_kv20, tmp_path):
    cases = [(dict(map_kind="foo"), "ridgefill.map_kind 'foo' is unknown"),
             (dict(format_version=4), "map format version 4 is newer than this ridgefill reads (3)"),
             (dict(context_tokens=3), "ridgefill.context_tokens 3 outside 0..2"),
             (dict(map_kind="kv"), "kv maps need ridgefill.kv_dims"),
             (dict(context_tokens=1), "layer 21: map shapes (576, 576)/(576,), expected (576, 1152)/(576,)")]
    for i, (keys, message) in enumerate(cases):
        bad = rewritten(maps20, tmp_path / f"bad{i}.gguf", **keys)
        with pytest.raises(RidgefillError, match=re.escape(message)):
            read_maps(bad)
    with pytest.raises(RidgefillError, match=re.escape(f"{tmp_path / 'bad0.gguf'}: ridgefill.map_kind 'foo'")):
        read_maps(tmp_path / "bad0.gguf")                     # names the file
    with pytest.raises(RidgefillError, match=re.escape("ridge_lambda has 18 entries, expected 9 (input maps")):
        read_maps(rewritten(maps_kv20, tmp_path / "as-input.gguf", drop=["kv_dims"], map_kind="input",
                            context_tokens=0))
    m = read_maps(maps_kv20)
    m.weights[23] = m.weights[23][:-1]
    with pytest.raises(RidgefillError, match=re.escape("layer 23: map shapes (383, 1728)/(384,), expected (384, 17")):
        m.validate()
    m.weights = {l: W[:, :-1] for l, W in read_maps(maps_kv20).weights.items()}
    with pytest.raises(RidgefillError, match=re.escape("map input width 1727 is not a multiple of context_tokens + 1")):
        m.validate()
    m = read_maps(maps_kv20)
    m.kv_dims = (192, 128)
    with pytest.raises(RidgefillError, match="layer 21: map shapes"):
        m.validate()
    m = read_maps(maps_kv20)
    m.ridge_lambda = m.ridge_lambda[:9]
    with pytest.raises(RidgefillError, match="ridge_lambda has 9 entries, expected 18"):
        m.validate()
    m = read_maps(maps_kv20)
    m.prior = "identity"
    with pytest.raises(RidgefillError, match="identity prior"):
        write_maps(tmp_path / "never.gguf", m)
    assert not (tmp_path / "never.gguf").exists()


def test_map_files_without_the_format_2_keys_read_as_before(maps20, tmp_path):
    """A format 1 file (no format_version, map_kind, context_tokens) reads as input maps, C = 0, version 1."""
    old = rewritten(maps20, tmp_path / "old.gguf", drop=["format_version", "map_kind", "context_tokens"])
    assert not [k for k in GGUFReader(old).fields if k.split(".")[-1] in ("format_version", "map_kind",
                                                                         "context_tokens", "kv_dims")]
    m, new = read_maps(old), read_maps(maps20)
    assert (m.map_kind, m.context_tokens, m.kv_dims, m.format_version) == ("input", 0, None, 1)
    assert new.format_version == 2 and m.extra == new.extra and m.prior == new.prior == "identity"
    for l in m.late_layers:
        np.testing.assert_array_equal(m.weights[l], new.weights[l])
    assert "format_version:   1" in ggufio.info_text(old) and "map_kind:         input" in ggufio.info_text(old)
