"""llama_ridgefill_reusable_prefix: approximately filled cells serve only requests that fill them alike."""
import pytest

from ridgefill._lib import lib


def reuse(n_common, cached, new):
    return lib().llama_ridgefill_reusable_prefix(n_common, *cached, *new)


NONE = (0, 0)


@pytest.mark.parametrize("n_common,cached,new,want", [
    (500, NONE, NONE, 500),            # exact cache, exact request
    (500, NONE, (4, 300), 500),        # exact cells are fine for an approximate request
    (500, (4, 300), NONE, 4),          # filled cells never serve an exact request: keep the sink rows
    (500, (4, 300), (4, 300), 500),    # the same fill: reuse everything
    (500, (4, 300), (4, 400), 4),      # the cached exact rows 300..499 saw a different fill
    (200, (4, 300), (4, 250), 200),    # the prefix ends inside the filled range, the new range covers it
    (200, (4, 300), (4, 150), 4),      # ... but not if the new tail starts earlier
    (200, (4, 300), (8, 300), 4),      # another sink count
    (3, (4, 300), NONE, 3),            # the prefix ends before the filled cells
])
def test_rule(n_common, cached, new, want):
    assert reuse(n_common, cached, new) == want
