"""scripts/prepare_upstream.py: the pin is verified and a patch that does not apply stops with its name."""
import os
import re
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


    # docs/maps.md ("What a skipped key costs"): CUDA's sparse flash attention, the one path that would skip the
    # positions before a band's window, is built for head sizes 256/512/576 with 8 or 16 query heads per KV head only,
    # and used from 4096 keys and twice the gathered count on
    cuda = dest / "vendor/llama.cpp/ggml/src/ggml-cuda"
    mma = (cuda / "fattn-mma-f16.cuh").read_text()
    start = mma.index("ggml_cuda_flash_attn_ext_mma_f16_may_use_sparse(")
    combos = mma[start:mma.index("}", start)]
    assert sorted(set(re.findall(r"DKQ == (\d+) && DV == (\d+) && ncols1 == \d+ && ncols2 == (\d+)", combos))) == \
        [("256", "256", "8"), ("512", "512", "8"), ("576", "512", "16")]
    assert "K->ne[1] >= std::max<int64_t>(4096, 2*n_gather)" in (cuda / "fattn.cu").read_text()
    # the dense CUDA path scans the mask only for the last position worth computing (KV_max), never for a first one
    common = (cuda / "fattn-common.cuh").read_text()
    assert "flash_attn_mask_to_KV_max" in common and "KV_min" not in common
    # the tiled CPU kernel converts a key tile's mask to F32, value by value, before it decides to skip the tile;
    # patch 0018 tests the tile's F16 bits before that (tests/test_cpu_fa_skip.py: the output is unchanged)
    ops = (dest / "vendor/llama.cpp/ggml/src/ggml-cpu/ops.cpp").read_text()
    tiled = ops[ops.index("static void ggml_compute_forward_flash_attn_ext_tiled("):]
    bits = tiled.index("not_inf |= (uint16_t) (mb_row[tk] ^ 0xFC00);")
    convert = tiled.index("mask32[tq * KV_TILE_SZ + tk] = slope * GGML_CPU_FP16_TO_FP32(mp_row[ic + tk]);")
    assert bits < tiled.index("if (all_inf) {") < convert < tiled.index("if (can_skip) {")


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
