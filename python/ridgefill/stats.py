"""95% intervals: the cluster bootstrap for means of per-token values, Wilson for accuracies.

All tail tokens of a prompt attend to one filled cache, so their errors are correlated: the sampling unit is
the prompt, and the bootstrap resamples whole prompts (groups), never tokens or blocks of tokens.
"""
from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054


def bootstrap_mean(values, groups, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` and its 95% percentile interval, resampling whole groups."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return float("nan"), float("nan"), float("nan")
    _, g = np.unique(np.asarray(groups), return_inverse=True)
    sums, counts = np.bincount(g, weights=values), np.bincount(g).astype(np.float64)
    idx = np.random.default_rng(seed).integers(0, len(sums), size=(n_boot, len(sums)))
    means = sums[idx].sum(1) / counts[idx].sum(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(values.mean()), float(lo), float(hi)


def wilson(successes: int, n: int) -> tuple[float, float, float]:
    """(rate, low, high): the Wilson score 95% interval of a binomial proportion."""
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    p = successes / n
    den = 1 + Z95 ** 2 / n
    mid = (p + Z95 ** 2 / (2 * n)) / den
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / den
    return p, max(0.0, mid - half), min(1.0, mid + half)


def fmt_ci(m: tuple[float, float, float], digits: int = 3, scale: float = 1.0) -> str:
    v, lo, hi = (x * scale for x in m)
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
