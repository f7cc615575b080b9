"""Ridge maps from streamed moments: the whole algorithm of `ridgefill calibrate`.

For every regression target y of a late layer l, predict it from the features f of the
same token:

    ŷ = W f + b,   min Σ‖y − W f − b‖² + λ‖W − P‖²,   P = 0 or [I 0].

The features are f_t = [h_t, h_{t−1}, …, h_{t−C}] (width D = (C+1)·d): the input h of the
split layer at the token and at its C predecessors in the sequence (C = context_tokens,
0..2; C = 0 is just h_t).  The targets are the layer inputs x_l ("input" maps, width d)
or, for "kv" maps, the layer's K (after any k-norm, before RoPE, heads one after another)
and V as two separate targets.

With centred moments A = Σ(f−μ_f)(f−μ_f)ᵀ and B = Σ(f−μ_f)(y−μ_y)ᵀ the solution is
Wᵀ = (A + λI)⁻¹ (B + λPᵀ),  b = μ_y − W μ_f.  A is the same for every target, so one
Cholesky factor serves all of them.  λ is given relative to the mean eigenvalue of A:
λ_abs = λ · trace(A)/D, so it does not depend on the number of calibration tokens.
The identity prior P = [I 0] (d_out ≤ D) shrinks toward ŷ = h_t.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg

LAMBDA_GRID = (1e-6, 1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)
PRIORS = ("zero", "identity")


def context_features(h: np.ndarray, context_tokens: int, start: int = 0) -> np.ndarray:
    """f_t = [h_t, h_{t−1}, …, h_{t−C}] for t = start..n−1, from h (n, d) of one sequence.

    Returns (n − start, (C+1)·d); start ≥ C, so every row's predecessors are in h."""
    if start < context_tokens:
        raise ValueError(f"row {start} has fewer than {context_tokens} predecessors")
    n = len(h)
    return np.concatenate([h[start - j:n - j] for j in range(context_tokens + 1)], axis=1)


@dataclass
class Moments:
    """Running float64 sums over tokens of the features f (width d) and of L targets y (width d_out, default d).

    (The field names keep the input maps' letters: h for the features, x for the targets.)
    """
    d: int
    L: int
    d_out: int | None = None
    n: int = 0
    sh: np.ndarray = field(init=False)   # Σ f            (d,)
    shh: np.ndarray = field(init=False)  # Σ f fᵀ         (d, d)
    sx: np.ndarray = field(init=False)   # Σ y            (L, d_out)
    shx: np.ndarray = field(init=False)  # Σ f yᵀ         (L, d, d_out)
    sxx: np.ndarray = field(init=False)  # Σ ‖y‖²         (L,)

    def __post_init__(self):
        d, L = self.d, self.L
        self.d_out = self.d_out or d
        self.sh, self.shh = np.zeros(d), np.zeros((d, d))
        self.sx, self.shx, self.sxx = np.zeros((L, self.d_out)), np.zeros((L, d, self.d_out)), np.zeros(L)

    def add(self, h: np.ndarray, xs: np.ndarray) -> None:
        """h: (n, d) features; xs: (L, n, d_out) targets of the same tokens."""
        h = np.asarray(h, dtype=np.float64)
        self.n += h.shape[0]
        self.sh += h.sum(0)
        self.shh += h.T @ h
        for l in range(self.L):
            x = np.asarray(xs[l], dtype=np.float64)
            self.sx[l] += x.sum(0)
            self.shx[l] += h.T @ x
            self.sxx[l] += np.einsum("ij,ij->", x, x)

    def is_finite(self) -> bool:
        return all(np.isfinite(a).all() for a in (self.sh, self.shh, self.sx, self.shx, self.sxx))


def layer_maps(m: Moments, lam: float | np.ndarray, prior: str = "identity"):
    """Closed-form ridge maps one target at a time: yields (l, W_l (d_out, d), b_l (d_out,)) in float64.

    Only one target's temporaries exist at a time (plus one Cholesky factor per distinct λ), so
    memory does not grow with the number of targets beyond the moments themselves.
    """
    if prior == "identity" and m.d_out > m.d:
        raise ValueError(f"the identity prior needs d_out <= d_in, not {m.d_out} > {m.d}")
    mu_h, mu_x = m.sh / m.n, m.sx / m.n
    lams = np.broadcast_to(np.asarray(lam, dtype=np.float64), (m.L,))
    A = m.shh - m.n * np.outer(mu_h, mu_h)
    scale = np.trace(A) / m.d
    diag, eye = np.diag_indices(m.d), np.diag_indices(m.d_out)
    for lam_rel in np.unique(lams):                            # one Cholesky per distinct λ
        lam_abs = lam_rel * scale
        reg = A.copy()
        reg[diag] += lam_abs
        chol = scipy.linalg.cho_factor(reg, overwrite_a=True)
        for l in np.flatnonzero(lams == lam_rel):
            rhs = m.shx[l] - (m.n * mu_h)[:, None] * mu_x[l][None, :]   # B_l (d_in, d_out)
            if prior == "identity":
                rhs[eye] += lam_abs                            # B_l + λPᵀ, Pᵀ = [I; 0]
            W = scipy.linalg.cho_solve(chol, rhs, overwrite_b=True).T
            yield l, W, mu_x[l] - W @ mu_h


def solve(m: Moments, lam: float | np.ndarray, prior: str = "identity",
          dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """Closed-form ridge maps for every target: W (L, d_out, d) with ŷ = W f + b, b (L, d_out).

    W is stored in `dtype` (calibrate asks for float32, the type maps are written in: half the memory);
    each target is solved in float64 and b from the float64 W.
    """
    W, b = np.empty((m.L, m.d_out, m.d), dtype=dtype), np.empty((m.L, m.d_out))
    for l, Wl, bl in layer_maps(m, lam, prior):
        W[l], b[l] = Wl, bl
    return W, b


def sse_layer(m: Moments, l: int, W: np.ndarray, b: np.ndarray) -> float:
    """Σ‖y_l − W f − b‖² over the tokens summed in m, for target l, from the moments alone."""
    W = np.asarray(W, dtype=np.float64)
    out = (m.sxx[l] - 2 * np.einsum("ij,ji->", W, m.shx[l]) - 2 * b @ m.sx[l]
           + np.einsum("ij,ij->", W @ m.shh, W) + 2 * b @ (W @ m.sh) + m.n * b @ b)
    return max(float(out), 0.0)


def sse(m: Moments, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ‖y_l − W_l f − b_l‖² over the tokens summed in m, per target, from the moments alone."""
    return np.array([sse_layer(m, l, W[l], b[l]) for l in range(m.L)])


def sse_identity(m: Moments) -> np.ndarray:
    """Σ‖y_l − h_t‖² per target: the error of the identity baseline ŷ = h_t (the first d_out features)."""
    e = m.d_out
    if e > m.d:
        raise ValueError(f"the identity baseline needs d_out <= d_in, not {e} > {m.d}")
    return np.maximum(m.sxx - 2 * np.trace(m.shx[:, :e], axis1=1, axis2=2) + np.trace(m.shh[:e, :e]), 0.0)


def sst(m: Moments) -> np.ndarray:
    """Σ‖y_l − mean‖², per target (the denominator of R²)."""
    return m.sxx - np.einsum("li,li->l", m.sx, m.sx) / m.n


def pick_lambda(train: Moments, val: Moments, prior: str, grid=LAMBDA_GRID) -> tuple[np.ndarray, np.ndarray]:
    """Per-target λ from `grid` with the smallest held-out error; returns (λ per target, errors (grid, L)).

    Maps are solved and scored one target at a time and never kept: memory stays that of the moments.
    """
    errs = np.empty((len(grid), train.L))
    for i, lam in enumerate(grid):
        for l, W, b in layer_maps(train, lam, prior):
            errs[i, l] = sse_layer(val, l, W, b)
    return np.asarray(grid)[errs.argmin(0)], errs
