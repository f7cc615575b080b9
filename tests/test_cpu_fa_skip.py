"""ggml-patches/0018: the tiled CPU flash attention skips a key tile on its F16 bits when the whole tile is -inf,
and the output is what computing the tile gives, bit for bit.

The check, through the fork's own libggml: one windowed attention (a sink and a window of the latest keys, the mask
RidgeFill's band gives a filled row) run twice, once with -inf where the window masks (the tiles past the window are
skipped) and once with -65504, the most negative finite F16 (no tile is all -inf, so every tile is computed; its
weights exp(-65504 - max) are exactly 0, and the first tile, which holds the sink, is never masked)."""
import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

pytest.importorskip("llama_cpp")
sys.path.insert(0, str(ROOT / "scripts"))
from fa_tile_bench import F16, F32, LIB, InitParams, load  # noqa: E402


def ggml():
    return load(str(LIB / "libggml-cpu.so"), ctypes.RTLD_GLOBAL)


def windowed_attention(mask_value, n_q=192, n_kv=2048, window=200, sink=4, threads=2):
    """Flash attention of n_q rows at the last positions of n_kv keys (3 query heads on 1 KV head, head size 64), each
    row seeing the first `sink` keys and its `window` latest; masked positions hold mask_value."""
    base, cpu = ggml()
    rng = np.random.default_rng(0)
    ctx = base.ggml_init(InitParams(256 << 20, None, False))
    try:
        def tensor(kind, values):
            t = base.ggml_new_tensor_4d(ctx, kind, *values.shape[::-1])
            buf = (ctypes.c_char * base.ggml_nbytes(t)).from_address(base.ggml_get_data(t))
            np.frombuffer(buf, dtype=values.dtype)[:] = values.ravel()
            return t
        q = tensor(F32, rng.standard_normal((1, 3, n_q, 64), dtype=np.float32))
        k = tensor(F16, rng.standard_normal((1, 1, n_kv, 64)).astype(np.float16))
        v = tensor(F16, rng.standard_normal((1, 1, n_kv, 64)).astype(np.float16))
        pos = np.arange(n_kv - n_q, n_kv)[:, None]
        key = np.arange(n_kv)[None, :]
        seen = (key <= pos) & ((key < sink) | (key > pos - window))
        mask = tensor(F16, np.where(seen, 0.0, mask_value).astype(np.float16)[None, None])
        out = base.ggml_flash_attn_ext(ctx, q, k, v, mask, ctypes.c_float(0.125), ctypes.c_float(0.0),
                                       ctypes.c_float(0.0))
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, out)
        assert cpu.ggml_graph_compute_with_ctx(ctx, gf, threads) == 0
        buf = (ctypes.c_char * base.ggml_nbytes(out)).from_address(base.ggml_get_data(out))
        return np.frombuffer(buf, dtype=np.float32).copy(), seen
    finally:
        base.ggml_free(ctx)


def test_a_skipped_masked_tile_changes_nothing_bit_for_bit():
    skipped, seen = windowed_attention(-np.inf)
    computed, _ = windowed_attention(-65504.0)
    # most key tiles of a row tile are outside the window and the sink: the case the patch is for
    tiles = seen.reshape(3, 64, 32, 64).any(axis=(1, 3))
    assert tiles.sum(axis=1).tolist() == [6, 6, 6] and np.isfinite(skipped).all()
    assert np.array_equal(skipped.view(np.uint32), computed.view(np.uint32))
    # and it is the attention it claims to be (numpy, F32, the same inputs)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 3, 192, 64), dtype=np.float32)[0]
    k = rng.standard_normal((1, 1, 2048, 64)).astype(np.float16).astype(np.float32)[0, 0]
    v = rng.standard_normal((1, 1, 2048, 64)).astype(np.float16).astype(np.float32)[0, 0]
    s = np.where(seen, q @ k.T * 0.125, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    ref = (w / w.sum(axis=-1, keepdims=True)) @ v                   # [head, row, d]
    assert np.abs(skipped.reshape(192, 3, 64) - ref.transpose(1, 0, 2)).max() < 2e-3


def test_the_tile_bench_runs_two_builds_side_by_side(tmp_path):
    """scripts/fa_tile_bench.py: two copies of one build, one position, one repeat (a smoke run: it loads both,
    times every mask with each and writes its table)."""
    import json
    import shutil
    import subprocess
    other = tmp_path / "libggml-cpu.so"
    shutil.copy(LIB / "libggml-cpu.so", other)
    out = tmp_path / "t.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "fa_tile_bench.py"), str(LIB / "libggml-cpu.so"),
                        str(other), "-r", "1", "--positions", "1024", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(x["mask"], x["tiles"]) for x in rows] == [("causal", 164), ("band", 143), ("seen-only", 136)]
    assert "| 1024 | band | 143 |" in r.stdout


def test_the_committed_tile_bench():
    """docs/maps.md ("A masked tile's cost, at the kernel"): at position 7680 the band's op took 1.95x the time of the
    same op on the keys it sees without patch 0018 and 1.23x with it (0.601x the old time); at 4096 1.41x and 1.12x;
    a causal op the same within 2-5%."""
    import json
    res = json.loads((ROOT / "docs" / "data" / "fa-tile-bench-smollm2-band.json").read_text())
    assert [Path(x).name for x in res["libs"]] == ["libggml-cpu-0017.so", "libggml-cpu-0018.so"]
    assert (res["threads"], res["repeats"], res["window"], res["sink"]) == (2, 20, 1024, 4)
    ms = {(r["position"], r["mask"]): r["ms"] for r in res["rows"]}
    got = {p: [f"{ms[p, 'band'][b] / ms[p, 'seen-only'][b]:.2f}" for b in range(2)] for p in (1024, 4096, 7680)}
    assert got == {1024: ["1.04", "1.06"], 4096: ["1.41", "1.12"], 7680: ["1.95", "1.23"]}
    assert f"{ms[7680, 'band'][1] / ms[7680, 'band'][0]:.3f}" == "0.601"
    # without it, a skipped tile at 7680 cost a seventh of a computed one, six skipped (880) per computed (144)
    band, seen = ms[7680, "band"][0], ms[7680, "seen-only"][0]
    assert f"{(band - seen * 144 / 136) / (8 * 128 - 144) / (seen / 136):.2f}" == "0.14" and (8 * 128 - 144) // 144 == 6
    assert [f"{ms[p, 'causal'][1] / ms[p, 'causal'][0]:.2f}" for p in (1024, 4096, 7680)] == ["0.99", "0.95", "1.02"]
    assert all(0.94 < ms[p, "seen-only"][1] / ms[p, "seen-only"][0] < 0.95 for p in (1024, 4096, 7680))
    # the read left at 7680: over seen-only, less the sink's extra tile (144 against 136), in ms
    assert f"{ms[7680, 'band'][1] - ms[7680, 'seen-only'][1] * 144 / 136:.1f}" == "2.5"
