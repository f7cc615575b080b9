"""The FLOP model behind the analytic speedup limit, against hand-computed cases."""
import pytest

from ridgefill.bench import Shape, flops

# a toy shape small enough to count by hand: d=4, 2 heads of 2 (1 KV head), FFN 8, vocab 10
TOY = Shape(n_layer=3, d=4, n_head=2, n_kv=1, head_dim=2, d_ff=8, n_vocab=10, n_ctx_train=64)


def test_exact_prefill_by_hand():
    # per token and layer: 2*(Q 4*4 + K,V 2*4*2 + O 4*4 + FFN 3*4*8) = 2*(16+16+16+96) = 288
    # attention, per layer: 2*2*4 * (1+2+3) = 96 for 3 tokens; output head 2*4*10 = 80
    assert flops(TOY, 3) == 3 * (3 * 288 + 96) + 80


def test_ridgefill_prefill_by_hand():
    # 6 tokens, sink 1, tail 2 -> tokens 1..3 approximate from split layer 1 (layers 1, 2)
    exact = flops(TOY, 6)
    saved = 2 * (3 * 288 + 2 * 2 * 4 * (2 + 3 + 4))          # layers 1-2 of tokens at positions 1..3
    cost = 3 * (2 * (2 * 4 * 2) * 2 + 2 * 4 * 4 * 1)          # K/V at layers 1-2, map at layer 2
    assert flops(TOY, 6, split_layer=1, tail=2, sink=1) == exact - saved + cost


def test_kv_maps_and_context_features_by_hand():
    exact, saved = flops(TOY, 6), 2 * (3 * 288 + 2 * 2 * 4 * (2 + 3 + 4))
    # kv maps: K/V projections at layer 1 only, the map at layer 2 goes from 4 (C=0) or 8 (C=1) features to 2+2
    assert flops(TOY, 6, 1, 2, 1, "kv") == exact - saved + 3 * (2 * (2 * 4 * 2) + 2 * 4 * 4)
    assert flops(TOY, 6, 1, 2, 1, "kv", 1) == exact - saved + 3 * (2 * (2 * 4 * 2) + 2 * 8 * 4)
    # input maps with one predecessor: the map at layer 2 reads 8 features
    assert flops(TOY, 6, 1, 2, 1, "input", 1) == exact - saved + 3 * (2 * (2 * 4 * 2) * 2 + 2 * 8 * 4)


def test_smollm2_limits_match_the_issue():
    smol = Shape(n_layer=30, d=576, n_head=9, n_kv=3, head_dim=64, d_ff=1536, n_vocab=49152, n_ctx_train=8192)
    lim = lambda s: flops(smol, 8192) / flops(smol, 8192, s, 1024, 4)  # noqa: E731
    assert lim(15) == pytest.approx(1.6, abs=0.02)
    assert lim(20) == pytest.approx(1.34, abs=0.02)
    assert flops(smol, 8192, 20, tail=8192) == flops(smol, 8192)    # all tail: nothing approximate


def test_flop_parts_split_weights_from_attention():
    """flop_parts: (weights, attention), summing to flops; the attention part is what the key/value products cost."""
    from ridgefill.bench import flop_parts
    w, a = flop_parts(TOY, 3)
    assert (w, a) == (3 * 3 * 288 + 80, 3 * 96)
    for args in ((6,), (6, 1, 2, 1), (6, 1, 2, 1, "kv", 1), (40, 2, 8, 1, "input", 0, 1, 4)):
        assert sum(flop_parts(TOY, *args)) == flops(TOY, *args)
    # a band of 1 layer below split 2 with a 4-position window: only attention changes
    w0, a0 = flop_parts(TOY, 40, 2, 8, 1)
    w1, a1 = flop_parts(TOY, 40, 2, 8, 1, "input", 0, 1, 4)
    assert w1 == w0 and a0 - a1 == 2 * 2 * 4 * (31 - 4) * (31 - 4 + 1) / 2


def test_attention_cost_fit_recovers_the_rates():
    import sys

    from conftest import ROOT
    sys.path.insert(0, str(ROOT / "scripts"))
    from attention_cost import fit

    from ridgefill.bench import flop_parts
    lengths = [8, 16, 32, 64]
    secs = [2e-6 * w + 5e-6 * a for w, a in (flop_parts(TOY, n) for n in lengths)]
    cw, ca = fit(TOY, lengths, secs)
    assert cw == pytest.approx(2e-6) and ca == pytest.approx(5e-6)


def test_tile_attention_counts_what_the_tiled_kernel_computes():
    """attention_profile.tile_attention: whole 64 x 64 tiles, the causal diagonal and a window's edges included."""
    import sys

    from conftest import ROOT
    sys.path.insert(0, str(ROOT / "scripts"))
    from attention_profile import tile_attention, tiles, ubatches

    from ridgefill.bench import flop_parts
    # causal: the tiles up to the row tile's last position; a window: its span plus the sink's tile
    assert tiles(0, 63) == 1 and tiles(64, 127) == 2 and tiles(4096, 4159) == 65
    assert tiles(4096, 4159, window=1024, sink=4) == (4159 // 64 - 3073 // 64 + 1) + 1 == 18
    assert tiles(4096, 4159, window=1024, sink=0) == 17 and tiles(100, 163, window=1024, sink=4) == 3
    # the runtime's split: batches of 2048, cut where the path changes, ubatches of <= 512
    ub = ubatches(8192, (4, 7168))
    assert ub[:3] == [(0, 4, False), (4, 512, True), (516, 512, True)] and ub[4] == (1540, 508, True)
    assert sum(r for _, r, f in ub if f) == 7164 and sum(r for _, r, f in ub if not f) == 1028
    assert sum(r for _, r, _ in ubatches(8192, None)) == 8192
    # on SmolLM2's shape, exact: the tiles' attention is the FLOP model's plus the diagonal tiles' halves
    smol = Shape(n_layer=30, d=576, n_head=9, n_kv=3, head_dim=64, d_ff=1536, n_vocab=49152, n_ctx_train=8192)
    t_exact, a_exact = tile_attention(smol, 8192, None, 1024, 4), flop_parts(smol, 8192)[1]
    assert t_exact == pytest.approx(a_exact * (1 + 32 / 4096), rel=2e-3)
    band = {"split_layer": 22, "band_layers": 18, "band_window": 1024, "band_full_layers": []}
    plain = {**band, "band_layers": 0, "band_window": 0}
    t_band, t_plain = tile_attention(smol, 8192, band, 1024, 4), tile_attention(smol, 8192, plain, 1024, 4)
    a_band = flop_parts(smol, 8192, 22, 1024, 4, "input", 0, 18, 1024)[1]
    # the window computes 18 tiles of 64 for a row's 1028 keys: above the FLOP model's count, below the full rows'
    assert a_band < t_band < t_plain and t_band / a_band == pytest.approx(1.04, abs=0.01)
    b128 = {**band, "band_window": 128}
    assert tile_attention(smol, 8192, b128, 1024, 4) / flop_parts(smol, 8192, 22, 1024, 4, "input", 0, 18, 128)[1] \
        == pytest.approx(1.06, abs=0.01)
    # an unwindowed band layer attends like an exact one
    assert tile_attention(smol, 8192, {**band, "band_full_layers": list(range(4, 22))}, 1024, 4) == t_plain


def test_a_windowed_row_tile_skips_44_tiles_on_average_at_8k():
    """docs/maps.md ("What a skipped key costs"): over the filled rows of an 8K prompt (1K tail, sink 4, W = 1024, the
    cache padded to 256 cells) a row tile skips 44 key tiles on average, up to 94, for the 17 it computes."""
    import math
    import sys

    from conftest import ROOT
    sys.path.insert(0, str(ROOT / "scripts"))
    from attention_profile import tiles, ubatches
    skipped, computed = [], []
    for u, rows, filled in ubatches(8192, (4, 7168)):
        n_kv = math.ceil((u + rows) / 256) * 256
        for q in range(0, rows, 64) if filled else ():
            c = tiles(u + q, u + min(q + 64, rows) - 1, 1024, 4)
            computed.append(c)
            skipped.append(n_kv // 64 - c)
    assert (round(sum(skipped) / len(skipped)), max(skipped), round(sum(computed) / len(computed))) == (44, 94, 17)
