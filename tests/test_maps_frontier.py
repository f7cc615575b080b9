"""scripts/maps_frontier.py: the frontier docs/maps.md draws, from the committed eval results."""
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import maps_frontier  # noqa: E402


def _row(split, limit, kl):
    return {"split": split, "limit": limit, "quality": {"d": ((kl, kl, kl), (0.0, 0.0, 0.0))}}


def test_frontier_is_no_faster_setting_with_lower_kl():
    rows = [_row(20, 1.33, 0.02), _row(18, 1.43, 0.03), _row(15, 1.60, 0.20), _row(15, 1.53, 0.25)]
    maps_frontier.mark_frontier(rows)
    assert [r["frontier"]["d"] for r in rows] == [True, True, True, False]


def test_committed_results_read_and_match_the_eval(smollm2):
    """Every (split, variant) of the committed maps evals is read with the eval's own numbers; the FLOP limits
    are the ones docs/maps.md quotes for split 20 (1.33x at 2K/256) and split 15 (1.60x)."""
    import json
    from ridgefill.bench import Shape, flops
    paths = sorted((ROOT / "docs" / "data").glob("maps-smollm2-s*-2k.json"))
    rows = [r for p in paths for r in maps_frontier.settings(p)]
    assert {(r["split"], r["variant"]) for r in rows} >= {(20, "input-c0"), (18, "input-c0"), (15, "input-c1")}
    s20 = json.loads((ROOT / "docs" / "data" / "maps-smollm2-s20-2k.json").read_text())
    (cell,) = s20["domains"]["shakespeare"].values()
    (r20,) = [r for r in rows if (r["split"], r["variant"]) == (20, "input-c0")]
    assert r20["quality"]["shakespeare"][0] == cell["modes"]["ridgefill"]["kl"]
    shape = Shape.of(str(smollm2))
    for split, want in ((20, 1.33), (15, 1.60)):
        limit = flops(shape, 2048) / flops(shape, 2048, split, 256, 4, "input", 0)
        assert round(limit, 2) == want
