"""`ridgefill calibrate`, `export` and `info` on SmolLM2 with real text."""
import re
import shutil

import numpy as np
import pytest
from conftest import run_cli
from gguf import GGUFReader

from ridgefill import ggufio
from ridgefill.errors import RidgefillError
from ridgefill.ggufio import MapFile, read_maps, write_maps


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
    src, aug = GGUFReader(smollm2), GGUFReader(out)
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
    assert peaks[1] - peaks[0] < 25, peaks   # 4x the tokens, (almost) the same memory
