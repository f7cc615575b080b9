"""The out-of-distribution guard's statistic and threshold (the runtime computes the same, cpp/ridgefill-runtime.cpp).

A check is `WINDOW` consecutive prompt rows computed exactly ("canary" rows).  On them the maps' outputs ŷ_l
(the predicted input x̂_l, or K̂_l and V̂_l) are compared with the exact values y_l, per late layer l and part p:

    e_lp   = Σ_rows |ŷ − y|² / Σ_rows |y|²         (relative squared error of the check)
    score  = mean_lp  e_lp / ē_lp                  (ē_lp: the same error on all held-out calibration rows)

so a check on text like the calibration text scores about 1.  A prompt's checks pool their rows: its score after
check k is the larger of the score of all its canary rows so far and that of its last RECENT checks' rows (`pooled`).
The first pool grows no noisier as checks add up (each single check would be one more noisy draw against the
threshold); the second keeps a register change late in a long prompt from being diluted by all the rows before it.
The threshold comes from the scores of single checks on held-out calibration windows (RULE below): the probe is
one check, and per layer a pooled error is a weighted mean of the checks' errors.  A prompt whose score goes above
it is computed exactly from there.
"""
from __future__ import annotations

import numpy as np

from .ggufio import Guard

WINDOW = 32            # rows per check
MARGIN = 1.25          # threshold = MARGIN × the largest held-out check score
RECENT = 2             # a prompt's score also pools its last RECENT checks alone (cpp/ridgefill-runtime.cpp)
RULE = f"threshold = {MARGIN:g} x the largest score of {WINDOW}-row checks on held-out calibration windows"


def sums(y_hat: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per window: Σ|ŷ−y|² and Σ|y|² over its rows.  y_hat, y: (n_windows, WINDOW, width)."""
    y_hat, y = y_hat.astype(np.float64), y.astype(np.float64)
    return ((y_hat - y) ** 2).sum(axis=(1, 2)), (y ** 2).sum(axis=(1, 2))


def scores(num: np.ndarray, den: np.ndarray, layer_error: np.ndarray) -> np.ndarray:
    """Check scores from per-window sums num, den: (n_windows, L·P)."""
    return (num / den / layer_error).mean(axis=1)


def pooled(num: np.ndarray, den: np.ndarray, layer_error: np.ndarray) -> np.ndarray:
    """A prompt's score after each of its checks, from the checks' sums num, den: (n_checks, L·P)."""
    cn, cd = np.cumsum(num, axis=0), np.cumsum(den, axis=0)
    before = lambda c: np.concatenate([np.zeros_like(c[:RECENT]), c[:-RECENT]])  # noqa: E731  (sums to k-RECENT)
    return np.maximum(scores(cn, cd, layer_error), scores(cn - before(cn), cd - before(cd), layer_error))


def fit(num: np.ndarray, den: np.ndarray) -> Guard:
    """The guard's data from held-out windows' sums num, den (n_windows, L·P)."""
    if len(num) < 2:
        raise ValueError("the guard needs at least two held-out windows")
    layer_error = num.sum(0) / den.sum(0)
    s = np.sort(scores(num, den, layer_error))
    q = np.quantile(num / den / layer_error, [0.5, 0.9, 1.0], axis=0).T      # (L·P, 3)
    return Guard(window=WINDOW, layer_error=layer_error, threshold=float(MARGIN * s[-1]), scores=s,
                 layer_error_q=q, rule=RULE)
