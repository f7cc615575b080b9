"""scripts/prepare_upstream.py: the pin is verified and a patch that does not apply stops with its name."""
import os
import subprocess
import sys

from conftest import ROOT

SCRIPT = str(ROOT / "scripts" / "prepare_upstream.py")


def prepare(dest, patches, **env):
    return subprocess.run([sys.executable, SCRIPT, "--dest", str(dest), "--patches", str(patches)],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=600)


def test_series_applies_and_reapplying_rewrites_nothing(tmp_path):
    dest = tmp_path / "src"
    r = prepare(dest, ROOT / "ggml-patches")
    assert r.returncode == 0, r.stderr
    assert (dest / "vendor/llama.cpp/src/llama.cpp").read_text().count("llama_ridgefill_version") == 1
    r = prepare(dest, ROOT / "ggml-patches")
    assert r.returncode == 0 and "files rewritten" not in r.stdout   # same series: nothing to do


def test_a_patch_that_does_not_apply_stops_with_its_name(tmp_path):
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-bogus.patch").write_text(
        "Subject: bogus\n\n"
        "--- a/vendor/llama.cpp/src/llama.cpp\n+++ b/vendor/llama.cpp/src/llama.cpp\n"
        "@@ -1,3 +1,3 @@\n-this line is not there\n+nor this one\n context\n")
    r = prepare(tmp_path / "src", patches)
    assert r.returncode == 1
    assert "patch 0001-bogus.patch does not apply" in r.stderr


def test_an_sdist_with_the_wrong_hash_is_refused(tmp_path):
    fake = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    fake.write_bytes(b"not the sdist")
    r = prepare(tmp_path / "src", ROOT / "ggml-patches", RIDGEFILL_UPSTREAM_SDIST=str(fake))
    assert r.returncode == 1
    assert "expected 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e" in r.stderr
