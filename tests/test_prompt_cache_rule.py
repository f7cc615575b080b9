"""llama_ridgefill_reusable_prefix: what a request may reuse of a cached prompt whose cells were partly filled.

An exact request reuses only the cells before the first filled one; an approximate request every cell filled as
it would fill it or computed with more exact work (cells it would fill, computed exactly).
"""
import pytest

from ridgefill._lib import reusable_prefix

EXACT = None


@pytest.mark.parametrize("n_common,filled,plan,want", [
    (500, [], EXACT, 500),                          # exact cache, exact request
    (500, [], (4, 300), 500),                       # exact cells serve an approximate request
    (500, [(4, 300)], EXACT, 4),                    # filled cells never serve an exact request: the sink rows stay
    (3, [(4, 300)], EXACT, 3),                      # the prefix ends before the filled cells
    (500, [(4, 300)], (4, 300), 500),               # the same fill: reuse everything
    (500, [(4, 300)], (4, 400), 500),               # rows 300..399 computed exactly where this request fills them
    (500, [(4, 300)], (4, 250), 250),               # rows 250..299 filled where this request computes exactly
    (200, [(4, 300)], (4, 250), 200),               # ... unless the prefix ends before them
    (200, [(4, 300)], (4, 150), 150),
    (500, [(4, 300)], (8, 300), 4),                 # another sink: rows 4..7 would be exact
    (500, [(8, 300)], (4, 300), 500),               # more exact sink rows than this request's
    (2000, [(4, 1400), (1700, 1744)], (4, 1744), 2000),   # a chat: each turn's fill inside the next turn's
    (2000, [(4, 1400), (1700, 1744)], (4, 1720), 1720),
    (2000, [(4, 1400), (1700, 1744)], EXACT, 4),
    (2000, [(4, 1400), (1700, 1744)], (4, 1600), 1700),   # the second range lies in this request's tail
])
def test_rule(n_common, filled, plan, want):
    assert reusable_prefix(n_common, filled, plan) == want


def test_reuse_never_exceeds_the_common_prefix():
    for n in (0, 1, 10, 300):
        assert reusable_prefix(n, [(4, 300)], (4, 300)) == n
        assert reusable_prefix(n, [], EXACT) == n
